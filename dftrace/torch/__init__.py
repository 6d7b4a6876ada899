"""PyTorch integration: a useful trace of a training loop without editing the model.

    import dftrace
    import dftrace.torch as dft
    from dftrace import ai

    dftrace.initialize(log_file="traces/run")
    loader = dft.trace_dataloader(DataLoader(ds, batch_size=32, num_workers=2))
    with dft.trace_compute(model, optimizer):
        for epoch in ai.pipeline.epoch.iter(range(3)):
            for x, y in loader:
                loss = loss_fn(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

What each piece writes:

- :func:`trace_dataloader`: ``dataloader.fetch.iter``/``fetch.block`` per batch in the
  main process, ``data.item`` per ``__getitem__`` and ``data.preprocess.collate`` per
  batch in the workers (fork, spawn and forkserver).
- :func:`trace_compute`: ``compute.forward`` (hooks on the root module),
  ``compute.backward`` (every ``backward()`` call) and ``compute.step`` (optimizer
  step hooks), with ``args.step`` = optimizer steps taken so far.
- :func:`trace_modules`: a span per submodule forward (and, opt-in, backward) named
  ``forward.<path>`` with input and output shapes.
- :func:`trace_distributed` / :func:`trace_ddp`: ``comm.*`` per collective.
- :func:`to_device`, :func:`save`, :func:`load`: ``device.transfer``,
  ``checkpoint.capture``, ``checkpoint.restart`` with bytes and path.
- :func:`profile_steps`: the PyTorch profiler (GPU kernels with CUDA) for a few
  steps every N, its traces written beside dftrace's.

Every hook body is guarded: an error inside dftrace is reported once as a warning
and never reaches your training loop.
"""

from __future__ import annotations

try:
    import torch
except ImportError as _exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "dftrace.torch needs PyTorch, which is not installed; "
        "install it with: pip install 'dftrace[torch]'") from _exc

import fnmatch
import os
import sys
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from torch import Tensor

from .._core.tree import ai
from ._data import (TracedCollate, TracedDataLoader, TracedDataset,
                          TracedIterableDataset, trace_collate, trace_dataloader,
                          trace_dataset)
from ._dist import DistributedTracing, note_distributed_rank, trace_ddp, trace_distributed
from ._profiler import StepProfiler, profile_steps
from .._hooks import call_in_span, guarded, warn_once
from ._workers import WorkerInit, worker_init_fn

__all__ = [
    "ComputeTracing",
    "DistributedTracing",
    "ModuleTracing",
    "StepProfiler",
    "TracedCollate",
    "TracedDataLoader",
    "TracedDataset",
    "TracedIterableDataset",
    "WorkerInit",
    "load",
    "note_distributed_rank",
    "profile_steps",
    "save",
    "shapes",
    "to_device",
    "trace_collate",
    "trace_compute",
    "trace_dataloader",
    "trace_dataset",
    "trace_ddp",
    "trace_distributed",
    "trace_modules",
    "worker_init_fn",
]

_get_ident = threading.get_ident


def _remove_handles(handles: list[Any]) -> None:
    """Remove torch hook handles, each even if another fails; empties the list."""
    for h in handles:
        try:
            h.remove()
        except Exception:
            pass
    handles.clear()


def shapes(obj: Any, limit: int = 8) -> list[list[int]]:
    """Shapes of the tensors in ``obj`` (a tensor, or lists/tuples/dicts of them,
    three levels deep), at most ``limit`` of them. Only shapes are kept: no
    reference to a tensor outlives the call."""
    if type(obj) is Tensor or isinstance(obj, Tensor):  # the common case of a module output
        return [list(obj.shape)]
    out: list[list[int]] = []
    _visit(obj, 0, out, limit)
    return out


def _visit(o: Any, depth: int, out: list[list[int]], limit: int) -> None:
    if len(out) >= limit:
        return
    if isinstance(o, Tensor):
        out.append(list(o.shape))
    elif depth < 3:
        if isinstance(o, (list, tuple)):
            for x in o:
                _visit(x, depth + 1, out, limit)
        elif isinstance(o, Mapping):
            for x in o.values():
                _visit(x, depth + 1, out, limit)


def _input_shapes(args: tuple, kwargs: dict, limit: int = 8) -> list[list[int]]:
    # Most modules get one tensor, or a few, and no kwargs: no recursion then.
    if not kwargs and len(args) == 1 and type(args[0]) is Tensor:
        return [list(args[0].shape)]
    out = []
    for a in args:
        if isinstance(a, Tensor):
            out.append(list(a.shape))
        else:
            _visit(a, 1, out, limit)
    if kwargs:
        _visit(kwargs, 0, out, limit)
    return out[:limit]


class _ThreadSpans:
    """Open spans of one hook pair, per thread (a module may run in several threads,
    and recursively), matched last-in first-out."""

    __slots__ = ("_by_thread",)

    def __init__(self) -> None:
        self._by_thread: dict[int, list[Any]] = {}

    def push(self, entry: Any) -> None:
        self._by_thread.setdefault(_get_ident(), []).append(entry)

    def pop(self) -> Any:
        lst = self._by_thread.get(_get_ident())
        if not lst:
            return None
        return lst.pop()

    def close_all(self) -> None:
        for lst in list(self._by_thread.values()):
            while lst:
                entry = lst.pop()
                span = entry[0] if isinstance(entry, tuple) else entry
                span.stop({"incomplete": True})
        self._by_thread.clear()


def _forward_failed(output: Any) -> str | None:
    """Inside an ``always_call`` forward hook: the exception's type name when the
    forward raised (torch calls the hook from its ``except`` block with no output)."""
    if output is not None:
        return None
    exc = sys.exc_info()[1]
    return type(exc).__name__ if exc is not None else None


# ---------------------------------------------------------------------------
# Compute: forward (root module hooks), backward (backward() calls), step
# ---------------------------------------------------------------------------

_backward_lock = threading.Lock()
_backward_users: list[ComputeTracing] = []
_original_backward: Any = None
_BACKWARD = ai.compute.backward


def _traced_backward(*args: Any, **kwargs: Any) -> Any:
    users = _backward_users
    if not users or not _BACKWARD.enabled:
        return _original_backward(*args, **kwargs)
    span_args = users[-1]._backward_args()
    if span_args is False:  # recorded already (automatic tracing inside your own span)
        return _original_backward(*args, **kwargs)
    return call_in_span(_BACKWARD, _original_backward, args, kwargs, args=span_args)


def _install_backward(user: ComputeTracing) -> None:
    global _original_backward
    with _backward_lock:
        if not _backward_users:
            _original_backward = torch.autograd.backward
            # Tensor.backward() calls torch.autograd.backward by attribute at call
            # time, so this one replacement covers loss.backward() too.
            torch.autograd.backward = _traced_backward
        _backward_users.append(user)


def _uninstall_backward(user: ComputeTracing) -> None:
    global _original_backward
    with _backward_lock:
        if user in _backward_users:
            _backward_users.remove(user)
        if not _backward_users and _original_backward is not None:
            if torch.autograd.backward is _traced_backward:
                torch.autograd.backward = _original_backward
            else:
                warn_once("backward-restore", "torch.autograd.backward was replaced after "
                          "trace_compute(); left as it is")
            _original_backward = None


class ComputeTracing:
    """What :func:`trace_compute` returns: a context manager whose ``remove()``
    takes every hook out again.

    ``step`` is the step number written into the spans' args: the number of
    optimizer steps taken since tracing began (``None`` without an optimizer
    until you set it, e.g. ``tracing.step = global_step``). A step set with
    ``ai.update(step=...)`` wins: the spans then carry that one.
    """

    def __init__(self, model: Any = None, optimizer: Any = None, *, forward: bool = True,
                 backward: bool = True, step: bool = True):
        self.step: int | None = 0 if optimizer is not None else None
        self._handles: list[Any] = []
        self._forward = _ThreadSpans()
        self._steps = _ThreadSpans()
        self._backward = False
        self._removed = False
        self._optimizers: list[Any] = []
        if model is not None and forward:
            self._handles.append(model.register_forward_pre_hook(self._forward_pre))
            self._handles.append(model.register_forward_hook(self._forward_post, always_call=True))
        if optimizer is not None and step:
            opts = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
            self._optimizers = opts
            for opt in opts:
                self._handles.append(opt.register_step_pre_hook(self._step_pre))
                self._handles.append(opt.register_step_post_hook(self._step_post))
        if backward:
            _install_backward(self)
            self._backward = True
        from . import _auto

        _auto.standing_down(+1)  # this model's compute is recorded here, not by auto=True

    def _backward_args(self) -> dict[str, Any] | None:
        s = self._own_step(_BACKWARD)
        return None if s is None else {"step": s}

    def _own_step(self, node: Any) -> int | None:
        """The step to write on ``node``'s span: ours, unless the user set one."""
        if self.step is None or "step" in node._args():
            return None
        return self.step

    @guarded
    def _forward_pre(self, module: Any, args: Any) -> None:
        node = ai.compute.forward
        if node.enabled:
            self._forward.push(node.start())

    @guarded
    def _forward_post(self, module: Any, args: Any, output: Any) -> None:
        span = self._forward.pop()
        if span is None:
            return
        extra: dict[str, Any] = {"training": bool(module.training)}
        step = self._own_step(ai.compute.forward)
        if step is not None:
            extra["step"] = step
        err = _forward_failed(output)
        if err:
            extra["error"] = err
        span.stop(extra)

    @guarded
    def _step_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        node = ai.compute.step
        leftover = self._steps.pop()
        if leftover is not None:  # the last step() raised: its post hook never ran
            leftover[0].stop({**leftover[1], "incomplete": True})
        if node.enabled:
            extra: dict[str, Any] = {"optimizer": type(optimizer).__name__}
            step = self._own_step(node)
            if step is not None:
                extra["step"] = step
            if len(self._optimizers) > 1:
                extra["optimizer_index"] = self._optimizers.index(optimizer)
            self._steps.push((node.start(), extra))

    @guarded
    def _step_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        entry = self._steps.pop()
        if entry is not None:
            entry[0].stop(entry[1])
        # Count steps of the first optimizer only, so a GAN's two optimizers do not
        # advance the step twice per iteration.
        if self.step is not None and (not self._optimizers or optimizer is self._optimizers[0]):
            self.step += 1

    def remove(self) -> None:
        """Take out every hook this tracing added; spans still open are closed,
        flagged incomplete (idempotent)."""
        if self._removed:
            return
        self._removed = True
        _remove_handles(self._handles)
        if self._backward:
            _uninstall_backward(self)
        self._forward.close_all()
        self._steps.close_all()
        from . import _auto

        _auto.standing_down(-1)

    def __enter__(self) -> ComputeTracing:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def trace_compute(model: Any = None, optimizer: Any = None, *, forward: bool = True,
                  backward: bool = True, step: bool = True) -> ComputeTracing:
    """Write ``compute.forward``, ``compute.backward`` and ``compute.step`` spans for a
    training loop, without editing the model or the loop.

    - forward: a forward pre-hook and an ``always_call`` forward hook on ``model`` (the
      root module only; see :func:`trace_modules` for submodules), with
      ``args.training``.
    - backward: every ``backward()`` call (``loss.backward()``,
      ``torch.autograd.backward``) while tracing is active, wherever it is made.
    - step: ``optimizer.step()`` via the optimizer's step hooks (``optimizer`` may be
      a list); a step that raised is closed, flagged incomplete, at the next step.

    Each span carries ``args.step``, the number of optimizer steps taken so far
    (forward and backward of step N happen before its ``compute.step``). Use it as
    a context manager, or keep it and call ``remove()``.
    """
    return ComputeTracing(model, optimizer, forward=forward, backward=backward, step=step)


# ---------------------------------------------------------------------------
# Per-module view
# ---------------------------------------------------------------------------

# Derived names that already mean something for every node.
_RESERVED_LEAVES = frozenset({"iter", "block", "init"})


def _event_path(path: str) -> str:
    return path + "_" if path in _RESERVED_LEAVES else path


def _matches(path: str, module: Any, patterns: Iterable[Any]) -> bool:
    for p in patterns:
        if isinstance(p, str):
            if fnmatch.fnmatchcase(path, p):
                return True
        elif isinstance(p, type):
            if isinstance(module, p):
                return True
        else:
            raise TypeError(
                f"trace_modules(include=/exclude=) take path patterns (str) or module "
                f"classes; got {p!r}")
    return False


class _ModuleSpans:
    """The spans of one submodule: its ``forward`` is wrapped (a C span wrapper when
    shapes are off: no hook machinery of torch's runs per call), its backward goes
    through full backward hooks. Holds no tensor: only the path, the nodes and the
    open backward spans."""

    __slots__ = ("path", "kind", "forward_node", "backward_node", "record_shapes", "_bwd")

    def __init__(self, path: str, kind: str, record_shapes: bool):
        self.path = path
        self.kind = kind
        self.forward_node = ai.compute.forward.derive(_event_path(path))
        self.backward_node = ai.compute.backward.derive(_event_path(path))
        self.record_shapes = record_shapes
        self._bwd = _ThreadSpans()

    def wrap_forward(self, forward: Any) -> Any:
        """``forward`` (the module's bound method) recording one span per call."""
        base = {"module": self.path, "type": self.kind}
        if not self.record_shapes:
            return self.forward_node(args=base).decorate(forward)
        node = self.forward_node

        def traced_forward(*args: Any, **kwargs: Any) -> Any:
            if not node._on:
                return forward(*args, **kwargs)
            try:
                extra = {**base, "input_shapes": _input_shapes(args, kwargs)}
            except Exception as exc:
                _skipped(exc)
                extra = dict(base)
            return call_in_span(node, forward, args, kwargs, extra, _output_shapes)

        return traced_forward

    @guarded
    def backward_pre(self, module: Any, grad_output: Any) -> None:
        node = self.backward_node
        if node.enabled:
            self._bwd.push((node.start(), {"module": self.path, "type": self.kind}))

    @guarded
    def backward_post(self, module: Any, grad_input: Any, grad_output: Any) -> None:
        entry = self._bwd.pop()
        if entry is not None:
            entry[0].stop(entry[1])

    def close_all(self) -> None:
        self._bwd.close_all()


_NO_FORWARD: Any = object()  # a module without a forward attribute of its own


def _skipped(exc: BaseException) -> None:
    warn_once("trace_modules.shapes", f"trace_modules: recording shapes failed and was skipped: {exc!r}")


def _output_shapes(out: Any) -> dict[str, Any] | None:
    """``args.output_shapes`` of a traced forward's result (a failure warns once)."""
    try:
        return {"output_shapes": shapes(out)}
    except Exception as exc:
        _skipped(exc)
        return None


class ModuleTracing:
    """What :func:`trace_modules` returns: a context manager; leaving it (normally
    or by an exception) or calling :meth:`remove` takes every hook out.

    ``paths`` lists the submodules that are hooked, in model order.
    """

    def __init__(self, model: Any, include: Iterable[Any] | None = None,
                 exclude: Iterable[Any] | None = None, max_depth: int | None = None,
                 backward: bool = False, shapes: bool = True):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"trace_modules() needs a torch.nn.Module; got {type(model).__name__}")
        if max_depth is not None and (not isinstance(max_depth, int) or max_depth < 1):
            raise ValueError(f"trace_modules(max_depth=...) must be an integer >= 1; got {max_depth!r}")
        include = list(include) if include is not None else None
        exclude = list(exclude) if exclude is not None else []
        self.paths: list[str] = []
        self._spans: list[_ModuleSpans] = []
        self._handles: list[Any] = []
        self._forwards: list[tuple[Any, Any]] = []  # (module, its own forward attribute)
        self._removed = False
        try:
            for path, module in model.named_modules():
                if not path:
                    continue  # the root is trace_compute's compute.forward
                if max_depth is not None and path.count(".") + 1 > max_depth:
                    continue
                if include is not None and not _matches(path, module, include):
                    continue
                if exclude and _matches(path, module, exclude):
                    continue
                ms = _ModuleSpans(path, type(module).__name__, shapes)
                own = module.__dict__.get("forward", _NO_FORWARD)
                self._forwards.append((module, own))
                module.forward = ms.wrap_forward(module.forward)
                if backward:
                    self._handles.append(module.register_full_backward_pre_hook(ms.backward_pre))
                    self._handles.append(module.register_full_backward_hook(ms.backward_post))
                self._spans.append(ms)
                self.paths.append(path)
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        """Take out every hook (idempotent); spans still open close as incomplete."""
        if self._removed:
            return
        self._removed = True
        _remove_handles(self._handles)
        for module, own in self._forwards:
            try:
                if own is _NO_FORWARD:
                    del module.forward
                else:
                    module.forward = own
            except Exception:
                pass
        self._forwards.clear()
        for ms in self._spans:
            ms.close_all()

    def __enter__(self) -> ModuleTracing:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def trace_modules(model: Any, include: Iterable[Any] | None = None,
                  exclude: Iterable[Any] | None = None, max_depth: int | None = None,
                  *, backward: bool = False, shapes: bool = True) -> ModuleTracing:
    """A span per submodule call, named by its path: ``forward.<path>`` (category
    ``compute``, e.g. ``forward.encoder.layers.0.attn``) with ``args.module``,
    ``args.type`` and, with ``shapes``, ``input_shapes``/``output_shapes``.

    ``include``/``exclude`` take glob patterns on the path (``"layers.*"``) or module
    classes (``torch.nn.Linear``); ``max_depth`` keeps paths of at most that many
    components (``1``: direct children). The root module is not hooked (that is
    :func:`trace_compute`'s ``compute.forward``). ``backward=True`` adds
    ``backward.<path>`` spans through full backward hooks; torch forbids in-place
    changes of a hooked module's output then (``ReLU(inplace=True)`` right after
    it raises), which is why it is off by default.

    Use as a context manager: hooks are removed on exit, also after an exception.
    No tensor is kept: only shapes are recorded. Each hooked module costs a few
    microseconds per call (see docs/integrations/pytorch.md).
    """
    return ModuleTracing(model, include, exclude, max_depth, backward, shapes)


# ---------------------------------------------------------------------------
# Device and checkpoint
# ---------------------------------------------------------------------------

def _move(obj: Any, device: Any, non_blocking: bool, count: list[int]) -> Any:
    if isinstance(obj, torch.Tensor):
        count[0] += obj.numel() * obj.element_size()
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_move(x, device, non_blocking, count) for x in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_move(x, device, non_blocking, count) for x in obj)
    if isinstance(obj, Mapping):
        moved = {k: _move(v, device, non_blocking, count) for k, v in obj.items()}
        try:
            return type(obj)(moved)
        except Exception:
            return moved
    to = getattr(obj, "to", None)
    if callable(to):  # e.g. a tokenizer's BatchEncoding
        return to(device)
    return obj


def to_device(batch: Any, device: Any, non_blocking: bool = False) -> Any:
    """Move a batch (a tensor, or lists/tuples/dicts of them) to ``device`` inside a
    ``device.transfer`` span with ``args.bytes``, ``device`` and ``non_blocking``.

    With ``non_blocking=True`` to a GPU the span measures the launch of the copy.
    """
    node = ai.device.transfer
    count = [0]
    return call_in_span(node, _move, (batch, device, non_blocking, count),
                        args={"device": str(device)},
                        after=lambda _out: {"bytes": count[0], "non_blocking": bool(non_blocking)})


def _path_of(f: Any) -> str | None:
    if isinstance(f, (str, os.PathLike)):
        return os.fspath(f)
    name = getattr(f, "name", None)
    return name if isinstance(name, str) else None


def _size_of(f: Any) -> int | None:
    try:
        if isinstance(f, (str, os.PathLike)):
            return os.path.getsize(f)
        return f.tell() if hasattr(f, "tell") else None
    except Exception:
        return None


def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
    """``torch.save`` inside a ``checkpoint.capture`` span with ``args.path`` and
    ``args.bytes`` (the file's size after writing; for a file object, the bytes
    written to it)."""
    node = ai.checkpoint.capture
    if not node.enabled:
        return torch.save(obj, f, *args, **kwargs)
    start_pos = None if isinstance(f, (str, os.PathLike)) else _size_of(f)
    path = _path_of(f)

    def written(_out: Any) -> dict[str, Any] | None:
        end = _size_of(f)
        if end is None:
            return None
        return {"bytes": end - start_pos if start_pos is not None else end}

    call_in_span(node, torch.save, (obj, f, *args), kwargs,
                 args={"path": path} if path is not None else None, after=written)
    return None


def load(f: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.load`` inside a ``checkpoint.restart`` span with ``args.path`` and
    ``args.bytes`` (the file's size)."""
    node = ai.checkpoint.restart
    if not node.enabled:
        return torch.load(f, *args, **kwargs)
    extra: dict[str, Any] = {}
    path = _path_of(f)
    if path is not None:
        extra["path"] = path
    if isinstance(f, (str, os.PathLike)):
        size = _size_of(f)
        if size is not None:
            extra["bytes"] = size
    return call_in_span(node, torch.load, (f, *args), kwargs, args=extra or None)
