"""What ``capture=`` costs per call, off and on, beside a bare call.

Same method as ``test_bench_core.py``: LOOP calls per round into a session whose
writer stays idle (the caller's cost only; encoding happens later, off the caller's
thread), minimum round time / LOOP = cost per call. Group ``capture``:

- ``bare``: the undecorated function, two arguments;
- ``off``: decorated without ``capture`` (the cost when capture is not used; it must
  equal the core's decorator ``hot`` figure: the same wrapper is used);
- ``on_disabled``: decorated with ``capture=True`` but the node switched off;
- ``on_ints``: ``capture=True, capture_result=True`` with two int arguments;
- ``on_ndarray`` / ``on_tensor``: the same with a numpy array / torch tensor argument
  (type, shape, dtype, device summarised);
- ``on_tensor_hash``: plus ``capture_hash=True`` on a 256-float tensor;
- ``with_on``: ``with node(capture=["x"], capture_result=True)`` around a block;
- ``iter_on``: ``.iter()`` with ``capture_result=True``, per item (two spans).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dftrace import ai
from dftrace._core import buffer as _buffer

LOOP = 10_000


def work(x, y=1):
    return x


def _clear():
    _buffer.discard_buffered()


def _run(benchmark, loop_fn):
    benchmark.extra_info["events_per_round"] = LOOP
    benchmark.pedantic(loop_fn, setup=_clear, rounds=20, iterations=1, warmup_rounds=2)


def _call_loop(fn, arg):
    def loop():
        for _ in range(LOOP):
            fn(arg, 2)
    return loop


@pytest.mark.benchmark(group="capture")
def test_capture_bare(benchmark):
    _run(benchmark, _call_loop(work, 1))


@pytest.mark.benchmark(group="capture")
def test_capture_off(benchmark, tracing):
    _run(benchmark, _call_loop(ai.compute.forward(work), 1))


@pytest.mark.benchmark(group="capture")
def test_capture_on_disabled(benchmark, tracing):
    f = ai.compute.forward(capture=True, capture_result=True)(work)
    ai.compute.forward.disable()
    _run(benchmark, _call_loop(f, 1))


@pytest.mark.benchmark(group="capture")
def test_capture_on_ints(benchmark, tracing):
    _run(benchmark, _call_loop(ai.compute.forward(capture=True, capture_result=True)(work), 1))


@pytest.mark.benchmark(group="capture")
def test_capture_on_ndarray(benchmark, tracing):
    f = ai.compute.forward(capture=True, capture_result=True)(work)
    _run(benchmark, _call_loop(f, np.zeros((32, 3, 8, 8), dtype=np.float32)))


@pytest.mark.benchmark(group="capture")
def test_capture_on_tensor(benchmark, tracing):
    f = ai.compute.forward(capture=True, capture_result=True)(work)
    _run(benchmark, _call_loop(f, torch.zeros(32, 3, 8, 8)))


@pytest.mark.benchmark(group="capture")
def test_capture_on_tensor_hash(benchmark, tracing):
    f = ai.compute.forward(capture=True, capture_result=True, capture_hash=True)(work)
    _run(benchmark, _call_loop(f, torch.zeros(256)))


@pytest.mark.benchmark(group="capture")
def test_capture_with_on(benchmark, tracing):
    use = ai.compute.forward(capture=["x"], capture_result=True)

    def loop():
        x = 1
        for _ in range(LOOP):
            with use:
                y = x  # noqa: F841 - the block's assignment is what capture_result records

    _run(benchmark, loop)


@pytest.mark.benchmark(group="capture")
def test_capture_iter_on(benchmark, tracing):
    use = ai.dataloader.fetch(capture_result=True)
    items = list(range(LOOP))

    def loop():
        for _ in use.iter(items):
            pass

    _run(benchmark, loop)
