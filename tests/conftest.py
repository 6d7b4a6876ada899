"""Shared fixtures: every test starts from the state ``import dftrace`` leaves."""

from __future__ import annotations

import pytest

from dftrace import testing


@pytest.fixture(autouse=True)
def _reset_dftrace():
    with testing.clean_state():
        yield
