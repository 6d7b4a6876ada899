"""What tracing a PyTorch loop with no annotations costs per step (``auto=True``, as
``dftrace run`` traces), beside the same loop annotated by hand and untraced, each in
a process of its own (see ``auto_overhead.py``). ``extra_info`` holds the fastest
round's µs per step of each variant."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("torch")
sys.path.insert(0, os.path.dirname(__file__))

import auto_overhead  # noqa: E402


def test_auto_step_overhead(benchmark):
    figures = benchmark.pedantic(auto_overhead.measure, kwargs={"steps": 2000, "rounds": 5},
                                 rounds=1, iterations=1)
    benchmark.extra_info.update({f"{k}_us_per_step": round(v, 1) for k, v in figures.items()})
    assert set(figures) == {"untraced", "hand", "auto"}
