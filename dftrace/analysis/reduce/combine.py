"""Partials of a whole run combined exactly: each file's process keys mapped to the
run's processes, and every table merged by its rule (CONTRIBUTING.md, "Partials and
how they combine"), steps settled where a file was read re-read where another file
holds the same process."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from ... import format as fmt
from .busy import GROUPS, mask_rows, overlap_and_alone, proc_intervals, swept_pieces, union_intervals
from .io_tables import regrouped_totals
from ..read.metadata import Resolution
from ..read.schema import HOST_KEY
from .sketch import merged_bins
from .step_numbers import regrouped_step_rows
from .steps import STEP_SCHEMA, STEP_TIME_SCHEMA, processes_enclosed_by_merged_work
from ..read.trace import FileReport, run_sources

from .aggregate import aggregate_partition, self_times_of
from .partial import EMPTY_TABLES, ROW_KEY, Partial, by_proc


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


def numbered_as_their_events(spans: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """Epoch spans (proc, epoch, start, end, n) numbered as the events inside them carry
    ``args.epoch`` (``events``: their extents per epoch): each span by the epoch whose
    first event is the first to begin inside it (of epochs whose first events begin
    together, the one most events carry: the span's own number is one of them). A
    loop over ``range(5, 8)`` holds epochs 5 to 7, not ``.iter()``'s count 0 to 2, and
    a ``with`` epoch span's own sticky epoch is the one before (so are its first
    fetch's: an epoch's first event is never early). Spans in which no epoch begins keep their number; those with none
    (numbered by minus their start as they were read) are left out."""
    if not spans.height or not events.height:
        return spans.filter(pl.col("epoch") >= 0)
    numbered = spans.with_row_index("_span")
    best = (numbered.join(events.select("proc", pl.col("epoch").alias("_epoch"), pl.col("start").alias("_from"),
                                        pl.col("n").alias("_n")), on="proc", how="inner")
            .filter((pl.col("_from") >= pl.col("start")) & (pl.col("_from") < pl.col("end")))
            .sort(["_span", "_from", "_n", "_epoch"], descending=[False, False, True, False])
            .unique("_span", keep="first", maintain_order=True)
            .select("_span", "_epoch"))
    if not best.height:
        return spans.filter(pl.col("epoch") >= 0)
    return (numbered.join(best, on="_span", how="left").with_columns(pl.coalesce("_epoch", "epoch").alias("epoch"))
            .filter(pl.col("epoch") >= 0)
            .group_by(["proc", "epoch"]).agg(pl.col("start").min(), pl.col("end").max(), pl.col("n").sum())
            .select(spans.columns).cast(spans.schema))


def combine(partials: Sequence[Partial]) -> Combined:
    """Merge partials exactly, mapping (pid, hhash) of each file to its process."""
    run = run_sources([p.source for p in partials], [p.keys for p in partials], [p.events for p in partials])
    resolution = run.resolution
    mappings = [_mapping(resolution, p) for p in partials]
    partials = _steps_unmodelled_where_shared(partials, mappings, resolution)
    partials = _io_cover_read_where_placed(partials, mappings, resolution)

    def each(kind: str) -> list[pl.DataFrame]:
        """Each partial's ``kind`` table keyed by proc."""
        return [by_proc(getattr(partial, kind), mapping) for partial, mapping in zip(partials, mappings)
                if getattr(partial, kind) is not None]

    def collect(kind: str, frames: list[pl.DataFrame] | None = None) -> pl.DataFrame:
        frames = each(kind) if frames is None else frames
        if frames:
            # Vertical, each column in the widest type of its frames: files' rank-step
            # tables are held each in its own narrow types (see ``_held_narrow``).
            return pl.concat(frames, how="vertical_relaxed")
        return EMPTY_TABLES[kind].drop(ROW_KEY).with_columns(pl.lit(None, pl.Int32).alias("proc"))

    extent = [pl.col("start").min(), pl.col("end").max(), pl.col("n").sum()]
    durations = merged_bins(collect("durations"), ["proc", "cat", "name"])
    self_times = self_times_of(collect("self_times"), collect("orphans"), collect("openers"), ["proc"]).group_by(
        ["cat", "name"]).agg(pl.col("us").sum())
    epochs = collect("epochs").group_by(["proc", "epoch"]).agg(*extent)
    epoch_spans = numbered_as_their_events(collect("epoch_spans").group_by(["proc", "epoch"]).agg(*extent), epochs)
    pieces = collect("extents")
    extents = pieces.group_by("proc").agg(*extent, pl.col("incomplete").sum())
    # A process read in one piece already has its overlap times; one spread over
    # several partitions (part files, frame ranges) needs its intervals unioned anew.
    counts = pieces.group_by("proc").len()
    split = set(counts.filter(pl.col("len") > 1).get_column("proc").to_list())
    # The steps table has a row per step and name (a step's work one row, in the parts
    # of a file): regroup only processes read in pieces.
    step_frames = each("steps")
    steps = collect("steps", step_frames)
    if split:  # only the steps whose rows are in several partials are grouped again
        steps = regrouped_step_rows(steps, [frame.height for frame in step_frames], ["proc"]).collect()
    del step_frames
    enclosed = {key[0] for key in processes_enclosed_by_merged_work(steps, ["proc"])}
    if enclosed:
        # Rare: a span that carries a step encloses others, in a file read in parts.
        del steps
        return combine(_steps_unmerged(partials, mappings, enclosed))
    overlap = collect("overlap").filter(~pl.col("proc").is_in(list(split))).select("proc", "mask", "us")
    interval_frames = each("intervals")
    from_pieces = _swept_from_pieces(interval_frames, split)
    if from_pieces:
        swept_procs = set(from_pieces)
        split -= swept_procs
        interval_frames = [_rows_of(frame, swept_procs, keep=False) for frame in interval_frames]
    intervals = collect("intervals", interval_frames)
    del interval_frames
    if split:  # those left by the sweep from pieces (no C kernels, too many runs): a union first
        is_split = pl.col("proc").is_in(list(split))
        merged = union_intervals(intervals.filter(is_split), ["proc"])
        intervals = pl.concat([intervals.filter(~is_split), merged], how="vertical")
    compute_bit = GROUPS.index("compute")
    compute = pl.concat([intervals.filter(pl.col("group") == compute_bit).select("proc", "start", "end"),
                         *(rows for _, _, rows in from_pieces.values())], how="vertical")
    # One sweep of each process's intervals: its blocked time, and the overlap times of
    # a process read in pieces (the others' came with their partials). Files read
    # whole found their processes' blocked time as they were read (their intervals
    # here are the compute ones alone).
    swept, alone = overlap_and_alone(intervals, "comm")
    del intervals
    overlap = pl.concat([overlap, swept.filter(pl.col("proc").is_in(list(split))),
                         *(rows for rows, _, _ in from_pieces.values())], how="vertical")
    blocked = pl.concat([alone, *(rows for _, rows, _ in from_pieces.values()),
                         collect("blocked").select("proc", "start", "end")], how="vertical")
    del from_pieces
    phases = (
        pl.concat([p.phases for p in partials], how="vertical").group_by("ph").agg(pl.col("n").sum())
        if partials
        else pl.DataFrame(schema={"ph": pl.String, "n": pl.Int64})
    )
    return Combined(
        resolution=resolution,
        files=run.files,
        durations=durations,
        self_times=self_times,
        steps=steps,
        containers=collect("containers"),
        collectives=collect("collectives"),
        epochs=epochs,
        epoch_spans=epoch_spans,
        extents=extents,
        overlap=overlap,
        compute=compute,
        blocked=blocked,
        file_extents=_file_extents(partials),
        phases=phases,
        partitions=len(partials),
        activity=run.activity,
        modelled=collect("modelled").select([*STEP_SCHEMA, *STEP_TIME_SCHEMA]),
        io_calls=collect("io_calls"),
        io_totals=regrouped_totals(collect("io_totals"), ["proc"]),
        io_cover=collect("io_cover"),
    )


def _swept_from_pieces(frames: list[pl.DataFrame], procs: set[int]
                       ) -> dict[int, tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]]:
    """For each of ``procs`` (processes read in pieces: each group's intervals in
    several of the partials' ``frames``), its overlap times (proc, mask, us), blocked
    time and compute intervals (proc, start, end), swept from the pieces' intervals
    as they are (``swept_pieces``), without a table of them all and its union; a
    process the sweep leaves is not in the result."""
    found = {}
    for proc in sorted(procs):
        swept = swept_pieces([_rows_of(frame, {proc}) for frame in frames], "comm", "compute")
        if swept is not None:
            totals, alone_starts, alone_ends, compute_starts, compute_ends = swept
            found[proc] = (mask_rows(proc, totals), proc_intervals(proc, alone_starts, alone_ends),
                           proc_intervals(proc, compute_starts, compute_ends))
    return found


def _rows_of(frame: pl.DataFrame, procs: set[int], keep: bool = True) -> pl.DataFrame:
    """The rows of ``frame`` (a ``proc`` column) of ``procs`` (with ``keep``, else those
    of the other processes): the frame itself, not a copy, where it holds one process's."""
    column = frame.get_column("proc")
    if frame.height and not column.null_count() and column.min() == column.max():
        return frame if (column[0] in procs) == keep else frame.clear()
    return frame.filter(pl.col("proc").is_in(list(procs)) == keep)


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
        procs = _procs(mapping)
        for proc in procs:
            holders[proc] = holders.get(proc, 0) + 1
        if partial.steps.height or (partial.modelled is not None and partial.modelled.get_column("work").any()):
            for proc in procs:
                placing.setdefault(resolution.processes[proc].rank, set()).add(proc)
    placing.pop(None, None)

    def shared(partial: Partial, procs: set[int]) -> bool:
        if partial.modelled is None:
            return False
        settled = partial.modelled.get_column("compute_us").is_not_null().any()
        return any(holders.get(proc, 0) > 1 or (settled and len(placing.get(resolution.processes[proc].rank, ())) > 1)
                   for proc in procs)

    return _read_again(partials, mappings, shared)


def _procs(mapping: pl.DataFrame) -> set[int]:
    """The processes of a partial's ``mapping`` (see ``_mapping``)."""
    return set(mapping.get_column("proc").drop_nulls().to_list())


def _read_again(partials: Sequence[Partial], mappings: list[pl.DataFrame],
                needed: Callable[[Partial, set[int]], bool]) -> list[Partial]:
    """``partials``, each that ``needed`` says of (given the partial and its processes)
    read again with its raw step rows and every table (``model=False``)."""
    return [aggregate_partition(partial.source.partition, model=False) if needed(partial, _procs(mapping))
            else partial for partial, mapping in zip(partials, mappings)]


def _io_cover_read_where_placed(partials: Sequence[Partial], mappings: list[pl.DataFrame],
                                resolution: Resolution) -> list[Partial]:
    """``partials``, those that left their I/O cover out (no file calls in them) read
    again with it where other partials hold file calls of the same processes, or of
    the helpers working for them: a call is placed in the busy time of its thread,
    which may be in another partition, and a DataLoader worker's in the compute of
    the process it works for, which may make no file call at all."""
    calling: set[int] = set()
    for partial, mapping in zip(partials, mappings):
        if partial.io_calls is not None and partial.io_calls.height:
            calling.update(by_proc(partial.io_calls, mapping).get_column("proc").unique().to_list())
    owners = resolution.owners()
    calling.update(owners[proc] for proc in list(calling) if proc in owners)
    return _read_again(partials, mappings, lambda partial, procs: partial.io_cover is None and bool(calling & procs))


def _steps_unmerged(partials: Sequence[Partial], mappings: list[pl.DataFrame], procs: set[int]) -> list[Partial]:
    """``partials``, those whose step rows have a step's work merged into one row
    (``work_merged``: the parts of a file) for one of ``procs`` read again with a row a
    name: there such a row, with the rows of the process's other parts, holds the
    starts of two or more work rows (``merged_work_encloses``). A whole file was looked
    at where it was read."""
    return _read_again(partials, mappings, lambda partial, own: bool(
        partial.steps.height and partial.steps.get_column("name").null_count() and procs & own))


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
