"""The C engine's span styles allocate nothing per call once warm: no span id, no
use, no token, no args object made per span. Counted below dftrace, at CPython's
allocators, on the calling thread (``_speedups.allocations``), under both writers."""

from __future__ import annotations

import itertools
import sys

import pytest

from dftrace import ai, testing
from dftrace._core import engine

pytestmark = pytest.mark.skipif(engine.speedups is None, reason="the C engine is not in use")

CALLS = 10_000
ARGS = {"bytes": 4096, "kind": "grad", "ratio": 0.5}


@ai.compute.forward
def _forward() -> None:
    return None


def _decorator(n: int) -> None:
    for _ in itertools.repeat(None, n):
        _forward()


def _with(n: int) -> None:
    for _ in itertools.repeat(None, n):
        with ai.comm.all_reduce:
            pass


def _with_args(n: int) -> None:
    for _ in itertools.repeat(None, n):
        with ai.comm.all_reduce(args=ARGS):
            pass


#: Args that change every call (built beforehand: the loop allocates nothing), and for
#: the warm-up args of many other lengths, so that what it leaves kept fits none.
_CHANGING = [{"bytes": 10_000 + i} for i in range(CALLS)]
_WARMING = [{"bytes": i, "tag": "x" * (i % 24)} for i in range(3000)]


def _with_changing_args(n: int) -> None:
    for args in _CHANGING[:n] if n == CALLS else _WARMING[:n]:
        with ai.comm.all_reduce(args=args):
            pass


def _node_start_stop(n: int) -> None:
    for _ in itertools.repeat(None, n):
        ai.device.transfer.start()
        ai.device.transfer.stop()


def _span_stop(n: int) -> None:
    for _ in itertools.repeat(None, n):
        ai.device.transfer.start().stop()


def _span_stop_args(n: int) -> None:
    for _ in itertools.repeat(None, n):
        ai.device.transfer.start().stop(args=ARGS)


def _iter(n: int) -> None:
    for _ in ai.dataloader.fetch.iter(itertools.repeat(None, n)):
        pass


#: style -> (its loop, the spans it records per call)
STYLES = {"decorator": (_decorator, {"forward": 1}), "with": (_with, {"all_reduce": 1}),
          "with args": (_with_args, {"all_reduce": 1}),
          "with args changing every call": (_with_changing_args, {"all_reduce": 1}),
          "node start/stop": (_node_start_stop, {"transfer": 1}),
          "Span.stop()": (_span_stop, {"transfer": 1}),
          "Span.stop(args=)": (_span_stop_args, {"transfer": 1}),
          ".iter() item": (_iter, {"fetch.iter": 1, "fetch.block": 1})}


def _loop_alone(n: int) -> None:
    for _ in itertools.repeat(None, n):
        pass


@pytest.mark.parametrize("writer", ["thread", "process"])
@pytest.mark.parametrize("style", list(STYLES))
def test_a_warm_span_style_allocates_nothing_per_call(tmp_path, writer, style):
    from dftrace._core import _speedups

    loop, spans = STYLES[style]
    # the loop itself allocates nothing: what is counted below is dftrace's
    assert _speedups.allocations(lambda: _loop_alone(CALLS))[1] < 10
    with testing.trace_to(tmp_path, writer=writer) as t:
        loop(3000)  # warm: the freelists and spare ids filled, the buffer's chunks made
        _, made = _speedups.allocations(lambda: loop(CALLS))
    if style == "Span.stop(args=)" and sys.version_info < (3, 11):
        made -= CALLS  # CPython 3.10 makes a bound method for each method call by keyword
    # a chunk of the buffer now and then (thread writer); nothing per span
    assert made < CALLS // 100, f"{style}: {made} allocations over {CALLS} calls"
    for name, per_call in spans.items():
        assert len(t.spans(name)) == per_call * (3000 + CALLS)
    if style == "with args changing every call":
        assert [s["args"]["bytes"] for s in t.spans("all_reduce")] == [*range(3000), *range(10_000, 10_000 + CALLS)]
    elif "args" in style:
        assert all(s["args"]["bytes"] == 4096 and s["args"]["kind"] == "grad" and s["args"]["ratio"] == 0.5
                   for s in t.spans(next(iter(spans))))


def test_the_counter_counts_what_a_call_allocates():
    from dftrace._core import _speedups

    def make(n: int) -> list:
        return [[i] for i in range(n)]

    result, made = _speedups.allocations(lambda: make(1000))
    assert len(result) == 1000 and made >= 1000
