"""Benchmarks run with pytest-benchmark: ``pytest bench`` (see docs/performance.md).
Each starts from the state ``import dftrace`` leaves."""

from __future__ import annotations

import pytest

import dftrace
from dftrace import testing
from dftrace._core import buffer as _buffer


@pytest.fixture(autouse=True)
def _reset_dftrace():
    with testing.clean_state():
        yield


@pytest.fixture
def tracing(tmp_path):
    """A session whose writer never runs during the measurement (hot path only)."""
    dftrace.initialize(log_file=str(tmp_path / "b"), flush_interval=3600, batch_size=10**9,
                       buffer_limit=10**8, inherit=False)
    yield
    _buffer.discard_buffered()
    dftrace.finalize()
