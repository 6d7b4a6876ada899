"""GPU answers from PyTorch profiler traces, with HolisticTraceAnalysis' (HTA 0.5.0) definitions.

Per rank and device, over the GPU kernels (device-side events with a stream and a
correlation id: kernels, memory copies and sets, stream syncs):

- **which kernels count**: when the traces hold two or more ``ProfilerStep#N``
  names, only the kernels launched (same ``correlation``) by host calls that
  started before the last ``ProfilerStep`` of the rank: the last step is usually
  cut short by the end of profiling;
- **times** are whole microseconds as HTA takes them: a start rounded up, an end
  rounded down;
- **kernel time** (``kernel_us``) runs from the start of the first kernel to the
  end of the last; **idle** is the part of it with no kernel running on any stream
  (kernel intervals merged); **compute** is the time some computation kernel runs
  (merged), **non-compute** the rest of the busy time (communication, memory);
- **kernel type** by name: communication ``^nccl.*Kernel``; memory names starting
  with Memcpy, Memset or dma; computation any name that is not communication, does
  not contain Memcpy or Sync and does not start with Memset; anything else other;
- **communication/computation overlap**: the share of (merged) communication time
  during which computation runs too; null without communication kernels;
- **idle time by cause**, per stream: the gap before each kernel (from the end of
  the previous kernel of the stream) is *host wait* when the kernel's launch call
  started after that end (the host was late), else *kernel wait* when the gap is
  under :data:`CONSECUTIVE_KERNEL_DELAY_US` (back-to-back launch latency), else
  *other*; gaps are summed over the streams (memory copies and sets included,
  stream syncs not).

Each profiler trace of a process is a profiling window of its own: times add up over
the windows, and correlation ids tie launches to kernels within one window.

Joined to the steps of the step model (dftrace's, else the profiler's), per step:
the GPU's busy share, the kernels launched in the step and their GPU time, and the
host time in calls that wait for the GPU (:func:`gpu_steps`); and per span, the
kernels launched inside it on its thread (:func:`span_gpu`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import polars as pl

from ... import format as fmt
from ..read.trace import TraceTable, load_traces, with_processes
from ..reduce.io_tables import IO_CATS
from ..read.kineto import PROFILER_CATS
from ..read.metadata import Resolution
from .context import Context

#: Gaps between kernels shorter than this (µs) count as kernel wait (HTA's default).
CONSECUTIVE_KERNEL_DELAY_US = 30
#: Kernels listed per rank and device, by total time.
TOP_KERNELS = 10
#: Busy intervals kept per stream for the report's GPU lanes (the shortest gaps closed first).
LANE_INTERVALS = 200

KERNEL_TYPES = ("computation", "communication", "memory", "other")
#: Device-side categories whose gaps the idle-time split looks at (syncs are not kernels there).
_IDLE_CATS = ("kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset")


def kernel_type(name: pl.Expr) -> pl.Expr:
    """HTA's kernel type of each kernel name (see the module docstring)."""
    return (
        pl.when(name.str.contains(r"^nccl.*Kernel")).then(pl.lit("communication"))
        .when(name.str.contains(r"^(Memcpy|Memset|dma)")).then(pl.lit("memory"))
        .when(~name.str.contains(r"^(nccl.*Kernel|.*Memcpy|Memset|.*Sync)")).then(pl.lit("computation"))
        .otherwise(pl.lit("other"))
    )


#: What ties a launch call to the GPU activity it launched: correlation ids are unique
#: within one profiler trace (a profiling window) of one process.
LAUNCH_KEY = ["proc", "file", "correlation"]


def kernels_of(activity: pl.DataFrame) -> pl.DataFrame:
    """The GPU kernels that count (see the module docstring), with HTA's whole-µs
    ``ts``/``end``, the launch call's start ``launch_ts`` and the ``type``."""
    whole_us = [(-(-pl.col("start_ns") // 1000)).alias("ts"), (pl.col("end_ns") // 1000).alias("end")]
    host = activity.filter(pl.col("stream").is_null())
    device = activity.filter(
        (pl.col("stream") >= 0) & (pl.col("correlation") >= 0) & pl.col("device").is_not_null()
    )
    launches = host.filter(pl.col("correlation").is_not_null())
    step_names = host.filter(pl.col("step").is_not_null()).get_column("name").n_unique()
    if step_names >= 2:
        last_step = host.filter(pl.col("step").is_not_null()).group_by("proc", "file").agg(
            pl.col("start_ns").max().alias("last_step_ns"))
        launches = launches.join(last_step, on=["proc", "file"], how="inner").filter(
            pl.col("start_ns") < pl.col("last_step_ns"))
        device = device.join(launches.select(LAUNCH_KEY).unique(), on=LAUNCH_KEY, how="semi")
    launch_ts = launches.group_by(LAUNCH_KEY).agg((-(-pl.col("start_ns").max() // 1000)).alias("launch_ts"))
    return (
        device.with_columns(*whole_us)
        .join(launch_ts, on=LAUNCH_KEY, how="left")
        .with_columns(kernel_type(pl.col("name").fill_null("")).alias("type"))
    )


def merge_intervals(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals: sorted by start, an interval that starts after every earlier
    one has ended opens a new merged interval."""
    if not len(ts):
        return ts, end
    order = np.argsort(ts, kind="stable")
    ts, end = ts[order], end[order]
    reach = np.maximum.accumulate(end)
    opens = np.empty(len(ts), dtype=bool)
    opens[0] = True
    opens[1:] = ts[1:] > reach[:-1]
    group = np.cumsum(opens) - 1
    starts = ts[opens]
    ends = np.full(len(starts), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(ends, group, end)
    return starts, ends


def _length(starts: np.ndarray, ends: np.ndarray) -> int:
    return int(ends.sum() - starts.sum())


def _intersection(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """Total time two sets of disjoint intervals overlap."""
    times = np.concatenate([a[0], a[1], b[0], b[1]])
    steps = np.concatenate([np.ones(len(a[0])), -np.ones(len(a[1])), np.ones(len(b[0])), -np.ones(len(b[1]))])
    order = np.lexsort((steps, times))  # at equal times, ends before starts
    running = np.cumsum(steps[order])
    sorted_times = times[order]
    both = running[:-1] == 2
    return int(np.diff(sorted_times)[both].sum())


def _pct(part: float, whole: float) -> float | None:
    return round(100 * part / whole, 2) if whole else None


def steps_answer(context: Context) -> dict[str, Any]:
    """Stage 1: per step of each process with a profiler trace, its GPU figures."""
    combined = context.combined
    return {"gpu_steps": gpu_steps(combined.activity, context.process_steps, combined.resolution)}


def answer(context: Context) -> dict[str, Any]:
    """Stage 3: per (rank, device), the GPU figures; the overview counts the profiler
    traces with no kernel in them (a CPU-only window)."""
    activity = context.combined.activity
    gpu = gpu_answers(activity, context.combined.resolution)
    if gpu or activity is None or not activity.height:
        return {"gpu": gpu}
    return {"gpu": gpu, "overview": {"profiler_files_without_gpu": activity.get_column("file").n_unique()}}


def gpu_answers(activity: pl.DataFrame | None, resolution: Resolution) -> list[dict[str, Any]]:
    """One answer per (rank, device): see the module docstring for the figures."""
    if activity is None or not activity.height:
        return []
    kernels = kernels_of(activity)
    answers = []
    for (proc, device), frame in sorted(kernels.partition_by("proc", "device", as_dict=True).items()):
        process = resolution.processes[proc]
        answers.append({"rank": process.rank, "host": process.host, "pid": process.pid, "device": device,
                        **device_figures(frame)})
    return answers


def device_figures(kernels: pl.DataFrame) -> dict[str, Any]:
    """The figures of one device's kernels (the output of :func:`kernels_of`).

    Each profiling window (file) is a timeline of its own: times are summed over the
    windows, so the time between two windows is not idle time."""
    totals: Counter[str] = Counter()
    type_times: Counter[str] = Counter()
    for window in kernels.partition_by("file"):
        times, types = _window_times(window)
        totals.update(times)
        type_times.update(types)
    span, idle, compute = totals["span"], totals["idle"], totals["compute"]
    idle_causes = idle_by_cause(kernels)
    idle_total = sum(idle_causes.values())
    return {
        "kernels": kernels.height,
        "kernel_us": span,
        "busy_us": span - idle,
        "idle_us": idle,
        "compute_us": compute,
        "non_compute_us": span - compute - idle,
        "idle_pct": _pct(idle, span),
        "compute_pct": _pct(compute, span),
        "non_compute_pct": _pct(span - compute - idle, span),
        "comm_compute_overlap_pct": _pct(totals["overlap"], totals["communication"]),
        "idle_by_cause": {
            **{f"{cause}_us": us for cause, us in idle_causes.items()},
            **{f"{cause}_pct": _pct(us, idle_total) for cause, us in idle_causes.items()},
        },
        "kernel_type_us": dict(sorted(type_times.items(), key=lambda kv: -kv[1])),
        "top_kernels": top_kernels(kernels),
        "streams": stream_lanes(kernels),
    }


def _window_times(kernels: pl.DataFrame) -> tuple[dict[str, int], dict[str, int]]:
    """Kernel time, idle, compute, communication and their overlap (µs) of one
    profiling window, and its busy time per combination of kernel types."""
    ts = kernels.get_column("ts").to_numpy()
    end = kernels.get_column("end").to_numpy()
    types = kernels.get_column("type").to_numpy()
    merged = merge_intervals(ts, end)
    span = int(merged[1][-1] - merged[0][0])
    by_type = {t: merge_intervals(ts[types == t], end[types == t]) for t in KERNEL_TYPES}
    times = {
        "span": span,
        "idle": span - _length(*merged),
        "compute": _length(*by_type["computation"]),
        "communication": _length(*by_type["communication"]),
        "overlap": _intersection(by_type["computation"], by_type["communication"]),
    }
    return times, kernel_type_times(by_type)


def stream_lanes(kernels: pl.DataFrame, limit: int = LANE_INTERVALS) -> list[dict[str, Any]]:
    """Per stream: kernels, busy time and its busy intervals ``[start, end]`` (µs since
    the epoch), at most ``limit`` of them: beyond that the shortest gaps are closed."""
    lanes = []
    for (stream,), frame in sorted(kernels.partition_by("stream", as_dict=True).items()):
        starts, ends = merge_intervals(frame.get_column("ts").to_numpy(), frame.get_column("end").to_numpy())
        busy = _length(starts, ends)
        if len(starts) > limit:
            gaps = starts[1:] - ends[:-1]
            kept = np.sort(np.argpartition(gaps, len(gaps) - (limit - 1))[len(gaps) - (limit - 1):])
            starts, ends = np.concatenate([starts[:1], starts[kept + 1]]), np.concatenate([ends[kept], ends[-1:]])
        lanes.append({"stream": stream, "kernels": frame.height, "busy_us": busy,
                      "busy": [[int(a), int(b)] for a, b in zip(starts, ends)]})
    return lanes


def idle_by_cause(kernels: pl.DataFrame) -> dict[str, int]:
    """Idle time per cause (host_wait, kernel_wait, other), summed over streams."""
    gaps = (
        kernels.filter(pl.col("cat").is_in(_IDLE_CATS))
        .sort("file", "stream", "ts", maintain_order=True)
        .with_columns(pl.col("end").shift(1).over("file", "stream").alias("previous_end"))
        .with_columns((pl.col("ts") - pl.col("previous_end")).alias("gap"))
        .filter(pl.col("gap").is_not_null())
    )
    host_wait = pl.col("launch_ts").is_not_null() & (pl.col("launch_ts") > pl.col("previous_end"))
    cause = (
        pl.when(host_wait).then(pl.lit("host_wait"))
        .when(pl.col("gap") < CONSECUTIVE_KERNEL_DELAY_US).then(pl.lit("kernel_wait"))
        .otherwise(pl.lit("other"))
    )
    sums = dict(gaps.group_by(cause.alias("cause")).agg(pl.col("gap").sum()).iter_rows())
    return {c: int(sums.get(c, 0)) for c in ("host_wait", "kernel_wait", "other")}


def kernel_type_times(by_type: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, int]:
    """Time per combination of kernel types running at once (``computation``,
    ``computation overlapping communication``, ...): the busy time split by what ran."""
    names = [t for t in KERNEL_TYPES if len(by_type[t][0])]
    if not names:
        return {}
    times = np.concatenate([np.concatenate(by_type[t]) for t in names])
    bits = np.concatenate([np.concatenate([np.full(len(by_type[t][0]), 1 << i), np.full(len(by_type[t][1]), -(1 << i))])
                           for i, t in enumerate(names)])
    order = np.lexsort((bits, times))
    state = np.cumsum(bits[order])[:-1]
    lengths = np.diff(times[order])
    out: dict[str, int] = {}
    for mask in np.unique(state[state > 0]):
        label = " overlapping ".join(t for i, t in enumerate(names) if mask & (1 << i))
        out[label] = int(lengths[state == mask].sum())
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def top_kernels(kernels: pl.DataFrame, limit: int = TOP_KERNELS) -> list[dict[str, Any]]:
    """The kernels with the most total time: name, type, count, total, mean and max (µs)."""
    dur = (pl.col("end") - pl.col("ts"))
    top = (
        kernels.group_by("name", "type")
        .agg(pl.len().alias("count"), dur.sum().alias("total_us"), dur.mean().round(2).alias("mean_us"),
             dur.max().alias("max_us"))
        .sort(["total_us", "name"], descending=[True, False])
        .head(limit)
    )
    return top.to_dicts()


#: Columns of ``dftrace sql``'s ``kernels`` table: every device-side activity, times
#: in µs since the epoch at nanosecond resolution.
KERNELS_SCHEMA = {
    "rank": pl.Int32, "host": pl.String, "pid": pl.Int64, "device": pl.Int32, "stream": pl.Int64,
    "cat": pl.String, "name": pl.String, "type": pl.String, "ts": pl.Float64, "end": pl.Float64,
    "dur": pl.Float64, "correlation": pl.Int64, "launch_name": pl.String, "launch_tid": pl.Int64,
    "launch_ts": pl.Float64, "queued": pl.Float64, "counted": pl.Boolean,
}

#: Columns of ``dftrace sql``'s ``gpu`` view: the summary's figures per rank and device.
GPU_VIEW_SCHEMA = {
    "rank": pl.Int32, "host": pl.String, "pid": pl.Int64, "device": pl.Int32, "kernels": pl.Int64,
    "kernel_us": pl.Int64, "busy_us": pl.Int64, "idle_us": pl.Int64, "compute_us": pl.Int64,
    "non_compute_us": pl.Int64, "idle_pct": pl.Float64, "compute_pct": pl.Float64,
    "non_compute_pct": pl.Float64, "comm_compute_overlap_pct": pl.Float64, "idle_host_wait_us": pl.Int64,
    "idle_kernel_wait_us": pl.Int64, "idle_other_us": pl.Int64,
}


def kernels_table(activity: pl.DataFrame, resolution: Resolution) -> pl.DataFrame:
    """Every device-side activity with its launch call (by correlation) and whether
    the GPU answers count it (``counted``, see the module docstring)."""
    us = 1000.0
    device = activity.filter(pl.col("stream").is_not_null())
    launches = (
        activity.filter(pl.col("stream").is_null() & pl.col("correlation").is_not_null())
        .group_by(LAUNCH_KEY)
        .agg(pl.col("name").first().alias("launch_name"), pl.col("tid").first().alias("launch_tid"),
             (pl.col("start_ns").first() / us).alias("launch_ts"))
    )
    counted = kernels_of(activity).select(*LAUNCH_KEY, "stream", "start_ns", pl.lit(True).alias("counted"))
    return (
        device.join(launches, on=LAUNCH_KEY, how="left")
        .join(counted, on=[*LAUNCH_KEY, "stream", "start_ns"], how="left")
        .pipe(with_processes, resolution)
        .with_columns(
            (pl.col("start_ns") / us).alias("ts"), (pl.col("end_ns") / us).alias("end"),
            ((pl.col("end_ns") - pl.col("start_ns")) / us).alias("dur"),
            kernel_type(pl.col("name").fill_null("")).alias("type"),
            pl.col("counted").fill_null(False),
        )
        .with_columns((pl.col("ts") - pl.col("launch_ts")).alias("queued"))
        .sort("rank", "device", "ts")
        .select(list(KERNELS_SCHEMA))
        .cast(KERNELS_SCHEMA)
    )


def gpu_view(answers: list[dict[str, Any]]) -> pl.DataFrame:
    """The GPU answers as one row per rank and device (scalars only)."""
    rows = [{**{k: a[k] for k in GPU_VIEW_SCHEMA if k in a},
             "idle_host_wait_us": a["idle_by_cause"]["host_wait_us"],
             "idle_kernel_wait_us": a["idle_by_cause"]["kernel_wait_us"],
             "idle_other_us": a["idle_by_cause"]["other_us"]} for a in answers]
    return pl.DataFrame(rows, schema=GPU_VIEW_SCHEMA)


# --- joined to dftrace's steps ---------------------------------------------------------

#: Runtime calls that block the host until the GPU has caught up.
SYNC_CALLS = frozenset(
    f"{api}{call}" for api in ("cuda", "hip") for call in (
        "DeviceSynchronize", "StreamSynchronize", "EventSynchronize", "Memcpy", "Memcpy2D", "Memcpy3D",
        "MemcpyFromSymbol", "MemcpyToSymbol", "MemcpyPeer", "MemcpyDtoH",
    )
) | {"cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize", "cuMemcpyDtoH_v2"}
#: Device-side copies that make an asynchronous launch block the host (pageable host memory).
_BLOCKING_COPY = r"^Memcpy DtoH \(Device -> Pageable\)"


def sync_waits(activity: pl.DataFrame) -> pl.DataFrame:
    """proc, start_ns, end_ns: the host calls that waited for the GPU: synchronising
    runtime calls, and asynchronous copies to pageable host memory."""
    host = activity.filter(pl.col("stream").is_null() & pl.col("correlation").is_not_null())
    blocking = activity.filter(pl.col("stream").is_not_null() & pl.col("name").str.contains(_BLOCKING_COPY))
    calls = host.filter(pl.col("name").is_in(list(SYNC_CALLS)))
    copies = host.join(blocking.select(LAUNCH_KEY).unique(), on=LAUNCH_KEY, how="semi")
    return pl.concat([calls, copies], how="vertical").unique().select("proc", "start_ns", "end_ns")


def _overlap_ns(starts: np.ndarray, ends: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """For each window [lo, hi): the time disjoint sorted intervals [starts, ends) cover in it."""
    covered = np.concatenate([[0], np.cumsum(ends - starts)])

    def covered_until(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(starts, t, side="right")  # intervals starting at or before t
        last = np.clip(i - 1, 0, None)
        partial = np.where(i > 0, np.clip(t - starts[last], 0, ends[last] - starts[last]), 0)
        return covered[last] * (i > 0) + partial

    return covered_until(hi) - covered_until(lo)


#: Largest rate (ppm) at which NTP slews the wall clock against the monotonic one.
MAX_SLEW_PPM = 500
#: Reading a clock pair at each anchor: at most this far apart (µs), for both anchors together.
ANCHOR_READ_US = 2


def clock_bound_us(anchors: list[tuple[int, int]], at_ns: int) -> float | None:
    """How far apart dftrace's and the profiler's times of one instant (``at_ns``)
    can be, given the process's clock anchors ((wall_ns, mono_ns), the first one
    dftrace's own).

    Both are wall-clock times of a monotonic clock: dftrace adds the wall-minus-monotonic
    offset read at its first anchor; the profiler calibrates its clock against the wall
    clock when it starts. They differ by how far the wall clock moved against the
    monotonic clock between the two calibrations. An anchor read when the profiler
    started (``profile_steps`` writes one per window) measures that move (its drift
    from the first anchor); from the last anchor before ``at_ns`` on, NTP can slew the
    wall clock by at most MAX_SLEW_PPM; plus the reading of the pairs. None without an
    anchor (the process has no dftrace trace). A step of the wall clock after the last
    anchor (``date -s``, an NTP step) is beyond this bound.
    """
    if not anchors:
        return None
    first_wall, first_mono = anchors[0]
    wall, mono = anchors[0]
    for a_wall, a_mono in anchors[1:]:
        if a_wall <= at_ns:
            wall, mono = a_wall, a_mono
    drift_us = abs((wall - mono) - (first_wall - first_mono)) / 1000
    return round(ANCHOR_READ_US + drift_us + MAX_SLEW_PPM * 1e-6 * abs(at_ns - wall) / 1000, 1)


#: A step the profiler recorded less of than this share (a sliver at a window's edge:
#: the profiler starts and stops inside the optimizer's step) has no GPU row.
MIN_PROFILED_SHARE = 0.1


def gpu_steps(activity: pl.DataFrame | None, process_steps: pl.DataFrame, resolution: Resolution) -> list[dict[str, Any]]:
    """Per step of each process with steps and GPU activity, for the steps the
    profiler recorded (in part or whole; ``profiled_pct``: how much of the step it
    recorded, its ``ProfilerStep#N`` spans, else the span of its activity; at least
    ``MIN_PROFILED_SHARE``): the
    shares of the recorded part in which some kernel (``gpu_busy_pct``) and some
    computation kernel (``gpu_compute_pct``) ran, the kernels launched in the step
    and their GPU time, and the host time spent waiting for the GPU in it (see
    docs/analysis.md, "GPU traces"). Stream syncs are not GPU work here.

    Steps are integer µs since the epoch (dftrace's clock), activity ns since the epoch
    (the profiler's): both are wall-clock times, compared as they are."""
    if activity is None or not activity.height or not process_steps.height:
        return []
    device = activity.filter(pl.col("stream").is_not_null() & (pl.col("cat") != "cuda_sync")).with_columns(
        kernel_type(pl.col("name")).alias("type"))
    launches = activity.filter(pl.col("stream").is_null() & pl.col("correlation").is_not_null())
    launched = device.join(launches.select(*LAUNCH_KEY, pl.col("start_ns").alias("launch_ns")),
                           on=LAUNCH_KEY, how="inner")
    waits = sync_waits(activity)
    # what the profiler recorded: its ProfilerStep#N spans, else all its activity
    marked = activity.filter(pl.col("step").is_not_null())
    rows = []
    for (proc,), steps in process_steps.filter(pl.col("proc").is_in(device.get_column("proc").unique().implode())
                                               ).partition_by("proc", as_dict=True).items():
        steps = steps.sort("start")
        lo = steps.get_column("start").to_numpy() * 1000
        hi = steps.get_column("end").to_numpy() * 1000
        mine = device.filter(pl.col("proc") == proc)
        busy = _covered(mine, lo, hi)
        compute = _covered(mine.filter(pl.col("type") == "computation"), lo, hi)
        waited = _covered(waits.filter(pl.col("proc") == proc), lo, hi)
        kernels = launched.filter(pl.col("proc") == proc).sort("launch_ns")
        at = kernels.get_column("launch_ns").to_numpy()
        durations = np.concatenate([[0], np.cumsum((kernels.get_column("end_ns") - kernels.get_column("start_ns")).to_numpy())])
        first, last = np.searchsorted(at, lo, side="left"), np.searchsorted(at, hi, side="left")
        process = resolution.processes[proc]
        windows = marked.filter(pl.col("proc") == proc)
        if not windows.height:  # no ProfilerStep spans: the span of its activity
            windows = activity.filter(pl.col("proc") == proc).select(pl.col("start_ns").min(),
                                                                     pl.col("end_ns").max())
        profiled = _covered(windows, lo, hi)
        for i, step in enumerate(steps.iter_rows(named=True)):
            span_ns = hi[i] - lo[i]
            if profiled[i] <= 0 or profiled[i] < MIN_PROFILED_SHARE * span_ns:
                continue  # not recorded, or a window's edge: too little to judge the step by

            rows.append({
                "rank": process.rank, "host": process.host, "pid": process.pid, "epoch": step["epoch"],
                "step": step["step"], "start_us": step["start"], "dur_us": step["end"] - step["start"],
                "profiled_pct": round(100 * profiled[i] / span_ns, 2) if span_ns else None,
                "gpu_busy_pct": round(100 * busy[i] / profiled[i], 2),
                "gpu_compute_pct": round(100 * compute[i] / profiled[i], 2),
                "kernels_launched": int(last[i] - first[i]),
                "kernel_us_launched": round((durations[last[i]] - durations[first[i]]) / 1000, 3),
                "sync_wait_us": round(waited[i] / 1000, 3),
                "clock_bound_us": clock_bound_us(process.anchors, int(lo[i])),
            })
    rows.sort(key=lambda r: (r["rank"] is None, r["rank"] or 0, r["host"], r["pid"], r["start_us"]))
    return rows


def _covered(intervals: pl.DataFrame, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """For each window [lo, hi) (ns): the time the rows' [start_ns, end_ns) cover in it."""
    return _overlap_ns(*merge_intervals(intervals.get_column("start_ns").to_numpy(),
                                        intervals.get_column("end_ns").to_numpy()), lo, hi)


#: Columns of ``dftrace sql``'s ``span_gpu`` view.
SPAN_GPU_SCHEMA = {
    "rank": pl.Int32, "host": pl.String, "pid": pl.Int64, "tid": pl.Int64, "cat": pl.String, "name": pl.String,
    "ts": pl.Int64, "dur": pl.Int64, "kernels": pl.Int64, "kernel_us": pl.Float64,
}


def span_gpu(spans: pl.DataFrame, activity: pl.DataFrame, resolution: Resolution) -> pl.DataFrame:
    """Per span (rank, host, pid, tid, cat, name, ts, dur): the kernels launched inside
    it (the launch call started in [ts, ts + dur) on the span's thread) and their GPU
    time (µs). Only spans of processes with GPU activity."""
    keys = pl.DataFrame(
        {"proc": range(len(resolution.processes)), "host": [p.host for p in resolution.processes],
         "pid": [p.pid for p in resolution.processes]},
        schema={"proc": pl.Int32, "host": pl.String, "pid": pl.Int64},
    )
    device = activity.filter(pl.col("stream").is_not_null())
    launches = (
        activity.filter(pl.col("stream").is_null() & pl.col("correlation").is_not_null())
        .select(*LAUNCH_KEY, pl.col("tid").alias("launch_tid"), pl.col("start_ns").alias("launch_ns"))
        .join(device.select(*LAUNCH_KEY, (pl.col("end_ns") - pl.col("start_ns")).alias("gpu_ns")),
              on=LAUNCH_KEY, how="inner")
        .join(keys, on="proc", how="left")
    )
    spans = spans.filter(pl.col("dur").is_not_null() & pl.col("ts").is_not_null())
    out = []
    for (host, pid, tid), group in launches.sort("launch_ns").partition_by("host", "pid", "launch_tid",
                                                                           as_dict=True).items():
        mine = spans.filter((pl.col("host") == host) & (pl.col("pid") == pid) & (pl.col("tid") == tid))
        if not mine.height:
            continue
        at = group.get_column("launch_ns").to_numpy()
        total = np.concatenate([[0], np.cumsum(group.get_column("gpu_ns").to_numpy())])
        lo = np.searchsorted(at, mine.get_column("ts").to_numpy() * 1000, side="left")
        hi = np.searchsorted(at, (mine.get_column("ts") + mine.get_column("dur")).to_numpy() * 1000, side="left")
        out.append(mine.with_columns(pl.Series("kernels", hi - lo), pl.Series("kernel_us", (total[hi] - total[lo]) / 1000)))
    if not out:
        return pl.DataFrame(schema=SPAN_GPU_SCHEMA)
    return pl.concat(out, how="vertical").select(list(SPAN_GPU_SCHEMA)).cast(SPAN_GPU_SCHEMA)


def gpu_by_span(spans: pl.DataFrame, activity: pl.DataFrame | None, resolution: Resolution,
                limit: int = TOP_KERNELS * 2) -> list[dict[str, Any]]:
    """Per (cat, name) of dftrace's spans (the profiler's own categories left out) in
    processes with a profiler trace: spans,
    the kernels launched inside them (see :func:`span_gpu`) and their GPU time (µs),
    most GPU time first. A kernel launched inside nested spans counts for each."""
    spans = spans.filter(~pl.col("cat").is_in(PROFILER_CATS))
    if activity is None or not activity.height or not spans.height:
        return []
    per_span = span_gpu(spans, activity, resolution)
    return (
        per_span.group_by("cat", "name")
        .agg(pl.len().alias("spans"), pl.col("kernels").sum(), pl.col("kernel_us").sum().round(3))
        .filter(pl.col("kernels") > 0)
        .sort(["kernel_us", "cat", "name"], descending=[True, False, False])
        .head(limit)
        .to_dicts()
    )


#: The columns of the spans read again for their GPU time.
SPAN_COLUMNS = ["pid", "tid", "cat", "name", "ph", "ts", "dur"]
#: dftrace's spans: complete events but the traced I/O calls.
USER_SPANS = (pl.col("ph") == fmt.PH_COMPLETE) & ~pl.col("cat").is_in(IO_CATS).fill_null(False)


def spans_answer(source: Any, combined: Any, **options: Any) -> list[dict[str, Any]]:
    """The Summary's ``gpu_spans``: per span name, the GPU time of the kernels launched
    inside its spans. Spans are not kept by the aggregates: those of the processes
    with a profiler trace beside their dftrace trace are read again from ``source``
    (with ``options``, as :func:`load_traces` takes them); a loaded trace has them."""
    if isinstance(source, TraceTable):
        spans = source.events if set(SPAN_COLUMNS) <= set(source.events.columns) else None
    else:
        files = dftrace_files_with_gpu(combined.activity, combined.resolution)
        spans = load_traces(files, columns=SPAN_COLUMNS, **options).events if files else None
    if spans is None:
        return []
    return gpu_by_span(spans.filter(USER_SPANS), combined.activity, combined.resolution)


def dftrace_files_with_gpu(activity: pl.DataFrame | None, resolution: Resolution) -> list[str]:
    """The files other than profiler traces of the processes that have GPU activity."""
    if activity is None or not activity.height:
        return []
    procs = set(activity.get_column("proc").unique().to_list())
    profiler_files = set(activity.get_column("file").unique().to_list())
    return sorted({path for (path, _, _), proc in resolution.index.items()
                   if proc in procs and path not in profiler_files})
