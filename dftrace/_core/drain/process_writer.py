"""The traced process's side of ``writer="process"``: records in shared memory.

The C engine appends this process's records to a ring of chunk slots in a memfd
(``_speedups.shm_attach``) instead of process memory. A drainer process
(:mod:`.drainer`, one per job and host, found through ``DFTRACE_DRAINER``) maps the
same memfd, encodes the records with the same encoder and writes the file with the
same :class:`FileSink`. No thread of this process ever writes the trace file: storage
that hangs holds the drainer, never this process, and a process killed with SIGKILL
loses nothing it committed to the ring (the drainer writes what the ring holds and
the spans its open-span table holds, incomplete, says how the process ended and
closes the file).

Who answers is checked before anything is sent: the drainer's socket is an
abstract name any local user could bind, so the kernel's credentials of the peer
(``SO_PEERCRED``) must name this user and, when known, the drainer's pid (the one
this process started, or the one recorded in ``DFTRACE_DRAINER`` as ``NAME:PID``).
The memfd's size is sealed before it is handed over, and every answer is checked:
anything unexpected makes this process write its trace itself (one warning).
Finding the drainer and registering with it is :mod:`.registration`'s part.

``buffer_limit`` bounds the spans in the ring's slots that the drainer has not written
yet, exactly as it bounds the spans waiting in memory with the writer thread (the
ring has two slots more than the limit needs; a slot also holds at most 256 KiB of
args). While the buffer has a tap (a ``dftrace.trace_in_memory()`` runs, see
:mod:`.buffer`), records go to process memory: this process encodes them, hands
the lines to the tap and relays them to the ring (:mod:`.relay`). When the drainer
is gone, this process writes the ring itself (:mod:`.fallback`).

Protocol on the Unix socket (this process -> drainer): one registration message
(4-byte length, JSON, the memfd as ancillary data), then ``w`` a write's worth of
slots is full, ``n`` write everything now (a full ring waits for room; no answer),
``s`` write everything now (answered ``y`` + 8-byte count of events written), ``f`` +
4-byte length + the trailer's lines: finalized, write everything, those lines and the
end of the file (answered ``d`` + 4-byte length + JSON: paths, events lost, error,
events written). The drainer answers the registration with ``k`` + its pid,
and says ``x`` + 4-byte length + the reason when it stops serving this process.
"""

from __future__ import annotations

import json
import mmap
import os
import select
import socket
import struct
import sys
import threading
import time
from typing import Any

from .. import buffer as _buffer, state as _state
from ..buffer import Consumer, tapped
from ..state import STATE
from .fallback import take_over
from .relay import Relay
from .registration import (ENV_VAR, MAX_ANSWER, DrainerUnavailable, _ProtocolError,
                           _Rejected, reap, register)
from ..writer import Patience

__all__ = ["ProcessWriter"]

#: A drainer that frees no slot for this long has stalled: a full ring stops
#: waiting for it (in block mode too), whatever the drainer says it is doing.
STALL_S = 1.0



def _ring(buffer_limit: int) -> tuple[int, mmap.mmap]:
    """A memfd for the ring, its size sealed (the drainer maps it: a shrink under
    its mapping, by anyone, would kill it with SIGBUS), and this process's mapping."""
    import fcntl

    sp = _state.native
    if sp is None:
        raise DrainerUnavailable("the C engine is off (DFTRACE_NO_SPEEDUPS or not built)",
                                 platform=True)
    if (not hasattr(os, "memfd_create") or not sys.platform.startswith("linux")
            or not hasattr(fcntl, "F_ADD_SEALS")):
        raise DrainerUnavailable("no sealable memfd on this platform", platform=True)
    # Two slots more than buffer_limit spans fill: the one being filled and one sealed
    # early (a wait for room seals it) never make the ring full before the limit.
    nslots = max(4, -(-buffer_limit // sp.SHM_SLOT_RECORDS) + 2)
    size = sp.SHM_FIXED_BYTES + nslots * sp.SHM_SLOT_BYTES
    try:
        fd = os.memfd_create("dftrace-ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError as exc:
        raise DrainerUnavailable(f"memfd_create failed: {exc}") from None
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        return fd, mmap.mmap(fd, size)
    except OSError as exc:
        os.close(fd)
        # A limit of this process (RLIMIT_FSIZE, memory): no ring here.
        raise DrainerUnavailable(f"shared memory of {size} bytes: {exc}", platform=True) from None


class ProcessWriter(Consumer):
    """The session's writer when a drainer process writes the file (the
    :class:`~._core.buffer.Consumer` protocol, and stalled, sync, stop): when to
    drain. While in-memory traces run, ``relay`` moves the records to the ring; when
    the drainer is gone, or answers anything unexpected, ``fallback`` (an in-process
    Writer, :func:`.fallback.take_over`) writes the ring from the drainer's last
    commit."""

    def __init__(self, session: Any):
        self.session = session
        self.pid = os.getpid()
        self.events_written = 0
        self.fallback: Any = None
        self._lock = threading.Lock()
        self._replies = b""
        self._progress = (-1, 0.0)  # (drainer's commits, monotonic time) when last seen
        self._gave_up_at = -1  # the drainer's commits when a full ring last stopped waiting
        self._fd, self._mm = _ring(session.config.buffer_limit)
        # Slots sealed since the drainer was last woken: it is woken once per write's
        # worth (as the writer thread at batch_size), at most half the ring and the
        # slots buffer_limit fills (a limit under one slot's size: each seal).
        self._sealed = 0
        nslots = max(1, (len(self._mm) - _state.native.SHM_FIXED_BYTES)
                     // _state.native.SHM_SLOT_BYTES)
        per_slot = _state.native.SHM_SLOT_RECORDS
        self._seals_per_wake = max(1, min(min(session.config.batch_size, 1 << 20) // per_slot, nslots // 2,
                                          session.config.buffer_limit // per_slot))
        previous = STATE.consumer
        if tapped() and previous is not None:
            previous.flush()  # the in-memory traces' records so far (attaching drops the buffer)
        try:
            enc = session.encoder
            _state.native.shm_attach(self._mm, session.pid, enc.pid_piece, enc.hh_piece,
                                     enc.offset_ns, enc.min_id)
            try:
                self._sock, self.drainer_pid = register(session, self._fd)
            except BaseException:
                _state.native.shm_detach()
                raise
        except DrainerUnavailable:
            self._release_ring()
            raise
        except Exception as exc:
            self._release_ring()
            limit = _state.limit_refused(exc)  # a limit of the system is named as one
            raise DrainerUnavailable(
                f"registration failed: {limit + ': ' if limit else ''}{exc!r}") from None
        os.close(self._fd)  # the drainer holds its own; the mapping stays
        self._fd = -1
        encoder, append = session.encoder, _state.native.shm_append_line

        def special_to_ring(rec: tuple) -> None:
            line = encoder.special_line(rec)
            if line:
                append(line)

        STATE.special_to_ring = special_to_ring
        self.relay = Relay(session, special_to_ring, self._relayed)
        self.tap_changed()  # an in-memory trace running already

    def end_open_spans(self, t1: int, tracks: set[int], t_tracks: int,
                       args: dict[int, bytes]) -> set[int]:
        """Ids of the spans open now, written incomplete (``shm_end_open_spans``), with
        the args fragments ``args`` gives by id."""
        try:
            return set(_state.native.shm_end_open_spans(t1, tracks, t_tracks, args))
        except Exception:
            return set()

    def _release_ring(self) -> None:
        self._mm.close()
        os.close(self._fd)

    def _here(self) -> bool:
        """This is the process that registered (not a child forked without the
        at-fork hooks, from C): only it talks to the drainer."""
        return os.getpid() == self.pid

    # -- the drainer is gone ---------------------------------------------------------
    def _lost(self, why: str = "ended") -> Any:
        """Write the ring from this process from now on (once), from the drainer's
        last commit (:mod:`.fallback`)."""
        with self._lock:
            if self.fallback is None:
                if why == "ended":
                    why = self._last_word() or why
                STATE.warn_once(
                    "drainer-lost",
                    f"the trace drainer (pid {self.drainer_pid}) {why}; this process writes "
                    "its trace itself from now on")
                os.environ.pop(ENV_VAR, None)  # children must not look for it either
                self.fallback = take_over(self.session, self._mm)
                try:
                    self._sock.close()
                except OSError:
                    pass
            return self.fallback

    def _last_word(self) -> str | None:
        """Why the drainer stopped serving this process, when it said so before
        closing the connection (None otherwise)."""
        try:
            while len(self._replies) < MAX_ANSWER:
                data = self._sock.recv(65536, socket.MSG_DONTWAIT)
                if not data:
                    break
                self._replies += data
        except OSError:
            pass
        try:
            self._take_reply(b"")
        except _Rejected as exc:
            return f"dropped this process's ring ({exc})"
        except _ProtocolError:
            pass
        return None

    def _send(self, b: bytes) -> bool:
        try:
            self._sock.send(b, socket.MSG_DONTWAIT)
            return True
        except BlockingIOError:
            return True  # wakes already queued
        except OSError:
            self._lost()
            return False

    # -- in-memory traces (:mod:`.relay`) ----------------------------------------
    def tap_changed(self) -> None:
        if self._here():
            self.relay.follow_tap()

    def _relayed(self) -> None:
        """Lines were relayed to the ring: the drainer is woken for them."""
        if self.fallback is None:
            self._send(b"w")

    # -- consumer protocol ---------------------------------------------------------
    def wake(self) -> None:
        if not self._here():
            return
        if self.relay.local:
            self.relay.relay()
        elif self.fallback is not None:
            self.fallback.wake()
        else:  # a slot was sealed
            self._sealed += 1
            if self._sealed >= self._seals_per_wake:
                self._sealed = 0
                self._send(b"w")

    def _watch(self) -> None:
        """Start measuring the drainer's progress (a wait for room begins)."""
        self._progress = (-1, time.monotonic())

    def _no_progress(self) -> bool:
        """The drainer committed nothing (wrote nothing, freed no slot) for STALL_S
        since _watch(), whatever it says it is doing (a stopped drainer says
        nothing)."""
        st = _state.native.shm_state()
        if st is None:
            return False
        now = time.monotonic()
        if st[3] != self._progress[0]:
            self._progress = (st[3], now)
        return now - self._progress[1] > STALL_S

    def stalled(self) -> bool:
        """The drainer's write under way is older than STALL_S: its storage stalled."""
        if self.fallback is not None:
            return bool(self.fallback.stalled())
        st = _state.native.shm_state()
        busy = st[2] if st else 0
        return bool(busy) and time.monotonic_ns() - busy > STALL_S * 1e9

    def wait_drained(self, below: int, timeout: float) -> bool:
        """The ring is full: wait until half its slots are free again; False (the
        record is then dropped and counted) when the drainer's storage stalled or it
        committed nothing for STALL_S, busy or not. Once it gave up, a full ring does
        not wait again until the drainer has committed since."""
        if not self._here():
            return False
        # In-memory traces run: the buffer is in process memory; a relay under way in this
        # thread found the ring full, though, and waits for the drainer.
        relaying = self.relay.under_way_here()
        if self.relay.local and not relaying:
            self.relay.relay()
            return True
        deadline = time.monotonic() + timeout
        st = _state.native.shm_state()
        if st is not None and st[3] == self._gave_up_at:
            return False  # still stalled: nothing committed since the last give-up
        self._gave_up_at = -1
        self._watch()
        # The slot being filled is sealed, so that the drainer writes and frees it whole.
        _state.native.shm_seal_now()
        if self.fallback is not None:
            self.fallback.wake()
        else:
            self._send(b"n")
        while True:
            st = _state.native.shm_state()
            if st is None or (st[0] >= max(1, st[1] // 2)
                              and (relaying or _buffer.buffered() <= below)):
                return True
            if time.monotonic() >= deadline or self.stalled() or self._no_progress():
                self._gave_up_at = st[3]
                return False
            time.sleep(0.001)

    def _request(self, b: bytes, reply: bytes, timeout: float,
                 patience: Patience | None = None) -> bytes | None:
        """Send ``b`` and wait for the answer starting with ``reply`` (None: none
        came in time, the drainer stalled or is gone). With ``patience``, "in time"
        means while the drainer keeps committing (see :class:`Patience`). Raises
        _ProtocolError when the drainer answered something else than the protocol's
        answers."""
        if not self._lock.acquire(timeout=max(0.0, timeout)):
            return None
        try:
            deadline = time.monotonic() + timeout

            def time_left() -> float:
                if patience is None:
                    return deadline - time.monotonic()
                st = _state.native.shm_state()
                return patience.left(st[3] if st is not None else None)

            if self.fallback is not None:
                return None
            view = memoryview(b)
            while view:  # never block on a drainer that does not read (hung storage)
                try:
                    view = view[self._sock.send(view, socket.MSG_DONTWAIT):]
                except BlockingIOError:
                    left = time_left()
                    if left <= 0 or self.stalled():
                        return None
                    select.select([], [self._sock], [], min(left, 0.05))
                except OSError:
                    return b""  # the drainer is gone
            while True:
                got = self._take_reply(reply)
                if got is not None:
                    return got
                left = time_left()
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
        """The next whole answer when it is of ``kind`` (None: none complete yet);
        _ProtocolError on bytes that are no answer."""
        buf = self._replies
        while buf:
            if buf[:1] == b"y":
                if len(buf) < 9:
                    break
                msg, buf = buf[:9], buf[9:]
            elif buf[:1] in (b"d", b"x"):
                if len(buf) < 5:
                    break
                n = struct.unpack("<I", buf[1:5])[0]
                if n > MAX_ANSWER:
                    raise _ProtocolError(f"an answer of {n} bytes")
                if len(buf) < 5 + n:
                    break
                msg, buf = buf[:5 + n], buf[5 + n:]
            else:
                raise _ProtocolError(f"the answer {buf[:16]!r}")
            self._replies = buf
            if msg[:1] == b"x":
                raise _Rejected(msg[5:].decode("utf-8", "replace"))
            if msg[:1] == kind:
                return msg
        self._replies = buf
        return None

    def _ask(self, b: bytes, reply: bytes, timeout: float,
             patience: Patience | None = None) -> bytes | None:
        """_request, with a drainer that is gone or answers nonsense replaced by
        the in-process writer (b"" then)."""
        try:
            got = self._request(b, reply, timeout, patience)
        except _Rejected as exc:
            self._lost(f"dropped this process's ring ({exc})")
            return b""
        except _ProtocolError as exc:
            self._lost(f"answered what it should not ({exc})")
            return b""
        if got == b"":
            self._lost()
        return got

    def flush(self, timeout: float = -1) -> int:
        """Have the drainer write everything recorded so far, and wait for it."""
        if not self._here():
            return 0
        self.relay.relay()
        if self.fallback is None:
            got = self._ask(b"s", b"y", 30.0 if timeout < 0 else timeout)
            if got:
                before = self.events_written
                self.events_written = struct.unpack("<Q", got[1:9])[0]
                return max(0, self.events_written - before)
            if got is None:
                return 0
        return int(self.fallback.flush(timeout))

    def sync(self, timeout: float) -> bool:
        if self.fallback is not None:
            return bool(self.fallback.sync(timeout))
        return self.flush(timeout) >= 0

    def stop(self, timeout: float = 30.0, trailer: Any = None,
             patience: Patience | None = None) -> bool:
        """Seal the ring and have the drainer end the file with the trailer's lines
        (sent with the request, so a full ring never drops them; the drainer adds the
        count of drops, which it reads from the ring). Waits at most ``timeout``
        seconds, and not at all once the drainer's storage stalled (the drainer
        still writes what the ring holds when it can). True when the file is
        complete."""
        self.relay.end(relay_first=self._here())
        body = trailer(False) if trailer is not None else b"]\n"
        lines = body[:-2] if body.endswith(b"]\n") else body
        if self.fallback is None:
            _state.native.shm_finish()
            patience = patience or Patience(timeout)
            got = self._ask(b"f" + struct.pack("<I", len(lines)) + lines, b"d", timeout, patience)
            if got is None:
                self._close()
                return False
            if got:
                try:
                    self._finished(got[5:])
                    self._close()
                    return True
                except _ProtocolError as exc:
                    self._lost(f"answered what it should not ({exc})")
        # The in-process writer: the drops are its to count.
        body = trailer(True) if trailer is not None else b"]\n"
        return bool(self.fallback.stop(timeout, lambda: body, patience))

    def _finished(self, answer: bytes) -> None:
        """Take the drainer's account of the file (each field checked)."""
        try:
            info = json.loads(answer)
        except ValueError:
            raise _ProtocolError("an answer that is not JSON") from None
        ok = isinstance(info, dict)
        paths = info.get("paths") if ok else None
        lost, written, failed = ((info.get("lost"), info.get("written"), info.get("failed"))
                                 if ok else (None, None, None))
        unsaved = info.get("unsaved", []) if ok else None
        loss_record = info.get("loss_record") if ok else None
        if not (isinstance(paths, list) and all(isinstance(p, str) for p in paths)
                and isinstance(unsaved, list) and all(isinstance(p, str) for p in unsaved)
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                        for v in (lost, written))
                and all(v is None or isinstance(v, str) for v in (failed, loss_record))):
            raise _ProtocolError("an account of the file with missing or wrong fields")
        # The drainer said each failure when it happened; finalize gives the counts in all.
        s = self.session
        s.sink.paths[:] = paths
        s.sink.unsaved[:] = unsaved
        s.sink.loss_record = loss_record
        s.sink.events_lost = lost
        s.sink.failed = failed
        self.events_written = written

    def _close(self) -> None:
        STATE.special_to_ring = None
        if _state.native is not None:
            _state.native.shm_detach()
        try:
            self._sock.close()
        except OSError:
            pass
        try:
            self._mm.close()
        except (BufferError, ValueError):
            pass
        reap()

    def forget(self) -> None:
        """In a forked child: let go of the parent's ring and connection without a
        word to the drainer (they stay the parent's)."""
        self._close()  # close() is not shutdown(): the parent's connection stays open
