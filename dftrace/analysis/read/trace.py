"""Loading trace files into a :class:`TraceTable`: the events table plus resolved metadata."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import polars as pl

from .decode import read_partition
from .partition_data import PartitionData
from ..runtime.executor import default_executor
from .kineto import activity_schema
from .metadata import FileMetadata, Resolution, resolve, resolved_records
from .schema import EVENT_COLUMNS, HOST_KEY, SUMMARY_COLUMNS
from .sources import DEFAULT_PARTITION_BYTES, Partition, PathsLike, plan_paths


# Key of the JSON document stored in a Parquet file's key-value metadata.


@dataclass
class FileReport:
    """How reading one input file went."""

    path: str
    partitions: int = 0
    lines: int = 0
    events: int = 0
    #: Lines that are not an event (cut-off, not JSON, ...), all counted.
    broken_count: int = 0
    #: ``(line number, reason)`` of the first broken lines of each partition. Line
    #: numbers count from the top of the decompressed file.
    broken: list[tuple[int, str]] = field(default_factory=list)
    #: Why decoding stopped early (a crash-cut zstd frame / gzip member), if it did.
    cut_off: str | None = None
    #: Whether the file ends with the ``]`` of a clean finalize.
    closed: bool = False


@dataclass
class TraceTable:
    """A loaded trace: one events table and the metadata resolved across its files.

    ``events`` follows ``EVENT_COLUMNS`` (see docs/analysis.md); ``processes`` has
    one row per (host, pid) in rank order; ``threads`` names threads and asyncio
    task tracks; ``meta`` keeps every metadata record (args as JSON text) so
    conversions lose nothing; ``files`` says what was read and what was broken.
    """

    events: pl.DataFrame
    processes: pl.DataFrame
    threads: pl.DataFrame
    meta: pl.DataFrame
    files: list[FileReport]
    #: GPU activity, launches and profiler steps of PyTorch profiler traces at
    #: nanosecond resolution (``dftrace.analysis.read.kineto.activity_schema()`` plus
    #: ``file``, ``host`` and ``rank``); None when no file is one.
    activity: pl.DataFrame | None = None

    @property
    def broken_lines(self) -> int:
        """Lines of all files that could not be read as events."""
        return sum(f.broken_count for f in self.files)

    def partition_data(self, arg_columns: dict[str, tuple[str, pl.DataType]]) -> PartitionData:
        """The trace as one partition, the columns a file's reading gives the reduction:
        ``arg_columns`` maps a column to the args key it is read from and its type."""
        events = self.events.select(
            *[pl.col(c) if c in self.events.columns else pl.lit(None, EVENT_COLUMNS[c]).alias(c)
              for c in SUMMARY_COLUMNS],
            pl.col("host").fill_null("").alias(HOST_KEY),
            *[_arg_of(self.events, column, key, dtype) for column, (key, dtype) in arg_columns.items()],
        )
        meta = resolved_records(self.processes.iter_rows(named=True), self.meta.iter_rows(named=True))
        activity = None
        if self.activity is not None:
            activity = self.activity.select(*activity_schema(), "file", pl.col("host").fill_null("").alias(HOST_KEY))
        return PartitionData(Partition("<memory>"), events, meta=meta, activity=activity)

    def __repr__(self) -> str:
        return (
            f"TraceTable({self.events.height} events, {self.processes.height} processes, "
            f"{len(self.files)} files, {self.broken_lines} broken lines)"
        )


def _arg_of(events: pl.DataFrame, column: str, key: str, dtype: pl.DataType) -> pl.Expr:
    """Column ``column`` of a loaded trace: as loaded, else read from its args text."""
    if column in events.columns:
        return pl.col(column).cast(dtype, strict=False)
    if "args" in events.columns:
        return pl.col("args").str.json_path_match(f"$.{key}").cast(dtype, strict=False).alias(column)
    return pl.lit(None, dtype).alias(column)


def load_traces(
    paths: PathsLike,
    *,
    columns: Sequence[str] | None = None,
    executor: Any = None,
    partition_bytes: int = DEFAULT_PARTITION_BYTES,
    progress: bool | None = None,
    arg_columns: dict[str, tuple[str, pl.DataType]] | None = None,
) -> TraceTable:
    """Load trace files, directories or glob patterns into one :class:`TraceTable`.

    Reads dftrace's ``.pfw``/``.pfw.gz``/``.pfw.zst`` (finalized or cut off by a
    crash), DFTracer 1.x/2.x files, Chrome JSON written by ``dftrace convert`` or
    ``merge``, and Parquet written by ``dftrace convert``. Broken lines are counted
    in ``TraceTable.files``, never raised. ``columns`` limits the event columns decoded
    (``pid``, ``host`` and ``rank`` are always present). ``executor`` is an
    :class:`EmbeddedExecutor` (default) or :class:`DaskExecutor`. ``progress``
    shows a bar (default: only when stderr is a terminal). ``arg_columns`` adds
    columns from other args: column name -> (key in ``args``, polars type).
    """
    wanted = _with_pid(columns)
    plan = plan_paths(paths, partition_bytes)
    parts = default_executor(executor).map(
        functools.partial(read_partition, columns=wanted, arg_columns=arg_columns), plan,
        progress=progress, desc="loading",
    )
    return assemble(parts, wanted, arg_columns)


def require_content(parts: Sequence[PartitionData], events: int | None = None) -> None:
    """Raise ValueError (one line) when no partition holds an event or a metadata
    record: every input is empty or garbage, which is an error, not an empty trace.
    ``events`` is how many events the partitions held, when their tables are gone."""
    if any(p.meta for p in parts) or (events if events is not None else any(p.events.height for p in parts)):
        return
    if not parts:
        raise ValueError("no trace files given (an empty list of paths, or a pattern that matched nothing)")
    broken: dict[str, int] = {}
    for p in parts:
        broken[p.partition.path] = broken.get(p.partition.path, 0) + p.broken_count
    detail = "; ".join(f"{os.path.basename(path)}: " + (f"{n} broken line{'s' if n != 1 else ''}" if n else "empty")
                       for path, n in list(broken.items())[:5])
    more = f"; {len(broken) - 5} more" if len(broken) > 5 else ""
    raise ValueError(f"no trace events in {len(broken)} file{'s' if len(broken) != 1 else ''} ({detail}{more})")


def _with_pid(columns: Sequence[str] | None) -> list[str] | None:
    if columns is None:
        return None
    return list(dict.fromkeys(["pid", *columns]))


def partition_keys(part: PartitionData) -> list[tuple[int, str]]:
    """The (pid, host_key) pairs a partition's events carry."""
    events = part.events
    if not events.height:
        return []
    pid, key = pl.col("pid").fill_null(0), pl.col(HOST_KEY)
    first = events.select(pid.first(), key.first()).row(0)
    # Usually every event of a partition has the same pair: check that cheaply
    # before hashing strings.
    if events.select((pid == first[0]).all() & (key == first[1]).all()).item():
        return [(int(first[0]), str(first[1]))]
    keys = events.select(pid, key).unique()
    return [(int(p), str(k)) for p, k in keys.iter_rows()]


def resolve_parts(parts: Sequence[PartitionData], keys: Sequence[list[tuple[int, str]]]) -> Resolution:
    """Resolve the metadata of all partitions together; ``keys``: each partition's
    (pid, host key) pairs."""
    return resolve(FileMetadata(p.partition.path, p.meta, k) for p, k in zip(parts, keys))


def activity_by_process(sources: Sequence[Any], resolution: Resolution) -> pl.DataFrame:
    """The activity tables of all partitions, each row given its process index ``proc``
    and the ``file`` it came from (one profiling window)."""
    frames = []
    for source in sources:
        activity = getattr(source, "activity", None)
        if activity is None or not activity.height:
            continue
        keys = activity.select("pid", HOST_KEY).unique()
        mapping = pl.DataFrame(
            {"pid": keys.get_column("pid"), HOST_KEY: keys.get_column(HOST_KEY),
             "proc": [resolution.process_of(source.partition.path, pid, key) for pid, key in keys.iter_rows()]},
            schema={"pid": pl.Int64, HOST_KEY: pl.String, "proc": pl.Int32},
        )
        if "file" not in activity.columns:
            activity = activity.with_columns(pl.lit(source.partition.path, pl.String).alias("file"))
        frames.append(activity.join(mapping, on=["pid", HOST_KEY], how="left").drop(HOST_KEY))
    if not frames:
        return pl.DataFrame(schema={**activity_schema(), "file": pl.String, "proc": pl.Int32})
    return pl.concat(frames, how="vertical")


def with_processes(activity: pl.DataFrame, resolution: Resolution) -> pl.DataFrame:
    """Activity by process index (``proc``) with each process's ``host`` and ``rank``."""
    procs = pl.DataFrame(
        {"proc": range(len(resolution.processes)), "host": [p.host for p in resolution.processes],
         "rank": [p.rank for p in resolution.processes]},
        schema={"proc": pl.Int32, "host": pl.String, "rank": pl.Int32},
    )
    return activity.join(procs, on="proc", how="left")


@dataclass
class RunSources:
    """A run's partitions read together: whose process each (file, pid, host key) is,
    what each file held, and the profilers' GPU activity by process index."""

    resolution: Resolution
    files: list[FileReport]
    #: ``activity_by_process``: empty when no partition is a profiler trace.
    activity: pl.DataFrame


def run_sources(parts: Sequence[PartitionData], keys: Sequence[list[tuple[int, str]]],
                events: Sequence[int]) -> RunSources:
    """The metadata of all partitions resolved together, and what follows from it;
    ``keys``: each partition's (pid, host key) pairs, ``events``: its event count."""
    resolution = resolve_parts(parts, keys)
    return RunSources(resolution, file_reports(parts, events), activity_by_process(parts, resolution))


def file_reports(parts: Sequence[PartitionData], events: Sequence[int]) -> list[FileReport]:
    """Per-file reports, numbering broken lines from the top of each file."""
    reports: dict[str, FileReport] = {}
    offsets: dict[str, int] = {}
    for part, n_events in sorted(
        zip(parts, events), key=lambda pe: (pe[0].partition.path, pe[0].partition.index)
    ):
        path = part.partition.path
        report = reports.setdefault(path, FileReport(path))
        offset = offsets.get(path, 0)
        report.partitions += 1
        report.lines += part.n_lines
        report.events += n_events
        report.broken_count += part.broken_count
        report.broken.extend((offset + number, reason) for number, reason in part.broken)
        report.cut_off = report.cut_off or part.cut_off
        report.closed = report.closed or part.closed
        offsets[path] = offset + part.n_lines
    return list(reports.values())


def assemble(
    parts: Sequence[PartitionData],
    columns: Sequence[str] | None = None,
    arg_columns: dict[str, tuple[str, pl.DataType]] | None = None,
) -> TraceTable:
    """Combine partitions into a :class:`TraceTable`, resolving hosts and ranks."""
    require_content(parts)
    keys = [partition_keys(p) for p in parts]
    run = run_sources(parts, keys, [p.events.height for p in parts])
    resolution = run.resolution
    frames = []
    for part, part_keys in zip(parts, keys):
        if not part.events.height:
            continue
        mapping = process_mapping(part.partition.path, part_keys, resolution).drop("_order")
        events = part.events.with_columns(pl.col("pid").fill_null(0))
        frames.append(
            events.join(mapping, on=["pid", HOST_KEY], how="left", maintain_order="left").drop(HOST_KEY)
        )
    order = [c for c in EVENT_COLUMNS if columns is None or c in columns or c in ("host", "rank")]
    schema = {c: EVENT_COLUMNS[c] for c in order}
    for column, (_, dtype) in (arg_columns or {}).items():
        order.append(column)
        schema[column] = dtype
    events = (
        pl.concat([f.select(order) for f in frames], how="vertical")
        if frames
        else pl.DataFrame(schema=schema)
    )
    return TraceTable(
        events=events,
        processes=processes_frame(resolution),
        threads=threads_frame(resolution),
        meta=meta_frame(resolution),
        files=run.files,
        activity=None if all(p.activity is None for p in parts) else with_processes(run.activity, resolution).drop("proc"),
    )


def process_mapping(path: str, keys: Sequence[tuple[int, str]], resolution: Resolution) -> pl.DataFrame:
    """pid, host_key -> host, rank and ``_order`` (the process's index in
    ``resolution.processes``) for the events of one partition of ``path``."""
    index = [resolution.process_of(path, pid, key) for pid, key in keys]
    procs = resolution.processes
    return pl.DataFrame(
        {
            "pid": [pid for pid, _ in keys],
            HOST_KEY: [key for _, key in keys],
            "host": [procs[i].host for i in index],
            "rank": [procs[i].rank for i in index],
            "_order": index,
        },
        schema={"pid": pl.Int64, HOST_KEY: pl.String, "host": pl.String, "rank": pl.Int32, "_order": pl.Int64},
    )


#: Columns of ``TraceTable.processes``: a resolved process's attributes of those
#: names, its ``info`` and ``custom`` dicts as JSON text.
_PROCESS_SCHEMA = {"host": pl.String, "pid": pl.Int64, "rank": pl.Int32, "name": pl.String, "label": pl.String,
                   "wall_ns": pl.Int64, "mono_ns": pl.Int64, "dropped": pl.Int64, "files": pl.List(pl.String),
                   "info": pl.String, "custom": pl.String}


def processes_frame(resolution: Resolution) -> pl.DataFrame:
    """One row per process, in rank order."""
    rows = []
    for p in resolution.processes:
        row = {column: getattr(p, column) for column in _PROCESS_SCHEMA}
        rows.append({**row, "info": orjson.dumps(p.info).decode(), "custom": orjson.dumps(p.custom).decode()})
    return pl.DataFrame(rows, schema=_PROCESS_SCHEMA)


def threads_frame(resolution: Resolution) -> pl.DataFrame:
    procs = resolution.processes
    rows = [
        {"host": procs[i].host, "pid": procs[i].pid, "tid": tid, "name": name}
        for (i, tid), name in sorted(resolution.threads.items())
    ]
    return pl.DataFrame(rows, schema={"host": pl.String, "pid": pl.Int64, "tid": pl.Int64, "name": pl.String})


def meta_frame(resolution: Resolution) -> pl.DataFrame:
    procs = resolution.processes
    rows = [
        {
            "host": procs[i].host,
            "pid": procs[i].pid,
            "tid": record.get("tid") if isinstance(record.get("tid"), int) else None,
            "name": record["name"],
            "cat": record.get("cat") if isinstance(record.get("cat"), str) else None,
            "args": orjson.dumps(record["args"], default=str).decode(),
        }
        for i, record in resolution.records
    ]
    return pl.DataFrame(rows, schema=META_SCHEMA)


#: Columns of ``TraceTable.meta``: every metadata record, args as JSON text.
META_SCHEMA = {"host": pl.String, "pid": pl.Int64, "tid": pl.Int64, "name": pl.String, "cat": pl.String,
               "args": pl.String}


