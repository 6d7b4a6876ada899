"""Taking records from the engine's buffer, encoding them and writing trace files.

The :class:`Writer` is a background thread. It wakes every ``flush_interval`` (or
sooner when producers report a full batch), takes what is buffered in frames of at
most ``max_batch`` records, and appends each frame to the file as ONE independent
zstd frame / gzip member. With the C engine the encoding, the compression and the
write all run with the GIL released, so traced threads keep running; the writer
holds the GIL only to detach the records and to hand the bytes on. A process killed
at any moment leaves a file that decodes up to its last complete flush.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from . import buffer as _buffer
from .buffer import Consumer, tapped, to_tap
from .state import STATE
from .records import Encoder
from .sink import FileSink, native_compressions

__all__ = ["Patience", "Writer"]

#: However the writing progresses, finishing a file gives up after this long: no
#: healthy finish comes near it (measured: 8 ranks on 2 cores writing 500,000 events
#: each finish in under 3 s), so reaching it means a writer far too slow for its load.
FINISH_CAP_S = 300.0


class Patience:
    """How long to wait for a writer that is finishing: it may take ``idle_s``
    seconds without progress (storage that stopped answering), and ``cap_s`` in all
    (a writer too slow for its load). Slow is not stuck: while progress is made, the
    wait goes on. ``left(progress)`` takes any value that changes when the writer
    gets on (bytes written, records taken, the drainer's commits)."""

    def __init__(self, idle_s: float, cap_s: float = FINISH_CAP_S) -> None:
        now = time.monotonic()
        self.idle_s = max(0.0, idle_s)
        self.start = now
        self.end = now + max(cap_s, self.idle_s)
        self._last: Any = None
        self._since = now
        #: Why the wait ended without the writer finishing: "stalled" (no progress
        #: for idle_s) or "too slow" (cap_s in all); None while it goes on.
        self.reason: str | None = None

    def left(self, progress: Any) -> float:
        """Seconds the caller may still wait; 0.0 (and ``reason`` set) when it must give up."""
        now = time.monotonic()
        if progress != self._last:
            self._last, self._since = progress, now
        idle_left = self._since + self.idle_s - now
        cap_left = self.end - now
        if idle_left <= 0:
            self.reason = "stalled"
            return 0.0
        if cap_left <= 0:
            self.reason = "too slow"
            return 0.0
        return min(idle_left, cap_left)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def exhausted(self) -> bool:
        """No time left, progress as last seen."""
        return self.left(self._last) <= 0


_WRITER_THREAD = "dftrace-writer"


class Writer(Consumer):
    """Background consumer of the record buffer for one process."""

    def __init__(self, encoder: Encoder, sink: FileSink, flush_interval: float,
                 source: Callable[[Encoder, int], tuple[bytes, int]] = _buffer.drain,
                 deliver: bool = True):
        self.encoder = encoder
        #: Where the records come from: the engine's buffer, or a shared-memory ring
        #: whose drainer process is gone (see ``_core.drain.process_writer``).
        self.source = source
        #: Hand batches to the tap (not when another consumer did already: the
        #: ring of a process writer whose drainer is gone).
        self.deliver = deliver
        self.sink = sink
        self.flush_interval = flush_interval
        #: Most records in one frame; a bigger backlog is written as several frames.
        self.max_batch = 16384
        self._wake = threading.Event()
        self._drained = threading.Condition(threading.Lock())
        self._flush_lock = threading.Lock()
        self._busy_since = 0.0  # monotonic start of the flush under way (0: none)
        self._stop = False
        self._trailer: Callable[[], bytes] | None = None
        self._finished = False
        self._started = 0  # flush rounds of the thread begun, and ended (see sync)
        self._completed = 0
        self.events_written = 0
        self._thread = threading.Thread(target=self._run, name=_WRITER_THREAD, daemon=True)
        try:
            self._thread.start()
        except RuntimeError:
            # Python 3.12 starts no thread once the interpreter is shutting down (a
            # writer made at exit: the drainer lost in finalize()); stop() then
            # writes everything on the caller's thread.
            if threading.main_thread().is_alive():
                raise

    #: Most records the C engine takes in one go (written as frames of max_batch).
    NATIVE_TAKE = 262_144

    # the consumer protocol (see buffer.Consumer) ---------------------------------
    #: One flush taking longer than this (or two flush intervals) means the storage
    #: stalled (a hung mount, a FIFO nobody reads): producers stop waiting for it.
    STALL_S = 1.0

    def _busy(self) -> float:
        """``time.monotonic()`` when the write under way began (0.0: none)."""
        return self._busy_since or _buffer.writing_since()

    def stalled(self) -> bool:
        since = self._busy()
        return bool(since) and time.monotonic() - since > max(self.STALL_S, 2 * self.flush_interval)

    def wake(self) -> None:
        """A producer found a full batch buffered: wake the writer. If the writer
        has already been writing for more than a flush interval (it cannot keep up
        with this rate), the producer waits until it is done (block mode only), so
        a kill -9 loses about one flush interval of events, not a full buffer. A
        stalled writer is not waited for."""
        self._wake.set()
        if STATE.batch_size < _buffer.chunk_records():
            _buffer.kick()  # the engine's loop takes whole chunks only: a smaller batch is ours
        since = self._busy()
        if (since and not STATE.drop_when_full
                and time.monotonic() - since > self.flush_interval
                and threading.current_thread() is not self._thread):
            # Poll without holding a lock: a signal handler may run in this thread.
            while self._busy() == since and not self.stalled():
                time.sleep(0.001)

    def wait_drained(self, below: int, timeout: float) -> bool:
        """Wait until at most ``below`` records are buffered; False on timeout or
        when the writer is stalled (the caller then drops and counts)."""
        if threading.current_thread() is self._thread or not self._thread.is_alive():
            return False
        self._wake.set()
        _buffer.kick()
        deadline = time.monotonic() + timeout
        with self._drained:
            while _buffer.buffered() > below:
                left = deadline - time.monotonic()
                if left <= 0 or self.stalled():
                    return False
                self._drained.wait(min(left, 0.05))
        return True

    # ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop:
            if not self._write_loop():
                self._wake.wait(self.flush_interval)
            self._wake.clear()
            if self._stop:
                break
            self._started += 1
            try:
                self.flush()
            except Exception as exc:  # never let the thread die silently
                STATE.warn_once("writer", f"writer error: {exc!r}")
            self._completed += 1
        self._finish()

    def _finish(self) -> None:
        """Last flush and the trailer, on the writer's thread (see :meth:`stop`)."""
        try:
            self.flush()
            trailer = self._trailer
            if trailer is not None:
                # Once: stop() may find this thread gone only after it closed the file
                # (a second close would record the losses elsewhere too).
                self._finished = True
                self.sink.close(trailer())
        except Exception as exc:
            STATE.warn_once("writer", f"writer error: {exc!r}")

    def _native_level(self) -> int | None:
        """The level for the engine's own writing (see FileSink.native_level), or None:
        an in-memory trace taps the batches, the records come from elsewhere (a shared ring), or the
        sink can't take it."""
        if (tapped() and self.deliver) or self.source is not _buffer.drain:
            return None
        if not self.sink.opened and self.sink.compression in native_compressions() and _buffer.buffered():
            self.sink.open_now()  # the header in Python, then every frame from the engine
        return self.sink.native_level()

    def _write_loop(self) -> bool:
        """Wait one flush interval in the C engine, which writes full batches
        meanwhile without the GIL; False where it can't (then the thread waits and
        flushes in Python)."""
        level = self._native_level()
        if level is None or not self._flush_lock.acquire(blocking=False):
            return False
        try:
            room = (self.sink.max_size - self.sink.bytes_written) if self.sink.max_size else 0
            result = _buffer.write_loop(self.encoder, self.max_batch, self.flush_interval,
                                     max(room, 1) if self.sink.max_size else 0,
                                     self.sink.fd, level)  # type: ignore[arg-type]
            if result is None:
                return False
            taken, written, nbytes, err, nlink = result
            if taken:
                self.sink.wrote_natively(taken, written, nbytes, err, nlink)
                self.events_written += written
                self._notify_drained()
            return True
        finally:
            self._flush_lock.release()

    def sync(self, timeout: float) -> bool:
        """Have the writer thread write everything buffered now and wait for it, at
        most ``timeout`` seconds. The caller never touches the file itself, so a
        stalled disk or a flush it interrupted (a signal handler) cannot hold it."""
        if not self._thread.is_alive() or threading.current_thread() is self._thread:
            return False
        target = self._started + 1
        self._wake.set()
        _buffer.kick()
        deadline = time.monotonic() + timeout
        while self._completed < target:
            if time.monotonic() >= deadline or not self._thread.is_alive():
                return False
            time.sleep(0.001)  # polling: no lock a signal handler could find held
        return True

    def flush(self, timeout: float = -1) -> int:
        """Encode and write everything buffered now; returns the number of records.
        With a ``timeout`` (seconds), give up when another flush holds the writer
        that long (a signal handler must not wait forever)."""
        if threading.current_thread() is not self._thread:
            _buffer.kick()  # the thread's loop holds the lock until it returns
        if not self._flush_lock.acquire(timeout=timeout):
            return 0
        self._busy_since = time.monotonic()
        try:
            return self._flush()
        finally:
            self._busy_since = 0.0
            self._flush_lock.release()

    def _flush(self) -> int:
        # Everything buffered when the flush began, and no more: under a steady
        # load a flush still ends.
        target = _buffer.buffered()
        total = 0
        while True:
            n = self._flush_batch()
            total += n
            if n == 0:
                return total
            if self.source is _buffer.drain:
                if total >= target or not _buffer.buffered():
                    return total
            elif n < self.max_batch:  # another source (a shared ring): until a short batch
                return total

    def _flush_batch(self) -> int:
        """One frame: at most ``max_batch`` records from the front of the buffer."""
        if self.sink.failed and not (tapped() and self.deliver):
            _, n = self.source(self.encoder, self.max_batch)  # nowhere to go: counted
            self.sink.events_lost += n
            return n
        level = self._native_level()
        if level is not None:
            # Everything buffered (up to NATIVE_TAKE) as frames of max_batch, the
            # GIL taken once for all of them.
            taken, written, nbytes, err, nlink = _buffer.drain_to_file(
                self.encoder, self.max_batch, self.NATIVE_TAKE, self.sink.fd, level)
            if taken:
                self.sink.wrote_natively(taken, written, nbytes, err, nlink)
                self.events_written += written
            self._notify_drained()
            return taken
        data, n = self.source(self.encoder, self.max_batch)
        self._notify_drained()
        if not data:
            return n
        if self.deliver:
            to_tap(data)
        self.sink.write(data, n)
        self.events_written += n
        return n

    def _notify_drained(self) -> None:
        # Never wait for this lock: a producer blocked in wait_drained polls
        # anyway, and a signal handler may hold it in the thread it interrupted.
        if self._drained.acquire(blocking=False):
            try:
                self._drained.notify_all()
            finally:
                self._drained.release()

    def stop(self, timeout: float = 30.0, trailer: Callable[[], bytes] | None = None,
             patience: Patience | None = None) -> bool:
        """Stop the thread after it wrote what is left and ``trailer()`` (idempotent).
        Waits while the writing progresses, at most ``timeout`` seconds without
        progress (or as ``patience`` says): past that the storage is stalled (or the
        writer far too slow: ``patience.reason``), and the file is abandoned (the
        events not written are counted in ``sink.events_lost`` plus whatever is still
        buffered). True when done."""
        self._trailer = trailer
        self._stop = True
        self._wake.set()
        _buffer.kick()
        if threading.current_thread() is self._thread:
            return False
        if not self._thread.is_alive():
            if not self._finished:
                self._finished = True
                self._finish()
            return True
        patience = patience or Patience(timeout)
        while True:
            left = patience.left((self.sink.bytes_written, self.events_written,
                                  _buffer.buffered(), _buffer.frames_written()))
            if left <= 0:
                break
            self._thread.join(timeout=min(left, 0.05))
            if not self._thread.is_alive():
                self._finished = True
                return True
        self.sink.abandon(close=True, writing=_buffer.in_flight())
        return False
