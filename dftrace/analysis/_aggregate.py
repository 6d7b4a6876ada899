"""Per-partition partial aggregates that combine exactly into whole-trace ones.

A partition's events are reduced to small tables: counts of each duration per
(process, category, name) (exact percentiles come from these), step and epoch
extents, the union of busy intervals per activity group and the process extents.
Counts and sums add, minima and maxima take the extreme, interval unions union
again: combining partials in any grouping gives the same result as aggregating
all events at once. Workers ship only these tables, never the events.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from .. import format as fmt
from ._decode import PartitionData, read_partition
from ._metadata import Resolution
from ._schema import HOST_KEY, SUMMARY_COLUMNS
from ._sources import Partition
from ._trace import FileReport, file_reports, partition_keys, resolve_parts

#: Activity groups of the time breakdown, in bit order. ``.block`` spans (the loop
#: body of ``.iter()``) are containers, not activity, and are left out.
GROUPS = ("compute", "data", "comm", "checkpoint", "device")
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


@dataclass
class Partial:
    """The aggregates of one partition (or several, once combined)."""

    #: Read report of the partition, with its metadata records.
    source: PartitionData
    keys: list[tuple[int, str]]
    #: pid, host_key, cat, name, dur, n: how many complete events had each duration.
    durations: pl.DataFrame
    #: pid, host_key, epoch, step, start, end, n
    steps: pl.DataFrame
    #: pid, host_key, epoch, start, end, n
    epochs: pl.DataFrame
    #: pid, host_key, group, start, end: disjoint busy intervals per group
    intervals: pl.DataFrame
    #: pid, host_key, start, end, n, incomplete
    extents: pl.DataFrame
    #: ph, n: events of every phase (counters, instants, ...)
    phases: pl.DataFrame


def summarize_partition(partition: Partition) -> Partial:
    """Read one partition and reduce it to a :class:`Partial` (runs on workers)."""
    return aggregate(read_partition(partition, SUMMARY_COLUMNS))


def aggregate(data: PartitionData) -> Partial:
    """Reduce a partition's events to a :class:`Partial`."""
    events = data.events
    keys = partition_keys(data)
    source = PartitionData(
        data.partition,
        events.clear(),
        meta=data.meta,
        n_lines=data.n_lines,
        broken=data.broken,
        broken_count=data.broken_count,
        cut_off=data.cut_off,
        closed=data.closed,
    )
    phases = events.group_by("ph").agg(pl.len().cast(pl.Int64).alias("n"))
    spans = events.filter(
        (pl.col("ph") == fmt.PH_COMPLETE)
        & pl.col("dur").is_not_null()
        & pl.col("ts").is_not_null()
        & ~pl.col("cat").is_in(TRACER_CATS)
    ).with_columns(pl.col("pid").fill_null(0), (pl.col("ts") + pl.col("dur")).alias("end"))
    durations = spans.group_by([*_KEY, "cat", "name", "dur"]).agg(pl.len().cast(pl.Int64).alias("n"))
    steps = (
        spans.filter(pl.col("step").is_not_null())
        .group_by([*_KEY, "epoch", "step"])
        .agg(*_extent())
    )
    epochs = spans.filter(pl.col("epoch").is_not_null()).group_by([*_KEY, "epoch"]).agg(*_extent())
    extents = spans.group_by(_KEY).agg(
        *_extent(), pl.col("incomplete").fill_null(False).sum().cast(pl.Int64).alias("incomplete")
    )
    busy = spans.with_columns(_group_expr().alias("group")).filter(pl.col("group").is_not_null())
    intervals = union_intervals(busy.select(*_KEY, "group", pl.col("ts").alias("start"), "end"), _KEY)
    return Partial(source, keys, durations, steps, epochs, intervals, extents, phases)


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


def union_intervals(frame: pl.DataFrame, keys: Sequence[str]) -> pl.DataFrame:
    """Merge overlapping or touching [start, end] intervals within each (keys, group)."""
    by = [*keys, "group"]
    if not frame.height:
        return frame
    ordered = frame.sort([*by, "start"])
    prev_end = pl.col("end").cum_max().shift(1).over(by)
    runs = ordered.with_columns(
        (prev_end.is_null() | (pl.col("start") > prev_end)).cum_sum().alias("run")
    )
    return (
        runs.group_by([*by, "run"], maintain_order=True)
        .agg(pl.col("start").min(), pl.col("end").max())
        .drop("run")
    )


@dataclass
class Combined:
    """All partials merged, keyed by process (an index into ``resolution.processes``)."""

    resolution: Resolution
    files: list[FileReport]
    durations: pl.DataFrame
    steps: pl.DataFrame
    epochs: pl.DataFrame
    intervals: pl.DataFrame
    extents: pl.DataFrame
    phases: pl.DataFrame
    partitions: int = 0


def combine(partials: Sequence[Partial]) -> Combined:
    """Merge partials exactly, mapping (pid, hhash) of each file to its process."""
    sources = [p.source for p in partials]
    resolution = resolve_parts(sources, [p.keys for p in partials])

    def collect(kind: str) -> pl.DataFrame:
        frames = []
        for partial in partials:
            frame = getattr(partial, kind)
            if not frame.height:
                continue
            path = partial.source.partition.path
            mapping = pl.DataFrame(
                {
                    "pid": [pid for pid, _ in partial.keys],
                    HOST_KEY: [key for _, key in partial.keys],
                    "proc": [resolution.process_of(path, pid, key) for pid, key in partial.keys],
                },
                schema={"pid": pl.Int64, HOST_KEY: pl.String, "proc": pl.Int32},
            )
            frames.append(frame.join(mapping, on=_KEY, how="left").drop(_KEY))
        if frames:
            return pl.concat(frames, how="vertical")
        empty = getattr(partials[0], kind) if partials else pl.DataFrame()
        return empty.drop(_KEY, strict=False).with_columns(pl.lit(None, pl.Int32).alias("proc"))

    extent = [pl.col("start").min(), pl.col("end").max(), pl.col("n").sum()]
    durations = collect("durations").group_by(["proc", "cat", "name", "dur"]).agg(pl.col("n").sum())
    steps = collect("steps").group_by(["proc", "epoch", "step"]).agg(*extent)
    epochs = collect("epochs").group_by(["proc", "epoch"]).agg(*extent)
    extents = collect("extents").group_by("proc").agg(*extent, pl.col("incomplete").sum())
    intervals = union_intervals(collect("intervals"), ["proc"])
    phases = (
        pl.concat([p.phases for p in partials], how="vertical").group_by("ph").agg(pl.col("n").sum())
        if partials
        else pl.DataFrame(schema={"ph": pl.String, "n": pl.Int64})
    )
    return Combined(
        resolution=resolution,
        files=file_reports(sources, [int(p.phases.get_column("n").sum()) for p in partials]),
        durations=durations,
        steps=steps,
        epochs=epochs,
        intervals=intervals,
        extents=extents,
        phases=phases,
        partitions=len(partials),
    )
