"""PyTorch profiler (Kineto) traces: reading them in every command, and the GPU answers.

The GPU figures are checked two ways: against a per-microsecond occupancy count the
test makes itself from the generated documents, and against HolisticTraceAnalysis
0.5.0 (the reference for the definitions) when it is installed.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import subprocess
import sys
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import kinetogen
import orjson
import pytest

pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from dftrace.analysis import load_traces, run_sql, summarize  # noqa: E402

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def host_events(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The events a reader keeps as rows: complete events of numbered processes, no flows."""
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and isinstance(e["pid"], int)]


def epoch_us(base_ns: int, ts: float) -> int:
    """A profiler time as whole µs since the epoch, in exact decimal arithmetic."""
    return int((Decimal(base_ns) / 1000 + Decimal(repr(ts))).to_integral_value(ROUND_HALF_UP))


# --- reading ---------------------------------------------------------------------------


@pytest.mark.parametrize("gzip_files", [True, False])
def test_summary_reads_profiler_traces(tmp_path: Path, gzip_files: bool) -> None:
    paths = kinetogen.write_job(tmp_path, ranks=2, seed=3, gzip_files=gzip_files)
    docs = [kinetogen.rank_document(rank, seed=3, world=2) for rank in range(2)]
    summary = summarize(tmp_path)
    overview = summary.overview
    assert overview["processes"] == 2
    assert overview["events"] == sum(len(host_events(d)) for d in docs)
    assert sum(f["broken_count"] for f in summary.files) == 0
    assert sorted(p["rank"] for p in summary.processes) == [0, 1]
    kernels = sum(1 for d in docs for e in d["traceEvents"] if e.get("cat") == "kernel")
    assert sum(c["count"] for c in summary.categories if c["cat"] == "kernel") == kernels
    # ProfilerStep#N spans are the steps
    assert sorted({s["step"] for s in summary.steps}) == [10, 11, 12, 13]
    assert len(paths) == 2


def test_detected_by_content_not_by_name(tmp_path: Path) -> None:
    doc = kinetogen.rank_document(0, seed=4)
    odd = kinetogen.write_document(doc, tmp_path / "profile.bin")
    trace = load_traces(odd)
    assert trace.events.height == len(host_events(doc))
    assert trace.processes.get_column("rank").to_list() == [0]
    assert trace.processes.get_column("host").to_list() == ["gpu-node0"]


def test_events_table_columns(tmp_path: Path) -> None:
    doc = kinetogen.rank_document(1, seed=5, world=2)
    trace = load_traces(kinetogen.write_document(doc, tmp_path / "r1.pt.trace.json.gz"))
    events = trace.events
    first = min(e["ts"] for e in host_events(doc))
    # times are µs since the epoch: the base plus the relative ts
    assert events.get_column("ts").min() == epoch_us(kinetogen.BASE_NS, first)
    # GPU activity sits on its stream's lane of the host process, with device/stream/correlation in args
    kernels = events.filter(events["cat"] == "kernel")
    assert set(kernels.get_column("pid").to_list()) == {4001}
    assert set(kernels.get_column("tid").to_list()) <= {kinetogen.COMPUTE_STREAM, kinetogen.COMM_STREAM}
    args = json.loads(kernels.get_column("args")[0])
    assert args["device"] == 1 and "correlation" in args
    names = dict(zip(trace.threads["tid"].to_list(), trace.threads["name"].to_list()))
    assert names[kinetogen.COMM_STREAM] == f"GPU 1 stream {kinetogen.COMM_STREAM}"
    steps = events.filter(events["name"].str.starts_with("ProfilerStep#"))
    assert steps.get_column("step").to_list() == [10, 11, 12, 13]


def test_zstd_document(tmp_path: Path) -> None:
    import zstandard

    doc = kinetogen.rank_document(0, seed=4)
    path = tmp_path / "trace.json"
    path.write_bytes(zstandard.ZstdCompressor().compress(orjson.dumps(doc, option=orjson.OPT_INDENT_2)))
    assert load_traces(path).events.height == len(host_events(doc))


def test_line_traces_named_json_are_still_read_as_lines(tmp_path: Path) -> None:
    path = tmp_path / "lines.json"
    events = [{"ph": "X", "cat": "compute", "name": "forward", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5}
              for i in range(3)]
    path.write_bytes(b"[\n" + b"\n".join(orjson.dumps(e) for e in events) + b"\n]\n")
    assert load_traces(path).events.height == 3


def test_not_a_document_is_one_broken_line(tmp_path: Path) -> None:
    """A profiler trace cut in half is one broken line: beside a whole one it is
    counted; alone it is an input without events, an error naming it."""
    path = tmp_path / "cut.pt.trace.json"
    text = orjson.dumps(kinetogen.rank_document(0), option=orjson.OPT_INDENT_2)
    path.write_bytes(text[: len(text) // 2])
    whole = tmp_path / "whole.pt.trace.json"
    whole.write_bytes(orjson.dumps(kinetogen.rank_document(1)))
    trace = load_traces([path, whole])
    (cut,) = [f for f in trace.files if f.path == str(path)]
    assert cut.broken_count == 1
    assert "not a JSON document" in cut.broken[0][1]
    assert trace.events.height > 0  # the whole one's events
    with pytest.raises(ValueError, match="cut.pt.trace.json: 1 broken line"):
        load_traces(path)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dftrace.cli", *args], capture_output=True, text=True, timeout=120)


def test_cli_commands_take_profiler_traces(tmp_path: Path) -> None:
    kinetogen.write_job(tmp_path / "job", ranks=2, seed=6)
    out = run_cli("summary", str(tmp_path / "job"))
    assert out.returncode == 0, out.stderr
    assert "GPU (PyTorch profiler traces" in out.stdout and "0 events" not in out.stdout
    converted = tmp_path / "out.pfw"
    out = run_cli("convert", str(tmp_path / "job"), "-o", str(converted))
    assert out.returncode == 0, out.stderr
    assert load_traces(converted).events.height == load_traces(tmp_path / "job").events.height
    out = run_cli("validate", *map(str, sorted((tmp_path / "job").iterdir())))
    assert out.returncode == 0, out.stdout + out.stderr


# --- GPU answers: ground truth computed here -------------------------------------------


def occupancy_truth(doc: dict[str, Any]) -> dict[str, Any]:
    """The temporal breakdown of one generated rank, counted microsecond by microsecond.

    Kernels launched before the last ProfilerStep count; each covers the whole
    microseconds from its start rounded up to its end rounded down.
    """
    base_us = 0  # all times here are relative to the same base
    events = doc["traceEvents"]
    steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
    last_step = max(e["ts"] for e in steps)
    launched = {e["args"]["correlation"] for e in events
                if e.get("cat") == "cuda_runtime" and e["ts"] < last_step}
    covered: dict[int, set[str]] = {}
    for e in events:
        if e.get("cat") not in GPU_CATS or e["args"]["correlation"] not in launched:
            continue
        kind = ("communication" if e["name"].startswith("nccl") else
                "memory" if e["cat"] != "kernel" else "computation")
        for us in range(math.ceil(e["ts"] - base_us), math.floor(e["ts"] + e["dur"] - base_us)):
            covered.setdefault(us, set()).add(kind)
    first, last = min(covered), max(covered) + 1
    span = last - first
    busy = len(covered)
    compute = sum(1 for kinds in covered.values() if "computation" in kinds)
    comm = sum(1 for kinds in covered.values() if "communication" in kinds)
    both = sum(1 for kinds in covered.values() if {"computation", "communication"} <= kinds)
    return {"kernel_us": span, "idle_us": span - busy, "compute_us": compute,
            "non_compute_us": busy - compute, "overlap_pct": 100 * both / comm if comm else None}


@pytest.mark.parametrize("seed", [0, 7])
def test_gpu_figures_match_occupancy_count(tmp_path: Path, seed: int) -> None:
    kinetogen.write_job(tmp_path, ranks=3, seed=seed)
    gpu = summarize(tmp_path).gpu
    assert [(g["rank"], g["device"]) for g in gpu] == [(0, 0), (1, 1), (2, 2)]
    for g in gpu:
        truth = occupancy_truth(kinetogen.rank_document(g["rank"], seed=seed, world=3))
        assert g["kernel_us"] == truth["kernel_us"]
        assert g["idle_us"] == truth["idle_us"]
        assert g["compute_us"] == truth["compute_us"]
        assert g["non_compute_us"] == truth["non_compute_us"]
        assert g["idle_pct"] == pytest.approx(100 * truth["idle_us"] / truth["kernel_us"], abs=0.01)
        assert g["comm_compute_overlap_pct"] == pytest.approx(truth["overlap_pct"], abs=0.01)
        assert g["idle_pct"] + g["compute_pct"] + g["non_compute_pct"] == pytest.approx(100, abs=0.02)


def test_loaded_table_keeps_the_gpu_activity(tmp_path: Path) -> None:
    kinetogen.write_job(tmp_path, ranks=2, seed=14)
    trace = load_traces(tmp_path)
    kernels = sum(1 for rank in range(2) for e in kinetogen.rank_document(rank, seed=14, world=2)["traceEvents"]
                  if e.get("cat") in GPU_CATS)
    assert trace.activity.filter(trace.activity["stream"].is_not_null()).height == kernels
    assert set(trace.activity.get_column("rank").to_list()) == {0, 1}
    assert summarize(trace).gpu == summarize(tmp_path).gpu != []


def test_kernels_of_the_last_profiler_step_are_left_out(tmp_path: Path) -> None:
    doc = kinetogen.rank_document(0, seed=1)
    kinetogen.write_document(doc, tmp_path / "r0.pt.trace.json")
    gpu = summarize(tmp_path).gpu[0]
    last_step = max(e["ts"] for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    launched = {e["args"]["correlation"] for e in doc["traceEvents"]
                if e.get("cat") == "cuda_runtime" and e["ts"] < last_step}
    in_steps = [e for e in doc["traceEvents"] if e.get("cat") in GPU_CATS and e["args"]["correlation"] in launched]
    every = [e for e in doc["traceEvents"] if e.get("cat") in GPU_CATS]
    assert len(in_steps) < len(every)
    assert gpu["kernels"] == len(in_steps)


def test_no_communication_means_no_overlap(tmp_path: Path) -> None:
    kinetogen.write_job(tmp_path, ranks=1, seed=2, with_comm=False)
    gpu = summarize(tmp_path).gpu[0]
    assert gpu["comm_compute_overlap_pct"] is None
    assert "communication" not in {k["type"] for k in gpu["top_kernels"]}


def test_kernel_types() -> None:
    import polars as pl

    from dftrace.analysis.answers.gpu import kernel_type

    names = {
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)": "communication",
        "Memcpy DtoH (Device -> Pageable)": "memory",
        "Memset (Device)": "memory",
        "dma_copy": "memory",
        "Stream Sync": "other",
        "void at::native::vectorized_elementwise_kernel<4>(int)": "computation",
        "void nccl_helper_kernel(int)": "computation",  # not ^nccl.*Kernel: a lower-case k
        "fused_MemcpyLike_kernel": "other",  # contains Memcpy
    }
    got = pl.DataFrame({"name": list(names)}).select(kernel_type(pl.col("name"))).to_series().to_list()
    assert dict(zip(names, got)) == names


# --- against HolisticTraceAnalysis -----------------------------------------------------


def hta_figures(directory: Path) -> dict[Any, dict[str, Any]]:
    """HTA 0.5.0's temporal breakdown, overlap and idle-time split per rank, and its
    kernel-type times over all ranks (key ``kernel_type_us``)."""
    pytest.importorskip("hta", reason="HolisticTraceAnalysis 0.5.0 is not installed (pip install "
                                       "'dftrace[gpu-check]'): no comparison with the reference")
    logging.getLogger("hta").setLevel(logging.ERROR)
    from hta.trace_analysis import TraceAnalysis

    analysis = TraceAnalysis(trace_dir=str(directory))
    temporal = analysis.get_temporal_breakdown(visualize=False).set_index("rank")
    overlap = analysis.get_comm_comp_overlap(visualize=False).set_index("rank")
    kernel_types, _ = analysis.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)
    figures: dict[Any, Any] = {"kernel_type_us": {row["kernel_type"].lower(): row["sum"]
                                                  for _, row in kernel_types.iterrows()}}
    for rank in temporal.index:
        idle, _ = analysis.get_idle_time_breakdown(ranks=[int(rank)], visualize=False)
        by_cause = idle.groupby("idle_category")["idle_time"].sum()
        row = temporal.loc[rank]
        value = overlap.loc[rank]["comp_comm_overlap_pctg"]
        figures[int(rank)] = {
            "idle_pct": row["idle_time_pctg"], "compute_pct": row["compute_time_pctg"],
            "non_compute_pct": row["non_compute_time_pctg"], "kernel_us": row["kernel_time(us)"],
            "overlap_pct": None if value != value else value,
            "idle_share": {cause: 100 * by_cause.get(cause, 0) / by_cause.sum() for cause in
                           ("host_wait", "kernel_wait", "other")},
        }
    return figures


@pytest.mark.filterwarnings("ignore")  # HTA's pandas deprecations and its 0/0 without communication
@pytest.mark.parametrize("options", [
    {"ranks": 4, "seed": 11},
    {"ranks": 2, "seed": 12, "with_comm": False},
    {"ranks": 3, "seed": 13, "gzip_files": False, "steps": 6},
])
def test_gpu_figures_match_hta(tmp_path: Path, options: dict[str, Any]) -> None:
    kinetogen.write_job(tmp_path, **options)
    assert_figures_match_hta(tmp_path)


def assert_figures_match_hta(tmp_path: Path) -> None:
    """Every rank's GPU figures from ``summarize`` equal HTA's for the traces there."""
    reference = hta_figures(tmp_path)
    gpu = summarize(tmp_path).gpu
    by_type = reference.pop("kernel_type_us")
    assert sorted(g["rank"] for g in gpu) == sorted(reference)
    # busy time per combination of kernel types, summed over ranks as HTA gives it
    ours: dict[str, int] = {}
    for g in gpu:
        for kind, us in g["kernel_type_us"].items():
            ours[kind] = ours.get(kind, 0) + us
    assert ours == pytest.approx({k: v for k, v in by_type.items() if v}, rel=0.01)
    for g in gpu:
        ref = reference[g["rank"]]
        assert g["idle_pct"] == pytest.approx(ref["idle_pct"], abs=1)
        assert g["compute_pct"] == pytest.approx(ref["compute_pct"], abs=1)
        assert g["non_compute_pct"] == pytest.approx(ref["non_compute_pct"], abs=1)
        if ref["overlap_pct"] is None:
            assert g["comm_compute_overlap_pct"] is None
        else:
            assert g["comm_compute_overlap_pct"] == pytest.approx(ref["overlap_pct"], abs=2)
        for cause, share in ref["idle_share"].items():
            assert g["idle_by_cause"][f"{cause}_pct"] == pytest.approx(share, abs=1)


# --- a real profiler trace, CPU only ---------------------------------------------------


@pytest.mark.filterwarnings("ignore:.*Profiler clears events")
def test_real_torch_profiler_cpu_trace(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    path = tmp_path / "worker.pt.trace.json"

    def save(prof: Any) -> None:
        prof.export_chrome_trace(str(path))

    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=3),
                 on_trace_ready=save) as prof:
        for _ in range(4):
            x = torch.randn(64, 64)
            with record_function("my_block"):
                (x @ x).sum()
            prof.step()
    doc = json.loads(path.read_text())
    summary = summarize(path)
    rows = host_events(doc)
    assert summary.overview["events"] == len(rows)
    assert sum(f["broken_count"] for f in summary.files) == 0
    ops = sum(1 for e in rows if e["cat"] == "cpu_op")
    assert sum(c["count"] for c in summary.categories if c["cat"] == "cpu_op") == ops
    steps = sorted(int(e["name"].split("#")[1]) for e in rows if e["name"].startswith("ProfilerStep#"))
    assert steps and sorted({s["step"] for s in summary.steps}) == steps
    assert summary.gpu == []
    # the events sit where the clock put them: base + ts, within the time the test ran
    first = min(e["ts"] for e in rows)
    trace = load_traces(path)
    assert trace.events.get_column("ts").min() == epoch_us(doc.get("baseTimeNanoseconds", 0), first)


def test_gzip_document_is_one_partition(tmp_path: Path) -> None:
    from dftrace.analysis.read.sources import plan_partitions

    path = kinetogen.write_document(kinetogen.rank_document(0, steps=30), tmp_path / "big.json.gz")
    assert len(plan_partitions([str(path)], partition_bytes=1024)) == 1
    assert gzip.decompress(path.read_bytes()).lstrip().startswith(b"{")


def test_sql_kernels_table_and_gpu_view(tmp_path: Path) -> None:
    kinetogen.write_job(tmp_path, ranks=2, seed=8)
    docs = [kinetogen.rank_document(rank, seed=8, world=2) for rank in range(2)]
    kernels = run_sql("SELECT rank, stream, count(*) AS n, sum(dur) AS us FROM kernels GROUP BY rank, stream "
                      "ORDER BY rank, stream", tmp_path)
    expected = {}
    for rank, doc in enumerate(docs):
        for e in doc["traceEvents"]:
            if e.get("cat") in GPU_CATS:
                n, us = expected.get((rank, e["args"]["stream"]), (0, 0.0))
                expected[(rank, e["args"]["stream"])] = (n + 1, us + e["dur"])
    got = {(r["rank"], r["stream"]): (r["n"], r["us"]) for r in kernels.to_dicts()}
    assert got.keys() == expected.keys()
    for key, (n, us) in expected.items():
        assert got[key][0] == n and got[key][1] == pytest.approx(us, abs=0.01)
    # each kernel's launch is the runtime call with its correlation id
    launches = run_sql("SELECT launch_name, count(*) AS n FROM kernels GROUP BY launch_name ORDER BY launch_name",
                       tmp_path)
    assert set(launches.get_column("launch_name").to_list()) == {"cudaLaunchKernel", "cudaMemcpyAsync",
                                                                 "cudaMemsetAsync"}
    gpu = run_sql("SELECT rank, device, idle_pct, compute_pct FROM gpu ORDER BY rank", tmp_path)
    summary = summarize(tmp_path).gpu
    assert gpu.to_dicts() == [{k: g[k] for k in ("rank", "device", "idle_pct", "compute_pct")} for g in summary]
    counted = run_sql("SELECT rank, count(*) AS n FROM kernels WHERE counted GROUP BY rank ORDER BY rank", tmp_path)
    assert counted.get_column("n").to_list() == [g["kernels"] for g in summary]
    # device, stream and correlation are columns of events too
    events = run_sql("SELECT count(*) AS n FROM events WHERE stream IS NOT NULL AND correlation IS NOT NULL", tmp_path)
    assert events.item() == sum(expected[k][0] for k in expected)


def test_report_and_diff_show_the_gpu(tmp_path: Path) -> None:
    from dftrace.analysis import compare_runs, render_html

    kinetogen.write_job(tmp_path / "a", ranks=2, seed=9)
    kinetogen.write_job(tmp_path / "b", ranks=2, seed=10, with_comm=False)
    base, new = summarize(tmp_path / "a"), summarize(tmp_path / "b")
    page = render_html(base)
    assert "GPU time per rank and device" in page
    assert "rank 0 · GPU 0" in page
    rows = {r.metric: r for r in compare_runs(tmp_path / "a", tmp_path / "b").rows}
    mean_idle = sum(g["idle_pct"] for g in base.gpu) / len(base.gpu) / 100
    assert rows["gpu.idle"].base == pytest.approx(mean_idle, abs=1e-4)
    assert rows["gpu.comm_compute_overlap"].new is None  # no communication in NEW
    assert rows["gpu.compute"].new == pytest.approx(sum(g["compute_pct"] for g in new.gpu) / 200, abs=1e-4)
    waits = [s["sync_wait_us"] for s in base.gpu_steps]
    assert rows["gpu.step_sync_wait"].base == pytest.approx(sum(waits) / len(waits))
    assert rows["gpu.step_busy"].new == pytest.approx(
        sum(s["gpu_busy_pct"] for s in new.gpu_steps) / len(new.gpu_steps) / 100, abs=1e-4)
    from dftrace.analysis.render.diff import render_diff

    printed = render_diff(compare_runs(tmp_path / "a", tmp_path / "b"))
    (overlap,) = [line for line in printed.splitlines() if line.strip().startswith("gpu.comm_compute_overlap")]
    assert "only in base" in overlap  # communication in BASE alone
    same = render_diff(compare_runs(tmp_path / "b", tmp_path / "b"))
    (overlap,) = [line for line in same.splitlines() if line.strip().startswith("gpu.comm_compute_overlap")]
    assert "only in" not in overlap  # in neither run: no change to speak of


# --- joined to dftrace's steps ---------------------------------------------------------


def gpu_of_process(pid: int, host: str, start_us: int, end_us: int, seed: int) -> dict[str, Any]:
    """A profiler trace of process ``pid`` on ``host`` (times: epoch µs, no base, whole µs):
    kernels on two streams launched a little before they run, device syncs, asynchronous
    copies into pageable memory, and ProfilerStep spans numbered unlike dftrace's steps."""
    rng = __import__("random").Random(seed)
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "ts": start_us, "args": {"labels": "CPU"}}]
    t, correlation = start_us, 1
    free = {7: start_us, 13: start_us}  # when each stream is done with its last kernel
    while t < end_us:
        correlation += 1
        roll = rng.random()
        if roll < 0.1:
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": pid, "tid": pid,
                           "ts": t, "dur": rng.randint(10, 60), "args": {"correlation": correlation}})
            t += 70
            continue
        launch_dur = 3 if roll > 0.2 else 25
        name = "cudaLaunchKernel" if roll > 0.2 else "cudaMemcpyAsync"
        events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": pid, "tid": pid, "ts": t,
                       "dur": launch_dur, "args": {"correlation": correlation}})
        stream = 7 if roll > 0.6 else 13
        kernel = {"ph": "X", "cat": "kernel" if roll > 0.2 else "gpu_memcpy",
                  "name": "gemm_kernel" if roll > 0.2 else "Memcpy DtoH (Device -> Pageable)", "pid": 0,
                  "tid": stream, "ts": max(t + rng.randint(4, 30), free[stream]), "dur": rng.randint(5, 80),
                  "args": {"device": 0, "stream": stream, "correlation": correlation}}
        free[stream] = kernel["ts"] + kernel["dur"]
        events.append(kernel)
        t += rng.randint(5, 60)
    for number, at in enumerate(range(start_us, end_us, (end_us - start_us) // 3)):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number + 100}", "pid": pid,
                       "tid": pid, "ts": at, "dur": (end_us - start_us) // 3, "args": {}})
    return {"schemaVersion": 1, "host_name": host, "distributedInfo": {"rank": 0}, "traceEvents": events}


def covered(intervals: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Microseconds of [lo, hi) inside any of the intervals, counted one by one."""
    return len({u for a, b in intervals for u in range(max(a, lo), min(b, hi))})


def test_gpu_joined_to_dftrace_steps(tmp_path: Path) -> None:
    import tracegen

    tracegen.write_run(tmp_path, ranks=1)
    alone = summarize(tmp_path)
    start, end = alone.overview["start_us"], alone.overview["end_us"]
    doc = gpu_of_process(1000, "node0", start, end, seed=3)
    kinetogen.write_document(doc, tmp_path / "node0_1000.1.pt.trace.json")
    joined = summarize(tmp_path)
    assert joined.overview["processes"] == 1  # the profiler trace joins dftrace's process
    # dftrace's steps stand: the profiler's ProfilerStep#100.. do not become steps
    assert [(s["epoch"], s["step"], s["dur_us"]) for s in joined.rank_steps] == \
        [(s["epoch"], s["step"], s["dur_us"]) for s in alone.rank_steps]
    rows = joined.gpu_steps
    assert len(rows) == len(alone.rank_steps)
    # the process has dftrace's clock anchor, so the join states its error bound
    assert all(row["clock_bound_us"] is not None and row["clock_bound_us"] >= 2 for row in rows)
    events = doc["traceEvents"]
    kernels = [e for e in events if e.get("cat") in GPU_CATS]
    launch_at = {e["args"]["correlation"]: e["ts"] for e in events if e.get("cat") == "cuda_runtime"}
    blocking = {e["args"]["correlation"] for e in kernels if "Pageable" in e["name"]}
    waits = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "cuda_runtime"
             and (e["name"] == "cudaDeviceSynchronize" or e["args"]["correlation"] in blocking)]
    busy = [(e["ts"], e["ts"] + e["dur"]) for e in kernels]
    checked = 0
    for row in rows:
        lo, hi = row["start_us"], row["start_us"] + row["dur_us"]
        inside = [e for e in kernels if lo <= launch_at[e["args"]["correlation"]] < hi]
        assert row["kernels_launched"] == len(inside)
        assert row["kernel_us_launched"] == sum(e["dur"] for e in inside)
        assert row["gpu_busy_pct"] == pytest.approx(100 * covered(busy, lo, hi) / (hi - lo), abs=0.01)
        compute = [(e["ts"], e["ts"] + e["dur"]) for e in kernels if e["cat"] == "kernel"]
        assert row["gpu_compute_pct"] == pytest.approx(100 * covered(compute, lo, hi) / (hi - lo), abs=0.01)
        assert row["sync_wait_us"] == covered(waits, lo, hi)
        checked += bool(inside)
    assert checked >= 2


def test_sql_span_gpu_attributes_kernels_to_the_spans_that_launched_them(tmp_path: Path) -> None:
    import tracegen

    tracegen.write_run(tmp_path, ranks=1)
    alone = summarize(tmp_path)
    doc = gpu_of_process(1000, "node0", alone.overview["start_us"], alone.overview["end_us"], seed=4)
    kinetogen.write_document(doc, tmp_path / "node0_1000.1.pt.trace.json")
    events = doc["traceEvents"]
    launch_at = {e["args"]["correlation"]: (e["ts"], e["tid"]) for e in events if e.get("cat") == "cuda_runtime"}
    kernels = [(launch_at[e["args"]["correlation"]], e["dur"]) for e in events if e.get("cat") in GPU_CATS]
    dftrace_events = load_traces(sorted(tmp_path.glob("*.pfw*"))).events
    spans = dftrace_events.filter(dftrace_events["ph"] == "X")
    expected: dict[str, tuple[int, int]] = {}
    for span in spans.iter_rows(named=True):
        inside = [dur for (at, tid), dur in kernels
                  if tid == span["tid"] and span["ts"] <= at < span["ts"] + span["dur"]]
        n, us = expected.get(span["name"], (0, 0))
        expected[span["name"]] = (n + len(inside), us + sum(inside))
    got = run_sql("SELECT name, sum(kernels) AS n, sum(kernel_us) AS us FROM span_gpu "
                  "WHERE cat NOT IN ('cuda_runtime', 'kernel', 'gpu_memcpy', 'user_annotation') GROUP BY name",
                  tmp_path)
    got_map = {r["name"]: (r["n"], r["us"]) for r in got.to_dicts()}
    # spans on threads that launched nothing (the loader's) have no row
    launching = {k: v for k, v in expected.items() if v[0]}
    assert {k: v for k, v in got_map.items() if v[0]} == launching
    assert sum(n for n, _ in expected.values()) > 0
    # the summary has the same per name, for dftrace's spans (read again for it)
    for summary in (summarize(tmp_path), summarize(load_traces(tmp_path))):
        by_name = {s["name"]: (s["kernels"], s["kernel_us"]) for s in summary.gpu_spans}
        assert by_name == {k: v for k, v in launching.items() if k in by_name}
        assert set(by_name) == set(launching)


#: How far torch.profiler's calibration of its clock may be off on a loaded machine (µs).
PROFILER_CALIBRATION_US = 8_000


@pytest.mark.filterwarnings("ignore:.*Profiler clears events")
def test_real_profiler_and_dftrace_share_one_clock(tmp_path: Path) -> None:
    """A process traced by dftrace and by torch.profiler at once: its two files are one
    process, and each record_function lies inside the dftrace span around it, up to
    the clock bound the join states."""
    pytest.importorskip("torch")
    script = tmp_path / "run.py"
    script.write_text(
        "import os, time, torch, dftrace\n"
        "from dftrace import ai\n"
        "from torch.profiler import profile, ProfilerActivity, record_function\n"
        "dftrace.initialize(log_file='traces/train', compression='none')\n"
        "with profile(activities=[ProfilerActivity.CPU]) as prof:\n"
        "    for step in range(4):\n"
        "        with ai.compute.forward(args={'step': step}):\n"
        "            with record_function(f'fwd{step}'):\n"
        "                x = torch.randn(200, 200); (x @ x).sum()\n"
        "        time.sleep(0.02)\n"
        "prof.export_chrome_trace(f'traces/{os.uname().nodename}_{os.getpid()}.pt.trace.json')\n"
        "dftrace.finalize()\n"
    )
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    trace = load_traces(tmp_path / "traces")
    assert trace.processes.height == 1
    anchor = trace.processes.get_column("wall_ns")[0]
    mono = trace.processes.get_column("mono_ns")[0]
    events = trace.events
    spans = {s: r for r in events.filter(events["name"] == "forward").iter_rows(named=True) for s in [r["step"]]}
    annotations = events.filter(events["name"].str.starts_with("fwd"))
    assert annotations.height == 4
    from dftrace.analysis.answers.gpu import clock_bound_us

    for row in annotations.iter_rows(named=True):
        outer = spans[int(row["name"][3:])]
        # The join's bound, plus the profiler's own calibration of its clock against
        # the wall clock, which a busy machine can interrupt (it read 6 ms off once
        # while the suite shared 2 cores with installs): a join off by a step (the
        # steps are 20 ms apart) or by the clocks' offset (seconds) still fails.
        bound = clock_bound_us([(anchor, mono)], row["ts"] * 1000) + PROFILER_CALIBRATION_US
        assert outer["ts"] - bound <= row["ts"]
        assert row["ts"] + row["dur"] <= outer["ts"] + outer["dur"] + bound
        assert row["tid"] == outer["tid"]


def test_hostile_documents_are_reported_not_raised(tmp_path: Path) -> None:
    events: list[Any] = [
        1, "x", None, [], {}, {"ph": 5}, {"ph": "X"},
        {"ph": "X", "pid": "Spans", "ts": 1},                     # the profiler's own track: left out
        {"ph": "X", "pid": 1, "ts": "12", "dur": 3},               # ts not a number
        {"ph": "X", "pid": 1, "ts": 1e300, "dur": 1},              # out of range
        {"ph": "X", "pid": 1, "ts": 7, "dur": -5},                 # negative dur
        {"ph": "X", "pid": 1, "tid": "t", "ts": 5, "dur": 2, "args": [1]},
        {"ph": "X", "pid": 2, "tid": 7, "ts": 5, "dur": 2, "cat": "kernel",
         "args": {"stream": "7", "device": 0, "correlation": 1.5}},
        {"ph": "M", "pid": 1, "name": "thread_name", "tid": 3, "args": {"name": 5}},
        {"ph": "X", "pid": 1, "tid": 1, "ts": 10, "dur": 1, "cat": "user_annotation", "name": "ProfilerStep#x"},
        {"ph": "X", "pid": 1, "tid": 1, "ts": 10, "dur": 1, "cat": "cuda_runtime", "name": "cudaLaunchKernel",
         "args": {"correlation": 3}},
    ]
    doc = {"traceEvents": events, "distributedInfo": {"rank": "3"}, "baseTimeNanoseconds": "x", "host_name": 7}
    (tmp_path / "odd.json").write_text(json.dumps(doc))
    (tmp_path / "not-a-list.json").write_bytes(b'{"traceEvents": 5}')
    summary = summarize(tmp_path)
    broken = {Path(f["path"]).name: f["broken_count"] for f in summary.files}
    # four non-objects, two without ph, one without pid, a string ts, one out of range, a negative dur
    assert broken == {"odd.json": 10, "not-a-list.json": 1}
    assert summary.overview["events"] == 4
    assert summary.processes[0]["rank"] is None and summary.processes[0]["host"] == "odd"
    out = run_cli("validate", str(tmp_path / "odd.json"))
    assert out.returncode == 1 and "[kineto] traceEvents[12]: GPU activity without an integer stream" in out.stdout
    out = run_cli("summary", str(tmp_path))
    assert out.returncode == 0 and "Traceback" not in out.stderr


def test_stream_lanes(tmp_path: Path) -> None:
    import polars as pl

    from dftrace.analysis.answers.gpu import stream_lanes

    kinetogen.write_job(tmp_path, ranks=1, seed=15)
    gpu = summarize(tmp_path).gpu[0]
    doc = kinetogen.rank_document(0, seed=15)
    last_step = max(e["ts"] for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    launched = {e["args"]["correlation"] for e in doc["traceEvents"]
                if e.get("cat") == "cuda_runtime" and e["ts"] < last_step}
    for lane in gpu["streams"]:
        spans = [(math.ceil(e["ts"]), math.floor(e["ts"] + e["dur"])) for e in doc["traceEvents"]
                 if e.get("cat") in GPU_CATS and e["args"]["stream"] == lane["stream"]
                 and e["args"]["correlation"] in launched]
        assert lane["kernels"] == len(spans)
        assert lane["busy_us"] == covered(spans, -(2**62), 2**62)
        assert sum(b - a for a, b in lane["busy"]) == lane["busy_us"]  # uncoarsened: exactly the busy time
    # coarsened: the largest gaps stay, every busy microsecond stays inside an interval
    kernels = pl.DataFrame({"stream": [7] * 6, "ts": [0, 10, 12, 30, 31, 100], "end": [5, 11, 20, 31, 40, 101]})
    lane = stream_lanes(kernels, limit=3)[0]
    # merged: [0,5] [10,11] [12,20] [30,40] [100,101]; gaps 5, 1, 10, 60: the two largest stay
    assert lane["busy"] == [[0, 20], [30, 40], [100, 101]]
    assert lane["busy_us"] == 5 + 1 + 8 + 10 + 1


def test_profiling_windows_of_one_process_are_timelines_of_their_own(tmp_path: Path) -> None:
    """Two profiler traces of one process (two windows, a second apart, with the same
    correlation ids): the time between them is not idle, and ids never cross windows."""
    first = kinetogen.rank_document(0, seed=16)
    second = kinetogen.rank_document(0, seed=17)
    for event in second["traceEvents"]:
        event["ts"] = round(event["ts"] + 1_000_000, 3)
    a = kinetogen.write_document(first, tmp_path / "w1.pt.trace.json")
    b = kinetogen.write_document(second, tmp_path / "w2.pt.trace.json")
    alone = [summarize(path).gpu[0] for path in (a, b)]
    both = summarize([a, b])
    assert both.overview["processes"] == 1
    (gpu,) = both.gpu
    for key in ("kernels", "kernel_us", "idle_us", "compute_us", "non_compute_us"):
        assert gpu[key] == alone[0][key] + alone[1][key]
    for cause in ("host_wait_us", "kernel_wait_us", "other_us"):
        assert gpu["idle_by_cause"][cause] == alone[0]["idle_by_cause"][cause] + alone[1]["idle_by_cause"][cause]


def clipped_union_ns(intervals: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Length of the union of intervals inside [lo, hi), by sorting and sweeping."""
    total, reach = 0, lo
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, hi)
        if b > a:
            total += b - a
            reach = b
    return total


def test_sync_wait_per_step_stays_within_each_rank(tmp_path: Path) -> None:
    """Every rank's correlation ids start alike: a rank's waits are its own calls only."""
    kinetogen.write_job(tmp_path, ranks=2, seed=21, steps=5)
    rows = summarize(tmp_path).gpu_steps
    assert {r["rank"] for r in rows} == {0, 1}
    for rank in (0, 1):
        doc = kinetogen.rank_document(rank, seed=21, world=2, steps=5)
        def ns(us: float) -> int:
            return int(Decimal(kinetogen.BASE_NS) + Decimal(repr(us)) * 1000)

        blocking = {e["args"]["correlation"] for e in doc["traceEvents"]
                    if e.get("name") == "Memcpy DtoH (Device -> Pageable)"}
        waits = [(ns(e["ts"]), ns(e["ts"]) + int(Decimal(repr(e["dur"])) * 1000)) for e in doc["traceEvents"]
                 if e.get("cat") == "cuda_runtime"
                 and (e["name"] == "cudaDeviceSynchronize" or e["args"]["correlation"] in blocking)]
        for row in (r for r in rows if r["rank"] == rank):
            lo, hi = row["start_us"] * 1000, (row["start_us"] + row["dur_us"]) * 1000
            assert row["sync_wait_us"] == pytest.approx(clipped_union_ns(waits, lo, hi) / 1000, abs=1e-3)


@pytest.mark.filterwarnings("ignore:.*Profiler clears events")
def test_real_tensorboard_handler_gzip_files(tmp_path: Path) -> None:
    """What ``tensorboard_trace_handler(use_gzip=True)`` writes on a schedule: one
    ``.pt.trace.json.gz`` per active window, each read as a trace of the process."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    handler = tensorboard_trace_handler(str(tmp_path), worker_name="worker0", use_gzip=True)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2, repeat=2),
                 on_trace_ready=handler) as prof:
        for _ in range(8):
            x = torch.randn(64, 64)
            (x @ x).sum()
            prof.step()
    files = sorted(tmp_path.glob("*.pt.trace.json.gz"))
    assert len(files) == 2
    summary = summarize(tmp_path)
    assert summary.overview["processes"] == 1 and summary.overview["files"] == 2
    docs = [json.loads(gzip.decompress(path.read_bytes())) for path in files]
    assert summary.overview["events"] == sum(len(host_events(doc)) for doc in docs)
    steps = sorted(int(e["name"].split("#")[1]) for doc in docs for e in host_events(doc)
                   if e["name"].startswith("ProfilerStep#"))
    assert sorted({s["step"] for s in summary.steps}) == steps


# --- real GPU traces: a two-rank DDP job on an NVIDIA H200 ------------------------------
# tests/data/gpu-h200, written by bench/gpu_job.py (2 ranks, gloo on one GPU, an MLP
# under DistributedDataParallel, profile_steps every 10 steps, 2 active): each rank's
# dftrace file, its DataLoader workers' files and three profiler windows.

GPU_JOB = Path(__file__).resolve().parents[1] / "data" / "gpu-h200"
WINDOWS = ("steps-8-9", "steps-18-19", "steps-28-29")


@pytest.mark.filterwarnings("ignore")  # HTA's pandas deprecations and its 0/0 without communication
@pytest.mark.parametrize("window", WINDOWS)
def test_real_gpu_traces_match_hta(tmp_path: Path, window: str) -> None:
    """On real kernels, copies and sets of an H200, each window's figures are HTA's."""
    windows = sorted(GPU_JOB.glob(f"*.{window}.pt.trace.json.gz"))
    assert len(windows) == 2
    for path in windows:
        (tmp_path / path.name).write_bytes(path.read_bytes())
    assert_figures_match_hta(tmp_path)


def _document(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rb") as fh:
        return orjson.loads(fh.read())


def test_real_gpu_job_joined_to_dftrace_steps() -> None:
    """dftrace's files and the profiler's windows of one rank are one process; each
    dftrace step the profiler recorded (a tenth of it or more) has a row whose kernel
    count and GPU time are those of the kernels launched in it, counted here from the
    profiler's own JSON, and the clock bound comes from the anchor of its window."""
    summary = summarize(GPU_JOB, index=False)
    assert summary.overview["ranks"] == 2
    assert summary.overview["processes"] == 10  # 2 ranks and their 8 loader workers
    rows = {(r["rank"], r["epoch"], r["step"]): r for r in summary.gpu_steps}
    expected_rows = set()
    for rank in (0, 1):
        docs = [_document(p) for p in sorted(GPU_JOB.glob(f"train-rank{rank}-*.pt.trace.json.gz"))]
        assert len(docs) == 3
        kernels, recorded = [], []
        for doc in docs:
            base, events = doc["baseTimeNanoseconds"], doc["traceEvents"]
            launch = {e["args"]["correlation"]: base + round(e["ts"] * 1000) for e in events
                      if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
            kernels += [(launch[e["args"]["correlation"]], e["dur"]) for e in events
                        if e.get("cat") in GPU_CATS and e["args"].get("correlation") in launch]
            recorded += [(base + round(e["ts"] * 1000), base + round((e["ts"] + e["dur"]) * 1000))
                         for e in events if e.get("cat") == "user_annotation" and str(e.get("name")).startswith("ProfilerStep#")]
        assert len(kernels) > 300
        mine = [step for step in summary.rank_steps if step["rank"] == f"rank {rank}"]
        assert len(mine) == 32  # 2 epochs of 16 steps
        # rank_steps' times are relative to the run's start: one row gives the origin
        some = next(r for r in rows.values() if r["rank"] == rank)
        origin = some["start_us"] - next(s["start_us"] for s in mine if (s["epoch"], s["step"]) ==
                                         (some["epoch"], some["step"]))
        for step in mine:
            lo = (origin + step["start_us"]) * 1000
            hi = lo + step["dur_us"] * 1000
            seen = sum(max(0, min(hi, b) - max(lo, a)) for a, b in recorded)
            if seen == 0 or seen < 0.1 * (hi - lo):
                continue
            key = (rank, step["epoch"], step["step"])
            expected_rows.add(key)
            row = rows[key]
            assert row["start_us"] * 1000 == lo and row["dur_us"] == step["dur_us"]
            inside = [dur for at, dur in kernels if lo <= at < hi]
            assert row["kernels_launched"] == len(inside)
            assert row["kernel_us_launched"] == pytest.approx(sum(inside), abs=0.01)
            assert row["profiled_pct"] == pytest.approx(100 * seen / (hi - lo), abs=0.1)
            assert 0 < row["clock_bound_us"] < 100
    assert set(rows) == expected_rows
    assert len(rows) == 12  # two steps of each of three windows, per rank


def test_window_without_host_name_joins_by_its_file_name(tmp_path: Path) -> None:
    """A profiler window that does not name its host (written by an older dftrace)
    still joins the dftrace file it is named after: the host comes from that name."""
    for path in GPU_JOB.glob("train-rank0-vm-495.*"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    window = tmp_path / "train-rank0-vm-495.steps-8-9.pt.trace.json.gz"
    doc = _document(window)
    del doc["host_name"]
    window.write_bytes(gzip.compress(orjson.dumps(doc)))
    summary = summarize(tmp_path, index=False)
    assert summary.overview["processes"] == 1
    assert {(r["epoch"], r["step"]) for r in summary.gpu_steps} >= {(0, 8), (0, 9)}
