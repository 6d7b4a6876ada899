"""``trace_modules``: a span per submodule forward (and, asked for, backward) named
``forward.<path>``, with input and output shapes."""

from __future__ import annotations

import fnmatch
import operator
from collections.abc import Iterable
from typing import Any

import torch

from .._core.tree import ai
from .._hooks import call_in_span, guarded, warn_once
from ._hooking import ThreadSpans, input_shapes, remove_handles, shapes

_NO_FORWARD: Any = object()  # a module without a forward attribute of its own


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
        self._bwd = ThreadSpans()

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
                extra = {**base, "input_shapes": input_shapes(args, kwargs)}
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


class _TracedForward:
    """A hooked module's ``forward`` attribute: calls its span wrapper. It stays the
    module's own: a copy of the model made while tracing (``copy.deepcopy`` for an
    EMA or a best model) gets the copy's own ``forward``, not a wrapper that runs the
    original's weights, and a model pickled meanwhile (``torch.save(model)``) is
    pickled without it. ``__wrapped__`` keeps the forward's signature visible."""

    __slots__ = ("call", "module", "own", "__wrapped__")

    def __init__(self, call: Any, module: Any, own: Any):
        self.call, self.module, self.own = call, module, own
        self.__wrapped__ = own if own is not _NO_FORWARD else type(module).forward.__get__(module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.call(*args, **kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        copy = memo.get(id(self.module))
        if copy is None:  # the wrapper alone: the same wrapper
            return self
        if self.own is not _NO_FORWARD:
            return _copied(self.own, memo)
        return type(copy).forward.__get__(copy)  # as the class's, bound to the copy

    def __reduce__(self) -> Any:
        # what the module had before: getattr(module, "forward") on a module being
        # unpickled (its attributes not yet set) is its class's, bound to it
        if self.own is _NO_FORWARD:
            return getattr, (self.module, "forward")
        return operator.itemgetter(0), ((self.own,),)


def _copied(value: Any, memo: dict[int, Any]) -> Any:
    import copy

    return copy.deepcopy(value, memo)


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
                module.forward = _TracedForward(ms.wrap_forward(module.forward), module, own)
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
        remove_handles(self._handles)
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
