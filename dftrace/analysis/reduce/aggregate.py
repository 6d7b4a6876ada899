"""Per-partition partial aggregates that combine exactly into whole-trace ones.

A partition's events are reduced to small tables: a sketch of the durations per
(process, category, name) (counts, totals, extremes exact; percentiles within a
stated relative error, see ``reduce.sketch``), the extents of
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
from typing import Any

import numpy as np
import polars as pl

from ... import format as fmt
from .busy import GROUPS, Painting, innermost_intervals, mask_times, overlap_and_alone, union_intervals
from ..read.decode import iter_partition_pieces, read_ahead
from ..read.partition_data import MAX_BROKEN_KEPT, PartitionData
from .io_tables import ARG_COLUMNS as IO_ARG_COLUMNS
from .io_tables import IO_CATS, cover_table, io_tables, regrouped_totals
from ..read.schema import HOST_KEY, SUMMARY_COLUMNS, loop_body
from .sketch import bins_of, merged_bins
from ..read.sources import Partition
from .step_numbers import epoch_span_keys, regrouped_step_rows
from .steps import (STEP_TIME_SCHEMA, container_rows, merged_work_encloses, model_steps, settled_procs, step_rows,
                    with_step_times, without_profiler_steps, work_merged)
from ..read.trace import TraceTable, partition_keys
from .partial import (EMPTY_TABLES, GROUP_CATS, IO_TABLES, PARTIAL_TABLES, ROW_KEY, TRACER_CATS, Partial, as_stored, by_proc,
                      compacted)
from .scanned import aggregate_scanned



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
    step rows become its processes' steps (``Partial.modelled``), and those of a part of
    a file have each step's work in one row (``_merges_work``), unless ``model`` is
    false: a few rows per step rather than one per step and name."""
    stream = read_ahead(_each_partitions_pieces(partitions))
    finishing: list[Future[Partial]] = []  # the partition before, being finished
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="dftrace-finish") as finisher:
            for first in stream:  # a partition's first piece: it has one at least
                partition = first[0]
                pieces = _until_partition_end(first, stream)
                del first
                stack = _pieces_folded(pieces, work_per_step=_merges_work(partition, model))
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


def _merges_work(partition: Partition, model: bool) -> bool:
    """Whether the step rows of ``partition``'s pieces have each step's work merged into
    one row (``work_merged``): those of every file of lines unless ``model`` is false.
    Where the file is whole, its steps are modelled where it is read (``_finished``
    reads it again if a merged row encloses other steps); where it is a part of one,
    ``combine`` looks at the rows of all of its parts."""
    return model and not partition.is_parquet


def _settles(partition: Partition, model: bool) -> bool:
    """Whether ``partition``'s steps are modelled where it is read: a whole file of
    lines (see ``Partial.modelled``)."""
    return model and partition.start == 0 and partition.end is None and not partition.is_parquet


def _finished(partition: Partition, stack: list[tuple[int, Partial]], model: bool) -> Partial:
    """The partial of ``partition`` from its pieces' (``_pieces_folded``; the list is
    emptied): folded into one, its steps modelled where the whole file was read, and,
    with ``model``, without an I/O cover where it holds no file calls."""
    settle = _settles(partition, model)
    partial = _folded(stack, settle)
    if settle and merged_work_encloses(partial.steps, ROW_KEY):
        # A step's work merged into one row holds other steps: the file is read again
        # with a row a name (rare: a span that carries a step and encloses others).
        partial = _folded(_pieces_folded(_summary_pieces(partition, inflate_ahead=True), work_per_step=False),
                          settle)
    if settle:
        partial = _settled_where_read(partial)
    if model and (partial.io_calls is None or not partial.io_calls.height):
        # No file calls: the busy time of its threads, which calls are placed in, is
        # left out (``combine`` reads it again where other partitions hold calls of its
        # processes). A trace without I/O held it for every thread and piece.
        partial.io_cover = None
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
    keys = [c for c in (*ROW_KEY, "cat") if c in partial.durations.columns]
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
    keys = partial.extents.select(ROW_KEY).unique(maintain_order=True).with_row_index("proc").with_columns(
        pl.col("proc").cast(pl.Int32))
    rows = without_profiler_steps(by_proc(partial.steps, keys))
    partial.steps = EMPTY_TABLES["steps"]  # each table is let go once it is used: they are the peak of a file
    steps = model_steps(rows, by_proc(partial.containers, keys))
    del rows
    intervals = by_proc(partial.intervals, keys)
    partial.intervals = EMPTY_TABLES["intervals"]
    compute_bit = GROUPS.index("compute")
    compute = intervals.filter(pl.col("group") == compute_bit).drop("group")
    overlap, blocked = overlap_and_alone(intervals, "comm")
    partial.overlap = as_stored("overlap", _by_key(overlap, keys))
    del intervals, overlap
    # A process whose steps are placed by its work keeps the time of its intervals in
    # each step, not the intervals (see ``with_step_times``).
    steps = with_step_times(steps, compute, blocked)
    settled = settled_procs(steps)
    partial.modelled = _held_narrow(as_stored("modelled", _by_key(steps, keys)), _NARROW_MODELLED)
    del steps
    if settled:
        unsettled = ~pl.col("proc").is_in(settled)
        blocked, compute = blocked.filter(unsettled), compute.filter(unsettled)
    partial.blocked = as_stored("blocked", _by_key(blocked, keys))
    partial.intervals = as_stored("intervals", _by_key(compute, keys).with_columns(
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


def _by_key(frame: pl.DataFrame, keys: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with the key columns of its proc (see ``by_proc``)."""
    if keys.height == 1:
        return frame.with_columns(pl.lit(keys.item(0, "pid"), pl.Int64).alias("pid"),
                                  pl.lit(keys.item(0, HOST_KEY), pl.String).alias(HOST_KEY))
    return frame.join(keys, on="proc")


#: Partials of pieces folded into one at a time.
_FOLD = 8
#: Decoded text reduced at a time by the summary: what a partition costs in memory
#: while it is read, whatever its size.
SUMMARY_PIECE_BYTES = 6 << 20


def aggregate_loaded(trace: TraceTable) -> Partial:
    """A loaded trace reduced as one partition, with the columns a file's reading gives."""
    return aggregate(trace.partition_data(IO_ARG_COLUMNS))


def aggregate(data: PartitionData, *, overlap: bool = True, work_per_step: bool = False) -> Partial:
    """Reduce a partition's events to a :class:`Partial` (its ``overlap`` table empty
    without ``overlap``: for a piece that is folded with others); with
    ``work_per_step``, its step rows have each step's work in one row (see
    ``work_merged``)."""
    if data.scanned is not None:
        partial = aggregate_scanned(data, data.scanned, overlap, work_per_step)
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
        kind: pl.concat([p[kind] for p in pieces], how="vertical") if pieces else EMPTY_TABLES[kind]
        for kind in PARTIAL_TABLES if kind not in IO_TABLES
    }
    tables.update(_io_of_table(events, spans))
    if work_per_step:
        tables["steps"] = work_merged(tables["steps"], ROW_KEY)
    return Partial(source, partition_keys(data), phases=phases, **tables)


def _io_of_table(events: pl.DataFrame, spans: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """The I/O tables of a partition's events (see ``reduce.io_tables``)."""
    missing = [pl.lit(None, dtype).alias(column) for column, (_, dtype) in IO_ARG_COLUMNS.items()
               if column not in events.columns]
    calls = events.filter((pl.col("ph") == fmt.PH_COMPLETE) & pl.col("dur").is_not_null() & pl.col("ts").is_not_null()
                          & pl.col("cat").is_in(IO_CATS)).with_columns(*missing, pl.col("pid").fill_null(0))
    io_calls, io_totals = io_tables(calls, ROW_KEY)
    cover = spans.select(*ROW_KEY, pl.col("tid").fill_null(0), _group_expr().alias("group"), pl.col("ts").alias("start"),
                         "end")
    return {"io_calls": as_stored("io_calls", io_calls), "io_totals": as_stored("io_totals", io_totals),
            "io_cover": as_stored("io_cover", cover_table(cover, ROW_KEY))}


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
    return list(spans.partition_by(ROW_KEY, as_dict=True).items())


def _aggregate_process(spans: pl.DataFrame, key: tuple[Any, ...], with_overlap: bool) -> dict[str, pl.DataFrame]:
    pid, host_key = key
    painting = self_time_intervals(spans)
    intervals = union_intervals(painting.intervals, [])
    masks = mask_times(intervals) if with_overlap else np.zeros(1, dtype=np.int64)
    overlap = pl.DataFrame(
        {"mask": np.flatnonzero(masks), "us": masks[masks > 0]}, schema={"mask": pl.Int64, "us": pl.Int64}
    )
    frame = spans.lazy()
    # Epoch spans numbered as read (``step_numbers.epoch_span_keys``); the events
    # inside renumber them (``combine.numbered_as_their_events``).
    epochs = spans.filter((pl.col("cat") == fmt.CAT_PIPELINE) & pl.col("name").is_in(fmt.EPOCH_NAMES))
    count, epoch = epochs.get_column("count"), epochs.get_column("epoch")
    keys = epoch_span_keys(epochs.get_column("ts").to_numpy(), count.fill_null(0).to_numpy(),
                           count.is_not_null().to_numpy(), epoch.fill_null(0).to_numpy(),
                           epoch.is_not_null().to_numpy())
    epoch_spans = epochs.lazy().with_columns(pl.Series("epoch", keys, dtype=pl.Int64)).group_by("epoch").agg(*_extent())
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
    return dict(zip(queries, pl.collect_all([as_stored(kind, query.with_columns(*keys))
                                             for kind, query in queries.items()], engine="in-memory")))


def _extent() -> list[pl.Expr]:
    return [
        pl.col("ts").min().alias("start"),
        pl.col("end").max().alias("end"),
        pl.len().cast(pl.Int64).alias("n"),
    ]


def _group_expr() -> pl.Expr:
    expr = pl.when(loop_body(pl.col("name"))).then(None)
    for cat, bit in GROUP_CATS.items():
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


def _overlap_of(intervals: pl.DataFrame) -> pl.DataFrame:
    """pid, host_key, mask, us: the overlap times of each process's disjoint ``intervals``."""
    overlap = [
        pl.DataFrame({"pid": pid, HOST_KEY: host_key, "mask": np.flatnonzero(masks), "us": masks[masks > 0]},
                     schema=EMPTY_TABLES["overlap"].schema)
        for (pid, host_key), frame in _by_process(intervals)
        for masks in [mask_times(frame)]
    ]
    return pl.concat(overlap, how="vertical") if overlap else EMPTY_TABLES["overlap"]


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
            setattr(p, kind, EMPTY_TABLES[kind])
        return frame

    # The busy intervals first: their sweep is the peak of a file, held beside as
    # little as can be.
    intervals = stacked("intervals")
    processes = _by_process(intervals)
    if len(processes) == 1:  # one process (the usual): its intervals unioned by group alone
        (pid, host_key), _ = processes[0]
        intervals = union_intervals(intervals.drop(ROW_KEY), []).with_columns(
            pl.lit(pid, pl.Int64).alias("pid"), pl.lit(host_key, pl.String).alias(HOST_KEY))
    else:
        intervals = union_intervals(intervals, ROW_KEY)
    del processes
    tables = {"intervals": as_stored("intervals", intervals)}
    del intervals
    tables["overlap"] = as_stored("overlap", _overlap_of(tables["intervals"])) if overlap else EMPTY_TABLES["overlap"]
    extent = [pl.col("start").min(), pl.col("end").max(), pl.col("n").sum()]
    # The regroupings run as one query: polars' default engine for a query streams
    # the groups, several times cheaper than a data frame's own group_by. The step
    # rows (one a step and name, about as many as spans; a whole file's, one a step's
    # work: ``work_merged``) are grouped again only where pieces share steps.
    step_rows_of_each = [p.steps.height for p in partials]
    regrouped = {
        "steps": regrouped_step_rows(stacked("steps"), step_rows_of_each, ROW_KEY),
        "self_times": stacked("self_times").lazy().group_by([*ROW_KEY, "cat", "name"]).agg(pl.col("us").sum()),
        "epochs": stacked("epochs").lazy().group_by([*ROW_KEY, "epoch"]).agg(*extent),
        "epoch_spans": stacked("epoch_spans").lazy().group_by([*ROW_KEY, "epoch"]).agg(*extent),
        "extents": stacked("extents").lazy().group_by(ROW_KEY).agg(*extent, pl.col("incomplete").sum()),
    }
    tables.update(zip(regrouped, pl.collect_all([as_stored(kind, frame) for kind, frame in regrouped.items()])))
    del regrouped
    tables["durations"] = as_stored("durations", merged_bins(stacked("durations"), [*ROW_KEY, "cat", "name"]))
    tables["io_totals"] = as_stored("io_totals", regrouped_totals(stacked("io_totals"), ROW_KEY))
    for kind in ("orphans", "openers", "containers", "collectives", "io_calls", "io_cover"):
        tables[kind] = as_stored(kind, stacked(kind))
    phases = pl.concat([p.phases for p in partials], how="vertical").group_by("ph").agg(pl.col("n").sum())
    return Partial(source, keys, phases=phases, **tables)


