"""Busy intervals: the union of a process's intervals of each group, and the sweep of
their boundaries that gives the time spent in each combination of active groups."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

#: Activity groups of the time breakdown, in bit order. ``.block`` spans (the loop
#: body of ``.iter()``) are containers, not activity, and are left out.
GROUPS = ("compute", "data", "comm", "checkpoint", "device")


def union_intervals(frame: pl.DataFrame, keys: Sequence[str]) -> pl.DataFrame:
    """Merge overlapping or touching [start, end] intervals within each (keys, group)."""
    if not frame.height:
        return frame
    pieces = []
    for key, part in frame.partition_by([*keys, "group"], as_dict=True, maintain_order=True).items():
        starts, ends = _union(part.get_column("start").to_numpy(), part.get_column("end").to_numpy())
        columns = {name: pl.repeat(value, len(starts), dtype=frame.schema[name], eager=True)
                   for name, value in zip([*keys, "group"], key)}
        pieces.append(pl.DataFrame({**columns, "start": starts, "end": ends}))
    return pl.concat(pieces, how="vertical").select(frame.columns)


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    # An interval opens a new run when it starts after everything before it ended.
    first = np.flatnonzero(np.concatenate(([True], starts[1:] > reach[:-1])))
    return starts[first], np.maximum.reduceat(ends, first)


def mask_times(intervals: pl.DataFrame) -> np.ndarray:
    """Time spent in each combination of active groups (bit mask -> µs) of one process.

    Each group's intervals are disjoint, so sweeping the sorted boundaries and
    toggling the group's bit at each one gives the set of active groups.
    """
    size = 1 << len(GROUPS)
    if not intervals.height:
        return np.zeros(size, dtype=np.int64)
    times, state = _sweep(intervals)
    spans = np.bincount(state[:-1], weights=np.diff(times), minlength=size)
    return np.rint(spans).astype(np.int64)


def _sweep(intervals: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The sorted boundaries of ``intervals`` (group, start, end) and the bit mask of
    the groups active from each one to the next. Each boundary is sorted as one
    integer, time * 8 + group: no index array (the order of boundaries at the same
    time only changes states that last no time)."""
    group = intervals.get_column("group").to_numpy().astype(np.int64)
    keys = np.concatenate([intervals.get_column("start").to_numpy() * 8 + group,
                           intervals.get_column("end").to_numpy() * 8 + group])
    del group
    keys.sort()
    state = np.bitwise_xor.accumulate(np.left_shift(np.uint8(1), (keys & 7).astype(np.uint8)))
    keys >>= 3
    return keys, state


def alone_intervals(intervals: pl.DataFrame, group: str) -> pl.DataFrame:
    """proc, start, end: the time each process spent with ``group`` active and no
    other group (disjoint intervals). ``intervals`` holds proc, group, start, end,
    disjoint within each (proc, group). For communication this is the blocked time:
    waiting in a collective (a blocking call, DDP's wait for its buckets, the
    completion of asynchronous work) while nothing else runs; several collectives at
    once count once, and in-flight work that overlaps compute is not waiting."""
    bit = 1 << GROUPS.index(group)
    pieces = []
    for (proc,), frame in intervals.partition_by("proc", as_dict=True).items():
        times, state = _sweep(frame)
        alone = (state[:-1] == bit) & (times[1:] > times[:-1])
        if alone.any():
            starts, ends = _union(times[:-1][alone], times[1:][alone])
            pieces.append(pl.DataFrame({"proc": proc, "start": starts, "end": ends},
                                       schema={"proc": pl.Int32, "start": pl.Int64, "end": pl.Int64}))
    if not pieces:
        return pl.DataFrame(schema={"proc": pl.Int32, "start": pl.Int64, "end": pl.Int64})
    return pl.concat(pieces, how="vertical")
