"""Tracing a PyTorch program that has no annotations (``auto=True``: ``dftrace run``,
``DFTRACE_ENABLE=1``, ``DFTRACE_AUTO=1``), once torch is imported, through hooks
PyTorch offers for everyone and a few replaced methods: a DataLoader's iterator
(``dataloader.fetch.init``, ``fetch`` per batch, ``fetch.end``; an evaluation
loader's pass as ``pipeline.evaluate``), the outermost modules' forwards,
``backward()`` and the optimizer steps, with ``args.step`` and ``args.epoch`` (how
they are counted: docs/integrations/pytorch.md, and ``_State``); ``torch.distributed``
and DDP's buckets; the Hugging Face and Lightning trainers' callbacks (the hooks
stand down while they train, and during a Keras ``fit``/``evaluate``/``predict``).

What you annotate is not recorded twice: a hook records nothing while a span of its
category is open on the calling thread (a ``with ai.compute...``, a function you
decorated with a compute node, ``ai.dataloader.fetch.iter(loader)``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import threading
import weakref
from typing import Any

import torch
from torch.utils.data import DataLoader

from .._core import engine as _engine
from .._core import lifecycle as _lifecycle
from .._core import tree as _tree
from .._core.tree import ai
from .._hooks import TRAINER_CALLBACKS, give_trainer_callback, warn_once
from . import _evaluations
from ._dist import note_distributed_rank, patch_init_process_group, trace_distributed, watch_ddp
from ._hooking import (BACKWARD, covered, forward_failed, front_function, global_hooks_aside, never_a_root,
                       remove_handles)

__all__ = ["install", "standing_down"]

_FETCH = ai.dataloader.fetch
_clock = _engine.clock
_grad_enabled = torch.is_grad_enabled
_FETCH_INIT = ai.dataloader.fetch.derive("init")
_FETCH_END = ai.dataloader.fetch.derive("end")
_FORWARD = ai.compute.forward
_STEP = ai.compute.step


class _State:
    """What the hooks count: optimizer steps taken, the training loader, this step's
    args. The pure-Python engine's twin of the C engine's ``AutoState``, which runs
    the same per step without a line of Python (the hooks run between PyTorch's own
    work, where each line of Python costs the most)."""

    def __init__(self) -> None:
        self.steps = 0
        self.down = 0  # integrations training now (they record the same)
        self.current = 0  # id() of the loader iterated last (0: none)
        self.training = 0  # id() of the training loader (iterated at the first optimizer step; until then the first)
        self.fixed = False  # the training loader is known
        self.epoch = 0  # how many times ``current`` was iterated before
        #: the training loader's epochs: the first of its own is ``shift`` (a loader
        #: made anew for each epoch continues its predecessor's count), its latest
        #: ``train_epoch``; ``ended``: that iteration ran to its end (``current_ended``:
        #: ``current``'s, which is then not adopted)
        self.shift, self.train_epoch, self.ended, self.current_ended = 0, 0, False, False
        #: an optimizer stepped while a loader is iterated: counted at the next batch
        #: (a GAN's second optimizer is the same step), or when ``stepped`` steps again;
        #: with no loader, the steps of ``counting`` alone count (see auto_hooks.c)
        self.pending, self.stepped, self.counting, self.last_opt = False, None, None, None
        self.evaluating = 0  # an evaluation over tensors at hand since the last step (see _evaluations.evaluated)
        #: called after each optimizer step while set (the roots' discovery; a held start)
        self.step_taken: Any = None
        self.after_step: Any = None
        self.optimizer_steps = 0  # every optimizer step taken
        self.position: dict[str, Any] = {"step": 0}

    def moved(self) -> None:
        """The step or the loader changed: this step's args, made anew (``epoch``
        while the training loader is the one iterated)."""
        position: dict[str, Any] = {"step": self.steps}
        if self.training and self.current == self.training:
            position["epoch"] = self.epoch + self.shift
        self.position = position

    def counted(self) -> None:
        self.steps += 1  # the step counted: what follows numbers on
        self.pending, self.stepped = False, None
        self.moved()
        _evaluations.evaluation_over()

    def begin(self, key: int, epoch: int) -> None:
        """Loader ``key``'s iteration ``epoch`` (from 0) begins."""
        if not self.training:
            self.training = key
        if key == self.training:
            self.train_epoch, self.ended = epoch + self.shift, False
        self.current, self.epoch, self.current_ended = key, epoch, False
        self.moved()

    def _adopt(self) -> None:
        """An optimizer step while another loader is iterated, after the training
        loader's iteration ended: that loader trains now (one made anew for each
        epoch), its epoch the next one (not one whose iteration ended before the
        step: an evaluation's, where ``itertools.cycle`` replays the training batches)."""
        self.shift = self.train_epoch + 1 - self.epoch
        self.training, self.train_epoch, self.ended = self.current, self.train_epoch + 1, False
        self.moved()

    def trained_elsewhere(self) -> None:
        """An integration's training run ended: the C engine's (auto_hooks.c)."""
        self.training, self.fixed, self.ended, self.current, self.current_ended = -1, True, True, 0, False
        self.moved()

    def fetches(self, it: Any, key: int, epoch: int) -> _Fetches:
        return _Fetches(it, key, epoch)

    def step_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            if self.pending and optimizer is self.stepped:
                self.counted()  # the same optimizer again with no batch between: a new step
            _end_step_left()
            if _stands_aside(_STEP, "compute"):
                return
            if not self.fixed:
                self.fixed = True
                if self.current:
                    if self.current != self.training:
                        self.train_epoch, self.ended = self.epoch, False
                    self.training = self.current
                self.moved()
            elif self.ended and self.current and self.current != self.training and not self.current_ended:
                self._adopt()
            elif self.current and self.current != self.training and self.current_ended:
                # an evaluation's loader ended before this step: it trains on, in the training loader's epoch
                self.current, self.epoch, self.current_ended = self.training, self.train_epoch - self.shift, self.ended
                self.moved()
            _LOCAL.step_span = (_STEP.start(), optimizer)
        except Exception as exc:
            warn_once("auto-step", f"optimizer step not recorded: {exc!r}")

    def step_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            held = _LOCAL.step_span
            if held is not None and held[1] is optimizer:
                _LOCAL.step_span = None
                held[0].stop({"optimizer": type(optimizer).__name__, **self.position})
            # (once the training loader's iteration ended, no batch comes to count it:
            # batches kept from it, itertools.cycle's, are used with no fetch)
            if not self.down and self.training and self.current == self.training and not self.ended:
                if not self.pending:  # counted at the next batch (see ``pending``)
                    self.pending, self.stepped = True, optimizer
            elif self.down or id(optimizer) in (self.counting or id(optimizer), self.last_opt):
                self.counting = id(optimizer)  # ids: an optimizer is not kept alive
                self.counted()  # no loader (or an integration's step): what follows numbers on
            self.last_opt, self.optimizer_steps = id(optimizer), self.optimizer_steps + 1
            if not self.down and self.step_taken is not None:
                self.step_taken()
            if self.after_step is not None:
                self.after_step()
        except Exception as exc:
            warn_once("auto-step", f"optimizer step not recorded: {exc!r}")


def _end_step_left() -> None:
    """The step span left open by a step that raised (torch calls no post-hook then) ends, incomplete,
    at the next step or batch fetched on its thread (a forward or backward may nest in it: a closure's)."""
    held = _LOCAL.step_span
    if held is not None:
        _LOCAL.step_span = None
        held[0].stop({"incomplete": True})


class _Local(threading.local):
    """Per thread: how deep in module calls the forward hooks are, their open forward
    span and its module, the open optimizer step span (class defaults: each thread
    starts with them, no lookup fails)."""

    depth = 0  # module calls open on this thread
    span: Any = None  # the open forward's span
    module: Any = None  # its module
    t0 = 0  # its start
    step_span: Any = None  # (span, optimizer)


_LOCAL = _Local()
_speedups = _engine.speedups
STATE: Any = _State()
_evaluations.STATE = STATE
_installed = False
_original_iter: Any = None


_DOWN_AT: list[int] = []  # the optimizer steps taken when an integration's run began


def standing_down(delta: int) -> None:
    """An integration began (+1) or ended (-1) a run: the hooks record nothing
    meanwhile (the integration records the same). One that took optimizer steps
    trained: a loader iterated after it is an evaluation's (unless one steps)."""
    if delta > 0 and not STATE.down:
        _DOWN_AT[:] = [STATE.optimizer_steps]
    STATE.down = max(0, STATE.down + delta)
    if not STATE.down and _DOWN_AT and STATE.optimizer_steps > _DOWN_AT.pop():
        STATE.trained_elsewhere()
    ROOTS.pause(STATE.down > 0)


#: Each thread's stack of open spans (``.stk``). The hooks ask :func:`~._hooking.covered` only when it
#: may hold a span (it is not known yet, or holds more than its base): in an un-annotated program, never.
_STACKS = _engine.LOCAL


def _stands_aside(node: Any, category: str) -> bool:
    """Whether a hook records nothing now: an integration stands ``auto`` down, the
    node is off, or you record it yourself (a span of ``category`` of yours is open;
    asked only when the stack may hold one). The Python twin of the C engine's
    ``may_record()`` (auto_hooks.c)."""
    stk = _STACKS.stk
    return bool(STATE.down or not node._on
                or ((stk is None or len(stk) > 1) and covered(category)))


# -- data loading ---------------------------------------------------------------------

class _Fetches:
    """A DataLoader's iterator, with a ``dataloader.fetch`` span per batch waited for
    (the pure-Python engine's twin of ``AutoState.fetches()``)."""

    __slots__ = ("it", "loader", "epoch", "done", "items")

    def __init__(self, it: Any, loader: int, epoch: int):
        self.it, self.loader, self.epoch = it, loader, epoch
        self.done, self.items = False, 0  # its iteration ended; the batches it gave

    def __del__(self) -> None:
        """A loader's iteration left early (a break): its workers' shut-down is its
        ``fetch.end``, and an evaluation's, cut short, is an evaluation all the same."""
        try:
            if not self.done and sys.getrefcount(self.it) == 2:
                t0 = _clock()
                self.it = None
                self._ended(t0)
        except Exception:
            pass

    def _ended(self, t0: int) -> None:
        """Its iteration ended (ran to its end, or was let go): the wait for that end,
        from ``t0`` until now, is its ``fetch.end``."""
        t1, training = _clock(), STATE.training == self.loader
        if training:
            STATE.ended = True
        if STATE.current == self.loader:
            STATE.current_ended = True
        _FETCH_END.record(t0, t1, {**((_epoch_now() or {}) if training else {}), "count": self.items})
        _evaluations.iteration_ended(self.loader, t1, self.items)

    def __iter__(self) -> _Fetches:
        return self

    def __next__(self) -> Any:
        if STATE.pending:  # the batch after an optimizer step: the next step's
            STATE.counted()
        if _LOCAL.step_span is not None:
            _end_step_left()
        if _stands_aside(_FETCH, "dataloader"):
            return self._next()
        if STATE.current != self.loader:
            STATE.current, STATE.epoch, STATE.current_ended = self.loader, self.epoch, False
            STATE.moved()
        t0 = _clock()
        try:
            item = self._next()
        except StopIteration:  # the wait for the end (its workers shut down): no batch
            self._ended(t0)
            raise
        except BaseException as exc:
            position = STATE.position if STATE.training == self.loader else {}
            _FETCH.record(t0, _clock(), {**position, "error": type(exc).__name__})
            raise
        _FETCH.record(t0, _clock(), STATE.position if STATE.training == self.loader else None)
        return item

    def _next(self) -> Any:
        try:
            item = next(self.it)
        except BaseException:
            self.done = True
            raise
        self.items += 1
        return item

    def __len__(self) -> int:
        return len(self.it)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.it, name)


def _epoch_now() -> dict[str, Any] | None:
    """The args of the start and end of the loader iterated now: the training loader's epoch."""
    return None if (epoch := STATE.position.get("epoch")) is None else {"epoch": epoch}


#: The start [loader id, t0, t1] of a loader made while another trains: held until it is known whether it trains.
_HELD: list[int] = []
os.register_at_fork(after_in_child=_HELD.clear)  # a forked child's (a worker's) is its parent's


def _settle_start(*_: Any) -> None:
    """The held start recorded, with the epoch where its loader trains: after the next
    optimizer step's hooks (they adopt a loader made anew), when another loader
    starts, or at exit."""
    held = tuple(_HELD)
    _HELD.clear()
    STATE.after_step = None
    _evaluations.settle_before_training()
    if held:
        key, t0, t1 = held
        _FETCH_INIT.record(t0, t1, _epoch_now() if STATE.training == key == STATE.current else None)


def _traced_iter(self: Any) -> Any:
    try:
        key = 0 if STATE.down or not _FETCH.enabled or self in _tree.ITERATED or covered("dataloader") else id(self)
        if key:
            _settle_start()
            epoch = _evaluations.pass_number(key)
            STATE.begin(key, epoch)
    except Exception:
        key = 0
    t0 = _clock()
    it = _original_iter(self)
    try:
        if key:
            _evaluations.BEGUN[key] = (t0, STATE.optimizer_steps)
            if STATE.training == key:
                _FETCH_INIT.record(t0, _clock(), _epoch_now())
            else:
                _HELD[:] = [key, t0, _clock()]
                STATE.after_step = _settle_start
            return STATE.fetches(it, key, epoch)
    except Exception as exc:
        warn_once("auto-fetch", f"DataLoader not traced: {exc!r}")
    return it


# -- compute --------------------------------------------------------------------------

def _forward_pre(module: Any, args: Any) -> None:
    try:
        local = _LOCAL
        if local.depth:  # a module inside the outermost one
            local.depth += 1
            return
        local.depth = 1
        if _stands_aside(_FORWARD, "compute"):
            return
        local.t0 = _clock()
        local.span = _FORWARD.start()
        local.module = module
    except Exception:
        pass


def _forward_post(module: Any, args: Any, output: Any) -> None:
    try:
        local = _LOCAL
        depth = local.depth
        if depth > 1:
            local.depth = depth - 1
            return
        local.depth = 0
        span = local.span
        if span is None or local.module is not module:
            return
        local.span = local.module = None
        args = {"module": type(module).__name__}
        trains = module.training and _grad_enabled()
        if trains:
            args.update(STATE.position)
        error = forward_failed(output)
        if error is not None:
            args["error"] = error
        span.stop(args)
        if (STATE.pending or STATE.ended) and not trains:  # after a step's work, or its epoch's
            _evaluations.evaluated(local.t0, _clock())
    except Exception:
        pass


#: The roots recorded through hooks of their own (those :func:`_front_forward` cannot
#: take). The hooks are module-level functions: a model pickled with them pickles.
_HOOKED: weakref.WeakSet[Any] = weakref.WeakSet()


# A copy of a root (copy.deepcopy, pickle) has its hooks too: it is not recorded.
def _root_pre(module: Any, args: Any) -> None:
    if module in _HOOKED:
        _forward_pre(module, args)


def _root_post(module: Any, args: Any, output: Any) -> None:
    if module in _HOOKED:
        _forward_post(module, args, output)


class _ForwardCall:
    """The pure-Python engine's twin of the C engine's ``AutoCall`` for a forward: a
    ``compute.forward`` span per call of a root added to it (not one inside another),
    the original ``fn`` called for every other instance."""

    def __init__(self, fn: Any, name: str):
        self.fn = fn
        self.name = name
        self.roots: weakref.WeakSet[Any] = weakref.WeakSet()

    def add_root(self, module: Any) -> bool:
        self.roots.add(module)
        return True

    def drop_root(self, address: int) -> None:
        pass  # a WeakSet forgets its own

    def __call__(self, module: Any, *args: Any, **kwargs: Any) -> Any:
        if module not in self.roots or _LOCAL.span is not None or _stands_aside(_FORWARD, "compute"):
            return self.fn(module, *args, **kwargs)
        t0 = _clock()
        span = _LOCAL.span = _FORWARD.start()
        try:
            out = self.fn(module, *args, **kwargs)
        except BaseException as exc:
            _LOCAL.span = None
            span.stop(self._args(module, type(exc).__name__ if isinstance(exc, Exception) else None))
            raise
        _LOCAL.span = None
        span.stop(self._args(module, None))
        if (STATE.pending or STATE.ended) and not (module.training and _grad_enabled()):
            _evaluations.evaluated(t0, _clock())
        return out

    def _args(self, module: Any, error: str | None) -> dict[str, Any]:
        args = {"module": self.name}
        if module.training and _grad_enabled():
            args.update(STATE.position)
        if error is not None:
            args["error"] = error
        return args


def _front_forward(module: Any) -> bool:
    """``module``'s calls recorded by its class's ``forward``, replaced by a function
    that calls an ``AutoCall`` (C; :class:`_ForwardCall`, its twin): it records the
    calls of the roots added to it and calls the original for every other instance.
    PyTorch's call path for a module with hooks costs more than the span itself, and
    hooks stop ``torch.jit.script``. False where it cannot (a ``forward`` of the
    instance's own, one that is not a function): hooks then."""
    if "forward" in vars(module):
        return False
    cls = type(module)
    front = cls.__dict__.get("forward")
    call = getattr(front, "__dftrace_call__", None)
    if call is None:
        fn = getattr(cls, "forward", None)
        if not inspect.isfunction(fn):
            return False
        if _speedups is not None:
            call = _speedups.AutoCall(STATE, _FORWARD, fn, module=cls.__name__)
        else:
            call = _ForwardCall(fn, cls.__name__)
        front = front_function(fn, call)
        cls.forward = front
    if not call.add_root(module):
        return False
    weakref.finalize(module, call.drop_root, id(module))
    return True


class _Roots:
    """Which modules are called at the top (models, not their layers). A hook on
    every module makes PyTorch take its slow path for every layer of every call, so
    the global hooks only find the roots during the first optimizer steps; then each
    root found is recorded by its class's ``forward`` (:func:`_front_forward`), or
    gets the same hooks of its own, and the global ones go."""

    #: Optimizer steps after which the global hooks are removed.
    DISCOVERY_STEPS = 2

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.found: weakref.WeakSet[Any] = weakref.WeakSet()
        self.searching = False  # the global hooks look for the roots (when not paused)

    def install(self) -> None:
        self.searching = True
        self.pause(STATE.down > 0)

    def pause(self, paused: bool) -> None:
        """While an integration trains (it records the forwards), the global hooks
        are removed, or each layer of its model would take PyTorch's slow path; the
        search goes on when it ends."""
        if paused and self.handles:
            remove_handles(self.handles)
            global_hooks_aside(self.handles)
            STATE.step_taken = None
        elif not paused and self.searching and not self.handles:
            from torch.nn.modules import module as _module

            _LOCAL.depth, _LOCAL.span, _LOCAL.module = 0, None, None

            self.handles = [_module.register_module_forward_pre_hook(self.global_pre),
                            _module.register_module_forward_hook(_forward_post, always_call=True)]
            global_hooks_aside(self.handles)
            STATE.step_taken = self.step_taken

    def global_pre(self, module: Any, args: Any) -> None:
        if not _LOCAL.depth:
            if never_a_root(module):  # Keras' (its callback records it), a loss: counted in depth alone
                _LOCAL.depth = 1
                return
            with contextlib.suppress(Exception):
                self.found.add(module)
        _forward_pre(module, args)

    def step_taken(self) -> None:
        if self.handles and STATE.steps >= self.DISCOVERY_STEPS and not _LOCAL.depth:
            self.searching = False
            self.pause(True)
            for module in list(self.found):
                try:
                    if not _front_forward(module):
                        _HOOKED.add(module)
                        module.register_forward_pre_hook(_root_pre)
                        module.register_forward_hook(_root_post, always_call=True)
                except Exception:
                    pass
            self.found = weakref.WeakSet()


ROOTS = _Roots()


class _BackwardArgs:
    """What ``dftrace.torch``'s traced ``backward()`` asks its users for."""

    def _backward_args(self) -> dict[str, Any] | None | bool:
        stk = _STACKS.stk
        if STATE.down or ((stk is None or len(stk) > 1) and covered("compute", depth=6)):
            return False  # nothing to record: it is recorded already
        return STATE.position  # encoded by the span's stop(): shared safely


# -- installing -----------------------------------------------------------------------


def _backward_front(original: Any, patch: Any) -> Any:
    """The C front that records backward() in the place of the shared patch
    (``_hooking.install_backward``), calling ``patch`` where it cannot record alone."""
    front = _speedups.AutoCall(STATE, BACKWARD, original, slow=patch)
    functools.update_wrapper(front, original)
    return front


def install(_torch: Any = None) -> None:
    """Install the hooks (once per process; called once torch is imported)."""
    global _original_iter, _installed, STATE
    if _installed:
        return
    _installed = True
    from . import _hooking
    from .._core.after_import import when_imported

    if _speedups is not None:  # the same, counted and recorded in C
        state = _speedups.AutoState(fetch=_FETCH, step=_STEP, covered=covered,
                                    grad_enabled=_grad_enabled, fetch_end=_FETCH_END,
                                    iteration_ended=_evaluations.iteration_ended, evaluated=_evaluations.evaluated,
                                    evaluation_over=_evaluations.evaluation_over)
        state.down = STATE.down  # integrations that began before
        STATE = _evaluations.STATE = state
    _original_iter = DataLoader.__iter__
    DataLoader.__iter__ = _traced_iter  # type: ignore[method-assign]
    ROOTS.install()
    from torch.optim import optimizer as _optimizer

    _optimizer.register_optimizer_step_pre_hook(STATE.step_pre)
    _optimizer.register_optimizer_step_post_hook(STATE.step_post)
    _lifecycle.at_end(_settle_start)  # as the trace ends (dftrace run's finalize comes before atexit's)
    _lifecycle.at_end(_evaluations.evaluation_over)
    # backward() recorded in C; the patch's users are asked only while auto stands down
    _hooking.install_backward(_BackwardArgs(),  # type: ignore[arg-type]
                              front=None if _speedups is None else _backward_front)
    if torch.distributed.is_available():
        trace_distributed()
        watch_ddp(every=True)
        patch_init_process_group()
        note_distributed_rank()
    for name, callback in TRAINER_CALLBACKS:
        when_imported(name, functools.partial(give_trainer_callback, callback))
