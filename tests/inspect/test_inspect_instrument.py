"""dftrace.instrument: shim existing methods with nodes, always restore them."""

from __future__ import annotations

import pytest

import dftrace
from dftrace import ai, testing


class Base:
    def inherited(self, x):
        return x + 100


class Pipeline(Base):
    def __init__(self):
        self.calls = 0

    def load(self, index):
        self.calls += 1
        return index * 2

    @staticmethod
    def normalize(value):
        return value / 10

    @classmethod
    def create(cls, size):
        return size

    def __getitem__(self, i):
        return i


ORIGINALS = {name: Pipeline.__dict__[name]
             for name in ("load", "normalize", "create", "__getitem__")}


def _assert_pristine():
    for name, original in ORIGINALS.items():
        assert Pipeline.__dict__[name] is original
    assert "inherited" not in Pipeline.__dict__


def test_class_methods_of_every_kind_are_traced_then_restored():
    """Instance, static and class methods shimmed on a class record spans while the
    block runs and are the original objects afterwards."""
    with testing.trace_to_memory() as result:
        with dftrace.instrument(Pipeline, {
            "load": ai.data.item(capture=True, capture_result=True),
            "normalize": ai.data.preprocess(capture=True),
            "create": ai.data.item.init(capture=True),
        }):
            p = Pipeline.create(3)
            assert Pipeline().load(4) == 8
            assert Pipeline.normalize(5) == 0.5
            assert Pipeline().normalize(5) == 0.5
    testing.assert_span(result, "item", count=1, args={"params": {"index": 4}, "result": 8})
    testing.assert_span(result, "preprocess", count=2, args={"params.value": 5})
    testing.assert_span(result, "item.init", count=1, args={"params": {"size": 3}})
    assert p == 3
    _assert_pristine()


def test_special_methods_are_shimmed_on_the_class():
    """__getitem__ on the class is traced when objects are indexed."""
    with testing.trace_to_memory() as result:
        with dftrace.instrument(Pipeline, {"__getitem__": ai.data.item(capture=True)}):
            assert Pipeline()[7] == 7
    testing.assert_span(result, "item", args={"params": {"i": 7}})
    _assert_pristine()


def test_inherited_method_is_shadowed_then_removed():
    """A method inherited from a base is shimmed on the class and the shadow removed after."""
    with testing.trace_to_memory() as result:
        with dftrace.instrument(Pipeline, {"inherited": ai.compute.forward(capture=True)}):
            assert Pipeline().inherited(1) == 101
    testing.assert_span(result, "forward", args={"params": {"x": 1}})
    assert Base().inherited(1) == 101 and "inherited" not in Pipeline.__dict__


def test_instance_shim_touches_only_that_instance():
    """Instrumenting an instance traces its method, not other instances', and removes the shim."""
    target, other = Pipeline(), Pipeline()
    with testing.trace_to_memory() as result:
        with dftrace.instrument(target, {"load": ai.data.item(capture=True)}):
            target.load(1)
            other.load(2)
    testing.assert_span(result, "item", count=1, args={"params": {"index": 1}})
    assert "load" not in vars(target) and target.calls == 1 and other.calls == 1


def test_instance_attribute_that_existed_is_put_back():
    """A callable already stored on the instance is restored, not deleted."""
    p = Pipeline()
    own = lambda index: "own"  # noqa: E731
    p.load = own
    with dftrace.instrument(p, {"load": ai.data.item}):
        assert p.load(1) == "own"
        assert p.load is not own
    assert p.load is own


def test_methods_are_restored_when_the_block_raises():
    """An exception inside the block still restores every shimmed method."""
    with pytest.raises(RuntimeError):
        with dftrace.instrument(Pipeline, {"load": ai.data.item, "normalize": ai.data.preprocess}):
            assert Pipeline.__dict__["load"] is not ORIGINALS["load"]
            raise RuntimeError("cell failed")
    _assert_pristine()


def test_the_same_method_instrumented_twice_ends_as_it_started():
    """Nested instrument blocks on one method unwind to the original."""
    with testing.trace_to_memory() as result:
        with dftrace.instrument(Pipeline, {"load": ai.data.item}):
            with dftrace.instrument(Pipeline, {"load": ai.data.preprocess}):
                Pipeline().load(1)
            Pipeline().load(2)
    first_item, second_item = testing.assert_span(result, "item", count=2)
    [outer] = testing.assert_span(result, "preprocess", count=1)
    assert first_item["args"]["p_idx"] == outer["id"]  # the inner shim wraps the outer one
    assert second_item["args"]["p_idx"] == 0
    _assert_pristine()


def test_misspelt_method_fails_before_anything_changes():
    """An unknown name raises AttributeError with a suggestion, and no method was shimmed."""
    with pytest.raises(AttributeError, match=r"no method 'lod'.*did you mean 'load'"):
        with dftrace.instrument(Pipeline, {"normalize": ai.data.preprocess, "lod": ai.data.item}):
            pass
    _assert_pristine()


def test_special_method_on_an_instance_points_to_the_class():
    """Shimming __getitem__ on an instance is refused with the class-level call to use."""
    with pytest.raises(TypeError, match=r"instrument\(Pipeline, \{'__getitem__'"):
        with dftrace.instrument(Pipeline(), {"__getitem__": ai.data.item}):
            pass


def test_non_methods_and_non_nodes_are_refused():
    """Properties, plain attributes and values that are not nodes raise TypeError."""
    class Handler:
        def __call__(self, x):
            return x

    class WithProperty:
        size = 3
        handler = Handler()

        @property
        def name(self):
            return "x"

    with pytest.raises(TypeError, match="property"):
        with dftrace.instrument(WithProperty, {"name": ai.data.item}):
            pass
    with pytest.raises(TypeError, match="not a method"):
        with dftrace.instrument(WithProperty, {"size": ai.data.item}):
            pass
    with pytest.raises(TypeError, match="callable Handler object, not a method"):
        with dftrace.instrument(WithProperty, {"handler": ai.data.item}):
            pass
    with pytest.raises(TypeError, match="give a node"):
        dftrace.instrument(Pipeline, {"load": "ai.data.item"})


def test_instrument_and_capture_together_show_values_in_the_trace():
    """An instrumented method with capture= appears in the captured Trace with its values."""
    with dftrace.trace_in_memory() as t:
        with dftrace.instrument(Pipeline, {"load": ai.data.item(capture=True, capture_result=True)}):
            Pipeline().load(21)
    call = t.data.item[0]
    assert (call.params.index, call.result) == (21, 42)
