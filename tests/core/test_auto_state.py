"""The C engine's types for automatic tracing (``AutoState``, ``AutoCall``; what
``dftrace/torch/_auto.py`` installs into PyTorch), driven here without torch: the
spans they write, their step and epoch args, and when they stand aside. The same
through PyTorch, under both engines: ``tests/integrations/test_auto.py``."""

from __future__ import annotations

import pytest

from dftrace import ai, testing
from dftrace._core import engine

from ._util import check_nesting

speedups = engine.speedups
pytestmark = pytest.mark.skipif(speedups is None, reason="the C engine was not built")


class Optimizer:
    pass


class Model:
    def __init__(self, training: bool = True) -> None:
        self.training = training

    def forward(self, x: int) -> int:
        if x < 0:
            raise ValueError("planted")
        return x * 2


def _state(covered=lambda category: False, grad=lambda: True):
    return speedups.AutoState(fetch=ai.dataloader.fetch, step=ai.compute.step, covered=covered,
                              grad_enabled=grad)


def _args(span):
    return {k: v for k, v in span["args"].items() if k not in ("hhash", "p_idx", "level")}


def test_a_loop_gets_fetch_forward_backward_and_step_spans_with_step_and_epoch(tmp_path):
    with testing.trace_to(tmp_path) as t:
        st = _state()
        model, opt = Model(), Optimizer()
        forward = speedups.AutoCall(st, ai.compute.forward, Model.forward, module="Model")
        backward = speedups.AutoCall(st, ai.compute.backward, lambda loss: loss)
        assert forward.add_root(model)
        other = Model()
        for epoch in range(2):
            st.begin(1234, epoch)
            for x in st.fetches(iter(range(3)), 1234, epoch):
                backward(forward(model, x))
                forward(other, x)  # not a root: not recorded
                st.step_pre(opt, (), {})
                st.step_post(opt, (), {})
        assert st.steps == 6
    fetches, forwards, backwards, steps = (t.spans(n) for n in ("fetch", "forward", "backward", "step"))
    expected = [{"step": k, "epoch": k // 3} for k in range(6)]
    assert [_args(e) for e in fetches] == expected
    assert [_args(e) for e in forwards] == [dict(p, module="Model") for p in expected]
    assert [_args(e) for e in backwards] == expected
    assert [_args(e) for e in steps] == [dict(p, optimizer="Optimizer") for p in expected]
    check_nesting(t.events)


def test_an_evaluation_forward_has_no_step_and_a_raising_one_says_so(tmp_path):
    with testing.trace_to(tmp_path) as t:
        st = _state()
        train, evaluate = Model(), Model(training=False)
        forward = speedups.AutoCall(st, ai.compute.forward, Model.forward, module="Model")
        forward.add_root(train)
        forward.add_root(evaluate)
        assert forward(evaluate, 1) == 2
        with pytest.raises(ValueError, match="planted"):
            forward(train, -1)
        forward.drop_root(id(train))
        forward(train, 1)  # dropped: not recorded
    assert [_args(e) for e in t.spans("forward")] == [
        {"module": "Model"}, {"step": 0, "module": "Model", "error": "ValueError"}]


def test_nothing_is_recorded_while_standing_down_or_while_you_record_it(tmp_path):
    asked = []

    def covered(category):
        asked.append(category)
        return True

    with testing.trace_to(tmp_path) as t:
        st = _state(covered)
        backward = speedups.AutoCall(st, ai.compute.backward, lambda: None)
        st.down = 1
        backward()
        list(st.fetches(iter(range(2)), 1, 0))
        st.step_pre(Optimizer(), (), {})
        st.step_post(Optimizer(), (), {})
        assert st.steps == 1  # counted (what follows numbers on), not recorded
        st.down = 0
        backward()  # nothing of yours open: covered() is not asked
        assert asked == []
        with ai.compute.backward:
            backward()
            list(st.fetches(iter(range(2)), 1, 0))
        assert asked == ["compute", "dataloader", "dataloader", "dataloader"]
    assert len(t.spans("backward")) == 2  # the one without yours, and yours
    assert t.spans("fetch") == []


def test_a_step_that_raised_ends_incomplete_at_the_next_batch(tmp_path):
    with testing.trace_to(tmp_path) as t:
        st = _state()
        opt = Optimizer()
        st.begin(7, 0)
        batches = st.fetches(iter(range(3)), 7, 0)
        next(batches)
        st.step_pre(opt, (), {})  # raised inside: no step_post
        next(batches)
        st.step_pre(opt, (), {})
        st.step_post(opt, (), {})
    steps = t.spans("step")
    assert [_args(e) for e in steps] == [{"incomplete": True}, {"step": 0, "epoch": 0, "optimizer": "Optimizer"}]
    assert all(e["args"]["level"] == 1 for e in t.spans("fetch") + steps)
