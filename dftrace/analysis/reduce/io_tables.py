"""File-I/O events reduced to the partial tables the I/O answers are computed from.

I/O events are a layer of their own: they never enter the span tables (steps,
categories, nesting, breakdown). Each partition reduces them to three tables that
combine exactly (see ``aggregate``): ``io_calls``, one row per I/O event (its
thread, times, kind, bytes, calls), for the answers that place calls in time;
``io_totals``, per (file hash, kind, size bucket), what whole-trace figures are
summed from; ``io_cover``, the union of each thread's compute, data-loading and
checkpoint spans, which the calls are placed in.

Rules. A call's ops are ``args.calls`` for an aggregated event, else 1; its bytes are
``args.ret`` where positive, for read and write calls only (times ``args.size`` for
DFTracer's ``fread``/``fwrite``, whose ``ret`` counts items of that size). A call's size is its bytes
per op; the size buckets are Darshan's (lower bounds inclusive: 100 bytes is in
100-1K), of the calls that moved bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from ... import format as fmt
from ..runtime import kernels
from .busy import GROUPS, key_and_group_ids, union_intervals

#: The categories of the interposer's events.
IO_CATS = ("POSIX", "STDIO")
READ, WRITE, METADATA, SYNC, OTHER = range(5)
KINDS = ("read", "write", "metadata", "sync", "other")
_KIND_OF = {
    **dict.fromkeys(("read", "pread", "readv", "preadv", "fread", "fgets", "sendfile_read",
                     "copy_file_range_read"), READ),
    **dict.fromkeys(("write", "pwrite", "writev", "pwritev", "fwrite", "fputs", "sendfile_write",
                     "copy_file_range_write"), WRITE),
    **dict.fromkeys(("fsync", "fdatasync"), SYNC),
    "mmap": OTHER,
}  # any other call is metadata (open, stat, close, seek, ...)
#: Lower bounds (inclusive) of the size buckets but the first: Darshan's, as the
#: tracer's per-file histograms have them.
SIZE_EDGES = (100, 1 << 10, 10 << 10, 100 << 10, 1 << 20, 4 << 20, 10 << 20, 100 << 20, 1 << 30)
SIZE_BUCKETS = ("0-100", "100-1K", "1K-10K", "10K-100K", "100K-1M", "1M-4M", "4M-10M", "10M-100M",
                "100M-1G", "1G+")
#: Reads (and writes) under this many bytes a call are small.
SMALL_BYTES = 64 << 10
#: Values beyond these are damage, not counts: such a call counts 1 op, 0 bytes.
MAX_CALLS = 1 << 40
MAX_BYTES = 1 << 50
#: The args the summary reads from I/O events, as event columns.
ARG_COLUMNS = {"io_fhash": ("fhash", pl.String()), "io_ret": ("ret", pl.Int64()), "io_calls": ("calls", pl.Int64()),
               "io_size": ("size", pl.Int64())}
#: The calls whose ``args.ret`` counts items of ``args.size`` bytes where the event has
#: a size (DFTracer's ``fread``/``fwrite``); dftrace's own carry bytes in ``ret``.
_ITEM_CALLS = ("fread", "fwrite")
#: Span groups that I/O is placed in: compute, data loading, checkpoint.
COMPUTE, LOADER, CHECKPOINT = (GROUPS.index(g) for g in ("compute", "data", "checkpoint"))
#: Schemas of the partial tables (without the process key columns).
SCHEMAS = {
    "io_calls": {"tid": pl.Int64, "ts": pl.Int64, "end": pl.Int64, "kind": pl.Int8, "bytes": pl.Int64,
                 "ops": pl.Int64},
    "io_totals": {"fhash": pl.String, "kind": pl.Int8, "bucket": pl.Int8, "small": pl.Boolean, "ops": pl.Int64,
                  "bytes": pl.Int64, "us": pl.Int64, "first": pl.Int64, "last": pl.Int64},
    "io_cover": {"tid": pl.Int64, "group": pl.Int8, "start": pl.Int64, "end": pl.Int64},
}
#: The key of an ``io_totals`` row beside the process's.
TOTALS_KEY = ("fhash", "kind", "bucket", "small")


def _kind() -> pl.Expr:
    """A call's kind (``KINDS``) by its name."""
    return pl.col("name").replace_strict(_KIND_OF, default=METADATA, return_dtype=pl.Int8).alias("kind")


def _ops() -> pl.Expr:
    """A call's ops: ``args.calls`` of an aggregated event, else 1."""
    calls = pl.col("io_calls")
    return pl.when(calls.is_between(1, MAX_CALLS)).then(calls).otherwise(1).cast(pl.Int64).alias("ops")


def _bytes() -> pl.Expr:
    """A call's bytes: ``args.ret`` where positive, of read and write calls (after
    ``kind``), times ``args.size`` for a call that counts items of that size."""
    items = pl.col("name").is_in(_ITEM_CALLS) & pl.col("io_size").is_between(1, MAX_BYTES)
    ret = pl.when(items).then(pl.col("io_ret") * pl.col("io_size")).otherwise(pl.col("io_ret"))
    moved = pl.col("kind").is_in([READ, WRITE]) & ret.is_between(1, MAX_BYTES)
    return pl.when(moved).then(ret).otherwise(0).cast(pl.Int64).alias("bytes")


def io_tables(events: pl.DataFrame, keys: list[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(io_calls, io_totals) of I/O events: ``keys`` plus tid, ts, dur, name and the
    ``ARG_COLUMNS`` (complete events with times only)."""
    moved = pl.col("kind").is_in([READ, WRITE])
    size = pl.col("bytes") // pl.col("ops")
    bucket = pl.sum_horizontal((size >= edge).cast(pl.Int8) for edge in SIZE_EDGES)
    frame = events.select(*keys, pl.col("tid").fill_null(0), "ts", (pl.col("ts") + pl.col("dur")).alias("end"),
                          pl.col("io_fhash").alias("fhash"), _kind(), "io_calls", "io_ret", "io_size", "name"
                          ).with_columns(_ops(), _bytes()).with_columns(
        pl.when(moved & (pl.col("bytes") > 0)).then(bucket).otherwise(-1).cast(pl.Int8).alias("bucket"),
        # Small: moved bytes, fewer than SMALL_BYTES a call (an end-of-file read, or a
        # failed one, moved none: left out, as the size histogram leaves it).
        (moved & (pl.col("bytes") > 0) & (size < SMALL_BYTES)).alias("small"))
    io_calls = frame.select(*keys, *SCHEMAS["io_calls"])
    io_totals = frame.group_by(*keys, *TOTALS_KEY).agg(
        pl.col("ops").sum(), pl.col("bytes").sum(), (pl.col("end") - pl.col("ts")).sum().alias("us"),
        pl.col("ts").min().alias("first"), pl.col("end").max().alias("last"))
    return io_calls, io_totals


#: The args ``dftrace sql``'s io table reads, as event columns.
SQL_ARG_COLUMNS = {**ARG_COLUMNS, "io_offset": ("offset", pl.Int64()), "io_errno": ("errno", pl.Int64())}
#: Columns of ``dftrace sql``'s io table.
SQL_SCHEMA = {"pid": pl.Int64, "host": pl.String, "rank": pl.Int32, "tid": pl.Int64, "ts": pl.Int64,
              "dur": pl.Int64, "name": pl.String, "cat": pl.String, "category": pl.String, "path": pl.String,
              "bytes": pl.Int64, "count": pl.Int64, "offset": pl.Int64, "calls": pl.Int64, "ret": pl.Int64,
              "errno": pl.Int64}


def named_by_any_process(rows: pl.DataFrame, paths: pl.DataFrame, key: str) -> pl.DataFrame:
    """``rows`` (joined to their own process's ``paths``: ``key``, ``path``) with the
    path of a hash their process never opened (a forked child reading what its parent
    opened) taken from any process that did: a hash is its path's, in any process."""
    anywhere = paths.unique(key, keep="first", maintain_order=True).select(key, pl.col("path").alias("_any"))
    return (rows.join(anywhere, on=key, how="left", nulls_equal=False)
            .with_columns(pl.coalesce("path", "_any").alias("path")).drop("_any"))


def sql_rows(events: pl.DataFrame, meta: pl.DataFrame) -> pl.DataFrame:
    """``dftrace sql``'s io table: one row per I/O event of ``events`` (a loaded trace's,
    with ``SQL_ARG_COLUMNS``), its file's path from the ``FH`` records of ``meta``."""
    paths = (meta.filter(pl.col("name") == "FH")
             .select("host", "pid", pl.col("args").str.json_path_match("$.value").alias("io_fhash"),
                     pl.col("args").str.json_path_match("$.name").alias("path"))
             .drop_nulls().unique(["host", "pid", "io_fhash"], keep="first"))
    calls = events.filter((pl.col("ph") == fmt.PH_COMPLETE) & pl.col("cat").is_in(IO_CATS))
    return (named_by_any_process(calls.join(paths, on=["host", "pid", "io_fhash"], how="left", nulls_equal=False),
                                 paths, "io_fhash")
            .with_columns(_kind(), _ops().alias("calls"))
            .with_columns(_bytes(), pl.col("kind").replace_strict(dict(enumerate(KINDS)), return_dtype=pl.String)
                          .alias("category"), pl.col("io_offset").alias("offset"), pl.col("io_ret").alias("ret"),
                          pl.col("io_errno").alias("errno"))
            .select(*SQL_SCHEMA).cast(SQL_SCHEMA))


def cover_table(spans: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """io_cover of spans (``keys``, tid, group, start, end): each thread's compute,
    data-loading and checkpoint time as disjoint intervals."""
    spans = spans.filter(pl.col("group").is_in([COMPUTE, LOADER, CHECKPOINT]))
    return union_intervals(spans.select(*keys, "tid", "group", "start", "end"), [*keys, "tid"])


def thread_cover(tid: np.ndarray, group: np.ndarray, start: np.ndarray, end: np.ndarray) -> dict[str, Any]:
    """tid, group, start, end: ``cover_table`` of one process's spans given as arrays
    (tid int64, group int8), the same rows, without a frame of them (half the time of
    a piece's cover, which a trace without file calls makes for every piece)."""
    kept = np.flatnonzero((group == COMPUTE) | (group == LOADER) | (group == CHECKPOINT))
    found = key_and_group_ids(tid[kept], group[kept]) if kernels.C is not None else None
    if found is None:
        table = cover_table(pl.DataFrame({"tid": tid, "group": group, "start": start, "end": end}), [])
        return {name: table.get_column(name) for name in table.columns}
    ids, n_ids = found
    rows, starts, ends = kernels.C.union(ids, np.ascontiguousarray(start[kept], np.int64),
                                         np.ascontiguousarray(end[kept], np.int64), n_ids)
    first = kept[np.frombuffer(rows, np.int64)]
    return {"tid": tid[first], "group": group[first], "start": np.frombuffer(starts, np.int64),
            "end": np.frombuffer(ends, np.int64)}


def regrouped_totals(totals: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """``io_totals`` rows of several partitions with one row a key again."""
    return totals.group_by(*keys, *TOTALS_KEY).agg(
        pl.col("ops").sum(), pl.col("bytes").sum(), pl.col("us").sum(), pl.col("first").min(),
        pl.col("last").max())
