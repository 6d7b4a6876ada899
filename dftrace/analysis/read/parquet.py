"""Parquet files of the events table: written by ``dftrace convert``, read back by
``load_traces`` and checked by ``dftrace validate`` (docs/format.md, section 6)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import orjson
import polars as pl

from ... import format as fmt
from .metadata import resolved_records
from .schema import EVENT_COLUMNS, HOST_KEY

_PARQUET_KEY = "dftrace"
_PARQUET_VERSION = 1


def write_parquet(trace: Any, path: str | os.PathLike[str]) -> None:
    """Write the events as Parquet, with processes, threads and metadata records
    stored in the file's key-value metadata so :func:`load_traces` reads it back."""
    trace.events.write_parquet(path, metadata=parquet_document(trace))


def parquet_document(trace: Any) -> dict[str, str]:
    """The key-value metadata of a Parquet file of ``trace``'s events: its processes
    and metadata records, which :func:`load_traces` reads back."""
    document = {
        "version": _PARQUET_VERSION,
        "processes": trace.processes.select("host", "pid", "rank").to_dicts(),
        "meta": trace.meta.to_dicts(),
    }
    return {_PARQUET_KEY: orjson.dumps(document).decode()}


def read_parquet_parts(path: str, wanted: Sequence[str]) -> tuple[pl.DataFrame, list[dict[str, Any]]]:
    """Read a Parquet file written by :func:`write_parquet` as one partition's data.

    Its events already carry ``host``, which becomes the host key, and synthetic
    records restore each process's rank, so resolution reproduces the processes
    that were written.
    """
    try:
        kv = pl.read_parquet_metadata(path)
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise ValueError(f"{path} is not a readable Parquet file: {exc}") from None
    if _PARQUET_KEY not in kv:
        raise ValueError(f"{path} was not written by dftrace (no {_PARQUET_KEY!r} metadata)")
    document = orjson.loads(kv[_PARQUET_KEY])
    if document.get("version") != _PARQUET_VERSION:
        raise ValueError(f"{path}: unsupported dftrace Parquet version {document.get('version')!r}")
    available = pl.read_parquet_schema(path)
    events = pl.read_parquet(path, columns=[c for c in [*wanted, "host"] if c in available])
    events = events.select(
        *[
            pl.col(c) if c in available else pl.lit(None, dtype=EVENT_COLUMNS[c]).alias(c)
            for c in wanted
        ],
        pl.col("host").fill_null("").alias(HOST_KEY),
    )
    return events, resolved_records(document["processes"], document["meta"])


def validate_parquet(path: str | os.PathLike[str]) -> list[fmt.Violation]:
    """Check a Parquet file against what :func:`write_parquet` writes (docs/format.md, section 6).

    Rules: a readable Parquet file; a ``dftrace`` key-value document of a known
    version listing processes and metadata records; every column of
    ``EVENT_COLUMNS`` with its type; ``pid``/``tid`` unsigned 32-bit; ``ts >= 0``;
    ``dur >= 0`` on complete events. Violations are about the file as a whole
    (line 0) and name the first offending row. An empty list means the file is fine.
    """
    path = os.fspath(path)
    try:
        kv = pl.read_parquet_metadata(path)
        schema = pl.read_parquet_schema(path)
    except Exception as exc:  # polars raises its own error types for non-Parquet input
        return [fmt.Violation(0, "parquet", f"not a readable Parquet file: {exc}")]
    found: list[fmt.Violation] = []

    def broken(rule: str, message: str) -> None:
        found.append(fmt.Violation(0, rule, message))

    try:
        document = orjson.loads(kv[_PARQUET_KEY])
    except (KeyError, orjson.JSONDecodeError):
        document = None
    if not isinstance(document, dict):
        broken("parquet-metadata", f"no {_PARQUET_KEY!r} JSON document in the key-value metadata")
    elif document.get("version") != _PARQUET_VERSION:
        broken("parquet-metadata", f"unsupported version {document.get('version')!r}")
    elif not (isinstance(document.get("processes"), list) and isinstance(document.get("meta"), list)):
        broken("parquet-metadata", "the document needs 'processes' and 'meta' lists")
    for column, dtype in EVENT_COLUMNS.items():
        if column not in schema:
            broken("parquet-columns", f"column {column!r} is missing")
        elif schema[column] != dtype:
            broken("parquet-columns", f"column {column!r} is {schema[column]}, expected {dtype}")
    if found:
        return found
    events = pl.scan_parquet(path).with_row_index("row", offset=1)
    checks = {
        "pid": ~pl.col("pid").is_between(0, fmt.UINT32_MAX),
        "tid": ~pl.col("tid").is_between(0, fmt.UINT32_MAX),
        "ts": pl.col("ts") < 0,
        "dur": (pl.col("ph") == fmt.PH_COMPLETE) & (pl.col("dur").is_null() | (pl.col("dur") < 0)),
    }
    for rule, bad in checks.items():
        rows = events.filter(bad.fill_null(False)).select("row", rule).collect()
        if rows.height:
            row, value = rows.row(0)
            broken(rule, f"{rows.height} rows with a bad {rule}, first row {row}: {value!r}")
    return found
