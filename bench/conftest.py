"""Benchmarks run with pytest-benchmark: ``pytest bench`` (see docs/performance.md)."""

from __future__ import annotations

import os

import pytest

from dftrace import testing


@pytest.fixture(autouse=True)
def _reset_dftrace():
    saved = {k: v for k, v in os.environ.items() if k.startswith("DFTRACE_")}
    testing.reset()
    yield
    testing.reset()
    for k in [k for k in os.environ if k.startswith("DFTRACE_")]:
        del os.environ[k]
    os.environ.update(saved)
