"""Asynchronous work's completions: a ``<leaf>.done`` span from the call to the end of
the work it started (a collective with ``async_op=True``, a DDP bucket's all-reduce),
written when its future completes, on a "comm in flight" track of its own; at a
session's end, what is still in flight is written ending then, incomplete."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from .. import format as fmt
from .._core import engine as _engine
from .._core import lifecycle as _lifecycle
from .._core.tree import Node


class _InFlightTracks:
    """Virtual threads on which ``<leaf>.done`` spans are written, so spans that
    overlap in time never share a track."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ends: list[list[int]] = []  # [tid, end of its last span]

    def track(self, t0: int, t1: int) -> int:
        with self._lock:
            for entry in self._ends:
                if entry[1] <= t0:
                    entry[1] = t1
                    return entry[0]
            tid = _engine.new_track("comm in flight")
            self._ends.append([tid, t1])
        return tid

    def clear(self) -> None:
        with self._lock:
            self._ends.clear()


in_flight_tracks = _InFlightTracks()


class _InFlight:
    """Asynchronous work whose ``.done`` span is not written yet. At a session's end it
    gets a moment to complete (its callback may run just after the wait for it), then
    what is left is written ending then, incomplete: none is lost unsaid."""

    #: How long a session's end waits for completions already under way.
    WAIT_S = 0.5

    def __init__(self) -> None:
        self._forked()
        self._next = 0
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        """(and in a forked child: the parent's work is not its own, its lock maybe held)"""
        self._lock = threading.Lock()
        self._work: dict[int, tuple[int, int, dict[str, Any], Any]] = {}

    def add(self, kid: int, t0: int, keep: dict[str, Any], sticky: Any) -> int:
        with self._lock:
            self._next += 1
            self._work[self._next] = (kid, t0, keep, sticky)
            if len(self._work) == 1:
                _lifecycle.at_end(self.end)
            return self._next

    def pop(self, token: int) -> bool:
        with self._lock:
            return self._work.pop(token, None) is not None

    def end(self) -> None:
        deadline = time.monotonic() + self.WAIT_S
        while self._work and time.monotonic() < deadline:
            time.sleep(0.005)
        with self._lock:
            left, self._work = self._work, {}
        t1 = _engine.clock()
        for kid, t0, keep, sticky in left.values():
            _engine.record_finished(kid, t0, t1, keep, sticky, in_flight_tracks.track(t0, t1), incomplete=True)


_in_flight = _InFlight()


def record_completion(node: Node, future: Any, t0: int, args: dict[str, Any]) -> None:
    """When ``future`` completes, write ``<node>.done`` from ``t0`` to then (at the
    session's end, if it has not: incomplete)."""
    done = node.derive(fmt.DONE_SUFFIX[1:])
    if not done.enabled:
        return
    keep = {k: args[k] for k in ("group", "seq", "bucket") if k in args}
    sticky = _engine.sticky_of(done)  # the sticky args in force when the work was issued
    token = _in_flight.add(done._kid, t0, keep, sticky)

    def on_done(_: Any) -> None:
        try:
            if _in_flight.pop(token):
                t1 = _engine.clock()
                _engine.record_finished(done._kid, t0, t1, keep, sticky, in_flight_tracks.track(t0, t1))
        except Exception:
            pass

    try:
        future.add_done_callback(on_done)
    except Exception:
        _in_flight.pop(token)
