"""Analysis of dftrace (and DFTracer) traces: load, summarise, compare, report, convert, merge, query.

The pipeline is load -> one table (:class:`TraceTable`) or partial aggregates ->
:class:`Summary` -> a renderer (terminal, JSON, HTML, Chrome JSON, pfw, Parquet).
It runs embedded (polars on threads, the default) or on a Dask cluster
(:class:`DaskExecutor`); the code is the same, only where it runs differs::

    from dftrace.analysis import load_traces, summarize, render_text
    print(render_text(summarize("traces/")))
    trace = load_traces("traces/*.pfw.zst")   # trace.events is a polars DataFrame

Names are imported on first use, so ``import dftrace.analysis`` stays cheap and a
missing extra is reported as ``pip install 'dftrace[analysis]'`` when it is needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._deps import ANALYSIS, check_installed

# public name -> module that defines it
_EXPORTS = {
    "DaskExecutor": "._executor",
    "EVENT_COLUMNS": "._schema",
    "EmbeddedExecutor": "._executor",
    "FileReport": "._trace",
    "MergeFilter": "._export",
    "RunDiff": "._diff",
    "Summary": "._summary",
    "TraceTable": "._trace",
    "compare_runs": "._diff",
    "compare_summaries": "._diff",
    "load_traces": "._trace",
    "merge": "._export",
    "render_html": "._render_html",
    "render_text": "._render_text",
    "run_sql": "._sql",
    "summarize": "._summary",
    "write_html": "._render_html",
    "write_trace": "._export",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    check_installed(*ANALYSIS)
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # the names as type checkers and IDEs should see them
    from ._diff import RunDiff, compare_runs, compare_summaries  # noqa: F401
    from ._executor import DaskExecutor, EmbeddedExecutor  # noqa: F401
    from ._export import MergeFilter, merge, write_trace  # noqa: F401
    from ._render_html import render_html, write_html  # noqa: F401
    from ._render_text import render_text  # noqa: F401
    from ._sql import run_sql  # noqa: F401
    from ._schema import EVENT_COLUMNS  # noqa: F401
    from ._summary import Summary, summarize  # noqa: F401
    from ._trace import FileReport, TraceTable, load_traces  # noqa: F401
