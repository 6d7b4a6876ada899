"""The C engine is used only when its clock agrees with Python's: a check that one
preempted read cannot fail (a loaded machine must not lose the C engine), while a
clock that truly differs is refused."""

from __future__ import annotations

from time import perf_counter_ns

import pytest

from dftrace._core import engine


def test_a_clock_that_differs_is_refused():
    assert not engine._clocks_agree(lambda: perf_counter_ns() + 5_000_000)
    assert not engine._clocks_agree(lambda: perf_counter_ns() - 5_000_000)


def test_one_preempted_read_does_not_refuse_the_engine():
    reads = iter([perf_counter_ns() - 50_000_000])  # the first read came 50 ms late

    def clock_preempted_once() -> int:
        return next(reads, None) or perf_counter_ns()

    assert engine._clocks_agree(clock_preempted_once)


def test_the_real_engine_clock_agrees():
    if engine.speedups is None:
        pytest.skip("the pure-Python engine has one clock")
    assert engine._clocks_agree(engine.speedups.clock_ns)
