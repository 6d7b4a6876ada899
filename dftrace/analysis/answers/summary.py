"""The answers: turning combined aggregates into a :class:`Summary`.

A Summary is plain data (dicts, lists, numbers) so it serialises to JSON as is;
the terminal table, ``--json`` and the HTML report all render from it. Times are
integer microseconds. Percentiles use the nearest-rank method: p95 is the smallest
value with at least 95 % of the observations at or below it. Those of steps are
exact; those of span durations (categories, data-loader waits) come from a
mergeable sketch (``_sketch``): exact below ``EXACT_BELOW_US``, within
``RELATIVE_ERROR`` above, as the overview states.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
import orjson
import polars as pl
import polars.selectors as cs

from ... import format as fmt
from ..reduce.aggregate import (Combined, Partial, aggregate, aggregate_partitions, combine,
                         without_row_keys)
from ..reduce.busy import GROUPS
from ..read.decode import PartitionData
from .durations import category_rows, dataloader_rows, distribution_rows
from ..runtime.executor import default_executor
from ..runtime.heap import hand_back, heap_for_answers
from ..reduce.index import file_identity, load_partials, store_partials
from ..reduce.io_tables import ARG_COLUMNS as IO_ARG_COLUMNS, IO_CATS
from .io import io_answers
from .gpu import dftrace_files_with_gpu, gpu_answers, gpu_by_span, gpu_steps
from ..read.kineto import activity_schema
from ..read.schema import EVENT_COLUMNS, HOST_KEY, SUMMARY_COLUMNS
from ..reduce.sketch import EXACT_BELOW_US, RELATIVE_ERROR
from ..read.sources import DEFAULT_PARTITION_BYTES, Partition, expand_paths, plan_partitions
from ..reduce.steps import (STEP_TIME_SCHEMA, model_steps, step_spread, time_in_steps, unit_steps,
                             without_profiler_steps)
from .stragglers import analyse, match_collectives
from ..read.parquet import resolved_records
from ..read.trace import PathsLike, TraceTable, as_path_list, load_traces, require_content

T = TypeVar("T")

#: How many (unit, step) rows the summary keeps for the per-rank step timeline;
#: beyond this, evenly spaced steps are kept (all ranks of each kept step).
RANK_STEPS_LIMIT = 20_000


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
    #: True when ``rank_steps`` keeps a subset of the steps (RANK_STEPS_LIMIT).
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
    #: Traced file I/O (cat POSIX and STDIO; see ``_io``): bytes, calls and time by
    #: kind, sizes, shares, per file, rank and step, in data loading and checkpoints,
    #: findings; empty without I/O events.
    io: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict."""
        return asdict(self)

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
    (see ``_index``) and taken from there while the file is unchanged.
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
    combined = combine(partials)
    del partials  # the per-partition tables are merged: free them before the answers are built
    with heap_for_answers():
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
                                                           desc="summarising"):
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


@dataclass
class UnitSteps:
    """The processes with the unit (rank) each belongs to, the runs, and the steps."""

    #: proc, label, rank, host, pid, dropped, unit, unit_order, run
    procs: pl.DataFrame
    runs: list[dict[str, Any]]
    #: Each process's steps (see ``model_steps``).
    process_steps: pl.DataFrame

    def by_unit(self) -> pl.DataFrame:
        """Each unit's steps (see ``unit_steps``): what the answers and ``dftrace sql``'s
        steps view are built on."""
        return unit_steps(self.process_steps, self.procs)


def steps_of(combined: Combined) -> UnitSteps:
    """Units, runs and steps of combined aggregates."""
    procs = _processes_frame(combined)
    runs = find_runs(combined, procs)
    procs = _units_per_run(procs, runs)
    process_steps = model_steps(without_profiler_steps(combined.steps), combined.containers).with_columns(
        pl.lit(None, dtype).alias(name) for name, dtype in STEP_TIME_SCHEMA.items())
    modelled = combined.modelled
    if modelled is not None and modelled.height:  # whole files' steps, modelled as read (held narrow)
        process_steps = (pl.concat([process_steps, modelled], how="vertical_relaxed") if process_steps.height
                         else modelled)
    # A step that carries no epoch is in the epoch whose span it starts in (a loop
    # numbered by ``.iter()`` alone): every table then shows the same epochs.
    process_steps = _steps_in_epochs(process_steps, _epoch_source(combined))
    return UnitSteps(procs, runs, process_steps)


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
    epochs = _epochs(_unit_extents(_epoch_source(combined), procs, ["epoch"]), found.process_steps)
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
    compared = _last_run_of_each_step(steps_by_unit, procs, runs)
    steps = _steps(compared)
    stragglers, collectives = analyse(
        match_collectives(combined.collectives, procs), compared,
        compared.select("unit", "epoch", "step", pl.col("blocked_us").alias("us")), compute, units
    )
    limit = RANK_STEPS_LIMIT if rank_steps_limit is None else rank_steps_limit
    rank_steps, sampled = _rank_steps(steps_by_unit, steps.select("epoch", "step"), runs, procs, limit)
    step_stats, imbalance = _step_stats(steps_by_unit), _imbalance(compared, steps)
    _say_where_resumed(runs, procs, steps_by_unit)
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
        steps=_rows(steps),
        step_stats=step_stats,
        rank_steps=rank_steps,
        rank_steps_sampled=sampled,
        breakdown=_breakdown(combined, procs),
        dataloader=dataloader_rows(combined.durations, procs),
        imbalance=imbalance,
        distributions=distribution_rows(combined.durations),
        gpu=gpu,
        gpu_steps=gpu_per_step,
        io=io,
    )


def _rows(frame: pl.DataFrame) -> list[dict[str, Any]]:
    """Rows as dicts, floats rounded to 3 decimals for readable JSON."""
    return frame.with_columns(cs.float().round(3)).to_dicts()


def _processes_frame(combined: Combined) -> pl.DataFrame:
    """proc -> label, rank, host, pid, and the unit steps are compared by.

    Ranks are the units when any process has one (processes without a rank, such
    as helpers, are then left out of step comparisons); otherwise each process is.
    """
    processes = combined.resolution.processes
    any_rank = any(p.rank is not None for p in processes)
    rows = []
    for i, p in enumerate(processes):
        if any_rank:
            unit = f"rank {p.rank}" if p.rank is not None else None
            order = p.rank if p.rank is not None else None
        else:
            unit, order = p.label, i
        rows.append(
            {"proc": i, "label": p.label, "rank": p.rank, "host": p.host, "pid": p.pid,
             "dropped": p.dropped, "unit": unit, "unit_order": order}
        )
    return pl.DataFrame(
        rows,
        schema={"proc": pl.Int32, "label": pl.String, "rank": pl.Int32, "host": pl.String,
                "pid": pl.Int64, "dropped": pl.Int64, "unit": pl.String, "unit_order": pl.Int64},
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


def _slowest() -> pl.Expr:
    # The unit with the longest time; ties go to the lowest rank.
    return pl.col("unit").sort_by(["dur", "unit_order"], descending=[True, False]).first()


def _unit_extents(frame: pl.DataFrame, procs: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Extents per (unit, *by): a rank's processes together, start to end."""
    units = procs.filter(pl.col("unit").is_not_null()).select("proc", "unit", "unit_order")
    joined = frame.join(units, on="proc", how="inner")
    return (
        joined.group_by(["unit", "unit_order", *by])
        .agg(pl.col("start").min(), pl.col("end").max(), pl.col("n").sum())
        .with_columns((pl.col("end") - pl.col("start")).alias("dur"))
    )


def nearest_rank(ordered: Sequence[T], q: float) -> T | None:
    """The q-quantile of sorted values by the nearest-rank method, as the summary's
    percentiles are: the smallest value with at least q of them at or below it; None
    for no values. :func:`_nearest_rank` is the same within a group of a frame."""
    if not ordered:
        return None
    return ordered[max(1, math.ceil(len(ordered) * q - 1e-9)) - 1]


def _nearest_rank(q: float) -> pl.Expr:
    """The q-quantile of ``dur`` within a group, by the nearest-rank method."""
    # The small epsilon keeps q * n from rounding up past an exact integer.
    rank = (pl.len() * q - 1e-9).ceil().cast(pl.Int64).clip(lower_bound=1) - 1
    return pl.col("dur").sort().gather(rank).first()


def _median_expr() -> pl.Expr:
    # Nearest-rank median (the lower middle value), like the percentiles.
    return _nearest_rank(0.5)


def _steps(by_unit: pl.DataFrame) -> pl.DataFrame:
    """Per (epoch, step): ranks, start, min/median/max time, slowest rank, max/median."""
    compared = step_spread(by_unit)
    if compared is None:
        compared = by_unit.group_by(["epoch", "step"]).agg(
            pl.len().alias("ranks"),
            pl.col("start").min().alias("start_us"),
            pl.col("dur").min().alias("min_us"),
            _median_expr().alias("median_us"),
            pl.col("dur").max().alias("max_us"),
            _slowest().alias("slowest"),
        )
    return (
        compared.with_columns(
            pl.when(pl.col("median_us") > 0).then(pl.col("max_us") / pl.col("median_us")).alias("imbalance")
        )
        .sort(["epoch", "step"], nulls_last=True)
    )


def _plain_stats() -> list[pl.Expr]:
    """count, total, min, max, mean, p50, p95 of ``dur`` (one value per row)."""
    return [
        pl.len().alias("count"),
        pl.col("dur").sum().alias("total_us"),
        pl.col("dur").min().alias("min_us"),
        pl.col("dur").max().alias("max_us"),
        pl.col("dur").mean().alias("mean_us"),
        _nearest_rank(0.5).alias("p50_us"),
        _nearest_rank(0.95).alias("p95_us"),
    ]


def _step_stats(by_unit: pl.DataFrame) -> dict[str, Any]:
    if not by_unit.height:
        return {}
    return _rows(by_unit.select(_plain_stats()))[0]


def _rank_steps(by_unit: pl.DataFrame, keys: pl.DataFrame, runs: list[dict[str, Any]],
                procs: pl.DataFrame, limit: int) -> tuple[list[dict[str, Any]], bool]:
    """``keys``: the (epoch, step) of ``by_unit``, each once, in order; the wait of a
    rank-step is its ``blocked_us``."""
    if not by_unit.height:
        return [], False
    sampled = by_unit.height > limit
    frame = by_unit
    if sampled:
        per_step = max(1, by_unit.height // keys.height)
        keep = max(1, limit // per_step)
        kept = keys.gather_every(math.ceil(keys.height / keep))
        # The rank-steps of the kept step numbers first (a mask, where a join of every
        # rank-step held 60 MB more for 1.25M of them), then those of their epochs.
        frame = by_unit.filter(pl.col("step").is_in(kept.get_column("step").implode(), nulls_equal=True)).join(
            kept, on=["epoch", "step"], how="semi", nulls_equal=True)
    origin = _run_origins(runs, procs, frame)
    rows = frame.sort(["epoch", "step", "unit_order"], nulls_last=True).select(
        pl.col("unit").alias("rank"), "epoch", "step",
        (pl.col("start") - origin).alias("start_us"), pl.col("dur").alias("dur_us"),
        pl.col("blocked_us").alias("wait_us"),
    )
    return rows.to_dicts(), sampled


def _run_origins(runs: list[dict[str, Any]], procs: pl.DataFrame, frame: pl.DataFrame) -> pl.Expr:
    """The start of each unit's run (of the whole trace when it is one run)."""
    if not runs:
        return pl.lit(frame.get_column("start").min() if frame.height else 0)
    start_of = {}
    for run in runs:
        for proc in run["procs"]:
            start_of[proc] = run["start_us"]
    units = procs.filter(pl.col("unit").is_not_null()).select("unit", "proc")
    mapping = {unit: start_of.get(proc, 0) for unit, proc in units.iter_rows()}
    return pl.col("unit").replace_strict(mapping, default=0, return_dtype=pl.Int64)


def _units_per_run(procs: pl.DataFrame, runs: list[dict[str, Any]]) -> pl.DataFrame:
    """procs with a ``run`` column; a unit found in several runs (rank 0 of each) is
    split into one per run ("rank 0 · run 2"), so steps and collectives never mix runs."""
    if not runs:
        return procs.with_columns(pl.lit(0, pl.Int32).alias("run"))
    run_of = {proc: i for i, run in enumerate(runs) for proc in run["procs"]}
    procs = procs.with_columns(pl.col("proc").replace_strict(run_of, default=0, return_dtype=pl.Int32).alias("run"))
    shared = pl.col("run").n_unique().over("unit") > 1
    return procs.with_columns(
        pl.when(shared).then(pl.col("unit") + pl.lit(" · run ") + (pl.col("run") + 1).cast(pl.String))
        .otherwise(pl.col("unit")).alias("unit"),
        pl.when(shared).then(pl.col("unit_order") + pl.col("run").cast(pl.Int64) * 1_000_000)
        .otherwise(pl.col("unit_order")).alias("unit_order"),
    )


def find_runs(combined: Combined, procs: pl.DataFrame) -> list[dict[str, Any]]:
    """Separate runs among the files, or [] when they are one run.

    Files belong to one run when their times overlap (with a minute of slack); a
    gap between groups of files means separate runs, which usually also shows as
    other hosts and command lines.
    """
    info = combined.resolution.processes
    # Times of a process started after the wall clock was stepped, put back on its
    # parent's clock: one job, whatever the wall clock did.
    shift = {path: step["shift_us"] for step in clock_steps(info) for path in info[step["proc"]].files}
    files = combined.file_extents
    if shift:
        shifted = pl.col("path").replace_strict(shift, default=0, return_dtype=pl.Int64)
        files = files.with_columns(pl.col("start") + shifted, pl.col("end") + shifted)
    files = files.sort("start")
    if files.height < 2:
        return []
    rank_of = _launched_ranks(info)
    groups: list[list[tuple[str, int, int, str]]] = []
    resumed: list[bool] = []
    reach = None
    #: rank -> (pid, end) of the process that ran it in the current run
    ranks_here: dict[int, tuple[int, int]] = {}
    for path, start, end, command in files.iter_rows():
        owner = rank_of.get(path)
        if reach is None or start > reach + RUN_GAP_US:
            groups.append([])
            resumed.append(False)
            ranks_here = {}
            reach = end
        elif owner is not None and owner[0] in ranks_here and ranks_here[owner[0]][0] != owner[1] \
                and ranks_here[owner[0]][1] <= start:
            # A rank run again by another process after the first ended: the job was
            # started again (torchrun's restarts, a requeued job resuming).
            groups.append([])
            resumed.append(True)
            ranks_here = {}
        groups[-1].append((path, start, end, command))
        if owner is not None:
            before = ranks_here.get(owner[0])
            ranks_here[owner[0]] = (owner[1], max(end, before[1]) if before and before[0] == owner[1] else end)
        reach = max(reach, end)
    if len(groups) < 2:
        return []
    runs = []
    job = -1
    for members, again in zip(groups, resumed):
        paths = {m[0] for m in members}
        run_procs = [i for i, p in enumerate(info) if paths & set(p.files)]
        job += 0 if again and job >= 0 else 1
        runs.append({
            "resumed": again,
            "job": job,
            "files": sorted(paths),
            "procs": run_procs,
            "ranks": sorted({info[p].rank for p in run_procs if info[p].rank is not None}),
            "hosts": sorted({info[p].host for p in run_procs if info[p].host}),
            "commands": sorted({m[3] for m in members} - {""}),
            "start_us": min(m[1] for m in members),
            "end_us": max(m[2] for m in members),
            "wall_us": max(m[2] for m in members) - min(m[1] for m in members),
        })
    return runs


def _last_run_of_each_step(by_unit: pl.DataFrame, procs: pl.DataFrame,
                           runs: list[dict[str, Any]]) -> pl.DataFrame:
    """``by_unit`` with each (rank, host, epoch, step) that the runs of one resumed job
    ran more than once kept from the last run only (separate runs keep theirs)."""
    if not any(r.get("resumed") for r in runs):
        return by_unit
    job_of = {i: run["job"] for i, run in enumerate(runs)}
    units = (procs.filter(pl.col("unit").is_not_null()).select("unit", "rank", "host", "run").unique("unit")
             .with_columns(pl.col("run").replace_strict(job_of, default=0, return_dtype=pl.Int64).alias("job")))
    return (by_unit.join(units, on="unit", how="left").sort("run", maintain_order=True)
            .unique(["job", "rank", "host", "epoch", "step"], keep="last", maintain_order=True)
            .sort(["unit_order", "start"], nulls_last=True).select(by_unit.columns))


def _say_where_resumed(runs: list[dict[str, Any]], procs: pl.DataFrame, by_unit: pl.DataFrame) -> None:
    """Each resumed run gets ``resumed_at``: the (epoch, step) its first step ran."""
    units = procs.filter(pl.col("unit").is_not_null()).select("unit", "run").unique("unit")
    first = (by_unit.join(units, on="unit", how="inner").filter(pl.col("step").is_not_null())
             .sort("start").group_by("run", maintain_order=True).first())
    at = {run: {"epoch": epoch, "step": step} for run, epoch, step in first.select("run", "epoch", "step").iter_rows()}
    for i, run in enumerate(runs):
        if run.get("resumed"):
            run["resumed_at"] = at.get(i)


#: A process whose clock anchor is further than this from its parent's (on their host,
#: whose monotonic clock they share) was started after the wall clock was stepped.
CLOCK_STEP_US = 1_000_000


def clock_steps(info: Sequence[Any]) -> list[dict[str, Any]]:
    """Processes started after the wall clock of their host was stepped, found by their
    clock anchor (wall and monotonic time at the start) against the one of the first
    traced process they descend from: a parent and its child share the host's
    monotonic clock, so their anchors differ only by a step of the wall clock. Each:
    ``proc`` (index), ``host``, ``pid``, ``step_us`` (how far the wall clock moved)
    and ``shift_us`` (what puts the process's times on its ancestor's clock)."""
    by_key = {(p.host, p.pid): p for p in info}

    def offset(p: Any) -> int | None:
        return p.wall_ns - p.mono_ns if p.wall_ns is not None and p.mono_ns is not None else None

    steps = []
    for i, p in enumerate(info):
        own = offset(p)
        root, seen = p, {id(p)}
        while True:  # the first traced ancestor on the host
            parent = by_key.get((root.host, root.info.get("ppid")))
            if parent is None or id(parent) in seen or offset(parent) is None:
                break
            root = parent
            seen.add(id(root))
        if own is None or root is p:
            continue
        step_us = (own - offset(root)) // 1000
        if abs(step_us) >= CLOCK_STEP_US:
            steps.append({"proc": i, "host": p.host, "pid": p.pid, "step_us": step_us,
                          "shift_us": -step_us})
    return steps


def _launched_ranks(info: Sequence[Any]) -> dict[str, tuple[int, int]]:
    """file -> (rank, pid) of the process it holds, for processes with a rank of their
    own (not a DataLoader worker, which shares its parent's)."""
    out: dict[str, tuple[int, int]] = {}
    for p in info:
        if p.rank is None or p.role is not None:
            continue
        for path in p.files:
            out.setdefault(path, (p.rank, p.pid))
    return out


#: Files whose times are further apart than this are of separate runs.
RUN_GAP_US = 60_000_000


def _epoch_source(combined: Combined) -> pl.DataFrame:
    """The pipeline's epoch spans when the trace has them, else the extents of the
    events that carry ``args.epoch``."""
    return combined.epoch_spans if combined.epoch_spans.height else combined.epochs


def _steps_in_epochs(steps: pl.DataFrame, epochs: pl.DataFrame) -> pl.DataFrame:
    """``steps`` (proc, epoch, step, start, ...) with the epoch of a step that carries
    none taken from the epoch span (proc, epoch, start, end) it starts in: a loop
    numbered by ``.iter()`` alone has epoch spans but no ``args.epoch``."""
    missing = steps.filter(pl.col("epoch").is_null())
    if not missing.height or not epochs.height:
        return steps
    spans = epochs.select("proc", pl.col("epoch").alias("_epoch"), pl.col("start").alias("_from"),
                          pl.col("end").alias("_to")).sort("_from")
    placed = (
        missing.sort("start").join_asof(spans, left_on="start", right_on="_from", by="proc", check_sortedness=False)
        .with_columns(pl.when(pl.col("start") < pl.col("_to")).then(pl.col("_epoch")).alias("epoch"))
        .select(steps.columns)
    )
    return pl.concat([steps.filter(pl.col("epoch").is_not_null()), placed], how="vertical_relaxed")


def _epochs(by_unit: pl.DataFrame, steps: pl.DataFrame) -> list[dict[str, Any]]:
    by_unit = by_unit.filter(pl.col("epoch").is_not_null())
    if not by_unit.height:
        return []
    # Lazy: only the two columns are taken from the steps (a filter of the frame
    # copied every column of every process's steps).
    step_counts = steps.lazy().filter(pl.col("epoch").is_not_null()).group_by(pl.col("epoch").cast(pl.Int64)).agg(
        pl.col("step").n_unique().alias("steps")
    ).collect()
    per_epoch = (
        by_unit.group_by("epoch")
        .agg(
            pl.len().alias("ranks"),
            pl.col("start").min().alias("start_us"),
            pl.col("n").sum().alias("spans"),
            _median_expr().alias("median_us"),
            pl.col("dur").max().alias("max_us"),
            _slowest().alias("slowest"),
        )
        .join(step_counts, on="epoch", how="left")
        .with_columns(pl.col("steps").fill_null(0))
        .sort("epoch")
    )
    return per_epoch.to_dicts()


def _imbalance(by_unit: pl.DataFrame, steps: pl.DataFrame) -> dict[str, Any]:
    if by_unit.get_column("unit").n_unique() < 2:  # nothing to compare a single rank with
        return {"steps_compared": 0, "mean_ratio": None, "max_ratio": None, "worst": [], "ranks": []}
    compared = steps.filter((pl.col("ranks") > 1) & pl.col("imbalance").is_not_null())
    # Only steps where someone was slower than the median make a straggler.
    uneven = compared.filter(pl.col("imbalance") > 1)
    worst = uneven.sort(["imbalance", "epoch", "step"], descending=[True, False, False], nulls_last=True).head(10)
    slowest = uneven.group_by("slowest").agg(pl.len().alias("slowest_count")).rename({"slowest": "unit"})
    per_unit = (
        _per_unit(by_unit, _plain_stats()[:-1])
        .join(slowest, on="unit", how="left")
        .with_columns(pl.col("slowest_count").fill_null(0).cast(pl.Int64))
        .sort("unit_order", nulls_last=True)
        .drop("unit_order")
        .rename({"unit": "rank", "count": "steps"})
    )
    ratios = compared.get_column("imbalance")
    return {
        "steps_compared": compared.height,
        "mean_ratio": round(ratios.mean(), 3) if compared.height else None,
        "max_ratio": round(ratios.max(), 3) if compared.height else None,
        "worst": _rows(worst),
        "ranks": _rows(per_unit),
    }


def _per_unit(by_unit: pl.DataFrame, stats: list[pl.Expr]) -> pl.DataFrame:
    """unit, unit_order and ``stats`` of each unit's rank-steps. Each unit's rows come
    together (``unit_steps`` sorts them by unit), and its statistics are found over
    its slice alone: a group_by of every rank-step at once sorted and gathered them
    all (60 MB more for 1.25M). Units whose rows are apart (no order among them) are
    grouped."""
    runs = by_unit.get_column("unit").rle().struct.unnest()
    if not runs.height or runs.height != runs.get_column("value").n_unique():
        return by_unit.group_by("unit", "unit_order").agg(stats)
    frames, offset = [], 0
    for length in runs.get_column("len").to_list():
        rows = by_unit.slice(offset, length)
        frames.append(rows.head(1).select("unit", "unit_order").hstack(rows.select(stats)))
        offset += length
    return pl.concat(frames, how="vertical")


def _breakdown(combined: Combined, procs: pl.DataFrame) -> dict[str, Any]:
    n = len(GROUPS)
    size = 1 << n
    per_proc: dict[int, np.ndarray] = {}
    for proc, mask, us in combined.overlap.iter_rows():
        per_proc.setdefault(proc, np.zeros(size, dtype=np.int64))[mask] += us
    labels = dict(procs.select("proc", "label").iter_rows())
    ranks = dict(procs.select("proc", "rank").iter_rows())
    totals = np.zeros(size, dtype=np.int64)
    wall_total = 0
    rows = []
    for proc, start, end in combined.extents.sort("proc").select("proc", "start", "end").iter_rows():
        per_mask = per_proc.get(proc, np.zeros(size, dtype=np.int64))
        wall = end - start
        totals += per_mask
        wall_total += wall
        busy, exclusive = _busy_exclusive(per_mask, n)
        rows.append(
            {
                "label": labels[proc], "rank": ranks[proc], "wall_us": wall,
                "busy_us": busy, "exclusive_us": exclusive,
                "idle_us": int(wall - per_mask[1:].sum()),
            }
        )
    busy, exclusive = _busy_exclusive(totals, n)
    groups = [
        {
            "group": g,
            "busy_us": busy[g],
            "exclusive_us": exclusive[g],
            "overlapped_us": busy[g] - exclusive[g],
            "share_of_wall": round(busy[g] / wall_total, 4) if wall_total else None,
            "overlap_share": round((busy[g] - exclusive[g]) / busy[g], 4) if busy[g] else None,
        }
        for g in GROUPS
    ]
    pairs = [
        {"a": GROUPS[i], "b": GROUPS[j],
         "overlap_us": int(sum(totals[m] for m in range(size) if m >> i & 1 and m >> j & 1))}
        for i in range(n)
        for j in range(i + 1, n)
    ]
    idle = int(wall_total - totals[1:].sum())
    return {
        "wall_us": int(wall_total),
        "groups": groups,
        "idle_us": idle,
        "idle_share": round(idle / wall_total, 4) if wall_total else None,
        "pairs": [p for p in pairs if p["overlap_us"]],
        "processes": rows,
    }


def _busy_exclusive(per_mask: np.ndarray, n: int) -> tuple[dict[str, int], dict[str, int]]:
    masks = np.arange(1 << n)
    busy = {g: int(per_mask[(masks >> i) & 1 == 1].sum()) for i, g in enumerate(GROUPS)}
    exclusive = {g: int(per_mask[1 << i]) for i, g in enumerate(GROUPS)}
    return busy, exclusive
