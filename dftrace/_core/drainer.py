"""The drainer process of ``writer="process"``: ``python -m dftrace._core.drainer NAME PPID``.

It listens on the abstract Unix socket ``NAME``; each traced process that registers
hands it a memfd holding its shared-memory ring (see :mod:`._core.shm`). For each
one it writes exactly the file the in-process writer would: the same
:class:`~._core.writer.FileSink` (names, header, rotation, compression, failure
handling) fed by the same C encoder (``_speedups.ShmReader``). When a producer's
connection ends without ``f`` (killed, ``os._exit``), it writes everything the ring
holds, a ``process_end`` metadata line saying how the process ended, and the end
of the file. It exits once its last producer is gone, and it started in a
session of its own, so the job's Ctrl-C does not end it before that.
"""

from __future__ import annotations

import json
import mmap
import os
import selectors
import signal
import socket
import struct
import sys
import time
from typing import Any

#: Records per frame (as the in-process writer's ``max_batch``).
MAX_BATCH = 16384
#: With no producer left, wait this long for another before exiting.
LINGER_S = 0.5
#: Exit when no producer registered this long after the start.
FIRST_PRODUCER_S = 30.0


class Producer:
    """One registered traced process: its ring, its file."""

    def __init__(self, conn: socket.socket, info: dict[str, Any], fd: int):
        from . import engine as _rec
        from .writer import FileSink

        self.conn = conn
        self.pid = int(info["pid"])
        size = os.fstat(fd).st_size
        self.mm = mmap.mmap(fd, size)
        os.close(fd)
        self.reader = _rec.speedups.ShmReader(self.mm)
        self.pid_piece = info["pid_piece"].encode("latin-1")
        self.hh_piece = info["hh_piece"].encode("latin-1")
        self.offset_ns = int(info["offset_ns"])
        self.min_id = int(info["min_id"])
        self.hhash = info["hhash"]
        self.flush_interval = float(info["flush_interval"])
        #: Full slots that make a write (as the in-process writer wakes at batch_size).
        self.wakes_per_write = max(1, min(int(info.get("batch_size", 65536)), 1 << 20)
                                   // _rec.speedups.SHM_SLOT_RECORDS)
        self.wakes = 0
        self.sink = FileSink(info["base"], info["compression"], info["level"],
                             int(info["max_size"]), info["header"].encode("latin-1"))
        self.next_flush = time.monotonic() + self.flush_interval
        self.written = 0
        self.rbuf = b""

    def write(self, partial: bool) -> None:
        """Encode and write what the ring holds (with ``partial``, the slot being
        filled too), in frames of at most MAX_BATCH records."""
        while True:
            # Once the file is open (its header written), frames go from the ring to
            # the file in C, as the writer thread's do.
            level = self.sink.native_level() if hasattr(self.reader, "drain_write") else None
            self.reader.set_busy(time.monotonic_ns())
            try:
                if level is not None:
                    n, nbytes, err, nlink = self.reader.drain_write(
                        self.sink.fd, level, MAX_BATCH, self.pid_piece, self.hh_piece,
                        self.offset_ns, self.min_id, partial)
                    if n:
                        self.sink.wrote_natively(n, 0 if err else n, 0 if err else nbytes, err, nlink)
                else:
                    data, n = self.reader.drain(MAX_BATCH, self.pid_piece, self.hh_piece,
                                                self.offset_ns, self.min_id, partial)
                    if data:
                        self.sink.write(data, n)
            finally:
                self.reader.set_busy(0)
            self.written += n
            if n < MAX_BATCH:
                return

    def _meta(self, name: str, args: dict[str, Any]) -> bytes:
        return json.dumps({"name": name, "cat": "dftrace", "pid": self.pid, "tid": self.pid,
                           "ph": "M", "args": {"hhash": self.hhash, **args}},
                          separators=(",", ":")).encode() + b"\n"

    def finish(self, finalized: bool) -> dict[str, Any]:
        """Write the rest and end the file; for a process that ended without
        finalizing, say how it ended (and what it counted as dropped)."""
        self.write(True)
        trailer = b""
        if not finalized:
            if self.reader.dropped:
                trailer += self._meta("dropped", {"count": self.reader.dropped,
                                                  "reason": "buffer full"})
            trailer += self._meta("process_end", {"finalized": False, **how_ended(self.pid)})
            self.written += 1
            if not self.sink.opened:  # a process that recorded nothing still gets its end
                self.sink.write(trailer, 1)
                trailer = b""
        self.sink.close(trailer + b"]\n")
        info = {"paths": list(self.sink.paths), "lost": self.sink.events_lost,
                "failed": self.sink.failed, "written": self.written}
        self.reader.close()
        try:
            self.mm.close()
        except (BufferError, ValueError):
            pass
        return info


def how_ended(pid: int, wait_s: float = 0.2) -> dict[str, Any]:
    """How process ``pid`` ended, read from its zombie's /proc entry while its parent
    has not reaped it yet (else: it ended without finalize, cause unknown)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return {"how": "ended without finalize"}
        fields = stat[stat.rindex(b")") + 2:].split()
        if fields[:1] in ([b"Z"], [b"X"]) and len(fields) >= 50:
            code = int(fields[49])  # exit_code: a wait status
            if code & 0x7F:
                return {"how": f"killed by signal {code & 0x7F}", "signal": code & 0x7F}
            return {"how": f"exited with status {code >> 8} without finalize",
                    "exit_status": code >> 8}
        if time.monotonic() >= deadline:
            return {"how": "ended without finalize"}
        time.sleep(0.005)


def _read_registration(conn: socket.socket) -> tuple[dict[str, Any], int]:
    conn.settimeout(5.0)
    msg, fds, _flags, _addr = socket.recv_fds(conn, 65536, 1)
    if not fds or len(msg) < 4:
        for fd in fds:
            os.close(fd)
        raise ConnectionError("no ring")
    n = struct.unpack("<I", msg[:4])[0]
    body = msg[4:]
    while len(body) < n:
        more = conn.recv(n - len(body))
        if not more:
            os.close(fds[0])
            raise ConnectionError("cut short")
        body += more
    conn.settimeout(None)
    return json.loads(body[:n]), fds[0]


def _same_user(conn: socket.socket) -> bool:
    """Only processes of this user may hand over rings (an abstract socket is
    reachable by every user of the network namespace)."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        return uid == os.getuid()
    except OSError:
        return False


def _tie_to_parent(ppid: int) -> None:
    """Learn (SIGUSR1) when the process that started us ends (Linux)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGUSR1, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def serve(name: str, ppid: int) -> int:
    """Serve producers until the last one is gone."""
    from . import engine as _rec

    if _rec.speedups is None:
        return 2
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, lambda *_: None)  # the parent ended: serve the rest
    _tie_to_parent(ppid)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    producers: dict[socket.socket, Producer] = {}
    started = time.monotonic()
    served = False  # a producer registered at some point
    idle_since = started
    while True:
        now = time.monotonic()
        if producers:
            idle_since = now
        elif (served and now - idle_since >= LINGER_S) or now - started > FIRST_PRODUCER_S:
            break
        # Sleep until the next flush is due: wakes, registrations and ends of
        # connections arrive on the sockets.
        timeout = min([p.next_flush for p in producers.values()], default=now + LINGER_S) - now
        for key, _ in sel.select(max(0.0, timeout)):
            sock = key.fileobj
            if sock is listener:
                served = _accept(listener, sel, producers) or served
                continue
            p = producers.get(sock)  # type: ignore[arg-type]
            if p is None:
                continue
            try:
                data = sock.recv(4096)  # type: ignore[union-attr]
            except OSError:
                data = b""
            _handle(p, data, sel, producers)
        now = time.monotonic()
        for p in list(producers.values()):
            if now >= p.next_flush:
                p.next_flush = now + p.flush_interval
                _guard(p.write, True)
    listener.close()
    return 0


def _guard(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:
        print(f"dftrace drainer: {exc!r}", file=sys.stderr)
        return None


def _accept(listener: socket.socket, sel: selectors.BaseSelector,
            producers: dict[socket.socket, Producer]) -> bool:
    try:
        conn, _ = listener.accept()
    except OSError:
        return False
    try:
        if not _same_user(conn):
            raise ConnectionError("another user")
        info, fd = _read_registration(conn)
        p = Producer(conn, info, fd)
        conn.sendall(b"k" + str(os.getpid()).encode())
    except Exception as exc:
        print(f"dftrace drainer: registration failed: {exc!r}", file=sys.stderr)
        conn.close()
        return False
    producers[conn] = p
    sel.register(conn, selectors.EVENT_READ)
    return True


def _handle(p: Producer, data: bytes, sel: selectors.BaseSelector,
            producers: dict[socket.socket, Producer]) -> None:
    if not data:  # the process is gone without finalize
        _end(p, False, sel, producers)
        return
    if b"f" in data:
        info = _guard(p.finish, True) or {"paths": [], "lost": 0, "failed": "drainer error"}
        body = json.dumps(info).encode()
        try:
            p.conn.sendall(b"d" + struct.pack("<I", len(body)) + body)
        except OSError:
            pass
        _drop(p, sel, producers)
        return
    if b"s" in data:
        _guard(p.write, True)
        try:
            p.conn.sendall(b"y" + struct.pack("<Q", p.written))
        except OSError:
            pass
    else:
        p.wakes += data.count(b"w")
        if p.wakes >= p.wakes_per_write:
            p.wakes = 0
            _guard(p.write, False)


def _end(p: Producer, finalized: bool, sel: selectors.BaseSelector,
         producers: dict[socket.socket, Producer]) -> None:
    _guard(p.finish, finalized or p.reader.finalized)
    _drop(p, sel, producers)


def _drop(p: Producer, sel: selectors.BaseSelector,
          producers: dict[socket.socket, Producer]) -> None:
    try:
        sel.unregister(p.conn)
    except (KeyError, ValueError):
        pass
    producers.pop(p.conn, None)
    p.conn.close()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m dftrace._core.drainer NAME PARENT_PID", file=sys.stderr)
        return 2
    return serve(argv[0], int(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
