"""A wall clock stepped during a run (an administrator, a late NTP correction): the
processes of one job keep one clock. Children started after the step, spawned or
forked, take their parent's anchor (wall time at its start and the monotonic clock
then), so their spans lie inside the parent's and the analysis reads one run. A
child anchored on the stepped wall clock anyway (a trace of an older dftrace) is
read as of its parent's run, and the summary names the step.
See docs/reliability.md, "At a glance".

The step is played inside the traced processes (changing the machine's clock is not
a test's to do): the parent replaces ``time.time_ns`` by the clock an hour back, and
starts its children with a preloaded library whose ``clock_gettime(CLOCK_REALTIME)``
reads an hour back from their first instruction (tracing starts at interpreter
start there, before any of their Python code runs).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from dftrace import testing

from ._util import clean_env, files, spans, write_script

#: clock_gettime(CLOCK_REALTIME) STEP_BACK_S seconds back.
SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

int clock_gettime(clockid_t id, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real)
        real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int r = real(id, ts);
    const char *back = getenv("STEP_BACK_S");
    if (r == 0 && id == CLOCK_REALTIME && back)
        ts->tv_sec -= atol(back);
    return r;
}
"""

#: Steps its own wall clock back an hour within its span, then starts a child
#: (spawned, on the stepped clock) and, with "fork", forks one; with "unanchored" the
#: child is given no anchor (as by an older dftrace).
PARENT = """
    import os, subprocess, sys, time
    import dftrace

    dftrace.initialize(log_file=sys.argv[1])
    with dftrace.ai.compute.forward:
        time.sleep(0.05)
        wall_ns = time.time_ns
        time.time_ns = lambda: wall_ns() - 3600 * 10**9
        time.time = lambda: time.time_ns() / 1e9
        env = dict(os.environ, LD_PRELOAD=sys.argv[2], STEP_BACK_S="3600")
        if sys.argv[4:] == ["unanchored"]:
            del env["DFTRACE_CLOCK_ANCHOR"]
        subprocess.run([sys.executable, sys.argv[3]], check=True, env=env)
        if sys.argv[4:] == ["fork"]:
            pid = os.fork()
            if pid == 0:
                with dftrace.ai.compute.backward:
                    pass
                dftrace.finalize()
                os._exit(0)
            os.waitpid(pid, 0)
        time.sleep(0.05)
"""

CHILD = """
    import dftrace
    with dftrace.ai.compute.step:
        pass
"""



@pytest.fixture
def step_back(tmp_path) -> str:
    """The preloaded library that steps a process's wall clock back."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not sys.platform.startswith("linux"):
        pytest.skip("needs a C compiler on Linux (to preload a clock an hour back)")
    src = tmp_path / "step_back.c"
    src.write_text(SHIM)
    lib = tmp_path / "step_back.so"
    built = subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src), "-ldl"],
                           capture_output=True, text=True)
    if built.returncode:
        pytest.skip(f"cannot build the preloaded clock: {built.stderr[-300:]}")
    return str(lib)


def _run(tmp_path, step_back: str, child: str, *extra: str):
    parent = write_script(tmp_path, PARENT, name="parent.py")
    child_path = write_script(tmp_path, child, name="child.py")
    out = tmp_path / "trace"
    done = subprocess.run([sys.executable, parent, str(out / "t"), step_back, child_path, *extra],
                          capture_output=True, text=True, timeout=120, env=clean_env())
    assert done.returncode == 0, done.stderr
    return out


def _summary(out, *args: str) -> subprocess.CompletedProcess:
    pytest.importorskip("polars", reason="dftrace summary needs the analysis extra")
    done = subprocess.run([sys.executable, "-m", "dftrace", "summary", *args, str(out)],
                          capture_output=True, text=True, timeout=300, env=clean_env())
    assert done.returncode == 0, done.stderr
    return done


def test_children_started_after_a_clock_step_share_the_parents_clock(tmp_path, step_back):
    """The wall clock stepped back an hour after the parent started: a spawned and a
    forked child started then write spans inside the parent's span, and
    ``dftrace summary`` reads one run."""
    out = _run(tmp_path, step_back, CHILD, "fork")
    assert len(files(out)) == 3, files(out)
    events = testing.read_events(out)
    (outer,) = spans(events, "forward")
    inner = spans(events, "step") + spans(events, "backward")
    assert len(inner) == 2
    for span in inner:
        assert span["pid"] != outer["pid"]
        assert outer["ts"] <= span["ts"] and span["ts"] + span["dur"] <= outer["ts"] + outer["dur"]
    answer = json.loads(_summary(out, "--json").stdout)
    assert answer["runs"] == [], answer["runs"]
    assert answer["overview"]["runs"] == 1
    assert answer["overview"]["clock_steps"] == []


def test_the_summary_reports_a_clock_step_instead_of_a_second_run(tmp_path, step_back):
    """A child anchored on the stepped wall clock (given no anchor by its parent) has
    times an hour off its parent's: ``dftrace summary`` reads one run and names the
    step."""
    out = _run(tmp_path, step_back, CHILD, "unanchored")
    events = testing.read_events(out)
    (outer,) = spans(events, "forward")
    (inner,) = spans(events, "step")
    assert inner["ts"] < outer["ts"] - 3_000_000_000  # an hour before its parent's span
    answer = json.loads(_summary(out, "--json").stdout)
    assert answer["runs"] == [], answer["runs"]
    (step,) = answer["overview"]["clock_steps"]
    assert step["pid"] == inner["pid"]
    assert abs(step["step_us"] + 3_600_000_000) < 60_000_000
    text = _summary(out).stdout
    assert "separate runs" not in text
    assert "was stepped by -3600" in text, text
