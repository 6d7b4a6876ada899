"""The contract between the C engine and the Python classes it reads, and between the
two engines: the C engine reads attributes of Python objects by name (published as
``_speedups.ENGINE_READS``), and both engines must write the same trace for the same
program, timestamps, pids and tids aside."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from _requirements import needs

import dftrace
from dftrace import ai
from dftrace._core import engine, kept_styles, tree

try:
    from dftrace._core import _speedups
    _C_MISSING = None
except ImportError as exc:  # the true cause, quoted by the skip
    _speedups = None
    _C_MISSING = f"the C engine was not built or does not load ({exc})"

REPO = os.path.dirname(os.path.dirname(os.path.abspath(dftrace.__file__)))


def _resolve(owner: str) -> Any:
    """The object named "module:qualname" (or a module)."""
    module, _, qualname = owner.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split(".") if qualname else ():
        obj = getattr(obj, part)
    return obj


def _instance_of(owner: str, obj: Any) -> Any:
    """A real object of the kind the engine reads: an instance for a class."""
    if not isinstance(obj, type):
        return obj
    made = {
        engine.Stack: lambda: engine.Stack(1, None),
        engine.Extra: lambda: engine.to_extra({"a": 1}),
        tree.Span: lambda: kept_styles.NO_SPAN,
        tree.Node: lambda: ai.compute.forward,
        tree.Use: lambda: ai.compute.forward(args={"a": 1}),
    }
    assert obj in made, f"ENGINE_READS names {owner}: the test has no instance of it"
    instance = made[obj]()
    assert isinstance(instance, obj)
    return instance


@needs("native", _C_MISSING)
def test_every_name_the_c_engine_reads_exists_on_what_it_reads_it_from():
    """Each attribute (or keyword) in ENGINE_READS exists on the real Python object it
    is read from, under whichever engine this process runs."""
    import asyncio  # noqa: F401 - the engine finds it in sys.modules once imported

    missing = []
    for owner, names in _speedups.ENGINE_READS.items():
        obj = _instance_of(owner, _resolve(owner))
        for name in names:
            if isinstance(obj, dict):
                found = name in obj
            elif callable(obj) and not isinstance(obj, type) and inspect.isroutine(obj):
                params = inspect.signature(obj).parameters.values()
                found = any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)
            else:
                found = hasattr(obj, name)
            if not found:
                missing.append(f"{owner}.{name}")
    assert missing == []


@needs("native", _C_MISSING)
def test_the_keywords_the_c_engine_parses_are_the_python_twins():
    """``span.stop(args=...)`` and ``node(args=...)`` are parsed in C by name; the Python
    methods they fall back to take the same keyword."""
    assert "args" in inspect.signature(tree.Span._stop_py).parameters
    assert _speedups.ENGINE_READS["dftrace._core.tree:Span._stop_py"] == ("args",)


@needs("native", _C_MISSING)
def test_register_documents_every_name_and_the_engine_got_them_all():
    """register()'s docstring lists every name it takes; with the C engine in use, each
    one was given an object at import."""
    names = _speedups.registered()
    assert len(names) == 25
    doc = _speedups.register.__doc__
    assert [n for n in names if f"  {n} " not in doc] == []
    if engine.speedups is not None:
        assert [n for n, v in names.items() if v is None] == []
    with pytest.raises(TypeError, match="unknown name"):
        _speedups.register(no_such_name=1)
    with pytest.raises(TypeError, match="callable"):
        _speedups.register(resolve=1)


# -- both engines, one program ----------------------------------------------------------
_PROGRAM = textwrap.dedent('''
    import asyncio, json, sys, threading
    import dftrace
    from dftrace import ai, testing
    from dftrace._core import engine

    @ai.compute.forward
    def forward(x):
        return x * 2

    @ai.compute.forward(args={"model": "m", "layers": [1, 2]})
    def forward_args(x):
        return x

    @ai.data.preprocess
    async def prepare(x):
        await asyncio.sleep(0)
        with ai.data.item(args={"x": x}):
            return x

    @ai.dataloader.fetch
    def batches(n):
        for i in range(n):
            yield i

    @ai.compute.backward
    def fails():
        raise ValueError("in a decorated call")

    @ai.dataloader.fetch
    def batches_fail():
        yield 1
        raise OSError("in a decorated generator")

    @ai.data.init
    async def stream(n):
        for i in range(n):
            await asyncio.sleep(0)
            yield i

    @ai.data.preprocess
    async def prepare_fails():
        raise RuntimeError("in a decorated coroutine")

    def source_fails():
        yield 1
        raise LookupError("in the iterable of an .iter()")

    async def in_a_loop():
        async for i in stream(2):
            forward(i)
        try:
            await prepare_fails()
        except RuntimeError:
            pass
        async for i in ai.data.item.aiter(stream(2)):
            forward(i)

    def step(tag):
        with ai.pipeline.epoch(args={"thread": tag}):
            forward(1)
            forward_args(2)
            for b in batches(2):
                forward(b)
            for x in ai.dataloader.fetch.iter(range(3)):
                with ai.compute.step:
                    forward(x)
            ai.comm.all_reduce.start()
            forward(3)
            ai.comm.all_reduce.stop()
            s = ai.checkpoint.capture.start()
            forward(4)
            s.stop(args={"bytes": 4096})
            ai.compute.update(phase=tag)
            with ai.compute.step(args={"own": 1}):
                forward(5)
            try:
                with ai.compute.step:
                    raise KeyError("in a with block")
            except KeyError:
                pass
            try:
                fails()
            except ValueError:
                pass
            asyncio.run(prepare(7))
            # a start() left open inside another: the outer stop() ends it, incomplete
            outer = ai.pipeline.train.start()
            ai.comm.bcast.start()
            forward(6)
            outer.stop()
            ai.pipeline.evaluate.start()
            ai.comm.bcast.start()
            ai.pipeline.evaluate.stop()
            # two .iter()s zipped: their loop-body spans nest
            for a, b in zip(ai.dataloader.fetch.iter(range(2)), ai.compute.forward.iter(range(3))):
                forward(a + b)
            try:
                for x in ai.dataloader.fetch.iter(source_fails()):
                    forward(x)
            except LookupError:
                pass
            try:
                for b in batches_fail():
                    forward(b)
            except OSError:
                pass
            try:
                s = ai.checkpoint.capture(args={"k": 1}).start()
                with ai.compute.step(args={"own": 2}):
                    raise IndexError("in a with block of a use")
            except IndexError:
                s.stop(args={"bytes": 1})
            asyncio.run(in_a_loop())

    with testing.trace_to(sys.argv[1]) as t:
        ai.update(epoch=1)
        step("main")
        threads = [threading.Thread(target=step, args=(f"t{i}",)) for i in range(2)]
        for th in threads:
            th.start()
            th.join()
    print(json.dumps({"c": engine.speedups is not None, "events": testing.read_events(sys.argv[1])}))
''')


def _normalized(events: list[dict[str, Any]]) -> list[list[tuple]]:
    """Per thread (in any order), its spans in the order they opened: name, cat,
    level, the parent's name, args (without the ids) and the rest of the fields but
    times, pids, tids and ids."""
    spans = {e["id"]: e for e in events if e.get("ph") == "X"}
    threads: dict[Any, list[tuple]] = {}
    for i in sorted(spans):
        e = spans[i]
        args = dict(e.get("args", {}))
        parent = args.pop("p_idx")
        args.pop("hhash", None)
        rest = {k: v for k, v in e.items() if k not in ("id", "pid", "tid", "ts", "dur", "args")}
        threads.setdefault(e["tid"], []).append((
            e["name"], e["cat"], args.pop("level"), spans[parent]["name"] if parent else None,
            json.dumps(args, sort_keys=True), json.dumps(rest, sort_keys=True)))
    return sorted(threads.values())


def _trace_of(tmp_path, pure: bool) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    if pure:
        env["DFTRACE_NO_SPEEDUPS"] = "1"
    out = tmp_path / ("python" if pure else "c")
    proc = subprocess.run([sys.executable, "-c", _PROGRAM, str(out)], env=env, cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs("native", _C_MISSING)
def test_both_engines_write_the_same_trace_for_every_span_style(tmp_path):
    """Decorators (sync, async, generator), ``with``, node-level and Span start/stop with
    args, ``.iter``, sticky args from update(), nesting, threads and exceptions inside
    spans: the C engine and the pure-Python one write the same spans."""
    c, py = _trace_of(tmp_path, pure=False), _trace_of(tmp_path, pure=True)
    assert c["c"] and not py["c"], "each run must use the engine it was started for"
    c_spans, py_spans = _normalized(c["events"]), _normalized(py["events"])
    assert len(c_spans) >= 3 and sum(map(len, c_spans)) > 60  # threads, and asyncio tasks
    assert c_spans == py_spans
    names = {s[0] for thread in c_spans for s in thread}
    assert {"forward", "fetch", "epoch", "fetch.iter", "fetch.block", "all_reduce", "capture",
            "step", "backward", "preprocess", "item", "data.init", "item.iter", "item.block",
            "forward.iter", "forward.block", "train", "evaluate", "bcast"} <= names, names
    # an exception inside each style is the span's args.error, under both engines
    errors = {(s[0], json.loads(s[4])["error"]) for thread in c_spans for s in thread
              if "error" in json.loads(s[4])}
    assert {("backward", "ValueError"), ("step", "KeyError"), ("step", "IndexError"),
            ("fetch.iter", "LookupError"), ("fetch", "OSError"),
            ("preprocess", "RuntimeError")} <= errors, errors
    # the start()s left open were ended by the outer stop(), flagged incomplete
    incomplete = [s for thread in c_spans for s in thread if "incomplete" in s[4] + s[5]]
    assert {s[0] for s in incomplete} == {"bcast"} and len(incomplete) == 6, incomplete
