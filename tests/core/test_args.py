"""Args keep their JSON types; anything else is summarised; nothing raises."""

from __future__ import annotations

from dftrace import ai, testing

from ._util import assert_valid


class Unprintable:
    def __repr__(self):
        raise RuntimeError("no repr")

    __str__ = __repr__


def test_json_types_are_kept(tmp_path):
    """Signed 64-bit ints, floats, bools, strings and None keep their types; ints
    beyond them (2**63 and up, up to hundreds of digits) are written as strings of
    their exact digits, which the validator and the analysis read (an int64 column
    would lose them), whichever path (plain args or not) encodes them."""
    big, huge = 2**100, 10**320 + 7
    with testing.trace_to(tmp_path) as t:
        with ai.compute.forward(args={"i": 2**40, "top": 2**63 - 1, "u": 2**64 - 1, "low": -(2**63),
                                      "big": big, "neg": -(2**70), "huge": huge,
                                      "f": 0.5, "b": True, "s": "x", "n": None}):
            pass
        with ai.compute.forward(args={"u": 2**63}):  # plain args: the fast path
            pass
    first, second = (s["args"] for s in t.spans("forward"))
    a = first
    assert (a["i"], a["top"], a["u"], a["low"], a["big"], a["neg"], a["huge"], a["f"], a["b"], a["s"],
            a["n"]) == (2**40, 2**63 - 1, str(2**64 - 1), -(2**63), str(big), str(-(2**70)), str(huge), 0.5,
                        True, "x", None)
    assert second["u"] == str(2**63)
    assert_valid(t.paths)


def test_awkward_values_still_give_valid_lines(tmp_path):
    """NaN/inf, surrogates, control characters, huge strings, bytes and failing reprs are written safely."""
    huge = "y" * 100_000
    with testing.trace_to(tmp_path, max_arg_length=64) as t:
        with ai.data.item(args={"nan": float("nan"), "inf": float("-inf"), "sur": "a\ud800b",
                                "ctl": "a\x00\x1fb", "huge": huge, "raw": b"\x00\xff",
                                "obj": Unprintable(), "nested": {"k": [1, {"x": 2}]},
                                "level": 99}):
            pass
    a = t.spans("item")[0]["args"]
    assert a["nan"] == "NaN" and a["inf"] == "-Infinity"
    assert a["sur"] == "a?b" and a["ctl"] == "a\x00\x1fb"
    assert a["huge"].startswith("y" * 64) and a["huge"].endswith("[+99936 chars]")
    assert a["raw"] == "<bytes len=2>"
    assert a["obj"] == "<Unprintable (repr failed)>"
    assert a["nested"] == {"k": [1, {"x": 2}]}
    assert a["level"] == 1 and a["arg_level"] == 99  # reserved keys are renamed
    assert_valid(t.paths)


def test_update_with_bad_values_never_raises(tmp_path):
    """``update`` with values that cannot be printed still records the event."""
    with testing.trace_to(tmp_path) as t:
        ai.compute.update(weird=Unprintable(), step=3)
        with ai.compute.forward:
            pass
    a = t.spans("forward")[0]["args"]
    assert a["step"] == 3 and a["weird"].startswith("<Unprintable")


def test_array_like_values_are_summarised_not_dumped(tmp_path):
    """Objects with shape and dtype are written as a short summary."""

    class Tensor:
        shape = (2, 3)
        dtype = "float32"

    with testing.trace_to(tmp_path) as t:
        with ai.device.transfer(args={"batch": Tensor()}):
            pass
    assert t.spans("transfer")[0]["args"]["batch"] == "<Tensor shape=(2, 3) dtype=float32>"


def test_keys_that_read_alike_are_both_kept(tmp_path):
    """Keys are written as strings: ``1`` and ``"1"`` read alike, and the later one
    overwrote the first. Both are kept, the later under its repr, at the top level
    and nested."""
    with testing.trace_to(tmp_path) as t:
        with ai.compute.forward(args={"m": {1: "int", "1": "str"}, 1: "a", "1": "b"}):
            pass
    (span,) = t.spans("forward")
    assert span["args"]["m"] == {"1": "int", "'1'": "str"}
    assert (span["args"]["1"], span["args"]["'1'"]) == ("a", "b")
    assert_valid(t.paths)
