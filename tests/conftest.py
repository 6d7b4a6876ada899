"""Shared fixtures and the suite's two pieces of plumbing:

* every test starts from the state ``import dftrace`` leaves;
* test files that load a framework which crashes beside another one in a single
  interpreter run in a pytest process of their own (see ``_process_groups.py``);
* ``DFTRACE_TEST_REQUIRE`` turns the skips of named capabilities into failures, so CI
  cannot pass with a broken C engine or without the FUSE or browser tests.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dftrace import testing

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _process_groups  # noqa: E402
import _requirements  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "needs(capability): the test skips without this capability; "
        "DFTRACE_TEST_REQUIRE=capability,... makes that skip a failure")
    config.pluginmanager.register(_process_groups.ProcessGroups(config), "dftrace-process-groups")
    config.pluginmanager.register(_requirements.Requirements(), "dftrace-requirements")


@pytest.fixture(autouse=True)
def _reset_dftrace():
    with testing.clean_state():
        yield
    _process_groups.check_isolation()


#: Real DFTracer output (1.0.5, 2.0.3, 2.2.0) shipped with the tests; see its README.md.
DFTRACER_SAMPLES = Path(__file__).resolve().parent / "data" / "dftracer"


@pytest.fixture(scope="session")
def samples() -> Path:
    """DFTracer's real trace files, in ``tests/data/dftracer``."""
    return DFTRACER_SAMPLES
