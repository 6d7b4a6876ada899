"""The clock anchor of a process: the wall time and the monotonic time of one moment.
Every timestamp of a trace is the monotonic clock shifted by the anchor's offset, so a
wall clock stepped during the run moves nothing; the children a traced process starts
on its host take its anchor (:data:`ANCHOR_ENV`), so a job's processes share one.
"""

from __future__ import annotations

import os
import time

__all__ = ["ANCHOR_ENV", "anchor_value", "job_anchor"]

#: ``<boot>:<wall_ns>:<mono_ns>``: the clock anchor of the job's first traced process,
#: taken over by its children started on the same host since that boot (exported
#: with the configuration).
ANCHOR_ENV = "DFTRACE_CLOCK_ANCHOR"


def _boot_id(host: str) -> str:
    """This boot of this host (the monotonic clock counts from it)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return f"{host}/{fh.read().strip()}"
    except OSError:  # not Linux: the host's name alone
        return host


def _read() -> tuple[int, int]:
    """(wall_ns, mono_ns) of one moment: the wall clock read between two readings of
    the monotonic one, the closest pair of a few tries. A process preempted between
    two plain readings (a busy node) would put all its spans off the other processes'
    by as long as it waited, and the ranks' waits for each other with them."""
    best = (0, 0, 0)
    for _ in range(8):
        m0 = time.perf_counter_ns()
        wall = time.time_ns()
        m1 = time.perf_counter_ns()
        if not best[0] or m1 - m0 < best[0]:
            best = (max(1, m1 - m0), wall, (m0 + m1) // 2)
        if m1 - m0 < 10_000:
            break
    return best[1], best[2]


def _inherited(host: str) -> tuple[int, int] | None:
    """(wall_ns, mono_ns) of the parent's anchor when it is of this host's boot."""
    boot, _, rest = os.environ.get(ANCHOR_ENV, "").rpartition(":")
    boot, _, wall = boot.rpartition(":")
    try:
        anchor = (int(wall), int(rest))
    except ValueError:
        return None
    if boot != _boot_id(host) or not 0 < anchor[1] <= time.perf_counter_ns():
        return None
    return anchor


def job_anchor(host: str) -> tuple[int, int]:
    """(wall_ns, mono_ns): the parent's anchor when it is of this host's boot, else one
    read now."""
    return _inherited(host) or _read()


def anchor_value(host: str, wall_ns: int, mono_ns: int) -> str:
    """What :data:`ANCHOR_ENV` carries to the children of a process of that anchor."""
    return f"{_boot_id(host)}:{wall_ns}:{mono_ns}"
