"""The answers: turning combined aggregates into a :class:`Summary`.

A Summary is plain data (dicts, lists, numbers) so it serialises to JSON as is;
the terminal table, ``--json`` and the HTML report all render from it. Times are
integer microseconds. Percentiles use the nearest-rank method: p95 is the smallest
value with at least 95 % of the observations at or below it. Those of steps are
exact; those of span durations (categories, data-loader waits) come from a
mergeable sketch (``reduce.sketch``): exact below ``EXACT_BELOW_US``, within
``RELATIVE_ERROR`` above, as the overview states.
"""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import orjson
import polars as pl

from ... import format as fmt
from ..reduce.aggregate import aggregate, aggregate_partitions
from ..reduce.combine import Combined, combine
from ..reduce.partial import Partial, without_row_keys
from ..read.partition_data import PartitionData
from .durations import category_rows, dataloader_rows, distribution_rows
from ..runtime import kernels
from ..runtime.executor import default_executor
from ..runtime.heap import hand_back, heap_for_answers
from ..runtime.progress import phase
from ..reduce.index import file_identity, load_partials, store_partials
from ..reduce.io_tables import ARG_COLUMNS as IO_ARG_COLUMNS, IO_CATS
from .io import io_answers
from .gpu import dftrace_files_with_gpu, gpu_answers, gpu_by_span, gpu_steps
from ..read.kineto import activity_schema
from ..read.schema import EVENT_COLUMNS, HOST_KEY, SUMMARY_COLUMNS
from ..reduce.sketch import EXACT_BELOW_US, RELATIVE_ERROR
from ..read.sources import DEFAULT_PARTITION_BYTES, Partition, expand_paths, plan_partitions
from ..reduce.steps import time_in_steps
from .stragglers import analyse, match_collectives
from ..read.parquet import resolved_records
from ..read.trace import PathsLike, TraceTable, as_path_list, load_traces, require_content
from .breakdown import time_breakdown
from .runs import clock_steps, last_run_of_each_step, say_where_resumed
from .units import count_of, format_us
from .steps import (RANK_STEPS_LIMIT, UnitSteps, epoch_rows, epoch_source, rank_imbalance, rank_step_rows, rounded_rows,
                    step_statistics, steps_across_units, steps_of, unit_extents)


@dataclass
class Summary:
    """Everything ``dftrace summary`` and ``dftrace report`` show, as plain data."""

    #: Files, processes, ranks, hosts, events, time span, broken lines, ...
    overview: dict[str, Any]
    #: Per input file: lines, events, broken lines (first ones with reasons), cut-off.
    files: list[dict[str, Any]]
    #: Per process (rank order): label, rank, host, pid, time span, spans, dropped, and how
    #: it ended when the trace says (``ended``: "killed by signal 9"; None when finalized).
    processes: list[dict[str, Any]]
    #: Per (category, name): count, total, self time (``self_us``: the time its spans
    #: were the innermost on their thread), mean, min, p50, p95, max, and the standard
    #: deviation of the durations (``std_us``; None for a single span).
    categories: list[dict[str, Any]]
    #: Per epoch: ranks, steps, slowest rank and its time, median rank time.
    epochs: list[dict[str, Any]]
    #: Ranks the others waited for in collectives, worst first (empty for one rank):
    #: rank, host, last_arrivals, caused_wait_us, compute_us_per_step, held_steps, ...
    stragglers: list[dict[str, Any]]
    #: Collectives matched across ranks: count, arrival skew, the worst ones.
    collectives: dict[str, Any]
    #: Separate runs found among the files (clock anchors far apart, other hosts and
    #: command lines); empty when the files are of one run.
    runs: list[dict[str, Any]]
    #: Per (epoch, step): ranks, min/median/max step time, slowest rank, max/median.
    steps: list[dict[str, Any]]
    #: Step times over all ranks and steps: count, mean, p50, p95, max.
    step_stats: dict[str, Any]
    #: Per (rank, epoch, step): start (from its run's start), duration, wait in collectives.
    rank_steps: list[dict[str, Any]]
    #: True when ``rank_steps`` keeps a subset of the steps (RANK_STEPS_LIMIT; how, in
    #: ``rank_steps_thinned``).
    rank_steps_sampled: bool
    #: Busy, exclusive and overlapped time per activity group, overall and per process.
    breakdown: dict[str, Any]
    #: Per ``<leaf>.iter``/``<leaf>.block`` pair: time waiting for items vs using them.
    dataloader: list[dict[str, Any]]
    #: Slowest vs median rank per step.
    imbalance: dict[str, Any]
    #: Duration histograms (log-spaced bins) of the names with the most total time.
    distributions: list[dict[str, Any]]
    #: Per (rank, device) of PyTorch profiler traces: GPU idle/compute/non-compute
    #: time, communication/computation overlap, idle time by cause, top kernels.
    gpu: list[dict[str, Any]]
    #: Per step of each process with dftrace steps and a PyTorch profiler trace of its
    #: GPU: GPU busy share, GPU time of the kernels launched in the step, host time
    #: in calls waiting for the GPU (sync_wait_us), the clock join's error bound.
    gpu_steps: list[dict[str, Any]]
    #: Per (cat, name) of dftrace's spans in processes with a profiler trace: spans, the
    #: kernels launched inside them and those kernels' GPU time, most GPU time first.
    gpu_spans: list[dict[str, Any]] = field(default_factory=list)
    #: Traced file I/O (cat POSIX and STDIO; see ``answers.io``): bytes, calls and time by
    #: kind, sizes, shares, per file, rank and step, in data loading and checkpoints,
    #: findings; empty without I/O events.
    io: dict[str, Any] = field(default_factory=dict)
    #: How ``rank_steps`` was thinned when it keeps a subset: every Nth step (``every``)
    #: of all ``steps``, and the ``slowest`` steps (by their slowest rank) besides;
    #: empty when it keeps every rank-step.
    rank_steps_thinned: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict."""
        return asdict(self)

    def __repr__(self) -> str:
        """One line: what was read, the steps, and the straggler if one stands out
        (the whole answer is ``to_dict()``; in a notebook the tables show)."""
        return f"<Summary: {'; '.join(headline(self))}>"

    def _repr_html_(self) -> str:
        """The headline and the main tables, for Jupyter."""
        return _summary_html(self)

    def to_json(self, indent: bool = True) -> str:
        """The summary as JSON text."""
        return self.to_json_bytes(indent).decode()

    def to_json_bytes(self, indent: bool = True) -> bytes:
        """The summary as JSON text, UTF-8 encoded."""
        option = orjson.OPT_INDENT_2 if indent else 0
        # The dataclass itself, not a deep copy of it (the answers of a long run are big).
        return orjson.dumps(self, option=option | orjson.OPT_SERIALIZE_NUMPY)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Summary:
        """Rebuild a summary from :meth:`to_dict` / ``dftrace summary --json`` output
        (fields an older version did not write come back empty)."""
        return cls(**{f.name: data[f.name] if f.name in data else _empty_field(f.type) for f in fields(cls)})


def _empty_field(annotation: Any) -> Any:
    return [] if str(annotation).startswith("list") else {}


def summarize(
    source: PathsLike | TraceTable,
    *,
    executor: Any = None,
    partition_bytes: int = DEFAULT_PARTITION_BYTES,
    progress: bool | None = None,
    index: bool = True,
) -> Summary:
    """Summarise trace files (or an already loaded :class:`TraceTable`).

    Files are cut into partitions; each is parsed and reduced to partial aggregates
    where it is read (a thread here, or a Dask worker with a :class:`DaskExecutor`),
    and the partials are combined exactly here. Only the columns the summary needs
    are decoded. With ``index``, the partials of each file are kept in the index
    (see ``reduce.index``) and taken from there while the file is unchanged.
    """
    if isinstance(source, TraceTable):
        combined = combine([_partial_of_trace(source)])
        combined.files = list(source.files)
        summary = build_summary(combined)
        if set(_SPAN_COLUMNS) <= set(source.events.columns):
            summary.gpu_spans = gpu_by_span(source.events.filter(_user_spans),
                                            combined.activity, combined.resolution)
        return summary
    skipped: list[str] = []
    partials = _partials(expand_paths(as_path_list(source), skipped), executor, partition_bytes, progress, index)
    require_content([p.source for p in partials], sum(p.events for p in partials))
    with phase("combining the parts", progress):
        combined = combine(partials)
    del partials  # the per-partition tables are merged: free them before the answers are built
    with phase("building the answers", progress), heap_for_answers():
        summary = build_summary(combined)
    summary.overview["skipped_files"] = skipped
    # Spans are not kept by the aggregates: those of processes with a profiler trace
    # beside their dftrace trace are read again for the per-span GPU time.
    files = dftrace_files_with_gpu(combined.activity, combined.resolution)
    if files:
        spans = load_traces(files, columns=_SPAN_COLUMNS, executor=executor, partition_bytes=partition_bytes,
                            progress=progress).events.filter(_user_spans)
        summary.gpu_spans = gpu_by_span(spans, combined.activity, combined.resolution)
    return summary


_SPAN_COLUMNS = ["pid", "tid", "cat", "name", "ph", "ts", "dur"]
#: Complete events but the traced I/O calls.
_user_spans = (pl.col("ph") == fmt.PH_COMPLETE) & ~pl.col("cat").is_in(IO_CATS).fill_null(False)


def _partials(files: list[str], executor: Any, partition_bytes: int, progress: bool | None,
              index: bool) -> list[Partial]:
    """The partials of ``files``, in file order: from the index where it holds those of
    an unchanged file, else read (and then kept in the index)."""
    known = {path: [without_row_keys(p) for p in load_partials(path, partition_bytes) or []] or None
             for path in files} if index else {}
    unread = [path for path in files if known.get(path) is None]
    identities = {path: file_identity(path) for path in unread} if index else {}
    plan = plan_partitions(unread, partition_bytes)
    read: dict[str, list[Partial]] = {}
    for partial in default_executor(executor).map_stream(aggregate_partitions, plan, progress=progress,
                                                           desc=f"reading {count_of(len(unread), 'file')}"):
        read.setdefault(partial.source.partition.path, []).append(without_row_keys(partial))
    for path, partials in read.items() if index else ():
        store_partials(path, identities[path], partition_bytes, partials)
    return [p for path in files for p in (known.get(path) or read.get(path, []))]


def _partial_of_trace(trace: TraceTable) -> Partial:
    """View an in-memory trace as one partition, so it takes the same path."""
    events = trace.events.select(
        *[
            pl.col(c) if c in trace.events.columns else pl.lit(None, EVENT_COLUMNS[c]).alias(c)
            for c in SUMMARY_COLUMNS
        ],
        pl.col("host").fill_null("").alias(HOST_KEY),
        *[_arg_of(trace.events, column, key, dtype) for column, (key, dtype) in IO_ARG_COLUMNS.items()],
    )
    meta = resolved_records(trace.processes.iter_rows(named=True), trace.meta.iter_rows(named=True))
    activity = None
    if trace.activity is not None:
        activity = trace.activity.select(*activity_schema(), "file", pl.col("host").fill_null("").alias(HOST_KEY))
    return aggregate(PartitionData(Partition("<memory>"), events, meta=meta, activity=activity))


def _arg_of(events: pl.DataFrame, column: str, key: str, dtype: pl.DataType) -> pl.Expr:
    """Column ``column`` of a loaded trace: as loaded, else read from its args text."""
    if column in events.columns:
        return pl.col(column).cast(dtype, strict=False)
    if "args" in events.columns:
        return pl.col("args").str.json_path_match(f"$.{key}").cast(dtype, strict=False).alias(column)
    return pl.lit(None, dtype).alias(column)


# --- building ------------------------------------------------------------------------


def build_summary(combined: Combined, *, rank_steps_limit: int | None = None,
                  steps: UnitSteps | None = None) -> Summary:
    """Compute every answer from combined aggregates (``rank_steps`` keeps at most
    ``rank_steps_limit`` rows, by default RANK_STEPS_LIMIT). The whole files' steps
    are taken over: ``combined.modelled`` is None afterwards. ``steps``: those
    :func:`steps_of` found in ``combined``, where the caller kept only some of them
    (the steps a live view shows); by default all of them."""
    found = steps_of(combined) if steps is None else steps
    # The whole files' steps (the largest table) are held by the steps found alone from
    # here, and each table below is let go once the answers that read it are built.
    combined.modelled = None
    procs, runs = found.procs, found.runs
    epochs = epoch_rows(unit_extents(epoch_source(combined), procs, ["epoch"]), found.process_steps)
    gpu_per_step = gpu_steps(combined.activity, found.process_steps, combined.resolution)
    io = io_answers(combined, found.process_steps)
    steps_by_unit = found.by_unit()
    # Each process's steps are used: only the units' are read from here, and the
    # pages of the whole files' steps go back to the system.
    del found
    hand_back()
    units = {unit: (rank, host) for unit, rank, host in
             procs.filter(pl.col("unit").is_not_null()).select("unit", "rank", "host").unique("unit").iter_rows()}
    # Each rank-step's compute and blocked time: found as its file was read where the
    # rank's steps are one process's (``with_step_times``), plus that of the intervals kept.
    compute_us = pl.col("compute_us").fill_null(0) + pl.Series(time_in_steps(combined.compute, procs, steps_by_unit))
    compute = dict(steps_by_unit.select("unit", compute_us).group_by("unit").agg(pl.col("compute_us").sum())
                   .iter_rows())
    # The blocked time stays a column of the steps, row by row: the time each rank-step
    # waited, without a join of every rank-step to put it back beside its step.
    blocked_us = (pl.col("blocked_us").fill_null(0)
                  + pl.Series(time_in_steps(combined.blocked, procs, steps_by_unit))).alias("blocked_us")
    steps_by_unit = steps_by_unit.select("unit", "unit_order", "epoch", "step", "start", "dur", blocked_us)
    # Ranks are compared step by step on each rank's last run of the step: a step a
    # resumed job ran again is one step of the job, not another rank.
    compared = last_run_of_each_step(steps_by_unit, procs, runs)
    steps = steps_across_units(compared)
    stragglers, collectives = analyse(
        match_collectives(combined.collectives, procs), compared,
        compared.select("unit", "epoch", "step", pl.col("blocked_us").alias("us")), compute, units
    )
    limit = RANK_STEPS_LIMIT if rank_steps_limit is None else rank_steps_limit
    rank_steps, thinned = rank_step_rows(steps_by_unit, steps.select("epoch", "step"), runs, procs, limit)
    step_stats, imbalance = step_statistics(steps_by_unit), rank_imbalance(compared, steps)
    say_where_resumed(runs, procs, steps_by_unit)
    del steps_by_unit, compared
    gpu = gpu_answers(combined.activity, combined.resolution)
    overview = _overview(combined, procs, runs)
    if not gpu and combined.activity is not None and combined.activity.height:
        # PyTorch profiler traces with no kernel in them: a CPU-only window.
        overview["profiler_files_without_gpu"] = combined.activity.get_column("file").n_unique()
    return Summary(
        overview=overview,
        files=[_file_dict(f) for f in combined.files],
        processes=_process_rows(combined, procs),
        categories=category_rows(combined.durations, combined.self_times),
        epochs=epochs,
        stragglers=stragglers,
        collectives=collectives,
        runs=runs,
        steps=rounded_rows(steps),
        step_stats=step_stats,
        rank_steps=rank_steps,
        rank_steps_sampled=bool(thinned),
        rank_steps_thinned=thinned,
        breakdown=time_breakdown(combined, procs),
        dataloader=dataloader_rows(combined.durations, procs),
        imbalance=imbalance,
        distributions=distribution_rows(combined.durations),
        gpu=gpu,
        gpu_steps=gpu_per_step,
        io=io,
    )


def _overview(combined: Combined, procs: pl.DataFrame, runs: list[dict[str, Any]]) -> dict[str, Any]:
    extents = combined.extents
    start = extents.get_column("start").min() if extents.height else None
    end = extents.get_column("end").max() if extents.height else None
    if runs:  # files of separate runs: the longest job's time, never the gap between them
        jobs: dict[int, tuple[int, int]] = {}
        for run in runs:  # a resumed run is of the job of the run before it
            first, last = jobs.get(run["job"], (run["start_us"], run["end_us"]))
            jobs[run["job"]] = (min(first, run["start_us"]), max(last, run["end_us"]))
        start, end = max(jobs.values(), key=lambda extent: extent[1] - extent[0])
    phases = dict(combined.phases.sort("ph").iter_rows())
    return {
        "files": len(combined.files),
        "partitions": combined.partitions,
        "kernels": kernels.name(),
        "processes": procs.height,
        "ranks": procs.get_column("rank").drop_nulls().n_unique(),
        "hosts": procs.get_column("host").n_unique(),
        "events": int(sum(phases.values())),
        "spans": int(extents.get_column("n").sum()) if extents.height else 0,
        "events_by_phase": {k: int(v) for k, v in phases.items()},
        "start_us": start,
        "end_us": end,
        "wall_us": (end - start) if start is not None else 0,
        "runs": max(len(runs), 1) if start is not None else 0,
        "broken_lines": sum(f.broken_count for f in combined.files),
        "cut_off_files": sum(1 for f in combined.files if f.cut_off),
        "unfinished_files": sum(1 for f in combined.files if not f.closed),
        "incomplete_spans": int(extents.get_column("incomplete").sum()) if extents.height else 0,
        "dropped_events": int(procs.get_column("dropped").sum()),
        "ended_abnormally": sum(p.ended is not None for p in combined.resolution.processes),
        "clock_steps": [{k: step[k] for k in ("host", "pid", "step_us")}
                        for step in clock_steps(combined.resolution.processes)],
        # Span-duration percentiles come from a sketch: exact below the first figure,
        # within the relative error above it (counts, totals, means, extremes exact).
        "duration_percentiles": {"exact_below_us": EXACT_BELOW_US, "relative_error": RELATIVE_ERROR},
    }


def _file_dict(report: Any) -> dict[str, Any]:
    out = asdict(report)
    out["broken"] = [{"line": n, "reason": r} for n, r in report.broken]
    return out


def _process_rows(combined: Combined, procs: pl.DataFrame) -> list[dict[str, Any]]:
    joined = procs.join(combined.extents, on="proc", how="left").sort("proc")
    ended = [p.ended for p in combined.resolution.processes]
    return [
        {
            "label": r["label"], "rank": r["rank"], "host": r["host"], "pid": r["pid"],
            "start_us": r["start"], "end_us": r["end"],
            "wall_us": (r["end"] - r["start"]) if r["start"] is not None else 0,
            "spans": r["n"] or 0, "incomplete": r["incomplete"] or 0, "dropped": r["dropped"],
            "ended": ended[r["proc"]],
        }
        for r in joined.iter_rows(named=True)
    ]


# --- as a notebook shows it ------------------------------------------------------------

def headline(s: Summary) -> list[str]:
    """The summary in a few phrases: what was read, the steps, the straggler if one
    stands out (``Summary``'s one-line form and the MCP server's headline)."""
    o = s.overview
    events = o.get("events", 0)
    ranks = f"{count_of(o['ranks'], 'rank')}, " if o.get("ranks") else ""
    processes = count_of(o.get("processes", 0), "process", "processes")
    parts = [f"{processes} ({ranks}{count_of(o.get('hosts', 0), 'host')}), "
             f"{events:,} event{'' if events == 1 else 's'} over {format_us(o.get('wall_us'))}"]
    if s.step_stats:
        parts.append(f"{s.step_stats['count']} steps, median {format_us(s.step_stats['p50_us'])}")
    held = [r for r in s.stragglers if r.get("significant")]
    if held:
        parts.append(f"{held[0]['unit']} holds the others back "
                     f"({format_us(held[0]['caused_wait_us_per_step'])} per step)")
    return parts


def _html_table(title: str, headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<h4>{html.escape(title)}</h4><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _summary_html(s: Summary) -> str:
    parts = [f"<p><b>{html.escape('; '.join(headline(s)))}</b></p>"]
    if s.step_stats:
        st = s.step_stats
        parts.append(_html_table("Steps", ["steps", "p50", "p95", "mean", "max"], [[
            st["count"], format_us(st["p50_us"]), format_us(st["p95_us"]), format_us(st["mean_us"]),
            format_us(st["max_us"])]]))
    top = sorted(s.categories, key=lambda c: -c["total_us"])[:10]
    if top:
        parts.append(_html_table("Where the time went (top 10 by total time)",
                                 ["category", "name", "count", "total", "p50", "p95", "self"],
                                 [[c["cat"], c["name"], c["count"], format_us(c["total_us"]), format_us(c["p50_us"]),
                                   format_us(c["p95_us"]), format_us(c.get("self_us"))] for c in top]))
    if s.stragglers:
        parts.append(_html_table("Ranks that held the others back", ["rank", "held steps", "wait caused / step",
                                                                     "significant"],
                                 [[r["unit"], f"{r['held_steps']} of {r['steps']}",
                                   format_us(r["caused_wait_us_per_step"]), "yes" if r["significant"] else "no"]
                                  for r in s.stragglers[:8]]))
    return "<div class='dftrace-summary'>" + "".join(parts) + "</div>"

