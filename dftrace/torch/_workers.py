"""Data-loader worker processes (PyTorch ``DataLoader(num_workers=N)``).

Workers trace without any help: a forked worker gets a file of its own at fork, a
``spawn``/``forkserver`` worker starts tracing when it imports dftrace (the parent's
``initialize`` exported its configuration to the environment), and every worker
flushes when it ends, although ``multiprocessing`` skips ``atexit`` there.

``worker_init_fn`` adds what only the loader knows: which worker this process is.
Its file then names the process ``dataloader worker <id>`` in Perfetto (instead of a
bare pid), and records a ``CM`` metadata event ``dataloader.worker`` with the worker
id. It also starts tracing in a worker whose parent traced without exporting its
configuration (``inherit=False``), if the environment asks for it.

    from dftrace.torch import worker_init_fn, WorkerInit

    DataLoader(ds, num_workers=4, worker_init_fn=worker_init_fn)
    DataLoader(ds, num_workers=4, worker_init_fn=WorkerInit(my_own_init))

Neither imports torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .._core import engine as _engine
from .._core.state import STATE
from .._core import lifecycle as _lifecycle
from .._core.config import env_enabled
from .._core.records import META

__all__ = ["worker_init_fn", "WorkerInit"]


def worker_init_fn(worker_id: int) -> None:
    """Pass as ``DataLoader(worker_init_fn=...)``: names this worker's trace
    ``dataloader worker <id>`` and makes sure the worker traces. Never raises."""
    try:
        s = _lifecycle.session()
        if s is None and env_enabled():
            s = _lifecycle.initialize()
        if s is None:
            return
        label = f"dataloader worker {worker_id}"
        if s.rank is not None:
            label = f"rank {s.rank} · {label}"
        pid = os.getpid()
        _engine.record_special(META, {"name": "process_name", "hhash": False,
                                   "args": {"name": f"{label} · pid {pid}"}}, pid)
        s.say_dataloader_worker(worker_id)
    except Exception as exc:
        STATE.warn_once("worker_init", f"worker_init_fn failed: {exc!r}")


class WorkerInit:
    """A ``worker_init_fn`` that does what :func:`worker_init_fn` does, then calls
    yours: ``DataLoader(worker_init_fn=WorkerInit(my_init))``. Picklable (for
    ``spawn``/``forkserver`` workers) whenever ``fn`` is; ``fn``'s exceptions are
    its own and propagate as they would without dftrace."""

    def __init__(self, fn: Callable[[int], Any] | None = None):
        self.fn = fn

    def __call__(self, worker_id: int) -> None:
        worker_init_fn(worker_id)
        if self.fn is not None:
            self.fn(worker_id)

    def __repr__(self) -> str:
        return f"WorkerInit({self.fn!r})"
