"""The generator styles: a decorated generator function (or async generator
function) records one span per iteration, from its first ``next`` until it ends or
closes. The span is not pushed: it is no parent of what the consumer does between
items, and it is recorded where it started when it still nests there, else on a
track of its own (``engine.close_span`` with ``pushed=False``). Both engines use
these (the C engine has no generator style of its own).

A generator still suspended when the session finalizes (held by the program at its
exit, or interrupted by a signal) never ends while it could be written: its span is
written then, flagged incomplete (:func:`close_open_generators`), and nothing is
recorded if it ends later.
"""

from __future__ import annotations

import os
from typing import Any

from .engine import close_ended, close_returned, close_span, current_stack, open_span, speedups

__all__ = ["close_open_generators", "wrap_asyncgen", "wrap_generator"]

#: The spans of generators under way, by id: (stack, span, args). A forked child's
#: are its parent's spans: it writes none of them.
_OPEN: dict[int, tuple[Any, Any, Any]] = {}
os.register_at_fork(after_in_child=_OPEN.clear)
#: With a ring (the default writer), a span under way is also kept in its open-span
#: table: if the process is killed, the drainer writes it, incomplete.
_keep_open = getattr(speedups, "shm_keep_open", None)


def _opened(stk: Any, s: Any, extra: Any) -> None:
    _OPEN[s.id] = (stk, s, extra)
    if _keep_open is not None:
        try:
            _keep_open(s.kid, s.t0, s.id, s.parent, s.level, stk.tid)
        except Exception:
            pass


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
    _opened(stk, s, extra)
    try:
        r = yield from gen
    except BaseException as e:
        if _OPEN.pop(s.id, None) is not None:
            close_ended(stk, s, extra, capture, params, e, pushed=False)
        raise
    if _OPEN.pop(s.id, None) is not None:
        close_returned(stk, s, extra, capture, params, r, pushed=False)
    return r


async def _asyncgen_span(agen: Any, node: Any, extra: Any, capture: Any, params: Any) -> Any:
    stk = current_stack()
    s = open_span(stk, node, node._kid, push=False, pairs=False)
    _opened(stk, s, extra)
    error = None
    try:
        async for item in agen:
            yield item
    except BaseException as e:
        error = e
        raise
    finally:
        if _OPEN.pop(s.id, None) is not None:
            close_ended(stk, s, extra, capture, params, error, pushed=False)


def close_open_generators(t: int) -> int:
    """Write the spans of the generators still under way, flagged incomplete, ending
    at ``t`` (at finalize: they will not end while they can be written); how many."""
    n = 0
    for i in sorted(_OPEN):
        entry = _OPEN.pop(i, None)
        if entry is not None:
            stk, s, extra = entry
            close_span(stk, s, t, extra, incomplete=True, pushed=False)
            n += 1
    return n
