"""The shape of the ``ai`` tree and the names its events carry."""

from __future__ import annotations

import dftrace
from dftrace import CATEGORIES, ai, testing
from dftrace import format as fmt

from ._util import assert_valid

EXPECTED = {
    "compute": ["forward", "backward", "step"],
    "data": ["preprocess", "item"],
    "dataloader": ["fetch"],
    "comm": ["send", "receive", "barrier", "bcast", "reduce", "all_reduce", "gather",
             "all_gather", "scatter", "reduce_scatter", "all_to_all"],
    "device": ["transfer"],
    "checkpoint": ["capture", "restart"],
    "pipeline": ["epoch", "train", "evaluate", "test"],
}


def _live_tree() -> dict[str, list[str]]:
    """Categories and their children, read from the nodes of the ``ai`` tree."""
    tree: dict[str, list[str]] = {}
    for node in ai.nodes():
        _, *names = node.path.split(".")
        if len(names) == 1:
            tree.setdefault(names[0], [])
        elif len(names) == 2 and node.name == names[1]:  # derived nodes have dotted names
            tree.setdefault(names[0], []).append(names[1])
    return tree


def test_tree_has_the_seven_categories_and_24_children():
    """The live ``ai`` tree holds exactly the categories and children of DFTracer's table."""
    tree = _live_tree()
    assert tree == EXPECTED
    assert sum(len(v) for v in tree.values()) == 24
    for cat, children in EXPECTED.items():
        node = getattr(ai, cat)
        assert node is ai[cat]
        for child in children:
            leaf = getattr(node, child)
            assert (leaf.name, leaf.cat, leaf.path) == (child, cat, f"ai.{cat}.{child}")


def test_the_format_and_the_public_constant_know_the_tree_s_categories():
    """CATEGORIES (public) and the format's category list match the tree that is built."""
    assert {k: list(v) for k, v in CATEGORIES.items()} == _live_tree()
    assert sorted(fmt.AI_CATEGORIES) == sorted(EXPECTED)


def test_every_leaf_writes_its_name_and_category(tmp_path):
    """Each leaf used as a context manager writes name=<leaf>, cat=<category>."""
    with testing.trace_to(tmp_path) as t:
        for cat, children in EXPECTED.items():
            for child in children:
                with getattr(getattr(ai, cat), child):
                    pass
    got = sorted((e["cat"], e["name"]) for e in t.spans())
    assert got == sorted((c, n) for c, ns in EXPECTED.items() for n in ns)
    assert_valid(t.paths)


def test_category_nodes_work_as_decorator_and_context_manager(tmp_path):
    """``@ai.compute`` and ``with ai.data:`` write events named after the category."""

    @ai.compute
    def work():
        return 7

    with testing.trace_to(tmp_path) as t:
        assert work() == 7
        with ai.data:
            pass
    assert [(e["name"], e["cat"]) for e in t.spans()] == [("compute", "compute"), ("data", "data")]


def test_init_events_are_namespaced(tmp_path):
    """``.init`` writes ``<leaf>.init``; ``with ai.checkpoint.init`` works (it raises in DFTracer)."""

    class Dataset:
        @ai.data.item.init
        def __init__(self, n):
            self.n = n

    with testing.trace_to(tmp_path) as t:
        assert Dataset(3).n == 3
        with ai.checkpoint.init:
            pass
        with ai.data.init:
            pass
    assert [(e["name"], e["cat"]) for e in t.spans()] == [
        ("item.init", "data"), ("checkpoint.init", "checkpoint"), ("data.init", "data")]


def test_derive_makes_a_child_event_in_the_same_category(tmp_path):
    """``derive(name="collate")`` on data.preprocess writes ``preprocess.collate`` in cat data,
    as decorator, context manager and iterator."""
    collate = ai.data.preprocess.derive(name="collate")
    assert ai.data.preprocess.derive("collate") is collate

    @collate
    def fn(batch):
        return batch

    with testing.trace_to(tmp_path) as t:
        fn([1])
        with collate:
            pass
        list(collate.iter([1, 2]))
    names = [(e["name"], e["cat"]) for e in t.spans()]
    assert names == [("preprocess.collate", "data")] * 2 + [
        ("preprocess.collate.iter", "data"), ("preprocess.collate.block", "data")] * 2 + [
        ("preprocess.collate.end", "data")]


def test_misuse_of_decorator_gives_a_helpful_error():
    """Decorating a non-callable says how to pass args instead."""
    import pytest

    with pytest.raises(TypeError, match=r"ai\.compute\.forward\(args="):
        ai.compute.forward.decorate(42)


def test_public_api_is_pinned():
    """``dftrace.__all__`` lists exactly the public names, sorted."""
    assert dftrace.__all__ == sorted(dftrace.__all__)
    for name in dftrace.__all__:
        assert hasattr(dftrace, name), name


def test_a_function_given_with_options_is_decorated_with_them(tmp_path):
    """``node(fn, args=...)`` returns ``fn`` traced as that use: each call is a span
    carrying the args (it used to return the use and drop ``fn``)."""

    def step(x):
        return x + 1

    with testing.trace_to(tmp_path) as result:
        traced = ai.compute.forward(step, args={"layer": 3})
        assert traced(1) == 2
        assert traced.__name__ == "step"
    [span] = testing.assert_span(result, "forward", cat="compute", count=1)
    assert testing.get_arg(span, "layer") == 3


def test_a_function_with_a_forced_off_use_is_returned_as_it_is():
    """``node(fn, enable=False)`` records nothing: ``fn`` comes back itself."""

    def step():
        pass

    assert ai.compute.forward(step, enable=False) is step


def test_a_value_that_is_not_a_function_with_options_is_refused():
    """``node(3, args=...)``: a TypeError says the node decorates functions."""
    import pytest

    with pytest.raises(TypeError, match="decorates functions"):
        ai.compute.forward(3, args={"a": 1})
