"""NVTX ranges (``nvtx=True``, ``DFTRACE_NVTX=1``): every span also opens an NVTX range
named ``<cat>.<name>``, so Nsight Systems shows the ``ai`` tree above the kernels.

Tested for real: NVTX loads a tool built here (``nvtx_recorder.c``) from
``NVTX_INJECTION64_PATH``, as it loads Nsight Systems, and the tool writes down every
range it receives. The ranges must have the names and the nesting of what the program
did, and those of the spans in its trace, with either engine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

import dftrace
from dftrace import ai, testing
from dftrace._core import engine as _engine
from dftrace._core import nvtx_ranges
from dftrace._core.config import ConfigError

from _requirements import needs

HERE = Path(__file__).resolve().parent


def _compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc")


def _tool_missing() -> str | None:
    """Why the NVTX tool cannot be used here (the true cause), or None."""
    if importlib.util.find_spec("nvtx") is None:
        return "NVIDIA's nvtx package is not installed (pip install 'dftrace[nvtx]')"
    if _compiler() is None:
        return "no C compiler (cc or gcc) to build the NVTX tool"
    return None


@pytest.fixture(scope="module")
def nvtx_tool(tmp_path_factory) -> Path:
    """The NVTX tool of nvtx_recorder.c, built as a shared library."""
    lib = tmp_path_factory.mktemp("nvtx") / "libnvtx_recorder.so"
    subprocess.run([_compiler(), "-shared", "-fPIC", "-O1", "-pthread", "-o", str(lib),
                    str(HERE / "nvtx_recorder.c")], check=True)
    return lib


def replay(lines: list[str]) -> tuple[Counter, Counter]:
    """The ranges a tool received, from its lines: push ranges as ``(tid, name,
    enclosing range's name or None)`` and start/end ranges as ``(name, tid of the
    start, tid of the end)``. Fails on a pop of an empty stack, an end of a range
    never started, or a range still open at the end."""
    stacks: dict[int, list[str]] = defaultdict(list)
    pushed: Counter = Counter()
    started: dict[int, tuple[str, int]] = {}
    ended: Counter = Counter()
    for line in lines:
        kind, tid, *rest = line.split()
        tid = int(tid)
        if kind == "PUSH":
            stack = stacks[tid]
            pushed[(tid, rest[0], stack[-1] if stack else None)] += 1
            stack.append(rest[0])
        elif kind == "POP":
            assert stacks[tid], f"a pop with no range open on thread {tid}: {lines}"
            stacks[tid].pop()
        elif kind == "START":
            started[int(rest[0])] = (rest[1], tid)
        elif kind == "END":
            name, opener = started.pop(int(rest[0]))
            ended[(name, opener, tid)] += 1
    assert not any(stacks.values()), f"push ranges never popped: {dict(stacks)}"
    assert not started, f"start ranges never ended: {started}"
    return pushed, ended


def label(e: dict[str, Any]) -> str:
    return f"{e['cat']}.{e['name']}"


# A traced program with every style: decorator, with, .iter, start/stop on one
# thread and across two, a thread of its own, exits out of order, a generator and
# asyncio tasks. argv: log_file prefix, nvtx (1/0).
PROGRAM = r"""
import asyncio, json, sys, threading
import dftrace
from dftrace import ai
from dftrace._core import engine

dftrace.initialize(log_file=sys.argv[1], nvtx=sys.argv[2] == "1")


@ai.compute.forward
def forward(x):
    with ai.compute.backward:
        return x + 1


@ai.data.preprocess
def numbers():
    yield 1
    yield 2


@ai.pipeline.evaluate
async def evaluate(i):
    with ai.pipeline.test:
        await asyncio.sleep(0.01)
    return i


async def both():
    return await asyncio.gather(evaluate(1), evaluate(2))


for item in ai.dataloader.fetch.iter(range(2)):
    forward(item)
span = ai.checkpoint.capture.start()
forward(0)
span.stop()
restart = ai.checkpoint.restart.start()


def worker():
    with ai.comm.all_reduce:
        forward(1)
    restart.stop()


t = threading.Thread(target=worker)
t.start()
t.join()
epoch, step = ai.pipeline.epoch, ai.compute.step
epoch.__enter__()
step.__enter__()
epoch.__exit__(None, None, None)
step.__exit__(None, None, None)
forward(2)
list(numbers())
asyncio.run(both())
print(json.dumps({"engine": "c" if engine.speedups is not None else "python",
                  "nvtx_on": engine.NVTX_ON, "nvtx_imported": "nvtx" in sys.modules,
                  "main": threading.get_native_id(), "worker": t.native_id}))
dftrace.finalize()
"""


#: The spans PROGRAM records, by <cat>.<name>.
PROGRAM_SPANS = Counter({
    "dataloader.fetch.iter": 2, "dataloader.fetch.block": 2, "dataloader.fetch.end": 1, "compute.forward": 5,
    "compute.backward": 5, "checkpoint.capture": 1, "checkpoint.restart": 1, "comm.all_reduce": 1,
    "pipeline.epoch": 1, "compute.step": 1, "data.preprocess": 1, "pipeline.evaluate": 2,
    "pipeline.test": 2,
})


def run_program(tmp_path: Path, engine: str, nvtx: bool, tool: Path | None) -> tuple[dict, list[str], list[dict]]:
    """Run PROGRAM (with the NVTX tool attached, when given): what it printed, the
    tool's lines and the trace's events."""
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    out_file = tmp_path / "ranges.txt"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DFTRACE_", "NVTX_"))}
    env["DFTRACE_NO_SPEEDUPS"] = "1" if engine == "python" else ""
    if tool is not None:
        env["NVTX_INJECTION64_PATH"] = str(tool)
        env["NVTX_RECORDER_OUT"] = str(out_file)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "trace"), "1" if nvtx else "0"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    if info["engine"] != engine:
        pytest.skip(f"the {engine} engine is not available here (the program ran on {info['engine']})")
    lines = out_file.read_text().splitlines() if out_file.exists() else []
    return info, lines, testing.read_events(tmp_path)


@needs("nvtx", _tool_missing())
@pytest.mark.parametrize("engine", ["c", "python"])
def test_nsight_tool_receives_every_span_as_a_range(tmp_path, nvtx_tool, engine):
    """Under an NVTX tool each span is a range named <cat>.<name>: spans on a thread's
    stack push ranges that nest as the spans do on their thread (a start() span
    stopped by another thread is popped by its own thread next time it opens a
    span); generator spans and asyncio tasks' spans are start/end ranges. Exits out
    of order leave the nesting whole."""
    info, lines, events = run_program(tmp_path, engine, True, nvtx_tool)
    assert info["nvtx_on"] and info["nvtx_imported"]
    pushed, ended = replay(lines)
    main, worker = info["main"], info["worker"]

    # What the program did, counted by hand.
    assert pushed == Counter({
        (main, "dataloader.fetch.iter", None): 3,  # two items, then the fetch that ends the loop
        (main, "dataloader.fetch.block", None): 2,
        (main, "compute.forward", "dataloader.fetch.block"): 2,
        (main, "compute.forward", "checkpoint.capture"): 1,
        (main, "compute.forward", None): 1,
        (main, "compute.backward", "compute.forward"): 4,
        (main, "checkpoint.capture", None): 1,
        (main, "checkpoint.restart", None): 1,  # stopped by the worker, popped here
        (main, "pipeline.epoch", None): 1,
        (main, "compute.step", "pipeline.epoch"): 1,
        (worker, "comm.all_reduce", None): 1,
        (worker, "compute.forward", "comm.all_reduce"): 1,
        (worker, "compute.backward", "compute.forward"): 1,
    })
    assert ended == Counter({
        ("data.preprocess", main, main): 1,
        ("pipeline.evaluate", main, main): 2,
        ("pipeline.test", main, main): 2,
    })

    # The same names and nesting as the spans of the trace.
    spans = {e["id"]: e for e in testing.spans(events)}
    assert Counter(map(label, spans.values())) == PROGRAM_SPANS
    started_names = {name for name, _, _ in ended}

    def push_parent(e: dict[str, Any]) -> str | None:
        p = e["args"]["p_idx"]
        while p and label(spans[p]) in started_names:  # start ranges do not nest
            p = spans[p]["args"]["p_idx"]
        return label(spans[p]) if p else None

    from_trace = Counter((e["tid"], label(e), push_parent(e)) for e in spans.values()
                         if label(e) not in started_names and label(e) != "dataloader.fetch.end")
    # the fetch that ends the loop is pushed as an item's wait; its span is fetch.end
    from_trace[(main, "dataloader.fetch.iter", None)] += 1
    assert pushed == from_trace
    assert Counter(name for name, _, _ in ended.elements()) == Counter(
        label(e) for e in spans.values() if label(e) in started_names)


@needs("nvtx", _tool_missing())
@pytest.mark.parametrize("engine", ["c", "python"])
def test_without_nvtx_no_range_is_made(tmp_path, nvtx_tool, engine):
    """With nvtx off (the default) nothing reaches the tool and the nvtx package is
    not even imported; the trace is the same."""
    info, lines, events = run_program(tmp_path, engine, False, nvtx_tool)
    assert not info["nvtx_on"] and not info["nvtx_imported"]
    assert not [ln for ln in lines if ln.split()[0] in ("PUSH", "START")]
    assert Counter(map(label, testing.spans(events))) == PROGRAM_SPANS


@needs("nvtx", _tool_missing())
def test_without_a_tool_nvtx_costs_nothing(tmp_path):
    """nvtx=True outside Nsight (no tool attached): the ranges would go nowhere, so
    the engines make none, and the program is traced as usual."""
    info, lines, events = run_program(tmp_path, "c" if _engine.speedups is not None else "python",
                                      True, None)
    assert info["nvtx_imported"] and not info["nvtx_on"]
    assert Counter(map(label, testing.spans(events))) == PROGRAM_SPANS


def test_missing_nvtx_package_fails_initialize(tmp_path, monkeypatch):
    """nvtx=True without the nvtx package: initialize() raises a ConfigError naming
    the setting and the install line, and starts nothing."""
    monkeypatch.setitem(sys.modules, "nvtx", None)  # import nvtx raises ImportError
    with pytest.raises(ConfigError, match=r"nvtx=True \(env DFTRACE_NVTX\).*pip install 'dftrace\[nvtx\]'"):
        dftrace.initialize(log_file=str(tmp_path / "t"), nvtx=True)
    assert dftrace.session() is None
    assert testing.trace_files(tmp_path) == []


def test_missing_nvtx_package_from_the_environment_warns_and_traces(tmp_path, monkeypatch):
    """DFTRACE_NVTX=1 without the nvtx package never stops a program: one warning,
    and tracing goes on without ranges."""
    monkeypatch.setitem(sys.modules, "nvtx", None)
    monkeypatch.setenv("DFTRACE_NVTX", "1")
    with pytest.warns(RuntimeWarning, match=r"DFTRACE_NVTX.*pip install 'dftrace\[nvtx\]'.*without NVTX"):
        with testing.trace_to(tmp_path) as t:
            assert not _engine.NVTX_ON
            with ai.compute.step:
                pass
    testing.assert_span(t, "step", count=1)


class FakeDomain:
    """Plays NVTX's domain in this process, writing the NVTX tool's lines."""

    def __init__(self, fail: bool = False):
        self.lines: list[str] = []
        self.fail = fail
        self.last = 0

    def get_event_attributes(self, message: str) -> str:
        return message

    def push_range(self, a: str) -> None:
        if self.fail:
            raise RuntimeError("the tool failed")
        self.lines.append(f"PUSH {threading.get_native_id()} {a}")

    def pop_range(self) -> None:
        self.lines.append(f"POP {threading.get_native_id()}")

    def start_range(self, a: str) -> int:
        if self.fail:
            raise RuntimeError("the tool failed")
        self.last += 1
        self.lines.append(f"START {threading.get_native_id()} {self.last} {a}")
        return self.last

    def end_range(self, r: int) -> None:
        self.lines.append(f"END {threading.get_native_id()} {r}")


@pytest.fixture
def fake_tool(monkeypatch) -> FakeDomain:
    """NVTX ranges on, into a FakeDomain (in a session started by the test)."""
    domain = FakeDomain()
    monkeypatch.setattr(nvtx_ranges, "_domain", domain)
    monkeypatch.setattr(nvtx_ranges, "_attrs", [])
    return domain


def test_a_span_closed_by_another_thread_leaves_both_threads_nesting_whole(tmp_path, fake_tool):
    """A span that ends on another thread (an .iter() loop body closed there) cannot
    pop its push range there (NVTX pops the caller's): nothing is popped on that
    thread, and the range ends when its own thread next opens a span, so every
    thread's ranges stay balanced and nest as the spans do."""
    with testing.trace_to(tmp_path) as t:
        _engine.use_nvtx(True)
        with ai.pipeline.epoch:
            it = iter(ai.dataloader.fetch.iter(range(3)))
            next(it)  # its loop body's span is open now
            closer = threading.Thread(target=it.close)
            closer.start()
            closer.join()
            with ai.compute.forward:
                pass
    testing.assert_span(t, "fetch.block", count=1)
    main = threading.get_native_id()
    pushed, ended = replay(fake_tool.lines)
    assert pushed == Counter({
        (main, "pipeline.epoch", None): 1,
        (main, "dataloader.fetch.iter", "pipeline.epoch"): 1,
        (main, "dataloader.fetch.block", "pipeline.epoch"): 1,
        (main, "compute.forward", "pipeline.epoch"): 1,
    })
    assert not ended


def test_a_start_span_stopped_by_another_thread_ends_with_what_it_holds(tmp_path, fake_tool):
    """stop() on another thread closes the start() span and the with-block opened
    inside it (as the trace does, incomplete): their ranges end when their thread
    next opens a span, and that span is at the top, as in the trace."""
    with testing.trace_to(tmp_path) as t:
        _engine.use_nvtx(True)
        span = ai.checkpoint.capture.start()
        with ai.pipeline.epoch:
            stopper = threading.Thread(target=span.stop)
            stopper.start()
            stopper.join()
            with ai.compute.forward:
                pass
    assert t.spans("forward")[0]["args"]["p_idx"] == 0
    main = threading.get_native_id()
    pushed, ended = replay(fake_tool.lines)
    assert pushed == Counter({(main, "checkpoint.capture", None): 1, (main, "pipeline.epoch", "checkpoint.capture"): 1,
                              (main, "compute.forward", None): 1})
    assert not ended


def test_spans_left_open_are_popped_with_the_span_below(tmp_path, fake_tool):
    """A with-block entered in a function and never exited: its range ends with the
    function's, as its span leaves the stack, and later ranges nest at the top."""

    @ai.compute.forward
    def leaky():
        ai.compute.backward.__enter__()

    with testing.trace_to(tmp_path):
        _engine.use_nvtx(True)
        leaky()
        with ai.compute.step:
            pass
    main = threading.get_native_id()
    pushed, _ = replay(fake_tool.lines)
    assert pushed == Counter({(main, "compute.forward", None): 1, (main, "compute.backward", "compute.forward"): 1,
                              (main, "compute.step", None): 1})


def test_a_failing_tool_never_reaches_the_program(tmp_path, monkeypatch):
    """A tool that raises costs the ranges, never the program or its trace."""
    monkeypatch.setattr(nvtx_ranges, "_domain", FakeDomain(fail=True))
    monkeypatch.setattr(nvtx_ranges, "_attrs", [])

    @ai.compute.forward
    def forward(x):
        return x + 1

    with testing.trace_to(tmp_path) as t:
        _engine.use_nvtx(True)
        assert [forward(i) for i in ai.dataloader.fetch.iter(range(3))] == [1, 2, 3]
        ai.checkpoint.capture.start().stop()
    testing.assert_span(t, "forward", count=3)
    testing.assert_span(t, "capture", count=1)


def test_finalize_turns_ranges_off(tmp_path, fake_tool):
    """After finalize no span reaches NVTX."""
    with testing.trace_to(tmp_path):
        _engine.use_nvtx(True)
        with ai.compute.step:
            pass
    assert not _engine.NVTX_ON
    n = len(fake_tool.lines)
    dftrace.initialize(log_file=str(tmp_path / "again"))
    with ai.compute.step:
        pass
    dftrace.finalize()
    assert len(fake_tool.lines) == n == 2
