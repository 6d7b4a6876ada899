"""A Lightning DDP job on CPU (2 processes, gloo) traced with dftrace's callback.

    python _lightning_ddp_job.py TRACE_DIR TRUTH_DIR SLOW_RANK [ACCUMULATE]

Lightning's launcher runs this script again for rank 1 (LOCAL_RANK=1, no RANK). The
rank ``SLOW_RANK`` (-1: none) sleeps ``SLOW_S`` in ``training_step`` on every
``SLOW_EVERY``-th step (with ``ACCUMULATE`` micro-batches a step, as many times the
batches, the steps the same, and the sleep on a micro-batch that does not synchronize
the gradients: the other rank waits for it before the next batch, not inside a
backward); a checkpoint is saved every ``SAVE_EVERY`` steps, mid-epoch
(rank 0 writes it, rank 1 waits for it). Each rank writes what it slept, its own step
starts (``on_train_batch_start``, monotonic clock, with the epoch) and its saves
(``trainer.save_checkpoint``, start and end) to ``TRUTH_DIR/truth-<rank>.json``."""

from __future__ import annotations

import json
import os
import sys
import time

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dftrace
from dftrace.lightning import TraceCallback

BATCHES, EPOCHS, SLOW_S, SLOW_EVERY, SAVE_EVERY, SAVE_S = 8, 2, 0.080, 4, 3, 0.020


class Model(pl.LightningModule):
    def __init__(self, slow_rank: int, accumulate: int = 1):
        super().__init__()
        self.slow_every, self.slow_batch = SLOW_EVERY * accumulate, 0 if accumulate > 1 else 1
        # Three layers of some size: DDP gets more than one gradient bucket.
        self.net = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                 nn.Linear(512, 1))
        self.slow_rank = slow_rank
        self.slept_s = 0.0
        self.slow_steps: list[int] = []

    def training_step(self, batch, batch_idx):
        if self.global_rank == self.slow_rank and batch_idx % self.slow_every == self.slow_batch:
            t0 = time.perf_counter()
            time.sleep(SLOW_S)
            self.slept_s += time.perf_counter() - t0
            self.slow_steps.append(int(self.trainer.global_step))
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_save_checkpoint(self, checkpoint):
        # Each save takes 20 ms or more on every rank: far beyond the few ms a busy
        # machine shifts a step's start by, so a save counted in a step shows.
        time.sleep(SAVE_S)


class Clock(pl.Callback):
    def __init__(self):
        self.starts: list[int] = []

        self.epochs: list[int] = []
        self.saves: list[tuple[int, int]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.starts.append(time.monotonic_ns())
        self.epochs.append(int(trainer.current_epoch))

    def timed(self, save):
        def save_checkpoint(*args, **kwargs):
            t0 = time.monotonic_ns()
            try:
                return save(*args, **kwargs)
            finally:
                self.saves.append((t0, time.monotonic_ns()))
        return save_checkpoint


def main() -> None:
    out, truth, slow_rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
    accumulate = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    dftrace.initialize(log_file=os.path.join(out, "run"))
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    n = BATCHES * 2 * 4 * accumulate
    data = TensorDataset(torch.randn(n, 64, generator=g), torch.randn(n, 1, generator=g))
    model, clock = Model(slow_rank, accumulate), Clock()
    saves = ModelCheckpoint(dirpath=os.path.join(truth, "checkpoints"), every_n_train_steps=SAVE_EVERY,
                            save_top_k=-1)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=EPOCHS,
                         accumulate_grad_batches=accumulate,
                         callbacks=[TraceCallback(), clock, saves], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=os.path.join(truth, "root"))
    trainer.save_checkpoint = clock.timed(trainer.save_checkpoint)  # inside dftrace's span
    trainer.fit(model, DataLoader(data, batch_size=4))
    with open(os.path.join(truth, f"truth-{trainer.global_rank}.json"), "w") as f:
        json.dump({"rank": trainer.global_rank, "pid": os.getpid(), "slept_s": model.slept_s,
                   "slow_steps": model.slow_steps, "steps": int(trainer.global_step),
                   "starts_ns": clock.starts, "epochs": clock.epochs, "saves_ns": clock.saves}, f)


if __name__ == "__main__":
    main()
