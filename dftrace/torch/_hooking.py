"""What the model hooks share: tensor shapes as args, each thread's open spans of
a hooked module, hooks removed without raising, the one patch of
``torch.autograd.backward`` that every user of backward() spans shares, whether you
record a category yourself now, and the ``forward`` that records a model's calls."""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from .._core import engine as _engine
from .._core import iterators as _iterators
from .._core import records as _records
from .._core import tree as _tree
from .._core.tree import ai
from .._hooks import call_in_span, warn_once


get_ident = threading.get_ident


def remove_handles(handles: list[Any]) -> None:
    """Remove torch hook handles, each even if another fails; empties the list."""
    for h in handles:
        try:
            h.remove()
        except Exception:
            pass
    handles.clear()


#: torch's own ``_has_any_global_hook`` while :func:`global_hooks_aside` stands in for
#: it, and the ids of the hooks it leaves out.
_HAS_ANY_GLOBAL_HOOK: Any = None
_OURS: frozenset = frozenset()


def global_hooks_aside(handles: list[Any]) -> None:
    """Leave the global module hooks of ``handles`` (dftrace's, finding the models
    during the first steps) out of torch's question whether any global hook is set,
    asked only to warn that ``torch.compile(module)`` runs such hooks once more: the
    program's output is what it would be untraced. ``handles`` empty: torch's own
    question again."""
    global _HAS_ANY_GLOBAL_HOOK, _OURS
    from torch.nn.modules import module as m

    if not handles:
        if _HAS_ANY_GLOBAL_HOOK is not None and getattr(m, "_has_any_global_hook", None) is _has_other_global_hook:
            m._has_any_global_hook = _HAS_ANY_GLOBAL_HOOK
        _HAS_ANY_GLOBAL_HOOK = None
        return
    own = getattr(m, "_has_any_global_hook", None)
    if own is None or own is _has_other_global_hook:
        return
    _HAS_ANY_GLOBAL_HOOK, _OURS = own, frozenset(getattr(h, "id", None) for h in handles)
    m._has_any_global_hook = _has_other_global_hook


#: The tables of torch's global module hooks, by hook id.
_GLOBAL_HOOK_TABLES = ("_global_backward_pre_hooks", "_global_backward_hooks", "_global_forward_pre_hooks",
                       "_global_forward_hooks", "_global_forward_hooks_always_called",
                       "_global_forward_hooks_with_kwargs")


def _has_other_global_hook() -> bool:
    """torch's ``_has_any_global_hook``, dftrace's own hooks aside."""
    from torch.nn.modules import module as m

    try:
        return any(k not in _OURS for name in _GLOBAL_HOOK_TABLES for k in getattr(m, name, ()))
    except Exception:
        return _HAS_ANY_GLOBAL_HOOK() if _HAS_ANY_GLOBAL_HOOK is not None else False


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


def input_shapes(args: tuple, kwargs: dict, limit: int = 8) -> list[list[int]]:
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


class ThreadSpans:
    """Open spans of one hook pair, per thread (a module may run in several threads,
    and recursively), matched last-in first-out."""

    __slots__ = ("_by_thread",)

    def __init__(self) -> None:
        self._by_thread: dict[int, list[Any]] = {}

    def push(self, entry: Any) -> None:
        self._by_thread.setdefault(get_ident(), []).append(entry)

    def pop(self) -> Any:
        lst = self._by_thread.get(get_ident())
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


def never_a_root(module: Any) -> bool:
    """Whether ``module``, called outermost, is no model's forward: a Keras layer or
    model (Keras on its torch backend, whose work Keras' callback records), or a loss
    (``nn.CrossEntropyLoss()`` and the like, a criterion applied to the output)."""
    return type(module).__module__.startswith("keras.") or isinstance(module, torch.nn.modules.loss._Loss)


def forward_failed(output: Any) -> str | None:
    """Inside an ``always_call`` forward hook: the exception's type name when the
    forward raised (torch calls the hook from its ``except`` block with no output)."""
    if output is not None:
        return None
    exc = sys.exc_info()[1]
    return type(exc).__name__ if exc is not None else None


# -- backward() calls, one patch for every user --------------------------------------

#: Who asked for backward() spans (``ComputeTracing``, automatic tracing), last first.
_backward_users: list[Any] = []
_original_backward: Any = None
#: What ``torch.autograd.backward`` is while there are users: ``_traced_backward``, or
#: the faster front a user asked for in its place (``install_backward``).
_installed_backward: Any = None
_backward_lock = threading.Lock()
BACKWARD = ai.compute.backward


def _traced_backward(*args: Any, **kwargs: Any) -> Any:
    users = _backward_users
    if not users or not BACKWARD._on:
        return _original_backward(*args, **kwargs)
    span_args = users[-1]._backward_args()
    if span_args is False:  # recorded already (automatic tracing inside your own span)
        return _original_backward(*args, **kwargs)
    return call_in_span(BACKWARD, _original_backward, args, kwargs, args=span_args)


def install_backward(user: Any, front: Callable[[Any, Any], Any] | None = None) -> None:
    """Add ``user`` to those asking for backward() spans. ``front(original, patch)``
    makes a faster callable to stand in the patch's place (automatic tracing's, in
    C), given the original backward and the patch it calls where it cannot record
    alone; it is put in place where the patch is still what torch calls."""
    global _original_backward, _installed_backward
    with _backward_lock:
        if not _backward_users:
            _original_backward = torch.autograd.backward
            # Tensor.backward() calls torch.autograd.backward by attribute at call
            # time, so this one replacement covers loss.backward() too.
            torch.autograd.backward = _installed_backward = _traced_backward
        if front is not None and torch.autograd.backward is _traced_backward:
            torch.autograd.backward = _installed_backward = front(_original_backward, _traced_backward)
        _backward_users.append(user)


def uninstall_backward(user: Any) -> None:
    global _original_backward, _installed_backward
    with _backward_lock:
        if user in _backward_users:
            _backward_users.remove(user)
        if not _backward_users and _original_backward is not None:
            if torch.autograd.backward is _installed_backward:
                torch.autograd.backward = _original_backward
            else:
                warn_once("backward-restore", "torch.autograd.backward was replaced after "
                          "trace_compute(); left as it is")
            _original_backward = _installed_backward = None


def front_function(fn: Any, call: Any) -> Any:
    """``fn`` (a class's ``forward``) calling through ``call``: a plain function, with
    ``fn``'s name, signature (``__wrapped__``), defaults and globals, so that what
    reads a module's ``forward`` reads what it would untraced: ``torch.jit.script``
    compiles ``fn``'s source, ``torch.fx`` traces through it, and under
    ``torch.compile`` it calls ``fn`` itself (no graph break). Its parameters are
    ``fn``'s own where they are plain (no ``*args``, ``**kwargs`` or keyword-only
    ones): the call passes them on as they are, with no tuple or dict made."""
    code = fn.__code__
    names = code.co_varnames[:code.co_argcount]
    plain = (not code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
             and not code.co_kwonlyargcount and not code.co_posonlyargcount
             and names and not any(n.startswith("_dft_") for n in names))
    params = ", ".join(names) if plain else "self, *args, **kwargs"
    made: dict[str, Any] = {}
    exec(f"def make(_dft_compiling, _dft_fn, _dft_call):\n"  # a text of our own: the names above
         f"    def forward({params}):\n"
         f"        if _dft_compiling():\n"
         f"            return _dft_fn({params})\n"
         f"        return _dft_call({params})\n"
         f"    return forward\n", made)
    forward = made["make"](compiling(), fn, call)
    front = types.FunctionType(forward.__code__, fn.__globals__, fn.__name__,
                               fn.__defaults__ if plain else None, forward.__closure__)
    functools.update_wrapper(front, fn)
    front.__dftrace_call__ = call  # type: ignore[attr-defined]
    return front


def compiling() -> Any:
    """A function that returns False, and True while ``torch.compile`` traces the
    code that calls it (``torch.compiler.is_dynamo_compiling``: one call that
    returns a constant; in older torch, the nearest one it has)."""
    compiler = getattr(torch, "compiler", None)
    for name in ("is_dynamo_compiling", "is_compiling"):
        found = getattr(compiler, name, None)
        if found is not None:
            return found
    try:
        from torch._dynamo import is_compiling
    except Exception:
        return lambda: False
    return is_compiling


def covered(category: str, depth: int = 12, names: tuple[str, ...] = ()) -> bool:
    """Whether a span of ``category`` (named one of ``names``, if given) you opened
    yourself is open on this thread: a ``with``/``start()`` span or an ``.iter()`` loop
    body of that category, or a function decorated with such a node. Nothing open (an
    un-annotated program): no, at once. The callers' frames are looked at only while a
    span of no known kind (a decorated function's) is open."""
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
            elif kinds.get(kid, ("", ""))[1] == category and (not names or kinds[kid][0] in names):
                return True
        decorated = _tree.DECORATED_CODE
        if unknown and decorated and not names:
            frame = sys._getframe(2)
            while frame is not None and depth:
                if decorated.get(frame.f_code) == category:
                    return True
                frame = frame.f_back
                depth -= 1
    except Exception:
        return False
    return False
