"""dftrace.testing helpers for users' own tests: trace_to_memory and the assertions."""

from __future__ import annotations

import pytest

import dftrace
from dftrace import ai, testing


@ai.compute.forward(capture=True, capture_result=True)
def forward(x):
    return [x, x]


def step(x):
    with ai.compute.step:
        forward(x)


def test_trace_to_memory_fills_a_trace_result_in_memory(tmp_path, monkeypatch):
    """trace_to_memory() yields a TraceResult holding the block's events, writing no file."""
    monkeypatch.chdir(tmp_path)
    with testing.trace_to_memory() as result:
        step(1)
    assert result.directory is None and result.paths == []
    assert result.names() == ["forward", "step"]
    assert list(tmp_path.iterdir()) == []


def test_trace_to_memory_keeps_the_events_when_the_block_raises():
    """A failing block still leaves its events in the result."""
    with pytest.raises(ValueError):
        with testing.trace_to_memory() as result:
            step(1)
            raise ValueError
    testing.assert_span(result, "forward", count=1)


def test_trace_result_converts_to_a_browsable_trace():
    """result.trace browses the captured events like dftrace.trace_in_memory's Trace."""
    with testing.trace_to_memory() as result:
        step(2)
    assert result.trace.compute.forward[0].params.x == 2


def test_assert_span_returns_matching_spans_in_start_order():
    """assert_span returns the spans whose args match, first started first."""
    with testing.trace_to_memory() as result:
        for i in range(3):
            forward(i)
    spans = testing.assert_span(result, "forward", count=3)
    assert [testing.get_arg(s, "params.x") for s in spans] == [0, 1, 2]
    [one] = testing.assert_span(result, "forward", args={"params.x": 1, "result.0": 1})
    assert one["args"]["result"] == [1, 1]


def test_assert_span_failure_lists_what_was_recorded():
    """A failing assert_span says what it wanted and what the trace holds."""
    with testing.trace_to_memory() as result:
        step(1)
    with pytest.raises(AssertionError) as info:
        testing.assert_span(result, "backward", cat="compute")
    message = str(info.value)
    assert "expected at least 1 span(s) named 'backward' in category 'compute'; found 0" in message
    assert "Recorded: compute.step ×1, compute.forward ×1." in message


def test_assert_span_failure_shows_the_args_that_did_not_match():
    """When args differ, the message shows the values the spans had."""
    with testing.trace_to_memory() as result:
        forward(5)
    with pytest.raises(AssertionError, match=r"has \{'params.x': 5\}"):
        testing.assert_span(result, "forward", args={"params.x": 6})


def test_assert_span_count_is_exact():
    """count= fails when there are more matching spans than asked for."""
    with testing.trace_to_memory() as result:
        forward(1)
        forward(1)
    with pytest.raises(AssertionError, match="expected 1 span"):
        testing.assert_span(result, "forward", count=1)


def test_assert_names_compares_start_order():
    """assert_names checks the span names in the order spans started."""
    with testing.trace_to_memory() as result:
        step(1)
    testing.assert_names(result, ["step", "forward"])
    with pytest.raises(AssertionError, match="differ at position 0"):
        testing.assert_names(result, ["forward", "step"])


def test_assert_nested_passes_for_ancestors_and_fails_otherwise():
    """assert_nested accepts any ancestor and reports the real chain when wrong."""
    with testing.trace_to_memory() as result:
        with ai.pipeline.epoch:
            step(1)
        forward(2)
    testing.assert_nested(result.events, "epoch", "step")
    with pytest.raises(AssertionError, match=r"id=\d+ is not inside a 'epoch' span"):
        testing.assert_nested(result, "epoch", "forward")  # the second forward is top level
    with pytest.raises(AssertionError, match="no span named 'backward'"):
        testing.assert_nested(result, "epoch", "backward")


def test_get_arg_names_the_keys_that_exist_when_one_is_missing():
    """get_arg raises KeyError listing the keys present where the path broke off."""
    with testing.trace_to_memory() as result:
        forward(1)
    [span] = testing.spans(result.events, "forward")
    with pytest.raises(KeyError, match=r"args.params has no 'y' \(it holds: \['x'\]\)"):
        testing.get_arg(span, "params.y")
    assert testing.get_arg(span, "params.y", None) is None


def test_helpers_accept_a_trace_or_a_list_of_events(tmp_path):
    """The assertions work on a Trace, on trace_to's result and on a plain event list."""
    with testing.trace_to(tmp_path) as written:
        forward(3)
    for source in (written, written.events, dftrace.Trace.load(tmp_path)):
        testing.assert_span(source, "forward", count=1, args={"params.x": 3})
