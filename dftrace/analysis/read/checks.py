"""``dftrace validate``'s check of one file, whatever it holds: a trace file against
the format's rules, a PyTorch profiler document, or a Parquet file written by
``dftrace convert`` against the events table."""

from __future__ import annotations

from typing import Any

from ..runtime.deps import ANALYSIS, check_installed

__all__ = ["violations_of"]


def violations_of(path: str, *, strict: bool = False, torn: list[Any] | None = None) -> list[Any]:
    """The rules ``path`` breaks (a trace file's cut-off end is appended to ``torn``;
    ``strict`` counts it as a violation)."""
    from ...format.rules import validate_file
    from .kineto import is_document_file, validate_document
    from .sources import PARQUET_SUFFIX

    if path.endswith(PARQUET_SUFFIX):
        check_installed(*ANALYSIS, needed_by="dftrace validate of a Parquet file")
        from .parquet import validate_parquet

        return validate_parquet(path)
    if is_document_file(path):
        return validate_document(path)
    return validate_file(path, strict=strict, torn=torn)
