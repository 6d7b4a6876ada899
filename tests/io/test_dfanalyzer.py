"""DFAnalyzer's ``posix`` preset on a dftrace trace reports the program's own bytes and
calls: reads, writes, opens and closes, nothing misfiled as "other". DFAnalyzer runs
where ``DFTRACE_TEST_DFANALYZER_PYTHON`` names an interpreter that imports it (its
dependencies' versions differ from dftrace's: ``.ci/run`` makes it an environment of
its own), or beside dftrace where it imports there; the test skips elsewhere."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _io_util import NEEDS_IO
from _requirements import needs_marks
from reliability._util import clean_env, run


#: The workload and DFAnalyzer's run, as the benchmark beside dftracer runs them:
#: ``--workload DATA FILES LOG``: 50 files of known sizes written in 16 KiB writes under
#: DATA, read back in 4 KiB reads and 64 KiB preads (each to its 0-byte end), one libc
#: call per os call, traced into LOG, printing what it did; ``--analyze TRACE WORK``:
#: DFAnalyzer's posix preset on the trace folder, printing the sums of its per-process
#: view's posix columns.
SCRIPT = str(Path(__file__).resolve().parents[2] / "bench" / "io_dfanalyzer.py")


def _analyzer_python() -> str | None:
    """The interpreter DFAnalyzer runs in, or None where there is none."""
    named = os.environ.get("DFTRACE_TEST_DFANALYZER_PYTHON")
    if named:
        return named
    try:
        return sys.executable if importlib.util.find_spec("dftracer.analyzer") else None
    except ModuleNotFoundError:  # no dftracer package at all
        return None


ANALYZER = _analyzer_python()
pytestmark = [*NEEDS_IO, *needs_marks("dfanalyzer", None if ANALYZER else
                                      "needs DFAnalyzer (pip install dftracer-analyzer, or "
                                      "DFTRACE_TEST_DFANALYZER_PYTHON naming an interpreter "
                                      "that has it)")]


@pytest.mark.timeout(900)
def test_dfanalyzer_posix_totals_are_the_programs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "trace").mkdir()
    traced = run([SCRIPT, "--workload", str(tmp_path / "data"), "50", str(tmp_path / "trace" / "t")], timeout=240)
    assert traced.returncode == 0, traced.stderr[-5000:]
    truth = {k: v for k, v in json.loads(traced.stdout.strip().splitlines()[-1]).items()
             if k.endswith(("_count", "_size")) and k != "other_count"}
    done = subprocess.run([ANALYZER, SCRIPT, "--analyze", str(tmp_path / "trace"),
                           str(tmp_path / "dfanalyzer")], capture_output=True, text=True,
                          timeout=840, env=clean_env())
    assert done.returncode == 0, done.stderr[-5000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert {k: got[k] for k in truth} == truth
    # a call name DFAnalyzer does not map (pread64, as DFTracer writes it) is filed "other"
    assert got["other_count"] == 0
    assert got["count"] == sum(v for k, v in truth.items() if k.endswith("_count"))
    assert got["size"] == truth["read_size"] + truth["write_size"]
