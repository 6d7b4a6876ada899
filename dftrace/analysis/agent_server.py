"""``dftrace mcp``: the analysis's answers for LLM agents, as a Model Context Protocol
server over stdio (the ``mcp`` extra: the protocol's official SDK).

An agent's client starts ``dftrace mcp --root DIR`` and calls its tools, each one
question about the traces at a path under the roots: ``list_runs`` (what there is to
analyse), ``summary``, ``steps``, ``stragglers``, ``dataloader``, ``gpu``, ``io``,
``breakdown``, ``diff``, ``sql`` and ``validate``. Every answer is compact JSON with the
units in the field names (``_us``, ``_bytes``, ``_share``), taken from the same
:class:`Summary` ``dftrace summary --json`` prints: nothing is worked out a second way
here, only picked, ordered and cut to ``limit`` rows per list (``<list>_left_off``
says how many rows were cut).

Paths are resolved (symlinks and ``..``) before they are checked: a path, or a file it
leads to, outside every root is refused, and so is a query that names a table
function reading files. The summary of a path is kept while its files keep their
sizes and modification times, so several questions about one run read it once.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Annotated, Any

import orjson
import polars as pl
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from .. import __version__
from .answers.summary import Summary, headline, summarize
from .read.checks import violations_of
from .read.sources import expand_paths, runs_in
from .render.text import findings, straggler_lines

#: Rows per list of an answer unless the call asks for more.
DEFAULT_ROWS = 20
#: Summaries kept (the most recently asked for).
SUMMARIES_KEPT = 8

TracePath = Annotated[str, Field(description="a trace directory, a trace file or a glob pattern: relative to the "
                                             "first root, or absolute (it must lie under a root)")]
Directory = Annotated[str | None, Field(description="a directory under a root to look in (default: every root)")]
SQLQuery = Annotated[str, Field(description="one SELECT (or WITH) query over the tables events, spans, steps, "
                                            "collectives, kernels, gpu, span_gpu, io")]
Threshold = Annotated[str, Field(description="relative change below which a figure is noise, such as 5%")]
Rows = Annotated[int, Field(ge=1, description="most rows of each list in the answer; a list cut short has a "
                                              "<list>_left_off beside it counting the rows left off")]

_INSTRUCTIONS = """\
Answers about dftrace traces (AI/ML training and inference pipelines) under {roots}.
Call list_runs first to find the trace directories, then summary on one of them; the
other tools answer one question each (steps, stragglers, dataloader, gpu, io, breakdown,
diff of two runs, sql over the trace tables, validate). A path is relative to {first}
or absolute under a root. Times are integer microseconds (fields ending in _us), shares
are fractions of 1 (_share, stall), _pct fields are percent; lists are cut to `limit`
rows, with <list>_left_off counting the rest."""


class Refused(ValueError):
    """A call the server does not answer (a path outside the roots, a query that reads files)."""


def capped(value: Any, limit: int) -> Any:
    """``value`` with each list of rows cut to ``limit`` items and ``<key>_left_off``
    beside it counting what was cut; lists of numbers (histogram bins) stay whole, and
    so do the lists of the same length beside them (their labels)."""
    if isinstance(value, list):
        return [capped(item, limit) for item in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    bins = {len(item) for item in value.values()
            if isinstance(item, list) and item and all(isinstance(x, (int, float)) for x in item)}
    for key, item in value.items():
        if (isinstance(item, list) and len(item) > limit and len(item) not in bins
                and not all(isinstance(x, (int, float)) for x in item)):
            out[key] = capped(item[:limit], limit)
            out[f"{key}_left_off"] = len(item) - limit
        else:
            out[key] = capped(item, limit)
    return out


def _plain(data: Any) -> Any:
    """``data`` as JSON has it (numpy numbers made Python ones), as ``--json`` prints it."""
    return orjson.loads(orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY))


class TraceAnswers:
    """The tools' answers about the traces under ``roots``."""

    def __init__(self, roots: Sequence[str]):
        if not roots:
            raise ValueError("dftrace mcp needs at least one --root")
        for root in roots:
            if not os.path.isdir(root):
                raise ValueError(f"--root {root!r} is not a directory")
        self.roots = list(dict.fromkeys(os.path.realpath(root) for root in roots))
        self._summaries: OrderedDict[tuple[Any, ...], dict[str, Any]] = OrderedDict()

    # --- paths ----------------------------------------------------------------------

    def _inside(self, given: str, path: str) -> str:
        """``path`` with symlinks and ``..`` resolved; Refused (naming ``given``, what the
        call said) when that lies outside every root."""
        real = os.path.realpath(path)
        if not any(os.path.commonpath([real, root]) == root for root in self.roots):
            leads = "" if real == given else f" (that is {real})"
            raise Refused(f"{given!r}{leads} is outside the roots this server reads: {', '.join(self.roots)}")
        return real

    def resolve(self, path: str) -> tuple[str, list[str]]:
        """``path`` made absolute (from the first root) with symlinks and ``..`` resolved,
        and the trace files it leads to; Refused when it or one of its files lies
        outside every root, FileNotFoundError when it leads to no trace file."""
        real = self._inside(path, os.path.join(self.roots[0], path))
        files = expand_paths([real])
        for file in files:
            self._inside(file, file)
        return real, files

    def resolve_directory(self, path: str) -> str:
        """``path`` resolved and checked like a trace path, without needing trace files there."""
        real = self._inside(path, os.path.join(self.roots[0], path))
        if not os.path.isdir(real):
            raise FileNotFoundError(f"{path!r} is not a directory" + ("" if os.path.exists(real) else
                                                                      ": it does not exist"))
        return real

    def _summary(self, path: str) -> tuple[str, dict[str, Any]]:
        """The summary of the traces at ``path`` as ``dftrace summary --json`` has it,
        kept while every file has the size and modification time it had."""
        real, files = self.resolve(path)
        key = (real, *((f, s.st_size, s.st_mtime_ns) for f in files for s in [os.stat(f)]))
        data = self._summaries.get(key)
        if data is None:
            data = _plain(summarize(real, progress=False))
            self._summaries[key] = data
            while len(self._summaries) > SUMMARIES_KEPT:
                self._summaries.popitem(last=False)
        self._summaries.move_to_end(key)
        return real, data

    # --- the tools ------------------------------------------------------------------

    def list_runs(self, path: Directory = None, limit: Rows = DEFAULT_ROWS) -> dict[str, Any]:
        """The directories under the roots (or under `path`) that hold trace files, most
        recently written first: path (absolute, for the other tools), files, bytes, and
        when the newest file was last written (UTC)."""
        where = [self.resolve_directory(path)] if path is not None else self.roots
        found: dict[str, None] = {}  # one root may hold another
        for top in where:
            try:
                found.update(dict.fromkeys(expand_paths([top])))
            except FileNotFoundError:
                continue
        by_directory: dict[str, list[os.stat_result]] = {}
        for file in found:
            try:
                self._inside(file, file)
            except Refused:  # a symlink to a trace outside the roots
                continue
            by_directory.setdefault(os.path.dirname(file), []).append(os.stat(file))
        runs = sorted(({"path": directory, "files": len(stats), "bytes": sum(s.st_size for s in stats),
                        "newest_mtime_ns": max(s.st_mtime_ns for s in stats)}
                       for directory, stats in by_directory.items()), key=lambda r: -r["newest_mtime_ns"])
        for run in runs:
            newest = datetime.fromtimestamp(run.pop("newest_mtime_ns") / 1e9, timezone.utc)
            run["modified_utc"] = newest.isoformat(timespec="seconds")
        return capped({"roots": self.roots, "runs": runs}, limit)

    def summary(self, path: TracePath, limit: Rows = DEFAULT_ROWS) -> dict[str, Any]:
        """What was read and how the run went: a one-line headline, the findings in words
        (separate runs, a resumed rank, the straggler) and the overview (files,
        processes, ranks, hosts, events, wall time, broken lines, dropped events, ...)."""
        real, data = self._summary(path)
        summary = Summary.from_dict(data)
        return capped({"path": real, "headline": "; ".join(headline(summary)), "findings": findings(summary),
                       "overview": data["overview"]}, limit)

    def steps(self, path: TracePath, limit: Rows = DEFAULT_ROWS) -> dict[str, Any]:
        """Step time over all ranks and steps (count of rank-steps, mean, p50, p95, max),
        the number of steps, the slowest steps (by their slowest rank) with the rank
        that was slowest, and the epochs."""
        real, data = self._summary(path)
        slowest = sorted(data["steps"], key=lambda s: s["max_us"], reverse=True)
        return capped({"path": real, "step_stats": data["step_stats"], "steps": Summary.from_dict(data).step_count(),
                       "slowest_steps": slowest, "epochs": data["epochs"]}, limit)

    def stragglers(self, path: TracePath, limit: Rows = DEFAULT_ROWS) -> dict[str, Any]:
        """Which rank held the others back in collectives, in words and as rows (worst
        first: wait caused, per step, steps held back, noise, compute per step), the
        collectives matched across ranks, and the slowest-vs-median rank per step."""
        real, data = self._summary(path)
        return capped({"path": real, "finding": straggler_lines(Summary.from_dict(data)),
                       "stragglers": data["stragglers"], "collectives": data["collectives"],
                       "imbalance": data["imbalance"]}, limit)

    def dataloader(self, path: TracePath, limit: Rows = DEFAULT_ROWS) -> dict[str, Any]:
        """Per data loader (each <leaf>.iter / <leaf>.block pair): items, time waiting for
        the next item (iter_us, p95, mean) against time using it (block_us), the stall
        share, and the same per rank, worst first."""
        real, data = self._summary(path)
        return capped({"path": real, "dataloader": data["dataloader"]}, limit)

    def gpu(self, path: TracePath, limit: Rows = DEFAULT_ROWS) -> dict[str, Any]:
        """GPU answers of PyTorch profiler traces: per rank and device the idle, compute
        and non-compute time, communication/computation overlap, idle time by cause and
        the top kernels; per step the GPU busy share and kernel time; per span the
        kernels it launched. Empty lists for traces without a profiler trace."""
        real, data = self._summary(path)
        return capped({"path": real, "gpu": data["gpu"], "gpu_steps": data["gpu_steps"],
                       "gpu_spans": data["gpu_spans"]}, limit)

    def io(self, path: TracePath, limit: Rows = DEFAULT_ROWS) -> dict[str, Any]:
        """Traced file I/O (POSIX and STDIO calls): bytes, calls and time by kind, request
        sizes, bandwidth, the time not hidden behind other work, I/O in data loading and
        checkpoints, per file, rank and step, and findings. Empty without I/O events."""
        real, data = self._summary(path)
        return capped({"path": real, "io": data["io"]}, limit)

    def breakdown(self, path: TracePath, limit: Rows = DEFAULT_ROWS) -> dict[str, Any]:
        """Where the time went: busy, exclusive and overlapped time per activity group
        (compute, data, communication, checkpoint, ...) with its share of the wall time,
        overall and per process; and per (category, name) the count, total, self time,
        mean, p50, p95 and max, most total time first."""
        real, data = self._summary(path)
        return capped({"path": real, "breakdown": data["breakdown"], "categories": data["categories"]}, limit)

    def diff(self, base: TracePath, new: TracePath, threshold: Threshold = "5%",
             limit: Rows = DEFAULT_ROWS) -> dict[str, Any]:
        """Two runs compared, BASE first, as `dftrace diff --json`: every figure (step
        p50/p95, epochs, per name, breakdown, stalls, stragglers, GPU, I/O) with both
        values, the change, a 95 % interval from the noise, and the metrics that moved
        beyond `threshold` (flagged, largest effect on step time first). A directory
        whose subdirectories hold the traces is several runs of its side."""
        from .answers.diff import compare_runs
        from .render.diff import parse_percent

        sides = []
        for side in (base, new):
            real, _ = self.resolve(side)
            sides.append([self.resolve(run)[0] for run in runs_in(real)])
        diff = compare_runs(sides[0], sides[1], threshold=parse_percent(threshold), progress=False)
        return capped(_plain(diff.to_dict()), limit)

    def sql(self, path: TracePath, query: SQLQuery,
            limit: Rows = 100) -> dict[str, Any]:
        """One SQL query (polars' dialect) over the traces' tables: events, spans, steps,
        collectives, kernels, gpu, span_gpu, io (`dftrace sql --help` lists their
        columns; durations and times are µs). Table functions that read files are refused."""
        from .answers.sql import FileFunctionError, query_error_text, reject_file_functions, result_json, run_sql

        try:
            reject_file_functions(query)
        except FileFunctionError as exc:
            raise Refused(f"the query names {exc.name}, a table function that reads files: this server "
                          "answers from the traces under its roots only") from None
        real, _ = self.resolve(path)
        broken: list[int] = []
        try:
            result = run_sql(query, [real], progress=False, broken=broken)
        except pl.exceptions.PolarsError as exc:
            raise Refused(f"in the query: {query_error_text(exc)}") from None
        shown = result.head(limit)
        answer = {"path": real, "columns": result.columns, "rows": orjson.loads(result_json(shown)),
                  "broken_lines": sum(broken)}
        if result.height > shown.height:
            answer["rows_left_off"] = result.height - shown.height
        return answer

    def validate(self, path: TracePath, strict: bool = False, limit: Rows = DEFAULT_ROWS) -> dict[str, Any]:
        """The trace format's rules checked on every file, as `dftrace validate --json`:
        per file its violations (line, rule, message) and, for a file cut off by a kill,
        what is still readable. `strict` counts a cut file as a violation."""
        real, files = self.resolve(path)
        report = []
        for file in files:
            torn: list[Any] = []
            row: dict[str, Any] = {"path": file, "violations": [v._asdict() for v in
                                                                violations_of(file, strict=strict, torn=torn)]}
            if torn:
                row["cut"] = str(torn[0])
            report.append(row)
        return capped({"path": real, "files": len(report), "failed": sum(bool(r["violations"]) for r in report),
                       "report": report}, limit)


#: The tools, in the order they are listed.
TOOLS = ("list_runs", "summary", "steps", "stragglers", "dataloader", "gpu", "io", "breakdown", "diff", "sql",
         "validate")


def build_server(answers: TraceAnswers) -> MCPServer:
    """The MCP server whose tools are ``answers``' methods named in :data:`TOOLS`,
    answering one call at a time."""
    server = MCPServer("dftrace", version=__version__, log_level="WARNING",
                       instructions=_INSTRUCTIONS.format(roots=", ".join(answers.roots), first=answers.roots[0]))
    one_at_a_time = threading.Lock()
    for name in TOOLS:
        method = getattr(answers, name)
        server.add_tool(_tool(method, one_at_a_time), name=name, description=inspect.getdoc(method),
                        annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    return server


def _tool(method: Callable[..., dict[str, Any]], lock: threading.Lock) -> Callable[..., CallToolResult]:
    """``method`` as a tool: its answer as compact JSON text and as structured content;
    an answer it cannot give (refused, no such file, bad query) as an error result
    whose text says why."""

    @functools.wraps(method)
    def call(**arguments: Any) -> CallToolResult:
        try:
            with lock:
                answer = method(**arguments)
        except (OSError, ValueError) as exc:
            raise ToolError(str(exc)) from None
        return CallToolResult(content=[TextContent(type="text", text=orjson.dumps(answer).decode())],
                              structured_content=answer)

    return call


def serve(roots: Sequence[str]) -> int:
    """Answer MCP requests on stdin/stdout until the client closes them (``dftrace mcp``)."""
    server = build_server(TraceAnswers(roots))
    try:
        server.run("stdio")
    except KeyboardInterrupt:
        pass
    return 0
