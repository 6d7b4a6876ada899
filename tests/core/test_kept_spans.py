"""The spans ``with`` and ``start()`` keep open on their stack (its ``open`` map): with
the C engine a ``KeptSpans`` holding the spans themselves, read by Python's paths as a
mapping; either engine ends what the other opened, and a span whose end comes while
others are still open above it ends them first, flagged incomplete."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from _requirements import needs

import dftrace
from dftrace import ai, testing
from dftrace._core import engine, kept_styles

from ._util import check_nesting

try:
    from dftrace._core import _speedups
    _C_MISSING = None
except ImportError as exc:
    _speedups = None
    _C_MISSING = f"the C engine was not built or does not load ({exc})"

REPO = os.path.dirname(os.path.dirname(os.path.abspath(dftrace.__file__)))


def _kept(i: int, opener: object = None) -> object:
    return _speedups.OpenSpan((i, 3, 0, 1, None, opener, None, 100 + i))


@needs("native", _C_MISSING)
def test_kept_spans_is_the_mapping_pythons_paths_read():
    """get / pop / in / len / items / [i] = / del, keyed by id, oldest first; an entry
    given for an id already kept replaces it (restick_open)."""
    m = _speedups.KeptSpans()
    assert len(m) == 0 and not m and m.get(1) is None and m.pop(1, "none") == "none"
    for i in (5, 2, 9, 7):  # any order in: kept in the order of their ids
        m[i] = _kept(i)
    assert [i for i, _ in m.items()] == m.keys() == list(m) == [2, 5, 7, 9]
    assert 7 in m and 8 not in m and "7" not in m and len(m) == 4
    s = m.get(7)
    assert (s.id, s.kid, s.parent, s.level, s.t0) == (7, 3, 0, 1, 107)
    m[7] = _kept(7, opener="again")
    assert m[7].opener == "again" and len(m) == 4
    assert m.pop(5).id == 5 and 5 not in m
    del m[2]
    assert m.keys() == [7, 9]
    with pytest.raises(KeyError):
        m[5]
    with pytest.raises(KeyError):
        m.pop(5)
    with pytest.raises(KeyError):
        m[8] = _kept(9)  # kept under its own id only
    with pytest.raises(TypeError):
        m[8] = (8, 3, 0, 1, None, None, None, 0)
    assert m.keys() == [7, 9]


@needs("native", _C_MISSING)
def test_started_spans_is_the_mapping_pythons_paths_read():
    """STATE.open_spans with the C engine: id -> stack, len / in / get / pop / [i] = /
    del, iterated in id order whatever the order they came in."""
    m = _speedups.StartedSpans()
    a, b = engine.Stack(1, None), engine.Stack(2, None)
    assert len(m) == 0 and not m and m.get(1) is None and m.pop(1, None) is None
    for i, stk in ((4, a), (2, b), (8, a), (6, b)):
        m[i] = stk
    assert list(m) == sorted(m) == [2, 4, 6, 8] and len(m) == 4
    assert m[4] is a and m.get(6) is b and 8 in m and 3 not in m and "8" not in m
    assert m.pop(8) is a and m.pop(2) is b and list(m) == [4, 6]
    m[4] = b
    assert m[4] is b and len(m) == 2
    del m[6]
    assert list(m) == [4]
    with pytest.raises(KeyError):
        m.pop(6)
    with pytest.raises(KeyError):
        del m[6]
    with pytest.raises(TypeError):
        m["4"] = a


def test_the_engine_in_use_keeps_open_spans_in_its_own_maps():
    stk = engine.Stack(1, None)
    native = engine.speedups is not None
    assert type(stk.open) is (_speedups.KeptSpans if native else dict)
    assert type(engine.STATE.open_spans) is (_speedups.StartedSpans if native else dict)


def test_start_past_max_open_spans_records_nothing_and_is_counted(tmp_path):
    """At max_open_spans start() spans still open, start() records nothing (counted in
    a dropped line); the ones open end at finalize, incomplete; a stop frees a place."""
    with testing.trace_to(tmp_path, max_open_spans=16) as t:
        ai.pipeline.epoch.start()
        ai.pipeline.epoch.stop()
        with pytest.warns(RuntimeWarning, match="still open"):
            for _ in range(20):
                ai.compute.forward.start()
    forward = t.spans("forward")
    assert len(forward) == 16 and all(e["args"]["incomplete"] is True for e in forward)
    assert len(t.spans("epoch")) == 1
    dropped = [e for e in t.events if e.get("name") == "dropped"]
    assert [(e["args"]["count"], e["args"]["reason"]) for e in dropped] == [(4, "open spans")]
    check_nesting(t.events)


def test_a_with_span_opened_by_one_engine_ends_in_the_other(tmp_path):
    """``__enter__`` (C with the C engine) then Python's ``cm_exit``; Python's
    ``cm_enter`` then ``__exit__``: one span each, nested as opened."""
    outer, inner = ai.pipeline.epoch, ai.compute.forward
    with testing.trace_to(tmp_path) as t:
        outer.__enter__()
        kept_styles.cm_enter(inner)
        inner.__exit__(None, None, None)
        kept_styles.cm_exit(outer, None, None, None)
        with ai.comm.barrier:  # nothing left open: a root span again
            pass
    epoch, = t.spans("epoch")
    forward, = t.spans("forward")
    assert forward["args"]["p_idx"] == epoch["id"] and forward["args"]["level"] == 2
    assert "incomplete" not in epoch["args"] and "incomplete" not in forward["args"]
    assert t.spans("barrier")[0]["args"]["level"] == 1
    check_nesting(t.events)


def test_a_with_span_ending_above_open_with_spans_ends_them_incomplete(tmp_path):
    """A ``with`` span whose exit comes while ``with`` spans entered inside it never
    exited ends them first (incomplete); their own late exits do nothing."""
    a, b, c = ai.pipeline.epoch, ai.compute.forward, ai.compute.backward
    with testing.trace_to(tmp_path) as t:
        a.__enter__()
        b.__enter__()
        c.__enter__()
        a.__exit__(None, None, None)
        c.__exit__(None, None, None)
        b.__exit__(None, None, None)
        with ai.comm.barrier:
            pass
    epoch, = t.spans("epoch")
    forward, = t.spans("forward")
    backward, = t.spans("backward")
    assert forward["args"]["incomplete"] is True and backward["args"]["incomplete"] is True
    assert "incomplete" not in epoch["args"]
    assert backward["args"]["p_idx"] == forward["id"] and forward["args"]["p_idx"] == epoch["id"]
    assert t.spans("barrier")[0]["args"]["level"] == 1
    check_nesting(t.events)


def test_with_and_start_spans_left_open_end_at_finalize_and_stop(tmp_path):
    """A ``start()`` span stopped by the Python path (``stop(span)`` from another frame)
    after a ``with`` left open inside it ends both; one never stopped ends at
    finalize, incomplete."""
    with testing.trace_to(tmp_path) as t:
        tok = ai.pipeline.train.start()
        ai.compute.forward.__enter__()  # never exited
        ai.pipeline.train.stop(tok)
        ai.pipeline.epoch.start()
    train, = t.spans("train")
    forward, = t.spans("forward")
    epoch, = t.spans("epoch")
    assert forward["args"]["incomplete"] is True and forward["args"]["p_idx"] == train["id"]
    assert "incomplete" not in train["args"] and epoch["args"]["incomplete"] is True
    check_nesting(t.events)


_ASYNCIO_LATE = textwrap.dedent('''
    import sys
    import dftrace
    from dftrace import ai, testing

    with testing.trace_to(sys.argv[1]) as t:
        with ai.compute.forward:  # the thread records before asyncio is imported
            pass
        assert "asyncio" not in sys.modules
        import asyncio

        async def task():
            with ai.comm.all_reduce:
                pass

        asyncio.run(task())
    fwd, = t.spans("forward")
    red, = t.spans("all_reduce")
    print(fwd["tid"] != red["tid"], red["args"]["level"])
''')


def test_a_with_span_in_a_task_finds_the_task_after_asyncio_is_imported_late(tmp_path):
    """A thread that recorded before asyncio was imported: a ``with`` span inside a
    task started afterwards goes on the task's track, not the thread's."""
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", _ASYNCIO_LATE, str(tmp_path)], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "1"]


def test_a_start_token_names_its_span_until_it_is_stopped(tmp_path):
    """``Span.id`` is the span's id in the trace while it is open, None once stopped;
    a token stopped through its node (``node.stop(span)``) or twice ends it once."""
    node = ai.device.transfer
    with testing.trace_to(tmp_path) as t:
        first, second = node.start(), node.start()
        ids = (first.id, second.id)
        node.stop(second)
        first.stop(args={"bytes": 1})
        first.stop()
        node.stop(second)
        assert (first.id, second.id) == (None, None)
    spans = sorted(t.spans("transfer"), key=lambda e: e["id"])
    assert [e["id"] for e in spans] == list(ids) and ids[0] < ids[1]
    assert spans[0]["args"]["bytes"] == 1 and spans[1]["args"]["p_idx"] == ids[0]
    check_nesting(t.events)
