"""The recording engine: one primitive under every style, exact buffer bounds, signals
during back-pressure, args snapshots, sticky args at span start, valid nesting."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import sys
import threading
import weakref

import pytest
from _requirements import native_engine_missing, needs, needs_marks

import dftrace
from dftrace import ai, testing
from dftrace._core import engine as _engine
from dftrace._core import buffer as _buffer
from dftrace._core.state import STATE

LIMIT = 1024  # the smallest buffer_limit the configuration accepts


def _styles():
    """Each recording style, as a function recording ``n`` spans of its own."""

    @ai.compute.forward
    def plain():
        pass

    @ai.compute.backward
    async def coro():
        pass

    @ai.data.preprocess
    def gen():
        yield 1

    def decorator(n):
        for _ in range(n):
            plain()

    def with_block(n):
        for _ in range(n):
            with ai.comm.all_reduce:
                pass

    def with_args(n):
        for i in range(n):
            with ai.comm.bcast(args={"bytes": i}):
                pass

    def iterator(n):  # two spans per item
        for _ in ai.dataloader.fetch.iter(range(n // 2)):
            pass

    def start_stop(n):
        for _ in range(n):
            ai.device.transfer.start().stop(args={"bytes": 1})

    def async_decorator(n):
        async def main():
            for _ in range(n):
                await coro()
        asyncio.run(main())

    def generator(n):
        for _ in range(n):
            list(gen())

    def async_iterator(n):  # two spans per item
        async def items():
            for i in range(n // 2):
                yield i

        async def main():
            async for _ in ai.pipeline.epoch.aiter(items()):
                pass
        asyncio.run(main())

    return {"decorator": decorator, "with": with_block, "with_args": with_args,
            "iter": iterator, "start_stop": start_stop, "async": async_decorator,
            "generator": generator, "aiter": async_iterator}


@pytest.mark.parametrize("writer", ["thread", "process"])
@pytest.mark.parametrize("style", sorted(_styles()))
def test_buffer_limit_is_exact_for_every_style(tmp_path, style, writer):
    """With nobody draining, the buffer holds exactly buffer_limit spans and the rest
    are dropped and counted, whatever the style records with, with either writer (the
    process writer's bound: spans in its shared ring not yet freed by the drainer)."""
    record = _styles()[style]
    dftrace.initialize(log_file=str(tmp_path / "t"), buffer_limit=LIMIT, on_full="drop",
                       batch_size=10**9, flush_interval=3600, writer=writer)
    STATE.consumer = None  # the writer stops taking records
    before = _buffer.buffered()
    record(3 * LIMIT)
    assert _buffer.buffered() == LIMIT
    assert STATE.dropped >= 3 * LIMIT - (LIMIT - before) - 2
    dropped = STATE.dropped
    dftrace.finalize()
    events = testing.read_events(tmp_path)
    lines = [e for e in events if e.get("name") == "dropped"]
    assert lines and lines[0]["args"]["count"] == dropped
    assert len(testing.spans(events)) == LIMIT


def test_keyboard_interrupt_while_waiting_for_room_reaches_the_program(tmp_path):
    """In block mode a span that waits for the writer to make room lets a Ctrl-C
    through: the KeyboardInterrupt propagates from the traced call."""
    dftrace.initialize(log_file=str(tmp_path / "t"), buffer_limit=LIMIT, batch_size=10**9,
                       flush_interval=3600)

    class StuckWriter:
        def wake(self):
            pass

        def wait_drained(self, below, timeout):
            threading.Event().wait(timeout)  # interruptible: a signal handler runs here
            return False

    STATE.consumer = StuckWriter()
    main = threading.main_thread().ident
    # Python's Ctrl-C handler, whatever this run inherited (a background job ignores SIGINT).
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGINT))
    timer.start()

    @ai.compute.forward
    def step():
        return 1

    calls = 0
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in range(100 * LIMIT):
                step()
                calls += 1
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, inherited)
    assert LIMIT <= calls < 100 * LIMIT


def test_stop_args_are_a_snapshot_and_keep_no_object_alive(tmp_path):
    """Args given to stop() and to node(args=) are encoded when given: a later change
    is not written, and the objects are not kept until the writer runs."""

    class Big:
        def __repr__(self):
            return "<Big>"

    big = Big()
    ref = weakref.ref(big)
    out = {"shape": [1, 2]}
    with testing.trace_to(tmp_path) as result:
        span = ai.compute.forward.start()
        span.stop(args={"out": out, "obj": big})
        out["shape"].append(3)
        del big
        gc.collect()
        alive_before_write = ref() is not None
        given = {"bytes": 10}
        with ai.comm.all_reduce(args=given):
            given["bytes"] = 99
    assert not alive_before_write
    fwd = result.spans("forward")[0]
    assert fwd["args"]["out"] == {"shape": [1, 2]} and fwd["args"]["obj"] == "<Big>"
    assert result.spans("all_reduce")[0]["args"]["bytes"] == 10


def test_sticky_args_are_those_in_force_when_the_span_started(tmp_path):
    """update() reaches the spans that start after it, not the ones already open:
    an epoch span does not carry the step of its last iteration."""
    with testing.trace_to(tmp_path) as result:
        for epoch in ai.pipeline.epoch.iter(range(2)):
            ai.update(epoch=epoch)
            for step in range(3):
                ai.update(step=step)
                with ai.compute.forward:
                    pass
        ai.update(step=99)
    fwds = result.spans("forward")
    assert [(f["args"]["epoch"], f["args"]["step"]) for f in fwds] == [
        (e, s) for e in range(2) for s in range(3)]
    blocks = result.spans("epoch.block")
    assert "step" not in blocks[0]["args"] and blocks[1]["args"]["step"] == 2
    assert blocks[1]["args"]["epoch"] == 0  # in force when the second epoch's body began


def test_update_is_constant_time_in_the_size_of_the_tree():
    """update() encodes only the values given: nodes refresh lazily on their next
    span, so an update after deriving 2,000 nodes touches none of them."""
    for i in range(2000):
        ai.compute.derive(f"layer{i}")
    refreshed = []
    real = _engine.sticky_of

    def counting(node):
        refreshed.append(node)
        return real(node)

    _engine.sticky_of = counting
    try:
        ai.update(step=1)
    finally:
        _engine.sticky_of = real
    assert refreshed == []
    assert ai.compute.derive("layer7")._args() == {"step": 1}


def test_switched_off_by_configuration_returns_the_plain_objects(monkeypatch):
    """DFTRACE_ENABLE=0: decorators return the function, node(args=) a do-nothing
    use, .iter(x) iter(x), update() nothing."""
    dftrace.initialize(enable=False)

    def f():
        return 1

    use = ai.comm.all_reduce(args={"bytes": 1})
    assert ai.compute.forward(f) is f and use(f) is f
    items = iter([1, 2])
    assert ai.dataloader.fetch.iter(items) is items and use.iter(items) is items
    assert list(ai.dataloader.fetch.iter([1, 2])) == [1, 2]
    with use:
        pass
    ai.update(step=1)
    assert ai.compute.forward._args() == {}


def test_disabled_node_use_encodes_nothing_until_it_records(tmp_path, monkeypatch):
    """node(args=) made while the node is off encodes nothing; used after recording
    starts it still writes its args."""
    from dftrace._core import records as _records

    encoded = []
    real = _records.plain_fragment
    monkeypatch.setattr(_records, "plain_fragment", lambda *a: encoded.append(a) or real(*a))
    ai.comm.disable()
    use = ai.comm.all_reduce(args={"bytes": 7})
    assert encoded == []
    ai.comm.enable()
    with testing.trace_to(tmp_path) as result:
        with use:
            pass
    assert result.spans("all_reduce")[0]["args"]["bytes"] == 7


def test_zip_of_two_iterators_writes_valid_nesting(tmp_path):
    """zip(a.iter(x), b.iter(y)) nests both loop bodies, and a decorated generator
    started before a with block and finished inside it gets a track of its own."""

    @ai.data.preprocess
    def gen():
        yield 1
        yield 2

    with testing.trace_to(tmp_path) as result:  # trace_to validates every file it reads
        for a, b in zip(ai.dataloader.fetch.iter(range(3)), ai.data.item.iter(range(3))):
            with ai.compute.forward:
                pass
        g = gen()
        next(g)
        with ai.compute.backward:
            list(g)
    assert len(result.spans("fetch.block")) == 3 and len(result.spans("item.block")) == 3
    testing.assert_nested(result, "item.block", "forward")
    assert len(result.spans("preprocess")) == 1


@pytest.mark.parametrize("engine", [
    pytest.param("SpanWrapper", marks=needs_marks("native", native_engine_missing())),
    "function",
])
def test_deep_recursion_works_as_deep_as_untraced(tmp_path, engine):
    """Traced recursion reaches the depth the same code reaches untraced: through the
    C decorator (whose call into the function Python 3.12 would charge to a C
    recursion budget of its own), and through the pure-Python engine's, which adds a
    frame per call and makes room for it."""
    code = (
        "import sys, dftrace\n"
        "from dftrace import ai\n"
        "dftrace.initialize(log_file=sys.argv[1])\n"
        "def plain(n):\n"
        "    return 0 if n == 0 else 1 + plain(n - 1)\n"
        "@ai.compute.forward\n"
        "def down(n):\n"
        "    return 0 if n == 0 else 1 + down(n - 1)\n"
        "returned = []\n"
        "def deepest(f):\n"
        "    lo, hi = 0, sys.getrecursionlimit()\n"
        "    while lo < hi:\n"
        "        mid = (lo + hi + 1) // 2\n"
        "        try:\n"
        "            f(mid)\n"
        "            lo = mid\n"
        "            returned.append(mid)\n"
        "        except RecursionError:\n"
        "            hi = mid - 1\n"
        "    return lo\n"
        "untraced = deepest(plain)\n"
        "returned.clear()\n"
        "traced = deepest(down)\n"
        "dftrace.finalize()\n"
        "print(type(down).__name__, untraced, traced, sum(n + 1 for n in returned))\n"
    )
    env = dict(os.environ, DFTRACE_NO_SPEEDUPS="" if engine == "SpanWrapper" else "1")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "deep")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    kind, untraced, traced, spans_returned = out.stdout.split()
    assert kind == engine
    assert int(untraced) > 900  # the default limit of 1000, less the frames below
    assert int(traced) >= int(untraced)
    # every level of every traced call that returned is in the trace
    forward = testing.spans(testing.read_events(tmp_path), "forward")
    assert sum(1 for e in forward if "error" not in e.get("args", {})) == int(spans_returned)


@needs("native", native_engine_missing())
def test_records_are_native_and_small():
    """With the C engine a buffered span without args takes 64 bytes of native memory."""
    assert _engine.speedups.RECORD_SIZE <= 64


def test_update_before_tracing_starts_reaches_the_first_spans(tmp_path):
    """Sticky args given while nothing records are kept (not encoded) and land on the
    spans that start once tracing is on."""
    ai.update(epoch=3)
    ai.compute.update({"step": 7})
    with testing.trace_to(tmp_path) as result:
        with ai.compute.forward:
            pass
        with ai.comm.all_reduce:
            pass
    assert result.spans("forward")[0]["args"]["epoch"] == 3
    assert result.spans("forward")[0]["args"]["step"] == 7
    assert result.spans("all_reduce")[0]["args"]["epoch"] == 3
    assert "step" not in result.spans("all_reduce")[0]["args"]


def test_updates_while_off_keep_the_last_value_of_each_key(tmp_path):
    """Repeated updates from one call site while nothing records (a training loop
    before initialize) keep each key's last value, and updates from other sites made
    in between keep theirs: the first spans carry what was set last."""
    for step in range(5):
        ai.update(epoch=0, step=step)
        if step == 2:
            ai.update(lr=0.1, step=-1)
    ai.update(epoch=1, step=9)
    assert ai._pending == {"epoch": 1, "step": 9, "lr": 0.1}
    ai.update(phase="train")
    with testing.trace_to(tmp_path) as result:
        with ai.compute.forward:
            pass
    args = result.spans("forward")[0]["args"]
    assert (args["epoch"], args["step"], args["lr"], args["phase"]) == (1, 9, 0.1, "train")
