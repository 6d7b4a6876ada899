"""What users write, per pattern, under every tracer in the same run.

Each (tracer, pattern) runs in a process of its own (``bench/_patterns.py``): the
realistic training step (``update`` + a ``fetch.iter`` item + three decorators + a
``with ...(args=)`` + a start/stop pair), and each of those patterns alone. The
tracers are no tracer at all, a minimal hand-written recorder, dftrace (recording;
off at run time; off by configuration) and DFTracer 2.2.0 (``pip install
'dftrace[bench]'``; skipped without it). Figures go to ``extra_info``; run
``python bench/report.py bench.json`` for the table in docs/performance.md.

Also here: memory per buffered event, how long the writer holds the GIL per frame,
``trace_modules`` per hooked module call and a traced DataLoader item (torch).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from time import perf_counter_ns

import pytest

import dftrace
from dftrace import ai
from dftrace._core import engine as _engine

HERE = os.path.dirname(os.path.abspath(__file__))
TRACERS = ("bare", "hand", "dftrace", "dftrace-off", "dftrace-offconfig", "dftracer")
PATTERNS = ("decorator", "with", "with_args", "update", "iter", "startstop", "stop_args", "step",
            "step_args")
N = {"step": 20_000, "step_args": 20_000, "update": 20_000}
N_DFTRACER = {"step": 2_000, "step_args": 2_000, "update": 2_000}  # its update() walks every node: slow


#: End-to-end rounds per tracer and pattern, each a fresh process: the fastest (as
#: for the hot path's fastest of five rounds) and the median are reported.
E2E_ROUNDS = 5


def _pattern_process(tracer: str, pattern: str, n: int, out: str, mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DFTRACE_", "DFTRACER_"))}
    proc = subprocess.run([sys.executable, os.path.join(HERE, "_patterns.py"), tracer, pattern,
                           str(n), out, mode], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _run_pattern(tracer: str, pattern: str, out: str) -> dict:
    """Hot path (one process, five rounds) and end to end (E2E_ROUNDS processes)."""
    n = (N_DFTRACER if tracer == "dftracer" else N).get(pattern, 50_000)
    result = _pattern_process(tracer, pattern, n, os.path.join(out, "hot"), "hot")
    e2e = [_pattern_process(tracer, pattern, n, os.path.join(out, f"e2e{i}"), "e2e")["e2e_ns"]
           for i in range(E2E_ROUNDS)]
    result["e2e_ns"] = min(e2e)
    result["e2e_median_ns"] = statistics.median(e2e)
    return result


@pytest.mark.benchmark(group="patterns")
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("tracer", TRACERS)
def test_pattern(benchmark, tmp_path, tracer, pattern):
    if tracer == "dftracer" and importlib.util.find_spec("dftracer") is None:
        pytest.skip("DFTracer is not installed: pip install 'dftrace[bench]'")
    result = _run_pattern(tracer, pattern, str(tmp_path))
    benchmark.extra_info.update(result)
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    assert result["hot_ns"] > 0 and result["e2e_ns"] > 0


# -- instructions: a figure the machine's noise does not move ---------------------------
#: Patterns whose instructions per operation are counted: the loop alone, no tracer,
#: the hand-written recorder, dftrace recording, off at run time, off by configuration.
COUNTED = ("decorator", "with", "with_args", "update", "iter", "startstop", "stop_args", "step",
           "step_args")


def _instructions(tracer: str, pattern: str, n: int, out: str) -> int:
    """Instructions (all threads) of ``_patterns.py`` end to end with ``n`` operations."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DFTRACE_", "DFTRACER_"))}
    env["PYTHONHASHSEED"] = "0"  # the same dict layouts in both runs: counts repeat exactly
    proc = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                           sys.executable, os.path.join(HERE, "_patterns.py"), tracer, pattern,
                           str(n), out, "e2e"], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return int(proc.stderr.split("Collected :")[1].split()[0])


@pytest.mark.benchmark(group="instructions")
@pytest.mark.parametrize("pattern", COUNTED)
@pytest.mark.parametrize("tracer", ("loop", "bare", "hand", "dftrace", "dftrace-off",
                                    "dftrace-disabled", "dftrace-offconfig"))
def test_instructions_per_operation(benchmark, tmp_path, tracer, pattern):
    """Instructions per operation end to end, counted by callgrind (the same count on
    every run, whatever else the machine does): the difference between 40,000 and
    10,000 operations, so the interpreter's start and the warm-up cancel out. The
    writer thread's work (encoding, compression) is counted though it runs on the
    other core; the hand-written recorder writes nothing."""
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed (apt install valgrind)")
    small, large = (_instructions(tracer, pattern, n, str(tmp_path / str(n))) for n in (10_000, 40_000))
    benchmark.extra_info.update({"tracer": tracer, "pattern": pattern,
                                 "instructions_per_op": round((large - small) / 30_000)})
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)


@pytest.mark.benchmark(group="allocations")
@pytest.mark.parametrize("pattern", COUNTED)
@pytest.mark.parametrize("tracer", ("loop", "hand", "dftrace", "dftracer"))
def test_allocations_per_operation(benchmark, tmp_path, tracer, pattern):
    """Allocations per operation once warm (CPython's allocators, the calling thread),
    the loop's own included: dftrace's are its count minus the loop's."""
    if tracer == "dftracer" and importlib.util.find_spec("dftracer") is None:
        pytest.skip("DFTracer is not installed: pip install 'dftrace[bench]'")
    if _engine.speedups is None:
        pytest.skip("the C engine is not built: its allocation counter is part of it")
    n = (N_DFTRACER if tracer == "dftracer" else N).get(pattern, 20_000)
    result = _pattern_process(tracer, pattern, n, str(tmp_path), "alloc")
    benchmark.extra_info.update(result)
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    assert result["allocs_per_op"] >= 0


# -- memory and the writer ----------------------------------------------------------------
_MEMORY = """
import gc, os, sys, psutil, dftrace
from dftrace import ai
from dftrace._core import engine as _engine
from dftrace._core.state import STATE
dftrace.initialize(log_file=sys.argv[1], buffer_limit=10**8, batch_size=10**9, flush_interval=3600)
STATE.consumer = None  # nothing drains: every record stays buffered
@ai.compute.forward
def f():
    pass
n = 1_000_000
gc.collect()
before = psutil.Process().memory_info().rss
for _ in range(n):
    f()
gc.collect()
print((psutil.Process().memory_info().rss - before) / n)
"""


@pytest.mark.benchmark(group="figures")
@pytest.mark.parametrize("engine", ["c", "python"])
def test_memory_per_buffered_event(benchmark, tmp_path, engine):
    """Resident memory per buffered span without args (1M spans, nothing drained)."""
    env = dict(os.environ, DFTRACE_NO_SPEEDUPS="1" if engine == "python" else "")
    out = subprocess.run([sys.executable, "-c", _MEMORY, str(tmp_path / "m")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    benchmark.extra_info["bytes_per_buffered_event"] = round(float(out.stdout.strip()), 1)
    benchmark.extra_info["engine"] = engine
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)


def test_writer_gil_hold_per_frame(benchmark, tmp_path):
    """Longest stretch the writer thread keeps the GIL while it writes one frame of
    16,384 records: a probe thread that only reads the clock sees it as its gap."""
    dftrace.initialize(log_file=str(tmp_path / "g"), flush_interval=3600, batch_size=10**9,
                       buffer_limit=10**8)

    @ai.compute.forward
    def f():
        return None

    session = dftrace.session()
    holds = []
    for _ in range(20):
        for _ in range(16_384):
            f()
        gaps = []
        stop = threading.Event()

        def probe():
            last = perf_counter_ns()
            worst = 0
            while not stop.is_set():
                now = perf_counter_ns()
                worst = max(worst, now - last)
                last = now
            gaps.append(worst)

        t = threading.Thread(target=probe)
        t.start()
        time.sleep(0.02)
        session.writer.flush()  # from this thread: the probe competes only with it
        stop.set()
        t.join()
        holds.append(gaps[0] / 1e6)
    dftrace.finalize()
    benchmark.extra_info["gil_hold_ms_median"] = round(statistics.median(holds), 3)
    benchmark.extra_info["gil_hold_ms_max"] = round(max(holds), 3)
    benchmark.extra_info["engine"] = "c" if _engine.speedups is not None else "python"
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)


# -- torch: a DataLoader item and trace_modules ---------------------------------------------
torch = importlib.import_module("torch") if importlib.util.find_spec("torch") else None


def _model(layers: int):
    return torch.nn.Sequential(*[torch.nn.Identity() for _ in range(layers)])


LAYERS = 100


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.benchmark(group="torch")
@pytest.mark.parametrize("variant", ["untraced", "shapes_off", "shapes_on"])
def test_trace_modules_per_hooked_call(benchmark, tracing, variant):
    """A forward through 100 hooked modules: per hooked module call."""
    from dftrace.torch import trace_modules

    model = _model(LAYERS)
    x = torch.zeros(1)
    tracing = None if variant == "untraced" else trace_modules(model, shapes=variant == "shapes_on")
    benchmark.extra_info["events_per_round"] = LAYERS
    with torch.no_grad():
        benchmark.pedantic(model, args=(x,), rounds=200, iterations=1, warmup_rounds=5)
    if tracing is not None:
        tracing.remove()


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.benchmark(group="torch")
@pytest.mark.parametrize("variant", ["untraced", "traced"])
def test_dataloader_item(benchmark, tracing, variant):
    """One batch of 64 items from a map-style dataset (num_workers=0), per item."""
    from torch.utils.data import DataLoader

    from dftrace.torch import trace_dataloader

    data = list(range(64 * 50))
    loader = DataLoader(data, batch_size=64)
    if variant == "traced":
        loader = trace_dataloader(loader)
    benchmark.extra_info["events_per_round"] = len(data)

    def epoch():
        for _ in loader:
            pass

    benchmark.pedantic(epoch, rounds=10, iterations=1, warmup_rounds=1)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.benchmark(group="torch")
@pytest.mark.parametrize("variant", ["no_profiler", "between_windows"])
def test_profile_steps_between_windows(benchmark, tracing, variant):
    """A small training step (Linear 64x64, SGD), per step: without the profiler
    schedule, and with ``profile_steps`` waiting between two windows."""
    from dftrace.torch import profile_steps

    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)

    def step():
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    schedule = profile_steps(opt, every=10**9, active=1, warmup=0, skip_first=10**8) \
        if variant == "between_windows" else None
    benchmark.pedantic(step, rounds=2000, iterations=1, warmup_rounds=100)
    if schedule is not None:
        assert schedule.paths == []  # never profiled: the cost measured is the wait's
        schedule.stop()
