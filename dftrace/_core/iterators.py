"""The iterator styles, ``.iter()`` and ``.aiter()``: a span per item and a span per
loop body.

Per item, a ``<leaf>.iter`` span covers getting it and a ``<leaf>.block`` span the
loop body holding it, both with ``count``. Both close on ``break``, ``close()`` and
errors. The C engine has its own ``SpanIter`` for the plain case; this module is the
pure-Python engine's and the one for ``.iter()`` uses that summarise their items.
"""

from __future__ import annotations

from typing import Any

from . import engine as _engine
from .engine import (LOCAL, Stack, _sticky, _unwind, clock, new_id, record, resolve, speedups,
                     with_error)
from .nvtx_ranges import close_range as nvtx_close, open_range as nvtx_open

__all__ = ["aiterate", "iterate"]


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
    it = iter(iterable)
    count = 0
    while True:
        if not gate._on:
            try:
                item = next(it)
            except StopIteration:
                return
            count += 1
            yield item
            continue
        stk = LOCAL.stk
        if stk is None or _engine._get_running_loop() is not None:
            stk = resolve()
        sticky = _sticky(node)
        i = new_id()
        p = stk[-1]
        lvl = len(stk)
        stk.append(i)
        if _engine.NVTX_ON:
            nvtx_open(ikid, i, stk, True)
        t0 = clock()
        try:
            item = next(it)
        except StopIteration:
            _unwind(stk, i)
            if _engine.NVTX_ON:
                nvtx_close(i)
            return
        except BaseException as e:
            t1 = clock()
            _unwind(stk, i)
            record(ikid, t0, t1, i, p, lvl, stk.tid, sticky, with_error(extra, e))
            raise
        t1 = clock()
        if stk.pop() is not i:
            _unwind(stk, i)
        count += 1
        record(ikid, t0, t1, i, p, lvl, stk.tid, sticky,
               extra if capture is None else capture.item_extra(extra, count, item), count)
        j = new_id()
        stk.append(j)
        if _engine.NVTX_ON:
            nvtx_open(bkid, j, stk, True)
        block = _Block(bkid, t1, j, p, lvl, stk, sticky, extra, count)
        _OPEN_BLOCKS[j] = block
        try:
            yield item
        finally:
            block.close(clock())


class _Block:
    """The open loop-body span of a pure-Python ``.iter()`` (see ``_OPEN_BLOCKS``)."""

    __slots__ = ("kid", "t0", "i", "p", "lvl", "stk", "sticky", "extra", "count")

    def __init__(self, kid: int, t0: int, i: int, p: int, lvl: int, stk: Stack,
                 sticky: Any, extra: Any, count: int):
        self.kid, self.t0, self.i, self.p, self.lvl = kid, t0, i, p, lvl
        self.stk, self.sticky, self.extra, self.count = stk, sticky, extra, count

    def close(self, t2: int) -> None:
        if _OPEN_BLOCKS.pop(self.i, None) is None:
            return  # already ended by an iterator below it
        stk = self.stk
        # Blocks of other iterators still open above this one (zip of two .iter()s)
        # end here first, so both nest.
        while stk and stk[-1] != self.i:
            other = _OPEN_BLOCKS.get(stk[-1])
            if other is None:
                break
            other.close(t2)
        if stk and stk[-1] == self.i:
            stk.pop()
        else:
            _unwind(stk, self.i)
        record(self.kid, self.t0, t2, self.i, self.p, self.lvl, stk.tid, self.sticky,
               self.extra, self.count)


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
        sticky = _sticky(node)
        i = new_id()
        p = stk[-1]
        lvl = len(stk)
        stk.append(i)
        if _engine.NVTX_ON:
            nvtx_open(ikid, i, stk, False)
        t0 = clock()
        try:
            item = await it.__anext__()
        except StopAsyncIteration:
            _unwind(stk, i)
            if _engine.NVTX_ON:
                nvtx_close(i)
            return
        except BaseException as e:
            t1 = clock()
            _unwind(stk, i)
            record(ikid, t0, t1, i, p, lvl, stk.tid, sticky, with_error(extra, e))
            raise
        t1 = clock()
        _unwind(stk, i)
        count += 1
        record(ikid, t0, t1, i, p, lvl, stk.tid, sticky, extra, count)
        j = new_id()
        stk.append(j)
        if _engine.NVTX_ON:
            nvtx_open(bkid, j, stk, False)
        try:
            yield item
        finally:
            t2 = clock()
            _unwind(stk, j)
            record(bkid, t1, t2, j, p, lvl, stk.tid, sticky, extra, count)
