"""Busy intervals: each thread's time painted with its innermost span, the union of a
process's intervals of each group, the sweep of their boundaries that gives the
time spent in each combination of active groups, and the time of a process's
intervals within each of its steps.

Each sweep has two ways, chosen in one place (the function named after it): the C
kernels of the ``runtime._kernels`` extension (``runtime/sweeps.c``, built with the
package) and numpy, for an install without a compiler. They give the same answers, malformed spans
included (tests/analysis/test_sweeps.py holds them to it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import polars as pl

from ..runtime import kernels


#: Activity groups of the time breakdown, in bit order. ``.block`` spans (the loop
#: body of ``.iter()``) are containers, not activity, and are left out.
GROUPS = ("compute", "data", "comm", "checkpoint", "device")


class Painting(NamedTuple):
    """What painting each thread's time with its innermost span finds."""

    #: group, start, end: the time each thread spent with its innermost open span in
    #: each activity group (the intervals of a group may touch: a union merges them)
    intervals: pl.DataFrame
    #: each span's self time, the time it was the innermost
    self_us: np.ndarray
    #: each span's nesting edges (see ``reduce.aggregate.nesting_edges``), found by the C
    #: sweep as it passes: whether it is an orphan, whether an opener. None from the
    #: numpy sweep, and where a thread's levels spread wider than its spans are many.
    orphan: np.ndarray | None = None
    opener: np.ndarray | None = None


def innermost_intervals(threads: pl.DataFrame) -> Painting:
    """The painting of ``threads``: tid, ts, end, level and group (an index into
    GROUPS, null for none), one row a span."""
    if kernels.C is not None:
        return _innermost_native(threads)
    return _innermost_numpy(threads)


def _innermost_native(threads: pl.DataFrame) -> Painting:
    filled = threads.select(pl.col("level").fill_null(0).cast(pl.Int64),
                            pl.col("level").is_not_null().cast(pl.UInt8).alias("level_valid"),
                            pl.col("group").fill_null(-1).cast(pl.Int8))
    columns = [np.ascontiguousarray(threads.get_column(name).to_numpy(), dtype=np.int64) for name in ("tid", "ts", "end")]
    columns += [np.ascontiguousarray(series.to_numpy()) for series in filled.iter_columns()]
    painting = painted_spans(*columns)
    if painting is None:  # spans with the same times: in the order the numpy path takes them
        painting = painted_spans(*columns, order=tied_order(*columns[:3]))
    assert painting is not None
    return painting


def tied_order(tid: np.ndarray, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Span indices, thread by thread in the order the threads first appear, each
    thread's spans by start, the longest first (``_by_start``): the ``order`` that
    tells ``painted_spans`` which of a thread's spans with the same times is the
    innermost."""
    frame = pl.DataFrame({"tid": tid, "ts": ts, "end": end, "span": np.arange(tid.size, dtype=np.int64)})
    return np.concatenate([_by_start(thread).get_column("span").to_numpy()
                           for thread in frame.partition_by("tid", maintain_order=True)])


def painted_spans(tid: np.ndarray, ts: np.ndarray, end: np.ndarray, level: np.ndarray, level_valid: np.ndarray,
                  group: np.ndarray, *, order: np.ndarray | None = None) -> Painting | None:
    """The painting of spans given as arrays (int64; ``level_valid`` uint8, ``group``
    int8, -1 for none), by the C sweep; None without it, and where two spans of a
    thread have the same times and no ``order`` (span indices, see ``runtime/sweeps.c``)
    says which is the innermost."""
    if kernels.C is None:
        return None
    given = b"" if order is None else np.ascontiguousarray(order, dtype=np.int64)
    painted = kernels.C.innermost(tid, ts, end, level, level_valid, group, given)
    if painted is None:
        return None
    groups, starts, ends, self_us, orphan, opener = painted
    intervals = pl.DataFrame(
        {"group": np.frombuffer(groups, np.int8), "start": np.frombuffer(starts, np.int64),
         "end": np.frombuffer(ends, np.int64)},
        schema={"group": pl.Int8, "start": pl.Int64, "end": pl.Int64},
    )
    edges = [None if mask is None else np.frombuffer(mask, np.bool_) for mask in (orphan, opener)]
    return Painting(intervals, np.frombuffer(self_us, np.int64), *edges)


def _innermost_numpy(threads: pl.DataFrame) -> Painting:
    pieces = []
    self_us = np.zeros(threads.height, dtype=np.int64)
    frame = threads.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("span"))
    for _, thread in frame.partition_by("tid", as_dict=True).items():
        intervals, (owner, us) = _innermost(thread)
        pieces.append(intervals)
        if owner.size:
            self_us += np.bincount(owner, us.astype(np.float64), self_us.size).astype(np.int64)
    if not pieces:
        return Painting(pl.DataFrame(schema={"group": pl.Int8, "start": pl.Int64, "end": pl.Int64}), self_us)
    return Painting(pl.concat(pieces, how="vertical"), self_us)


def _innermost(thread: pl.DataFrame) -> tuple[pl.DataFrame, tuple[np.ndarray, np.ndarray]]:
    thread = _by_start(thread)
    starts = thread.get_column("ts").to_numpy().astype(np.int64)
    ends = thread.get_column("end").to_numpy().astype(np.int64)
    groups = thread.get_column("group").fill_null(-1).to_numpy().astype(np.int64)
    spans = thread.get_column("span").to_numpy().astype(np.int64)
    levels = thread.get_column("level")
    if levels.null_count():
        depth = _depths(starts, ends)
    else:
        depth = levels.to_numpy().astype(np.int64)
    bounds = _sorted_unique(np.concatenate([starts, ends]))
    if bounds.size < 2:
        return (pl.DataFrame(schema={"group": pl.Int8, "start": pl.Int64, "end": pl.Int64}),
                (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)))
    first = np.searchsorted(bounds, starts)
    last = np.searchsorted(bounds, ends)
    segments = bounds.size - 1
    best_depth = np.full(segments, -1, dtype=np.int64)
    best_group = np.full(segments, -1, dtype=np.int64)
    best_span = np.full(segments, -1, dtype=np.int64)
    position = np.arange(starts.size, dtype=np.int64)
    # Deeper spans paint over shallower ones; spans of one depth on one thread are
    # disjoint, so painting depth by depth leaves the innermost span (and its group).
    for d in np.unique(depth):
        at = depth == d
        opens, closes = first[at], last[at]
        cover = _tally(opens, closes, None, segments + 1)
        code = _tally(opens, closes, groups[at] + 2, segments + 1)
        owner = _tally(opens, closes, position[at], segments + 1)
        depth_cover = np.cumsum(cover)[:-1]
        covered = depth_cover > 0
        # Spans of one depth overlap only in odd files (identical events): their
        # codes add up, so divide by how many there are; never out of range.
        count = np.maximum(depth_cover, 1)
        value = np.clip(np.cumsum(code)[:-1] // count - 2, -1, len(GROUPS) - 1)
        which = np.clip(np.cumsum(owner)[:-1] // count, 0, starts.size - 1)
        take = covered & (d >= best_depth)
        best_depth[take] = d
        best_group[take] = value[take]
        best_span[take] = which[take]
    keep = best_group >= 0
    owned = best_span >= 0
    intervals = pl.DataFrame(
        {"group": best_group[keep], "start": bounds[:-1][keep], "end": bounds[1:][keep]},
        schema={"group": pl.Int8, "start": pl.Int64, "end": pl.Int64},
    )
    return intervals, (spans[best_span[owned]], np.diff(bounds)[owned])


def _by_start(thread: pl.DataFrame) -> pl.DataFrame:
    """A thread's spans by start, the longest first. Spans with the same times are in
    the order polars' sort leaves them (not stable): which of them is the innermost."""
    return thread.sort(["ts", "end"], descending=[False, True])


def _tally(opens: np.ndarray, closes: np.ndarray, values: np.ndarray | None, size: int) -> np.ndarray:
    """Per boundary, the sum of ``values`` (1 without) of the spans opening there less
    that of those closing there (int64; ``np.bincount`` is many times faster than
    ``np.add.at``, and its float sums of integers are exact far beyond these)."""
    if values is None:
        return np.bincount(opens, minlength=size) - np.bincount(closes, minlength=size)
    weights = values.astype(np.float64)
    return (np.bincount(opens, weights, size) - np.bincount(closes, weights, size)).astype(np.int64)


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` by sorting: several times faster than its hashing for millions of times."""
    values = np.sort(values)
    if values.size:
        values = values[np.concatenate(([True], values[1:] != values[:-1]))]
    return values


def _depths(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Nesting depth of each span (sorted by start, longest first) from its times."""
    depth = np.empty(starts.size, dtype=np.int64)
    open_ends: list[int] = []
    for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())):
        while open_ends and open_ends[-1] <= s:
            open_ends.pop()
        depth[i] = len(open_ends) + 1
        open_ends.append(e)
    return depth


def union_intervals(frame: pl.DataFrame, keys: Sequence[str]) -> pl.DataFrame:
    """Merge overlapping or touching [start, end] intervals within each (keys, group),
    in the order each (keys, group) first appears, each one's intervals by start."""
    if not frame.height:
        return frame
    if kernels.C is not None:
        return _union_native(frame, keys)
    pieces = []
    for key, part in frame.partition_by([*keys, "group"], as_dict=True, maintain_order=True).items():
        starts, ends = _union(part.get_column("start").to_numpy(), part.get_column("end").to_numpy())
        columns = {name: pl.repeat(value, len(starts), dtype=frame.schema[name], eager=True)
                   for name, value in zip([*keys, "group"], key)}
        pieces.append(pl.DataFrame({**columns, "start": starts, "end": ends}))
    return pl.concat(pieces, how="vertical").select(frame.columns)


def _union_native(frame: pl.DataFrame, keys: Sequence[str]) -> pl.DataFrame:
    ids, n_ids = _key_ids(frame, keys)
    rows, starts, ends = kernels.C.union(
        ids, *(np.ascontiguousarray(frame.get_column(name).to_numpy(), dtype=np.int64) for name in ("start", "end")),
        n_ids)
    picked = pl.Series(np.frombuffer(rows, np.int64), dtype=pl.UInt32)  # polars' index type: a quick gather
    return pl.DataFrame([*(frame.get_column(key)[picked] for key in (*keys, "group")),
                         pl.Series("start", np.frombuffer(starts, np.int64)),
                         pl.Series("end", np.frombuffer(ends, np.int64))]).select(frame.columns)


def _key_ids(frame: pl.DataFrame, keys: Sequence[str]) -> tuple[np.ndarray, int]:
    """A number from 0 for each distinct (``keys``, group) of ``frame``'s rows, and how
    many: from the group alone where the keys are the same on every row, from one
    integer key and the group packed into one integer where only that key varies (a
    piece's threads), else from polars' ranking of them all (several times slower)."""
    group = frame.get_column("group")
    varying = [key for key, same in zip(keys, frame.select(
        pl.col(key).eq_missing(pl.col(key).first()).all() for key in keys).row(0) if keys else ()) if not same]
    if group.dtype == pl.Int8 and not group.null_count():
        if not varying:
            return group.to_numpy().astype(np.int64) + 128, 256  # the group alone tells them apart
        key = frame.get_column(varying[0])
        if len(varying) == 1 and key.dtype.is_integer() and not key.null_count():
            found = key_and_group_ids(key.to_numpy(), group.to_numpy())
            if found is not None:
                return found
    ids = frame.select(pl.struct(*keys, "group").rank("dense")).to_series().to_numpy().astype(np.int64) - 1
    return ids, int(ids.max()) + 1


def key_and_group_ids(key: np.ndarray, group: np.ndarray) -> tuple[np.ndarray, int] | None:
    """A number from 0 for each distinct (``key``, ``group``) of the rows (an integer
    key, an int8 group), and how many, found from the two packed into one integer;
    None where a key is too wide to pack."""
    if key.size and not (-(1 << 54) < key.min() and key.max() < 1 << 54):
        return None
    _, ids = np.unique((key.astype(np.int64) << 8) + group.astype(np.int64) + 128, return_inverse=True)
    return np.ascontiguousarray(ids.reshape(-1), np.int64), int(ids.max()) + 1 if ids.size else 0


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
    if not intervals.height:
        return np.zeros(1 << len(GROUPS), dtype=np.int64)
    return _masks(intervals, -1)[0]


def overlap_and_alone(intervals: pl.DataFrame, group: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """From one sweep of each process's ``intervals`` (proc, group, start, end,
    disjoint within each (proc, group)): proc, mask, us, each process's time in each
    combination of groups (as ``mask_times`` finds it); and proc, start, end, the time
    each process spent with ``group`` active and no other group (disjoint intervals).
    For communication the latter is the blocked time: waiting in a collective (a
    blocking call, DDP's wait for its buckets, the completion of asynchronous work)
    while nothing else runs; several collectives at once count once, and in-flight
    work that overlaps compute is not waiting."""
    bit = 1 << GROUPS.index(group)
    overlaps, pieces = [], []
    for proc, frame in each_process(intervals):
        totals, starts, ends = _masks(frame, bit)
        overlaps.append(mask_rows(proc, totals))
        if starts.size:
            pieces.append(proc_intervals(proc, starts, ends))
    overlap = (pl.concat(overlaps, how="vertical") if overlaps
               else pl.DataFrame(schema={"proc": pl.Int32, "mask": pl.Int64, "us": pl.Int64}))
    if not pieces:
        return overlap, proc_intervals(0, np.empty(0, np.int64), np.empty(0, np.int64))
    return overlap, pl.concat(pieces, how="vertical")


def mask_rows(proc: int, totals: np.ndarray) -> pl.DataFrame:
    """proc, mask, us: a process's time in each combination of groups (``totals``: µs
    by bit mask), the combinations it spent time in."""
    return pl.DataFrame({"proc": proc, "mask": np.flatnonzero(totals > 0), "us": totals[totals > 0]},
                        schema={"proc": pl.Int32, "mask": pl.Int64, "us": pl.Int64})


def proc_intervals(proc: int, starts: np.ndarray, ends: np.ndarray) -> pl.DataFrame:
    """proc, start, end: one process's intervals."""
    return pl.DataFrame({"proc": proc, "start": starts, "end": ends},
                        schema={"proc": pl.Int32, "start": pl.Int64, "end": pl.Int64})


def swept_pieces(pieces: Sequence[pl.DataFrame], alone: str, emit: str
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """One sweep of one process's intervals held in ``pieces`` (group, start, end; each
    piece's disjoint within each group, as a part of a file leaves them, the pieces
    overlapping each other anywhere), without a union of them all: µs in each bit mask
    (as ``mask_times``), the starts and ends of the runs where ``alone`` is the only
    group active (as ``overlap_and_alone``), and those of the union of ``emit``'s
    intervals (those of no length left out: they hold no time). Nothing is copied
    where a piece's columns are in one chunk each. None without the C kernels, where
    an interval ends before it starts, or where the pieces are more than 65,536
    ordered runs (see ``runtime/sweeps.c``)."""
    if kernels.C is None:
        return None
    arrays = [(np.ascontiguousarray(piece.get_column("group").to_numpy(), np.int8),
               *(np.ascontiguousarray(piece.get_column(name).to_numpy(), np.int64) for name in ("start", "end")))
              for piece in pieces if piece.height]
    found = kernels.C.cover(arrays, 1 << len(GROUPS), 1 << GROUPS.index(alone), 1 << GROUPS.index(emit))
    del arrays
    return None if found is None else tuple(np.frombuffer(array, np.int64) for array in found)


def each_process(frame: pl.DataFrame) -> list[tuple[int, pl.DataFrame]]:
    """(proc, its rows) for each process of ``frame`` (a ``proc`` column): the frame
    itself, not a copy, where it holds one process's rows (a whole file's intervals,
    the usual)."""
    procs = frame.get_column("proc").unique()
    if procs.len() == 1 and not procs.null_count():
        return [(procs.item(), frame)]
    return [(proc, rows) for (proc,), rows in frame.partition_by("proc", as_dict=True).items()]


def _masks(intervals: pl.DataFrame, alone: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(µs in each bit mask, from 0 to 2**len(GROUPS) - 1 at least; starts and ends of the
    runs where the mask is ``alone``, none for -1) of ``intervals`` (group, start, end)."""
    group, starts, ends = (np.ascontiguousarray(intervals.get_column(name).to_numpy(), dtype=np.int64)
                           for name in ("group", "start", "end"))
    if kernels.C is not None:
        totals, alone_starts, alone_ends = kernels.C.masks(group, starts, ends, 1 << len(GROUPS), alone)
        return (np.frombuffer(totals, np.int64), np.frombuffer(alone_starts, np.int64),
                np.frombuffer(alone_ends, np.int64))
    return _masks_numpy(group, starts, ends, alone)


def _masks_numpy(group: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                 alone: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # Each boundary is sorted as one integer, time * 8 + group: no index array (the
    # order of boundaries at the same time only changes states that last no time).
    keys = np.concatenate([starts * 8 + group, ends * 8 + group])
    keys.sort()
    state = np.bitwise_xor.accumulate(np.left_shift(np.uint8(1), (keys & 7).astype(np.uint8)))
    times = keys >> 3
    del keys
    totals = np.rint(np.bincount(state[:-1], weights=np.diff(times), minlength=1 << len(GROUPS))).astype(np.int64)
    run = (state[:-1] == alone) & (times[1:] > times[:-1]) if alone >= 0 else None
    if run is None or not run.any():
        return totals, np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    return (totals, *_union(times[:-1][run], times[1:][run]))


def time_within(starts: np.ndarray, ends: np.ndarray, step_start: np.ndarray, step_end: np.ndarray) -> np.ndarray:
    """The time of disjoint intervals (``starts``, ``ends``: one process's) that falls
    within each [``step_start``, ``step_end``).

    Besides the result, one array a step and one an interval are made: the intervals
    are read where they are when they come sorted (they usually do), and the time
    before each is summed in place."""
    if not starts.size:
        return np.zeros(step_start.size, dtype=np.int64)
    if starts.size > 1 and not (starts[1:] >= starts[:-1]).all():
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        del order
    # before[k]: the time of the intervals before the k-th.
    before = np.empty(starts.size + 1, dtype=np.int64)
    before[0] = 0
    np.subtract(ends, starts, out=before[1:])
    np.cumsum(before[1:], out=before[1:])

    def time_until(t: np.ndarray) -> np.ndarray:
        # time before t: whole intervals before it plus the part of the one it is in
        last = np.searchsorted(starts, t, side="right")
        inside = last > 0
        last -= 1
        last[~inside] = 0
        part = np.minimum(t, ends[last])
        part -= starts[last]
        part[~inside] = 0
        part += before[last]
        return part

    return time_until(step_end) - time_until(step_start)


def time_in_steps(intervals: pl.DataFrame, procs: pl.DataFrame, steps: pl.DataFrame) -> np.ndarray:
    """Per row of ``steps`` (unit, start, end), the time of disjoint per-process
    ``intervals`` (proc, start, end) that falls within it (a unit's processes
    together; 0 for a unit without intervals).

    Neither table is copied whole: each process's intervals and each unit's steps are
    looked at through their row numbers."""
    totals = np.zeros(steps.height, dtype=np.int64)
    if not steps.height or not intervals.height:
        return totals
    units = dict(procs.filter(pl.col("unit").is_not_null()).select("proc", "unit").iter_rows())
    grouped_rows = steps.select("unit").with_row_index("row").group_by("unit").agg("row")
    rows_of = {unit: rows.to_numpy() for unit, rows in
               zip(grouped_rows.get_column("unit").to_list(), grouped_rows.get_column("row"))}
    step_start, step_end = steps.get_column("start").to_numpy(), steps.get_column("end").to_numpy()
    proc = intervals.get_column("proc").to_numpy()
    starts_all, ends_all = intervals.get_column("start").to_numpy(), intervals.get_column("end").to_numpy()
    grouped = proc.size < 2 or bool((proc[1:] >= proc[:-1]).all())
    by_proc = None if grouped else np.argsort(proc, kind="stable")
    procs_in_order = np.unique(proc)
    bounds = np.searchsorted(proc if grouped else proc[by_proc], procs_in_order, side="left").tolist() + [proc.size]
    # Per process, its intervals sorted alone (sorting the table was the peak); a unit's
    # processes add up. Where the table comes grouped by process (as combined), each
    # process's intervals are read in place.
    for i, one in enumerate(procs_in_order.tolist()):
        own = rows_of.get(units.get(int(one)))
        if own is None:
            continue
        taken = slice(bounds[i], bounds[i + 1]) if by_proc is None else by_proc[bounds[i]:bounds[i + 1]]
        totals[own] += time_within(starts_all[taken], ends_all[taken], step_start[own], step_end[own])
    return totals
