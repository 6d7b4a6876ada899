"""Trace files: :class:`FileSink` appends frames to ``<base>.pfw[.zst|.gz]``, names
part files, finishes each file (checked ``fdatasync`` and ``close``), and keeps the
record of what a failing storage lost (:func:`save_loss_record`). The in-process
writer thread, the drainer and a producer whose drainer is gone all write through it.
"""

from __future__ import annotations

import os
import stat
import tempfile
import zlib
from collections.abc import Callable
from typing import Any

from . import buffer as _buffer
from .state import STATE

__all__ = ["FileSink", "SUFFIXES", "loss_record_dir", "native_compressions", "save_loss_record"]

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



def native_compressions() -> set[str]:
    global _NATIVE
    if _NATIVE is None:
        _NATIVE = set(_buffer.native_compressions())
    return _NATIVE

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
                or self.compression not in native_compressions()
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
