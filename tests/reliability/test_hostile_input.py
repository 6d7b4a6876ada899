"""Hostile names, categories and args: every line stays valid UTF-8 JSON, nothing raises."""

from __future__ import annotations

import math
import tempfile

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dftrace
from dftrace import Node, ai, testing

from ._util import assert_valid

MAX_ARG = 64  # max_arg_length for these tests: long strings are cheap to make


class Unprintable:
    """An object whose __repr__ and __str__ both raise."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __hash__(self) -> int:
        return 7

    def _repr_pretty_(self, p, cycle) -> None:
        p.text("Unprintable()")  # so hypothesis can still report an example


class Shaped:
    """Looks like an array but its shape raises."""

    dtype = "float32"

    @property
    def shape(self):
        raise ValueError("no shape")

    def __repr__(self) -> str:
        return "Shaped()"


# Any text: lone surrogates, control characters, NUL, emoji, RTL marks...
texts = st.text(st.characters(codec=None), max_size=40) | st.sampled_from(
    ["\ud800", "a\udfffb", "\x00\x1b[31m\n\t", "\u202e\U0001f600", "%d%s%b", '"}]\\', "hhash"])
huge_ints = st.integers() | st.sampled_from([2**63, 2**64, -(2**63) - 1, 10**100, -(10**300)])
floats = st.floats(allow_nan=True, allow_infinity=True)
leaves = (st.none() | st.booleans() | huge_ints | floats | texts | st.binary(max_size=20)
          | st.builds(bytearray, st.binary(max_size=5)) | st.just(Unprintable())
          | st.just(Shaped()) | st.just("m" * 1_000_000) | st.just(object()))
values = st.recursive(
    leaves,
    lambda inner: (st.lists(inner, max_size=5) | st.tuples(inner, inner)
                   | st.dictionaries(texts | st.integers() | st.just(Unprintable()), inner,
                                     max_size=5)
                   | st.frozensets(st.integers(), max_size=3)),
    max_leaves=12,
)
arg_dicts = st.dictionaries(texts | huge_ints | st.just(Unprintable()), values, max_size=6)

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _trace(record) -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        with testing.trace_to(d, max_arg_length=MAX_ARG) as t:
            record()
        assert_valid(t.paths)
        for p in t.paths:  # every line is UTF-8 that orjson (strict JSON) accepts
            for raw in open(p, "rb").read().splitlines():
                raw.decode("utf-8")
                if raw not in (b"[", b"]"):
                    orjson.loads(raw)
        return t.events


def _check_value(original, written) -> None:
    """What an arg became: same JSON value when it has one, else a bounded string."""
    t = type(original)
    if original is None or t is bool:
        assert written is original
    elif t is int:
        if abs(original) < 2**63:
            assert written == original
        else:  # beyond 64 bits: written as a string of its digits, read back as such
            assert written == str(original)
    elif t is float:
        if math.isfinite(original):
            assert written == original
        else:
            assert written in ("NaN", "Infinity", "-Infinity")
    elif t is str:
        assert isinstance(written, str)
        if len(original) > MAX_ARG:
            assert written.endswith(f"…[+{len(original) - MAX_ARG} chars]")
        else:
            assert len(written) == len(original)
    elif t in (bytes, bytearray):
        assert written == f"<{t.__name__} len={len(original)}>"
    else:
        assert isinstance(written, (str, list, dict))
        if isinstance(written, str):
            assert len(written) < 2 * MAX_ARG + 200


@SETTINGS
@given(name=texts, cat=texts, args=arg_dicts)
def test_any_name_category_and_args_give_valid_lines(name, cat, args):
    """Whatever the name, category and args, every written line is valid UTF-8 JSON."""
    def record():
        node = Node(name, cat)
        with node(args=args):
            pass

        @node(args=args)
        def f():
            return 1

        assert f() == 1
        for _ in node.iter([1, 2]):
            pass
        node.update(args)
        with node:
            pass

    spans = testing.spans(_trace(record))
    assert len(spans) == 8  # with, decorator, 2 x (iter, block), the pass's end, with
    # What a name becomes: itself, with any lone surrogate written as "?".
    want_name = name.encode("utf-8", "replace").decode("utf-8")
    want_cat = cat.encode("utf-8", "replace").decode("utf-8")
    for e in spans:
        assert e["name"] in (want_name, want_name + ".iter", want_name + ".block", want_name + ".end")
        assert e["cat"] == want_cat


@SETTINGS
@given(value=values)
def test_any_arg_value_is_kept_or_summarised(value):
    """An arg keeps its JSON value, or becomes a bounded summary string; it never raises."""
    def record():
        with ai.compute.forward(args={"v": value}):
            pass

    (span,) = testing.spans(_trace(record))
    _check_value(value, span["args"]["v"])


def test_megabyte_string_is_cut_with_a_visible_marker(tmp_path):
    """A 1 MB string arg is written as its first max_arg_length characters and a marker."""
    with testing.trace_to(tmp_path, max_arg_length=100) as t:
        with ai.data.preprocess(args={"text": "é" * 1_000_000}):
            pass
    (span,) = t.spans()
    assert span["args"]["text"] == "é" * 100 + "…[+999900 chars]"
    assert_valid(t.paths)


def test_reserved_arg_names_do_not_replace_dftrace_fields(tmp_path):
    """User args named hhash/level/p_idx are renamed, never clobbering the span's own."""
    with testing.trace_to(tmp_path) as t:
        with ai.compute.step(args={"level": "x", "p_idx": -4, "hhash": None}):
            pass
    a = t.spans()[0]["args"]
    assert (a["level"], a["p_idx"]) == (1, 0)
    assert (a["arg_level"], a["arg_p_idx"], a["arg_hhash"]) == ("x", -4, None)


def test_unprintable_objects_everywhere_do_not_reach_user_code(tmp_path):
    """Objects whose repr and str raise, as keys and values, in updates and uses: no exception."""
    bad = Unprintable()
    with testing.trace_to(tmp_path) as t:
        ai.pipeline.update({bad: bad, "ok": [bad, {bad: bad}]})
        with ai.pipeline.epoch(args={"x": bad}):
            pass
        ai.pipeline.reset_args()
    (span,) = t.spans()
    assert span["args"]["x"] == "<Unprintable (repr failed)>"
    assert span["args"]["ok"][0] == "<Unprintable (repr failed)>"
    assert_valid(t.paths)


def test_session_keeps_working_after_hostile_input(tmp_path):
    """Events recorded after bad input are written as usual."""
    with testing.trace_to(tmp_path) as t:
        with Node("\ud800", "\udfff")(args={"\ud83d": float("nan")}):
            pass
        with ai.compute.forward:
            pass
    assert [e["name"] for e in t.spans()] == ["?", "forward"]
    dftrace.finalize()
