"""A partition's partial aggregates: the tables of a :class:`Partial`, each declared
once here with its columns (``EMPTY_TABLES``), and the forms a partial is held and
shipped in. How they are filled is ``aggregate``'s (and ``scanned``'s); how they
combine is ``combine``'s (CONTRIBUTING.md, "Partials and how they combine")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from ... import format as fmt
from ..read.partition_data import PartitionData
from .io_tables import SCHEMAS as IO_SCHEMAS
from ..read.schema import HOST_KEY, FrameT
from .sketch import BIN_SCHEMA
from .steps import STEP_SCHEMA, STEP_TIME_SCHEMA


#: The breakdown's group of each category of the vocabulary, in its spelling and in
#: capitals (DFTracer programs name theirs so: ``dft_fn("COMPUTE")``).
GROUP_CATS = {
    spelling: group
    for cat, group in ((fmt.CAT_COMPUTE, 0), (fmt.CAT_DATA, 1), (fmt.CAT_DATALOADER, 1), (fmt.CAT_COMM, 2),
                       (fmt.CAT_CHECKPOINT, 3), (fmt.CAT_DEVICE, 4))
    for spelling in (cat, cat.upper())
}


#: The tracers' own bookkeeping events, left out of every statistic.
TRACER_CATS = (fmt.CAT_TRACER, fmt.CAT_DFTRACER)


ROW_KEY = ["pid", HOST_KEY]


@dataclass
class Partial:
    """The aggregates of one partition."""

    #: Read report of the partition, with its metadata records (no events).
    source: PartitionData
    keys: list[tuple[int, str]]
    #: pid, host_key, cat, name, bin, n, total, lo, hi, m2: the durations of the
    #: complete events of each name as a mergeable sketch (see ``reduce.sketch``).
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
    #: totals per file and kind, and the spans they are placed in (see ``reduce.io_tables``).
    #: ``io_cover`` is None where a partition without calls left it out (``combine``
    #: reads it again where another partial holds calls of its processes).
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


PARTIAL_TABLES = ("durations", "steps", "containers", "collectives", "epochs", "epoch_spans", "intervals",
           "self_times", "orphans", "openers", "extents", "overlap", "io_calls", "io_totals", "io_cover")


#: The I/O tables among them: found apart from the spans' (see ``reduce.io_tables``).
IO_TABLES = ("io_calls", "io_totals", "io_cover")


def compacted(partial: Partial) -> Partial:
    """``partial`` with each table in one chunk of exactly its size: the partials of
    every partition are held until they are combined, so the spare capacity and
    chunk lists the reduction left behind would be held with them."""
    for kind in PARTIAL_TABLES:
        if getattr(partial, kind) is not None:
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
                setattr(partial, kind, table.drop(ROW_KEY))
    return partial


def by_proc(table: pl.DataFrame, keys: pl.DataFrame) -> pl.DataFrame:
    """``table`` with the proc of ``keys`` (pid, host_key, proc) in place of its key
    columns, which it may have let go (``without_row_keys``). One process's rows take a
    constant column, which shares the others' memory where a join would copy them."""
    if keys.height == 1:
        return table.drop(ROW_KEY, strict=False).with_columns(pl.lit(keys.item(0, "proc"), pl.Int32).alias("proc"))
    return table.join(keys, on=ROW_KEY, how="inner").drop(ROW_KEY)


def stored_table(kind: str, pid: int, columns: dict[str, Any]) -> pl.DataFrame:
    """The ``kind`` table of one process's ``columns`` (Series, arrays or lists), in
    the columns and types of a partial's ``kind`` table."""
    height = len(next(iter(columns.values())))
    host_key = pl.Series(HOST_KEY, [""], dtype=pl.String)
    series = [pl.Series("pid", np.full(height, pid, dtype=np.int64)),
              host_key.new_from_index(0, height) if height else host_key.clear()]
    for name, dtype in EMPTY_TABLES[kind].schema.items():
        if name in ROW_KEY:
            continue
        column = columns[name]
        column = column.alias(name) if isinstance(column, pl.Series) else pl.Series(name, column)
        series.append(column if column.dtype == dtype else column.cast(dtype))
    return pl.DataFrame(series)


KEY_SCHEMA = {"pid": pl.Int64, HOST_KEY: pl.String}


EXTENT_SCHEMA = {"start": pl.Int64, "end": pl.Int64, "n": pl.Int64}


EMPTY_TABLES = {
    "durations": pl.DataFrame(
        schema={**KEY_SCHEMA, "cat": pl.String, "name": pl.String, **BIN_SCHEMA}
    ),
    "steps": pl.DataFrame(schema={**KEY_SCHEMA, "epoch": pl.Int64, "step": pl.Int64, "cat": pl.String,
                                  "name": pl.String, **EXTENT_SCHEMA}),
    "containers": pl.DataFrame(schema={**KEY_SCHEMA, "name": pl.String, "start": pl.Int64, "end": pl.Int64,
                                       "after_work": pl.Boolean}),
    "collectives": pl.DataFrame(schema={**KEY_SCHEMA, "name": pl.String, "group": pl.String, "seq": pl.Int64,
                                        "ts": pl.Int64, "dur": pl.Int64, "done": pl.Boolean}),
    "epochs": pl.DataFrame(schema={**KEY_SCHEMA, "epoch": pl.Int64, **EXTENT_SCHEMA}),
    "epoch_spans": pl.DataFrame(schema={**KEY_SCHEMA, "epoch": pl.Int64, **EXTENT_SCHEMA}),
    "intervals": pl.DataFrame(schema={**KEY_SCHEMA, "group": pl.Int8, "start": pl.Int64, "end": pl.Int64}),
    "self_times": pl.DataFrame(schema={**KEY_SCHEMA, "cat": pl.String, "name": pl.String, "us": pl.Int64}),
    "orphans": pl.DataFrame(schema={**KEY_SCHEMA, "tid": pl.Int64, "level": pl.Int64, "start": pl.Int64,
                                    "end": pl.Int64}),
    "openers": pl.DataFrame(schema={**KEY_SCHEMA, "tid": pl.Int64, "level": pl.Int64, "start": pl.Int64,
                                    "end": pl.Int64, "cat": pl.String, "name": pl.String}),
    "extents": pl.DataFrame(schema={**KEY_SCHEMA, **EXTENT_SCHEMA, "incomplete": pl.Int64}),
    "overlap": pl.DataFrame(schema={**KEY_SCHEMA, "mask": pl.Int64, "us": pl.Int64}),
    "modelled": pl.DataFrame(schema={**KEY_SCHEMA, **{k: v for k, v in STEP_SCHEMA.items() if k != "proc"},
                                     **STEP_TIME_SCHEMA}),
    "blocked": pl.DataFrame(schema={**KEY_SCHEMA, "start": pl.Int64, "end": pl.Int64}),
    **{kind: pl.DataFrame(schema={**KEY_SCHEMA, **schema}) for kind, schema in IO_SCHEMAS.items()},
}


#: The tables of a partial with a row a name, process or epoch, not a step, span or
#: busy interval: what stays bounded however long a followed file grows.
KEYED_TABLES = ("durations", "self_times", "epochs", "epoch_spans", "extents", "io_totals")


def keyed_only(partial: Partial) -> Partial:
    """``partial`` with its tables of ``KEYED_TABLES`` alone (the others emptied):
    its counts, durations, extents and metadata, without its steps, spans and
    intervals. Such partials fold in a time bounded by their names and processes."""
    for kind in PARTIAL_TABLES:
        if kind not in KEYED_TABLES:
            setattr(partial, kind, EMPTY_TABLES[kind])
    partial.modelled = partial.blocked = None
    return partial


def as_stored(kind: str, frame: FrameT) -> FrameT:
    """``frame`` with the columns and types of a partial's ``kind`` table."""
    if isinstance(frame, pl.DataFrame) and frame.schema == EMPTY_TABLES[kind].schema:
        return frame
    return frame.select(EMPTY_TABLES[kind].columns).cast(EMPTY_TABLES[kind].schema)
