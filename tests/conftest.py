"""Shared fixtures: every test starts from the state ``import dftrace`` leaves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dftrace import testing


@pytest.fixture(autouse=True)
def _reset_dftrace():
    with testing.clean_state():
        yield


#: Real DFTracer output (1.0.5, 2.0.3, 2.2.0) shipped with the tests; see its README.md.
DFTRACER_SAMPLES = Path(__file__).resolve().parent / "data" / "dftracer"


@pytest.fixture(scope="session")
def samples() -> Path:
    """DFTracer's real trace files, in ``tests/data/dftracer``."""
    return DFTRACER_SAMPLES


@pytest.fixture
def busy_machine():
    """Three processes spinning on the CPU while the test runs (a shared, busy machine)."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    yield
    for p in spinners:
        p.kill()
        p.wait()
