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
import stat
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

from . import buffer as _buffer
from .buffer import Consumer, tapped, to_tap
from .state import STATE
from .records import Encoder

__all__ = ["FileSink", "Patience", "Writer", "SUFFIXES"]

SUFFIXES = {"zstd": ".pfw.zst", "gzip": ".pfw.gz", "none": ".pfw"}

#: zstd's level when none is configured: on trace lines level 1 is both faster and
#: smaller than 3 (measured in docs/performance.md).
_ZSTD_LEVEL = 1

#: gzip's level when none is configured, in Python and in the engine: on trace lines
#: level 1 writes files as small as 6 (4.3 bytes per event either way) at about half
#: the CPU (measured in docs/performance.md).
_GZIP_LEVEL = 1

#: The engine's ``level`` for gzip at level n is _GZIP_LEVEL_BASE + n (see dftrace/_core/engine_c/writer.c).
_GZIP_LEVEL_BASE = 100

#: What the C engine can compress and write itself, the GIL released (see
#: :meth:`FileSink.native_level`); found at the first session (it loads libzstd),
#: not at import. Set to an empty set to force the Python path.
_NATIVE: set[str] | None = None


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


def _native() -> set[str]:
    global _NATIVE
    if _NATIVE is None:
        _NATIVE = set(_buffer.native_compressions())
    return _NATIVE

_WRITER_THREAD = "dftrace-writer"


class FileSink:
    """Appends compressed frames to ``<base>.pfw[.zst|.gz]``, rotating to part files
    past ``max_size`` bytes. Any OS error disables the sink with one warning, at
    once, that counts the events lost so far; every event after it is counted too.

    The file is created at the first write (a process that records nothing, or a
    forked child that execs, leaves no file), exclusively: an existing file of that
    name (pid reuse, a rerun) is never truncated; the next free ``<base>.<N>`` is
    taken instead, as for a symbolic link there. A FIFO already there under the
    exact name is written into (a reader consumes the stream live) only when this
    user owns it and a reader has it open; otherwise the next name is taken (a FIFO
    planted by another user in a shared directory gets nothing, and one nobody reads
    never blocks the writer). Files are created with ``mode`` (less the umask).
    ``header`` (bytes, or a function returning them, called at the first write)
    opens every part file.

    A file is finished with ``fdatasync`` and ``close``, both checked: storage that
    takes every write and fails at the end (NFS write-back: EIO, EDQUOT) loses the
    whole file, and its events are counted, the file is taken out of ``paths`` (into
    ``unsaved``) and ``warn`` says so. A file cut by a failed write (a full disk)
    ends, where the storage takes it at the end, with a ``dropped`` record
    (``meta(name, args)`` makes it) and ``]``; where it does not, the record goes to
    :func:`loss_record_dir` (``loss_record`` names the file), so that the trace's
    owner finds what the file cannot say."""

    def __init__(self, base: str, compression: str, level: int | None, max_size: int = 0,
                 header: bytes | Callable[[], bytes] = b"", mode: int = 0o644,
                 meta: Callable[[str, dict[str, Any]], bytes] | None = None,
                 warn: Callable[[str, str], None] | None = None):
        self.base = base
        self.mode = mode
        self.compression = compression
        self.suffix = SUFFIXES[compression]
        self.level = level
        self.max_size = max_size
        self._header = header  # written at the top of every part file
        self.part = 0
        self.run = 0  # N of <base>.<N> when <base> was taken
        self.paths: list[str] = []
        #: Files the storage did not keep (fdatasync or close failed): not in paths.
        self.unsaved: list[str] = []
        #: Where the ``dropped`` record went when the file itself could not take it.
        self.loss_record: str | None = None
        self._meta = meta
        self._warn = warn or STATE.warn_once
        self.bytes_written = 0
        self.failed: str | None = None
        #: Events that reached this sink but are in no file (write failed, file
        #: deleted, storage abandoned at shutdown).
        self.events_lost = 0
        self._events_in_file = 0  # events in the current file (lost with it if deleted)
        self._writing = 0  # events in the write under way (lost if it never returns)
        self.abandoned = False
        self._fifo = False
        self._fd: int | None = None
        if compression == "zstd":
            import zstandard  # at the first session, not at ``import dftrace``

            self._zc = zstandard.ZstdCompressor(level=_ZSTD_LEVEL if level is None else level)

    @property
    def path(self) -> str:
        """The file written to (before the first write: the name it will have)."""
        return self.paths[-1] if self.paths else self._name()

    @property
    def fd(self) -> int | None:
        """The open file's descriptor (None before the first write)."""
        return self._fd

    @property
    def opened(self) -> bool:
        return bool(self.paths)

    @property
    def is_fifo(self) -> bool:
        """The file written is a FIFO (a reader consumes the stream)."""
        return self._fifo

    def _name(self) -> str:
        return self.name_of(self.run, self.part)

    def name_of(self, run: int, part: int) -> str:
        """The file name of run ``run`` (``<base>.<run>`` when ``<base>`` was taken),
        part ``part``."""
        return (self.base + (f".{run}" if run else "")
                + (f".part{part}" if part else "") + self.suffix)

    def header(self) -> bytes:
        if callable(self._header):
            self._header = self._header()
        return self._header

    def _open(self) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        while True:
            name = self._name()
            try:
                self._fd = os.open(name, flags, self.mode)
                break
            except FileExistsError:
                fd = _open_own_fifo(name) if not self.paths else None
                if fd is not None:
                    self._fd = fd
                    self._fifo = True
                    break
                if self.part:
                    self.part += 1
                else:
                    self.run += 1
                if self.run > 100_000:
                    raise
        self.paths.append(name)
        self.bytes_written = 0
        self._events_in_file = 0
        self._write_raw(self.header())

    def _compress(self, data: bytes) -> bytes:
        """One zstd frame / gzip member from ``data``. (zstandard's streaming
        ``compressobj`` releases the GIL while it works; its one-shot ``compress``
        does not.)"""
        if self.compression == "zstd":
            c = self._zc.compressobj(size=len(data))
            return c.compress(data) + c.flush()
        if self.compression == "gzip":  # wbits 31: a complete gzip member
            c = zlib.compressobj(_GZIP_LEVEL if self.level is None else self.level, zlib.DEFLATED, 31)
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
            if self.abandoned:  # finalize gave up waiting: the rest is not ours
                return
        self.bytes_written += len(out)

    def open_now(self) -> None:
        """Create the file and write its header now (before the first frame), so that
        the first frame too can go straight from the engine. A failure disables the
        sink, as a failed write does."""
        if self._fd is not None or self.failed or self.abandoned:
            return
        try:
            self._open()
        except Exception as exc:
            self._fail(exc)

    def native_level(self) -> int | None:
        """The ``level`` for :func:`engine.drain_to_file` (-1: no compression) when
        the next frame can go straight from the engine to the open file: the C
        engine can compress this way, no rotation is due. None otherwise."""
        if (self._fd is None or self.failed or self.abandoned
                or self.compression not in _native()
                or (self.max_size and self.bytes_written >= self.max_size and not self._fifo)):
            return None
        if self.compression == "none":
            return -1
        if self.compression == "gzip":
            return _GZIP_LEVEL_BASE + (_GZIP_LEVEL if self.level is None else self.level)
        return _ZSTD_LEVEL if self.level is None else self.level

    def wrote_natively(self, taken: int, written: int, nbytes: int, err: int, nlink: int) -> None:
        """Account for frames :func:`engine.drain_to_file` wrote (or failed to)."""
        self.bytes_written += nbytes
        self._events_in_file += written
        if err:
            self.events_lost += taken - written
            self._fail(OSError(err, os.strerror(err)))
        elif nlink == 0 and not self._fifo:
            self._deleted()

    def write(self, data: bytes, events: int) -> None:
        """Append ``data`` (``events`` lines) as one frame."""
        if not data:
            return
        if self.failed or self.abandoned:
            self.events_lost += events
            return
        self._writing = events
        try:
            if self._fd is None:
                self._open()
            elif self.max_size and self.bytes_written >= self.max_size and not self._fifo:
                self._rotate()
                if self.failed:  # the storage did not keep the part just finished
                    self.events_lost += events
                    return
            self._write_raw(data)
            self._events_in_file += events
            if not self._fifo and os.fstat(self._fd).st_nlink == 0:  # type: ignore[arg-type]
                self._deleted()
        except Exception as exc:
            self.events_lost += events
            self._fail(exc)
        finally:
            self._writing = 0

    def _deleted(self) -> None:
        """The file (or its directory) was removed: what it held is gone."""
        self.events_lost += self._events_in_file
        self.failed = "deleted"
        self._warn(
            "sink-deleted",
            f"{self.path} was deleted while the run went on: {self._events_in_file} events "
            "written to it are lost; tracing stops, the run goes on.")
        self._close_fd()

    def _rotate(self) -> None:
        self._write_raw(b"]\n")
        if self._finish_file():
            self.part += 1
            self._open()

    def _fail(self, exc: BaseException) -> None:
        self.failed = f"{type(exc).__name__}: {exc}"
        empty = self._fd is not None and not self._fifo and self.bytes_written == 0
        self._warn(
            "sink-failed",
            f"writing {self.path} failed ({self.failed}): {self.events_lost} events lost "
            "so far, and every event from now on (the count at the end says how many); "
            "tracing stops, the run goes on. "
            + ("No file was written." if empty or not self.paths
               else "The file written so far stays readable."))
        self._cut_back()
        if empty:  # not even the header fit: leave no empty file (it was ours: O_EXCL)
            self._close_fd()
            try:
                os.unlink(self.paths.pop())
            except OSError:
                pass
        # Otherwise the file stays open: space may come back by the end of the run,
        # and then the file itself says how many events it misses (see close).

    def _cut_back(self) -> None:
        """Drop a frame cut short by a failure (e.g. disk full): what stays on disk
        decodes. Shrinking a file needs no space."""
        try:
            if self._fd is not None and not self._fifo:
                os.ftruncate(self._fd, self.bytes_written)
        except OSError:
            pass

    def _finish_file(self) -> bool:
        """Have the storage keep the open file (fdatasync: storage that takes every
        write may fail only now, NFS write-back) and close it. On failure the file is
        lost with every event in it: counted, said, and out of ``paths``. True when
        the storage kept it."""
        fd, self._fd = self._fd, None
        if fd is None:
            return True
        step = "fdatasync"
        try:
            try:
                if not self._fifo:  # a pipe keeps nothing to sync
                    getattr(os, "fdatasync", os.fsync)(fd)
            finally:
                step = "close"
                os.close(fd)
            return True
        except OSError as exc:
            self._unsaved(step, exc)
            return False

    def _unsaved(self, step: str, exc: OSError) -> None:
        path = self.paths.pop() if self.paths else self._name()
        self.unsaved.append(path)
        self.events_lost += self._events_in_file
        why = f"{step} failed: {type(exc).__name__}: {exc}"
        self.failed = self.failed or why
        self._warn(
            f"sink-unsaved:{path}",
            f"the storage did not keep {path} ({why}): the {self._events_in_file} events "
            f"written to it are lost, {self.events_lost} in all so far; tracing stops "
            "there, the run goes on")
        self._events_in_file = 0

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def close(self, trailer: bytes = b"]\n") -> None:
        """Write ``trailer`` and close; a sink that never wrote an event leaves no file.
        After a failure, the ``dropped`` record of the events lost goes before
        ``trailer`` where the storage takes them now (space came back), else to
        :func:`loss_record_dir`."""
        if self.abandoned:
            return
        if self._fd is not None:
            try:
                self._write_raw(self._loss_record() + trailer)
            except Exception as exc:
                if not self.failed:
                    self._fail(exc)
                self._cut_back()
                self._finish_file()  # what the file holds may be lost too (NFS)
            else:
                if self._finish_file():
                    return
        record = self._loss_record()
        if record:  # with the trailer's own lines (other counts of drops), not its "]"
            self._record_elsewhere(record + trailer.removesuffix(b"]\n"))

    def _loss_record(self) -> bytes:
        """The ``dropped`` line of what a failure of the storage lost (b"" when none
        failed, the file was deleted, or no ``meta`` was given)."""
        if not self.failed or self.failed == "deleted" or self._meta is None:
            return b""
        return self._meta("dropped", {"count": self.events_lost, "reason": "storage",
                                      "error": self.failed})

    def _record_elsewhere(self, record: bytes) -> None:
        """Save the ``dropped`` record where the trace's storage is not (the count in
        all at the end names the place)."""
        trace = self.paths[-1] if self.paths else self.unsaved[-1] if self.unsaved else self._name()
        self.loss_record = save_loss_record(trace, record)

    def abandon(self, close: bool = False, writing: int = 0) -> None:
        """Stop using the file: a forked child's copy (forget the descriptor) or
        storage that stalled at shutdown (the stuck write, of ``writing`` events
        when the engine wrote it, is left to the kernel)."""
        self.abandoned = True
        self.events_lost += max(self._writing, writing)
        if not close:
            self._fd = None


def loss_record_dir() -> str:
    """Where records of losses go when the trace's storage cannot take them:
    ``$XDG_RUNTIME_DIR`` (a directory of this user's, in memory) when it is set and
    this user's, else the temporary directory (``$TMPDIR``, ``/tmp``)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    try:
        st = os.stat(runtime) if runtime else None
    except OSError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
        return runtime
    return tempfile.gettempdir()


def save_loss_record(trace: str, record: bytes) -> str | None:
    """Write ``record`` to ``dftrace-dropped-<trace's file name>.json`` (``-N`` before
    ``.json`` when taken) in :func:`loss_record_dir`, created exclusively with mode
    0600, never through a symbolic link. Returns its path; None when nothing could
    be written (nothing is left behind then)."""
    folder = loss_record_dir()
    flags = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
             | getattr(os, "O_CLOEXEC", 0))
    stem = os.path.join(folder, "dftrace-dropped-" + os.path.basename(trace))
    for n in range(100):
        path = f"{stem}{f'-{n}' if n else ''}.json"
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            continue
        except OSError:
            return None
        try:
            view = memoryview(record)
            while view:
                view = view[os.write(fd, view):]
            os.close(fd)
            return path
        except OSError:
            os.close(fd)
            try:
                os.unlink(path)
            except OSError:
                pass
            return None
    return None


def _open_own_fifo(path: str) -> int | None:
    """``path`` opened for writing when it is a FIFO this user owns that a reader has
    open (then in blocking mode, as a file is); None otherwise. The open never
    blocks and follows no symbolic link."""
    flags = (os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
             | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.lstat(path)
        if not stat.S_ISFIFO(st.st_mode) or st.st_uid != os.geteuid():
            return None  # not even opened: its reader learns nothing
        fd = os.open(path, flags)  # ENXIO: a FIFO without a reader
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if stat.S_ISFIFO(st.st_mode) and st.st_uid == os.geteuid():
            os.set_blocking(fd, True)
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


class Writer(Consumer):
    """Background consumer of the record buffer for one process."""

    def __init__(self, encoder: Encoder, sink: FileSink, flush_interval: float,
                 source: Callable[[Encoder, int], tuple[bytes, int]] = _buffer.drain,
                 deliver: bool = True):
        self.encoder = encoder
        #: Where the records come from: the engine's buffer, or a shared-memory ring
        #: whose drainer process is gone (see ``_core.shm``).
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
                self.sink.close(trailer())
        except Exception as exc:
            STATE.warn_once("writer", f"writer error: {exc!r}")

    def _native_level(self) -> int | None:
        """The level for the engine's own writing (see FileSink.native_level), or None:
        an in-memory trace taps the batches, the records come from elsewhere (a shared ring), or the
        sink can't take it."""
        if (tapped() and self.deliver) or self.source is not _buffer.drain:
            return None
        if not self.sink.opened and self.sink.compression in _native() and _buffer.buffered():
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
