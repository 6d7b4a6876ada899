"""The traced process's side of ``writer="process"``: records in shared memory.

The C engine appends this process's records to a ring of chunk slots in a memfd
(``_speedups.shm_attach``) instead of process memory. A drainer process
(:mod:`._core.drainer`, one per job and host, found through ``DFTRACE_DRAINER``)
maps the same memfd, encodes the records with the same encoder and writes the file
with the same :class:`FileSink`. No thread of this process ever writes the trace
file: storage that hangs holds the drainer, never this process, and a process
killed with SIGKILL loses nothing it committed to the ring (the drainer notices
the end of its connection, writes what the ring holds, says how the process
ended and closes the file).

Protocol on the Unix socket (this process -> drainer): one registration message
(4-byte length, JSON, the memfd as ancillary data), then single bytes: ``w`` a
slot is full, ``s`` write everything now and answer ``y`` + 8-byte count of events
written, ``f`` finalized: write everything and the end of the file, answer ``d`` +
4-byte length + JSON (paths, events lost, error). The drainer answers the
registration with ``k``.
"""

from __future__ import annotations

import json
import mmap
import os
import secrets
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from . import engine as _rec

__all__ = ["ENV_VAR", "DrainerUnavailable", "ProcessWriter"]

#: The drainer's socket name (abstract namespace), inherited by child processes.
ENV_VAR = "DFTRACE_DRAINER"
#: How long initialize waits for a drainer to start and accept the ring.
START_TIMEOUT_S = 5.0
#: A drainer write taking longer than this means its storage stalled.
STALL_S = 1.0

_started: list[subprocess.Popen] = []  # drainers this process started (reaped when done)


class DrainerUnavailable(Exception):
    """Shared memory or a drainer process cannot be had here."""


def _ring(buffer_limit: int) -> tuple[int, mmap.mmap]:
    sp = _rec.speedups
    if sp is None:
        raise DrainerUnavailable("the C engine is off (DFTRACE_NO_SPEEDUPS or not built)")
    if not hasattr(os, "memfd_create") or not sys.platform.startswith("linux"):
        raise DrainerUnavailable("no memfd on this platform")
    nslots = max(4, -(-buffer_limit // sp.SHM_SLOT_RECORDS))
    size = sp.SHM_FIXED_BYTES + nslots * sp.SHM_SLOT_BYTES
    try:
        fd = os.memfd_create("dftrace-ring", os.MFD_CLOEXEC)
    except OSError as exc:
        raise DrainerUnavailable(f"memfd_create failed: {exc}") from None
    try:
        os.ftruncate(fd, size)
        return fd, mmap.mmap(fd, size)
    except OSError as exc:
        os.close(fd)
        raise DrainerUnavailable(f"shared memory of {size} bytes: {exc}") from None


def _connect(name: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect("\0" + name)
    except OSError:
        sock.close()
        raise
    return sock


#: Variables naming the job a process belongs to: processes of one job that are not
#: each other's children (torchrun ranks, srun tasks) share a drainer through them.
_JOB_VARS = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID")


def _job_name() -> str:
    """The drainer name of this job on this host ("" when no launcher names the job)."""
    import hashlib

    for var in _JOB_VARS:
        job = os.environ.get(var, "").strip()
        if job:
            digest = hashlib.blake2b(f"{var}={job}".encode(), digest_size=8).hexdigest()
            return f"dftrace-drainer-{os.getuid()}-{digest}"
    return ""


#: Runs a module of the dftrace this process imported, whatever the working directory
#: holds: ``python -m`` would put the working directory first on ``sys.path``, so a
#: directory holding a ``dftrace`` folder (a clone) would run that one instead.
_RUN_INSTALLED = (
    "import os, runpy, sys\n"
    "if sys.path and sys.path[0] in ('', os.getcwd()): del sys.path[0]\n"
    "sys.path.insert(0, sys.argv.pop(1))\n"
    "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)\n")


def installed_module_argv(module: str, *args: str) -> list[str]:
    """The command that runs ``module`` of this very dftrace installation with ``args``."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return [sys.executable, "-c", _RUN_INSTALLED, root, module, *args]


def _start_drainer(name: str = "") -> str:
    """Start a drainer in a session of its own (a Ctrl-C or a SIGTERM sent to the
    job's process group does not end it before it has written its producers' files).
    When another process of the job started one of the same name first, this one
    exits at once and the other answers."""
    name = name or f"dftrace-drainer-{os.getpid()}-{secrets.token_hex(6)}"
    env = dict(os.environ)
    env["DFTRACE_ENABLE"] = "0"  # the drainer itself is never traced
    env.pop(ENV_VAR, None)
    try:
        proc = subprocess.Popen(
            installed_module_argv("dftrace._core.drainer", name, str(os.getpid())),
            # No standard stream of the job: a launcher reading the job's output must
            # not wait for the drainer (which may be held by hung storage). Failures
            # reach the producer in the answer to its finalize.
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        raise DrainerUnavailable(f"cannot start the drainer: {exc}") from None
    _started.append(proc)
    return name


def _reap() -> None:
    for proc in list(_started):
        if proc.poll() is not None:
            _started.remove(proc)


def _register(session: Any, fd: int) -> tuple[socket.socket, int]:
    """Connect to the job's drainer (starting one when there is none) and hand it
    the ring. Returns the socket and the drainer's pid."""
    enc = session.encoder
    cfg = session.config
    msg = json.dumps({
        "pid": session.pid, "base": session.base, "compression": cfg.compression,
        "level": cfg.compression_level, "max_size": cfg.max_file_size,
        "flush_interval": cfg.flush_interval, "batch_size": cfg.batch_size,
        "pid_piece": enc.pid_piece.decode("latin-1"),
        "hh_piece": enc.hh_piece.decode("latin-1"), "offset_ns": enc.offset_ns,
        "min_id": enc.min_id, "hhash": session.hhash,
        "header": session.sink.header().decode("latin-1"),
    }).encode()
    payload = struct.pack("<I", len(msg)) + msg
    deadline = time.monotonic() + START_TIMEOUT_S
    name = os.environ.get(ENV_VAR, "").strip() or _job_name()
    started = False
    last: BaseException | None = None
    while time.monotonic() < deadline:
        if not name:
            name, started = _start_drainer(_job_name()), True
        os.environ[ENV_VAR] = name
        try:
            sock = _connect(name)
        except OSError as exc:
            last = exc
            if not started:  # the drainer named is gone, or the job has none yet
                name = ""
            else:
                time.sleep(0.01)
            continue
        try:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            socket.send_fds(sock, [payload], [fd])
            reply = sock.recv(16)
            if reply[:1] == b"k":
                sock.settimeout(None)
                return sock, int(reply[1:] or b"0")
            last = ConnectionError("the drainer refused the ring")
        except OSError as exc:
            last = exc
        sock.close()
        if not started:
            name = ""
        else:
            break
    raise DrainerUnavailable(f"no drainer answered ({last})")


class ProcessWriter:
    """The session's writer when a drainer process writes the file (the consumer
    protocol of :class:`~._core.writer.Writer`: wake, wait_drained, stalled, sync,
    flush, stop). When the drainer is gone, an in-process Writer takes over the ring
    from where the drainer stopped reading (into a file of the next free name)."""

    def __init__(self, session: Any):
        if _rec.STATE.captures:
            raise DrainerUnavailable("a dftrace.capture() is running")
        self.session = session
        self.events_written = 0
        self.fallback: Any = None
        self._lock = threading.Lock()
        self._replies = b""
        self._fd, self._mm = _ring(session.config.buffer_limit)
        try:
            _rec.speedups.shm_attach(self._mm, session.pid)
            try:
                self._sock, self.drainer_pid = _register(session, self._fd)
            except BaseException:
                _rec.speedups.shm_detach()
                raise
        except BaseException:
            self._mm.close()
            os.close(self._fd)
            raise
        os.close(self._fd)  # the drainer holds its own; the mapping stays
        self._fd = -1
        encoder, append = session.encoder, _rec.speedups.shm_append_line

        def special_to_ring(rec: tuple) -> None:
            line = encoder.special_line(rec)
            if line:
                append(line)

        _rec.STATE.special_to_ring = special_to_ring

    # -- the drainer is gone ---------------------------------------------------------
    def _lost(self) -> Any:
        """Write the ring from this process from now on (once)."""
        with self._lock:
            if self.fallback is None:
                from .writer import FileSink, Writer

                s = self.session
                _rec.STATE.warn_once(
                    "drainer-lost",
                    f"the trace drainer (pid {self.drainer_pid}) ended; this process writes "
                    "its trace itself from now on")
                reader = _rec.speedups.ShmReader(self._mm, True)

                def source(enc: Any, max_records: int) -> tuple[bytes, int]:
                    return reader.drain(max_records, enc.pid_piece, enc.hh_piece, enc.offset_ns,
                                        enc.min_id, True)

                sink = FileSink(s.base, s.config.compression, s.config.compression_level,
                                s.config.max_file_size, s.sink.header())
                s.sink = sink
                self.fallback = Writer(s.encoder, sink, s.config.flush_interval, source)
                try:
                    self._sock.close()
                except OSError:
                    pass
            return self.fallback

    def _send(self, b: bytes, wait: bool = False) -> bool:
        try:
            self._sock.send(b, 0 if wait else socket.MSG_DONTWAIT)
            return True
        except BlockingIOError:
            return True  # wakes already queued
        except OSError:
            self._lost()
            return False

    # -- consumer protocol ---------------------------------------------------------
    def wake(self) -> None:
        if self.fallback is not None:
            self.fallback.wake()
        else:
            self._send(b"w")

    def stalled(self) -> bool:
        if self.fallback is not None:
            return bool(self.fallback.stalled())
        st = _rec.speedups.shm_state()
        busy = st[2] if st else 0
        return bool(busy) and time.monotonic_ns() - busy > STALL_S * 1e9

    def wait_drained(self, below: int, timeout: float) -> bool:
        """The ring is full: wait until half its slots are free again; False on
        timeout or when the writer's storage stalled (the record is then dropped
        and counted)."""
        deadline = time.monotonic() + timeout
        self.wake()
        while True:
            st = _rec.speedups.shm_state()
            if st is None or st[0] >= max(1, st[1] // 2):
                return True
            if time.monotonic() >= deadline or self.stalled():
                return False
            time.sleep(0.001)

    def _request(self, b: bytes, reply: bytes, timeout: float) -> bytes | None:
        """Send ``b`` and wait for the answer starting with ``reply`` (None: none
        came in time, the drainer stalled or is gone)."""
        if not self._lock.acquire(timeout=max(0.0, timeout)):
            return None
        try:
            deadline = time.monotonic() + timeout
            if self.fallback is not None:
                return None
            while True:  # never block on a drainer that does not read (hung storage)
                try:
                    self._sock.send(b, socket.MSG_DONTWAIT)
                    break
                except BlockingIOError:
                    left = deadline - time.monotonic()
                    if left <= 0 or self.stalled():
                        return None
                    select.select([], [self._sock], [], min(left, 0.05))
                except OSError:
                    return b""  # the drainer is gone
            while True:
                got = self._take_reply(reply)
                if got is not None:
                    return got
                left = deadline - time.monotonic()
                if left <= 0 or self.stalled():
                    return None
                r, _, _ = select.select([self._sock], [], [], min(left, 0.05))
                if r:
                    try:
                        data = self._sock.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        return b""  # the drainer is gone
                    self._replies += data
        finally:
            self._lock.release()

    def _take_reply(self, kind: bytes) -> bytes | None:
        buf = self._replies
        while buf:
            if buf[:1] == b"y":
                if len(buf) < 9:
                    return None
                msg, buf = buf[:9], buf[9:]
            elif buf[:1] == b"d":
                if len(buf) < 5:
                    return None
                n = struct.unpack("<I", buf[1:5])[0]
                if len(buf) < 5 + n:
                    return None
                msg, buf = buf[:5 + n], buf[5 + n:]
            else:
                buf = buf[1:]
                continue
            self._replies = buf
            if msg[:1] == kind:
                return msg
        self._replies = buf
        return None

    def flush(self, timeout: float = -1) -> int:
        """Have the drainer write everything recorded so far, and wait for it."""
        if self.fallback is not None:
            return int(self.fallback.flush(timeout))
        got = self._request(b"s", b"y", 30.0 if timeout < 0 else timeout)
        if got == b"":
            return int(self._lost().flush(timeout))
        if got:
            before = self.events_written
            self.events_written = struct.unpack("<Q", got[1:9])[0]
            return self.events_written - before
        return 0

    def sync(self, timeout: float) -> bool:
        if self.fallback is not None:
            return bool(self.fallback.sync(timeout))
        return self.flush(timeout) >= 0

    def stop(self, timeout: float = 30.0, trailer: Any = None) -> bool:
        """Put the trailer's lines in the ring, seal it and have the drainer end
        the file. Waits at most ``timeout`` seconds, and not at all once the
        drainer's storage stalled (the drainer still writes what the ring holds
        when it can). True when the file is complete."""
        sp = _rec.speedups
        body = trailer() if trailer is not None else b"]\n"
        if self.fallback is None:
            lines = body[:-2] if body.endswith(b"]\n") else body
            if lines:
                sp.shm_append_line(lines)
            sp.shm_finish()
            got = self._request(b"f", b"d", timeout)
            if got == b"":
                self._lost()
            elif got is None:
                self._close()
                return False
            else:
                info = json.loads(got[5:])
                s = self.session
                s.sink.paths[:] = info.get("paths", [])
                s.sink.events_lost = int(info.get("lost", 0))
                s.sink.failed = info.get("failed")
                self.events_written = int(info.get("written", 0))
                if s.sink.failed:
                    _rec.STATE.warn_once(
                        "sink-failed", f"the trace drainer could not write {s.path} "
                        f"({s.sink.failed}); {s.sink.events_lost} events were not written")
                self._close()
                return True
            return bool(self.fallback.stop(timeout, lambda: b"]\n"))
        return bool(self.fallback.stop(timeout, lambda: body))

    def _close(self) -> None:
        _rec.STATE.special_to_ring = None
        if _rec.speedups is not None:
            _rec.speedups.shm_detach()
        try:
            self._sock.close()
        except OSError:
            pass
        try:
            self._mm.close()
        except (BufferError, ValueError):
            pass
        _reap()

    def forget(self) -> None:
        """In a forked child: let go of the parent's ring and connection without a
        word to the drainer (they stay the parent's)."""
        self._close()  # close() is not shutdown(): the parent's connection stays open
