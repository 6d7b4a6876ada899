"""A small PyTorch training run whose trace shows every category of the ``ai`` tree.

A regression MLP on random points, trained with a DataLoader of 2 worker
processes, a one-rank gloo process group for the gradient all-reduce, a checkpoint
per epoch and a restart from the last one. Run it with either of::

    python -m dftrace.examples.torch_training            # traces into ./dftrace-torch-example
    dftrace run -m dftrace.examples.torch_training       # uses dftrace run's settings

What writes which span:

=================================  ==================================================
category                           from
=================================  ==================================================
``pipeline`` train/epoch/          ``with ai.pipeline.train``, ``ai.pipeline.epoch.iter``,
evaluate/test                      ``with ai.pipeline.evaluate`` / ``ai.pipeline.test``
``dataloader`` fetch               ``dftrace.torch.trace_dataloader``
``data`` item, preprocess(.collate)  the same call, in the worker processes, plus the
                                   dataset's own ``with ai.data.preprocess``
``compute`` forward/backward/step  ``dftrace.torch.trace_compute``, and
                                   ``trace_modules`` for ``forward.<layer>``
``comm`` all_reduce                ``dftrace.torch.trace_distributed``
``device`` transfer                ``dftrace.torch.to_device``
``checkpoint`` capture/restart     ``dftrace.torch.save`` / ``dftrace.torch.load``
=================================  ==================================================
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections import Counter

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

import dftrace
import dftrace.torch as dft
from dftrace import ai


class Points(Dataset):
    """Random points ``x`` (drawn from ``seed``) with targets ``y = relu(x) . w + noise``
    (the same ``w`` for every seed)."""

    def __init__(self, n: int = 512, dim: int = 16, seed: int = 0):
        w = torch.randn(dim, 1, generator=torch.Generator().manual_seed(1234)) / dim
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=g) * 3 + 1
        self.y = torch.relu(self.x) @ w + 0.01 * torch.randn(n, 1, generator=g)
        self.mean, self.std = self.x.mean(0), self.x.std(0)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        with ai.data.preprocess:
            x = (self.x[i] - self.mean) / self.std
        return x, self.y[i]


def _join_process_group() -> bool:
    """A gloo group for the gradient all-reduce: the launcher's (torchrun) when there
    is one, else a group of just this process. True when we created it."""
    if dist.is_initialized():
        return False
    if "MASTER_ADDR" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    else:
        # A group of one needs no rendezvous: an in-memory store, no port to pick.
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return True


def average_gradients(model: nn.Module) -> None:
    """One all-reduce of all gradients, flattened (what DDP does in buckets)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def train(epochs: int = 2, batch_size: int = 32, samples: int = 512, workers: int = 2,
          checkpoint_dir: str | None = None) -> float:
    """Train, evaluate, checkpoint and restart; returns the test loss."""
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_set, val_set = Points(samples, seed=0), Points(samples // 4, seed=1)
    train_loader = dft.trace_dataloader(
        DataLoader(train_set, batch_size=batch_size, shuffle=True, num_workers=workers))
    val_loader = dft.trace_dataloader(
        DataLoader(val_set, batch_size=batch_size, num_workers=workers))
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.MSELoss()
    scratch = None if checkpoint_dir else tempfile.TemporaryDirectory(prefix="dftrace-torch-example-")
    ckpt_dir = checkpoint_dir or scratch.name
    ckpt = os.path.join(ckpt_dir, "model.pt")
    created_group = _join_process_group()
    try:
        with dft.trace_distributed(), dft.trace_compute(model, opt), \
                dft.trace_modules(model, max_depth=1), ai.pipeline.train:
            for epoch in ai.pipeline.epoch.iter(range(epochs)):
                model.train()
                for x, y in train_loader:
                    x, y = dft.to_device((x, y), device)
                    loss = loss_fn(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    average_gradients(model)
                    opt.step()
                with ai.pipeline.evaluate, torch.no_grad():
                    model.eval()
                    val = sum(loss_fn(model(x), y).item()
                              for x, y in (dft.to_device(b, device) for b in val_loader))
                print(f"epoch {epoch}: validation loss {val / len(val_loader):.4f}")
                dft.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch}, ckpt)
            state = dft.load(ckpt, map_location=device)
            model.load_state_dict(state["model"])
            with ai.pipeline.test, torch.no_grad():
                model.eval()
                x, y = dft.to_device(val_set[:64], device)
                test = loss_fn(model(x), y).item()
        print(f"test loss {test:.4f}")
        return test
    finally:
        if created_group:
            dist.destroy_process_group()
        if scratch is not None:
            scratch.cleanup()


def _summary(directory: str) -> str:
    from dftrace.testing import read_events, trace_files

    kinds: Counter[tuple[str, str]] = Counter()
    files = trace_files(directory)
    for f in files:
        for e in read_events(f, strict=False):
            if e.get("ph") == "X":
                kinds[(e.get("cat", "?"), e.get("name", "?"))] += 1
    lines = [f"{len(files)} trace files (the main process and its DataLoader workers):"]
    lines += [f"  {cat:<11} {name:<22} {n:>5}" for (cat, name), n in sorted(kinds.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", default="dftrace-torch-example",
                   help="trace directory when tracing is not set up already (default: %(default)s)")
    a = p.parse_args(argv)
    session = dftrace.session()
    own = session is None
    if own:
        session = dftrace.initialize(log_file=os.path.join(a.out, "torch_training"))
    train(epochs=a.epochs, batch_size=a.batch_size, samples=a.samples, workers=a.workers)
    if own and session is not None:
        dftrace.finalize()
        directory = os.path.dirname(session.path)
        print(f"\ntrace written to {directory}\n{_summary(directory)}")
        print(f"\nopen the files in https://ui.perfetto.dev, or: dftrace summary {directory}")


if __name__ == "__main__":
    main()
