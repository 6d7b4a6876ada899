"""Fixtures for the analysis tests: generated runs and a Dask cluster."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import tracegen

#: Steps made slow in the standard run: (rank, epoch, step) -> extra µs.
SLOW = {(1, 0, 2): 500, (3, 1, 1): 900}


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four ranks on two hosts, 2 epochs x 4 steps, two straggling steps (see SLOW)."""
    directory = tmp_path_factory.mktemp("run")
    tracegen.write_run(directory, ranks=4, slow=SLOW)
    return directory


@pytest.fixture(scope="module")
def dask_executor():
    """A two-worker distributed.LocalCluster on loopback, started once per module."""
    pytest.importorskip("distributed")
    from dftrace.analysis import DaskExecutor

    executor = DaskExecutor(workers=2, threads_per_worker=1, processes=True)
    logging.getLogger("distributed").setLevel(logging.ERROR)
    yield executor
    executor.close()
