"""Shared fixtures and the suite's two pieces of plumbing:

* every test starts from the state ``import dftrace`` leaves;
* test files that load a framework which crashes beside another one in a single
  interpreter run in a pytest process of their own (see ``_process_groups.py``);
* ``DFTRACE_TEST_REQUIRE`` turns the skips of named capabilities into failures, so CI
  cannot pass with a broken C engine or without the FUSE or browser tests;
* marks say which tests CI runs again with the other writer, the pure-Python engine
  or another Python (see ``_reruns.py``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dftrace import testing

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _process_groups  # noqa: E402
import _requirements  # noqa: E402
import _reruns  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    # The summary's index of files already read goes to a directory of the run's own,
    # never the user's cache (commands the tests start inherit it).
    config._dftrace_index_dir = os.environ["DFTRACE_INDEX_DIR"] = tempfile.mkdtemp(prefix="dftrace-index-")
    # So do the records of losses that a failed trace storage could not take.
    config._dftrace_runtime_dir = os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="dftrace-runtime-")
    # The commands the tests start run as from the suite's activated environment: its
    # interpreter's directory first on PATH (what `pip install` hints assume; the
    # hint for an environment that is not active has a test of its own).
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    config.addinivalue_line(
        "markers", "needs(capability): the test skips without this capability; "
        "DFTRACE_TEST_REQUIRE=capability,... makes that skip a failure")
    _reruns.register(config)
    config.pluginmanager.register(_process_groups.ProcessGroups(config), "dftrace-process-groups")
    config.pluginmanager.register(_requirements.Requirements(), "dftrace-requirements")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    _reruns.mark(items)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(getattr(config, "_dftrace_index_dir", ""), ignore_errors=True)
    shutil.rmtree(getattr(config, "_dftrace_runtime_dir", ""), ignore_errors=True)


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Which dftrace is under test, and with which engine: run from a clone after a
    non-editable install, ``python -m pytest`` imports the clone's sources, not the
    installed package (and its C engine)."""
    import dftrace
    from _requirements import native_engine_missing

    where = Path(dftrace.__file__).resolve().parent
    engine = native_engine_missing() or "the C engine"
    lines = [f"dftrace under test: {where} ({engine})"]
    try:
        from importlib.metadata import distribution

        installed = Path(distribution("dftrace").locate_file("dftrace")).resolve()
        if installed.exists() and installed != where:
            lines.append(f"  note: the installed dftrace is {installed}; these tests import {where} "
                         "(an editable install, pip install -e, tests what is installed)")
    except Exception:  # noqa: BLE001 - not installed at all: the sources are what runs
        pass
    return lines


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


@pytest.fixture
def busy_machine():
    """Three processes spinning on the CPU while the test runs (a shared, busy machine)."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    yield
    for p in spinners:
        p.kill()
        p.wait()
