"""Per-partition partial aggregates that combine exactly into whole-trace ones.

A partition's events are reduced to small tables: a sketch of the durations per
(process, category, name) (counts, totals, extremes exact; percentiles within a
stated relative error, see ``_sketch``), the extents of
each (step, name) the step model works from, the pipeline's own spans, one row
per traced collective (to match calls across ranks), epoch extents, the union of
busy intervals per activity group (self time: each thread's time goes to its
innermost span) and the process extents.
Counts and sums add, minima and maxima take the extreme, interval unions union
again: combining partials in any grouping gives the same result as aggregating
all events at once. Workers ship only these tables, never the events.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from ... import format as fmt
from ..runtime.kernels import analysis_kernels
from .busy import (GROUPS, Painting, innermost_intervals, mask_times, overlap_and_alone, painted_spans,
                    union_intervals)
from ..read.decode import (MAX_BROKEN_KEPT, PartitionData, ScannedPiece, iter_partition_pieces, number_series, read_ahead,
                      text_passes, text_series)
from ..read.activity import activity_by_process
from .io_tables import ARG_COLUMNS as IO_ARG_COLUMNS
from .io_tables import IO_CATS, SCHEMAS as IO_SCHEMAS, cover_table, io_tables, regrouped_totals
from ..read.metadata import Resolution
from ..read.schema import HOST_KEY, SUMMARY_COLUMNS, FrameT
from .sketch import BIN_SCHEMA, EXACT_BELOW_US, bins_of, merged_bins
from ..read.sources import Partition
from .steps import (PROFILER_STEP_PREFIX, STEP_SCHEMA, STEP_TIME_SCHEMA, WORK_CATS, container_rows,
                     merged_work_encloses, model_steps, settled_procs, step_codes, step_rows, with_step_times,
                     without_profiler_steps, work_merged)
from ..read.trace import FileReport, file_reports, partition_keys, resolve_parts

_GROUP_CATS = {
    fmt.CAT_COMPUTE: 0,
    fmt.CAT_DATA: 1,
    fmt.CAT_DATALOADER: 1,
    fmt.CAT_COMM: 2,
    fmt.CAT_CHECKPOINT: 3,
    fmt.CAT_DEVICE: 4,
}
#: The tracers' own bookkeeping events, left out of every statistic.
TRACER_CATS = (fmt.CAT_TRACER, fmt.CAT_DFTRACER)

_KEY = ["pid", HOST_KEY]

#: The C kernels; None without them (no compiler, or DFTRACE_NO_SPEEDUPS).
_native = analysis_kernels()


@dataclass
class Partial:
    """The aggregates of one partition."""

    #: Read report of the partition, with its metadata records (no events).
    source: PartitionData
    keys: list[tuple[int, str]]
    #: pid, host_key, cat, name, bin, n, total, lo, hi, m2: the durations of the
    #: complete events of each name as a mergeable sketch (see ``_sketch``).
    durations: pl.DataFrame
    #: pid, host_key, epoch, step, cat, name, start, end, n: extents of the spans
    #: carrying args.step, per name (pipeline spans and loop bodies left out)
    steps: pl.DataFrame
    #: pid, host_key, name, start, end: the pipeline's own spans (train, epoch,
    #: evaluate, ...), loop bodies and item waits left out
    containers: pl.DataFrame
    #: pid, host_key, name, group, seq, ts, dur, done: traced collectives (done: the
    #: span from an asynchronous call to its completion)
    collectives: pl.DataFrame
    #: pid, host_key, epoch, start, end, n: extents of the events carrying args.epoch
    epochs: pl.DataFrame
    #: pid, host_key, epoch, start, end, n: the pipeline's epoch spans themselves
    epoch_spans: pl.DataFrame
    #: pid, host_key, group, start, end: disjoint busy intervals per group
    intervals: pl.DataFrame
    #: pid, host_key, cat, name, us: self time per name as painted in this partition
    self_times: pl.DataFrame
    #: pid, host_key, tid, level, start, end / ... cat, name: spans whose enclosing span
    #: is elsewhere, and spans that may enclose such spans of earlier partitions
    #: (see ``self_times_of``)
    orphans: pl.DataFrame
    openers: pl.DataFrame
    #: pid, host_key, start, end, n, incomplete
    extents: pl.DataFrame
    #: pid, host_key, mask, us: time in each combination of active groups, valid
    #: when this partial holds all of the process's events (see ``combine``).
    overlap: pl.DataFrame
    #: ph, n: events of every phase (counters, instants, ...)
    phases: pl.DataFrame
    #: pid, host_key, epoch, step, start, end, n, work, compute_us, blocked_us: the
    #: steps of each process of a whole file, modelled where it was read (``steps`` is
    #: then empty), with the process's compute and blocked time in each (see
    #: ``with_step_times``); None when ``steps`` holds the rows. Valid while no other
    #: file holds events of the same process, and, for the times, no other process of
    #: its rank places steps by its work: ``combine`` reads such a file again otherwise.
    #: Held with each count and time in the narrowest integer type that holds the
    #: file's values (see ``_held_narrow``).
    modelled: pl.DataFrame | None = None
    #: pid, host_key, tid, ts, end, kind, bytes, ops / fhash, kind, bucket, small, ops,
    #: bytes, us, first, last / tid, group, start, end: the traced I/O calls, their
    #: totals per file and kind, and the spans they are placed in (see ``_io``).
    io_calls: pl.DataFrame | None = None
    io_totals: pl.DataFrame | None = None
    io_cover: pl.DataFrame | None = None
    #: pid, host_key, start, end: with ``modelled``, the blocked time (see
    #: ``overlap_and_alone``) of the processes without step times, found where it was
    #: read; ``intervals`` then keeps their compute intervals alone, all the answers
    #: need of the others.
    blocked: pl.DataFrame | None = None

    @property
    def events(self) -> int:
        """Events of every phase the partition held."""
        return int(self.phases.get_column("n").sum())


def aggregate_partition(partition: Partition, *, model: bool = True) -> Partial:
    """Read one partition and reduce it to a :class:`Partial` (see
    ``aggregate_partitions``)."""
    (partial,) = aggregate_partitions([partition], model=model)
    return partial


def aggregate_partitions(partitions: Iterable[Partition], *, model: bool = True) -> Iterator[Partial]:
    """Read each of ``partitions`` in turn and reduce it to a :class:`Partial` (runs on
    workers), piece by piece: the piece being reduced and the next one, inflated and
    decoded meanwhile on a thread (``read_ahead``), are held at a time. A partition's
    pieces' partials are then folded into one and its steps modelled on a thread of
    their own (``_finished``) while the next partition's pieces are read. A whole file's
    step rows become its processes' steps (``Partial.modelled``) unless ``model`` is
    false: a few rows per step rather than one per step and name."""
    stream = read_ahead(_each_partitions_pieces(partitions))
    finishing: list[Future[Partial]] = []  # the partition before, being finished
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="dftrace-finish") as finisher:
            for first in stream:  # a partition's first piece: it has one at least
                partition = first[0]
                pieces = _until_partition_end(first, stream)
                del first
                stack = _pieces_folded(pieces, work_per_step=_settles(partition, model))
                if finishing:
                    yield finishing.pop().result()
                finishing.append(finisher.submit(_finished, partition, stack, model))
                del stack
            if finishing:
                yield finishing.pop().result()
    finally:
        stream.close()


#: What follows a partition's last piece in ``_each_partitions_pieces``.
_PARTITION_END = object()


def _each_partitions_pieces(partitions: Iterable[Partition]) -> Generator[tuple[Partition, Any], None, None]:
    # Each piece is inflated on the thread that decodes it: the decoding and the
    # reducing thread keep two cores busy already, and a third inflating one piece
    # further ahead held a piece more and was slower.
    for partition in partitions:
        for piece in _summary_pieces(partition, inflate_ahead=False):
            yield partition, piece
        yield partition, _PARTITION_END


def _summary_pieces(partition: Partition, *, inflate_ahead: bool) -> Iterator[PartitionData]:
    return iter_partition_pieces(partition, SUMMARY_COLUMNS, piece_bytes=SUMMARY_PIECE_BYTES,
                                 inflate_ahead=inflate_ahead, scanned=True, arg_columns=IO_ARG_COLUMNS)


def _until_partition_end(first: tuple[Partition, Any], stream: Iterator[tuple[Partition, Any]]
                         ) -> Iterator[PartitionData]:
    """The pieces of one partition from ``first`` on, each let go of before the next
    is waited for."""
    piece = first[1]
    del first
    while piece is not _PARTITION_END:
        yield piece
        del piece
        piece = next(stream)[1]


def _pieces_folded(pieces: Iterator[PartitionData], *, work_per_step: bool) -> list[tuple[int, Partial]]:
    """The partials of ``pieces``, with the number of pieces each holds; with
    ``work_per_step``, each piece's step rows with each step's work merged into one
    (``work_merged``: for a file whose steps are modelled where it is read)."""
    # Pieces are folded as they come, _FOLD of a like number of pieces at a time: a
    # few partials are held whatever the partition's size, and each piece is folded
    # about log(pieces) / log(_FOLD) times.
    # A piece's overlap times are left out: folding finds them anew from the unioned
    # intervals, and a partition read in one piece has them found at the end.
    stack: list[tuple[int, Partial]] = []
    for piece in pieces:
        partial = names_capped(aggregate(piece, overlap=False, work_per_step=work_per_step))
        del piece
        stack.append((1, partial))
        del partial
        while len(stack) >= _FOLD and len({weight for weight, _ in stack[-_FOLD:]}) == 1:
            folded = fold_partials([p for _, p in stack[-_FOLD:]])
            weight = stack[-1][0] * _FOLD
            del stack[-_FOLD:]
            stack.append((weight, compacted(folded)))
    return stack


def _settles(partition: Partition, model: bool) -> bool:
    """Whether ``partition``'s steps are modelled where it is read: a whole file of
    lines (see ``Partial.modelled``)."""
    return model and partition.start == 0 and partition.end is None and not partition.is_parquet


def _finished(partition: Partition, stack: list[tuple[int, Partial]], model: bool) -> Partial:
    """The partial of ``partition`` from its pieces' (``_pieces_folded``; the list is
    emptied): folded into one, its steps modelled where the whole file was read."""
    settle = _settles(partition, model)
    partial = _folded(stack, settle)
    if settle and merged_work_encloses(partial.steps, _KEY):
        # A step's work merged into one row holds other steps: the file is read again
        # with a row a name (rare: a span that carries a step and encloses others).
        partial = _folded(_pieces_folded(_summary_pieces(partition, inflate_ahead=True), work_per_step=False),
                          settle)
    if settle:
        partial = _settled_where_read(partial)
    return compacted(names_capped(partial))


#: Names kept per process and category in a partition's durations and self times:
#: beyond, those of the least total time are one row, ``OTHER_NAMES``, so a trace with
#: millions of distinct names (a file path in each) is summarized in bounded memory.
MAX_NAMES = 10_000
#: The row that stands for the names beyond ``MAX_NAMES`` (its count and time exact).
OTHER_NAMES = "(other names)"


def names_capped(partial: Partial) -> Partial:
    """``partial`` with at most ``MAX_NAMES`` names per process and category in its
    durations and self times, the others folded into one ``OTHER_NAMES`` row. Where a
    name is kept in one partition and folded in another, its own row holds only the
    first part: the cap takes effect only past ``MAX_NAMES`` distinct names."""
    keys = [c for c in (*_KEY, "cat") if c in partial.durations.columns]
    names = partial.durations.select(*keys, "name").unique()
    if (names.group_by(keys).len().get_column("len").max() or 0) <= MAX_NAMES:
        return partial
    totals = partial.durations.group_by(*keys, "name").agg(pl.col("total").sum())
    kept = totals.filter(pl.col("total").rank("ordinal", descending=True).over(keys) <= MAX_NAMES).select(
        *keys, "name", pl.lit(True).alias("kept"))

    def folded(table: pl.DataFrame) -> pl.DataFrame:
        flag = table.join(kept, on=[*keys, "name"], how="left").get_column("kept").fill_null(False)
        return table.with_columns(pl.when(flag).then(pl.col("name")).otherwise(pl.lit(OTHER_NAMES)).alias("name"))

    durations, self_times = partial.durations, partial.self_times
    partial.durations = merged_bins(folded(durations), [*keys, "name"]).select(durations.columns).cast(
        durations.schema)
    partial.self_times = folded(self_times).group_by(*keys, "name").agg(pl.col("us").sum()).select(
        self_times.columns).cast(self_times.schema)
    return partial


def _folded(stack: list[tuple[int, Partial]], settle: bool) -> Partial:
    """The pieces' partials of ``stack`` (emptied) folded into one."""
    partials = [p for _, p in stack]
    read_in_one_piece = len(stack) == 1 and stack[0][0] == 1
    stack.clear()
    # A settled file's overlap times come from the sweep that finds its blocked time.
    if len(partials) > 1:
        return fold_partials(partials, overlap=not settle)
    partial = partials[0]
    if read_in_one_piece and not settle:
        partial.overlap = _overlap_of(partial.intervals)
    return partial


def _settled_where_read(partial: Partial) -> Partial:
    """A whole file's ``partial`` with its step rows replaced by each process's steps
    and its busy intervals by the compute intervals and the blocked time: what the
    answers need of them, a fraction of the rows; its overlap times found anew."""
    # Every process with step rows has spans, hence extents.
    keys = partial.extents.select(_KEY).unique(maintain_order=True).with_row_index("proc").with_columns(
        pl.col("proc").cast(pl.Int32))
    rows = without_profiler_steps(_by_proc(partial.steps, keys))
    partial.steps = _EMPTY["steps"]  # each table is let go once it is used: they are the peak of a file
    steps = model_steps(rows, _by_proc(partial.containers, keys))
    del rows
    intervals = _by_proc(partial.intervals, keys)
    partial.intervals = _EMPTY["intervals"]
    compute_bit = GROUPS.index("compute")
    compute = intervals.filter(pl.col("group") == compute_bit).drop("group")
    overlap, blocked = overlap_and_alone(intervals, "comm")
    partial.overlap = _as_stored("overlap", _by_key(overlap, keys))
    del intervals, overlap
    # A process whose steps are placed by its work keeps the time of its intervals in
    # each step, not the intervals (see ``with_step_times``).
    steps = with_step_times(steps, compute, blocked)
    settled = settled_procs(steps)
    partial.modelled = _held_narrow(_as_stored("modelled", _by_key(steps, keys)), _NARROW_MODELLED)
    del steps
    if settled:
        unsettled = ~pl.col("proc").is_in(settled)
        blocked, compute = blocked.filter(unsettled), compute.filter(unsettled)
    partial.blocked = _as_stored("blocked", _by_key(blocked, keys))
    partial.intervals = _as_stored("intervals", _by_key(compute, keys).with_columns(
        pl.lit(compute_bit, pl.Int8).alias("group")))
    return partial


#: The columns of ``Partial.modelled`` held narrow: a step's numbers, its event count
#: and its times. Its start and end are times since the epoch, 64 bits wide.
_NARROW_MODELLED = ("epoch", "step", "n", *STEP_TIME_SCHEMA)


def _held_narrow(frame: pl.DataFrame, columns: Sequence[str]) -> pl.DataFrame:
    """``frame`` with each of its integer ``columns`` in the narrowest signed type that
    holds its values: the rank-step tables of every file are held until the answers,
    and their numbers and times take one to four bytes where eight were kept
    (``unit_steps`` widens them again)."""
    if not frame.height:
        return frame
    return frame.with_columns(frame.get_column(column).shrink_dtype() for column in columns)


def _by_proc(frame: pl.DataFrame, keys: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with the proc of ``keys`` (pid, host_key, proc) in place of its key
    columns; one process's rows take a constant column rather than a join."""
    if keys.height == 1:
        return frame.drop(_KEY).with_columns(pl.lit(keys.item(0, "proc"), pl.Int32).alias("proc"))
    return frame.join(keys, on=_KEY).drop(_KEY)


def _by_key(frame: pl.DataFrame, keys: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with the key columns of its proc (see ``_by_proc``)."""
    if keys.height == 1:
        return frame.with_columns(pl.lit(keys.item(0, "pid"), pl.Int64).alias("pid"),
                                  pl.lit(keys.item(0, HOST_KEY), pl.String).alias(HOST_KEY))
    return frame.join(keys, on="proc")


#: Partials of pieces folded into one at a time.
_FOLD = 8
#: Decoded text reduced at a time by the summary: what a partition costs in memory
#: while it is read, whatever its size.
SUMMARY_PIECE_BYTES = 6 << 20

PARTIAL_TABLES = ("durations", "steps", "containers", "collectives", "epochs", "epoch_spans", "intervals",
           "self_times", "orphans", "openers", "extents", "overlap", "io_calls", "io_totals", "io_cover")
#: The I/O tables among them: found apart from the spans' (see ``_io``).
_IO_TABLES = ("io_calls", "io_totals", "io_cover")


def compacted(partial: Partial) -> Partial:
    """``partial`` with each table in one chunk of exactly its size: the partials of
    every partition are held until they are combined, so the spare capacity and
    chunk lists the reduction left behind would be held with them."""
    for kind in PARTIAL_TABLES:
        setattr(partial, kind, getattr(partial, kind).rechunk().shrink_to_fit())
    if partial.modelled is not None:
        partial.modelled = partial.modelled.rechunk().shrink_to_fit()
        partial.blocked = partial.blocked.rechunk().shrink_to_fit()
    return partial


def without_row_keys(partial: Partial) -> Partial:
    """``partial`` as it is held until it is combined: one of a single process (the
    usual) without the pid and host key of every row, which take more memory than
    the rows' times (``combine`` gives its rows that process)."""
    if len(partial.keys) == 1:
        for kind in (*PARTIAL_TABLES, "modelled", "blocked"):
            table = getattr(partial, kind)
            if table is not None and HOST_KEY in table.columns:
                setattr(partial, kind, table.drop(_KEY))
    return partial


def aggregate(data: PartitionData, *, overlap: bool = True, work_per_step: bool = False) -> Partial:
    """Reduce a partition's events to a :class:`Partial` (its ``overlap`` table empty
    without ``overlap``: for a piece that is folded with others); with
    ``work_per_step``, its step rows have each step's work in one row (see
    ``work_merged``)."""
    if data.scanned is not None:
        partial = _aggregate_scanned(data, data.scanned, overlap, work_per_step)
        if partial is not None:
            return partial
        data.events, data.scanned = data.scanned.events(), None
    events = data.events
    source = PartitionData(
        data.partition,
        events.clear(),
        meta=data.meta,
        n_lines=data.n_lines,
        broken=data.broken,
        broken_count=data.broken_count,
        cut_off=data.cut_off,
        closed=data.closed,
        activity=data.activity,
    )
    phases = events.group_by("ph").agg(pl.len().cast(pl.Int64).alias("n"))
    spans = events.filter(
        (pl.col("ph") == fmt.PH_COMPLETE)
        & pl.col("dur").is_not_null()
        & pl.col("ts").is_not_null()
        & ~pl.col("cat").is_in(TRACER_CATS)
        & ~pl.col("cat").is_in(IO_CATS)
    ).with_columns(pl.col("pid").fill_null(0), (pl.col("ts") + pl.col("dur")).alias("end"))
    # One process at a time: a partition rarely holds more than one, and grouping
    # by integer keys alone is several times faster than with the string host key.
    pieces = [_aggregate_process(frame, key, overlap) for key, frame in _by_process(spans)]
    tables = {
        kind: pl.concat([p[kind] for p in pieces], how="vertical") if pieces else _EMPTY[kind]
        for kind in PARTIAL_TABLES if kind not in _IO_TABLES
    }
    tables.update(_io_of_table(events, spans))
    if work_per_step:
        tables["steps"] = work_merged(tables["steps"], _KEY)
    return Partial(source, partition_keys(data), phases=phases, **tables)


def _aggregate_scanned(data: PartitionData, piece: ScannedPiece, with_overlap: bool,
                       work_per_step: bool = False) -> Partial | None:
    """``aggregate`` of a piece from the columns the C scanner read, without making a
    table of its events: each text's tests are made once per distinct value, and the
    groups are found by the C kernel. The same tables as ``aggregate``'s (held so by
    tests/analysis/test_scanned_reduction.py); None where the piece needs the table
    (events of several processes, spans of a thread with the same times, nesting edges
    the sweep leaves to the query, a level beyond 32 bits)."""
    kept = piece.kept
    ph_values, ph_index = piece.ph
    counts = np.bincount(ph_index[kept], minlength=len(ph_values))
    phases = pl.DataFrame({"ph": [v for v, c in zip(ph_values, counts.tolist()) if c], "n": counts[counts > 0]},
                          schema={"ph": pl.String, "n": pl.Int64})
    pid_values, pid_valid = piece.numbers["pid"]
    pids = np.where(pid_valid, pid_values, 0)[kept]
    if pids.size and (pids != pids[0]).any():
        return None
    level_values, level_valid = piece.numbers["level"]
    if (level_valid & ((level_values < -(2**31)) | (level_values >= 2**31))).any():
        return None  # the table's Int32 cast refuses it
    source = PartitionData(data.partition, data.events.clear(), meta=data.meta, n_lines=data.n_lines,
                           broken=data.broken, broken_count=data.broken_count, cut_off=data.cut_off,
                           closed=data.closed, activity=data.activity)
    keys = [(int(pids[0]), "")] if pids.size else []
    cat_values, cat_all = piece.texts["cat"]
    is_x = np.array([v == fmt.PH_COMPLETE for v in ph_values], dtype=np.bool_)
    counted_cat = np.array([v is not None and v not in TRACER_CATS and v not in IO_CATS for v in cat_values],
                           dtype=np.bool_)
    timed = kept & is_x[ph_index] & piece.numbers["ts"][1] & piece.numbers["dur"][1]
    rows = np.flatnonzero(timed & counted_cat[cat_all])
    io_cat = np.array([v in IO_CATS for v in cat_values], dtype=np.bool_)
    io = _io_of_scanned(piece, np.flatnonzero(timed & io_cat[cat_all]), keys)
    if not rows.size:
        empty = {kind: _EMPTY[kind] for kind in PARTIAL_TABLES if kind not in _IO_TABLES}
        return Partial(source, keys, phases=phases, **empty, **io, io_cover=_EMPTY["io_cover"])
    span = _ScannedSpans(piece, rows)
    tid_values, tid_ok = span.take("tid")
    tid = np.where(tid_ok, tid_values, 0)
    level, level_ok = span.take("level")
    block = span.name_is(lambda v: v.endswith(fmt.BLOCK_SUFFIX))
    group = np.where(block, -1, np.array([_GROUP_CATS.get(v, -1) for v in cat_values], dtype=np.int8)[span.cat])
    painting = painted_spans(tid, span.ts, span.end, np.where(level_ok, level, 0), level_ok.view(np.uint8),
                             group.astype(np.int8))
    if painting is None or painting.orphan is None or painting.opener is None:
        return None
    intervals = union_intervals(painting.intervals, [])
    masks = mask_times(intervals) if with_overlap else np.zeros(1, dtype=np.int64)
    pipeline = span.cat_is(lambda v: v == fmt.CAT_PIPELINE)
    epoch, epoch_ok = span.take("epoch")
    step, step_ok = span.take("step")
    count, count_ok = span.take("count")
    seq, seq_ok = span.take("seq")
    incomplete, incomplete_ok = span.take("incomplete")
    done = span.name_is(lambda v: v.endswith(fmt.DONE_SUFFIX))
    edge = {"tid": tid, "level": (level, level_ok), "start": span.ts, "end": span.end}
    name_values = piece.texts["name"][0]
    group_values, group_index = piece.texts["group"]
    # An epoch span numbers its epoch as .iter()'s 1-based count, else in args.epoch.
    span_epoch = np.where(count_ok, count - 1, epoch)
    # With work_per_step, each step's work is one row: compute, without a name (see ``work_merged``).
    cat_texts, step_cat, name_texts, step_name = cat_values, span.cat, name_values, span.name
    if work_per_step:
        merged = span.cat_is(lambda v: v in WORK_CATS) & ~span.name_is(lambda v: v.startswith(PROFILER_STEP_PREFIX))
        cat_texts, step_cat = [*cat_values, fmt.CAT_COMPUTE], np.where(merged, len(cat_values), span.cat)
        name_texts, step_name = [*name_values, None], np.where(merged, len(name_values), span.name)
    columns = {
        "steps": span.extents([epoch_ok, np.where(epoch_ok, epoch, 0), step, step_cat, step_name],
                              step_ok & ~pipeline & ~block & ~done,
                              {"epoch": (epoch, epoch_ok), "step": step, "cat": (cat_texts, step_cat),
                               "name": (name_texts, step_name)}),
        "containers": span.select(pipeline & ~block & ~span.name_is(lambda v: v.endswith(fmt.ITER_SUFFIX)),
                                  {"name": span.name, "start": span.ts, "end": span.end}),
        "collectives": span.select(span.cat_is(lambda v: v == fmt.CAT_COMM) & seq_ok, {
            "name": ([None if v is None else v.removesuffix(fmt.DONE_SUFFIX) for v in name_values], span.name),
            "group": (["" if v is None else v for v in group_values], group_index[rows]),
            "seq": seq, "ts": span.ts, "dur": span.dur, "done": done}),
        "epochs": span.extents([epoch], epoch_ok, {"epoch": epoch}),
        "epoch_spans": span.extents([span_epoch], pipeline & span.name_is(lambda v: v in fmt.EPOCH_NAMES)
                                    & (count_ok | epoch_ok), {"epoch": span_epoch}),
        "extents": {"start": [int(span.ts.min())], "end": [int(span.end.max())], "n": [rows.size],
                    "incomplete": [int((incomplete_ok & (incomplete != 0)).sum())]},
        "self_times": span.extents([span.cat, span.name], np.ones(rows.size, dtype=np.bool_),
                                   {"cat": span.cat, "name": span.name}, sums=("us", painting.self_us)),
        "orphans": span.select(painting.orphan, edge),
        "openers": span.select(painting.opener, {**edge, "cat": span.cat, "name": span.name}),
        "intervals": {name: intervals.get_column(name) for name in intervals.columns},
        "overlap": {"mask": np.flatnonzero(masks), "us": masks[masks > 0]},
        "durations": span.bins(),
    }
    pid = keys[0][0]
    cover = pl.DataFrame({"pid": np.full(rows.size, pid, dtype=np.int64), HOST_KEY: [""] * rows.size, "tid": tid,
                          "group": group.astype(np.int8), "start": span.ts, "end": span.end})
    return Partial(source, keys, phases=phases, **{kind: _stored(kind, pid, table) for kind, table in columns.items()},
                   **io, io_cover=_as_stored("io_cover", cover_table(cover, _KEY)))


def _io_of_table(events: pl.DataFrame, spans: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """The I/O tables of a partition's events (see ``_io``)."""
    missing = [pl.lit(None, dtype).alias(column) for column, (_, dtype) in IO_ARG_COLUMNS.items()
               if column not in events.columns]
    calls = events.filter((pl.col("ph") == fmt.PH_COMPLETE) & pl.col("dur").is_not_null() & pl.col("ts").is_not_null()
                          & pl.col("cat").is_in(IO_CATS)).with_columns(*missing, pl.col("pid").fill_null(0))
    io_calls, io_totals = io_tables(calls, _KEY)
    cover = spans.select(*_KEY, pl.col("tid").fill_null(0), _group_expr().alias("group"), pl.col("ts").alias("start"),
                         "end")
    return {"io_calls": _as_stored("io_calls", io_calls), "io_totals": _as_stored("io_totals", io_totals),
            "io_cover": _as_stored("io_cover", cover_table(cover, _KEY))}


def _io_of_scanned(piece: ScannedPiece, rows: np.ndarray, keys: list[tuple[int, str]]) -> dict[str, pl.DataFrame]:
    """io_calls and io_totals of the I/O events at ``rows`` of a scanned piece (of one process)."""
    if not rows.size:
        return {"io_calls": _EMPTY["io_calls"], "io_totals": _EMPTY["io_totals"]}
    columns = {"pid": np.full(rows.size, keys[0][0], dtype=np.int64), HOST_KEY: [""] * rows.size}
    for name in ("tid", "ts", "dur", "io_ret", "io_calls"):
        values, valid = piece.numbers[name]
        columns[name] = number_series(name, values[rows], valid[rows])
    for name in ("name", "io_fhash"):
        values, index = piece.texts[name]
        columns[name] = text_series(name, values, index[rows])
    io_calls, io_totals = io_tables(pl.DataFrame(columns), _KEY)
    return {"io_calls": _as_stored("io_calls", io_calls), "io_totals": _as_stored("io_totals", io_totals)}


def _stored(kind: str, pid: int, columns: dict[str, Any]) -> pl.DataFrame:
    """The ``kind`` table of one process's ``columns`` (Series, arrays or lists), in
    the columns and types of a partial's ``kind`` table."""
    height = len(next(iter(columns.values())))
    host_key = pl.Series(HOST_KEY, [""], dtype=pl.String)
    series = [pl.Series("pid", np.full(height, pid, dtype=np.int64)),
              host_key.new_from_index(0, height) if height else host_key.clear()]
    for name, dtype in _EMPTY[kind].schema.items():
        if name in _KEY:
            continue
        column = columns[name]
        column = column.alias(name) if isinstance(column, pl.Series) else pl.Series(name, column)
        series.append(column if column.dtype == dtype else column.cast(dtype))
    return pl.DataFrame(series)


class _ScannedSpans:
    """The spans among a scanned piece's lines (``rows``), column by column; texts as
    their indices among their distinct values (``cat``, ``name``)."""

    def __init__(self, piece: ScannedPiece, rows: np.ndarray):
        self.piece, self.rows = piece, rows
        self.cat = piece.texts["cat"][1][rows]
        self.name = piece.texts["name"][1][rows]
        self.ts = piece.numbers["ts"][0][rows]
        self.dur = piece.numbers["dur"][0][rows]
        self.end = self.ts + self.dur

    def take(self, column: str) -> tuple[np.ndarray, np.ndarray]:
        """(values, valid) of a number column at the spans."""
        values, valid = self.piece.numbers[column]
        return values[self.rows], valid[self.rows]

    def cat_is(self, test: Any) -> np.ndarray:
        return self._each(test, self.piece.texts["cat"][0], self.cat)

    def name_is(self, test: Any) -> np.ndarray:
        return self._each(test, self.piece.texts["name"][0], self.name)

    @staticmethod
    def _each(test: Any, values: list[str | None], index: np.ndarray) -> np.ndarray:
        return text_passes(values, index, lambda value: value is not None and bool(test(value)))

    def select(self, taken: np.ndarray, columns: dict[str, Any]) -> dict[str, Any]:
        """``columns`` (see ``_column``) of the spans ``taken`` marks."""
        at = np.flatnonzero(taken)
        return {name: self._column(name, values, at) for name, values in columns.items()}

    def extents(self, keys: list[np.ndarray], taken: np.ndarray, columns: dict[str, Any], *,
                low: np.ndarray | None = None, high: np.ndarray | None = None,
                sums: tuple[str, np.ndarray] | None = None) -> dict[str, Any]:
        """``columns`` (see ``_column``) of the groups of the spans ``taken`` marks by
        ``keys`` (int arrays), with their least start (or ``low``), greatest end (or
        ``high``) and count, and with ``sums``, (name, values), the sum of those values."""
        stacked = np.empty((self.ts.size, len(keys)), dtype=np.int64)
        for place, key in enumerate(keys):
            stacked[:, place] = key
        at, least, most, n, total = (np.frombuffer(buffer, np.int64) for buffer in _native.extents(
            stacked, len(keys), self.ts if low is None else low, self.end if high is None else high,
            b"" if sums is None else sums[1], np.ascontiguousarray(taken, dtype=np.uint8)))
        found = {name: self._column(name, values, at) for name, values in columns.items()}
        found.update(start=least, end=most, n=n)
        if sums is not None:
            found[sums[0]] = total
        return found

    def _column(self, name: str, values: Any, at: np.ndarray) -> Any:
        """Column ``name`` at the spans ``at`` of ``values``: an array of every span,
        (values, valid) arrays, or (texts, each span's index among them); the spans'
        ``cat`` and ``name`` indices as their texts."""
        if name in ("cat", "name") and values is getattr(self, name):
            return text_series(name, self.piece.texts[name][0], values[at])
        if isinstance(values, tuple) and isinstance(values[0], list):
            return text_series(name, values[0], values[1][at])
        if isinstance(values, tuple):
            data, valid = values[0][at], values[1][at]
            return number_series(name, data, valid)
        return values[at]

    def bins(self) -> dict[str, Any]:
        """The durations' sketch per name (``bins_of``): the exact bins (durations below
        ``EXACT_BELOW_US``, one value each, no spread) grouped in C, the buckets of the
        longer ones by ``bins_of`` itself."""
        exact = self.dur < EXACT_BELOW_US
        found = self.extents([self.cat, self.name, self.dur], exact, {"cat": self.cat, "name": self.name},
                             low=self.dur, high=self.dur, sums=("total", self.dur))
        columns = {"cat": found["cat"], "name": found["name"], "bin": found["start"], "n": found["n"],
                   "total": found["total"], "lo": found["start"], "hi": found["end"],
                   "m2": np.zeros(found["n"].size, dtype=np.float64)}
        if exact.all():
            return columns
        longer = pl.DataFrame({"cat": self.cat[~exact], "name": self.name[~exact], "dur": self.dur[~exact]})
        binned = bins_of(longer.lazy(), ["cat", "name"]).collect(engine="in-memory")
        binned = binned.with_columns(text_series(name, self.piece.texts[name][0], binned.get_column(name).to_numpy())
                                     for name in ("cat", "name"))
        return {name: pl.concat([pl.Series(name, column), binned.get_column(name)]) for name, column in columns.items()}


def _by_process(spans: pl.DataFrame) -> list[tuple[tuple[Any, ...], pl.DataFrame]]:
    """(pid, host_key), rows of each process of ``spans``: one process's (the usual)
    as they are, not copied apart."""
    if not spans.height:
        return []
    # In one query: the host key of a trace file's rows is one value, held as such
    # until a column of it is asked for.
    pid, host_key, same = spans.select(
        pl.col("pid").first(), pl.col(HOST_KEY).first(),
        ((pl.col("pid") == pl.col("pid").first()).all()
         & (pl.col(HOST_KEY) == pl.col(HOST_KEY).first()).all()).alias("same"),
    ).row(0)
    if same:
        return [((pid, host_key), spans)]
    return list(spans.partition_by(_KEY, as_dict=True).items())


_KEY_SCHEMA = {"pid": pl.Int64, HOST_KEY: pl.String}
_EXTENT_SCHEMA = {"start": pl.Int64, "end": pl.Int64, "n": pl.Int64}
_EMPTY = {
    "durations": pl.DataFrame(
        schema={**_KEY_SCHEMA, "cat": pl.String, "name": pl.String, **BIN_SCHEMA}
    ),
    "steps": pl.DataFrame(schema={**_KEY_SCHEMA, "epoch": pl.Int64, "step": pl.Int64, "cat": pl.String,
                                  "name": pl.String, **_EXTENT_SCHEMA}),
    "containers": pl.DataFrame(schema={**_KEY_SCHEMA, "name": pl.String, "start": pl.Int64, "end": pl.Int64}),
    "collectives": pl.DataFrame(schema={**_KEY_SCHEMA, "name": pl.String, "group": pl.String, "seq": pl.Int64,
                                        "ts": pl.Int64, "dur": pl.Int64, "done": pl.Boolean}),
    "epochs": pl.DataFrame(schema={**_KEY_SCHEMA, "epoch": pl.Int64, **_EXTENT_SCHEMA}),
    "epoch_spans": pl.DataFrame(schema={**_KEY_SCHEMA, "epoch": pl.Int64, **_EXTENT_SCHEMA}),
    "intervals": pl.DataFrame(schema={**_KEY_SCHEMA, "group": pl.Int8, "start": pl.Int64, "end": pl.Int64}),
    "self_times": pl.DataFrame(schema={**_KEY_SCHEMA, "cat": pl.String, "name": pl.String, "us": pl.Int64}),
    "orphans": pl.DataFrame(schema={**_KEY_SCHEMA, "tid": pl.Int64, "level": pl.Int64, "start": pl.Int64,
                                    "end": pl.Int64}),
    "openers": pl.DataFrame(schema={**_KEY_SCHEMA, "tid": pl.Int64, "level": pl.Int64, "start": pl.Int64,
                                    "end": pl.Int64, "cat": pl.String, "name": pl.String}),
    "extents": pl.DataFrame(schema={**_KEY_SCHEMA, **_EXTENT_SCHEMA, "incomplete": pl.Int64}),
    "overlap": pl.DataFrame(schema={**_KEY_SCHEMA, "mask": pl.Int64, "us": pl.Int64}),
    "modelled": pl.DataFrame(schema={**_KEY_SCHEMA, **{k: v for k, v in STEP_SCHEMA.items() if k != "proc"},
                                     **STEP_TIME_SCHEMA}),
    "blocked": pl.DataFrame(schema={**_KEY_SCHEMA, "start": pl.Int64, "end": pl.Int64}),
    **{kind: pl.DataFrame(schema={**_KEY_SCHEMA, **schema}) for kind, schema in IO_SCHEMAS.items()},
}


def _aggregate_process(spans: pl.DataFrame, key: tuple[Any, ...], with_overlap: bool) -> dict[str, pl.DataFrame]:
    pid, host_key = key
    painting = self_time_intervals(spans)
    intervals = union_intervals(painting.intervals, [])
    masks = mask_times(intervals) if with_overlap else np.zeros(1, dtype=np.int64)
    overlap = pl.DataFrame(
        {"mask": np.flatnonzero(masks), "us": masks[masks > 0]}, schema={"mask": pl.Int64, "us": pl.Int64}
    )
    frame = spans.lazy()
    # An epoch span numbers its epoch as .iter()'s 1-based count, else in args.epoch
    # (sticky args are those in force when a span starts: an epoch's own
    # ai.update(epoch=...) comes after its span began).
    epoch_spans = (
        frame.filter((pl.col("cat") == fmt.CAT_PIPELINE) & pl.col("name").is_in(fmt.EPOCH_NAMES))
        .with_columns(pl.coalesce(pl.col("count") - 1, pl.col("epoch")).alias("epoch"))
        .filter(pl.col("epoch").is_not_null())
        .group_by("epoch")
        .agg(*_extent())
    )
    orphans, openers = nesting_edges(spans, painting)
    # The tables are found in one call, by the engine for data in memory: a data
    # frame's own (the durations' variances are the same to the bit), and streaming
    # costs more than it saves on a piece's few rows.
    queries = {
        "steps": step_rows(frame, []),
        "containers": container_rows(frame, []),
        "collectives": frame.filter((pl.col("cat") == fmt.CAT_COMM) & pl.col("seq").is_not_null()).select(
            pl.col("name").str.strip_suffix(fmt.DONE_SUFFIX), pl.col("group").fill_null(""), "seq", "ts",
            "dur", pl.col("name").str.ends_with(fmt.DONE_SUFFIX).alias("done"),
        ),
        "epochs": frame.filter(pl.col("epoch").is_not_null()).group_by("epoch").agg(*_extent()),
        "epoch_spans": epoch_spans,
        "extents": frame.select(
            *_extent(), pl.col("incomplete").fill_null(False).sum().cast(pl.Int64).alias("incomplete")),
        "self_times": frame.select("cat", "name", pl.Series("us", painting.self_us)).group_by(["cat", "name"])
        .agg(pl.col("us").sum()),
        "orphans": orphans,
        "openers": openers,
        "intervals": intervals.lazy(),
        "overlap": overlap.lazy(),
        "durations": bins_of(frame, ["cat", "name"]),
    }
    keys = [pl.lit(pid, pl.Int64).alias("pid"), pl.lit(host_key, pl.String).alias(HOST_KEY)]
    return dict(zip(queries, pl.collect_all([_as_stored(kind, query.with_columns(*keys))
                                             for kind, query in queries.items()], engine="in-memory")))


def _extent() -> list[pl.Expr]:
    return [
        pl.col("ts").min().alias("start"),
        pl.col("end").max().alias("end"),
        pl.len().cast(pl.Int64).alias("n"),
    ]


def _group_expr() -> pl.Expr:
    expr = pl.when(pl.col("name").str.ends_with(fmt.BLOCK_SUFFIX)).then(None)
    for cat, bit in _GROUP_CATS.items():
        expr = expr.when(pl.col("cat") == cat).then(pl.lit(bit))
    return expr.otherwise(None).cast(pl.Int8)


def self_time_intervals(spans: pl.DataFrame) -> Painting:
    """The painting of ``spans`` (see ``Painting``): the time each thread spent with its
    innermost open span in each activity group, each span's self time (the time it
    was the innermost), and, where the C sweep finds them, its nesting edges; per
    span in the order of ``spans``.

    A collective inside ``backward`` is communication, not compute. Time whose
    innermost span has no group (pipeline spans, loop bodies) belongs to no group,
    but is its span's self time. Spans are nested per thread by ``level`` (depth on
    the track); without levels (DFTracer 2.x files) the nesting is rebuilt from the
    times."""
    return innermost_intervals(spans.select(pl.col("tid").fill_null(0), "ts", "end", "level",
                                            _group_expr().alias("group")))


def nesting_edges(spans: pl.DataFrame, painting: Painting) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """(orphans, openers) of a partition's spans, for self time across partitions:
    orphans (tid, level, start, end) are spans whose enclosing span (one level up,
    same thread: the latest to start at or before it, the longest of those starting
    together) is not among ``spans`` or ends before them; openers (tid, level, start,
    end, cat, name) are the spans that began before every span of their thread here
    ended, the only ones that can enclose an orphan of an earlier partition (a span
    is written when it ends, after everything it encloses). Threads without levels
    have none. Taken from ``painting`` where its sweep found them, else by a query."""
    frame = spans.lazy().select(pl.col("tid").fill_null(0), "level", "ts", "end", "cat", "name")
    edge = ["tid", "level", pl.col("ts").alias("start"), "end"]
    if painting.orphan is not None and painting.opener is not None:
        return (frame.filter(pl.lit(pl.Series(painting.orphan))).select(edge),
                frame.filter(pl.lit(pl.Series(painting.opener))).select(*edge, "cat", "name"))
    frame = frame.filter(pl.col("level").is_not_null().all().over("tid"))
    parents = frame.select("tid", (pl.col("level") + 1).alias("level"), pl.col("ts").alias("_from"),
                           pl.col("end").alias("_to")).sort(["_from", "_to"])
    inner = frame.filter(pl.col("level") > 1).sort("ts")
    orphans = (
        inner.join_asof(parents, left_on="ts", right_on="_from", by=["tid", "level"], check_sortedness=False)
        .filter(pl.col("_to").is_null() | (pl.col("_to") < pl.col("end")))
        .select(edge)
    )
    openers = frame.filter(pl.col("ts") < pl.col("end").min().over("tid")).select(*edge, "cat", "name")
    return orphans, openers


def self_times_of(self_times: pl.DataFrame, orphans: pl.DataFrame, openers: pl.DataFrame,
                  keys: Sequence[str]) -> pl.DataFrame:
    """*keys, cat, name, us: self time per name, exact across partitions: a span
    painted in one partition counted as its own the time of the spans it encloses
    that were written in another (its orphans there), which is taken back here."""
    totals = self_times.group_by([*keys, "cat", "name"]).agg(pl.col("us").sum())
    if not orphans.height or not openers.height:
        return totals
    parents = openers.select(*keys, "tid", (pl.col("level") + 1).alias("level"), pl.col("start").alias("_from"),
                             pl.col("end").alias("_to"), "cat", "name").sort(["_from", "_to"])
    taken = (
        orphans.sort("start")
        .join_asof(parents, left_on="start", right_on="_from", by=[*keys, "tid", "level"], check_sortedness=False)
        .filter(pl.col("_to").is_not_null() & (pl.col("_to") >= pl.col("end")))
        .group_by([*keys, "cat", "name"]).agg((pl.col("end") - pl.col("start")).sum().alias("_taken"))
    )
    return (
        totals.join(taken, on=[*keys, "cat", "name"], how="left")
        # Never below zero: spans of one level that overlap (a malformed file) can
        # take from the wrong one.
        .with_columns(pl.max_horizontal(pl.col("us") - pl.col("_taken").fill_null(0), pl.lit(0)).alias("us"))
        .drop("_taken")
    )


@dataclass
class Combined:
    """All partials merged, keyed by process (an index into ``resolution.processes``)."""

    resolution: Resolution
    files: list[FileReport]
    durations: pl.DataFrame
    #: cat, name, us: each name's self time (the time its spans were the innermost
    #: on their thread), all processes together.
    self_times: pl.DataFrame
    steps: pl.DataFrame
    containers: pl.DataFrame
    collectives: pl.DataFrame
    epochs: pl.DataFrame
    epoch_spans: pl.DataFrame
    extents: pl.DataFrame
    #: proc, mask, us: time each process spent in each combination of active groups.
    overlap: pl.DataFrame
    #: proc, start, end: disjoint compute intervals (self time) of each process
    #: without step times in ``modelled``.
    compute: pl.DataFrame
    #: proc, start, end: disjoint intervals each process (without step times in
    #: ``modelled``) spent blocked in communication with nothing else running (see
    #: ``overlap_and_alone``).
    blocked: pl.DataFrame
    #: path, start, end, command: each input file's time span and the command line
    #: its process info names (to tell files of separate runs apart).
    file_extents: pl.DataFrame
    phases: pl.DataFrame
    partitions: int = 0
    #: proc plus ``_kineto.activity_schema()``: GPU activity, launches and profiler
    #: steps of PyTorch profiler traces (empty for other traces).
    activity: pl.DataFrame | None = None
    #: proc, epoch, step, start, end, n, work, compute_us, blocked_us: steps modelled
    #: where whole files were read (their processes have no rows in ``steps``), each
    #: count and time in the narrowest type that holds every file's values (see
    #: ``_held_narrow``): ``unit_steps`` widens them as it copies them.
    modelled: pl.DataFrame | None = None
    #: The partials' I/O tables (see ``Partial``) keyed by proc; io_totals a row a
    #: (proc, file hash, kind, bucket, small) again.
    io_calls: pl.DataFrame | None = None
    io_totals: pl.DataFrame | None = None
    io_cover: pl.DataFrame | None = None


def combine(partials: Sequence[Partial]) -> Combined:
    """Merge partials exactly, mapping (pid, hhash) of each file to its process."""
    sources = [p.source for p in partials]
    resolution = resolve_parts(sources, [p.keys for p in partials])
    mappings = [_mapping(resolution, p) for p in partials]
    partials = _steps_unmodelled_where_shared(partials, mappings, resolution)

    def collect(kind: str, only: set[int] | None = None) -> pl.DataFrame:
        frames = []
        for partial, mapping in zip(partials, mappings):
            table = getattr(partial, kind)
            if table is None:
                continue
            if mapping.height == 1:
                # The usual partition of one process: every row is that process's (held
                # without its key: without_row_keys), and adding a column shares the
                # others' memory where a join would copy them.
                proc = pl.lit(mapping.item(0, "proc"), pl.Int32).alias("proc")
                frame = table.drop(_KEY, strict=False).with_columns(proc)
            else:
                frame = table.join(mapping, on=_KEY, how="inner").drop(_KEY)
            frames.append(frame if only is None else frame.filter(pl.col("proc").is_in(list(only))))
        if frames:
            # Vertical, each column in the widest type of its frames: files' rank-step
            # tables are held each in its own narrow types (see ``_held_narrow``).
            return pl.concat(frames, how="vertical_relaxed")
        return _EMPTY[kind].drop(_KEY).with_columns(pl.lit(None, pl.Int32).alias("proc"))

    extent = [pl.col("start").min(), pl.col("end").max(), pl.col("n").sum()]
    durations = merged_bins(collect("durations"), ["proc", "cat", "name"])
    self_times = self_times_of(collect("self_times"), collect("orphans"), collect("openers"), ["proc"]).group_by(
        ["cat", "name"]).agg(pl.col("us").sum())
    epochs = collect("epochs").group_by(["proc", "epoch"]).agg(*extent)
    epoch_spans = collect("epoch_spans").group_by(["proc", "epoch"]).agg(*extent)
    pieces = collect("extents")
    extents = pieces.group_by("proc").agg(*extent, pl.col("incomplete").sum())
    # A process read in one piece already has its overlap times; one spread over
    # several partitions (part files, frame ranges) needs its intervals unioned anew.
    counts = pieces.group_by("proc").len()
    split = set(counts.filter(pl.col("len") > 1).get_column("proc").to_list())
    # The steps table has a row per step and name: regroup only processes read in pieces.
    steps = collect("steps")
    if split:
        is_split = pl.col("proc").is_in(list(split))
        steps = pl.concat([
            steps.filter(~is_split),
            steps.filter(is_split).group_by(["proc", "epoch", "step", "cat", "name"]).agg(*extent)
            .select(steps.columns),
        ], how="vertical")
    overlap = collect("overlap").filter(~pl.col("proc").is_in(list(split)))
    intervals = collect("intervals")
    if split:  # a process read in pieces has each group's intervals in several partials
        is_split = pl.col("proc").is_in(list(split))
        merged = union_intervals(intervals.filter(is_split), ["proc"])
        intervals = pl.concat([intervals.filter(~is_split), merged], how="vertical")
    compute_bit = GROUPS.index("compute")
    compute = intervals.filter(pl.col("group") == compute_bit).select("proc", "start", "end")
    # One sweep of each process's intervals: its blocked time, and the overlap times of
    # a process read in pieces (the others' came with their partials). Files read
    # whole found their processes' blocked time as they were read (their intervals
    # here are the compute ones alone).
    swept, alone = overlap_and_alone(intervals, "comm")
    if split:
        overlap = pl.concat([overlap.select("proc", "mask", "us"), swept.filter(pl.col("proc").is_in(list(split)))],
                            how="vertical")
    blocked = pl.concat([alone, collect("blocked").select("proc", "start", "end")], how="vertical")
    phases = (
        pl.concat([p.phases for p in partials], how="vertical").group_by("ph").agg(pl.col("n").sum())
        if partials
        else pl.DataFrame(schema={"ph": pl.String, "n": pl.Int64})
    )
    return Combined(
        resolution=resolution,
        files=file_reports(sources, [p.events for p in partials]),
        durations=durations,
        self_times=self_times,
        steps=steps,
        containers=collect("containers"),
        collectives=collect("collectives"),
        epochs=epochs,
        epoch_spans=epoch_spans,
        extents=extents,
        overlap=overlap.select("proc", "mask", "us"),
        compute=compute,
        blocked=blocked,
        file_extents=_file_extents(partials),
        phases=phases,
        partitions=len(partials),
        activity=activity_by_process(sources, resolution),
        modelled=collect("modelled").select([*STEP_SCHEMA, *STEP_TIME_SCHEMA]),
        io_calls=collect("io_calls"),
        io_totals=regrouped_totals(collect("io_totals"), ["proc"]),
        io_cover=collect("io_cover"),
    )


def _steps_unmodelled_where_shared(partials: Sequence[Partial], mappings: list[pl.DataFrame],
                                   resolution: Resolution) -> list[Partial]:
    """``partials``, those whose steps were modelled for a process that other partials
    also hold events of (its parts in several files, a profiler trace beside it) read
    again with their step rows: a process's steps are modelled from all of its rows."""
    holders: dict[int, int] = {}
    # A process's step times found where it was read (``with_step_times``) are its
    # rank's only while no other process of the rank places steps by its work.
    placing: dict[int, set[int]] = {}
    for partial, mapping in zip(partials, mappings):
        procs = set(mapping.get_column("proc").drop_nulls().to_list())
        for proc in procs:
            holders[proc] = holders.get(proc, 0) + 1
        if partial.steps.height or (partial.modelled is not None and partial.modelled.get_column("work").any()):
            for proc in procs:
                placing.setdefault(resolution.processes[proc].rank, set()).add(proc)
    placing.pop(None, None)
    out = list(partials)
    for i, (partial, mapping) in enumerate(zip(partials, mappings)):
        procs = mapping.get_column("proc").drop_nulls().to_list()
        shared = any(holders.get(proc, 0) > 1 for proc in procs)
        settled = partial.modelled is not None and partial.modelled.get_column("compute_us").is_not_null().any()
        if settled:
            shared |= any(len(placing.get(resolution.processes[proc].rank, ())) > 1 for proc in procs)
        if partial.modelled is not None and shared:
            out[i] = aggregate_partition(partial.source.partition, model=False)
    return out


def _file_extents(partials: Sequence[Partial]) -> pl.DataFrame:
    rows: dict[str, list[Any]] = {}
    for p in partials:
        path = p.source.partition.path
        row = rows.setdefault(path, [path, None, None, ""])
        if p.extents.height:
            start, end = p.extents.get_column("start").min(), p.extents.get_column("end").max()
            row[1] = start if row[1] is None else min(row[1], start)
            row[2] = end if row[2] is None else max(row[2], end)
        for record in p.source.meta:
            if record.get("name") == fmt.META_PROCESS_INFO and isinstance(record.get("args"), dict):
                cmd = record["args"].get("cmdline")
                if cmd and not row[3]:
                    row[3] = " ".join(map(str, cmd)) if isinstance(cmd, list) else str(cmd)
    return pl.DataFrame(
        [r for r in rows.values() if r[1] is not None],
        schema={"path": pl.String, "start": pl.Int64, "end": pl.Int64, "command": pl.String}, orient="row",
    )


def _mapping(resolution: Resolution, partial: Partial) -> pl.DataFrame:
    """(pid, host_key) of one partial -> process index."""
    path = partial.source.partition.path
    return pl.DataFrame(
        {
            "pid": [pid for pid, _ in partial.keys],
            HOST_KEY: [key for _, key in partial.keys],
            "proc": [resolution.process_of(path, pid, key) for pid, key in partial.keys],
        },
        schema={"pid": pl.Int64, HOST_KEY: pl.String, "proc": pl.Int32},
    )


def _overlap_of(intervals: pl.DataFrame) -> pl.DataFrame:
    """pid, host_key, mask, us: the overlap times of each process's disjoint ``intervals``."""
    overlap = [
        pl.DataFrame({"pid": pid, HOST_KEY: host_key, "mask": np.flatnonzero(masks), "us": masks[masks > 0]},
                     schema=_EMPTY["overlap"].schema)
        for (pid, host_key), frame in _by_process(intervals)
        for masks in [mask_times(frame)]
    ]
    return pl.concat(overlap, how="vertical") if overlap else _EMPTY["overlap"]


#: The tables of a partial with a row a name, process or epoch, not a step, span or
#: busy interval: what stays bounded however long a followed file grows.
KEYED_TABLES = ("durations", "self_times", "epochs", "epoch_spans", "extents", "io_totals")


def keyed_only(partial: Partial) -> Partial:
    """``partial`` with its tables of ``KEYED_TABLES`` alone (the others emptied):
    its counts, durations, extents and metadata, without its steps, spans and
    intervals. Such partials fold in a time bounded by their names and processes."""
    for kind in PARTIAL_TABLES:
        if kind not in KEYED_TABLES:
            setattr(partial, kind, _EMPTY[kind])
    partial.modelled = partial.blocked = None
    return partial


def fold_partials(partials: Sequence[Partial], *, overlap: bool = True) -> Partial:
    """One partial holding what ``partials`` hold: consecutive pieces of one file, in
    order (a file followed while it grows). Exact like :func:`combine`: counts add,
    extents widen, busy intervals union again and the overlap times are recomputed
    (left empty without ``overlap``, for a caller that finds them itself).
    ``partials`` are used up: their tables are emptied as they are folded."""
    first, last = partials[0], partials[-1]
    broken: list[tuple[int, str]] = []
    lines = 0
    for p in partials:
        broken.extend((lines + number, reason) for number, reason in p.source.broken)
        lines += p.source.n_lines
    part = first.source.partition
    source = PartitionData(
        Partition(part.path, part.index, part.start, last.source.partition.end),
        first.source.events,
        meta=[record for p in partials for record in p.source.meta],
        n_lines=lines,
        broken=broken[:MAX_BROKEN_KEPT],
        broken_count=sum(p.source.broken_count for p in partials),
        cut_off=last.source.cut_off,
        closed=any(p.source.closed for p in partials),
    )
    keys = list(dict.fromkeys(k for p in partials for k in p.keys))

    def stacked(kind: str) -> pl.DataFrame:
        frame = pl.concat([getattr(p, kind) for p in partials], how="vertical")
        for p in partials:  # let go of the pieces' tables as they are used (see above)
            setattr(p, kind, _EMPTY[kind])
        return frame

    # The busy intervals first: their sweep is the peak of a file, held beside as
    # little as can be.
    intervals = stacked("intervals")
    processes = _by_process(intervals)
    if len(processes) == 1:  # one process (the usual): its intervals unioned by group alone
        (pid, host_key), _ = processes[0]
        intervals = union_intervals(intervals.drop(_KEY), []).with_columns(
            pl.lit(pid, pl.Int64).alias("pid"), pl.lit(host_key, pl.String).alias(HOST_KEY))
    else:
        intervals = union_intervals(intervals, _KEY)
    del processes
    tables = {"intervals": _as_stored("intervals", intervals)}
    del intervals
    tables["overlap"] = _as_stored("overlap", _overlap_of(tables["intervals"])) if overlap else _EMPTY["overlap"]
    extent = [pl.col("start").min(), pl.col("end").max(), pl.col("n").sum()]
    # The regroupings run as one query: polars' default engine for a query streams
    # the groups, several times cheaper than a data frame's own group_by. The step
    # rows (one a step and name, about as many as spans; a whole file's, one a step's
    # work: ``work_merged``) are grouped again only where pieces share steps.
    step_rows_of_each = [p.steps.height for p in partials]
    regrouped = {
        "steps": _steps_of_pieces(stacked("steps"), step_rows_of_each, extent),
        "self_times": stacked("self_times").lazy().group_by([*_KEY, "cat", "name"]).agg(pl.col("us").sum()),
        "epochs": stacked("epochs").lazy().group_by([*_KEY, "epoch"]).agg(*extent),
        "epoch_spans": stacked("epoch_spans").lazy().group_by([*_KEY, "epoch"]).agg(*extent),
        "extents": stacked("extents").lazy().group_by(_KEY).agg(*extent, pl.col("incomplete").sum()),
    }
    tables.update(zip(regrouped, pl.collect_all([_as_stored(kind, frame) for kind, frame in regrouped.items()])))
    del regrouped
    tables["durations"] = _as_stored("durations", merged_bins(stacked("durations"), [*_KEY, "cat", "name"]))
    tables["io_totals"] = _as_stored("io_totals", regrouped_totals(stacked("io_totals"), _KEY))
    for kind in ("orphans", "openers", "containers", "collectives", "io_calls", "io_cover"):
        tables[kind] = _as_stored(kind, stacked(kind))
    phases = pl.concat([p.phases for p in partials], how="vertical").group_by("ph").agg(pl.col("n").sum())
    return Partial(source, keys, phases=phases, **tables)


def _steps_of_pieces(rows: pl.DataFrame, heights: list[int], extent: list[pl.Expr]) -> pl.LazyFrame:
    """The step rows of consecutive pieces (``heights`` rows each, a row a key in
    each) with a row a key. A step's rows are in one piece but for the steps that
    straddle two: only the rows whose (epoch, step) falls within another piece's range
    of them are grouped again (the shared steps and maybe a few more: exact whatever
    the rows' order), not the whole file's rows."""
    keys = [*_KEY, "epoch", "step", "cat", "name"]
    codes = step_codes(rows)
    if codes is None:  # steps too far apart to number with one integer
        return rows.lazy().group_by(keys).agg(*extent)
    code = codes[0]
    ends = np.cumsum(heights)
    pieces = [(end - height, end) for height, end in zip(heights, ends) if height]
    ranges = [(code[a:b].min(), code[a:b].max()) for a, b in pieces]
    shared = np.zeros(code.size, dtype=bool)
    for i, (a, b) in enumerate(pieces):
        for j, (low, high) in enumerate(ranges):
            if j != i:
                shared[a:b] |= (code[a:b] >= low) & (code[a:b] <= high)
    if not shared.any():
        return rows.lazy()
    shared_rows = pl.Series(shared)
    return pl.concat([rows.filter(~shared_rows).lazy(),
                      rows.filter(shared_rows).lazy().group_by(keys).agg(*extent)],
                     how="vertical")


def _as_stored(kind: str, frame: FrameT) -> FrameT:
    """``frame`` with the columns and types of a partial's ``kind`` table."""
    if isinstance(frame, pl.DataFrame) and frame.schema == _EMPTY[kind].schema:
        return frame
    return frame.select(_EMPTY[kind].columns).cast(_EMPTY[kind].schema)
