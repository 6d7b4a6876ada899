"""The C accelerator and the pure-Python recorder behave the same."""

from __future__ import annotations

import glob
import os
import pathlib
import subprocess
import sys

import pytest

import dftrace
from dftrace import _recorder

HERE = pathlib.Path(__file__).resolve().parent


def test_built_accelerator_is_used():
    """When the C module was built, the engine uses it (records in native memory)."""
    if os.environ.get("DFTRACE_NO_SPEEDUPS", "").strip() not in ("", "0"):
        pytest.skip("DFTRACE_NO_SPEEDUPS is set: the pure-Python recorder is asked for")
    built = glob.glob(os.path.join(os.path.dirname(dftrace.__file__), "_speedups*"))
    if not [b for b in built if not b.endswith(".c")]:
        pytest.skip("the C accelerator was not built here (no compiler): pure Python is in use")
    assert _recorder.speedups is not None and _recorder.record is _recorder.speedups.record


def test_core_suite_passes_in_pure_python():
    """The core tests pass with DFTRACE_NO_SPEEDUPS=1 (the fallback a compiler-less install gets)."""
    env = dict(os.environ, DFTRACE_NO_SPEEDUPS="1")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE),
                          "-k", "not pure_python and not built_accelerator"],
                         capture_output=True, text=True, env=env, cwd=HERE.parents[1])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
