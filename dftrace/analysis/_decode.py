"""Reading one partition into a table of events plus the metadata records it holds.

This is the function every executor runs on its workers. The fast path splits the
decoded bytes into lines and lets polars parse all events at once; metadata lines
(a handful per file) and any partition polars refuses (a broken line in the middle,
an arg of an unexpected type) are parsed line by line with orjson, which reports
each broken line instead of failing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
import polars as pl

from .. import format as fmt
from ._schema import EVENT_COLUMNS, HOST_KEY, RAW_FIELDS
from ._sources import Partition

# Keep this many broken lines (number and reason) per partition; all are counted.
MAX_BROKEN_KEPT = 100

_PHASE_CODES = {str(code): letter for code, letter in fmt.DFTRACER_PHASES.items()}


@dataclass
class PartitionData:
    """What one partition holds: events, metadata records and how reading went."""

    partition: Partition
    #: The requested event columns plus ``host_key`` (the event's ``hhash``, used
    #: to resolve its host); ``host`` and ``rank`` are filled in after all
    #: partitions' metadata is known.
    events: pl.DataFrame
    #: Metadata events as ``{"pid", "tid", "name", "cat", "args"}`` dicts, in file order.
    meta: list[dict[str, Any]] = field(default_factory=list)
    #: Lines in this partition (to number broken lines across partitions).
    n_lines: int = 0
    #: ``(line number within the partition, reason)`` of the first broken lines.
    broken: list[tuple[int, str]] = field(default_factory=list)
    broken_count: int = 0
    #: Why decoding stopped before the end of the partition, if it did.
    cut_off: str | None = None
    #: Whether the closing ``]`` of a finalized file was seen.
    closed: bool = False

    def note_broken(self, number: int, reason: str) -> None:
        self.broken_count += 1
        if len(self.broken) < MAX_BROKEN_KEPT:
            self.broken.append((number, reason))


def read_partition(partition: Partition, columns: Iterable[str] | None = None) -> PartitionData:
    """Read ``partition`` into :class:`PartitionData` with the given event columns.

    ``columns`` defaults to the whole schema (``dftrace.analysis.EVENT_COLUMNS``);
    asking for fewer (the summary needs eight) skips decoding the rest, which is
    what makes the summary fast. Never raises on bad content.
    """
    wanted = _wanted(columns)
    if partition.is_parquet:
        return _read_parquet(partition, wanted)
    decoded = fmt.read_trace_bytes(partition.path, partition.start, partition.end)
    result = PartitionData(partition, _empty(wanted), cut_off=decoded.cut_off)
    data = decoded.data
    if not data:
        return result
    lines = pl.read_lines(data, name="text").with_row_index("line", offset=1)
    result.n_lines = lines.height
    starts_object = pl.col("text").str.starts_with("{")
    for number, text in lines.filter(~starts_object).iter_rows():
        _classify_other(result, number, text)
    candidates = lines.filter(starts_object)
    if candidates.height and candidates.item(-1, "line") == lines.height and not data.endswith(b"\n"):
        # A crash can cut the last line; check it alone rather than failing the batch.
        line = fmt.parse_line(candidates.item(-1, "text").encode())
        if line.error is not None:
            result.note_broken(lines.height, line.error)
            candidates = candidates.slice(0, candidates.height - 1)
    if decoded.cut_off is not None:
        _note_cut_off(result, decoded.cut_off)
    if candidates.select(pl.col("text").str.ends_with(",").any()).item():
        candidates = candidates.with_columns(pl.col("text").str.strip_suffix(","))
    try:
        events, meta_lines = _decode_fast(result, candidates, wanted)
    except pl.exceptions.PolarsError:
        events, meta_lines = _decode_slow(result, candidates, wanted)
    result.meta = [_meta_record(text) for text in meta_lines]
    result.events = events
    return result


def _wanted(columns: Iterable[str] | None) -> list[str]:
    if columns is None:
        return [c for c in EVENT_COLUMNS if c not in ("host", "rank")]
    unknown = set(columns) - set(EVENT_COLUMNS)
    if unknown:
        raise ValueError(f"unknown event columns {sorted(unknown)}; known: {list(EVENT_COLUMNS)}")
    return [c for c in EVENT_COLUMNS if c in set(columns) and c not in ("host", "rank")]


def _empty(wanted: list[str]) -> pl.DataFrame:
    schema = {c: EVENT_COLUMNS[c] for c in wanted}
    schema[HOST_KEY] = pl.String
    return pl.DataFrame(schema=schema)


def _note_cut_off(result: PartitionData, reason: str) -> None:
    """Count a cut-off stream once: on its last, cut line if that was broken."""
    if result.broken and result.broken[-1][0] == result.n_lines:
        number, error = result.broken[-1]
        result.broken[-1] = (number, f"{error} ({reason})")
    else:
        result.note_broken(result.n_lines + 1, reason)


def _classify_other(result: PartitionData, number: int, text: str) -> None:
    stripped = text.strip()
    line = fmt.parse_line(stripped.encode())
    if line.is_structural:
        if stripped == "]":
            result.closed = True
    elif line.error is not None:
        result.note_broken(number, line.error)
    else:
        # An event line with leading whitespace: valid JSON but not in the layout
        # the fast path expects. Rare enough to send the partition down the slow path.
        result.note_broken(number, "event line starts with whitespace")


def _struct_dtype(wanted: list[str]) -> pl.Struct:
    top: dict[str, Any] = {"ph": pl.String}
    args: dict[str, Any] = {fmt.ARG_HOSTNAME_HASH: pl.String}
    for column in wanted:
        source = RAW_FIELDS.get(column)
        if source is None:
            continue
        where, key, dtype = source
        (args if where == "args" else top)[key] = dtype
    top["args"] = pl.Struct(args)
    return pl.Struct(top)


def _decode_fast(
    result: PartitionData, candidates: pl.DataFrame, wanted: list[str]
) -> tuple[pl.DataFrame, list[str]]:
    extra = []
    if "args" in wanted:
        extra.append(pl.col("text").str.json_path_match("$.args").alias("args_json"))
    parsed = candidates.select(
        pl.col("line"), pl.col("text").str.json_decode(_struct_dtype(wanted)).alias("event"), *extra
    ).unnest("event")
    parsed = parsed.with_columns(pl.col("ph").replace(_PHASE_CODES))
    for (number,) in parsed.filter(pl.col("ph").is_null()).select("line").iter_rows():
        result.note_broken(number, "event without ph")
    is_meta = pl.col("ph") == fmt.PH_METADATA
    meta_lines = (
        candidates.join(parsed.filter(is_meta).select("line"), on="line", how="semi")
        .get_column("text")
        .to_list()
    )
    events = parsed.filter(~is_meta & pl.col("ph").is_not_null())
    return _finish(events, wanted), meta_lines


def _finish(parsed: pl.DataFrame, wanted: list[str]) -> pl.DataFrame:
    """Turn decoded fields into schema columns (args unnested, p_idx <= 0 as null)."""
    args = pl.col("args")
    exprs = []
    for column in wanted:
        source = RAW_FIELDS.get(column)
        if column == "args":
            exprs.append(pl.col("args_json").alias("args"))
            continue
        where, key, _ = source
        expr = args.struct.field(key) if where == "args" else pl.col(key)
        if column == "parent_id":
            expr = pl.when(expr > 0).then(expr)
        exprs.append(expr.cast(EVENT_COLUMNS[column]).alias(column))
    exprs.append(args.struct.field(fmt.ARG_HOSTNAME_HASH).fill_null("").alias(HOST_KEY))
    return parsed.select(exprs)


def _decode_slow(
    result: PartitionData, candidates: pl.DataFrame, wanted: list[str]
) -> tuple[pl.DataFrame, list[str]]:
    """Parse line by line: slower, but reports each bad line and coerces odd types."""
    rows: dict[str, list[Any]] = {"ph": [], "args": [], "args_json": []}
    tops = {RAW_FIELDS[c][1] for c in wanted if c in RAW_FIELDS and RAW_FIELDS[c][0] == "top"} - {"ph"}
    for key in tops:
        rows[key] = []
    meta_lines = []
    for number, text in candidates.iter_rows():
        line = fmt.parse_line(text.encode())
        if line.error is not None:
            result.note_broken(number, line.error)
            continue
        event = line.event
        assert event is not None
        ph = fmt.normalize_phase(event.get("ph"))
        if ph is None:
            result.note_broken(number, f"no usable ph: {event.get('ph')!r}")
            continue
        if ph == fmt.PH_METADATA:
            meta_lines.append(text)
            continue
        rows["ph"].append(ph)
        for key in tops:
            rows[key].append(event.get(key))
        raw_args = event.get("args")
        raw_args = raw_args if isinstance(raw_args, dict) else None
        rows["args"].append(raw_args)
        rows["args_json"].append(orjson.dumps(raw_args).decode() if raw_args is not None else None)
    fields = {f.name: f.dtype for f in _struct_dtype(wanted).fields}
    columns = {"ph": pl.Series(rows["ph"], dtype=pl.String)}
    for key, key_dtype in fields.items():
        if key in tops:
            columns[key] = pl.Series([_coerce(v, key_dtype) for v in rows[key]], dtype=key_dtype)
    arg_fields = {f.name: f.dtype for f in fields["args"].fields}
    columns["args"] = pl.Series(
        [
            {k: _coerce(a.get(k), t) for k, t in arg_fields.items()} if a is not None else None
            for a in rows["args"]
        ],
        dtype=pl.Struct(arg_fields),
    )
    columns["args_json"] = pl.Series(rows["args_json"], dtype=pl.String)
    return _finish(pl.DataFrame(columns), wanted), meta_lines


def _coerce(value: Any, dtype: Any) -> Any:
    if value is None:
        return None
    if dtype == pl.String:
        return value if isinstance(value, str) else orjson.dumps(value).decode()
    if dtype == pl.Boolean:
        return value if isinstance(value, bool) else None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**63 else None
    if isinstance(value, float):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _meta_record(text: str) -> dict[str, Any]:
    event = orjson.loads(text)
    args = event.get("args")
    return {
        "pid": event.get("pid"),
        "tid": event.get("tid"),
        "name": event.get("name"),
        "cat": event.get("cat"),
        "args": args if isinstance(args, dict) else {},
    }


def _read_parquet(partition: Partition, wanted: list[str]) -> PartitionData:
    from ._trace import read_parquet_parts

    events, meta = read_parquet_parts(partition.path, wanted)
    return PartitionData(partition, events, meta=meta, n_lines=0)
