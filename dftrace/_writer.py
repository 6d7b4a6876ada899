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

import os
import threading
import time
import zlib
from typing import Any

from . import _recorder as _rec
from ._events import Encoder

__all__ = ["FileSink", "Writer", "SUFFIXES"]

SUFFIXES = {"zstd": ".pfw.zst", "gzip": ".pfw.gz", "none": ".pfw"}

_WRITER_THREAD = "dftrace-writer"

#: Called with each encoded batch before it is written: in-memory captures
#: (``dftrace.capture()``) running beside a file session. Empty otherwise.
LISTENERS: list[Any] = []


class FileSink:
    """Appends compressed frames to ``<base>.pfw[.zst|.gz]``, rotating to part files
    past ``max_size`` bytes. Any OS error disables the sink with one warning."""

    def __init__(self, base: str, compression: str, level: int | None, max_size: int = 0,
                 header: bytes = b""):
        self.base = base
        self.compression = compression
        self.suffix = SUFFIXES[compression]
        self.level = level
        self.max_size = max_size
        self.header = header  # written at the top of every part file
        self.part = 0
        self.paths: list[str] = []
        self.bytes_written = 0
        self.failed: str | None = None
        self._fd: int | None = None
        if compression == "zstd":
            import zstandard  # at the first session, not at ``import dftrace``

            self._zc = zstandard.ZstdCompressor(level=3 if level is None else level)
        self._open()

    @property
    def path(self) -> str:
        return self.paths[-1]

    def _open(self) -> None:
        name = self.base + (f".part{self.part}" if self.part else "") + self.suffix
        self._fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self.paths.append(name)
        self.bytes_written = 0
        self._write_raw(self.header)

    def _compress(self, data: bytes) -> bytes:
        """One zstd frame / gzip member from ``data``. (zstandard's streaming
        ``compressobj`` releases the GIL while it works; its one-shot ``compress``
        does not.)"""
        if self.compression == "zstd":
            c = self._zc.compressobj(size=len(data))
            return c.compress(data) + c.flush()
        if self.compression == "gzip":  # wbits 31: a complete gzip member
            c = zlib.compressobj(6 if self.level is None else self.level, zlib.DEFLATED, 31)
            return c.compress(data) + c.flush()
        return data

    def _write_raw(self, data: bytes) -> None:
        # bytes_written only counts whole frames: on failure the file is cut back
        # to it, so what stays on disk always decodes.
        if not data or self._fd is None:
            return
        out = self._compress(data)
        view = memoryview(out)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        self.bytes_written += len(out)

    def write(self, data: bytes) -> None:
        if self.failed or not data:
            return
        try:
            if self.max_size and self.bytes_written >= self.max_size:
                self._rotate()
            self._write_raw(data)
        except Exception as exc:
            self._fail(exc)

    def _rotate(self) -> None:
        self._write_raw(b"]\n")
        os.close(self._fd)  # type: ignore[arg-type]
        self._fd = None
        self.part += 1
        self._open()

    def _fail(self, exc: BaseException) -> None:
        self.failed = f"{type(exc).__name__}: {exc}"
        _rec.STATE.warn_once(
            "sink-failed",
            f"writing {self.path} failed ({self.failed}); tracing stops, the run goes on. "
            "The file written so far stays readable.")
        try:
            if self._fd is not None:
                # Drop a frame cut short by the failure (e.g. disk full); shrinking
                # a file needs no space.
                os.ftruncate(self._fd, self.bytes_written)
        except OSError:
            pass
        try:
            if self._fd is not None:
                os.close(self._fd)
        except OSError:
            pass
        self._fd = None

    def close(self, trailer: bytes = b"]\n") -> None:
        if self._fd is None:
            return
        try:
            self._write_raw(trailer)
        except Exception as exc:
            self._fail(exc)
            return
        try:
            os.close(self._fd)
        except OSError:
            pass
        self._fd = None

    def abandon(self) -> None:
        """Forget the file descriptor without writing (a forked child's copy)."""
        self._fd = None


class Writer:
    """Background consumer of the record buffer for one process."""

    def __init__(self, encoder: Encoder, sink: FileSink, flush_interval: float):
        self.encoder = encoder
        self.sink = sink
        self.flush_interval = flush_interval
        #: Most records in one frame; a bigger backlog is written as several frames.
        self.max_batch = 16384
        self._wake = threading.Event()
        self._drained = threading.Condition(threading.Lock())
        self._flush_lock = threading.Lock()
        self._busy_since = 0.0  # monotonic start of the flush under way (0: none)
        self._stop = False
        self.events_written = 0
        self._thread = threading.Thread(target=self._run, name=_WRITER_THREAD, daemon=True)
        self._thread.start()

    # consumer protocol used by _recorder.pressure -----------------------------
    def wake(self) -> None:
        """A producer found a full batch buffered: wake the writer. If the writer
        has already been writing for more than a flush interval (it cannot keep up
        with this rate), the producer waits until it is done (block mode only), so
        a kill -9 loses about one flush interval of events, not a full buffer."""
        self._wake.set()
        since = self._busy_since
        if (since and not _rec.STATE.drop_when_full
                and time.monotonic() - since > self.flush_interval
                and threading.current_thread() is not self._thread):
            deadline = time.monotonic() + 10.0
            # Poll without holding a lock: a signal handler may run in this thread.
            while self._busy_since == since and time.monotonic() < deadline:
                time.sleep(0.001)

    def wait_drained(self, below: int, timeout: float) -> bool:
        if threading.current_thread() is self._thread or not self._thread.is_alive():
            return False
        self._wake.set()
        deadline = time.monotonic() + timeout
        with self._drained:
            while _rec.buffered() > below:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._drained.wait(min(left, 0.05))
        return True

    # ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            if self._stop:
                break
            try:
                self.flush()
            except Exception as exc:  # never let the thread die silently
                _rec.STATE.warn_once("writer", f"writer error: {exc!r}")

    def flush(self, timeout: float = -1) -> int:
        """Encode and write everything buffered now; returns the number of records.
        With a ``timeout`` (seconds), give up when another flush holds the writer
        that long (a signal handler must not wait forever)."""
        if not self._flush_lock.acquire(timeout=timeout):
            return 0
        self._busy_since = time.monotonic()
        try:
            return self._flush()
        finally:
            self._busy_since = 0.0
            self._flush_lock.release()

    def _flush(self) -> int:
        total = 0
        while True:
            n = self._flush_batch()
            total += n
            if n < self.max_batch:
                return total

    def _flush_batch(self) -> int:
        """One frame: at most ``max_batch`` records from the front of the buffer."""
        if self.sink.failed and not LISTENERS:
            _, n = _rec.drain(self.encoder, self.max_batch)  # nowhere to go: counted
            _rec.STATE.dropped += n
            return n
        data, n = _rec.drain(self.encoder, self.max_batch)
        # Never wait for this lock: a producer blocked in wait_drained polls
        # anyway, and a signal handler may hold it in the thread it interrupted.
        if self._drained.acquire(blocking=False):
            try:
                self._drained.notify_all()
            finally:
                self._drained.release()
        if not data:
            return n
        for listener in LISTENERS:
            try:
                listener(data)
            except Exception:
                pass
        self.sink.write(data)
        self.events_written += n
        return n

    def stop(self) -> None:
        """Stop the thread and flush what is left (idempotent)."""
        self._stop = True
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)
        self.flush()
