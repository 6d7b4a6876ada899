"""The generator styles: a decorated generator function (or async generator
function) records one span per iteration, from its first ``next`` until it ends or
closes. The span is not pushed: it is no parent of what the consumer does between
items, and it is recorded where it started when it still nests there, else on a
track of its own (``engine.close_span`` with ``pushed=False``). Both engines use
these (the C engine has no generator style of its own).
"""

from __future__ import annotations

from typing import Any

from .engine import close_ended, close_returned, current_stack, open_span

__all__ = ["wrap_asyncgen", "wrap_generator"]


def wrap_generator(fn: Any, obj: Any, gate: Any, capture: Any = None) -> Any:
    """A generator function: one span from its first ``next`` until it ends or closes
    (not a parent of what the consumer does between items); with ``capture``, its
    arguments and its ``return`` value."""
    return _wrap_generating(fn, obj, gate, capture, _generator_span)


def wrap_asyncgen(fn: Any, obj: Any, gate: Any, capture: Any = None) -> Any:
    """An async generator function: one span for its whole iteration."""
    return _wrap_generating(fn, obj, gate, capture, _asyncgen_span)


def _wrap_generating(fn: Any, obj: Any, gate: Any, capture: Any, span: Any) -> Any:
    """The wrapper of a (async) generator function: ``span`` wraps what it returns."""
    node = obj._node
    extra = obj._extra

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        gen = fn(*args, **kwargs)
        if not gate._on:
            return gen
        return span(gen, node, extra, capture,
                    capture.params(args, kwargs) if capture is not None else None)

    return wrapper


def _generator_span(gen: Any, node: Any, extra: Any, capture: Any, params: Any) -> Any:
    stk = current_stack()
    s = open_span(stk, node, node._kid, push=False, pairs=False)
    try:
        r = yield from gen
    except BaseException as e:
        close_ended(stk, s, extra, capture, params, e, pushed=False)
        raise
    close_returned(stk, s, extra, capture, params, r, pushed=False)
    return r


async def _asyncgen_span(agen: Any, node: Any, extra: Any, capture: Any, params: Any) -> Any:
    stk = current_stack()
    s = open_span(stk, node, node._kid, push=False, pairs=False)
    error = None
    try:
        async for item in agen:
            yield item
    except BaseException as e:
        error = e
        raise
    finally:
        close_ended(stk, s, extra, capture, params, error, pushed=False)
