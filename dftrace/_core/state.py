"""Process-wide recorder state, in one place, and the one :meth:`ProcessState.reset`.

``STATE`` holds what the whole process shares: who consumes the record buffer
(:mod:`.buffer`), the buffer's limits, drop counts, the spans open from
``start()``, the generation of the sticky args and the warnings already given.
Modules whose hot paths read state of their own as module globals (the engine's
per-thread stacks, the tree's options, running in-memory traces, the session) register
how to put it back with :meth:`ProcessState.on_reset`, and what a forked child
must forget with :meth:`ProcessState.on_fork`; ``dftrace.testing.reset()`` calls
``STATE.reset()`` and nothing else writes another module's state.

This module is at the bottom of the core's imports: it imports nothing of dftrace.
"""

from __future__ import annotations

import errno
import os
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["STATE", "ProcessState", "bind_native", "limit_refused", "native"]

#: The C engine (``_speedups``) once the engine module loaded it, else None.
native: Any = None


def bind_native(mod: Any) -> None:
    """The engine module loaded the C engine (or decided against it: None)."""
    global native
    native = mod
    STATE.open_spans = new_open_spans()


def new_open_spans() -> Any:
    """An empty ``STATE.open_spans``: a dict, or the C engine's ``StartedSpans`` (the
    same mapping, read in place by its start()/stop())."""
    return {} if native is None else native.StartedSpans()


def limit_refused(exc: BaseException) -> str | None:
    """Which limit of the system ``exc`` says refused a resource (a thread, memory, a
    process, a file descriptor), as the warning names it; None when ``exc`` is no such
    refusal (a bug, or a setting, which must still be told as they are)."""
    if isinstance(exc, RuntimeError) and "can't start new thread" in str(exc):
        return "could not start a thread (RLIMIT_AS / pids limit?)"
    if isinstance(exc, MemoryError):
        return "out of memory (RLIMIT_AS?)"
    if isinstance(exc, OSError):
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            return "out of file descriptors (RLIMIT_NOFILE?)"
        if exc.errno == errno.EAGAIN:
            return "could not start a process or thread (pids limit / RLIMIT_NPROC?)"
        if exc.errno == errno.ENOMEM:
            return "out of memory (RLIMIT_AS?)"
    return None


class ProcessState:
    """Process-wide recorder state; one instance, ``STATE``."""

    #: Defaults, as ``import dftrace`` leaves them (``initialize`` sets its own).
    BATCH_SIZE = 16384
    BUFFER_LIMIT = 1_048_576
    MAX_OPEN_SPANS = 100_000

    def __init__(self) -> None:
        self._resets: list[tuple[int, Callable[[], None]]] = []
        self._forks: list[Callable[[], None]] = []
        self._sgen = 1
        self._batch_size = self.BATCH_SIZE
        self._buffer_limit = self.BUFFER_LIMIT
        self._drop_when_full = False
        self._clear()

    def _clear(self) -> None:
        #: Takes the records out of the buffer (a :class:`.buffer.Consumer`), or None.
        self.consumer: Any = None
        #: Gets a copy of every encoded batch (running in-memory traces), or None.
        self.tap: Callable[[bytes], None] | None = None
        #: With writer="process": puts a special record's line in the shared ring.
        self.special_to_ring: Any = None
        self._dropped = 0
        if native is not None:
            native.set_dropped(0)
        self.woken = False  # the consumer was told a batch is ready (pure-Python engine)
        self.memory_traces = 0  # in-memory traces running (they open the gate too)
        self.pid = os.getpid()
        self.open_spans: Any = new_open_spans()  # id of a start() span -> its stack
        self.max_open_spans = self.MAX_OPEN_SPANS  # past it start() records nothing ...
        self.open_refused = 0  # ... and counts here
        self._warned: set[str] = set()

    # -- hooks -----------------------------------------------------------------------
    def on_reset(self, fn: Callable[[], None], order: int = 0) -> None:
        """Run ``fn`` at every :meth:`reset`, lower ``order`` first (registered once,
        at import, by the module that owns the state ``fn`` restores)."""
        self._resets.append((order, fn))
        self._resets.sort(key=lambda e: e[0])

    def on_fork(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` in a forked child, at :meth:`after_fork`."""
        self._forks.append(fn)

    def reset(self) -> None:
        """Every piece of process state back to how ``import dftrace`` left it.
        Finalize a running session first (``dftrace.testing.reset`` does)."""
        self._clear()
        self.set_limits(self.BATCH_SIZE, self.BUFFER_LIMIT, False)
        for _, fn in list(self._resets):
            fn()

    def after_fork(self) -> None:
        """In a forked child: nothing of the parent's spans, buffer or ring is ours."""
        self.open_spans = new_open_spans()
        self.pid = os.getpid()
        self.special_to_ring = None
        for fn in list(self._forks):
            fn()
        self.dropped = 0
        self.open_refused = 0

    # -- counters and limits ---------------------------------------------------------
    @property
    def sgen(self) -> int:
        """Generation of the sticky args: update() bumps it, nodes refresh lazily."""
        return native.sticky_gen() if native is not None else self._sgen

    @property
    def dropped(self) -> int:
        """Records dropped (buffer full, out of memory) and counted so far."""
        return native.dropped() if native is not None else self._dropped

    @dropped.setter
    def dropped(self, n: int) -> None:
        if native is not None:
            native.set_dropped(n)
        self._dropped = n

    def set_limits(self, batch_size: int, buffer_limit: int, drop_when_full: bool) -> None:
        """Wake the consumer at ``batch_size`` records; at ``buffer_limit`` wait for it
        (or drop and count, with ``drop_when_full``)."""
        self._batch_size = batch_size
        self._buffer_limit = buffer_limit
        self._drop_when_full = bool(drop_when_full)
        if native is not None:
            native.set_limits(batch_size, buffer_limit, bool(drop_when_full))

    batch_size = property(lambda self: self._batch_size,
                          lambda self, v: self.set_limits(v, self._buffer_limit, self._drop_when_full))
    buffer_limit = property(lambda self: self._buffer_limit,
                            lambda self, v: self.set_limits(self._batch_size, v, self._drop_when_full))
    drop_when_full = property(lambda self: self._drop_when_full,
                              lambda self, v: self.set_limits(self._batch_size, self._buffer_limit, v))

    def warn_once(self, key: str, message: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        try:
            warnings.warn(f"dftrace: {message}", RuntimeWarning, stacklevel=3)
        except Exception:
            pass

    def warn_deprecated(self, old: str, new: str) -> None:
        """A :class:`DeprecationWarning`, once per process (again after :meth:`reset`),
        for a caller of the old name ``old`` that now reads ``new``."""
        key = f"deprecated:{old}"
        if key in self._warned:
            return
        self._warned.add(key)
        warnings.warn(f"{old} is deprecated; use {new}, which does the same",
                      DeprecationWarning, stacklevel=3)


STATE = ProcessState()
