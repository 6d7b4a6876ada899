"""Where the records of ``writer="process"`` go while in-memory traces run
(``dftrace.trace_in_memory()``): process memory, then this process encodes them,
hands the lines to the traces and relays them to the ring, for the drainer.

The C engine appends records to the ring (``shm_local(False)``) or to the buffer in
process memory (``shm_local(True)``); :class:`Relay` switches between the two as
in-memory traces come and go, and moves what the buffer holds on to the ring.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from .. import buffer as _buffer, state as _state
from ..buffer import tapped, to_tap
from ..state import STATE

__all__ = ["Relay"]

#: Most bytes of lines relayed to the ring as one record (a slot's args hold 256 KiB).
RELAY_BYTES = 192 * 1024


class Relay:
    """The records' way to the ring while in-memory traces run. ``local``: they are in
    process memory now; ``lock`` is held while a relay is under way (a full ring
    found by it waits for the drainer, see ``ProcessWriter.wait_drained``)."""

    def __init__(self, session: Any, special_to_ring: Callable[[tuple], None],
                 written: Callable[[], None]):
        self.session = session
        self.local = False
        self.lock = threading.RLock()
        self._special_to_ring = special_to_ring
        self._written = written  # lines are in the ring: the drainer should know

    def follow_tap(self) -> None:
        """In-memory traces started (records go to process memory) or all ended
        (records go to the ring again, with what the last trace left)."""
        want = tapped()
        with self.lock:
            if want == self.local:
                return
            self.local = want
            _state.native.shm_local(want)
            # Metadata lines too: in the buffer (for the in-memory traces), or the ring.
            STATE.special_to_ring = None if want else self._special_to_ring
            if not want:
                self.relay(force=True)

    def relay(self, force: bool = False) -> int:
        """While in-memory traces run: encode what is buffered in process memory, hand
        it to the traces and append the lines to the ring. Returns the number of
        records."""
        if not (self.local or force):
            return 0
        total = 0
        with self.lock:
            target = _buffer.buffered()
            while True:
                data, n = _buffer.drain(self.session.encoder, 16384)
                total += n
                if data:
                    to_tap(data)
                    to_ring(data)
                if n == 0 or total >= target:
                    break
        if total:
            self._written()
        return total

    def end(self, relay_first: bool) -> None:
        """The session ends: records go to the ring, with what is buffered
        (``relay_first``: in the process that registered the ring)."""
        if self.local:
            if relay_first:
                self.relay()
            self.local = False
            _state.native.shm_local(False)

    def under_way_here(self) -> bool:
        """This thread is relaying now."""
        return self.local and self.lock._is_owned()  # type: ignore[attr-defined]


def to_ring(data: bytes) -> None:
    """Append encoded lines to the ring, as records of at most RELAY_BYTES cut at line
    ends (a longer line goes whole: the engine splits it over slots)."""
    append = _state.native.shm_append_line
    start = 0
    while start < len(data):
        end = len(data)
        if end - start > RELAY_BYTES:
            cut = data.rfind(b"\n", start, start + RELAY_BYTES)
            end = cut + 1 if cut >= 0 else data.find(b"\n", start + RELAY_BYTES) + 1 or end
        if not append(data[start:end]):  # the ring stayed full: dropped (counted once)
            STATE.dropped += max(0, data.count(b"\n", start, end) - 1)
        start = end
