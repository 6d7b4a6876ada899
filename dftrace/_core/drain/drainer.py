"""The drainer process of ``writer="process"``: ``python -m dftrace._core.drain.drainer NAME PPID``.

It listens on the abstract Unix socket ``NAME``; each traced process of this user
(the kernel's credentials of the peer say so; the pid it gives is the one the
kernel names) that registers hands it a memfd holding its shared-memory ring (see
:mod:`.process_writer`), its size sealed. For each one it writes exactly the file the
in-process writer would: the same :class:`~._core.sink.FileSink` (names, header,
rotation, compression, failure handling) with the producer's umask, fed by the same
C encoder (``_speedups.ShmReader``). After each write it commits (frees the slots
written and publishes where the file stands, for a successor). When a producer's
connection ends without ``f`` (killed, ``os._exit``), it writes everything the ring
holds, the spans its open-span table still holds (incomplete), the drops the ring
counts, a ``process_end`` line saying how the process ended, and the end of the file.
Anything a producer sends or writes in its ring that does not fit the protocol drops
that producer, never the drainer. It
exits once its last producer is gone, and it started in a session of its own, so
the job's Ctrl-C does not end it before that.
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

from ...format import names as fmt
from .producer_process import how_ended, pidfd_of, tell

#: Records per frame (as the in-process writer's ``max_batch``).
MAX_BATCH = 16384
#: With no producer left, wait this long for another before exiting.
LINGER_S = 0.5
#: Exit when no producer registered this long after the start.
FIRST_PRODUCER_S = 30.0
#: The largest ring accepted (buffer_limit's largest value takes less).
MAX_RING_BYTES = 1 << 40
#: The largest message a producer sends (the registration, the trailer's lines).
MAX_MESSAGE = 16 << 20


class Producer:
    """One registered traced process: its ring, its file."""

    def __init__(self, conn: socket.socket, pid: int, info: Registration, fd: int):
        from .. import engine as _engine
        from ..sink import FileSink

        self.conn = conn
        self.pid = pid
        #: A pidfd of the producer, opened now: it tells how the process ended even
        #: once its parent has reaped it (see how_ended).
        self.pidfd = pidfd_of(pid)
        size = _sealed_size(fd)
        self.mm = mmap.mmap(fd, size)
        os.close(fd)
        try:
            self.reader = _engine.speedups.ShmReader(self.mm)
        except BaseException:
            self.mm.close()
            raise
        self.pid_piece = info.pid_piece
        self.hh_piece = info.hh_piece
        self.offset_ns = info.offset_ns
        self.min_id = info.min_id
        self.hhash = info.hhash
        self.flush_interval = info.flush_interval
        #: Warnings said to the producer (each once).
        self.said: set[str] = set()
        # The producer's umask, as its own writer would have had (this process's is 0).
        self.sink = FileSink(info.base, info.compression, info.level, info.max_size,
                             info.header, mode=0o644 & ~info.umask, meta=self._meta,
                             warn=self.warn)
        self.next_flush = time.monotonic() + self.flush_interval
        self.written = 0
        self.rbuf = b""

    def warn(self, key: str, message: str) -> None:
        """Say a problem of the producer's file to the producer's user when it
        happens (once per ``key``), on the producer's standard error: the counts
        reach the producer again in the answer to its finalize, but a process killed
        before that must have heard them."""
        if key in self.said:
            return
        self.said.add(key)
        tell(self.pid, self.pidfd, f"dftrace: {message} (said by the trace drainer, "
             f"pid {os.getpid()})\n")

    def _commit(self, advance: bool = True) -> None:
        """Publish where the file stands (a successor cuts it back to ``size`` and
        goes on reading from there): after each write, and when a file is opened."""
        sink = self.sink
        whole = sink.opened and sink.fd is not None and not sink.is_fifo
        self.reader.commit(sink.run, sink.part, sink.bytes_written if whole else -1, advance)

    def _open(self) -> None:
        if not self.sink.opened:
            self.sink.open_now()
            self._commit(advance=False)

    def write(self, partial: bool) -> None:
        """Encode and write what the ring holds (with ``partial``, the slot being
        filled too), in frames of at most MAX_BATCH records. Slots are freed for the
        producer only once their bytes are written (the commit)."""
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
                        self._open()
                        self.sink.write(data, n)
            finally:
                self.reader.set_busy(0)
            self._commit()
            self.written += n
            if n < MAX_BATCH:
                return

    def _meta(self, name: str, args: dict[str, Any]) -> bytes:
        return json.dumps({"name": name, "cat": fmt.CAT_TRACER, "pid": self.pid, "tid": self.pid,
                           "ph": fmt.PH_METADATA, "args": {fmt.ARG_HOSTNAME_HASH: self.hhash, **args}},
                          separators=(",", ":")).encode() + b"\n"

    def finish(self, trailer_lines: bytes | None) -> dict[str, Any]:
        """Write the rest and end the file: for a process that ended without
        finalizing (``trailer_lines`` None), the spans it had open (ending now,
        incomplete); the drops its ring counts; its trailer lines (sent with ``f``),
        or how it ended."""
        self.write(True)
        trailer, not_kept = b"", 0
        if trailer_lines is None:  # killed: the spans it had open end now, incomplete
            trailer, _, not_kept = self.reader.open_spans(self.pid_piece, self.hh_piece,
                                                          self.offset_ns, self.min_id,
                                                          time.monotonic_ns())
            if not (self.sink.opened or self.written or self.reader.dropped or trailer):
                return self.close()  # recorded nothing (a forked child that exec'd): no file
        if self.reader.dropped:
            trailer += self._meta("dropped", {"count": self.reader.dropped,
                                              "reason": "buffer full"})
        if trailer_lines is None:
            end = {"finalized": False, **how_ended(self.pid, self.pidfd)}
            trailer += self._meta("process_end", {**end, "open_spans_not_kept": not_kept} if not_kept else end)
        else:
            trailer += trailer_lines
        lines = trailer.count(b"\n")
        # A process that recorded nothing still gets its end and its counts; a file
        # that failed takes them with its end, if at all (see FileSink.close).
        if trailer and not self.sink.failed:
            self._open()
            self.sink.write(trailer, lines)
            self._commit()
            self.written += lines
            trailer = b""
        self.sink.close(trailer + b"]\n")
        return self.close()

    def reject(self, why: str) -> dict[str, Any]:
        """The ring is inconsistent (a producer that wrote over its header): stop
        reading it. The file says so and ends."""
        print(f"dftrace drainer: dropped producer {self.pid}: {why}", file=sys.stderr)
        if self.sink.opened:
            self.sink.close(self._meta("ring_rejected", {"reason": why}) + b"]\n")
        return self.close()

    def close(self) -> dict[str, Any]:
        info = {"paths": list(self.sink.paths), "lost": self.sink.events_lost,
                "failed": self.sink.failed, "written": self.written,
                "unsaved": list(self.sink.unsaved), "loss_record": self.sink.loss_record}
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        self.reader.close()
        try:
            self.mm.close()
        except (BufferError, ValueError):
            pass
        return info


class Registration:
    """A producer's registration, checked field by field (anything else: refused)."""

    def __init__(self, info: Any):
        from ..sink import SUFFIXES

        if not isinstance(info, dict):
            raise ValueError("not an object")

        def get(key: str, kind: Any, check: Any = lambda v: True) -> Any:
            v = info.get(key)
            if isinstance(v, bool) or not isinstance(v, kind) or not check(v):
                raise ValueError(f"bad {key!r}")
            return v

        def text(key: str, limit: int = 1 << 20) -> str:
            return get(key, str, lambda v: len(v) <= limit)

        self.base = text("base", 4096)
        self.compression = get("compression", str, lambda v: v in SUFFIXES)
        level = info.get("level")
        self.level = None if level is None else get("level", int, lambda v: -(1 << 20) < v < 100)
        self.max_size = get("max_size", int, lambda v: v >= 0)
        self.flush_interval = float(get("flush_interval", (int, float),
                                        lambda v: 0.001 <= v <= 86400))
        self.batch_size = get("batch_size", int, lambda v: v > 0)
        self.pid_piece = text("pid_piece", 4096).encode("latin-1")
        # a file-I/O call's line leaves out the piece's last key (its records have no level)
        self.hh_piece = get("hh_piece", str, lambda v: len(v) <= 4096
                            and v.endswith(',"level":')).encode("latin-1")
        self.offset_ns = get("offset_ns", int, lambda v: abs(v) < 1 << 63)
        self.min_id = get("min_id", int, lambda v: 0 <= v < 1 << 63)
        self.hhash = text("hhash", 64)
        self.header = text("header").encode("latin-1")
        self.umask = get("umask", int, lambda v: 0 <= v <= 0o777)


def _sealed_size(fd: int) -> int:
    """The size of a producer's memfd, which it sealed: it can neither shrink it
    under our mapping (SIGBUS) nor grow it. Anything else is refused."""
    import fcntl

    need = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
    if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & need != need:
        raise ValueError("the ring's size is not sealed")
    size = os.fstat(fd).st_size
    if not 0 < size <= MAX_RING_BYTES:
        raise ValueError(f"a ring of {size} bytes")
    return size


def _read_registration(conn: socket.socket) -> tuple[Registration, int]:
    conn.settimeout(5.0)
    msg, fds, _flags, _addr = socket.recv_fds(conn, 65536, 1)
    if len(fds) != 1 or len(msg) < 4:
        for fd in fds:
            os.close(fd)
        raise ConnectionError("no ring")
    try:
        n = struct.unpack("<I", msg[:4])[0]
        if n > MAX_MESSAGE:
            raise ConnectionError("registration too long")
        body = msg[4:]
        while len(body) < n:
            more = conn.recv(n - len(body))
            if not more:
                raise ConnectionError("cut short")
            body += more
        conn.settimeout(None)
        return Registration(json.loads(body[:n])), fds[0]
    except BaseException:
        os.close(fds[0])
        raise


def peer_of(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket, from the kernel."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


def _tie_to_parent(ppid: int) -> None:
    """Learn (SIGUSR1) when the process that started us ends (Linux)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGUSR1, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class Served:
    """The producers being served and the selector their connections are in."""

    def __init__(self, listener: socket.socket):
        self.listener = listener
        self.sel = selectors.DefaultSelector()
        self.sel.register(listener, selectors.EVENT_READ)
        self.producers: dict[socket.socket, Producer] = {}

    def accept(self) -> bool:
        """Register a producer. Only processes of this user may hand over rings (an
        abstract socket is reachable by every user of the network namespace), and
        the ring's owner is the pid the kernel names, whatever the message says."""
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return False
        try:
            pid, uid = peer_of(conn)
            if uid != os.geteuid():
                raise ConnectionError(f"uid {uid} is another user")
            info, fd = _read_registration(conn)
            p = Producer(conn, pid, info, fd)
            conn.sendall(b"k" + str(os.getpid()).encode())
        except Exception as exc:
            print(f"dftrace drainer: registration refused: {exc!r}", file=sys.stderr)
            conn.close()
            return False
        self.producers[conn] = p
        self.sel.register(conn, selectors.EVENT_READ)
        return True

    def handle(self, p: Producer, data: bytes) -> None:
        """What the producer sent (b"": its connection ended)."""
        if not data:  # the process is gone without finalize
            self.end(p, None)
            return
        p.rbuf += data
        wrote = woken = False
        while True:
            try:
                msg = _next_message(p)
            except ValueError as exc:
                self.reject(p, str(exc))
                return
            if msg is None:
                break
            if msg[:1] == b"f":
                self.end(p, msg[5:])
                return
            if msg in (b"s", b"n"):  # write now (n: a producer waits for room; no answer)
                self.guard(p, p.write, True)
                wrote = True
                if p.conn not in self.producers:
                    return
                if msg == b"s":
                    try:
                        p.conn.sendall(b"y" + struct.pack("<Q", p.written))
                    except OSError:
                        pass
            else:  # "w": the producer sealed a write's worth of slots
                woken = True
        if woken and not wrote:
            self.guard(p, p.write, False)

    def guard(self, p: Producer, fn: Any, *args: Any) -> Any:
        """Run ``fn``; an inconsistent ring drops its producer, other errors are said."""
        from .. import engine as _engine

        try:
            return fn(*args)
        except _engine.speedups.RingError as exc:
            self.reject(p, str(exc))
        except Exception as exc:
            print(f"dftrace drainer: {exc!r}", file=sys.stderr)
        return None

    def end(self, p: Producer, trailer_lines: bytes | None) -> None:
        """The producer finalized (``trailer_lines``: its last lines, answered with
        ``d`` and what became of the file) or ended without finalize (None)."""
        info = self.guard(p, p.finish, trailer_lines)
        if p.conn not in self.producers:  # rejected meanwhile
            return
        if info is None:
            info = {"paths": list(p.sink.paths), "lost": 0, "failed": "drainer error",
                    "written": p.written}
        if trailer_lines is not None:
            body = json.dumps(info).encode()
            try:
                p.conn.sendall(b"d" + struct.pack("<I", len(body)) + body)
            except OSError:
                pass
        self.drop(p)

    def reject(self, p: Producer, why: str) -> None:
        """Stop serving ``p``, and tell it why (``x`` + 4-byte length + the reason):
        it writes its trace itself from then on, and says so."""
        try:
            p.reject(why)
        except Exception:
            pass
        body = why.encode("utf-8", "replace")[:4096]
        try:
            p.conn.send(b"x" + struct.pack("<I", len(body)) + body, socket.MSG_DONTWAIT)
        except OSError:
            pass
        self.drop(p)

    def drop(self, p: Producer) -> None:
        try:
            self.sel.unregister(p.conn)
        except (KeyError, ValueError):
            pass
        self.producers.pop(p.conn, None)
        p.conn.close()


def _next_message(p: Producer) -> bytes | None:
    """The next whole message in the producer's input (None: not yet complete).
    Raises ValueError on anything that is not a message of the protocol."""
    buf = p.rbuf
    if not buf:
        return None
    kind = buf[:1]
    if kind in (b"w", b"s", b"n"):
        p.rbuf = buf[1:]
        return kind
    if kind == b"f":
        if len(buf) < 5:
            return None
        n = struct.unpack("<I", buf[1:5])[0]
        if n > MAX_MESSAGE:
            raise ValueError("trailer too long")
        if len(buf) < 5 + n:
            return None
        p.rbuf = buf[5 + n:]
        return buf[:5 + n]
    raise ValueError(f"unknown message {kind!r}")


def serve(name: str, ppid: int) -> int:
    """Serve producers until the last one is gone."""
    from .. import engine as _engine

    if _engine.speedups is None:
        return 2
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, lambda *_: None)  # the parent ended: serve the rest
    _tie_to_parent(ppid)
    os.umask(0)  # each file is created with its producer's umask (see Producer)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(64)
    srv = Served(listener)
    started = time.monotonic()
    served = False  # a producer registered at some point
    idle_since = started
    while True:
        now = time.monotonic()
        if srv.producers:
            idle_since = now
        elif (served and now - idle_since >= LINGER_S) or now - started > FIRST_PRODUCER_S:
            break
        # Sleep until the next flush is due: wakes, registrations and ends of
        # connections arrive on the sockets.
        timeout = min([p.next_flush for p in srv.producers.values()],
                      default=now + LINGER_S) - now
        for key, _ in srv.sel.select(max(0.0, timeout)):
            sock = key.fileobj
            if sock is listener:
                served = srv.accept() or served
                continue
            p = srv.producers.get(sock)  # type: ignore[arg-type]
            if p is None:
                continue
            try:
                data = sock.recv(65536)  # type: ignore[union-attr]
            except OSError:
                data = b""
            srv.handle(p, data)
        now = time.monotonic()
        for p in list(srv.producers.values()):
            if now >= p.next_flush:
                p.next_flush = now + p.flush_interval
                srv.guard(p, p.write, True)
    listener.close()
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m dftrace._core.drain.drainer NAME PARENT_PID", file=sys.stderr)
        return 2
    return serve(argv[0], int(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
