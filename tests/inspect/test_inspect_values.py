"""Value summaries: what a capture records instead of the value itself."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

np = pytest.importorskip("numpy", reason="array summaries are tested on numpy arrays")
torch = pytest.importorskip("torch", reason="tensor summaries are tested on torch tensors: pip install 'dftrace[torch]'")

from dftrace._inspect.binding import make_extra  # noqa: E402
from dftrace._inspect.values import content_hash, describe_value, render  # noqa: E402


def test_numbers_none_and_bools_are_kept_as_they_are():
    """Ints (any size), floats, bools and None are recorded unchanged."""
    assert describe_value(3) == 3
    assert describe_value(2**80) == 2**80
    assert describe_value(1.5) == 1.5
    assert describe_value(True) is True
    assert describe_value(None) is None


def test_non_finite_floats_become_names():
    """NaN and infinities are written as strings (JSON has no such numbers)."""
    assert [describe_value(float("nan")), describe_value(float("inf")), describe_value(-float("inf"))] == [
        "NaN", "Infinity", "-Infinity"]


def test_long_strings_are_cut_with_a_count_of_what_was_dropped():
    """A string longer than max_len keeps its head and says how much was cut."""
    s = describe_value("x" * 5000, max_len=100)
    assert s.startswith("x" * 100)
    assert s.endswith("[+4900 chars]")
    assert describe_value("short") == "short"


def test_small_containers_keep_their_items_summarised():
    """Short lists and small dicts keep every item, each summarised."""
    assert describe_value([1, "a", (2, 3)]) == [1, "a", [2, 3]]
    assert describe_value({"lr": 0.1, 3: "x"}) == {"lr": 0.1, "3": "x"}


def test_long_containers_keep_type_length_and_head():
    """A long list is described by type, length and its first items."""
    s = describe_value(list(range(1000)))
    assert s == {"type": "list", "len": 1000, "head": [0, 1, 2, 3, 4, 5, 6, 7]}
    d = describe_value({f"k{i}": i for i in range(100)})
    assert d["len"] == 100 and len(d["head"]) == 16


def test_deep_nesting_is_cut_off():
    """Containers below the depth limit become a short type description."""
    assert describe_value([[[[1, 2]]]]) == [[["<list len=2>"]]]


def test_namedtuples_keep_field_names():
    """A namedtuple is recorded by field name."""
    from collections import namedtuple

    Batch = namedtuple("Batch", "x y")
    assert describe_value(Batch(1, "a")) == {"x": 1, "y": "a"}


def test_numpy_array_is_type_shape_dtype_device():
    """A numpy array becomes its type, shape, dtype and device, not its data."""
    a = np.zeros((3, 4), dtype=np.float32)
    assert describe_value(a) == {"type": "numpy.ndarray", "shape": [3, 4], "dtype": "float32",
                            "device": "cpu"}


def test_torch_tensor_is_type_shape_dtype_device():
    """A torch tensor becomes its type, shape, dtype and device."""
    t = torch.ones(2, 5, dtype=torch.int64)
    assert describe_value(t) == {"type": "torch.Tensor", "shape": [2, 5], "dtype": "int64",
                            "device": "cpu"}


def test_scalar_tensor_records_its_value():
    """A 0-d tensor (a loss) records its number too."""
    s = describe_value(torch.tensor(2.5))
    assert s["shape"] == [] and s["value"] == 2.5


def test_numpy_scalars_become_numbers():
    """numpy scalar types are recorded as plain numbers."""
    assert describe_value(np.float32(1.5)) == 1.5
    assert describe_value(np.int64(7)) == 7


def test_hash_is_only_added_when_asked_for():
    """Content hashes are opt-in."""
    t = torch.arange(6)
    assert "hash" not in describe_value(t)
    assert describe_value(t, hash_values=True)["hash"] == content_hash(t)


def test_hash_depends_on_content_not_layout():
    """Equal data hashes equal whatever the memory layout; different data differs."""
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    transposed_copy = a.t().contiguous().t()  # same values, different strides
    assert not transposed_copy.is_contiguous()
    assert content_hash(a) == content_hash(transposed_copy)
    b = a.clone()
    b[0, 0] = 99
    assert content_hash(a) != content_hash(b)


def test_hash_covers_dtype_and_shape():
    """The same bytes under another dtype or shape hash differently."""
    a = np.arange(4, dtype=np.int32)
    assert content_hash(a) != content_hash(a.reshape(2, 2))
    assert content_hash(a) != content_hash(a.view(np.float32))


def test_torch_and_numpy_with_the_same_data_hash_alike():
    """A tensor and the array it converts to share a hash."""
    t = torch.arange(10, dtype=torch.float64)
    assert content_hash(t) == content_hash(t.numpy())


def test_hash_is_the_same_in_another_process():
    """The hash is deterministic: a fresh interpreter computes the same digest."""
    code = ("import numpy as np; from dftrace._inspect.values import content_hash; "
            "print(content_hash(np.arange(100, dtype=np.float64).reshape(10, 10)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == content_hash(np.arange(100, dtype=np.float64).reshape(10, 10))


def test_bfloat16_tensors_can_be_hashed():
    """Dtypes numpy lacks still hash (through their raw bytes)."""
    t = torch.ones(4, dtype=torch.bfloat16)
    h = content_hash(t)
    assert h is not None and h != content_hash(torch.ones(4, dtype=torch.float16))


def test_object_whose_repr_raises_is_described_by_type():
    """A value whose repr raises is summarised without raising."""
    class Bad:
        def __repr__(self):
            raise RuntimeError("no")

    s = describe_value(Bad())
    assert s.startswith("<") and s.endswith("Bad (repr failed)>")


def test_other_objects_use_their_short_repr():
    """Objects without a better summary are recorded by their (cut) repr."""
    class Point:
        def __repr__(self):
            return "Point(1, 2)" + "!" * 1000

    s = describe_value(Point())
    assert s.startswith("Point(1, 2)") and len(s) < 260


def test_render_describes_a_tensor_summary_on_one_line():
    """Tables show a tensor summary as Type[shape] dtype device."""
    assert render(describe_value(torch.zeros(4, 3))) == "Tensor[4, 3] float32 cpu"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=50)
    | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=12)
    | st.dictionaries(st.text(max_size=5) | st.integers(), children, max_size=20)
    | st.tuples(children, children),
    max_leaves=60,
)


def _as_written(v):
    """What an arg reads back as: integers beyond 64 bits are written as their digits."""
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return v if -(1 << 63) <= v < (1 << 64) else str(v)
    if isinstance(v, dict):
        return {k: _as_written(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_as_written(x) for x in v]
    return v


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_every_summary_encodes_as_strict_json(value):
    """Whatever goes in, the summary encodes as event args that strict JSON reads back
    (integers beyond 64 bits as their digits)."""
    s = describe_value(value)
    frag = make_extra({"v": s}).frag
    assert json.loads(b"{" + frag[1:] + b"}")["v"] == _as_written(s)


def test_summaries_do_not_import_numpy_or_torch():
    """Summarising plain values leaves numpy and torch unimported."""
    code = ("import sys, dftrace; from dftrace._inspect.values import describe_value; "
            "describe_value({'a': [1, 2.0, 'x', b'y']}); "
            "print('numpy' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("value", [b"abc", bytearray(b"abc"), memoryview(b"abc")])
def test_bytes_are_described_by_length(value):
    """Bytes-like values record their length, not their content."""
    assert describe_value(value)["len"] == 3


def test_captured_keys_that_read_alike_are_both_kept():
    """``{1: ..., "1": ...}`` keeps both entries, the later under its repr."""
    assert describe_value({1: "int", "1": "str"}) == {"1": "int", "'1'": "str"}
