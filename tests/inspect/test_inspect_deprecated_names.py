"""The in-memory trace names of 0.1.0 (``capture``, ``Capture``, ``last_capture``,
``testing.capture_events``) still work as the new ones do, and warn once."""

from __future__ import annotations

import warnings

import pytest

import dftrace
from dftrace import ai, testing
from dftrace._inspect import memory


def _forward(x):
    return ai.compute.forward(lambda v: v + 1)(x)


def test_trace_in_memory_records_the_block_without_warning():
    """``dftrace.trace_in_memory()`` is the name that records a block into memory."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with dftrace.trace_in_memory() as t:
            _forward(1)
        assert dftrace.last_in_memory_trace() is t
    assert [c.name for c in t.compute.forward] == ["forward"]
    assert isinstance(dftrace.trace_in_memory(), dftrace.InMemoryTracing)


def test_capture_still_records_in_memory_and_warns():
    """``dftrace.capture()`` does what ``trace_in_memory()`` does, with a DeprecationWarning."""
    with pytest.warns(DeprecationWarning, match=r"dftrace\.capture\(\) is deprecated; "
                                                r"use dftrace\.trace_in_memory\(\)"):
        tracing = dftrace.capture(max_items=1)
    assert isinstance(tracing, dftrace.InMemoryTracing)
    with tracing as t:
        for _ in ai.dataloader.fetch.iter(range(5)):
            _forward(1)
    assert len(t.compute.forward) == 1  # sample mode came through
    with pytest.warns(DeprecationWarning, match="last_in_memory_trace"):
        assert dftrace.last_capture() is t


def test_the_capture_class_is_the_in_memory_tracing_class_and_warns():
    """``Capture(...)`` builds an ``InMemoryTracing`` and warns."""
    with pytest.warns(DeprecationWarning, match="InMemoryTracing"):
        tracing = memory.Capture(max_items=2)
    assert isinstance(tracing, memory.InMemoryTracing)
    assert tracing.max_items == 2


def test_capture_events_still_fills_a_trace_result_and_warns():
    """``testing.capture_events()`` is ``testing.trace_to_memory()``, with a warning."""
    with pytest.warns(DeprecationWarning, match=r"testing\.trace_to_memory\(\)"):
        block = testing.capture_events()
    with block as result:
        _forward(2)
    testing.assert_span(result, "forward", cat="compute", count=1)


def test_each_old_name_warns_once_per_process():
    """A second use of an old name does not warn again (until the state is reset)."""
    with pytest.warns(DeprecationWarning):
        dftrace.capture()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dftrace.capture()
    testing.reset()
    with pytest.warns(DeprecationWarning):
        dftrace.capture()


def test_old_names_are_not_in_the_public_list():
    """``__all__`` and ``dir()`` show only the new names; the old ones still resolve."""
    for old in ("capture", "last_capture"):
        assert old not in dftrace.__all__ and old not in dir(dftrace)
        assert callable(getattr(dftrace, old))
    for new in ("InMemoryTracing", "last_in_memory_trace", "trace_in_memory"):
        assert new in dftrace.__all__
    assert "capture_events" not in testing.__all__ and "trace_to_memory" in testing.__all__
