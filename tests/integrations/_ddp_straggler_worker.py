"""One rank of the real DDP jobs in test_ddp_stragglers (spawned): a model cut into
several gradient buckets, one rank sleeping in its collate function on chosen steps.

Each rank writes truth-<rank>.json (beside the traces, not among them): the time it
slept, measured on its own clock, the steps it slept in, and when it launched each
step's last gradient bucket on the host's monotonic clock, which the ranks of one
machine share."""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torch.utils.data.dataloader import default_collate

import dftrace
import dftrace.torch as dft
from dftrace import ai

#: Floats per layer: (WIDTH + 1) * WIDTH parameters of 4 bytes.
WIDTH = 32
LAYER_BYTES = (WIDTH + 1) * WIDTH * 4


class SlowCollate:
    """default_collate, sleeping ``slow_s`` on the given batches; counts the batches
    and adds up the time it slept on the process's own clock."""

    def __init__(self, slow_s: float, slow_batches: set[int]):
        self.slow_s, self.slow_batches = slow_s, slow_batches
        self.batch, self.slept, self.slow_steps = 0, 0.0, []

    def __call__(self, items):  # type: ignore[no-untyped-def]
        if self.batch in self.slow_batches:
            t0 = time.perf_counter()
            time.sleep(self.slow_s)
            self.slept += time.perf_counter() - t0
            self.slow_steps.append(self.batch)
        self.batch += 1
        return default_collate(items)


def run(rank: int, world: int, init_file: str, out: str, truth_dir: str, steps: int, buckets: int, slow_rank: int | None,
        slow_s: float, slow_every: int) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dftrace.initialize(log_file=os.path.join(out, "job"))
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    slow = {k for k in range(steps) if k % slow_every == 1} if rank == slow_rank else set()
    collate = SlowCollate(slow_s, slow)
    try:
        torch.manual_seed(0)
        x = torch.randn(steps * 4 * world, WIDTH)
        data = TensorDataset(x, x.sum(1, keepdim=True))
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False)
        loader = dft.trace_dataloader(DataLoader(data, batch_size=4, sampler=sampler, collate_fn=collate))
        layers: list[nn.Module] = []
        for _ in range(buckets):
            layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
        model = nn.Sequential(*layers, nn.Linear(WIDTH, 1))
        # One layer's gradients fill a bucket: `buckets` buckets (the last holds the head too).
        ddp = DistributedDataParallel(model, bucket_cap_mb=LAYER_BYTES / 1e6)
        launched: list[float] = []

        def timed_allreduce(state, bucket):  # type: ignore[no-untyped-def]
            launched.append(time.monotonic())
            return default_hooks.allreduce_hook(state, bucket)

        dft.trace_ddp(ddp, hook=timed_allreduce)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.001)
        last_bucket_at: list[float] = []
        with dft.trace_distributed(), dft.trace_compute(ddp, opt), ai.pipeline.train:
            for step, (xb, yb) in enumerate(loader):
                ai.update(epoch=0, step=step)
                loss = nn.functional.mse_loss(ddp(xb), yb)
                opt.zero_grad()
                launched.clear()
                loss.backward()
                last_bucket_at.append(launched[-1])  # every backward launches its buckets
                opt.step()
    finally:
        dist.destroy_process_group()
        dftrace.finalize()
    with open(os.path.join(truth_dir, f"truth-{rank}.json"), "w") as fh:
        json.dump({"slept_s": collate.slept, "slow_steps": collate.slow_steps, "last_bucket_at": last_bucket_at}, fh)
