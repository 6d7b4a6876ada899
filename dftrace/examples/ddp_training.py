"""Data-parallel training on 2 CPU ranks, traced: find the rank that holds the others back.

Two processes started with ``torch.multiprocessing.spawn`` join a gloo process group
over the loopback interface and train a small MLP with ``DistributedDataParallel``.
``--slow-rank`` makes one rank sleep in every forward, as a slower GPU, a noisy
neighbour or a bigger input shard would; ``dftrace summary`` then names it.
Run it with ``dftrace demo --ddp`` or ``python -m dftrace.examples.ddp_training``.

Each rank traces what the PyTorch integration guide shows: ``trace_dataloader``,
``trace_compute``, ``trace_ddp`` (one ``comm.all_reduce`` per gradient bucket) and
``trace_distributed`` (the per-step all-reduce of the loss), with
``ai.update(epoch=..., step=...)`` in the loop and an evaluation after each epoch.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import dftrace
import dftrace.torch as dft
from dftrace import ai


class SlowForward(nn.Module):
    """Wraps a model; sleeps ``delay`` seconds in each forward."""

    def __init__(self, inner: nn.Module, delay: float):
        super().__init__()
        self.inner, self.delay = inner, delay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return self.inner(x)


def train(rank: int, world: int, *, epochs: int = 2, steps: int = 32, batch_size: int = 16,
          slow_rank: int | None = None, slow_ms: float = 20.0) -> int:
    """Train for ``epochs`` x ``steps`` steps in an initialised process group; returns
    the number of training steps this rank ran."""
    torch.manual_seed(0)
    n = steps * batch_size * world
    x = torch.randn(n, 16)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = dft.trace_dataloader(DataLoader(data, batch_size=batch_size, sampler=sampler))
    delay = slow_ms / 1000 if rank == slow_rank else 0.0
    model = SlowForward(nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 1)), delay)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.01)  # a few buckets per step
    dft.trace_ddp(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    done = 0
    with dft.trace_distributed(), dft.trace_compute(ddp, opt), ai.pipeline.train:
        for epoch in ai.pipeline.epoch.iter(range(epochs)):
            sampler.set_epoch(epoch)
            ddp.train()
            for step, (xb, yb) in enumerate(loader):
                ai.update(epoch=epoch, step=step)
                loss = loss_fn(ddp(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                reported = loss.detach().clone()
                dist.all_reduce(reported)  # the mean loss every rank prints
                done += 1
            with ai.pipeline.evaluate, torch.no_grad():
                ddp.eval()
                val = sum(loss_fn(ddp(xb), yb).item() for xb, yb in loader)
            if rank == 0:
                print(f"epoch {epoch}: loss {reported.item() / world:.4f}, "
                      f"validation {val / max(len(loader), 1):.4f}")
    return done


def _run_rank(rank: int, world: int, init_file: str, out: str, epochs: int, steps: int,
              slow_rank: int | None, slow_ms: float) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    dftrace.initialize(log_file=os.path.join(out, "ddp"))
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    try:
        train(rank, world, epochs=epochs, steps=steps, slow_rank=slow_rank, slow_ms=slow_ms)
    finally:
        dist.destroy_process_group()
        dftrace.finalize()


def launch(out: str, *, world: int = 2, epochs: int = 2, steps: int = 32,
           slow_rank: int | None = 1, slow_ms: float = 20.0) -> str:
    """Run ``world`` ranks (CPU, gloo, loopback) tracing into ``out``; returns ``out``."""
    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    # The rendezvous goes through a file: no port to pick, nothing leaves the host.
    fd, init_file = tempfile.mkstemp(prefix="dftrace-ddp-")
    os.close(fd)
    os.unlink(init_file)
    try:
        mp.spawn(_run_rank, args=(world, init_file, out, epochs, steps, slow_rank, slow_ms),
                 nprocs=world, join=True)
    finally:
        if os.path.exists(init_file):
            os.unlink(init_file)
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The example's options (shared with ``dftrace demo --ddp``)."""
    p.add_argument("--ranks", type=int, default=2, help="processes to start (default: %(default)s)")
    p.add_argument("--steps", type=int, default=32, help="training steps per epoch (default: %(default)s)")
    p.add_argument("--slow-rank", type=int, default=1,
                   help="rank that sleeps in each forward; -1 for none (default: %(default)s)")
    p.add_argument("--slow-ms", type=float, default=20.0,
                   help="how long it sleeps, in ms (default: %(default)s)")


def run(ns: argparse.Namespace, out: str, epochs: int) -> str:
    """Launch with parsed options (``slow_rank`` -1 means none)."""
    slow = ns.slow_rank if ns.slow_rank is not None and ns.slow_rank >= 0 else None
    return launch(out, world=ns.ranks, epochs=epochs, steps=ns.steps, slow_rank=slow, slow_ms=ns.slow_ms)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="dftrace-ddp", help="trace directory (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=2)
    add_arguments(p)
    a = p.parse_args(argv)
    out = run(a, a.out, a.epochs)
    print(f"\ntrace written to {out}\nfind the straggler with: dftrace summary {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
