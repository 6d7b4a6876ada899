"""The C engine is the one in use where it was built (CI runs the core and reliability
tests again with DFTRACE_NO_SPEEDUPS=1 for the pure-Python twin)."""

from __future__ import annotations

import glob
import os

import pytest

import dftrace
from dftrace._core import engine as _recorder


def test_built_accelerator_is_used():
    """When the C module was built, the engine uses it (records in native memory)."""
    if os.environ.get("DFTRACE_NO_SPEEDUPS", "").strip() not in ("", "0"):
        pytest.skip("DFTRACE_NO_SPEEDUPS is set: the pure-Python recorder is asked for")
    built = glob.glob(os.path.join(os.path.dirname(dftrace.__file__), "_core", "_speedups*"))
    if not [b for b in built if not b.endswith(".c")]:
        pytest.skip("the C accelerator was not built here (no compiler): pure Python is in use")
    assert _recorder.speedups is not None and _recorder.record is _recorder.speedups.record


