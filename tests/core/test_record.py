"""``Node.record(t0, t1, args)``: spans whose times are known after the fact, checked
on the written trace, under both engines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

import dftrace
from dftrace import ai, testing

from ._util import assert_valid, check_nesting

REPO = os.path.dirname(os.path.dirname(os.path.abspath(dftrace.__file__)))


def _times(dur_ns: int = 2_000_000) -> tuple[int, int]:
    """Times of a span that began now and has ended when this returns."""
    t0 = time.perf_counter_ns()
    while time.perf_counter_ns() < t0 + dur_ns:
        time.sleep(dur_ns / 1e9)
    return t0, t0 + dur_ns


def test_a_recorded_span_has_the_given_times_and_nests_in_the_open_with_span(tmp_path):
    with testing.trace_to(tmp_path) as t:
        with ai.pipeline.epoch:
            t0, t1 = _times()
            ai.data.item.record(t0, t1)
        ai.compute.step.record(*_times(3_000_000))
    epoch, item, step = (t.spans(name)[0] for name in ("epoch", "item", "step"))
    assert (item["cat"], step["cat"]) == ("data", "compute")
    assert item["args"]["p_idx"] == epoch["id"] and item["args"]["level"] == 2
    assert step["args"]["p_idx"] == 0 and step["args"]["level"] == 1
    assert item["dur"] == 2000 and step["dur"] == 3000  # µs, as given
    check_nesting(t.events)
    assert_valid(t.paths)


def test_args_are_encoded_at_the_call_and_join_sticky_and_use_args(tmp_path):
    with testing.trace_to(tmp_path) as t:
        ai.compute.update(step=4)
        args = {"bytes": 10}
        ai.compute.forward.record(*_times(), args)
        args["bytes"] = 99  # after the call: not written
        ai.compute.forward(args={"model": "m"}).record(*_times(), {"bytes": 11})
        ai.compute.update(step=5)  # after the spans: not theirs
    first, second = t.spans("forward")
    assert {k: first["args"][k] for k in ("step", "bytes")} == {"step": 4, "bytes": 10}
    assert {k: second["args"][k] for k in ("step", "model", "bytes")} == {
        "step": 4, "model": "m", "bytes": 11}


def test_nothing_is_recorded_while_tracing_or_the_node_is_off(tmp_path):
    ai.compute.forward.record(*_times())  # no session: returns
    with testing.trace_to(tmp_path) as t:
        ai.compute.disable()
        ai.compute.forward.record(*_times())
        ai.compute.forward(args={"a": 1}).record(*_times())
        ai.compute.enable()
        ai.compute.forward(enable=False).record(*_times())
        ai.data.item.record(*_times())
    assert t.names() == ["item"]


def test_times_that_are_not_ints_or_end_before_they_start_record_nothing_and_warn_once(tmp_path):
    t0, t1 = _times()
    with testing.trace_to(tmp_path) as t:
        with pytest.warns(RuntimeWarning, match=r"ai\.compute\.forward\.record.*t0 <= t1"):
            ai.compute.forward.record(t1, t0)
        with pytest.warns(RuntimeWarning, match=r"times must be ints"):
            ai.compute.forward.record(t0 / 1e9, t1 / 1e9)
        with warnings.catch_warnings(record=True) as again:
            warnings.simplefilter("always")
            ai.compute.forward.record(t1, t0)
            ai.compute.forward.record(True, t1)
            ai.compute.forward.record(t0, 1 << 64)
        assert [str(w.message) for w in again if "dftrace" in str(w.message)] == []
        ai.compute.forward.record(t0, t1)  # a good one still records
    assert len(t.spans("forward")) == 1


_PROGRAM = textwrap.dedent('''
    import json, sys, time
    from dftrace import ai, testing
    from dftrace._core import engine

    with testing.trace_to(sys.argv[1]) as t:
        ai.update(run="r")
        with ai.pipeline.epoch(args={"e": 1}):
            with ai.compute.step:
                t0 = time.perf_counter_ns()
                time.sleep(0.001)
                ai.data.item.record(t0, t0 + 5000, {"count": 1})
            ai.data.item(args={"src": "w"}).record(t0, t0 + 7000)
            ai.data.disable()
            ai.data.item.record(t0, t0 + 9000)
    print(json.dumps({"c": engine.speedups is not None, "events": t.events}))
''')


@pytest.mark.parametrize("pure", [False, True], ids=["c-engine", "python-engine"])
def test_both_engines_write_the_same_recorded_spans(tmp_path, pure):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    if pure:
        env["DFTRACE_NO_SPEEDUPS"] = "1"
    proc = subprocess.run([sys.executable, "-c", _PROGRAM, str(tmp_path / "t")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    if not pure and not out["c"]:
        pytest.skip("the C engine was not built")
    assert out["c"] is not pure
    spans = {e["id"]: e for e in out["events"] if e.get("ph") == "X"}
    got = sorted((e["name"], spans[e["args"]["p_idx"]]["name"] if e["args"]["p_idx"] else None,
                  e["dur"] if e["name"] == "item" else None,
                  json.dumps({k: v for k, v in e["args"].items()
                              if k not in ("hhash", "p_idx", "level")}))
                 for e in spans.values())
    assert got == sorted([
        ("epoch", None, None, json.dumps({"run": "r", "e": 1})),
        ("step", "epoch", None, json.dumps({"run": "r"})),
        ("item", "step", 5, json.dumps({"run": "r", "count": 1})),
        ("item", "epoch", 7, json.dumps({"run": "r", "src": "w"})),
    ])


def test_off_by_configuration_records_nothing_and_checks_nothing(tmp_path):
    """DFTRACE_ENABLE=0: record() returns at its first check, bad times included."""
    program = textwrap.dedent('''
        import sys, time, warnings
        warnings.simplefilter("error")
        import dftrace
        from dftrace import ai
        dftrace.initialize(log_file=sys.argv[1])
        t0 = time.perf_counter_ns()
        ai.compute.forward.record(t0, t0 + 1000, {"a": 1})
        ai.compute.forward(args={"b": 2}).record(t0, t0 + 1000)
        ai.compute.forward.record(t0 + 1000, t0)
        ai.compute.forward.record("t0", None)
        dftrace.finalize()
    ''')
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    env["DFTRACE_ENABLE"] = "0"
    proc = subprocess.run([sys.executable, "-c", program, str(tmp_path / "t")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert list(tmp_path.iterdir()) == []
