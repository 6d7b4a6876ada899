"""Writing a :class:`TraceTable` out (Chrome JSON, pfw for DFAnalyzer, Parquet) and merging.

:func:`merge` is a pure transform from one TraceTable to another: unique pids, process
names and sort order by rank, per-host clock alignment and filters. The writers
turn any TraceTable into a file.
"""

from __future__ import annotations

import contextlib
import gzip
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import IO, Any

import orjson
import polars as pl

from ... import format as fmt
from ..reduce.steps import container_rows, model_steps, step_rows
from ..read.parquet import write_parquet
from ..read.trace import TraceTable

# Events encoded per batch: bounds memory while writing big traces.
_BATCH = 50_000
# Bytes of lines written at a time, at most about.
_WRITE_BYTES = 4 << 20
# Output columns in the order Chrome-trace readers expect them.
_EVENT_KEYS = ("id", "name", "cat", "pid", "tid", "ts", "dur", "ph")
# Args rebuilt from columns when the trace was loaded without the ``args`` column.
_ARG_COLUMNS = {
    "level": fmt.ARG_LEVEL,
    "parent_id": fmt.ARG_PARENT,
    "epoch": fmt.ARG_EPOCH,
    "step": fmt.ARG_STEP,
    "count": fmt.ARG_COUNT,
    "incomplete": fmt.ARG_INCOMPLETE,
}
#: Output formats, by the suffix of the output file.
FORMATS = {
    ".json": "chrome", ".json.gz": "chrome", ".pfw": "pfw", ".pfw.gz": "pfw", ".pfw.zst": "pfw", ".parquet": "parquet",
}


def output_format(path: str | os.PathLike[str]) -> str:
    """The output format a file name asks for (see :data:`FORMATS`)."""
    name = os.fspath(path)
    for suffix in sorted(FORMATS, key=len, reverse=True):
        if name.endswith(suffix):
            return FORMATS[suffix]
    raise ValueError(f"cannot tell the output format of {name!r}; use one of {', '.join(FORMATS)}")


def write_trace(trace: TraceTable, path: str | os.PathLike[str]) -> None:
    """Write ``trace`` in the format its file name asks for.

    ``.json`` / ``.json.gz``: strict Chrome JSON (one array, one event per line),
    which chrome://tracing, Perfetto and ``json.load`` open. ``.pfw`` / ``.pfw.gz`` /
    ``.pfw.zst``: dftrace's own line layout, which DFAnalyzer and dftrace read. ``.parquet``: the events table.
    """
    kind = output_format(path)
    if kind == "parquet":
        write_parquet(trace, path)
        return
    with _open_lines(path, kind) as (write, separator):
        write(_meta_lines(trace, _first_times(trace.events)))
        write(_event_lines(trace.events, separator))


@contextlib.contextmanager
def _open_lines(path: str | os.PathLike[str],
                kind: str) -> Iterator[tuple[Callable[[Iterable[bytes]], None], bytes]]:
    """A function that writes lines to ``path`` (``.gz``/``.zst`` compressed by its
    name) between the opening ``[`` and the closing ``]``, in batches (an item may be
    several lines joined already), and the separator of its lines."""
    name = os.fspath(path)
    separator = b",\n" if kind == "chrome" else b"\n"
    with contextlib.ExitStack() as stack:
        if name.endswith(".zst"):
            import zstandard

            raw = stack.enter_context(open(path, "wb"))
            fh: IO[bytes] = stack.enter_context(zstandard.ZstdCompressor().stream_writer(raw))
        else:
            fh = stack.enter_context((gzip.open if name.endswith(".gz") else open)(path, "wb"))
        fh.write(b"[\n")
        written = [False]

        def write(lines: Iterable[bytes]) -> None:
            batch: list[bytes] = []
            size = 0
            for line in lines:
                batch.append(line)
                size += len(line)
                if len(batch) == _BATCH or size >= _WRITE_BYTES:
                    fh.write((separator if written[0] else b"") + separator.join(batch))
                    batch, size, written[0] = [], 0, True
            if batch:
                fh.write((separator if written[0] else b"") + separator.join(batch))
                written[0] = True

        yield write, separator
        fh.write(b"\n]\n")


def _meta_lines(trace: TraceTable, first_ts: dict[int, int]) -> Iterator[bytes]:
    """Metadata first (Perfetto recognises JSON by a leading object).

    Every record has a ``ts``: metadata takes its process's first event time
    (``first_ts``, by pid; the trace's first, for a process without events), as
    strict readers expect."""
    default_ts = min(first_ts.values(), default=0)
    for row in trace.meta.iter_rows(named=True):
        event: dict[str, Any] = {"name": row["name"]}
        if row["cat"] is not None:
            event["cat"] = row["cat"]
        event.update(pid=row["pid"], tid=row["tid"] if row["tid"] is not None else row["pid"],
                     ts=first_ts.get(row["pid"], default_ts), ph="M")
        event["args"] = orjson.Fragment(row["args"])
        yield orjson.dumps(event)
    for pid, args in _identity_records(trace):
        yield orjson.dumps({"name": fmt.META_PROCESS_INFO, "cat": fmt.CAT_TRACER, "pid": pid, "tid": pid,
                            "ts": first_ts.get(pid, default_ts), "ph": "M", "args": args})


def _first_times(events: pl.DataFrame) -> dict[int, int]:
    """pid -> the time of its first event."""
    if "ts" not in events.columns or not events.height:
        return {}
    firsts = events.group_by("pid").agg(pl.col("ts").min()).drop_nulls()
    return dict(firsts.iter_rows())


def _identity_records(trace: TraceTable) -> list[tuple[int, dict[str, Any]]]:
    """``PR`` records for processes whose host or rank no metadata record states.

    Hosts and ranks can come from a file's name, which the output does not keep;
    these records carry them into it so the output loads back the same.
    """
    stated: dict[tuple[str, int], set[str]] = {}
    for host, pid, name, args in trace.meta.select("host", "pid", "name", "args").iter_rows():
        if name in (fmt.META_HOSTNAME_HASH, fmt.META_PROCESS_INFO):
            parsed = orjson.loads(args)
            keys = stated.setdefault((host, pid), set())
            if name == fmt.META_HOSTNAME_HASH or parsed.get("hostname"):
                keys.add("hostname")
            if name == fmt.META_PROCESS_INFO and parsed.get("rank") is not None:
                keys.add("rank")
    records = []
    for host, pid, rank in trace.processes.select("host", "pid", "rank").iter_rows():
        keys = stated.get((host, pid), set())
        if "hostname" not in keys or (rank is not None and "rank" not in keys):
            records.append((pid, {"hostname": host, "rank": rank}))
    return records


def _event_lines(events: pl.DataFrame, separator: bytes) -> Iterator[bytes]:
    """The events' lines, a batch at a time, joined by ``separator``: the fields of
    :data:`_EVENT_KEYS` it has (none that is null), then ``args`` (the text as read,
    or rebuilt from the columns of :data:`_ARG_COLUMNS`). Encoded by polars' JSON
    writer, as orjson writes them one by one."""
    keys = [k for k in _EVENT_KEYS if k in events.columns]
    arg_columns = [c for c in _ARG_COLUMNS if c in events.columns]
    for batch in events.iter_slices(_BATCH):
        nulls = batch.null_count().row(0, named=True)
        head = _json_objects(batch, {k: k for k in keys}, nulls)
        if "args" in batch.columns:
            args = pl.col("args")
        elif arg_columns:
            args = _json_objects(batch, {c: _ARG_COLUMNS[c] for c in arg_columns}, nulls)
            args = pl.when(args != "{}").then(args)
        else:
            args = pl.lit(None, pl.String)
        line = (pl.when(args.is_null()).then(head)
                .when(head == "{}").then(pl.concat_str(pl.lit('{"args":'), args, pl.lit("}")))
                .otherwise(pl.concat_str(head.str.head(-1), pl.lit(',"args":'), args, pl.lit("}"))))
        yield batch.select(line.str.join(separator.decode())).item().encode()


def _json_objects(batch: pl.DataFrame, fields: dict[str, str], nulls: dict[str, int]) -> pl.Expr:
    """JSON objects of the columns ``fields`` (column: key, in order), the null ones
    left out. A field's ``"key":null`` text is found only where a field is, never in
    a string."""
    if not fields:
        return pl.lit("{}")
    encoded = pl.struct([pl.col(c).alias(k) for c, k in fields.items()]).struct.json_encode()
    columns = list(fields)
    for c in columns[1:]:
        if nulls[c]:
            encoded = encoded.str.replace_all(f',"{fields[c]}":null', "", literal=True)
    if nulls[columns[0]]:
        first = f'"{fields[columns[0]]}":null'
        encoded = encoded.str.replace("{" + first + ",", "{", literal=True).str.replace(
            "{" + first + "}", "{}", literal=True)
    return encoded


# --- merge ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MergeFilter:
    """What to keep when merging (None: everything)."""

    #: Keep events of these categories only.
    categories: Sequence[str] | None = None
    #: Keep events overlapping [start_s, end_s], seconds from the (aligned) trace start.
    start_s: float | None = None
    end_s: float | None = None
    #: Keep, per rank, the time of steps first..last (inclusive, by the step model
    #: of docs/analysis.md) ...
    steps: tuple[int, int] | None = None
    #: ... of this epoch (any epoch when None).
    epoch: int | None = None


def merge(trace: TraceTable, keep: MergeFilter | None = None, *, align_clocks: bool = True) -> TraceTable:
    """Make one Perfetto-friendly trace of many processes and ranks.

    Every process gets a unique pid (its own unless another process already has
    it), is named ``rank R · host · pid P`` and sorted by rank. With
    ``align_clocks``, the processes of each host are put on the clock of its
    lowest-ranked process using the recorded clock anchors (wall minus monotonic
    time at start-up): processes on one host share the monotonic clock, so the
    difference of their anchors is exactly the wall-clock adjustment between their
    starts. Hosts themselves stay as their clocks (NTP) put them.
    """
    keep = keep or MergeFilter()
    procs = trace.processes
    new_pid = assign_pids(procs)
    offset_us = _clock_offsets(procs) if align_clocks else {}
    mapping = pl.DataFrame(
        {
            "host": procs.get_column("host"),
            "pid": procs.get_column("pid"),
            "new_pid": [new_pid[k] for k in zip(procs["host"], procs["pid"])],
            "offset": [offset_us.get(k, 0) for k in zip(procs["host"], procs["pid"])],
            "order": list(range(procs.height)),
        },
        schema={"host": pl.String, "pid": pl.Int64, "new_pid": pl.Int64, "offset": pl.Int64, "order": pl.Int64},
    )
    events = (
        trace.events.join(mapping, on=["host", "pid"], how="left", maintain_order="left")
        .with_columns(pl.col("ts") + pl.col("offset").fill_null(0))
    )
    filtered = _filter(events, keep)
    if not filtered.height and events.height and keep != MergeFilter():
        raise ValueError(f"no events match {_describe(keep)}"
                         + (f": {describe_steps(events)}" if keep.steps is not None else ""))
    events = filtered.sort(["order", "ts"], maintain_order=True).with_columns(pl.col("new_pid").alias("pid"))
    events = events.drop("new_pid", "offset", "order")
    return replace(
        trace,
        events=events,
        processes=procs.with_columns(
            pl.Series("pid", [new_pid[k] for k in zip(procs["host"], procs["pid"])], dtype=pl.Int64)
        ),
        threads=_remap(trace.threads, new_pid),
        meta=_merged_meta(trace, new_pid, offset_us),
    )


def assign_pids(procs: pl.DataFrame) -> dict[tuple[str, int], int]:
    """(host, pid) -> a pid no other process has (its own when it can)."""
    used: set[int] = set()
    out = {}
    next_free = max(procs.get_column("pid").to_list(), default=0) + 1
    for host, pid in zip(procs["host"], procs["pid"]):
        new = pid
        if new in used or not 0 <= new <= fmt.UINT32_MAX:
            new, next_free = next_free, next_free + 1
        used.add(new)
        out[(host, pid)] = new
    return out


def _clock_offsets(procs: pl.DataFrame) -> dict[tuple[str, int], int]:
    reference: dict[str, int] = {}
    offsets = {}
    for host, pid, wall, mono in procs.select("host", "pid", "wall_ns", "mono_ns").iter_rows():
        if wall is None or mono is None:
            continue
        base = wall - mono
        ref = reference.setdefault(host, base)
        offsets[(host, pid)] = round((ref - base) / 1000)
    return offsets


def _filter(events: pl.DataFrame, keep: MergeFilter) -> pl.DataFrame:
    end = pl.col("ts") + pl.col("dur").fill_null(0)
    if keep.categories is not None:
        events = events.filter(pl.col("cat").is_in(list(keep.categories)))
    if keep.start_s is not None or keep.end_s is not None:
        origin = events.get_column("ts").min() or 0
        if keep.start_s is not None:
            events = events.filter(end >= origin + round(keep.start_s * 1e6))
        if keep.end_s is not None:
            events = events.filter(pl.col("ts") <= origin + round(keep.end_s * 1e6))
    if keep.steps is not None:
        first, last = keep.steps
        unit = pl.coalesce(pl.col("rank").cast(pl.String), pl.col("host") + pl.lit(":") + pl.col("pid").cast(pl.String))
        windows = step_windows(events, unit, first, last, keep.epoch)
        events = in_windows(events.with_columns(unit.alias("_unit")), windows, "_unit", end).drop("_unit")
    return events


def in_windows(frame: pl.DataFrame, windows: pl.DataFrame, on: str, end: pl.Expr) -> pl.DataFrame:
    """The rows of ``frame`` that overlap one of their ``on`` value's windows
    (``windows``: on, _from, _to; a window an epoch's kept steps), each once."""
    return (frame.with_row_index("_row").join(windows, on=on, how="inner", maintain_order="left")
            .filter((end > pl.col("_from")) & (pl.col("ts") < pl.col("_to")))
            .unique("_row", keep="first", maintain_order=True).drop("_row", "_from", "_to"))


def kept_step_windows(steps: pl.DataFrame, unit_of: pl.DataFrame, first: int, last: int,
                      epoch: int | None, containers: pl.DataFrame) -> pl.DataFrame:
    """_unit, _from, _to: the time of each unit's steps ``first``..``last`` (``steps``
    as ``model_steps`` gives them; ``unit_of``: proc, _unit), one window an epoch:
    steps 5 to 6 of every epoch are not all that lies between epoch 0's and the last's.
    Steps that carry no epoch are each in the epoch span they start in (``containers``:
    proc, name, start, ...), a window each."""
    selected = steps.filter(pl.col("step").is_between(first, last))
    if epoch is not None:
        selected = selected.filter(pl.col("epoch") == epoch)
    spans = (containers.filter(pl.col("name").is_in(fmt.EPOCH_NAMES)).select("proc", pl.col("start").alias("_in"))
             .sort("_in"))
    selected = (selected.sort("start").join_asof(spans, left_on="start", right_on="_in", by="proc",
                                                 strategy="backward", check_sortedness=False)
                if spans.height and selected.get_column("epoch").null_count() else selected.with_columns(
                    pl.lit(None, pl.Int64).alias("_in")))
    return (selected.join(unit_of, on="proc").group_by("_unit", "epoch", "_in")
            .agg(pl.col("start").min().alias("_from"), pl.col("end").max().alias("_to")).drop("epoch", "_in"))


def _describe(keep: MergeFilter) -> str:
    """The filter in words."""
    parts = []
    if keep.categories is not None:
        parts.append("categories " + ", ".join(keep.categories))
    if keep.start_s is not None or keep.end_s is not None:
        parts.append(f"time from {keep.start_s or 0:g} s" + ("" if keep.end_s is None else f" to {keep.end_s:g} s"))
    if keep.steps is not None:
        first, last = keep.steps
        parts.append(f"steps {first}..{last}" + (f" of epoch {keep.epoch}" if keep.epoch is not None else ""))
    return "the filter (" + "; ".join(parts) + ")"


def _remap(frame: pl.DataFrame, new_pid: dict[tuple[str, int], int]) -> pl.DataFrame:
    return frame.with_columns(
        pl.Series("pid", [new_pid.get(k, k[1]) for k in zip(frame["host"], frame["pid"])], dtype=pl.Int64)
    )


def _merged_meta(
    trace: TraceTable, new_pid: dict[tuple[str, int], int], offset_us: dict[tuple[str, int], int]
) -> pl.DataFrame:
    """Metadata of the merged trace: names and sort order by rank, pids remapped."""
    rows = []
    for index, proc in enumerate(trace.processes.iter_rows(named=True)):
        key = (proc["host"], proc["pid"])
        pid = new_pid[key]
        sort_index = proc["rank"] if proc["rank"] is not None else 1_000_000 + index
        rows.append(_meta_row(proc["host"], pid, fmt.META_PROCESS_NAME, {"name": proc["label"]}))
        rows.append(_meta_row(proc["host"], pid, fmt.META_PROCESS_SORT_INDEX, {"sort_index": sort_index}))
    replaced = {fmt.META_PROCESS_NAME, fmt.META_PROCESS_SORT_INDEX}
    for row in trace.meta.iter_rows(named=True):
        if row["name"] in replaced:
            continue
        key = (row["host"], row["pid"])
        args = row["args"]
        if row["name"] == fmt.META_CLOCK_ANCHOR and offset_us.get(key):
            anchor = orjson.loads(args)
            anchor["wall_ns"] = anchor.get("wall_ns", 0) + offset_us[key] * 1000
            args = orjson.dumps(anchor).decode()
        rows.append({**row, "pid": new_pid.get(key, row["pid"]), "args": args})
    return pl.DataFrame(rows, schema=trace.meta.schema)


def _meta_row(host: str, pid: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"host": host, "pid": pid, "tid": pid, "name": name, "cat": None, "args": orjson.dumps(args).decode()}


def step_windows(events: pl.DataFrame, unit: pl.Expr, first: int, last: int,
                 epoch: int | None) -> pl.DataFrame:
    """_unit, _from, _to: per unit and epoch, the time of steps ``first``..``last``
    (of ``epoch``, or of any epoch) by the step model. ``events`` is a loaded trace's
    events table; ``unit`` names the rank (or process) of each event."""
    spans = events.filter(
        (pl.col("ph") == fmt.PH_COMPLETE) & pl.col("ts").is_not_null() & pl.col("dur").is_not_null()
    ).with_columns(
        (pl.col("ts") + pl.col("dur")).alias("end"),
        pl.struct("host", "pid").rank("dense").cast(pl.Int32).alias("proc"),
        unit.alias("_unit"),
    )
    units = spans.select("proc", "_unit").unique("proc")
    containers = container_rows(spans, ["proc"])
    steps = model_steps(step_rows(spans, ["proc"]), containers)
    return kept_step_windows(steps, units, first, last, epoch, containers)


def describe_steps(events: pl.DataFrame) -> str:
    """What steps and epochs the events carry, for a message about a filter."""
    spans = events.filter(pl.col("step").is_not_null())
    if not spans.height:
        return "the trace has no step numbers"
    steps = spans.get_column("step")
    epochs = sorted(spans.get_column("epoch").drop_nulls().unique().to_list())
    where = f"epochs {epochs[0]}..{epochs[-1]}" if epochs else "no epoch numbers"
    return f"the trace has steps {steps.min()}..{steps.max()} and {where}"
