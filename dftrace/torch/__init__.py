"""PyTorch integration: a useful trace of a training loop without editing the model.

    import dftrace
    import dftrace.torch as dft
    from dftrace import ai

    dftrace.initialize(log_file="traces/run")
    loader = dft.trace_dataloader(DataLoader(ds, batch_size=32, num_workers=2))
    with dft.trace_compute(model, optimizer):
        for epoch in ai.pipeline.epoch.iter(range(3)):
            for x, y in loader:
                loss = loss_fn(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

What each piece writes:

- :func:`trace_dataloader`: ``dataloader.fetch.iter``/``fetch.block`` per batch in the
  main process, ``data.item`` per ``__getitem__`` and ``data.preprocess.collate`` per
  batch in the workers (fork, spawn and forkserver).
- :func:`trace_compute`: ``compute.forward`` (hooks on the root module),
  ``compute.backward`` (every ``backward()`` call) and ``compute.step`` (optimizer
  step hooks), with ``args.step`` = optimizer steps taken so far.
- :func:`trace_modules`: a span per submodule forward (and, opt-in, backward) named
  ``forward.<path>`` with input and output shapes.
- :func:`trace_distributed` / :func:`trace_ddp`: ``comm.*`` per collective.
- :func:`to_device`, :func:`save`, :func:`load`: ``device.transfer``,
  ``checkpoint.capture``, ``checkpoint.restart`` with bytes and path.
- :func:`profile_steps`: the PyTorch profiler (GPU kernels with CUDA) for a few
  steps every N, its traces written beside dftrace's.

Every hook body is guarded: an error inside dftrace is reported once as a warning
and never reaches your training loop.
"""

from __future__ import annotations

from .._install_hint import import_framework

torch = import_framework("torch", "torch", "PyTorch")

import os
from collections.abc import Mapping
from typing import Any

from .._core.tree import ai
from ._data import (TracedCollate, TracedDataLoader, TracedDataset,
                          TracedIterableDataset, trace_collate, trace_dataloader,
                          trace_dataset)
from ._dist import DistributedTracing, note_distributed_rank, trace_ddp, trace_distributed
from ._profiler import StepProfiler, profile_steps
from .._hooks import call_in_span
from ._workers import WorkerInit, worker_init_fn
from ._compute import ComputeTracing, trace_compute
from ._hooking import shapes
from ._modules import ModuleTracing, trace_modules

__all__ = [
    "ComputeTracing",
    "DistributedTracing",
    "ModuleTracing",
    "StepProfiler",
    "TracedCollate",
    "TracedDataLoader",
    "TracedDataset",
    "TracedIterableDataset",
    "WorkerInit",
    "load",
    "note_distributed_rank",
    "profile_steps",
    "save",
    "shapes",
    "to_device",
    "trace_collate",
    "trace_compute",
    "trace_dataloader",
    "trace_dataset",
    "trace_ddp",
    "trace_distributed",
    "trace_modules",
    "worker_init_fn",
]


# ---------------------------------------------------------------------------
# Device and checkpoint
# ---------------------------------------------------------------------------

def _move(obj: Any, device: Any, non_blocking: bool, count: list[int]) -> Any:
    if isinstance(obj, torch.Tensor):
        count[0] += obj.numel() * obj.element_size()
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_move(x, device, non_blocking, count) for x in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_move(x, device, non_blocking, count) for x in obj)
    if isinstance(obj, Mapping):
        moved = {k: _move(v, device, non_blocking, count) for k, v in obj.items()}
        try:
            return type(obj)(moved)
        except Exception:
            return moved
    to = getattr(obj, "to", None)
    if callable(to):  # e.g. a tokenizer's BatchEncoding
        return to(device)
    return obj


def to_device(batch: Any, device: Any, non_blocking: bool = False) -> Any:
    """Move a batch (a tensor, or lists/tuples/dicts of them) to ``device`` inside a
    ``device.transfer`` span with ``args.bytes``, ``device`` and ``non_blocking``.

    With ``non_blocking=True`` to a GPU the span measures the launch of the copy.
    """
    node = ai.device.transfer
    count = [0]
    return call_in_span(node, _move, (batch, device, non_blocking, count),
                        args={"device": str(device)},
                        after=lambda _out: {"bytes": count[0], "non_blocking": bool(non_blocking)})


def _path_of(f: Any) -> str | None:
    if isinstance(f, (str, os.PathLike)):
        return os.fspath(f)
    name = getattr(f, "name", None)
    return name if isinstance(name, str) else None


def _size_of(f: Any) -> int | None:
    try:
        if isinstance(f, (str, os.PathLike)):
            return os.path.getsize(f)
        return f.tell() if hasattr(f, "tell") else None
    except Exception:
        return None


def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
    """``torch.save`` inside a ``checkpoint.capture`` span with ``args.path`` and
    ``args.bytes`` (the file's size after writing; for a file object, the bytes
    written to it)."""
    node = ai.checkpoint.capture
    if not node.enabled:
        return torch.save(obj, f, *args, **kwargs)
    start_pos = None if isinstance(f, (str, os.PathLike)) else _size_of(f)
    path = _path_of(f)

    def written(_out: Any) -> dict[str, Any] | None:
        end = _size_of(f)
        if end is None:
            return None
        return {"bytes": end - start_pos if start_pos is not None else end}

    call_in_span(node, torch.save, (obj, f, *args), kwargs,
                 args={"path": path} if path is not None else None, after=written)
    return None


def load(f: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.load`` inside a ``checkpoint.restart`` span with ``args.path`` and
    ``args.bytes`` (the file's size)."""
    node = ai.checkpoint.restart
    if not node.enabled:
        return torch.load(f, *args, **kwargs)
    extra: dict[str, Any] = {}
    path = _path_of(f)
    if path is not None:
        extra["path"] = path
    if isinstance(f, (str, os.PathLike)):
        size = _size_of(f)
        if size is not None:
            extra["bytes"] = size
    return call_in_span(node, torch.load, (f, *args), kwargs, args=extra or None)
