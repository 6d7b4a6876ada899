"""How spans, args, switches and hooks behave, checked in the written trace."""

from __future__ import annotations

import asyncio
import contextlib
import os
import warnings

import pytest

import dftrace
from dftrace import ai, testing

from ._util import assert_valid, by_id, check_nesting


def test_bare_decorator_records_each_call_and_keeps_the_function(tmp_path):
    """``@ai.compute.forward`` records one span per call and returns the result."""

    @ai.compute.forward
    def forward(x, scale=2):
        """Doc."""
        return x * scale

    assert forward.__name__ == "forward" and forward.__doc__ == "Doc."
    with testing.trace_to(tmp_path) as t:
        assert forward(3) == 6
        assert forward(3, scale=3) == 9
    spans = t.spans("forward")
    assert [e["cat"] for e in spans] == ["compute", "compute"]
    assert spans[0]["ts"] + spans[0]["dur"] <= spans[1]["ts"]  # two calls, one after the other
    assert_valid(t.paths)


def test_decorator_args_land_on_this_function_only(tmp_path):
    """Args given with ``(args=...)`` go on that function's events, not the node's other uses."""

    @ai.compute.forward(args={"model": "resnet"})
    def f1():
        pass

    @ai.compute.forward
    def f2():
        pass

    with testing.trace_to(tmp_path) as t:
        f1()
        f2()
        f1()
    args = [e["args"].get("model") for e in t.spans("forward")]
    assert args == ["resnet", None, "resnet"]


def test_context_manager_with_args(tmp_path):
    """``with node:`` and ``with node(args=...):`` each write one span; args only on the second."""
    with testing.trace_to(tmp_path) as t:
        with ai.comm.all_reduce:
            pass
        with ai.comm.all_reduce(args={"bytes": 4096}):
            pass
    a, b = t.spans("all_reduce")
    assert "bytes" not in a["args"] and b["args"]["bytes"] == 4096


def test_iter_writes_iter_and_block_spans_with_count(tmp_path):
    """``.iter`` writes ``<leaf>.iter`` and ``<leaf>.block`` per item with 1-based ``count``;
    spans inside the loop body nest under the block."""

    @ai.compute.forward
    def fwd():
        pass

    with testing.trace_to(tmp_path) as t:
        items = list(ai.pipeline.epoch.iter(range(3)))
        for _ in ai.dataloader.fetch.iter(["a", "b"]):
            fwd()
    assert items == [0, 1, 2]
    assert [e["args"]["count"] for e in t.spans("epoch.iter")] == [1, 2, 3]
    assert [e["args"]["count"] for e in t.spans("epoch.block")] == [1, 2, 3]
    blocks = {e["id"]: e for e in t.spans("fetch.block")}
    for f in t.spans("forward"):
        assert f["args"]["p_idx"] in blocks
    check_nesting(t.events)
    assert_valid(t.paths)


def test_iter_counts_making_the_iterator_in_the_first_items_wait(tmp_path):
    """A loader's iterator is made when the loop asks for the first item (a DataLoader
    starts its workers then): that time is in the first ``.iter`` span, not in none;
    an iterable whose ``__iter__`` raises raises at the loop, recorded."""
    import time

    class Slow:
        def __iter__(self):
            time.sleep(0.05)
            return iter(range(3))

    class Broken:
        def __iter__(self):
            raise OSError("no workers")

    with testing.trace_to(tmp_path) as t:
        wrapped = ai.dataloader.fetch.iter(Slow())
        began = time.perf_counter_ns()
        assert list(wrapped) == [0, 1, 2]
        waited_us = (time.perf_counter_ns() - began) / 1e3
        with pytest.raises(OSError, match="no workers"):
            for _ in ai.dataloader.fetch.iter(Broken()):
                pass
    first, *rest = t.spans("fetch.iter")
    assert 50_000 <= first["dur"] <= waited_us and len(rest) == 3
    assert rest[-1]["args"].get("error") == "OSError"
    assert_valid(t.paths)


def test_iter_writes_the_wait_that_finds_the_pass_over_as_its_end(tmp_path):
    """The ``next()`` that finds a pass over can be a loop's longest wait (a tf.data
    pipeline draining, a loader's workers shutting down): it is ``<leaf>.end``, with
    the loop's args and how many items it gave, up to the source's iterator gone, and
    its epoch but no step; a loop that is left early has none. The data-loader stall counts
    it as waiting."""
    import time

    class Draining:
        """Three items, then 60 ms to find the end, and 40 ms to let its iterator go."""

        def __iter__(self):
            return self

        def __init__(self):
            self.n = 0

        def __next__(self):
            self.n += 1
            if self.n > 3:
                time.sleep(0.06)
                raise StopIteration
            return self.n

        def __del__(self):
            time.sleep(0.04)

    with testing.trace_to(tmp_path) as t:
        ai.update(epoch=0, step=7)
        for _ in ai.dataloader.fetch(args={"loader": "train"}).iter(Draining()):
            waited = time.perf_counter_ns()
        ended_us = (time.perf_counter_ns() - waited) / 1e3
        for i in ai.dataloader.fetch.iter(range(5)):
            if i == 1:
                break
    [end] = t.spans("fetch.end")
    assert end["cat"] == "dataloader" and 100_000 <= end["dur"] <= ended_us, (end, ended_us)
    assert (end["args"]["count"], end["args"]["loader"]) == (3, "train")
    assert "step" not in end["args"] and end["args"]["epoch"] == 0
    assert len(t.spans("fetch.iter")) == 3 + 2
    assert_valid(t.paths)
    pytest.importorskip("polars")
    from dftrace.analysis import summarize

    [loop] = summarize(t.paths).dataloader
    assert loop["iter_us"] >= sum(e["dur"] for e in t.spans("fetch.iter")) + end["dur"]
    assert loop["items"] == 5


@pytest.mark.parametrize("how", ["break", "exception", "close"])
def test_iter_closes_its_spans_early(tmp_path, how):
    """Leaving a ``.iter`` loop by break, an exception or ``close()`` still closes the block span."""
    with testing.trace_to(tmp_path) as t:
        if how == "break":
            for i in ai.dataloader.fetch.iter(range(10)):
                if i == 1:
                    break
        elif how == "exception":
            with pytest.raises(KeyError):
                for i in ai.dataloader.fetch.iter(range(10)):
                    if i == 1:
                        raise KeyError(i)
        else:
            it = ai.dataloader.fetch.iter(range(10))
            next(it), next(it)
            it.close()
        with ai.compute.step:  # the stack is clean afterwards: this is a root span
            pass
    assert len(t.spans("fetch.block")) == 2
    assert t.spans("step")[0]["args"]["level"] == 1
    check_nesting(t.events)


def test_iter_returns_the_iterables_own_iterator_when_tracing_is_off():
    """Without tracing, ``.iter(x)`` is ``iter(x)``: an iterator, as when tracing is on, so
    a second loop over it is empty either way (and a generator comes back as itself)."""
    data = [1, 2]
    it = ai.dataloader.fetch.iter(data)
    assert next(it) == 1 and list(it) == [2] and list(it) == []
    gen = (x for x in data)
    assert ai.dataloader.fetch.iter(gen) is gen


def test_aiter_returns_the_async_iterables_own_iterator_when_tracing_is_off():
    """Without tracing, ``.aiter(x)`` is ``aiter(x)``: ``anext`` works on it as when on."""
    import asyncio

    class Source:
        def __aiter__(self):
            return self._items()

        async def _items(self):
            for x in (1, 2):
                yield x

    async def main():
        it = ai.comm.receive.aiter(Source())
        return [await anext(it), [x async for x in it]]

    assert asyncio.run(main()) == [1, [2]]


def test_update_is_sticky_for_the_node_and_its_subtree(tmp_path):
    """``node.update`` reaches later events of the node and its children; ``ai.update`` the whole tree."""
    with testing.trace_to(tmp_path) as t:
        ai.compute.update(epoch=1)
        with ai.compute.forward:
            pass
        ai.compute.forward.update(step=5)
        with ai.compute.forward:
            pass
        with ai.compute.backward:
            pass
        ai.update(run="a")
        with ai.comm.barrier:
            pass
    f1, f2 = t.spans("forward")
    assert (f1["args"]["epoch"], f1["args"].get("step")) == (1, None)
    assert (f2["args"]["epoch"], f2["args"]["step"]) == (1, 5)
    assert t.spans("backward")[0]["args"]["epoch"] == 1 and "step" not in t.spans("backward")[0]["args"]
    assert t.spans("barrier")[0]["args"]["run"] == "a"


def test_uses_made_with_options_follow_their_node(tmp_path):
    """A use created with ``(args=...)`` before ``disable()`` is switched off by it and reached by ``update``."""

    @ai.checkpoint.capture(args={"kind": "full"})
    def save():
        pass

    with testing.trace_to(tmp_path) as t:
        ai.checkpoint.disable()
        save()
        ai.checkpoint.enable()
        ai.checkpoint.capture.update(epoch=2)
        save()
    (e,) = t.spans("capture")
    assert e["args"]["kind"] == "full" and e["args"]["epoch"] == 2


def test_disable_and_enable(tmp_path):
    """``disable()`` on a category or the whole tree stops events; ``enable()`` brings them back."""
    with testing.trace_to(tmp_path) as t:
        ai.compute.disable()
        with ai.compute.forward:
            pass
        with ai.comm.send:
            pass
        ai.compute.enable()
        ai.disable()
        with ai.comm.receive:
            pass
        ai.enable()
        with ai.compute.forward:
            pass
    assert t.names() == ["send", "forward"]


def test_updates_made_while_switched_off_reach_the_spans_after(tmp_path):
    """``update()`` while its node (or the whole tree) is switched off keeps the last
    values of each key: the spans recorded once it is on again carry them, as do
    spans forced on meanwhile; the values of a key given twice are the later ones."""
    with testing.trace_to(tmp_path) as t:
        ai.update(run="a")
        ai.disable()
        for step in range(3):
            ai.update(epoch=1, step=step)  # one call site: its values replace the last ones
        ai.compute.update(phase="off")
        with ai.compute.forward(enable=True):  # forced on: it reads the updates made so far
            pass
        ai.update(step=7)
        ai.enable()
        with ai.compute.backward:
            pass
        ai.compute.disable()
        ai.compute.update(phase="on")
        ai.compute.enable()
        with ai.compute.step:
            pass
    forward, backward, step = (t.spans(name)[0]["args"] for name in ("forward", "backward", "step"))
    assert (forward["run"], forward["epoch"], forward["step"], forward["phase"]) == ("a", 1, 2, "off")
    assert (backward["run"], backward["epoch"], backward["step"], backward["phase"]) == ("a", 1, 7, "off")
    assert (step["step"], step["phase"]) == (7, "on")


def test_forced_enable_overrides_the_node_switch(tmp_path):
    """``enable=True`` records while its category is disabled; ``enable=False`` never records."""

    @ai.compute.forward(enable=True)
    def on():
        pass

    @ai.compute.backward(enable=False)
    def off():
        pass

    assert off.__name__ == "off" and not hasattr(off, "__wrapped__")
    with testing.trace_to(tmp_path) as t:
        ai.compute.disable()
        on()
        with ai.compute.step(enable=True):
            pass
        ai.compute.enable()
        off()
        with ai.compute.backward(enable=False):
            pass
    assert t.names() == ["forward", "step"]


def test_start_stop_hook_style(tmp_path):
    """``start()``/``stop()`` write one span; spans in between nest under it."""
    with testing.trace_to(tmp_path) as t:
        ai.pipeline.train.start()
        with ai.compute.forward:
            pass
        ai.pipeline.train.stop()
        tok = ai.pipeline.epoch.start()
        tok.stop()
        tok.stop()  # a second stop is harmless
    train = t.spans("train")[0]
    assert t.spans("forward")[0]["args"]["p_idx"] == train["id"]
    assert len(t.spans("epoch")) == 1
    check_nesting(t.events)


def test_stop_without_start_warns_once_and_does_nothing(tmp_path):
    """A ``stop()`` with nothing open writes nothing and warns once."""
    with testing.trace_to(tmp_path) as t:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            ai.compute.stop()
            ai.compute.stop()
    assert t.spans() == []
    assert len([x for x in w if "without a matching start" in str(x.message)]) == 1


def test_unstopped_start_is_closed_at_finalize_as_incomplete(tmp_path):
    """A ``start()`` never stopped is written at finalize with ``args.incomplete=true``."""
    with testing.trace_to(tmp_path) as t:
        ai.pipeline.epoch.start()
    (e,) = t.spans("epoch")
    assert e["args"]["incomplete"] is True


def test_stopping_a_parent_closes_children_left_open(tmp_path):
    """Stopping a span closes the start()-spans still open inside it, flagged incomplete."""
    with testing.trace_to(tmp_path) as t:
        ai.pipeline.epoch.start()
        ai.compute.start()  # e.g. a step whose after_run never came
        ai.pipeline.epoch.stop()
    comp, = t.spans("compute")
    epoch, = t.spans("epoch")
    assert comp["args"]["incomplete"] is True and "incomplete" not in epoch["args"]
    check_nesting(t.events)


def test_a_start_left_open_in_a_loop_body_or_call_ends_with_it(tmp_path):
    """A ``start()`` in one ``.iter()`` body stopped in the next one's, and one left open
    in a decorated call: each ends with the body (the call) it started in, flagged
    incomplete, as one left open in a ``with`` block does, so no span outlives its
    parent (it crossed the loop bodies' ends before: a file validate rejected)."""
    @ai.compute.forward
    def forward():
        ai.data.preprocess.start()  # e.g. a hook whose end comes after the call

    with testing.trace_to(tmp_path) as t:
        started = None
        for _ in ai.pipeline.epoch.iter(range(2)):
            for step in ai.dataloader.fetch.iter(range(2)):
                if started is not None:
                    started.stop()  # its body ended first: nothing left to stop
                    started = None
                if step == 1:
                    started = ai.data.item.start()
            forward()
    blocks = by_id(t.events)
    items, preprocess = t.spans("item"), t.spans("preprocess")
    assert len(items) == 2 and len(preprocess) == 2
    for e in items + preprocess:
        parent = blocks[e["args"]["p_idx"]]
        assert e["args"]["incomplete"] is True and e["ts"] + e["dur"] <= parent["ts"] + parent["dur"]
    assert {blocks[e["args"]["p_idx"]]["name"] for e in items} == {"fetch.block"}
    check_nesting(t.events)
    assert_valid(t.paths)


def test_metadata_mode_writes_cm_events(tmp_path):
    """``start(metadata=True)``/``stop(metadata=True)`` write CM events ``epoch.start``/``epoch.end``."""
    with testing.trace_to(tmp_path) as t:
        ai.pipeline.epoch.start(metadata=True)
        ai.pipeline.epoch.stop(metadata=True)
    cms = [e["args"] for e in t.metadata("CM")]
    assert [c["name"] for c in cms] == ["epoch.start", "epoch.end"]
    assert all(c["value"].isdigit() for c in cms)
    assert int(cms[0]["value"]) <= int(cms[1]["value"])
    assert t.spans() == []


def test_exception_closes_the_span_and_propagates_unchanged(tmp_path):
    """An exception inside a span closes it (with ``args.error``) and reaches the caller as is."""
    err = ValueError("boom")

    @ai.compute.forward
    def bad():
        raise err

    with testing.trace_to(tmp_path) as t:
        with pytest.raises(ValueError) as info:
            bad()
        assert info.value is err
        with pytest.raises(KeyError):
            with ai.comm.send:
                raise KeyError("x")
    assert t.spans("forward")[0]["args"]["error"] == "ValueError"
    assert t.spans("send")[0]["args"]["error"] == "KeyError"


def test_recursion_and_self_nesting_keep_every_event(tmp_path):
    """A recursive decorated function and a node nested in itself write every level."""

    @ai.compute.forward
    def depth(n):
        return 0 if n == 0 else 1 + depth(n - 1)

    with testing.trace_to(tmp_path) as t:
        assert depth(4) == 4
        with ai.comm.send:
            with ai.comm.send:
                pass
    levels = sorted(e["args"]["level"] for e in t.spans("forward"))
    assert levels == [1, 2, 3, 4, 5]
    assert sorted(e["args"]["level"] for e in t.spans("send")) == [1, 2]
    check_nesting(t.events)


def test_async_function_span_covers_the_awaited_body(tmp_path):
    """An ``async def`` decorated with a node gets a span as long as its awaited body."""

    @ai.comm.receive
    async def fetch(delay):
        await asyncio.sleep(delay)
        return delay

    with testing.trace_to(tmp_path) as t:
        assert asyncio.run(fetch(0.02)) == 0.02
    (e,) = t.spans("receive")
    assert e["dur"] >= 20_000


def test_tasks_made_inside_a_span_have_tracks_of_their_own(tmp_path):
    """A task made inside another task's span inherits its context (where the task's
    stack is kept) but not its stack: each child's spans nest on a track of its own,
    and the parent's spans opened around and after the children nest in the parent."""

    async def child(i):
        with ai.compute.forward(args={"c": i}):
            await asyncio.sleep(0.001)
            with ai.compute.backward:
                pass

    async def parent():
        with ai.pipeline.derive("request"):
            children = [asyncio.ensure_future(child(i)) for i in range(3)]
            with ai.data.preprocess:
                await asyncio.sleep(0.002)
            await asyncio.gather(*children)
            with ai.device.transfer:
                pass

    with testing.trace_to(tmp_path) as t:
        asyncio.run(parent())
    spans = by_id(t.events)
    [request] = t.spans("pipeline.request")
    for name in ("preprocess", "transfer"):
        [e] = t.spans(name)
        assert (e["tid"], e["args"]["p_idx"]) == (request["tid"], request["id"])
    forwards = t.spans("forward")
    assert len({e["tid"] for e in forwards} | {request["tid"]}) == 4
    assert all(e["args"]["p_idx"] == 0 and e["args"]["level"] == 1 for e in forwards)
    for e in t.spans("backward"):
        assert spans[e["args"]["p_idx"]]["name"] == "forward" and spans[e["args"]["p_idx"]]["tid"] == e["tid"]
    check_nesting(t.events)


def test_a_cancelled_or_timed_out_task_s_span_says_so(tmp_path):
    """A request cancelled (``task.cancel()``) or timed out (``asyncio.wait_for``) is
    not a success: its spans carry ``error: CancelledError``, as an exception's do;
    one that finished has none. They were written as successes."""

    @ai.pipeline.derive("request")
    async def handle(delay):
        with ai.pipeline.derive("queue"):
            await asyncio.sleep(delay)
        return delay

    async def main():
        done = await handle(0)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(handle(10), 0.01)
        task = asyncio.ensure_future(handle(10))
        await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return done

    with testing.trace_to(tmp_path) as t:
        assert asyncio.run(main()) == 0
    errors = sorted((e["name"], e["args"].get("error", "")) for e in t.spans()
                    if e["name"] in ("pipeline.request", "pipeline.queue"))
    assert errors == [("pipeline.queue", ""), *[("pipeline.queue", "CancelledError")] * 2,
                      ("pipeline.request", ""), *[("pipeline.request", "CancelledError")] * 2], errors
    assert_valid(t.paths)


def test_concurrent_tasks_get_their_own_tracks(tmp_path):
    """Concurrent asyncio tasks on one node each write their own event on a track of their own."""

    @ai.comm.receive
    async def fetch(i):
        await asyncio.sleep(0.001 * (i % 3))
        with ai.compute.forward:
            pass

    async def main():
        await asyncio.gather(*(fetch(i) for i in range(20)))

    with testing.trace_to(tmp_path) as t:
        asyncio.run(main())
    recv = t.spans("receive")
    assert len(recv) == 20 and len({e["tid"] for e in recv}) == 20
    fwd = by_id(t.events)
    for f in t.spans("forward"):
        assert fwd[f["args"]["p_idx"]]["name"] == "receive"
    check_nesting(t.events)
    assert_valid(t.paths)


def test_generator_function_span_covers_its_iteration(tmp_path):
    """A decorated generator function writes one span ending when the generator finishes."""

    @ai.data.preprocess
    def gen(n):
        yield from range(n)

    with testing.trace_to(tmp_path) as t:
        assert list(gen(3)) == [0, 1, 2]
    assert len(t.spans("preprocess")) == 1


def test_decorators_applied_before_initialize_record_after_it(tmp_path):
    """Nodes decorated at import time (before ``initialize``) record once tracing starts."""

    @ai.compute.step
    def early():
        pass

    early()  # not tracing yet: nothing recorded, nothing raised
    with testing.trace_to(tmp_path) as t:
        early()
    assert t.names() == ["step"]


def test_finalize_is_idempotent_and_stops_recording(tmp_path):
    """``finalize()`` twice is fine; after it nothing records."""
    s = dftrace.initialize(log_file=str(tmp_path / "t"), compression="none", inherit=False)
    with ai.compute.forward:
        pass
    dftrace.finalize()
    dftrace.finalize()
    with ai.compute.forward:
        pass
    events = testing.read_events(s.path)
    assert len(testing.spans(events)) == 1
    assert open(s.path).read().endswith("]\n")


def test_initialize_twice_returns_the_running_session(tmp_path):
    """A second ``initialize`` while a session runs returns it instead of opening a new file."""
    s1 = dftrace.initialize(log_file=str(tmp_path / "t"), inherit=False)
    s2 = dftrace.initialize(log_file=str(tmp_path / "other"), inherit=False)
    assert s1 is s2 and dftrace.session() is s1
    with ai.compute.forward:
        pass
    dftrace.finalize()
    files = testing.trace_files(tmp_path)
    assert [os.path.basename(f).split("-")[0] for f in files] == ["t"]
    assert len(testing.spans(testing.read_events(files[0]), "forward")) == 1


def test_leaving_a_with_block_closes_start_spans_left_open_inside(tmp_path):
    """A ``with`` span that ends while a ``start()`` inside it is still open closes that
    span too (flagged incomplete), so the file stays properly nested."""
    with testing.trace_to(tmp_path) as t:
        with ai.pipeline.epoch:
            ai.compute.start()  # e.g. a callback whose end never came
        with ai.comm.barrier:  # the stack is clean again: a root span
            pass
    comp, = t.spans("compute")
    epoch, = t.spans("epoch")
    assert comp["args"]["incomplete"] is True and comp["args"]["p_idx"] == epoch["id"]
    assert t.spans("barrier")[0]["args"]["level"] == 1
    check_nesting(t.events)
