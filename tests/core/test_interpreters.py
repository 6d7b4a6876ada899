"""Sub-interpreters: dftrace imports in one without harm to the process, and stays off
there while the main interpreter traces on."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from dftrace import testing
from dftrace.analysis.runtime.kernels import analysis_kernels

#: The module that runs code in a sub-interpreter: ``_interpreters`` from Python 3.13,
#: ``_xxsubinterpreters`` before.
INTERPRETERS = next((m for m in ("_interpreters", "_xxsubinterpreters")
                     if importlib.util.find_spec(m) is not None), None)

pytestmark = pytest.mark.skipif(INTERPRETERS is None,
                                reason="this Python has no sub-interpreters (_interpreters)")

# Run in a sub-interpreter: what dftrace is there, told on stdout (the process's).
SUB = """
import dftrace
from dftrace import ai
from dftrace._core import engine
session = dftrace.initialize(log_file={sub_log!r})
def step():
    return 1
print("sub engine:", "C" if engine.speedups is not None else "Python")
print("sub session:", session)
print("sub decorator returns the function:", ai.compute.forward(step) is step)
from dftrace.analysis.runtime.kernels import analysis_kernels
print("sub scanner:", "C" if analysis_kernels() is not None else "Python")
"""

# The process: the main interpreter traces around a sub-interpreter that imports dftrace.
MAIN = """
import sys
import {interpreters} as interpreters
import dftrace
from dftrace import ai
dftrace.initialize(log_file=sys.argv[1])
with ai.compute.forward:
    pass
iid = interpreters.create()
failed = interpreters.run_string(iid, sys.argv[2])  # Python 3.13 returns a failure, 3.12 raises
assert failed is None, failed
interpreters.destroy(iid)
with ai.compute.forward:
    pass
dftrace.finalize()
print("main engine:", "C" if dftrace._core.engine.speedups is not None else "Python")
"""


def test_a_sub_interpreter_imports_dftrace_and_the_process_exits_cleanly(tmp_path):
    """A sub-interpreter's ``import dftrace`` neither aborts the process at exit (as
    Python 3.12.1 does once a sub-interpreter imported hashlib) nor disturbs the main
    interpreter's trace: the C engine stays the main interpreter's, the sub-interpreter
    gets the pure-Python engine, and tracing stays off there with one warning."""
    sub = SUB.format(sub_log=str(tmp_path / "sub" / "trace"))
    out = subprocess.run(
        [sys.executable, "-c", MAIN.format(interpreters=INTERPRETERS), str(tmp_path / "main" / "trace"),
         textwrap.dedent(sub)],
        capture_output=True, text=True, timeout=120, env=dict(os.environ, DFTRACE_ENABLE=""))
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert "sub engine: Python" in lines
    assert "sub session: None" in lines
    assert "sub decorator returns the function: True" in lines
    # the analysis's C scanner keeps no state: every interpreter loads its own
    assert f"sub scanner: {'C' if analysis_kernels() is not None else 'Python'}" in lines
    # once, at the sub-interpreter's start (the main interpreter's session exported
    # DFTRACE_ENABLE=1, so dftrace starts with it) or at its initialize()
    assert out.stderr.count("dftrace: tracing is off in this sub-interpreter") == 1, out.stderr
    # the main interpreter traced both spans, around the sub-interpreter's life
    assert len(testing.spans(testing.read_events(tmp_path / "main"), "forward")) == 2
    assert not (tmp_path / "sub").exists()
