"""The iterator styles, ``.iter()`` and ``.aiter()``: a span per item and a span per
loop body.

Per item, a ``<leaf>.iter`` span covers getting it and a ``<leaf>.block`` span the
loop body holding it, both with ``count``. Both close on ``break``, ``close()`` and
errors. The ``next()`` that finds the pass over is ``<leaf>.end`` (:func:`record_end`):
its wait can be long (a ``tf.data`` pipeline draining, a loader's workers shutting
down). The C engine has its own ``SpanIter`` for the plain case; this module is the
pure-Python engine's and the one for ``.iter()`` uses that summarise their items.
"""

from __future__ import annotations

from typing import Any

from . import engine as _engine
from .engine import LOCAL, OpenSpan, Stack, clock, close_span, current_stack, new_id, open_span, record, \
    resolve, speedups, sticky_of
from .records import Extra

__all__ = ["aiterate", "aislice", "iterate", "record_end"]


def record_end(node: Any, t0: int, t1: int, extra: Any, count: int) -> None:
    """The ``next()`` that found a ``.iter()`` pass over, from ``t0`` to ``t1``: a
    ``<leaf>.end`` span, with the loop's own args and ``count`` the items it gave. It
    is written on every pass that runs to its end, however short (a list's end takes
    no time; a pipeline draining or a loader shutting its workers down can be a
    loop's longest wait), and the sticky args in force but ``step``: it ends the
    pass of its epoch, but is no step's (the step numbered last ended with its work)."""
    try:
        end = node.derive("end")
        if end._on:
            sticky = sticky_of(end)
            if sticky is not None and "step" in sticky.args:
                sticky = Extra({k: v for k, v in sticky.args.items() if k != "step"}) if len(sticky.args) > 1 else None
            stk = current_stack()
            record(end._kid, t0, t1, new_id(), stk[-1], len(stk), stk.tid, sticky, extra, count, 0)
    except Exception:
        pass


if speedups is not None:
    speedups.register(iter_end=record_end)


def iterate(obj: Any, gate: Any, iterable: Any, capture: Any = None) -> Any:
    """``.iter()``: per item, a ``<leaf>.iter`` span (getting it) and a ``<leaf>.block``
    span (the loop body holding it), both with ``count``. Closes on break/close/error.
    With ``capture``, each ``.iter`` span also carries the summary of its item."""
    if speedups is not None and capture is None:
        return speedups.SpanIter(obj._node, gate, obj._extra, iterable)
    return _iterate(obj, gate, iterable, capture)


def _iterate(obj: Any, gate: Any, iterable: Any, capture: Any) -> Any:
    node = obj._node
    extra = obj._extra
    ikid, bkid = node._ikid, node._bkid
    it = None  # made when the first item is asked for, inside its span (a DataLoader's workers start)
    count = 0
    while True:
        if not gate._on:
            try:
                if it is None:
                    it = iter(iterable)
                item = next(it)
            except StopIteration:
                return
            count += 1
            yield item
            continue
        stk = LOCAL.stk
        if stk is None or _engine._get_running_loop() is not None:
            stk = resolve()
        s = open_span(stk, node, ikid)
        try:
            if it is None:
                it = iter(iterable)
            item = next(it)
        except StopIteration:
            close_span(stk, s, 0, recorded=False)  # the end: no .iter span, but its wait
            break
        except BaseException as e:
            close_span(stk, s, clock(), extra, e)
            raise
        t1 = clock()
        count += 1
        close_span(stk, s, t1, extra if capture is None else capture.item_extra(extra, count, item),
                   count=count)
        block = _Block(open_span(stk, node, bkid, extra=extra, t0=t1), stk, count)
        _OPEN_BLOCKS[block.span.id] = block
        try:
            yield item
        finally:
            block.close(clock())
    # the wait that found the pass over, and for the source's iterator to go (its
    # workers, its threads; out of the except clause, whose traceback holds it)
    it = iterable = None
    record_end(node, s.t0, clock(), extra, count)


class _Block:
    """The open loop-body span of a pure-Python ``.iter()`` (see ``_OPEN_BLOCKS``)."""

    __slots__ = ("span", "stk", "count")

    def __init__(self, span: OpenSpan, stk: Stack, count: int):
        self.span, self.stk, self.count = span, stk, count

    def close(self, t2: int) -> None:
        s = self.span
        if _OPEN_BLOCKS.pop(s.id, None) is None:
            return  # already ended by an iterator below it
        stk = self.stk
        # Blocks of other iterators still open above this one (zip of two .iter()s)
        # end here first, so both nest.
        while stk and stk[-1] != s.id:
            other = _OPEN_BLOCKS.get(stk[-1])
            if other is None:
                break
            other.close(t2)
        close_span(stk, s, t2, s.extra, count=self.count)


#: Loop-body spans open now, by id (pure-Python engine; the C engine keeps a list).
_OPEN_BLOCKS: dict[int, _Block] = {}


async def aiterate(obj: Any, gate: Any, aiterable: Any) -> Any:
    """``.aiter()``: the ``async for`` twin of :func:`iterate`."""
    node = obj._node
    extra = obj._extra
    ikid, bkid = node._ikid, node._bkid
    it = aiterable.__aiter__()
    count = 0
    while True:
        if not gate._on:
            try:
                item = await it.__anext__()
            except StopAsyncIteration:
                return
            count += 1
            yield item
            continue
        stk = resolve()
        s = open_span(stk, node, ikid, pairs=False)
        try:
            item = await it.__anext__()
        except StopAsyncIteration:
            close_span(stk, s, 0, recorded=False)  # the end: no .iter span, but its wait
            break
        except BaseException as e:
            close_span(stk, s, clock(), extra, e)
            raise
        t1 = clock()
        count += 1
        close_span(stk, s, t1, extra, count=count)
        block = open_span(stk, node, bkid, extra=extra, pairs=False, t0=t1)
        try:
            yield item
        finally:
            close_span(stk, block, clock(), extra, count=count)
    it = aiterable = None  # the wait that found the pass over, and for the source's iterator to go
    record_end(node, s.t0, clock(), extra, count)


async def aislice(aiterable: Any, n: int) -> Any:
    """The first ``n`` items of an async iterable (``itertools.islice`` for
    ``async for``: sample mode's limit on ``.aiter()``)."""
    if n <= 0:
        return
    count = 0
    async for item in aiterable:
        yield item
        count += 1
        if count >= n:
            return


def close_open_blocks(t: int, ids: list[int] | None = None) -> int:
    """Write the loop-body spans of ``.iter()`` loops still suspended (an exception or
    a signal inside the loop leaves its generator holding them), flagged incomplete,
    ending at ``t``, innermost first: all of them (at finalize), or those with an id
    in ``ids`` (unwound from their stack by a span that enclosed them). How many."""
    n = speedups.close_open_blocks(t, ids) if speedups is not None else 0
    for i in sorted(_OPEN_BLOCKS if ids is None else (i for i in ids if i in _OPEN_BLOCKS), reverse=True):
        block = _OPEN_BLOCKS.pop(i, None)  # ids grow: the newest is innermost
        if block is not None:
            close_span(block.stk, block.span, t, block.span.extra, count=block.count, incomplete=True)
            n += 1
    return n


_engine.UNWOUND_BLOCKS = lambda ids, t: close_open_blocks(t, ids)


def open_block_kinds() -> dict[int, int]:
    """{span id: kind id} of the ``.iter()`` loop-body spans open now."""
    kinds = dict(speedups.open_block_kinds()) if speedups is not None else {}
    for i, block in list(_OPEN_BLOCKS.items()):
        kinds[i] = block.span.kid
    return kinds
