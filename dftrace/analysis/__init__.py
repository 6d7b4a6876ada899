"""Analysis of dftrace (and DFTracer) traces: load, summarise, compare, report, convert, merge, query.

The package is a pipeline in stages, each a folder whose modules import only from
the stages below it:

- ``read/``: finding trace files, cutting them into partitions and decoding them
  (dftrace and DFTracer lines, PyTorch profiler documents, Parquet), with what the
  metadata says of each process;
- ``reduce/``: the per-partition tables (:class:`reduce.aggregate.Partial`) and how
  they combine, the step model and the interval sweeps;
- ``answers/``: one module per question (steps, stragglers, data loader, GPU, file
  I/O, diff, SQL), gathered by :func:`summarize` into a :class:`Summary`;
- ``render/``: the terminal text, the HTML report, the diff and the live watch; the
  answers as DataFrames (``frames``) and plotly figures (``figures``), for notebooks;
- ``export/``: traces written back out (Chrome JSON, pfw, Parquet; merge, convert);
- ``runtime/``: where the work runs (executors), the optional dependencies, the heap
  policy and the C kernels.

``commands`` holds the command-line subcommands. It runs embedded (polars on
threads, the default) or on a Dask cluster (:class:`DaskExecutor`); the code is the
same, only where it runs differs::

    from dftrace.analysis import load_traces, summarize, render_text
    print(render_text(summarize("traces/")))
    trace = load_traces("traces/*.pfw.zst")   # trace.events is a polars DataFrame

Names are imported on first use, so ``import dftrace.analysis`` stays cheap and a
missing extra is reported as ``pip install 'dftrace[analysis]'`` when it is needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .runtime.deps import ANALYSIS, check_installed

# public name -> module that defines it
_EXPORTS = {
    "DaskExecutor": ".runtime.executor",
    "EVENT_COLUMNS": ".read.schema",
    "EmbeddedExecutor": ".runtime.executor",
    "FileReport": ".read.trace",
    "MergeFilter": ".export.tables",
    "RunDiff": ".answers.diff",
    "Summary": ".answers.summary",
    "TraceTable": ".read.trace",
    "compare_runs": ".answers.diff",
    "compare_summaries": ".answers.diff",
    "load_traces": ".read.trace",
    "merge": ".export.tables",
    "render_html": ".render.html",
    "render_text": ".render.text",
    "run_sql": ".answers.sql",
    "summarize": ".answers.summary",
    "write_html": ".render.html",
    "write_perfetto": ".export.perfetto",
    "write_trace": ".export.tables",
}

# public name -> module that is it: the answers as DataFrames and as plotly figures
_MODULES = {
    "figures": ".render.figures",
    "frames": ".render.frames",
}

__all__ = sorted([*_EXPORTS, *_MODULES])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name) or _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    check_installed(*ANALYSIS)
    imported = importlib.import_module(module, __name__)
    value = imported if name in _MODULES else getattr(imported, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # the names as type checkers and IDEs should see them
    from .answers.diff import RunDiff, compare_runs, compare_summaries  # noqa: F401
    from .runtime.executor import DaskExecutor, EmbeddedExecutor  # noqa: F401
    from .export.tables import MergeFilter, merge, write_trace  # noqa: F401
    from .export.perfetto import write_perfetto  # noqa: F401
    from .render.html import render_html, write_html  # noqa: F401
    from .render import figures, frames  # noqa: F401
    from .render.text import render_text  # noqa: F401
    from .answers.sql import run_sql  # noqa: F401
    from .read.schema import EVENT_COLUMNS  # noqa: F401
    from .answers.summary import Summary, summarize  # noqa: F401
    from .read.trace import FileReport, TraceTable, load_traces  # noqa: F401
