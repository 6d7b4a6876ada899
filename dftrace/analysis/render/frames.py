"""The answers of a :class:`Summary` as polars DataFrames, one function a question.

Each function takes a summary, or anything :func:`summarize` takes (a directory, files,
a glob, a loaded trace), which is summarised first, and returns a DataFrame of the
summary's rows for that question, in the summary's order, with typed columns::

    from dftrace.analysis import frames, summarize
    summary = summarize("traces/")
    frames.steps(summary).sort("max_us", descending=True).head()

Columns carry their unit: ``_us`` microseconds, ``_bytes`` bytes, ``_ops`` calls,
``_pct`` percent (of 100), ``_share`` a fraction of 1; ``start_us`` is the time since
the Unix epoch, but in ``rank_steps``, where it is the time since the run's start. A
value the summary leaves out is null (NaN included). A question the run has no answer
to (no steps, no second rank, no GPU, no file I/O) gives an empty frame with the same
columns. Where a chart of ``render.figures`` draws a frame's rows, the frame's
docstring names it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import polars as pl
import polars.selectors as cs

from ..answers.io import CALL_FIGURES
from ..answers.summary import Summary, summarize
from ..read.sources import PathsLike
from ..read.trace import TraceTable
from ..reduce.busy import GROUPS

__all__ = [
    "breakdown", "categories", "dataloader", "epochs", "gpu", "gpu_kernels", "gpu_spans", "gpu_steps", "io_files",
    "io_ranks", "io_steps", "processes", "rank_steps", "stragglers", "steps",
]

#: What every function takes: a summary, or what is summarised into one.
Source = Summary | PathsLike | TraceTable

_INT, _FLOAT, _TEXT, _BOOL = pl.Int64, pl.Float64, pl.String, pl.Boolean
#: The figures of a set of file calls, as the I/O answers name them (all integers).
_IO_COLUMNS = {name: _INT for name in CALL_FIGURES}


# --- steps -------------------------------------------------------------------------------


def steps(source: Source) -> pl.DataFrame:
    """Per (epoch, step), over the ranks that ran it: their number, when the step
    started, the shortest, median and longest rank's time, the slowest rank, and the
    longest over the median (``imbalance``). ``figures.step_times`` draws the same steps
    rank by rank."""
    return _frame(_summary(source).steps, {
        "epoch": _INT, "step": _INT, "ranks": _INT, "start_us": _INT, "min_us": _INT, "median_us": _INT,
        "max_us": _INT, "slowest": _TEXT, "imbalance": _FLOAT})


def rank_steps(source: Source) -> pl.DataFrame:
    """Per (rank, epoch, step): the step's start since the run's start, its time and its
    wait in collectives (a subset of the steps when ``summary.rank_steps_sampled``).
    Drawn by ``figures.step_timeline``, ``figures.step_times`` and
    ``figures.collective_waits``."""
    return _frame(_summary(source).rank_steps, {
        "rank": _TEXT, "epoch": _INT, "step": _INT, "start_us": _INT, "dur_us": _INT, "wait_us": _INT})


def stragglers(source: Source) -> pl.DataFrame:
    """Per rank, worst first: how often it arrived last at a collective, the wait it
    caused the others (in all, and per step), the steps it held them back in, its
    compute per step, and whether that stands out from the noise (``significant``,
    ``p_value``). Empty for one rank. Drawn by ``figures.stragglers``."""
    return _frame(_summary(source).stragglers, {
        "rank": _INT, "unit": _TEXT, "host": _TEXT, "steps": _INT, "held_steps": _INT, "last_arrivals": _INT,
        "last_steps": _INT, "caused_wait_us": _INT, "caused_wait_us_per_step": _INT, "compute_us_per_step": _INT,
        "median_lead_us": _INT, "noise_us": _INT, "beyond_us": _INT, "p_value": _FLOAT, "significant": _BOOL,
        "pattern": _TEXT})


def epochs(source: Source) -> pl.DataFrame:
    """Per epoch: ranks, steps, its start, spans, the median and the slowest rank's
    time, and the slowest rank."""
    return _frame(_summary(source).epochs, {
        "epoch": _INT, "ranks": _INT, "steps": _INT, "start_us": _INT, "spans": _INT, "median_us": _INT,
        "max_us": _INT, "slowest": _TEXT})


# --- where the time goes ----------------------------------------------------------------


def breakdown(source: Source, *, per_process: bool = False) -> pl.DataFrame:
    """Time per activity (``group``: compute, data, comm, checkpoint, device), all
    processes together: busy, alone (exclusive) and overlapped with another activity,
    the share of the processes' time; a last row, ``idle``, holds the time in none (as
    its busy and exclusive time).

    ``per_process``: a row per process instead (label, rank, its time, idle time, and
    each activity's busy and exclusive time, ``<group>_busy_us``, ``<group>_exclusive_us``),
    as ``figures.time_breakdown`` draws it."""
    time = _summary(source).breakdown
    if per_process:
        kinds = ("busy", "exclusive")
        flat = ({**p, **{f"{g}_{kind}_us": p[f"{kind}_us"][g] for g in GROUPS for kind in kinds}}
                for p in time.get("processes", []))
        return _frame(flat, {"label": _TEXT, "rank": _INT, "wall_us": _INT, "idle_us": _INT,
                             **{f"{g}_{kind}_us": _INT for g in GROUPS for kind in kinds}})
    idle = time.get("idle_us")
    rows = [*time.get("groups", []), *([{"group": "idle", "busy_us": idle, "exclusive_us": idle, "overlapped_us": 0,
                                         "share_of_wall": time["idle_share"]}] if idle is not None else [])]
    return _frame(rows, {"group": _TEXT, "busy_us": _INT, "exclusive_us": _INT, "overlapped_us": _INT,
                         "share_of_wall": _FLOAT, "overlap_share": _FLOAT})


def categories(source: Source) -> pl.DataFrame:
    """Per (cat, name): spans, total time, self time (the time its spans were the
    innermost on their thread), mean, standard deviation (null for one span) and
    the nearest-rank percentiles of their durations. Drawn by
    ``figures.self_time_by_name``; the busiest names' histograms by
    ``figures.duration_distributions``."""
    return _frame(_summary(source).categories, {
        "cat": _TEXT, "name": _TEXT, "count": _INT, "total_us": _INT, "self_us": _INT, "mean_us": _FLOAT,
        "std_us": _FLOAT, "min_us": _INT, "p50_us": _INT, "p95_us": _INT, "max_us": _INT})


def dataloader(source: Source, *, per_rank: bool = False) -> pl.DataFrame:
    """Per data loader (a ``<leaf>.iter``/``<leaf>.block`` pair): items, time waiting
    for them (in all, mean, p95), time using them, and the share of loop time spent
    waiting (``stall_share``).

    ``per_rank``: a row per loader and rank (waiting, using, stall share), as
    ``figures.data_loader_stall`` draws it."""
    loaders = _summary(source).dataloader
    if per_rank:
        return _frame(({"cat": d["cat"], "loader": d["loader"], **r, "stall_share": r["stall"]}
                       for d in loaders for r in d["ranks"]),
                      {"cat": _TEXT, "loader": _TEXT, "rank": _TEXT, "iter_us": _INT, "block_us": _INT,
                       "stall_share": _FLOAT})
    return _frame(({**d, "stall_share": d["stall"]} for d in loaders), {
        "cat": _TEXT, "loader": _TEXT, "items": _INT, "iter_us": _INT, "iter_mean_us": _FLOAT,
        "iter_p95_us": _INT, "block_us": _INT, "stall_share": _FLOAT})


def processes(source: Source) -> pl.DataFrame:
    """Per process, in rank order: label, rank, host, pid, first and last event, spans,
    spans left open, events dropped, how it ended when the trace says so (null when it
    finished), and whether it is another's worker (a DataLoader worker)."""
    return _frame(_summary(source).processes, {
        "label": _TEXT, "rank": _INT, "host": _TEXT, "pid": _INT, "start_us": _INT, "end_us": _INT,
        "wall_us": _INT, "spans": _INT, "incomplete": _INT, "dropped": _INT, "ended": _TEXT,
        "worker": _BOOL})


# --- GPU --------------------------------------------------------------------------------


def gpu(source: Source) -> pl.DataFrame:
    """Per (rank, device) of PyTorch profiler traces: kernels, the time from the first
    kernel's start to the last one's end (``kernel_us``), busy, idle, computation and
    other kernels' time with their percentages, communication overlapped by
    computation, and idle time by cause (``idle_host_wait_us``: waiting on the host,
    ``idle_kernel_wait_us``: between kernels, ``idle_other_us``). Drawn by
    ``figures.gpu_time``; the streams' busy time by ``figures.gpu_streams``."""
    causes = ("host_wait", "kernel_wait", "other")
    rows = ({**g, **{f"idle_{key}": value for key, value in g["idle_by_cause"].items()}}
            for g in _summary(source).gpu)
    return _frame(rows, {
        "rank": _INT, "host": _TEXT, "pid": _INT, "device": _INT, "kernels": _INT, "kernel_us": _INT,
        "busy_us": _INT, "idle_us": _INT, "compute_us": _INT, "non_compute_us": _INT, "idle_pct": _FLOAT,
        "compute_pct": _FLOAT, "non_compute_pct": _FLOAT, "comm_compute_overlap_pct": _FLOAT,
        **{f"idle_{cause}_us": _INT for cause in causes}, **{f"idle_{cause}_pct": _FLOAT for cause in causes}})


def gpu_kernels(source: Source) -> pl.DataFrame:
    """Per (rank, device), the kernels with the most GPU time: name, type
    (computation, communication, memory, other), launches, total, mean and longest."""
    return _frame(({"rank": g["rank"], "device": g["device"], **k} for g in _summary(source).gpu
                   for k in g["top_kernels"]), {
        "rank": _INT, "device": _INT, "name": _TEXT, "type": _TEXT, "count": _INT, "total_us": _INT,
        "mean_us": _FLOAT, "max_us": _INT})


def gpu_steps(source: Source) -> pl.DataFrame:
    """Per step of each process with dftrace steps and a profiler trace of its GPU:
    the share of the step profiled, the GPU's busy and computing shares, the kernels
    launched in the step and their GPU time, the host's time waiting for the GPU, and
    the bound on the error of joining the two clocks."""
    return _frame(_summary(source).gpu_steps, {
        "rank": _INT, "host": _TEXT, "pid": _INT, "epoch": _INT, "step": _INT, "start_us": _INT, "dur_us": _INT,
        "profiled_pct": _FLOAT, "gpu_busy_pct": _FLOAT, "gpu_compute_pct": _FLOAT, "kernels_launched": _INT,
        "kernel_us_launched": _FLOAT, "sync_wait_us": _FLOAT, "clock_bound_us": _FLOAT})


def gpu_spans(source: Source) -> pl.DataFrame:
    """Per (cat, name) of dftrace's spans in processes with a profiler trace: spans,
    the kernels launched inside them and those kernels' GPU time, most first."""
    return _frame(_summary(source).gpu_spans, {
        "cat": _TEXT, "name": _TEXT, "spans": _INT, "kernels": _INT, "kernel_us": _FLOAT})


# --- file I/O -----------------------------------------------------------------------------


def io_files(source: Source) -> pl.DataFrame:
    """Per file of the traced file calls, most I/O time first (at most the summary's
    1000): path (null where only its hash, ``fhash``, is known), bytes, calls and time
    by kind (read, write, metadata, sync, other). The I/O over time is drawn by
    ``figures.io_over_time``."""
    return _frame(_io(source, "files"), {"path": _TEXT, "fhash": _TEXT, **_IO_COLUMNS})


def io_ranks(source: Source) -> pl.DataFrame:
    """Per rank (null for processes without one; a DataLoader worker counts for its
    rank): bytes, calls and time of its file calls by kind."""
    return _frame(_io(source, "ranks"), {"rank": _INT, **_IO_COLUMNS})


def io_steps(source: Source) -> pl.DataFrame:
    """Per (epoch, step): bytes, calls and time of the file calls that started within
    the step, all processes together."""
    return _frame(_io(source, "steps"), {"epoch": _INT, "step": _INT, **_IO_COLUMNS})


# --- shared pieces -----------------------------------------------------------------------


def _summary(source: Source) -> Summary:
    return source if isinstance(source, Summary) else summarize(source)


def _io(source: Source, table: str) -> list[dict[str, Any]]:
    return _summary(source).io.get(table, [])


def _frame(rows: Iterable[Mapping[str, Any]], schema: Mapping[str, Any]) -> pl.DataFrame:
    """``rows`` as a frame of exactly ``schema``'s columns (NaN made null)."""
    rows = list(rows)
    frame = pl.DataFrame({name: [row.get(name) for row in rows] for name in schema}, schema=schema)
    return frame.with_columns(cs.float().fill_nan(None))
