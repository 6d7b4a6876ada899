"""Overhead of recording one event, side by side with a bare call and a minimal
hand-written recorder (two ``perf_counter_ns()`` reads and a tuple appended to a list).

Every benchmark runs LOOP events per round; divide by LOOP for the cost of one event
(``bench/report.py`` prints the table in docs/performance.md). Groups:

- ``decorator``, ``with``, ``iter``, ``startstop``: the API styles. In each group:
  ``bare`` (no tracing code at all), ``hand`` (the minimal recorder), ``flag`` (a
  wrapper that checks one flag, the bar for the disabled path), ``hot`` (dftrace
  recording into its buffer, the writer idle), ``disabled`` (dftrace switched off
  at run time with ``ai.disable()``), ``offconfig`` (off by configuration).
- ``e2e``: LOOP_E2E events then ``finalize()``: encoding, compression and writing
  included.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import subprocess
import sys
import threading
import time
from time import perf_counter_ns

import pytest

import dftrace
from dftrace import ai, testing
from dftrace._core import tree as _tree
from dftrace._core import buffer as _buffer

LOOP = 10_000
LOOP_E2E = 200_000


def work():
    return None


# -- the baselines ------------------------------------------------------------------
_hand_buf: list = []


def hand_recorder(fn):
    append = _hand_buf.append

    def wrapper(*args, **kwargs):
        t0 = perf_counter_ns()
        r = fn(*args, **kwargs)
        t1 = perf_counter_ns()
        append((t0, t1))
        return r

    return wrapper


class _Flag:
    on = False


def flag_wrapper(fn, flag=_Flag):
    def wrapper(*args, **kwargs):
        if not flag.on:
            return fn(*args, **kwargs)
        return fn(*args, **kwargs)

    return wrapper


class HandCM:
    __slots__ = ("t0",)

    def __enter__(self):
        self.t0 = perf_counter_ns()

    def __exit__(self, *exc):
        _hand_buf.append((self.t0, perf_counter_ns()))


def hand_iter(it):
    t0 = perf_counter_ns()
    for x in it:
        t1 = perf_counter_ns()
        _hand_buf.append((t0, t1))
        yield x
        t0 = perf_counter_ns()
        _hand_buf.append((t1, t0))


def _clear():
    _hand_buf.clear()
    _buffer.discard_buffered()


def _run(benchmark, loop_fn):
    benchmark.extra_info["events_per_round"] = LOOP
    benchmark.pedantic(loop_fn, setup=_clear, rounds=30, iterations=1, warmup_rounds=2)


def _call_loop(fn):
    def loop():
        for _ in range(LOOP):
            fn()
    return loop


# -- decorator ------------------------------------------------------------------------
@pytest.mark.benchmark(group="decorator")
def test_decorator_bare(benchmark):
    _run(benchmark, _call_loop(work))


@pytest.mark.benchmark(group="decorator")
def test_decorator_hand(benchmark):
    _run(benchmark, _call_loop(hand_recorder(work)))


@pytest.mark.benchmark(group="decorator")
def test_decorator_flag(benchmark):
    _run(benchmark, _call_loop(flag_wrapper(work)))


@pytest.mark.benchmark(group="decorator")
def test_decorator_hot(benchmark, tracing):
    _run(benchmark, _call_loop(ai.compute.forward(work)))


@pytest.mark.benchmark(group="decorator")
def test_decorator_disabled(benchmark, tracing):
    f = ai.compute.forward(work)
    ai.disable()
    _run(benchmark, _call_loop(f))


@pytest.mark.benchmark(group="decorator")
def test_decorator_offconfig(benchmark):
    _tree.set_off_for_good(True)
    _run(benchmark, _call_loop(ai.compute.forward(work)))


# -- with -------------------------------------------------------------------------------
def _with_loop(cm):
    def loop():
        for _ in range(LOOP):
            with cm:
                pass
    return loop


@pytest.mark.benchmark(group="with")
def test_with_bare(benchmark):
    _run(benchmark, _with_loop(contextlib.nullcontext()))


@pytest.mark.benchmark(group="with")
def test_with_hand(benchmark):
    _run(benchmark, _with_loop(HandCM()))


@pytest.mark.benchmark(group="with")
def test_with_hot(benchmark, tracing):
    _run(benchmark, _with_loop(ai.comm.all_reduce))


@pytest.mark.benchmark(group="with")
def test_with_disabled(benchmark, tracing):
    ai.disable()
    _run(benchmark, _with_loop(ai.comm.all_reduce))


@pytest.mark.benchmark(group="with")
def test_with_offconfig(benchmark):
    _tree.set_off_for_good(True)
    _run(benchmark, _with_loop(ai.comm.all_reduce))


# -- iter -------------------------------------------------------------------------------
_ITEMS = range(LOOP)


def _iter_loop(wrap):
    def loop():
        for _ in wrap(_ITEMS):
            pass
    return loop


@pytest.mark.benchmark(group="iter")
def test_iter_bare(benchmark):
    _run(benchmark, _iter_loop(lambda x: x))


@pytest.mark.benchmark(group="iter")
def test_iter_hand(benchmark):
    _run(benchmark, _iter_loop(hand_iter))


@pytest.mark.benchmark(group="iter")
def test_iter_hot(benchmark, tracing):
    _run(benchmark, _iter_loop(ai.dataloader.fetch.iter))


@pytest.mark.benchmark(group="iter")
def test_iter_disabled(benchmark, tracing):
    ai.disable()
    _run(benchmark, _iter_loop(ai.dataloader.fetch.iter))


@pytest.mark.benchmark(group="iter")
def test_iter_offconfig(benchmark):
    _tree.set_off_for_good(True)
    _run(benchmark, _iter_loop(ai.dataloader.fetch.iter))


# -- start / stop -----------------------------------------------------------------------
def _startstop_loop(node):
    def loop():
        for _ in range(LOOP):
            node.start()
            node.stop()
    return loop


@pytest.mark.benchmark(group="startstop")
def test_startstop_hand(benchmark):
    state = {}

    class Hook:
        def start(self):
            state["t0"] = perf_counter_ns()

        def stop(self):
            _hand_buf.append((state["t0"], perf_counter_ns()))

    _run(benchmark, _startstop_loop(Hook()))


@pytest.mark.benchmark(group="startstop")
def test_startstop_hot(benchmark, tracing):
    _run(benchmark, _startstop_loop(ai.pipeline.train))


@pytest.mark.benchmark(group="startstop")
def test_startstop_disabled(benchmark, tracing):
    ai.disable()
    _run(benchmark, _startstop_loop(ai.pipeline.train))


# -- end to end -------------------------------------------------------------------------
def _e2e(benchmark, tmp_path, compression, body):
    def setup():
        dftrace.initialize(log_file=str(tmp_path / f"e2e-{time.perf_counter_ns()}"),
                           compression=compression, inherit=False)
        return (), {}

    def run():
        body()
        dftrace.finalize()

    benchmark.extra_info["events_per_round"] = LOOP_E2E
    benchmark.pedantic(run, setup=setup, rounds=3, iterations=1)


@pytest.mark.benchmark(group="e2e")
@pytest.mark.parametrize("compression", ["zstd", "gzip", "none"])
def test_e2e_decorator(benchmark, tmp_path, compression):
    f = ai.compute.forward(work)

    def body():
        for _ in range(LOOP_E2E):
            f()

    _e2e(benchmark, tmp_path, compression, body)


@pytest.mark.benchmark(group="e2e")
def test_e2e_with(benchmark, tmp_path):
    def body():
        cm = ai.comm.all_reduce
        for _ in range(LOOP_E2E):
            with cm:
                pass

    _e2e(benchmark, tmp_path, "zstd", body)


@pytest.mark.benchmark(group="e2e")
def test_e2e_iter(benchmark, tmp_path):
    def body():  # two events per item
        for _ in ai.dataloader.fetch.iter(range(LOOP_E2E // 2)):
            pass

    _e2e(benchmark, tmp_path, "zstd", body)


@pytest.mark.benchmark(group="e2e")
def test_e2e_startstop(benchmark, tmp_path):
    def body():
        node = ai.pipeline.train
        for _ in range(LOOP_E2E):
            node.start()
            node.stop()

    _e2e(benchmark, tmp_path, "zstd", body)


# -- size and pauses (figures, not timings of a loop) -----------------------------------
def realistic_run(steps: int) -> int:
    """A training-loop shaped trace: epochs, fetch.iter/block, forward/backward/step with
    epoch/step args, an all_reduce with bytes. Returns the number of events."""

    @ai.compute.forward
    def forward():
        pass

    @ai.compute.backward
    def backward():
        with ai.comm.all_reduce(args={"bytes": 4096}):
            pass

    @ai.compute.step
    def step():
        pass

    n = 0
    for epoch in ai.pipeline.epoch.iter(range(4)):
        ai.update(epoch=epoch)
        for i in ai.dataloader.fetch.iter(range(steps // 4)):
            ai.compute.update(step=i)
            forward()
            backward()
            step()
            n += 6
        n += 2
    return n


@pytest.mark.parametrize("compression", ["zstd", "gzip", "none"])
def test_bytes_per_event(benchmark, tmp_path, compression):
    """Bytes on disk per event for a realistic trace (stored in extra_info)."""
    sizes = {}

    def run():
        d = tmp_path / f"size-{time.perf_counter_ns()}"
        s = dftrace.initialize(log_file=str(d / "t"), compression=compression, inherit=False)
        n = realistic_run(40_000)
        dftrace.finalize()
        sizes["bpe"] = sum(os.path.getsize(p) for p in s.paths) / n

    benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info["bytes_per_event"] = round(sizes["bpe"], 2)


_BLOCK = b"x" * 8192


def _native_work():
    """About 5 µs of C work that releases the GIL, as a tensor op does."""
    hashlib.sha256(_BLOCK).digest()


def test_longest_flush_pause(benchmark, tmp_path):
    """How long a traced thread waits while the writer works. A thread emits events
    each wrapping ~5 µs of GIL-releasing C work (about 170k events/s, more than any
    training loop); we record every gap over 1 ms between batches of 10 events, and
    the windows where the writer flushes holding the GIL. Three rounds of 1 s
    untraced then 1 s traced, so the machine's own noise is measured beside it.
    Reported (extra_info, ms): the longest gap that overlaps a flush, the longest
    gap traced and untraced, the number of gaps over 1 ms of each, and the longest
    gap that overlaps one of the interpreter's garbage collections (in any thread:
    each holds the GIL; its length grows with the program's heap, here pytest's)."""
    result = {"untraced_max_ms": 0.0, "traced_max_ms": 0.0, "during_flush_max_ms": 0.0,
              "untraced_gaps_over_1ms": 0, "traced_gaps_over_1ms": 0, "during_gc_max_ms": 0.0}
    collections: list[tuple[int, int]] = []
    began = [0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            began[0] = perf_counter_ns()
        else:
            collections.append((began[0], perf_counter_ns()))

    def gaps(traced: bool) -> tuple[list[int], int]:
        f = ai.compute.forward(_native_work)
        windows: list[tuple[int, int]] = []
        if traced:
            # The writer thread's flushes run in this process (the drainer's, in its own).
            s = dftrace.initialize(log_file=str(tmp_path / f"p-{time.perf_counter_ns()}"),
                                   inherit=False, writer="thread")
            original = s.writer._flush_batch

            def timed():
                t0 = perf_counter_ns()
                n = original()
                if n:
                    windows.append((t0, perf_counter_ns()))
                return n

            s.writer._flush_batch = timed
        long_gaps = []
        last = perf_counter_ns()
        end = last + 1_000_000_000
        while last < end:
            for _ in range(10):
                f()
            now = perf_counter_ns()
            if now - last > 1_000_000:
                long_gaps.append((last, now))
            last = now
        if traced:
            dftrace.finalize()
        in_flush = max((b - a for a, b in long_gaps
                        if any(w0 < b and a < w1 for w0, w1 in windows)), default=0)
        in_gc = max((b - a for a, b in long_gaps
                     if any(w0 < b and a < w1 for w0, w1 in collections)), default=0)
        return [b - a for a, b in long_gaps], in_flush, in_gc

    def run():
        gc.callbacks.append(on_gc)
        try:
            for _ in range(3):
                for mode in ("untraced", "traced"):
                    got, in_flush, in_gc = gaps(mode == "traced")
                    result[f"{mode}_max_ms"] = max(result[f"{mode}_max_ms"], max(got, default=0) / 1e6)
                    result[f"{mode}_gaps_over_1ms"] += len(got)
                    result["during_flush_max_ms"] = max(result["during_flush_max_ms"], in_flush / 1e6)
                    result["during_gc_max_ms"] = max(result["during_gc_max_ms"], in_gc / 1e6)
        finally:
            gc.callbacks.remove(on_gc)

    benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update({k: round(v, 2) for k, v in result.items()})


def test_import_time(benchmark):
    """Wall time of ``import dftrace`` in a fresh interpreter, minus a bare interpreter start."""
    def timed(code: str) -> float:
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            best = min(best, time.perf_counter() - t)
        return best

    res = {}

    def run():
        res["ms"] = (timed("import dftrace") - timed("pass")) * 1000

    benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info["import_ms"] = round(res["ms"], 1)


def test_threads_do_not_block_each_other(benchmark, tracing):
    """Four threads recording at once (total events per round = 4 x LOOP)."""
    f = ai.compute.forward(work)

    def loop():
        ts = [threading.Thread(target=_call_loop(f)) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    benchmark.extra_info["events_per_round"] = 4 * LOOP
    benchmark.pedantic(loop, setup=_clear, rounds=5, iterations=1)


# make the realistic workload importable for docs/performance.md's reproduction notes
__all__ = ["realistic_run", "testing"]
