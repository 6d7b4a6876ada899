"""SQL over trace files: the ``events`` table and the ``spans``, ``steps`` and
``collectives`` views, run by polars' SQL engine.

Each table is a lazy scan: polars tells the scan which columns the query uses (and
its row filter), and only those columns are decoded from the files, through the
same per-partition reader (:func:`read_partition`) the summary runs on threads or
on Dask. ``events`` (and the views over it) hands polars' streaming engine one
partition after another, a few read ahead, so that a query that reduces the rows
(a count, a sum by name, a top ten) holds about what those partitions and its result
need, whatever the size of the trace. Args other than the documented ones become
columns of their own; which exist is learnt from the first events of each file.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import orjson
import polars as pl
from polars.io.plugins import register_io_source

from ... import format as fmt
from ..read.decode import read_partition
from ..runtime.executor import default_executor
from ..read.schema import EVENT_COLUMNS, RAW_FIELDS
from ..read.sources import SQL_PARTITION_BYTES, Partition, PathsLike, expand_paths, first_events_of, plan_partitions
from ..reduce.aggregate import aggregate_partitions
from ..reduce.combine import combine
from ..reduce.index import without_copies
from .steps import steps_of
from .gpu import (GPU_VIEW_SCHEMA, KERNELS_SCHEMA, SPAN_GPU_SCHEMA, USER_SPANS, gpu_answers, gpu_view,
                   kernels_table, span_gpu)
from ..reduce.io_tables import SQL_ARG_COLUMNS as IO_ARG_COLUMNS
from ..reduce.io_tables import SQL_SCHEMA as IO_SCHEMA
from ..reduce.io_tables import sql_rows as io_rows
from ..read.metadata import FileMetadata, Resolution, resolve
from ..read.schema import HOST_KEY
from ..read.partition_data import PartitionData
from ..read.trace import assemble, partition_keys, process_mapping, require_content, run_sources

#: Views over ``events``, with what each row is (shown by ``dftrace sql --help``).
VIEWS = {
    "spans": "complete events (ph 'X') with end = ts + dur, the traced file calls left out (see io)",
    "steps": "one row per step per rank, as the summary has them: rank, unit, epoch, step, ts, end, dur, n_spans",
    "collectives": "communication spans: rank, host, pid, tid, name, group, seq, ts, dur, end, bytes, epoch, step",
    "kernels": "GPU activity of PyTorch profiler traces (kernels, memcpy, memset): rank, host, pid, device, stream, "
               "cat, name, type, ts, end, dur (µs, ns resolution), correlation, launch_name, launch_tid, launch_ts, "
               "queued, counted (by the gpu answers)",
    "gpu": "the summary's GPU answers, one row per rank and device: kernel_us, busy_us, idle_us, compute_us, "
           "non_compute_us, idle_pct, compute_pct, non_compute_pct, comm_compute_overlap_pct, "
           "idle_host_wait_us, idle_kernel_wait_us, idle_other_us (gaps between kernels by cause, summed over streams)",
    "span_gpu": "spans of processes with a PyTorch profiler trace, with the kernels launched inside them (the launch "
                "call started in the span, on its thread): rank, host, pid, tid, cat, name, ts, dur, kernels, kernel_us",
    "io": "traced file calls (cat POSIX and STDIO), one row each: pid, host, rank, tid, ts, dur, name, cat, category "
          "(read, write, metadata, sync, other), path, bytes (moved by a read or write), count (bytes asked), "
          "offset (a word of SQL: quote it, \"offset\"), calls (the calls an aggregated event stands for, else 1), "
          "ret (the call's result, -1 on failure), errno (on failure)",
}

#: Args every event may carry, already columns of ``events`` (``hhash`` names the host).
_KNOWN_ARGS = {source[1] for source in RAW_FIELDS.values() if source[0] == "args"} | {fmt.ARG_HOSTNAME_HASH}

#: The spans of the views: complete events but the traced file calls (the io table's).

_STEP_SCHEMA = {"rank": pl.Int32, "unit": pl.String, "epoch": pl.Int64, "step": pl.Int64, "ts": pl.Int64,
                "end": pl.Int64, "dur": pl.Int64, "n_spans": pl.Int64}


def run_sql(
    query: str,
    paths: PathsLike,
    *,
    executor: Any = None,
    partition_bytes: int = SQL_PARTITION_BYTES,
    progress: bool | None = None,
    allow_file_functions: bool = False,
    broken: list[int] | None = None,
    copies: list[dict[str, str]] | None = None,
) -> pl.DataFrame:
    """Run one SQL ``query`` over the traces at ``paths`` and return its result.

    The tables are ``events`` (the columns of ``EVENT_COLUMNS`` plus one per other
    arg) and the views in :data:`VIEWS`. A query reads only those: polars' table
    functions that read files (``read_csv(...)`` and the like) raise ValueError
    unless ``allow_file_functions``, so a query from someone else cannot print a
    file of this machine. The number of broken lines of the input is appended to
    ``broken`` when given, the files left out as copies of others (as the summary
    leaves them out) to ``copies``. Raises ``polars.exceptions.PolarsError`` for a query
    polars cannot run.
    """
    if not allow_file_functions:
        reject_file_functions(query)
    reject_statements(query)
    tables = TraceTables(paths, executor=executor, partition_bytes=partition_bytes, progress=progress)
    plan = tables.context().execute(query, eager=False)
    stops_early, tables.rows_wanted = _limits(plan)
    engine = "in-memory" if stops_early else "streaming"
    try:
        result = plan.collect(engine=engine)
        if tables.stale:  # a host or rank became known after events it names: read again, all known
            tables.close_reads()
            result = plan.collect(engine=engine)
    finally:
        tables.close_reads()
    if broken is not None:
        broken.append(tables.broken_lines)
    if copies is not None:
        copies.extend(tables.copies)
    return _count_named(query, result)


def query_error_text(exc: Exception) -> str:
    """What was wrong with a query polars could not run, in a line: polars' first
    (the plan dump after it is noise), with the tables a query can read where it
    named another."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if re.search(r"relation '.*' (was )?not found", message):
        message += f"; the tables are events, {', '.join(VIEWS)}"
    return message


#: ``count(*)`` in a query (polars names its column ``len``).
_COUNT_STAR = re.compile(r"\bcount\s*\(\s*\*\s*\)", re.IGNORECASE)


def _count_named(query: str, result: pl.DataFrame) -> pl.DataFrame:
    """The column of an unnamed ``count(*)`` is named ``count(*)``, as SQL engines name
    it (polars says ``len``), unless the query names a ``len`` itself."""
    if "len" in result.columns and "count(*)" not in result.columns and _COUNT_STAR.search(query) \
            and not re.search(r"\blen\b", query, re.IGNORECASE):
        return result.rename({"len": "count(*)"})
    return result


#: What a plan may hold above its one scan of the events without changing which of
#: the scan's rows it needs (projections, computed columns, the scan's own lines).
_ROW_KEEPING = re.compile(r"\s*(simple π|SELECT \[|WITH_COLUMNS:|\[|PROJECT |SELECTION:|ESTIMATED ROWS)")


def _limits(plan: pl.LazyFrame) -> tuple[bool, int | None]:
    """What the query's LIMITs ask of the scans: whether it may stop taking rows before
    they end, and the rows of the events scan it needs at most (None: all).

    A LIMIT polars does not give the scan itself (one over a filter) stops the query
    early. The streaming engine ends a scan then by unwinding the thread that reads it,
    which a Python scan does not survive (the process aborts at exit): such a query
    runs on the in-memory engine, which reads the scans to their end. Where the LIMIT
    is right over the events scan (its filter and projections aside: ``SELECT ... FROM
    spans LIMIT 5``), the scan is given offset + length as the rows it needs, and
    stops there itself."""
    lines = plan.explain().splitlines()
    at = [i for i, line in enumerate(lines) if re.match(r"\s*SLICE\[", line)]
    scans = [i for i, line in enumerate(lines) if "SCAN" in line]
    found = re.search(r"offset: (\d+), len: (\d+)", lines[at[0]]) if len(at) == 1 else None
    right_over = (found is not None and scans == [at[0] + 1]
                  and lines[scans[0]].strip().startswith("PYTHON[events]")
                  and all(_ROW_KEEPING.match(line) for i, line in enumerate(lines) if i not in (at[0], scans[0])))
    return bool(at), int(found.group(1)) + int(found.group(2)) if right_over and found else None


#: polars' SQL table functions, which read files named in the query: any name of the
#: family, called or not (polars also calls ``"read_csv"(...)`` and ``read_csv /* */ (...)``).
_FILE_FUNCTION = re.compile(r"\b((?:read|scan)_[a-z0-9_]+)\b", re.IGNORECASE)
#: What a query says that is not a name: string literals, then comments.
_NOT_NAMES = re.compile(r"'(?:[^']|'')*'|--[^\n]*|/\*[\s\S]*?(?:\*/|\Z)")


class FileFunctionError(ValueError):
    """A query names a table function that reads files (``name``)."""

    def __init__(self, name: str):
        super().__init__(f"the query names {name}(), which reads files: dftrace sql reads only the traces it "
                         "was given (--allow-file-functions allows it)")
        self.name = name


def reject_file_functions(query: str) -> None:
    """Raise :class:`FileFunctionError` when ``query`` names a table function that reads files,
    anywhere outside its string literals and comments: quoted (``"read_csv"``,
    `` `read_csv` ``) or not, called or not. A string that names one
    (``WHERE name = 'read_csv'``) is data, and passes."""
    names = _NOT_NAMES.sub(lambda m: "''" if m.group(0).startswith("'") else " ", query)
    found = _FILE_FUNCTION.search(names)
    if found:
        raise FileFunctionError(found.group(1))


def reject_statements(query: str) -> None:
    """Raise ValueError where ``query`` changes tables (``DROP TABLE``, ``CREATE``,
    ``INSERT`` ...) rather than asks for rows: polars runs some of them, and an empty
    result was printed as if they answered."""
    words = _NOT_NAMES.sub(" ", query).lstrip(" \t\r\n(").split(None, 1)
    if words and words[0].upper() in _CHANGES:
        raise ValueError(f"dftrace sql answers one query (SELECT ..., WITH ... SELECT ..., SHOW TABLES): "
                         f"{words[0]!r} changes tables rather than asks for rows")


#: Statements that change tables.
_CHANGES = ("DROP", "CREATE", "INSERT", "UPDATE", "DELETE", "ALTER", "TRUNCATE", "REPLACE", "MERGE")


class TraceTables:
    """The lazy tables of one set of trace files; loads what queries ask for, once."""

    def __init__(
        self,
        paths: PathsLike,
        *,
        executor: Any = None,
        partition_bytes: int = SQL_PARTITION_BYTES,
        progress: bool | None = None,
    ):
        self._executor = default_executor(executor)
        #: The files left out, holding the same events as another (as the summary does).
        files, self.copies = without_copies(expand_paths(paths), self._executor, progress)
        self._plan = plan_partitions(files, partition_bytes)
        self._progress = progress
        #: Other args as columns: column name -> (key in args, type).
        self.arg_columns = discover_arg_columns(self._plan)
        self.schema: dict[str, pl.DataType] = {
            **EVENT_COLUMNS, **{column: dtype for column, (_, dtype) in self.arg_columns.items()}
        }
        self._lock = threading.Lock()
        self._activity_read: tuple[pl.DataFrame, Resolution] | None = None
        self._io_read: pl.DataFrame | None = None
        #: Every file's metadata resolved, once a read of the events reached the end.
        self._resolution: Resolution | None = None
        #: Broken lines of the input (known once a query read the events).
        self.broken_lines = 0
        #: The columns decoded by each read of the events so far, in order (to check
        #: what a query read).
        self.loads: list[tuple[str, ...]] = []
        #: Set when a read of the events gave rows a host or rank that metadata read
        #: after them changed: the query must run again (see :meth:`events`).
        self.stale = False
        #: The reads of the events a query started (closed by :meth:`close_reads`).
        self.reads: list[_Read] = []
        #: The rows of the events a query needs at most, where its plan says so (a
        #: LIMIT over the filtered scan): a read stops once it gave them.
        self.rows_wanted: int | None = None

    def events(self, columns: Sequence[str], predicate: pl.Expr | None = None,
               read: _Read | None = None) -> Iterator[pl.DataFrame]:
        """The events table's rows with ``columns`` (those matching ``predicate``), one
        partition after another in file order, as the executor reads them a few
        ahead (``imap``): what is held at once is bounded by those partitions.

        ``host`` and ``rank`` come from the processes' metadata: on the first read,
        from what was read up to the partition (where metadata read later changes
        them, a rank recorded after a process's first events, :attr:`stale` is set
        and the caller runs the query again); afterwards, from every file's. A read
        that stops early (a ``LIMIT`` the scan was given) keeps what was read up to
        there; one whose ``read`` is stopped ends at the next partition."""
        try:
            yield from self._events(columns, predicate, read or _Read())
        finally:
            if read is not None:
                read.done.set()

    def _events(self, columns: Sequence[str], predicate: pl.Expr | None, read: _Read) -> Iterator[pl.DataFrame]:
        wanted = set(columns) | (set(predicate.meta.root_names()) if predicate is not None else set())
        out = [c for c in self.schema if c in wanted]
        decoded = [c for c in EVENT_COLUMNS if c in wanted and c not in ("host", "rank")]
        arg_columns = {c: source for c, source in self.arg_columns.items() if c in wanted}
        processes = "host" in wanted or "rank" in wanted
        with self._lock:
            self.loads.append(("pid", *decoded, *arg_columns))
            final = self._resolution
        reader = functools.partial(read_partition, columns=["pid", *decoded], arg_columns=arg_columns)
        files: list[FileMetadata] = []
        held: list[PartitionData] = []  # what each partition held, its events let go
        known, seen = final, set()
        given: dict[tuple[str, int, str], tuple[Any, Any]] = {}  # the host and rank each process got
        rows = 0
        # closed here, whoever holds this read: the executor's threads end with it
        with contextlib.closing(self._executor.imap(reader, self._plan, progress=self._progress,
                                                    desc="loading")) as parts:
            for part in parts:
                if read.stopped:
                    return
                path, keys = part.partition.path, partition_keys(part)
                files.append(FileMetadata(path, part.meta, keys))
                held.append(PartitionData(part.partition, part.events.clear(), part.meta,
                                          broken_count=part.broken_count))
                rows += part.events.height
                if not part.events.height:
                    continue
                frame = part.events.with_columns(pl.col("pid").fill_null(0))
                if processes:
                    new = {(path, *key) for key in keys} - seen
                    if final is None and (new or any(r.get("name") in _NAMES_A_PROCESS for r in part.meta)):
                        known = resolve(files)
                    seen |= new
                    mapping = process_mapping(path, keys, known).drop("_order")
                    for pid, key, host, rank in mapping.iter_rows():
                        given.setdefault((path, pid, key), (host, rank))
                    frame = frame.join(mapping, on=["pid", HOST_KEY], how="left", maintain_order="left")
                frame = frame.select(out)
                yield frame.filter(predicate) if predicate is not None else frame
        if final is None:  # the first read to reach the end: every file's metadata is known
            require_content(held, rows)
            final = resolve(files)
            with self._lock:
                self._resolution, self.broken_lines = final, sum(p.broken_count for p in held)
                self.stale = self.stale or any(
                    got != _host_and_rank(final, *process) for process, got in given.items())

    def close_reads(self) -> None:
        """End the reads of the events the queries started, and wait for them: polars
        hands back a result while a read it stopped taking from (a ``LIMIT`` met) may
        still be running in its thread; such a read stops at its next partition."""
        reads, self.reads = self.reads, []
        for read in reads:
            read.stopped = True
        for read in reads:
            try:
                if read.frames is not None:
                    read.frames.close()  # waiting to be taken from: ends here
            except ValueError:
                pass  # being run by the query's thread: it sees ``stopped``
            read.done.wait(_READ_END_S)

    def context(self) -> pl.SQLContext:
        """A SQL context with ``events`` and the views registered."""
        events = _streamed(self.events, self.schema, "events", self.reads, lambda: self.rows_wanted)
        spans = events.filter(USER_SPANS).with_columns(
            (pl.col("ts") + pl.col("dur")).alias("end")
        )
        bytes_column = pl.col(self._arg("bytes")) if "bytes" in self.arg_columns else pl.lit(None, pl.Int64)
        collectives = spans.filter(pl.col("cat") == fmt.CAT_COMM).select(
            "rank", "host", "pid", "tid", "name", "group", "seq", "ts", "dur", "end",
            bytes_column.cast(pl.Int64, strict=False).alias("bytes"), "epoch", "step",
        )
        steps = _scan(lambda columns: self._steps().select(columns), _STEP_SCHEMA, "steps")
        kernels = _scan(lambda columns: kernels_table(*self._activity()).select(columns), KERNELS_SCHEMA, "kernels")
        gpu = _scan(lambda columns: gpu_view(gpu_answers(*self._activity())).select(columns), GPU_VIEW_SCHEMA, "gpu")
        span_gpu_view = _scan(lambda columns: span_gpu(
            pl.concat(self.events(["rank", "host", "pid", "tid", "cat", "name", "ph", "ts", "dur"], USER_SPANS),
                      how="vertical"), *self._activity()).select(columns), SPAN_GPU_SCHEMA, "span_gpu")
        io = _scan(lambda columns: self._io().select(columns), IO_SCHEMA, "io")
        return pl.SQLContext(frames={"events": events, "spans": spans, "steps": steps, "collectives": collectives,
                                     "kernels": kernels, "gpu": gpu, "span_gpu": span_gpu_view, "io": io})

    def _io(self) -> pl.DataFrame:
        """The io view's rows (read once): the I/O events with their args and paths."""
        with self._lock:
            if self._io_read is None:
                columns = ["pid", "tid", "cat", "name", "ph", "ts", "dur", "count"]
                parts = self._executor.map(functools.partial(read_partition, columns=columns,
                                                             arg_columns=IO_ARG_COLUMNS),
                                           self._plan, progress=self._progress, desc="loading")
                trace = assemble(parts, columns, IO_ARG_COLUMNS)
                self._io_read = io_rows(trace.events, trace.meta)
            return self._io_read

    def _activity(self) -> tuple[pl.DataFrame, Resolution]:
        """GPU activity of the PyTorch profiler traces among the files, with its processes
        (read once, for whichever of kernels, gpu and span_gpu a query uses first)."""
        with self._lock:
            if self._activity_read is None:
                parts = self._executor.map(functools.partial(read_partition, columns=["pid"]), self._plan,
                                           progress=self._progress, desc="loading")
                run = run_sources(parts, [partition_keys(p) for p in parts], [p.events.height for p in parts])
                self._activity_read = (run.activity, run.resolution)
            return self._activity_read

    def _arg(self, key: str) -> str:
        return next(column for column, (k, _) in self.arg_columns.items() if k == key)

    def _steps(self) -> pl.DataFrame:
        """One row per step per rank (or per process without ranks), as the summary has them.

        Computed the summary's way, from per-partition aggregates: a big trace's
        events are never all in memory at once."""
        partials = self._executor.map_stream(aggregate_partitions, self._plan, progress=self._progress,
                                             desc="steps")
        found = steps_of(combine(partials))
        ranks = found.procs.select("unit", "rank").unique("unit")
        return (
            found.by_unit().join(ranks, on="unit", how="left")
            .select("rank", "unit", "epoch", "step", pl.col("start").alias("ts"), "end", "dur",
                    pl.col("n").alias("n_spans"))
            .cast(_STEP_SCHEMA)
        )


#: The metadata records that can give a process its host or rank (what the other
#: records say, the files' names for one, does not change them): a partition with one
#: has the metadata read so far resolved again.
_NAMES_A_PROCESS = {fmt.META_PROCESS_NAME, fmt.META_HOSTNAME_HASH, fmt.META_PROCESS_INFO}


#: How long the end of a query waits for a read it stopped (at most one partition's
#: decoding is left of it).
_READ_END_S = 10.0


class _Read:
    """One read of the events a query started (see :meth:`TraceTables.close_reads`)."""

    def __init__(self) -> None:
        self.frames: Any = None
        self.stopped = False
        self.done = threading.Event()


def _host_and_rank(resolution: Resolution, path: str, pid: int, key: str) -> tuple[Any, Any]:
    process = resolution.processes[resolution.process_of(path, pid, key)]
    return process.host, process.rank


def _streamed(load: Any, schema: dict[str, pl.DataType], name: str, reads: list[Any],
              rows_wanted: Any) -> pl.LazyFrame:
    """A lazy table whose rows come from ``load(columns, predicate)``, an iterator of
    frames, told the columns a query uses and its row filter; it stops once it gave
    the rows polars or ``rows_wanted()`` asks for at most. Each iterator is added to
    ``reads``, to be closed once the query is done: one it stopped taking from (a
    ``LIMIT`` met) stops reading then, not when the interpreter ends."""

    def source(
        with_columns: list[str] | None, predicate: pl.Expr | None, n_rows: int | None, _batch: int | None
    ) -> Iterator[pl.DataFrame]:
        # A query that names no column (count(*)) still needs the rows: read one.
        columns = (with_columns or list(schema)[:1]) if with_columns is not None else list(schema)
        left = min((n for n in (n_rows, rows_wanted()) if n is not None), default=None)
        read = _Read()
        reads.append(read)
        read.frames = frames = load(columns, predicate, read)
        for frame in frames:
            if left is not None:
                frame = frame.head(left)
                left -= frame.height
            yield frame
            if left == 0:
                return

    return register_io_source(source, schema=schema, explain_name=name)


def _scan(load: Any, schema: dict[str, pl.DataType], name: str) -> pl.LazyFrame:
    """A lazy table whose rows come from ``load(columns)``, told the columns a query uses."""

    def source(
        with_columns: list[str] | None, predicate: pl.Expr | None, n_rows: int | None, _batch: int | None
    ) -> Iterator[pl.DataFrame]:
        # A query that names no column (count(*)) still needs the rows: read one.
        frame = load(with_columns or list(schema)[:1] if with_columns is not None else list(schema))
        if predicate is not None:
            frame = frame.filter(predicate)
        if n_rows is not None:
            frame = frame.head(n_rows)
        yield frame

    return register_io_source(source, schema=schema, explain_name=name)


def discover_arg_columns(plan: Sequence[Partition]) -> dict[str, tuple[str, pl.DataType]]:
    """Other args seen in the first events of each file: column -> (key, type).

    A key seen with integers only is Int64, with numbers Float64, with booleans only
    Boolean, anything else String (JSON text for lists and objects). A key that is
    also an event column's name (or ``end``, which ``spans`` adds) becomes ``arg_<key>``.
    """
    seen: dict[str, set[type]] = {}
    firsts = {p.path: p for p in plan if not p.is_parquet and p.index == 0}
    for partition in firsts.values():
        for event in first_events_of(partition):
            args = event.get("args")
            if not isinstance(args, dict) or fmt.normalize_phase(event.get("ph")) == fmt.PH_METADATA:
                continue
            for key, value in args.items():
                if key not in _KNOWN_ARGS and value is not None:
                    seen.setdefault(key, set()).add(type(value))
    for partition in plan:
        if partition.is_parquet:
            for key, kinds in _parquet_arg_types(partition.path).items():
                seen.setdefault(key, set()).update(kinds)
    columns: dict[str, tuple[str, pl.DataType]] = {}
    for key in sorted(seen):
        kinds = seen[key]
        if kinds == {int}:
            dtype: pl.DataType = pl.Int64()
        elif kinds <= {int, float}:
            dtype = pl.Float64()
        elif kinds == {bool}:
            dtype = pl.Boolean()
        else:
            dtype = pl.String()
        columns[f"arg_{key}" if key in EVENT_COLUMNS or key == "end" else key] = (key, dtype)
    return columns


def _parquet_arg_types(path: str) -> dict[str, set[type]]:
    args = pl.read_parquet(path, columns=["args"], n_rows=10_000).get_column("args").drop_nulls()
    seen: dict[str, set[type]] = {}
    for text in args.to_list():
        for key, value in orjson.loads(text).items():
            if key not in _KNOWN_ARGS and value is not None:
                seen.setdefault(key, set()).add(type(value))
    return seen


# --- output ------------------------------------------------------------------------

#: Output formats of ``-o FILE`` by suffix.
OUTPUT_SUFFIXES = (".parquet", ".csv", ".json")


def check_output(path: str) -> None:
    """Raise ValueError for an output file whose suffix names no format."""
    if not path.endswith(OUTPUT_SUFFIXES):
        raise ValueError(f"-o {path!r}: the suffix picks the format, one of {', '.join(OUTPUT_SUFFIXES)}")


def write_result(result: pl.DataFrame, path: str) -> None:
    """Write a query's result to ``path`` as Parquet, CSV or JSON (by suffix)."""
    check_output(path)
    if path.endswith(".parquet"):
        result.write_parquet(path)
    elif path.endswith(".csv"):
        result.write_csv(path)
    else:
        with open(path, "wb") as fh:
            fh.write(result_json(result))


def result_json(result: pl.DataFrame) -> bytes:
    """The rows as a JSON array of objects."""
    return orjson.dumps(result.to_dicts(), option=orjson.OPT_INDENT_2) + b"\n"


def result_table(result: pl.DataFrame, max_rows: int) -> str:
    """The rows as a Markdown-style table for a terminal, at most ``max_rows`` of them."""
    shown = result.head(max_rows) if max_rows >= 0 else result
    with pl.Config(
        tbl_rows=-1, tbl_cols=-1, tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True,
        tbl_formatting="ASCII_MARKDOWN", tbl_width_chars=1000, fmt_str_lengths=80, tbl_cell_numeric_alignment="RIGHT",
        thousands_separator=False,
    ):
        text = str(shown) + "\n"
    if shown.height < result.height:
        text += f"({result.height - shown.height} more rows: --rows, --csv or -o FILE for all)\n"
    return text

