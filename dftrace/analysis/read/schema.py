"""The one table schema every loaded trace has, whatever wrote the files."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
import polars as pl

from ... import format as fmt

#: A data frame or a query on one: functions of tables that serve either way.
FrameT = TypeVar("FrameT", pl.DataFrame, pl.LazyFrame)

#: Columns of ``TraceTable.events``, in order, with their polars types. Times are integer
#: microseconds since the Unix epoch (fractional microseconds are truncated).
EVENT_COLUMNS: dict[str, pl.DataType] = {
    "pid": pl.Int64(),
    "tid": pl.Int64(),
    "rank": pl.Int32(),  # from PR metadata, process_name or the file name; null if unknown
    "host": pl.String(),  # hostname resolved through HH metadata across files
    "cat": pl.String(),
    "name": pl.String(),
    "ph": pl.String(),  # Chrome phase letter; DFTracer's integer codes are mapped
    "ts": pl.Int64(),
    "dur": pl.Int64(),  # null for counter and instant events
    "id": pl.Int64(),
    "parent_id": pl.Int64(),  # args.p_idx; null for root spans (0 or -1 in files)
    "level": pl.Int32(),  # args.level: nesting depth on the track, from 1
    "epoch": pl.Int64(),
    "step": pl.Int64(),
    "count": pl.Int64(),  # args.count: item number of .iter() spans
    "incomplete": pl.Boolean(),  # true for spans closed at finalize without a stop
    "group": pl.String(),  # args.group: process group of a collective
    "seq": pl.Int64(),  # args.seq: the collective's number within its group
    "args": pl.String(),  # the whole args object as JSON text, common args included
}

#: Where each decoded column comes from: ("top" | "args", JSON key, type to decode as).
RAW_FIELDS: dict[str, tuple[str, str, pl.DataType]] = {
    "pid": ("top", "pid", pl.Int64()),
    "tid": ("top", "tid", pl.Int64()),
    "cat": ("top", "cat", pl.String()),
    "name": ("top", "name", pl.String()),
    "ph": ("top", "ph", pl.String()),
    "ts": ("top", "ts", pl.Int64()),
    "dur": ("top", "dur", pl.Int64()),
    "id": ("top", "id", pl.Int64()),
    "parent_id": ("args", fmt.ARG_PARENT, pl.Int64()),
    "level": ("args", fmt.ARG_LEVEL, pl.Int64()),
    "epoch": ("args", fmt.ARG_EPOCH, pl.Int64()),
    "step": ("args", fmt.ARG_STEP, pl.Int64()),
    "count": ("args", fmt.ARG_COUNT, pl.Int64()),
    "incomplete": ("args", fmt.ARG_INCOMPLETE, pl.Boolean()),
    "group": ("args", "group", pl.String()),
    "seq": ("args", "seq", pl.Int64()),
}

#: Per-partition column holding the event's hostname hash until hosts are resolved.
HOST_KEY = "host_key"

#: What the summary reads: everything else is skipped while parsing.
SUMMARY_COLUMNS = ("pid", "tid", "cat", "name", "ph", "ts", "dur", "level", "epoch", "step", "count",
                   "incomplete", "group", "seq")


def coerce_value(value: Any, dtype: Any) -> Any:
    """``value`` as the column type ``dtype`` holds it (None where it cannot be)."""
    if value is None:
        return None
    if dtype == pl.String:
        return value if isinstance(value, str) else orjson.dumps(value).decode()
    if dtype == pl.Boolean:
        return value if isinstance(value, bool) else None
    if dtype == pl.Float64:
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**63 else None
    if isinstance(value, float):
        return int(value)
    if isinstance(value, str):  # digits of an integer beyond 64 bits, or text
        try:
            number = int(value)
        except ValueError:
            return None
        return number if -(2**63) <= number < 2**63 else None
    return None


def loop_body(name: pl.Expr) -> pl.Expr:
    """Whether a span's ``name`` is a loop body's (``fmt.LOOP_BODY_SUFFIXES``): a
    container of the loop's work, never work itself."""
    return pl.any_horizontal(name.str.ends_with(suffix) for suffix in fmt.LOOP_BODY_SUFFIXES)
