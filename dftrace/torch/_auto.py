"""Tracing a PyTorch program that has no annotations (``auto=True``: ``dftrace run``,
``DFTRACE_ENABLE=1``, ``DFTRACE_AUTO=1``).

Installed once torch is imported, it records, through hooks PyTorch offers for
everyone (global module and optimizer hooks) and a few replaced methods:

- ``dataloader.fetch.init`` when a DataLoader's iterator is made (worker start-up),
  then ``dataloader.fetch`` per batch: the time the loop waited for it;
- ``compute.forward`` per call of an outermost module (a model, not its layers),
  ``compute.backward`` per ``backward()``, and ``compute.step`` per
  ``optimizer.step()``, all with ``args.step``: the optimizer steps taken before
  them, so gradient accumulation's micro-batches share their step. Forwards run
  under ``torch.no_grad()`` or in ``eval()`` mode (evaluation) carry no step;
- ``args.epoch``: how many times the training loader (the one iterated when the
  first optimizer step ran; until then, the first loader iterated) was iterated
  before, on its fetches and the steps run while it is iterated;
- ``torch.distributed`` calls (:func:`~dftrace.torch.trace_distributed`), each
  ``DistributedDataParallel`` model's gradient buckets
  (:func:`~dftrace.torch.trace_ddp`, registered at its first forward, or around a
  communication hook you register), and the rank once a process group exists;
- Hugging Face ``Trainer`` and Lightning ``Trainer`` objects get
  :class:`dftrace.transformers.TraceCallback` / :class:`dftrace.lightning.TraceCallback`
  unless they have one; while they train, the hooks above stand down.

What you annotate is not recorded twice: a hook records nothing while a span of its
category is open on the calling thread (a ``with ai.compute...``, a function you
decorated with a compute node, ``ai.dataloader.fetch.iter(loader)``).
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any

import torch
from torch.utils.data import DataLoader

from .._core import engine as _engine
from .._core import iterators as _iterators
from .._core import records as _records
from .._core import tree as _tree
from .._core.tree import ai
from .._hooks import warn_once
from ._dist import note_distributed_rank, trace_ddp, trace_distributed

__all__ = ["install", "standing_down", "trace_ddp_of", "watch_ddp"]

_FETCH = ai.dataloader.fetch
_clock = _engine.clock
_grad_enabled = torch.is_grad_enabled
_FETCH_INIT = ai.dataloader.fetch.derive("init")
_FORWARD = ai.compute.forward
_BACKWARD = ai.compute.backward
_STEP = ai.compute.step


class _State:
    """What the hooks count: optimizer steps taken, the training loader and its
    iterations, the integrations training now."""

    def __init__(self) -> None:
        self.steps = 0
        self.train_loader: int | None = None  # id() of the training loader
        self.first_loader: int | None = None
        #: The training loader's id(); until the first step, the first loader's.
        self.training: int | None = None
        self.iterations: dict[int, int] = {}  # id(loader) -> iterations begun
        self.current: int | None = None  # the loader iterated last on the main thread
        self.integrations = 0
        self.installed = False
        self.local = _Local()
        #: The args of the spans of this step (``step``, ``epoch``), made once per
        #: step by :meth:`moved`, not per span: the hooks run between PyTorch's
        #: own work, where each line of Python they run costs the most.
        self.position: dict[str, Any] = {"step": 0}

    def moved(self) -> None:
        """The step or the epoch may have changed: the position is made anew.
        ``epoch``: how many times the training loader (until the first step, the
        first loader iterated) was iterated before, while it is the one iterated."""
        position: dict[str, Any] = {"step": self.steps}
        loader = self.training = self.train_loader if self.train_loader is not None else self.first_loader
        if loader is not None and self.current == loader:
            position["epoch"] = self.iterations.get(loader, 1) - 1
        self.position = position


class _Local(threading.local):
    """Per thread: the hooks' open forward and step spans, and how deep in module
    calls it is (class defaults: each thread starts with them, no lookup fails)."""

    depth = 0  # module calls open on this thread
    span: Any = None  # the open forward's span
    module: Any = None  # its module
    step_span: Any = None


STATE = _State()


def standing_down(delta: int) -> None:
    """An integration began (+1) or ended (-1) a training run: the hooks record
    nothing meanwhile (the integration records the same)."""
    STATE.integrations = max(0, STATE.integrations + delta)


#: Each thread's stack of open spans (``.stk``). The hooks ask :func:`_covered` only
#: when it may hold a span (it is not known yet, or holds more than its base): in an
#: un-annotated program, never.
_STACKS = _engine.LOCAL


def _covered(category: str, depth: int = 12) -> bool:
    """Whether a span of ``category`` you opened yourself is open on this thread: a
    ``with``/``start()`` span or an ``.iter()`` loop body of that category, or a
    function decorated with such a node. Nothing open (an un-annotated program): no,
    at once. The callers' frames are looked at only while a span of no known kind (a
    decorated function's) is open."""
    try:
        stk = _engine.LOCAL.stk or _engine.current_stack()
        if len(stk) <= 1:
            return False
        kinds = _records.kind_names()
        blocks = None
        unknown = False
        for i in stk[1:]:
            s = stk.open.get(i) if hasattr(stk.open, "get") else None
            if s is not None:
                kid = s.kid
            else:
                if blocks is None:
                    blocks = _iterators.open_block_kinds()
                kid = blocks.get(i)
            if kid is None:
                unknown = True
            elif kinds.get(kid, ("", ""))[1] == category:
                return True
        decorated = _tree.DECORATED_CODE
        if unknown and decorated:
            frame = sys._getframe(2)
            while frame is not None and depth:
                if decorated.get(frame.f_code) == category:
                    return True
                frame = frame.f_back
                depth -= 1
    except Exception:
        return False
    return False


# -- data loading ---------------------------------------------------------------------

class _Fetches:
    """A DataLoader's iterator, with a ``dataloader.fetch`` span per batch waited for."""

    __slots__ = ("it", "loader")

    def __init__(self, it: Any, loader: int):
        self.it = it
        self.loader = loader

    def __iter__(self) -> _Fetches:
        return self

    def __next__(self) -> Any:
        stk = _STACKS.stk
        if (STATE.integrations or not _FETCH._on
                or ((stk is None or len(stk) > 1) and _covered("dataloader"))):
            return next(self.it)
        if STATE.current != self.loader:
            STATE.current = self.loader
            STATE.moved()
        t0 = _clock()
        try:
            item = next(self.it)
        except StopIteration:
            raise
        except BaseException as exc:
            position = STATE.position if STATE.training == self.loader else {}
            _FETCH.record(t0, _clock(), {**position, "error": type(exc).__name__})
            raise
        _FETCH.record(t0, _clock(), STATE.position if STATE.training == self.loader else None)
        return item

    def __len__(self) -> int:
        return len(self.it)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.it, name)


_original_iter: Any = None


def _traced_iter(self: Any) -> Any:
    if STATE.integrations or not _FETCH.enabled or self in _tree.ITERATED or _covered("dataloader"):
        return _original_iter(self)
    key = id(self)
    if STATE.first_loader is None:
        STATE.first_loader = key
    STATE.iterations[key] = STATE.iterations.get(key, 0) + 1
    STATE.current = key
    STATE.moved()
    t0 = _clock()
    it = _original_iter(self)
    _FETCH_INIT.record(t0, _clock())
    return _Fetches(it, key)


# -- compute --------------------------------------------------------------------------

def _forward_pre(module: Any, args: Any) -> None:
    try:
        local = STATE.local
        if local.depth:  # a module inside the outermost one
            local.depth += 1
            return
        local.depth = 1
        stk = _STACKS.stk
        if (STATE.integrations or not _FORWARD._on
                or ((stk is None or len(stk) > 1) and _covered("compute"))):
            return
        local.span = _FORWARD.start()
        local.module = module
    except Exception:
        pass


def _forward_post(module: Any, args: Any, output: Any) -> None:
    try:
        local = STATE.local
        depth = local.depth
        if depth > 1:
            local.depth = depth - 1
            return
        local.depth = 0
        span = local.span
        if span is None or local.module is not module:
            return
        local.span = local.module = None
        if module.training and _grad_enabled():
            span.stop({"module": type(module).__name__, **STATE.position})
        else:
            span.stop({"module": type(module).__name__})
    except Exception:
        pass


class _Roots:
    """Which modules are called at the top (models, not their layers). A hook on
    every module makes PyTorch take its slow path for every layer of every call, so
    the global hooks only find the roots during the first optimizer steps; then each
    root found gets the same hooks of its own, and the global ones go."""

    #: Optimizer steps after which the global hooks are removed.
    DISCOVERY_STEPS = 2

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.found: weakref.WeakSet[Any] = weakref.WeakSet()

    def install(self) -> None:
        from torch.nn.modules import module as _module

        self.handles = [_module.register_module_forward_pre_hook(self.global_pre),
                        _module.register_module_forward_hook(_forward_post, always_call=True)]

    def global_pre(self, module: Any, args: Any) -> None:
        if not STATE.local.depth:
            try:
                self.found.add(module)
            except Exception:
                pass
        _forward_pre(module, args)

    def step_taken(self) -> None:
        if self.handles and STATE.steps >= self.DISCOVERY_STEPS and not STATE.local.depth:
            for handle in self.handles:
                handle.remove()
            self.handles = []
            for module in list(self.found):
                try:
                    module.register_forward_pre_hook(_forward_pre)
                    module.register_forward_hook(_forward_post, always_call=True)
                except Exception:
                    pass
            self.found = weakref.WeakSet()


ROOTS = _Roots()


class _BackwardArgs:
    """What ``dftrace.torch``'s traced ``backward()`` asks its users for."""

    def _backward_args(self) -> dict[str, Any] | None | bool:
        stk = _STACKS.stk
        if STATE.integrations or ((stk is None or len(stk) > 1) and _covered("compute", depth=6)):
            return False  # nothing to record: it is recorded already
        return STATE.position  # encoded by the span's stop(): shared safely


def _step_pre(optimizer: Any, args: Any, kwargs: Any) -> None:
    try:
        local = STATE.local
        local.step_span = None
        stk = _STACKS.stk
        if (STATE.integrations or not _STEP._on
                or ((stk is None or len(stk) > 1) and _covered("compute"))):
            return
        if STATE.train_loader is None:
            STATE.train_loader = STATE.current if STATE.current is not None else STATE.first_loader
            STATE.moved()
        local.step_span = _STEP.start()
    except Exception as exc:
        warn_once("auto-step", f"optimizer step not recorded: {exc!r}")


def _step_post(optimizer: Any, args: Any, kwargs: Any) -> None:
    try:
        local = STATE.local
        span = local.step_span
        if span is not None:
            local.step_span = None
            span.stop({"optimizer": type(optimizer).__name__, **STATE.position})
        if not STATE.integrations:
            STATE.steps += 1
            STATE.moved()
            if ROOTS.handles:
                ROOTS.step_taken()
    except Exception as exc:
        warn_once("auto-step", f"optimizer step not recorded: {exc!r}")


# -- distributed ----------------------------------------------------------------------

#: Modules whose DistributedDataParallel wrapper is traced whether ``auto`` is on or
#: not: an integration's model, wrapped by its trainer after the callback saw it.
_WANTED: weakref.WeakSet[Any] = weakref.WeakSet()


def trace_ddp_of(module: Any) -> None:
    """Record the gradient buckets of the DistributedDataParallel model that will
    wrap ``module`` (made later, by a trainer): registered at its first forward."""
    _WANTED.add(module)
    watch_ddp()


def _wanted(ddp: Any) -> bool:
    try:
        return STATE.installed or ddp.module in _WANTED
    except Exception:
        return False


def watch_ddp() -> None:
    """DistributedDataParallel's ``__init__`` and ``register_comm_hook``, once: a model
    wrapped while ``auto`` is on (or whose module is wanted by then, or by its first
    forward: a callback given to a trainer that had wrapped it already) gets
    :func:`trace_ddp` at its first forward, or around the communication hook you
    register before it."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    if getattr(DDP.__init__, "__dftrace_patched__", False):
        return
    init, register = DDP.__init__, DDP.register_comm_hook

    def __init__(self: Any, *a: Any, **kw: Any) -> None:
        init(self, *a, **kw)
        try:
            note_distributed_rank()
            handle: list[Any] = []

            def first_forward(module: Any, args: Any) -> None:
                for h in handle:
                    h.remove()
                if _wanted(self) and not getattr(self, "_dftrace_hooked", False):
                    try:
                        trace_ddp(self)
                    except Exception as exc:
                        warn_once("auto-ddp", f"DDP gradient buckets are not recorded: {exc!r}")

            handle.append(self.register_forward_pre_hook(first_forward))
        except Exception:
            pass

    def register_comm_hook(self: Any, state: Any, hook: Any) -> Any:
        if getattr(self, "_dftrace_hooked", False) or not _wanted(self):
            return register(self, state, hook)
        return trace_ddp(self, hook, state)  # your hook, traced (it registers it)

    __init__.__dftrace_patched__ = True  # type: ignore[attr-defined]
    DDP.__init__ = __init__  # type: ignore[method-assign]
    DDP.register_comm_hook = register_comm_hook  # type: ignore[method-assign]


def _patch_init_process_group() -> None:
    import torch.distributed as dist

    original = dist.init_process_group

    def init_process_group(*a: Any, **kw: Any) -> Any:
        out = original(*a, **kw)
        note_distributed_rank()
        return out

    dist.init_process_group = init_process_group


# -- trainers -------------------------------------------------------------------------

#: The modules that define the trainers, and the integration's function that gives a
#: trainer class its callback once the module is imported (named, not imported here:
#: the integrations import this module).
_TRAINERS = (("transformers.trainer", "dftrace.transformers:trace_trainers"),
             ("lightning.pytorch.trainer.trainer", "dftrace.lightning:trace_trainers"),
             ("pytorch_lightning.trainer.trainer", "dftrace.lightning:trace_trainers"))


# -- installing -----------------------------------------------------------------------

def install(_torch: Any = None) -> None:
    """Install the hooks (once per process; called once torch is imported)."""
    global _original_iter
    if STATE.installed:
        return
    STATE.installed = True
    from ._hooking import install_backward
    from .._core.after_import import when_imported

    _original_iter = DataLoader.__iter__
    DataLoader.__iter__ = _traced_iter  # type: ignore[method-assign]
    ROOTS.install()
    from torch.optim import optimizer as _optimizer

    _optimizer.register_optimizer_step_pre_hook(_step_pre)
    _optimizer.register_optimizer_step_post_hook(_step_post)
    install_backward(_BackwardArgs())  # type: ignore[arg-type]
    if torch.distributed.is_available():
        trace_distributed()
        watch_ddp()
        _patch_init_process_group()
        note_distributed_rank()
    for name, trace in _TRAINERS:
        when_imported(name, trace)
