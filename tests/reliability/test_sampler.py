"""Resource counters: off by default at no cost, counter events in cat "sys" when on."""

from __future__ import annotations

import os
import threading
import time

import psutil
import pytest

import dftrace
from dftrace import ai, testing

from ._util import assert_valid, run


def _sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dftrace-sampler"]


def test_sampling_is_off_by_default(tmp_path):
    """Without sample_interval no sampler thread runs and no counter is written."""
    with testing.trace_to(tmp_path) as t:
        assert _sampler_threads() == []
        with ai.compute.step:
            pass
    assert [e for e in t.events if e.get("ph") == "C"] == []


def test_import_does_not_load_psutil():
    """import dftrace leaves psutil unloaded (sampling and process info load it when used)."""
    out = run(["-c", "import sys, dftrace; print('psutil' in sys.modules)"])
    assert out.stdout.strip() == "False", out.stderr


def test_counters_are_written_in_category_sys(tmp_path):
    """With sample_interval, CPU, memory, thread and I/O counters arrive as "ph":"C" in cat sys."""
    with testing.trace_to(tmp_path, sample_interval=0.02) as t:
        assert len(_sampler_threads()) == 1
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:  # some CPU work to measure
            sum(i * i for i in range(10_000))
    assert _sampler_threads() == []  # finalize stopped it
    assert_valid(t.paths)
    counters = [e for e in t.events if e.get("ph") == "C"]
    assert {e["cat"] for e in counters} == {"sys"}
    by_name: dict[str, list[dict]] = {}
    for e in counters:
        by_name.setdefault(e["name"], []).append(e)
    assert {"cpu", "memory", "threads"} <= set(by_name)
    assert len(by_name["memory"]) >= 3
    rss = psutil.Process().memory_info().rss
    assert all(0 < e["args"]["rss_bytes"] < 4 * rss for e in by_name["memory"])
    assert max(e["args"]["percent"] for e in by_name["cpu"]) > 0
    assert all(e["args"]["count"] >= 2 for e in by_name["threads"])  # main + writer at least
    if hasattr(psutil.Process(), "io_counters"):
        try:
            psutil.Process().io_counters()
        except psutil.Error:
            pass
        else:
            assert {"read_bytes", "write_bytes"} <= set(by_name["io"][0]["args"])
    assert all(e["pid"] == os.getpid() and isinstance(e["ts"], int) for e in counters)
    ts = [e["ts"] for e in by_name["memory"]]
    assert ts == sorted(ts)


def test_sample_interval_comes_from_the_environment(tmp_path, monkeypatch):
    """DFTRACE_SAMPLE_INTERVAL switches sampling on like the keyword does."""
    monkeypatch.setenv("DFTRACE_SAMPLE_INTERVAL", "0.01")
    s = dftrace.initialize(log_file=str(tmp_path / "t"), compression="none", inherit=False)
    assert s.sampler is not None and len(_sampler_threads()) == 1
    time.sleep(0.05)
    dftrace.finalize()
    events = testing.read_events(s.path)
    assert any(e.get("ph") == "C" and e["name"] == "memory" for e in events)


# Python 3.12+ warns about any fork while threads run (here dftrace's writer and
# sampler); the child never uses them, their locks or their buffer.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_forked_child_samples_itself(tmp_path):
    """A forked child restarts sampling: its file has its own counters."""
    s = dftrace.initialize(log_file=str(tmp_path / "t"), compression="none", inherit=False,
                           sample_interval=0.01)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            time.sleep(0.05)
            ok = dftrace.session() is not None and dftrace.session().sampler is not None
            dftrace.finalize()
            code = 0 if ok else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    dftrace.finalize()
    assert os.waitstatus_to_exitcode(status) == 0
    child = [p for p in testing.trace_files(tmp_path) if p.endswith(f"-{pid}.pfw")]
    assert len(child) == 1 and s.path not in child
    events = testing.read_events(child[0])
    assert {e["pid"] for e in events if e.get("ph") == "C"} == {pid}
