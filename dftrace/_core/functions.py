"""The function styles: what decorating a function with a node or a use makes of it.

:func:`decorate` picks the style by what it is given: a function records one span per
call (:func:`wrap_sync`; with the C engine its ``SpanWrapper`` unless values are
captured), a coroutine function one per awaited call (:func:`wrap_async`), a
generator or async generator function one per iteration (:mod:`.generators`). Every
span opens and closes through the engine's :func:`~.engine.open_span` /
:func:`~.engine.close_span`.

``obj`` is a Node or a Use: ``obj._node`` names the events and ``obj._extra`` holds
the use's own args. ``gate._on`` says whether to record now. ``capture`` (a
``_inspect.binding.FunctionCapture``, or None) adds captured values: its ``params``
summarises the arguments before the clock starts, its ``extra`` builds the span's
args after it stops; neither raises nor keeps a value alive.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from . import generators as _generators
from .engine import LOCAL, clock, close_ended, close_returned, close_span, open_span, resolve, speedups

__all__ = ["DECORATED_CODE", "decorate", "wrap_async", "wrap_sync"]

#: The code of each function decorated with a node -> the node's category: what
#: automatic tracing looks for among the frames of a call, so that a function you
#: annotated is not recorded twice.
DECORATED_CODE: dict[Any, str] = {}


def decorate(obj: Any, fn: Any, gate: Any) -> Any:
    """Wrap ``fn`` so each call is a span of ``obj``'s node."""
    import inspect  # at the first decoration, not at ``import dftrace``
    if isinstance(fn, (staticmethod, classmethod)):
        return type(fn)(decorate(obj, fn.__func__, gate))
    if inspect.isclass(fn):
        fn.__init__ = decorate(obj, fn.__init__, gate)  # type: ignore[misc]
        return fn
    if not callable(fn):
        raise TypeError(
            f"{obj!r} decorates functions; got {type(fn).__name__}. "
            f"To pass args use {obj._node.path}(args={{...}}).")
    # Chosen here, once: uses without capture pay nothing for it.
    capture = obj._capture.bind(fn) if obj._capture is not None else None
    if inspect.iscoroutinefunction(fn):
        wrapper = wrap_async(fn, obj, gate, capture)
    elif inspect.isasyncgenfunction(fn):
        wrapper = _generators.wrap_asyncgen(fn, obj, gate, capture)
    elif inspect.isgeneratorfunction(fn):
        wrapper = _generators.wrap_generator(fn, obj, gate, capture)
    else:
        wrapper = wrap_sync(fn, obj, gate, capture)
    try:
        functools.update_wrapper(wrapper, fn)
    except Exception:
        pass
    wrapper.__dftrace_node__ = obj._node  # type: ignore[attr-defined]
    code = getattr(fn, "__code__", None)
    if code is not None:
        DECORATED_CODE[code] = obj._node.cat
    return wrapper


# Pure-Python spans add a frame per traced call; past this depth each call makes
# sure the recursion limit leaves the program the depth it would have untraced.
_DEEP = 128
_limit_set = 0
_limit_user = 0


def _deepen(lvl: int) -> None:
    global _limit_set, _limit_user
    try:
        cur = sys.getrecursionlimit()
        if cur != _limit_set:  # first time, or the program set its own limit
            _limit_user = cur
        want = _limit_user + lvl + _DEEP
        if want > cur:
            sys.setrecursionlimit(want)
            _limit_set = want
    except Exception:
        pass


def wrap_sync(fn: Any, obj: Any, gate: Any, capture: Any = None) -> Any:
    """A function: one span per call (the C engine's ``SpanWrapper`` when it is in
    use and nothing is captured)."""
    node = obj._node
    extra = obj._extra
    if speedups is not None and capture is None:
        return speedups.SpanWrapper(fn, node, gate, extra)
    kid = node._kid

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not gate._on:
            return fn(*args, **kwargs)
        params = capture.params(args, kwargs) if capture is not None else None
        stk = LOCAL.stk
        if stk is None:
            stk = resolve()
        s = open_span(stk, node, kid)
        if s.level >= _DEEP:
            _deepen(s.level)
        try:
            r = fn(*args, **kwargs)
        except BaseException as e:
            close_ended(stk, s, extra, capture, params, e)
            raise
        # close_returned() written out: the pure engine's decorator pays no extra call a span.
        close_span(stk, s, clock(), extra if capture is None else capture.extra(extra, params, r))
        return r

    return wrapper


def wrap_async(fn: Any, obj: Any, gate: Any, capture: Any = None) -> Any:
    """A coroutine function: one span per call, from the call to its result (on the
    calling task's own track)."""
    node = obj._node
    extra = obj._extra
    kid = node._kid

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not gate._on:
            return await fn(*args, **kwargs)
        params = capture.params(args, kwargs) if capture is not None else None
        stk = resolve()
        s = open_span(stk, node, kid, pairs=False)
        try:
            r = await fn(*args, **kwargs)
        except BaseException as e:
            close_ended(stk, s, extra, capture, params, e)
            raise
        close_returned(stk, s, extra, capture, params, r)
        return r

    return wrapper
