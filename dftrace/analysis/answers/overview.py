"""The overview of a summary (files, processes, ranks, events, time span, what was cut
off or dropped) and its per-file and per-process rows."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import polars as pl

from ..reduce.combine import Combined
from ..reduce.sketch import EXACT_BELOW_US, RELATIVE_ERROR
from ..runtime import kernels
from .context import Context
from .runs import clock_steps


def answer(context: Context) -> dict[str, Any]:
    """Stage 3: the overview, one row per file and one per process (rank order)."""
    combined, procs = context.combined, context.procs
    return {
        "overview": _overview(combined, procs, context.runs),
        "files": [_file_dict(f) for f in combined.files],
        "processes": _process_rows(combined, procs),
    }


def _overview(combined: Combined, procs: pl.DataFrame, runs: list[dict[str, Any]]) -> dict[str, Any]:
    extents = combined.extents
    start = extents.get_column("start").min() if extents.height else None
    end = extents.get_column("end").max() if extents.height else None
    io = combined.io_totals
    if start is None and io is not None and io.height:  # no span: the traced file calls' time
        start, end = io.get_column("first").min(), io.get_column("last").max()
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
    # A traced child of a traced process (a DataLoader worker, multiprocessing's
    # helpers) is a worker of it, not a process of the job's own.
    workers = [p.role is not None for p in combined.resolution.processes]
    return [
        {
            "label": r["label"], "rank": r["rank"], "host": r["host"], "pid": r["pid"],
            "start_us": r["start"], "end_us": r["end"],
            "wall_us": (r["end"] - r["start"]) if r["start"] is not None else 0,
            "spans": r["n"] or 0, "incomplete": r["incomplete"] or 0, "dropped": r["dropped"],
            "ended": ended[r["proc"]], "worker": workers[r["proc"]],
        }
        for r in joined.iter_rows(named=True)
    ]


