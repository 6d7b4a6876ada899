"""capture= on `with` blocks and on .iter()."""

from __future__ import annotations

import asyncio

import pytest

import dftrace
from dftrace import ai, testing
from dftrace._core import buffer as _buffer


def test_with_capture_names_records_those_variables_at_entry():
    """capture=[names] on a with block records the named variables as it starts."""
    np = pytest.importorskip("numpy")
    def step(batch, lr):
        with ai.compute.step(capture=["batch", "lr"]):
            batch = None  # rebinding inside the block does not change what was captured
        return lr

    with testing.trace_to_memory() as result:
        step(np.ones((2, 2)), 0.1)
    testing.assert_span(result, "step", args={"params.batch.shape": [2, 2], "params.lr": 0.1})


def test_with_capture_true_records_the_enclosing_functions_arguments():
    """capture=True on a with block records the arguments of the function it is in."""
    def load(self, index, *, retries=3):
        unrelated = "not an argument"
        with ai.data.item(capture=True):
            return unrelated

    with testing.trace_to_memory() as result:
        load(object(), 5)
    [span] = testing.assert_span(result, "item")
    assert span["args"]["params"] == {"index": 5, "retries": 3}


def test_with_capture_result_records_variables_the_block_assigned():
    """capture_result=True records the variables bound or rebound inside the block."""
    def run(x):
        kept = 1
        with ai.data.preprocess(capture_result=True):
            y = [v * 2 for v in x]
            x = len(y)
        return kept

    with testing.trace_to_memory() as result:
        run([1, 2])
    [span] = testing.assert_span(result, "preprocess")
    assert span["args"]["result"] == {"y": [2, 4], "x": 2}


def test_set_result_and_capture_on_the_scope_add_values_by_hand():
    """The `as` target records extra parameters and an explicit result."""
    with testing.trace_to_memory() as result:
        with ai.checkpoint.capture(capture=[]) as call:
            call.capture(path="/ckpt/1.pt", step=10)
            call.set_result({"bytes": 1024})
    testing.assert_span(result, "capture", cat="checkpoint",
                        args={"params": {"path": "/ckpt/1.pt", "step": 10},
                              "result": {"bytes": 1024}})


def test_with_block_that_raises_records_params_and_the_error():
    """An exception leaving the block is recorded and propagates."""
    def work(n):
        with ai.compute.forward(capture=True):
            raise ValueError("bad n")

    with testing.trace_to_memory() as result:
        with pytest.raises(ValueError):
            work(3)
    [span] = testing.assert_span(result, "forward", args={"params.n": 3, "error": "ValueError"})
    assert span["args"]["error_message"] == "bad n"


def test_nested_capturing_with_blocks_nest_in_the_trace():
    """A capturing block inside another is its child, each with its own params."""
    def outer(a):
        with ai.pipeline.train(capture=True):
            inner(a + 1)

    def inner(b):
        with ai.compute.forward(capture=True):
            pass

    with testing.trace_to_memory() as result:
        outer(1)
    testing.assert_nested(result, "train", "forward")
    testing.assert_span(result, "train", args={"params": {"a": 1}})
    testing.assert_span(result, "forward", args={"params": {"b": 2}})


def test_one_capturing_use_serves_recursive_blocks():
    """The same capturing use entered recursively closes each span with its own values."""
    use = ai.compute.forward(capture=["depth"])

    def recurse(depth):
        with use:
            if depth:
                recurse(depth - 1)

    with testing.trace_to_memory() as result:
        recurse(2)
    outer, middle, inner = testing.assert_span(result, "forward", count=3)
    assert [s["args"]["params"]["depth"] for s in (outer, middle, inner)] == [2, 1, 0]
    assert middle["args"]["p_idx"] == outer["id"] and inner["args"]["p_idx"] == middle["id"]


def test_async_with_captures_the_coroutines_arguments():
    """`async with` on a capturing use records the enclosing coroutine's arguments."""
    async def send(payload):
        async with ai.comm.send(capture=True, capture_result=True) as call:
            await asyncio.sleep(0)
            call.set_result("ok")

    with testing.trace_to_memory() as result:
        asyncio.run(send("hello"))
    testing.assert_span(result, "send", args={"params.payload": "hello", "result": "ok"})


def test_scope_methods_are_harmless_when_not_recording():
    """With tracing off, the with block runs, its scope methods do nothing, and
    nothing is left in the record buffer."""
    with ai.compute.forward(capture=True, capture_result=True) as call:
        call.capture(x=1)
        call.set_result(2)
    assert dftrace.last_in_memory_trace() is None
    assert _buffer.buffered() == 0


def test_iter_with_capture_result_records_each_item():
    """.iter() on a use with capture_result=True records each item on its .iter span."""
    np = pytest.importorskip("numpy")
    with testing.trace_to_memory() as result:
        for _ in ai.dataloader.fetch(capture_result=True).iter([np.zeros(3), "text"]):
            pass
    first, second = testing.assert_span(result, "fetch.iter", count=2)
    assert first["args"]["result"]["shape"] == [3] and first["args"]["count"] == 1
    assert second["args"]["result"] == "text" and second["args"]["count"] == 2
    assert all("result" not in b["args"] for b in testing.assert_span(result, "fetch.block"))
