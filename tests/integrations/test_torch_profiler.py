"""dftrace.torch.profile_steps with the real PyTorch profiler (CPU activity here; with
CUDA the same files hold the GPU's kernels): windows of steps, files beside dftrace's."""

from __future__ import annotations

import gzip
import json
import os
import re

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import dftrace  # noqa: E402
import dftrace.torch as dft  # noqa: E402
from dftrace import testing  # noqa: E402


def _train(opt, model, steps: int, marks: list[int] | None = None) -> None:
    for i in range(steps):
        x = torch.randn(8, 4)
        loss = nn.functional.mse_loss(model(x), torch.zeros(8, 1))
        opt.zero_grad()
        loss.backward()
        opt.step()


def _profiler_steps(path: str) -> list[int]:
    with gzip.open(path, "rt") as fh:
        trace = json.load(fh)
    assert isinstance(trace["traceEvents"], list)
    names = [e.get("name", "") for e in trace["traceEvents"]]
    assert any(e.get("cat") == "cpu_op" for e in trace["traceEvents"])  # operators recorded
    return sorted({int(m.group(1)) for n in names if (m := re.match(r"ProfilerStep#(\d+)$", n))})


def test_windows_of_steps_are_written_beside_the_dftrace_file(tmp_path):
    """Every 5 optimizer steps, steps 3 and 4 (one warm-up step before them) are
    profiled; each window is one gzip Kineto file named after the dftrace file and the
    steps it holds, and holds exactly those ProfilerStep markers."""
    s = dftrace.initialize(log_file=str(tmp_path / "run"), rank=0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with dft.trace_compute(model, opt), dft.profile_steps(opt, every=5, active=2, warmup=1) as prof:
        _train(opt, model, 12)
    dftrace.finalize()
    stem = re.sub(r"\.pfw(\.zst|\.gz)?$", "", s.path)
    assert prof.steps == 12
    assert prof.paths == [f"{stem}.steps-3-4.pt.trace.json.gz", f"{stem}.steps-8-9.pt.trace.json.gz"]
    assert [_profiler_steps(p) for p in prof.paths] == [[3, 4], [8, 9]]
    assert os.path.basename(stem).startswith("run-rank0-")
    # dftrace's own trace is untouched: one compute.step per optimizer step
    steps = [e for e in testing.spans(testing.read_events(s.path)) if e["name"] == "step"]
    assert len(steps) == 12


def test_windows_name_their_host_and_anchor_the_clock(tmp_path):
    """Each window's file names the host as dftrace's metadata does (the analysis joins
    the two files of one process by host and pid), and dftrace's trace gets a clock
    anchor read as each window's profiler started, after the one of initialize()."""
    s = dftrace.initialize(log_file=str(tmp_path / "run"))
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with dft.profile_steps(opt, every=5, active=2) as prof:
        _train(opt, model, 12)
    dftrace.finalize()
    hosts = set()
    for path in prof.paths:
        with gzip.open(path, "rt") as fh:
            hosts.add(json.load(fh)["host_name"])
    events = testing.read_events(s.path)
    (host,) = {e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "HH"}
    assert hosts == {host}
    anchors = [e["args"] for e in events if e.get("ph") == "M" and e["name"] == "clock_anchor"]
    # three windows began: steps 3-4, 8-9, and one at step 12, stopped in its warm-up
    assert len(prof.paths) == 2 and len(anchors) == 1 + 3
    assert all(a["wall_ns"] > 0 and a["mono_ns"] > 0 for a in anchors)
    assert [a["mono_ns"] for a in anchors] == sorted(a["mono_ns"] for a in anchors)
    pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")
    from dftrace.analysis import load_traces

    trace = load_traces(tmp_path)
    assert trace.processes.height == 1  # dftrace's file and the windows are one process


def test_a_window_cut_short_by_stop_is_written(tmp_path):
    """stop() during an active window writes what was recorded; no optimizer: .step()."""
    dftrace.initialize(log_file=str(tmp_path / "run"))
    model = nn.Linear(4, 1)
    prof = dft.profile_steps(every=4, active=3, warmup=0)
    for _ in range(7):  # one step waits, three are profiled: 1-3, then 5-7, open at stop()
        model(torch.randn(2, 4)).sum().backward()
        prof.step()
    prof.stop()
    prof.step()  # after stop: nothing, no error
    assert prof.steps == 7
    assert [os.path.basename(p).split(".", 1)[1] for p in prof.paths] == [
        "steps-1-3.pt.trace.json.gz", "steps-5-6.pt.trace.json.gz"]
    assert _profiler_steps(prof.paths[0]) == [1, 2, 3]
    assert _profiler_steps(prof.paths[1])[:2] == [5, 6]  # and the step begun when stop() came


@pytest.mark.parametrize("kw, name", [({"every": 0}, "every"), ({"active": 0}, "active"),
                                      ({"every": 3, "active": 3, "warmup": 1}, "every"),
                                      ({"warmup": -1}, "warmup"), ({"every": 2.5}, "every")])
def test_bad_schedule_is_refused_naming_the_argument(kw, name):
    """A schedule that cannot work raises ValueError naming the argument, before anything runs."""
    with pytest.raises(ValueError, match=name):
        dft.profile_steps(**kw)


def test_a_cpu_only_window_is_said_to_hold_no_gpu_activity(tmp_path):
    """Profiled on a machine without CUDA: the summary says its profiler traces hold no
    GPU activity rather than leaving the GPU section out without a word."""
    pytest.importorskip("polars")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the window holds its kernels")
    from dftrace.analysis import render_text, summarize

    dftrace.initialize(log_file=str(tmp_path / "run"), rank=0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with dft.trace_compute(model, opt), dft.profile_steps(opt, every=5, active=2, warmup=1):
        _train(opt, model, 12)
    dftrace.finalize()
    summary = summarize(tmp_path)
    assert summary.gpu == [] and summary.overview["profiler_files_without_gpu"] == 2
    assert "2 PyTorch profiler traces with no GPU activity" in render_text(summary)
