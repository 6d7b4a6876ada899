"""Loaders' passes under automatic tracing (``dftrace.torch._auto``): their numbers (a
look at a batch is none), and evaluation passes: a loader that is
not the training one, iterated with no optimizer step (to its end or left early), or
one iterated before the first optimizer step when another then trains, and
the eval-mode forwards of the outermost modules run between an optimizer step and the
next batch over tensors at hand, each pass a ``pipeline.evaluate`` span on a track of
its own, so that the step it interrupts does not hold its time."""

from __future__ import annotations

import os
from typing import Any

from .._core import engine as _engine
from .._core.tree import ai
from .._hooks import warn_once
from ._hooking import covered

_EVALUATE = ai.pipeline.evaluate

#: The automatic hooks' state (``_auto.STATE``: the C engine's ``AutoState`` or its
#: Python twin), handed over by ``_auto`` whenever it is made.
STATE: Any = None

#: Each loader's iteration under way: its start and the optimizer steps by then. One not
#: the training loader's that ends with no optimizer step is an evaluation: a
#: ``pipeline.evaluate`` span on a track of its own (the step it interrupts ends there).
BEGUN: dict[int, tuple[int, int]] = {}
_EVALUATION_TRACK: list[int] = []  # [pid, tid] of this process's track
#: id(loader) -> how many times it was iterated, and whether its last iteration was a
#: look at a batch (``next(iter(loader))``: one batch or none, no optimizer step),
#: whose number the next iteration takes (see ``pass_number``).
_ITERATIONS: dict[int, int] = {}
_LOOKED: dict[int, bool] = {}
#: [loader id, t0, t1] of a pass before the first optimizer step, of more than one
#: batch, through the loader then taken for the training one: an evaluation (a
#: baseline's) once another loader trains (see ``settle_before_training``).
_BEFORE_TRAINING: list[int] = []


def pass_number(key: int) -> int:
    """Loader ``key``'s iteration that begins: its number, from 0 (see ``_ITERATIONS``)."""
    number = _ITERATIONS.get(key, 0) - _LOOKED.pop(key, False)
    _ITERATIONS[key] = number + 1
    return number


def iteration_ended(key: int, t1: int, batches: int) -> None:
    """Loader ``key``'s iteration ran to its end, or was left, at ``t1``, having given
    ``batches`` (see ``BEGUN``)."""
    try:
        begun = BEGUN.pop(key, None)
        _LOOKED[key] = begun is not None and batches <= 1 and begun[1] == STATE.optimizer_steps
        if begun is not None and key == STATE.training and batches > 1 and not STATE.optimizer_steps:
            _BEFORE_TRAINING[:] = [key, begun[0], t1]
        if begun is None or key == STATE.training or begun[1] != STATE.optimizer_steps:
            return
        if covered("pipeline", names=("evaluate", "test")) or any(
                a < t1 and begun[0] < b for a, b in RECORDED_ELSEWHERE):
            return  # recorded by you or an integration (Lightning's validate())
        evaluation_over()  # one before it is over
        _EVALUATION_RUN[:] = [begun[0], t1]  # held: the forwards of batches fetched ahead follow its end
        STATE.evaluating = 1
    except Exception as exc:
        warn_once("auto-evaluate", f"an evaluation pass not recorded: {exc!r}")


#: [t0, t1] of the last evaluations an integration recorded (Lightning's ``validate()``,
#: whose loader's pass ends at its teardown): a pass overlapping one is that evaluation.
RECORDED_ELSEWHERE: list[tuple[int, int]] = []


def recorded_elsewhere(t0: int, t1: int) -> None:
    """An integration recorded an evaluation from ``t0`` to ``t1`` (see ``RECORDED_ELSEWHERE``)."""
    RECORDED_ELSEWHERE.append((t0, t1))
    del RECORDED_ELSEWHERE[:-8]


def settle_before_training() -> None:
    """After an optimizer step: the pass held in ``_BEFORE_TRAINING`` is an evaluation
    where another loader trains now."""
    if _BEFORE_TRAINING and STATE.optimizer_steps:
        key, t0, t1 = _BEFORE_TRAINING
        _BEFORE_TRAINING.clear()
        if key != STATE.training:
            record_evaluation(t0, t1)


def record_evaluation(t0: int, t1: int) -> None:
    """A ``pipeline.evaluate`` span from ``t0`` to ``t1`` on this process's evaluation track."""
    if not _EVALUATE.enabled:
        return
    if not _EVALUATION_TRACK or _EVALUATION_TRACK[0] != os.getpid():
        _EVALUATION_TRACK[:] = [os.getpid(), _engine.new_track("evaluation")]
    _engine.record_finished(_EVALUATE._kid, t0, t1, None, _engine.sticky_of(_EVALUATE), tid=_EVALUATION_TRACK[1])


#: The first start and last end of the eval-mode forwards of the outermost modules run
#: between an optimizer step and the next batch, outside any loader's pass: an
#: evaluation over tensors at hand; or an evaluation loader's pass and the eval-mode
#: forwards after its end (a loader that fetches a batch ahead, as Hugging Face's
#: accelerate does, ends before the last batch's forward). Recorded as one
#: ``pipeline.evaluate`` span when the next step begins, another evaluation pass ends
#: (or at exit), so that the step before does not hold its time.
_EVALUATION_RUN: list[int] = []
os.register_at_fork(after_in_child=_EVALUATION_RUN.clear)  # a forked child's (a worker's) is its parent's


def evaluated(t0: int, t1: int) -> None:
    """An eval-mode forward from ``t0`` to ``t1`` after a step's work (see ``_EVALUATION_RUN``)."""
    try:
        if any(key != STATE.training for key in BEGUN):
            return  # an evaluation loader's pass: a span of its own
        if _BEFORE_TRAINING and t0 >= _BEFORE_TRAINING[2] and not STATE.optimizer_steps:
            _BEFORE_TRAINING[2] = t1  # the forward of a batch a pass before training fetched ahead
            return
        if _EVALUATION_RUN:
            _EVALUATION_RUN[1] = t1
        else:
            _EVALUATION_RUN[:] = [t0, t1]
        STATE.evaluating = 1  # the C engine's state calls evaluation_over when the next step begins
    except Exception:
        pass


def evaluation_over() -> None:
    """The step after an evaluation over tensors at hand begins (or the program ends)."""
    if not _EVALUATION_RUN:
        return
    t0, t1 = _EVALUATION_RUN
    _EVALUATION_RUN.clear()
    try:
        record_evaluation(t0, t1)
    except Exception as exc:
        warn_once("auto-evaluate", f"an evaluation pass not recorded: {exc!r}")
