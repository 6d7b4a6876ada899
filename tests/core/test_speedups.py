"""The C engine is the one in use where it was built (CI runs the core and reliability
tests again with DFTRACE_NO_SPEEDUPS=1 for the pure-Python twin)."""

from __future__ import annotations

import glob
import os

import pytest
from _requirements import native_engine_missing, needs

import dftrace
from dftrace._core import engine as _engine


@needs("native", None if os.environ.get("DFTRACE_NO_SPEEDUPS", "").strip() in ("", "0")
       else "DFTRACE_NO_SPEEDUPS=1 asks for the pure-Python engine")
def test_built_accelerator_is_used():
    """When the C module was built, the engine uses it (records in native memory);
    where it was not built, the test says why it did not load."""
    built = glob.glob(os.path.join(os.path.dirname(dftrace.__file__), "_core", "_speedups*"))
    if not [b for b in built if not b.endswith(".c")]:
        pytest.skip(native_engine_missing() or "no built C engine next to the package")
    assert _engine.speedups is not None and _engine.record is _engine.speedups.record


