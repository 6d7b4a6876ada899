"""In-memory traces: ``with dftrace.trace_in_memory() as t:`` records the block into
memory (no files, no ``initialize``) and fills ``t``, a :class:`~.browse.Trace`, when
it ends, also when it raises. ``max_items=N`` makes every ``.iter()`` inside stop
after N items. The trace is made of the very lines a file session writes (the
writer's encoder, parsed back), so ``trace_in_memory()`` and ``Trace.load(path)``
agree.

The names of 0.1.0 (``capture``, ``Capture``, ``last_capture``) still work and warn
(:class:`DeprecationWarning`): "capture" now means only the values a node records
(``node(capture=...)``).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import orjson

from .._core import tree as _tree
from .._core import buffer as _buffer, engine as _engine
from .._core.state import STATE
from .._core import lifecycle as _lifecycle
from .._core.session import hostname_hash
from .._core.records import Encoder
from .browse import Trace

__all__ = ["InMemoryTracing", "last_in_memory_trace", "reset_state", "trace_in_memory"]



# =====================================================================================
# In-memory traces
# =====================================================================================

_lock = threading.RLock()
_active: list[InMemoryTracing] = []  # running in-memory traces, oldest first
_last: Trace | None = None
_encoders: dict[int, Encoder] = {}
_fork_hook = False


def _encoder() -> Encoder:
    """This process's encoder for in-memory traces that run without a file session. Same pid
    and host hash as a session's, so both can share the kinds' cached templates."""
    pid = os.getpid()
    enc = _encoders.get(pid)
    if enc is None:
        s = _lifecycle.session()
        if s is not None and s.pid == pid:
            hhash, offset = s.hhash, s.offset_ns
        else:
            hhash = hostname_hash(socket.gethostname())
            offset = time.time_ns() - time.perf_counter_ns()
        enc = Encoder(pid, hhash, offset, _tree._max_arg_length)
        _encoders.clear()
        _encoders[pid] = enc
    return enc


def _deliver(data: bytes) -> None:
    """Hand an encoded batch to every running in-memory trace (the buffer's tap)."""
    for c in list(_active):
        c._chunks.append(data)


def _drain() -> None:
    """Take everything buffered and deliver it (when no file session consumes it)."""
    with _lock:
        enc = _encoder()
        target = _buffer.buffered()  # what is buffered now, and no more (a steady load)
        total = 0
        while True:
            data, n = _buffer.drain(enc, 65536)
            if data:
                _deliver(data)
            total += n
            if n == 0 or total >= target or not _buffer.buffered():
                return


class _MemoryConsumer(_buffer.Consumer):
    """Drains the record buffer into running in-memory traces while no file session does."""

    def wake(self) -> None:
        _drain()

    def wait_drained(self, below: int, timeout: float) -> bool:
        _drain()
        return True

    def flush(self, timeout: float = -1) -> int:
        before = _buffer.buffered()
        _drain()
        return before


_CONSUMER = _MemoryConsumer()


def _collect() -> None:
    """Bring every record buffered so far to the running in-memory traces (a session's
    writer hands them to the tap, _deliver)."""
    (STATE.consumer or _CONSUMER).flush()


def _start_tap() -> None:
    """The first in-memory trace started: batches go to _deliver too, and while no
    session consumes the buffer, in-memory traces consume it themselves."""
    if STATE.consumer is None:
        _buffer.attach(_CONSUMER)
    _buffer.set_tap(_deliver)


def _stop_tap() -> None:
    """The last in-memory trace ended (or they are forgotten)."""
    _buffer.detach(_CONSUMER)
    if STATE.tap is _deliver:
        _buffer.set_tap(None)


def _apply_max_items() -> None:
    limits = [c.max_items for c in _active if c.max_items is not None]
    # Nested sampling in-memory traces: the innermost one that set a limit wins.
    _tree.set_max_items(limits[-1] if limits else None)


def _after_fork_in_child() -> None:
    # A forked child (a DataLoader worker) cannot hand events back to the parent's
    # memory: stop tracing into memory there, and never wait on a lock held by a parent thread.
    global _lock
    _lock = threading.RLock()
    _active.clear()
    _encoders.clear()
    _stop_tap()  # the child's session writes to its file only
    STATE.memory_traces = 0
    _tree.set_max_items(None)
    _lifecycle._set_gate()


def _describe(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # an exception whose __str__ raises
        return type(exc).__name__


def _add_note(exc: BaseException, note: str) -> None:
    try:
        if hasattr(exc, "add_note"):
            exc.add_note(note)
        else:  # Python 3.10: the attribute add_note would set
            exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]
    except Exception:
        pass


class InMemoryTracing:
    """``with dftrace.trace_in_memory() as t:`` -- see :func:`trace_in_memory`."""

    def __init__(self, max_items: int | None = None):
        if max_items is not None and (isinstance(max_items, bool) or not isinstance(max_items, int)
                                      or max_items < 1):
            raise ValueError("trace_in_memory(max_items=...) takes a positive int or None; "
                             f"got {max_items!r}")
        self.max_items = max_items
        self.trace: Trace | None = None
        self._chunks: list[bytes] = []
        self._first_id = 0
        self._running = False

    def __enter__(self) -> Trace:
        global _fork_hook
        with _lock:
            if self._running:
                raise RuntimeError("this dftrace.trace_in_memory() is already running")
            if not _fork_hook and hasattr(os, "register_at_fork"):
                os.register_at_fork(after_in_child=_after_fork_in_child)
                _fork_hook = True
            self.trace = Trace(max_items=self.max_items)
            self._chunks = []
            self._first_id = _engine.new_id()  # spans opened before this are not ours
            self._running = True
            _active.append(self)
            STATE.memory_traces += 1
            _apply_max_items()
            _start_tap()
        _lifecycle._set_gate()
        return self.trace

    def __exit__(self, et: Any, ev: Any, tb: Any) -> bool:
        global _last
        trace = self.trace
        try:
            try:
                _collect()
            finally:
                with _lock:
                    if self in _active:
                        _active.remove(self)
                        STATE.memory_traces = max(0, STATE.memory_traces - 1)
                    if not _active:
                        _stop_tap()
                    _apply_max_items()
                    self._running = False
                _lifecycle._set_gate()
            if trace is not None:
                trace._fill(self._events(), error=None if ev is None else _describe(ev))
        except Exception as exc:  # never let the trace hide the block's own outcome
            STATE.warn_once("trace_in_memory",
                            f"trace_in_memory could not build its trace: {exc!r}")
        finally:
            self._chunks = []
        _last = trace
        if ev is not None and trace is not None and not isinstance(ev, (SystemExit, GeneratorExit)):
            _add_note(ev, f"dftrace: the in-memory trace recorded {len(trace)} call(s) before "
                          "this error; browse them in the object `with dftrace.trace_in_memory() "
                          "as ...` bound, or dftrace.last_in_memory_trace().")
        return False

    def _events(self) -> list[dict[str, Any]]:
        first = self._first_id
        out: list[dict[str, Any]] = []
        for chunk in self._chunks:
            for line in chunk.split(b"\n"):
                if not line:
                    continue
                try:
                    ev = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                i = ev.get("id") if isinstance(ev, dict) else None
                if isinstance(i, int) and i > first:
                    out.append(ev)
        return out

    def __repr__(self) -> str:
        state = "running" if self._running else "idle"
        return f"<dftrace.InMemoryTracing max_items={self.max_items} {state}>"


def trace_in_memory(max_items: int | None = None) -> InMemoryTracing:
    """Record a block into memory and browse it as a :class:`Trace`::

        with dftrace.trace_in_memory(max_items=4) as t:
            train_one_epoch()
        t.compute.forward[0].params.x.shape

    No files are written and no ``initialize`` is needed; a running file session
    keeps writing as well. ``t`` is filled when the block ends, also when it raises
    (the exception then carries a note saying so, and :func:`last_in_memory_trace`
    returns the partial trace). ``max_items=N`` is sample mode: every ``.iter()`` called
    inside the block yields at most N items.
    """
    return InMemoryTracing(max_items)


def last_in_memory_trace() -> Trace | None:
    """The :class:`Trace` of the most recent :func:`trace_in_memory` block to end
    (also one that raised), or None."""
    return _last


# -- the names of 0.1.0, deprecated ------------------------------------------------------

class Capture(InMemoryTracing):
    """Deprecated name of :class:`InMemoryTracing`."""

    def __init__(self, max_items: int | None = None):
        STATE.warn_deprecated("dftrace.Capture", "dftrace.InMemoryTracing")
        super().__init__(max_items)


def capture(max_items: int | None = None) -> InMemoryTracing:
    """Deprecated name of :func:`trace_in_memory`."""
    STATE.warn_deprecated("dftrace.capture()", "dftrace.trace_in_memory()")
    return InMemoryTracing(max_items)


def last_capture() -> Trace | None:
    """Deprecated name of :func:`last_in_memory_trace`."""
    STATE.warn_deprecated("dftrace.last_capture()", "dftrace.last_in_memory_trace()")
    return _last


def reset_state() -> None:
    """Forget running in-memory traces and the last trace (``dftrace.testing.reset``)."""
    global _last
    with _lock:
        for c in _active:
            c._running = False
        _active.clear()
        _stop_tap()
        _encoders.clear()
        _last = None
        _tree.set_max_items(None)


STATE.on_reset(reset_state, order=1)
