"""What users write, timed under each tracer in a process of its own.

    python bench/_patterns.py TRACER PATTERN N OUT_DIR MODE

prints one JSON object. MODE ``hot``: ``hot_ns``, per operation, the fastest of five
rounds of N, dftrace's writer kept idle (recording only). MODE ``e2e``: ``e2e_ns``,
per operation for N operations then the tracer's finalize, in a fresh process
(recording, encoding, compression and writing together, with default settings).
MODE ``alloc``: ``allocs_per_op``, the allocations CPython's allocators made on the
calling thread per operation, N operations after a warm-up, default settings (the
loop's own included: ``loop`` counts those alone).

Tracers: ``loop`` (the loop alone: the same functions called, every tracer call
removed: the floor the off switch is measured against), ``bare`` (the same code
with no tracer: plain functions, null contexts),
``hand`` (a minimal hand-written Python recorder with the same API: two
``perf_counter_ns()`` reads and a tuple appended to a list per span), ``dftrace``,
``dftrace-off`` (tracing not started: off at run time), ``dftrace-disabled``
(started, then ``ai.disable()``), ``dftrace-offconfig``
(``DFTRACE_ENABLE=0``), ``dftracer`` (LLNL DFTracer 2.2.0, ``pydftracer``'s AI API;
``pip install 'dftrace[bench]'``).

Each tracer runs in a fresh process because DFTracer reads its switch at import.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from time import perf_counter_ns
from typing import Any

PATTERNS = ("decorator", "with", "with_args", "update", "iter", "startstop", "stop_args", "step",
            "step_args")
#: Spans each pattern records per operation (update records none).
SPANS = {"decorator": 1, "with": 1, "with_args": 1, "update": 0, "iter": 2, "startstop": 1,
         "stop_args": 1, "step": 8, "step_args": 8}


# -- the tracers ----------------------------------------------------------------------
class _BareNode:
    """The same calls with no tracer at all."""

    def __getattr__(self, name: str) -> _BareNode:
        return self

    def __call__(self, fn: Any = None, **kw: Any) -> Any:
        return fn if fn is not None else contextlib.nullcontext()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None

    def iter(self, it: Any) -> Any:
        return it

    def update(self, **kw: Any) -> None:
        return None

    def start(self) -> _BareNode:
        return self

    def stop(self, args: Any = None) -> None:
        return None


class _HandNode:
    """A minimal hand-written recorder with the ``ai`` API."""

    buf: list = []
    sticky: dict = {}

    def __init__(self, name: str = "ai") -> None:
        self.name = name
        self.args: Any = None

    def __getattr__(self, name: str) -> _HandNode:
        node = _HandNode(name)
        setattr(self, name, node)
        return node

    def __call__(self, fn: Any = None, *, args: Any = None) -> Any:
        if fn is None:
            use = _HandNode(self.name)
            use.args = dict(args) if args else None
            return use
        append = self.buf.append

        def wrapper(*a: Any, **kw: Any) -> Any:
            t0 = perf_counter_ns()
            r = fn(*a, **kw)
            append((t0, perf_counter_ns()))
            return r

        return wrapper

    def __enter__(self) -> _HandNode:
        self.t0 = perf_counter_ns()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.buf.append((self.t0, perf_counter_ns(), self.args))

    def iter(self, it: Any) -> Any:
        append = self.buf.append
        t0 = perf_counter_ns()
        for x in it:
            t1 = perf_counter_ns()
            append((t0, t1))
            yield x
            t0 = perf_counter_ns()
            append((t1, t0))

    def update(self, **kw: Any) -> None:
        self.sticky.update(kw)

    def start(self) -> _HandNode:
        span = _HandNode(self.name)
        span.t0 = perf_counter_ns()
        return span

    def stop(self, args: Any = None) -> None:
        self.buf.append((self.t0, perf_counter_ns(), dict(args) if args else None))


def _setup(tracer: str, out: str, hot: bool = False) -> tuple[Any, Any]:
    """(the ai tree, the finalize function) of ``tracer``."""
    if tracer == "loop":
        return None, lambda: None
    if tracer == "bare":
        return _BareNode(), lambda: None
    if tracer == "hand":
        return _HandNode(), lambda: None
    if tracer.startswith("dftrace") and tracer != "dftracer":
        if tracer == "dftrace-offconfig":
            os.environ["DFTRACE_ENABLE"] = "0"
        import dftrace

        if tracer in ("dftrace", "dftrace-disabled"):
            idle = {"flush_interval": 3600, "batch_size": 10**9, "buffer_limit": 10**8} if hot else {}
            dftrace.initialize(log_file=os.path.join(out, "t"), inherit=False, **idle)
        if tracer == "dftrace-disabled":
            dftrace.ai.disable()
        return dftrace.ai, dftrace.finalize
    if tracer == "dftracer":
        os.environ["DFTRACER_ENABLE"] = "1"
        os.environ["DFTRACER_INIT"] = "FUNCTION"
        os.environ.setdefault("DFTRACER_INC_METADATA", "1")
        from dftracer.python import ai, dftracer

        log = dftracer.initialize_log(logfile=os.path.join(out, "dft.pfw"), data_dir=None,
                                      process_id=-1)
        return ai, log.finalize
    raise SystemExit(f"unknown tracer {tracer!r}")


# -- the patterns -----------------------------------------------------------------------
def _loop(pattern: str) -> Any:
    """``pattern``'s loop with every tracer call removed (the functions still called)."""

    def fn() -> None:
        return None

    def calls(n: int) -> None:
        for _ in range(n):
            fn()

    def empty(n: int) -> None:
        for _ in range(n):
            pass

    def realistic(n: int) -> None:
        for i, _batch in enumerate(range(n)):
            fn()
            fn()
            fn()

    return {"decorator": calls, "step": realistic, "step_args": realistic}.get(pattern, empty)


def _make(pattern: str, ai: Any) -> Any:
    """A function running ``n`` operations of ``pattern``."""
    if ai is None:
        return _loop(pattern)

    @ai.compute.forward
    def forward() -> None:
        return None

    @ai.compute.backward
    def backward() -> None:
        return None

    @ai.compute.step
    def step() -> None:
        return None

    comm = ai.comm.all_reduce
    transfer = ai.device.transfer
    fetch = ai.dataloader.fetch

    def decorator(n: int) -> None:
        for _ in range(n):
            forward()

    def with_(n: int) -> None:
        for _ in range(n):
            with comm:
                pass

    def with_args(n: int) -> None:
        for i in range(n):
            with comm(args={"bytes": i}):
                pass

    def update(n: int) -> None:
        for i in range(n):
            ai.update(epoch=0, step=i)

    def iter_(n: int) -> None:
        for _ in fetch.iter(range(n)):
            pass

    def startstop(n: int) -> None:
        for _ in range(n):
            span = transfer.start()
            transfer.stop() if span is None else span.stop()

    def stop_args(n: int) -> None:
        for i in range(n):
            span = transfer.start()
            if span is None:  # DFTracer's start() returns nothing: args go on the node
                transfer.update(args={"bytes": i})
                transfer.stop()
            else:
                span.stop(args={"bytes": i})

    def realistic(n: int, varying: bool = False) -> None:
        # update + one fetch.iter item (2 spans) + 3 decorators + a with with args
        # + a start/stop pair: 8 spans per step; `varying`: the with's args change
        # every step, as a size read from the batch would
        for i, _batch in enumerate(fetch.iter(range(n))):
            ai.update(epoch=0, step=i)
            forward()
            backward()
            step()
            with comm(args={"bytes": 4096 + i if varying else 4096}):
                pass
            span = transfer.start()
            transfer.stop() if span is None else span.stop()

    def realistic_args(n: int) -> None:
        realistic(n, varying=True)

    return {"decorator": decorator, "with": with_, "with_args": with_args, "update": update,
            "iter": iter_, "startstop": startstop, "stop_args": stop_args, "step": realistic,
            "step_args": realistic_args}[pattern]


def measure(tracer: str, pattern: str, n: int, out: str, mode: str) -> dict[str, Any]:
    ai, finalize = _setup(tracer, out, hot=mode == "hot")
    run = _make(pattern, ai)
    result: dict[str, Any] = {"tracer": tracer, "pattern": pattern, "n": n,
                              "spans_per_op": SPANS[pattern]}
    if mode == "hot":
        run(min(n, 2000))  # warm up
        rounds = []
        for _ in range(5):
            t0 = perf_counter_ns()
            run(n)
            rounds.append((perf_counter_ns() - t0) / n)
        result["hot_ns"] = round(min(rounds), 1)
    elif mode == "alloc":
        from dftrace._core._speedups import allocations

        run(min(n, 2000))  # warm up: first uses fill what is kept for the next ones
        result["allocs_per_op"] = round(allocations(lambda: run(n))[1] / n, 3)
        finalize()
    else:
        run(min(n, 2000))  # warm up (first-use costs), as for the hot path
        t0 = perf_counter_ns()
        run(n)
        finalize()
        result["e2e_ns"] = round((perf_counter_ns() - t0) / n, 1)
    return result


if __name__ == "__main__":
    tracer, pattern, n, out, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
    os.makedirs(out, exist_ok=True)
    result = measure(tracer, pattern, n, out, mode)
    print(json.dumps(result), flush=True)
    time.sleep(0)
