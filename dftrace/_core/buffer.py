"""The record buffer and the one way out of it: a :class:`Consumer`.

The engine appends span records here (:data:`BUFFER`, or the C engine's native
chunks) and metadata/counter/instant records to :data:`SPECIALS`. Exactly one
consumer takes them out at a time (``STATE.consumer``, set with :func:`attach`):
the writer thread (``writer.Writer``), the drainer's client (``shm.ProcessWriter``)
or, while no session runs, the in-memory traces' own (``_inspect.memory``). The
engine calls the consumer's ``wake`` at every full batch and ``wait_drained`` at the
buffer's limit (block mode).

A copy of every encoded batch can go to one *tap* (:func:`set_tap`): the running
in-memory traces (``dftrace.trace_in_memory()``). Whoever consumes the buffer hands each
batch to the tap (:func:`to_tap`) before writing it anywhere, and is told when the
tap comes or goes (``Consumer.tap_changed``): the writer thread then encodes in
Python instead of in the C engine, the process writer keeps records in process
memory and relays them to its ring.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from . import state as _state
from .state import STATE

__all__ = ["BUFFER", "SPECIALS", "Consumer", "attach", "buffered", "detach", "discard_buffered",
           "drain", "drain_to_file", "frames_written", "in_flight", "kick", "native_compressions",
           "set_tap", "tapped", "to_tap", "wait_for_room", "wake_consumer", "write_loop",
           "writing_since"]

#: The pure-Python engine's span records (tuples, see ``records``); the C engine keeps
#: them in native memory instead. Never rebound.
BUFFER: list[tuple] = []
#: Metadata, counter and instant records ``(kind, t_ns, id, tid, payload)``: rare, so
#: they stay Python objects in both engines and are encoded by the consumer.
SPECIALS: list[tuple] = []


class Consumer:
    """What takes the records out of the buffer. The engine calls ``wake`` and
    ``wait_drained``; in-memory traces call ``flush``; :func:`set_tap` calls
    ``tap_changed``. Each encoded batch goes to :func:`to_tap` before anywhere else."""

    def wake(self) -> None:
        """A batch is ready (``batch_size`` records, or a slot of the ring is full)."""

    def wait_drained(self, below: int, timeout: float) -> bool:
        """The buffer is at ``buffer_limit`` (block mode): return once at most
        ``below`` records wait; False when it gave up (the record is then dropped
        and counted)."""
        return False

    def flush(self, timeout: float = -1) -> int:
        """Hand everything recorded so far on now (to the tap too); the number of
        records."""
        return 0

    def tap_changed(self) -> None:
        """The tap came or went (an in-memory trace started, or the last one ended)."""


def attach(consumer: Consumer | None) -> Consumer | None:
    """Make ``consumer`` the one that takes the records (None: nobody); returns the
    one before it."""
    previous = STATE.consumer
    STATE.consumer = consumer
    return previous


def detach(consumer: Consumer) -> None:
    """``consumer`` stops taking the records (if it still does)."""
    if STATE.consumer is consumer:
        STATE.consumer = None


def set_tap(tap: Callable[[bytes], None] | None) -> None:
    """Copy every encoded batch to ``tap`` from now on (None: to nobody), and tell
    the consumer. A consumer that fails to follow warns once."""
    STATE.tap = tap
    consumer = STATE.consumer
    if consumer is not None:
        try:
            consumer.tap_changed()
        except Exception as exc:
            STATE.warn_once("tap", f"the writer could not follow the in-memory trace: {exc!r}")


def tapped() -> bool:
    """Encoded batches go to a tap too."""
    return STATE.tap is not None


def to_tap(data: bytes) -> None:
    """Hand an encoded batch to the tap (a failing tap is skipped)."""
    tap = STATE.tap
    if tap is not None:
        try:
            tap(data)
        except Exception:
            pass


# ---------------------------------------------------------------------------
# Producers' side (the engine): room and wake-ups.
# ---------------------------------------------------------------------------

def room() -> bool:
    """At the buffer limit: True once the consumer made room (block mode)."""
    if STATE.drop_when_full:
        return False
    try:
        wait_for_room()
    except Exception:
        return False
    return len(BUFFER) < STATE.buffer_limit


def _consumer() -> Consumer | None:
    """The consumer, unless this process is the child of a fork() made from C (no
    at-fork hook ran): the parent's consumer has no thread here, and its locks may
    have been copied held by a thread that does not exist here."""
    c = STATE.consumer
    return c if c is not None and STATE.pid == os.getpid() else None


def wait_for_room() -> None:
    """Block until the consumer drained the buffer to half its limit (or gave up).
    Signals are not swallowed: their exceptions propagate to the recording call."""
    c = _consumer()
    if c is not None:
        c.wait_drained(STATE.buffer_limit // 2, 10.0)


def wake_consumer() -> None:
    STATE.woken = True
    c = _consumer()
    if c is not None:
        try:
            c.wake()
        except Exception:
            pass


# ---------------------------------------------------------------------------
# Consumers' side: what is buffered, and taking it.
# ---------------------------------------------------------------------------

def buffered() -> int:
    """Span records waiting for the consumer."""
    native = _state.native
    return native.buffered() if native is not None else len(BUFFER)


def discard_buffered() -> None:
    """Forget every buffered record (a forked child's copy of its parent's)."""
    del BUFFER[:]
    del SPECIALS[:]
    STATE.woken = False
    if _state.native is not None:
        _state.native.reset()


def _take_specials(encoder: Any) -> tuple[bytes, int]:
    """The lines of every special record buffered (taken), and how many."""
    if not SPECIALS:
        return b"", 0
    specials = SPECIALS[:]
    del SPECIALS[:len(specials)]
    return b"".join(encoder.special_line(r) for r in specials), len(specials)


def drain(encoder: Any, max_records: int) -> tuple[bytes, int]:
    """Take up to ``max_records`` span records (and every special record) and return
    their lines. With the C engine the encoding runs with the GIL released."""
    out, taken = _take_specials(encoder)
    native = _state.native
    if native is not None:
        data, n = native.drain(max_records, encoder.pid_piece, encoder.hh_piece,
                               encoder.offset_ns, encoder.min_id)
    else:
        n = min(len(BUFFER), max_records)
        batch = BUFFER[:n]
        del BUFFER[:n]
        STATE.woken = False
        data = encoder.encode_spans(batch)
    return out + data if out else data, n + taken


def native_compressions() -> tuple[str, ...]:
    """The compressions :func:`drain_to_file` can write ("none", "zstd", "gzip"), or
    none (the pure-Python engine; zstd needs the system's libzstd, gzip its
    libdeflate)."""
    native = _state.native
    return tuple(native.native_write()) if native is not None else ()


def chunk_records() -> int:
    """Records per chunk of the C engine (its write loop takes whole chunks); 1
    without it."""
    return getattr(_state.native, "CHUNK_RECORDS", 1)


def drain_to_file(encoder: Any, frame_records: int, max_records: int, fd: int,
                  level: int) -> tuple[int, int, int, int, int]:
    """Like :func:`drain`, but the C engine also compresses (``level`` < 0: none;
    0..22: zstd at that level; 100 + n: gzip at level n) and appends to ``fd``, as
    frames of at most ``frame_records`` records, all with the GIL released once.
    Returns (records taken, records written, bytes written, errno or 0, the file's
    link count or -1); on an error, written records and bytes count whole frames
    only."""
    prefix, taken = _take_specials(encoder)
    n, done, nbytes, err, nlink = _state.native.drain_write(
        fd, level, frame_records, max_records, encoder.pid_piece, encoder.hh_piece,
        encoder.offset_ns, encoder.min_id, prefix)
    # the specials went into the first frame: written unless that one failed
    return n + taken, done + (taken if done or not err else 0), nbytes, err, nlink


def write_loop(encoder: Any, frame_records: int, seconds: float, max_bytes: int, fd: int,
               level: int) -> tuple[int, int, int, int, int] | None:
    """The writer thread's wait with the C engine: for ``seconds`` (or until
    :func:`kick`), write every full batch of records to ``fd`` as frames, without
    the GIL (records still in the chunk being filled, and metadata records, are left
    for :func:`drain_to_file`). Returns (records taken, records written, bytes
    written, errno or 0, link count or -1), or None where the engine has no such
    loop (the caller waits and drains instead)."""
    loop = getattr(_state.native, "write_loop", None)
    if loop is None:
        return None
    return loop(fd, level, frame_records, seconds, max_bytes, encoder.pid_piece,
                encoder.hh_piece, encoder.offset_ns, encoder.min_id)


def kick() -> None:
    """Make a :func:`write_loop` under way return now."""
    k = getattr(_state.native, "kick", None)
    if k is not None:
        k()


def writing_since() -> float:
    """``time.monotonic()`` when the write a :func:`write_loop` is doing began (0.0:
    none)."""
    w = getattr(_state.native, "writing_since", None)
    return w() if w is not None else 0.0


def frames_written() -> int:
    """Frames the C engine has written whole in this process (0 without it): it moves
    frame by frame inside one long write of many frames."""
    f = getattr(_state.native, "frames_written", None)
    return f() if f is not None else 0


def in_flight() -> int:
    """Records taken by a :func:`drain_to_file` that has not returned (a write
    stuck on storage)."""
    native = _state.native
    return native.in_flight() if native is not None else 0
