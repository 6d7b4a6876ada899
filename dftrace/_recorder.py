"""The recording core: the shared buffer, span ids, and per-thread/per-task nesting.

Recording one span is: read the clock, run the user's code, read the clock, append
one tuple to ``BUFFER``. Everything else (encoding, compression, writing) happens
later in a consumer (the file writer, or an in-memory capture).

Nesting lives on a :class:`Stack` (a list of the ids of the open spans) that belongs
to one thread, or to one asyncio task. Plain threads find theirs in a
``threading.local`` (one attribute read). Code running inside an event loop finds
its task's stack through a ``ContextVar``; each task gets a stack of its own and a
*track*: a virtual tid, so Perfetto draws concurrent tasks on separate rows instead
of overlapping them on one. Nodes hold no per-call state, so one node can be used
by many threads, tasks and recursive calls at once.
"""

from __future__ import annotations

import itertools
import os
import threading
import warnings
import weakref
import sys
from contextvars import ContextVar
from time import perf_counter_ns
from typing import Any

from ._events import META

__all__ = ["BUFFER", "STATE", "LOCAL", "Stack", "current_stack", "record_special", "VTID_BASE"]

#: The one buffer every traced thread appends to. Never rebound: hot paths capture
#: its ``append``. Consumers take from the front with ``del BUFFER[:n]``.
BUFFER: list[tuple] = []
append = BUFFER.append


def record(*rec: Any) -> None:
    """Append one record ``(kind, t0, t1, id, parent, level, tid, extra)``; replaced
    by the C version (which also keeps records out of the garbage collector's way)."""
    append(rec)

clock = perf_counter_ns
ids = itertools.count(1)

#: Virtual tids for asyncio tasks start here (real Linux tids stay below 2**22).
VTID_BASE = 0x40000000
_vtids = itertools.count(VTID_BASE + 1)

#: How often (in span ids) a producer checks the buffer's fill level.
CHECK_MASK = 0xFFF


def _get_running_loop() -> Any:
    """The running asyncio loop, or None. No loop can run before asyncio is imported,
    so importing dftrace does not import asyncio; once it is, this name is rebound to
    asyncio's own (C) function."""
    aio = sys.modules.get("asyncio")
    if aio is None:
        return None
    global _get_running_loop
    _get_running_loop = aio._get_running_loop
    return _get_running_loop()


class Stack(list):
    """Ids of the open spans of one thread or task, above a 0 sentinel (so
    ``self[-1]`` is always the parent id and ``len(self)`` the next level). ``open``
    maps the id of each span opened by ``with``/``start()`` to ``(t0, opener, extra,
    parent, level)``."""

    __slots__ = ("tid", "owner", "open", "__weakref__")

    def __init__(self, tid: int, owner: Any):
        super().__init__((0,))
        self.tid = tid
        self.owner = owner
        self.open: dict[int, tuple] = {}


class _ThreadLocal(threading.local):
    stk: Stack | None = None  # the stack spans use right now (None: ask resolve())
    thread_stk: Stack | None = None  # this thread's own stack


LOCAL = _ThreadLocal()
TASK_STACK: ContextVar[Stack | None] = ContextVar("dftrace_task_stack", default=None)


class _State:
    """Process-wide recorder state; one instance, ``STATE``."""

    def __init__(self) -> None:
        self.consumer: Any = None  # object with wake(), wait_drained(limit, timeout)
        self.batch_size = 65536
        self.buffer_limit = 1_048_576
        self.drop_when_full = False
        self.dropped = 0
        self.captures = 0  # in-memory captures running (they open the gate too)
        self.pid = os.getpid()
        self.open_spans: dict[int, Stack] = {}  # id of a start() span -> its stack
        self.max_open_spans = 100_000  # past it start() records nothing ...
        self.open_refused = 0  # ... and counts here
        self._warned: set[str] = set()

    def warn_once(self, key: str, message: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        try:
            warnings.warn(f"dftrace: {message}", RuntimeWarning, stacklevel=3)
        except Exception:
            pass

    def reset_after_fork(self) -> None:
        # Only the forking thread lives on in the child: give it a fresh stack so no
        # span of the parent is anyone's parent here.
        LOCAL.stk = None
        LOCAL.thread_stk = None
        TASK_STACK.set(None)
        self.open_spans = {}
        self.pid = os.getpid()
        self.dropped = 0
        self.open_refused = 0
        del BUFFER[:]
        STACKS.clear()


STATE = _State()

#: Every live thread and task stack, so finalize can tell how many spans are still
#: open on other threads (added once per thread/task, on the slow path).
STACKS: weakref.WeakValueDictionary[int, Stack] = weakref.WeakValueDictionary()


def record_special(kind: Any, payload: dict, tid: int | None = None, t_ns: int | None = None) -> None:
    """Append a non-span record (metadata, counter, instant)."""
    if tid is None:
        tid = threading.get_native_id()
    record(kind, clock() if t_ns is None else t_ns, 0, next(ids), 0, 0, tid, payload)


def _thread_stack() -> Stack:
    stk = LOCAL.thread_stk
    if stk is None:
        tid = threading.get_native_id()
        stk = LOCAL.thread_stk = Stack(tid, None)
        STACKS[id(stk)] = stk
        try:
            name = threading.current_thread().name
        except Exception:
            name = str(tid)
        record_special(META, {"name": "thread_name", "args": {"name": name}}, tid)
    return stk


def resolve() -> Stack:
    """The stack of the calling thread, or of the calling asyncio task (slow path).

    Outside an event loop the thread's stack is installed in ``LOCAL.stk`` so the
    next span takes the fast path. Inside one, ``LOCAL.stk`` stays ``None`` so every
    span comes here and finds its own task's stack.
    """
    loop = _get_running_loop()
    if loop is None:
        stk = LOCAL.stk = _thread_stack()
        return stk
    LOCAL.stk = None
    thread_stk = _thread_stack()
    import asyncio  # already imported: a loop is running

    task = asyncio.current_task(loop)
    if task is None:  # a plain loop callback: the thread's own track
        return thread_stk
    stk = TASK_STACK.get()
    if stk is not None and stk.owner is task:
        return stk
    # A new task: its own track and its own nesting (p_idx never crosses tracks).
    vtid = next(_vtids)
    stk = Stack(vtid, task)
    STACKS[id(stk)] = stk
    try:
        tname = task.get_name()
    except Exception:
        tname = "task"
    record_special(META, {"name": "thread_name",
                          "args": {"name": f"{tname} (asyncio, thread {thread_stk.tid})"}}, vtid)
    TASK_STACK.set(stk)
    return stk


def current_stack() -> Stack:
    """The stack spans of the caller nest on (for ``with``/``start``/``iter``)."""
    stk = LOCAL.stk
    if stk is None or _get_running_loop() is not None:
        stk = resolve()
    return stk


def pressure() -> None:
    """Called by producers every CHECK_MASK+1 span ids: wake or wait for the consumer."""
    try:
        n = len(BUFFER)
        c = STATE.consumer
        if c is None:
            return
        if n >= STATE.batch_size:
            c.wake()
        if n >= STATE.buffer_limit:
            if STATE.drop_when_full or not c.wait_drained(STATE.buffer_limit // 2, 10.0):
                # Drop the newest events beyond the limit and count them; never hang.
                extra = len(BUFFER) - STATE.buffer_limit
                if extra > 0:
                    del BUFFER[STATE.buffer_limit:]
                    STATE.dropped += extra
    except Exception:
        pass


def _unwind(stk: Stack, i: int) -> None:
    """Remove span ``i`` and anything left above it (spans that never closed)."""
    try:
        del stk[stk.index(i):]
    except ValueError:
        pass


def _with_error(extra: Any, exc: BaseException) -> Any:
    if not isinstance(exc, Exception):
        return extra
    args = {"error": type(exc).__name__}
    if extra is not None:
        args = {**(extra if isinstance(extra, dict) else extra.args), **args}
    return args


# ---------------------------------------------------------------------------
# Decorators. The wrappers read module globals, the cheapest lookups Python has.
# ``obj`` is a Node or a Use: it has ``_node`` (the tree node whose current kinds
# name the events) and ``_extra``. ``gate._on`` says whether to record right now.
# ---------------------------------------------------------------------------

def wrap_sync(fn: Any, obj: Any, gate: Any) -> Any:
    node = obj._node
    extra = obj._extra
    if speedups is not None:
        return speedups.SpanWrapper(fn, node, gate, extra)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not gate._on:
            return fn(*args, **kwargs)
        stk = LOCAL.stk
        if stk is None:
            stk = resolve()
        i = next(ids)
        if not i & 0xFFF:  # CHECK_MASK, inlined
            pressure()
        p = stk[-1]
        lvl = len(stk)
        stk.append(i)
        t0 = clock()
        try:
            r = fn(*args, **kwargs)
        except BaseException as e:
            t1 = clock()
            _unwind(stk, i)
            record(node._kind, t0, t1, i, p, lvl, stk.tid, _with_error(extra, e))
            raise
        t1 = clock()
        if stk.pop() is not i:
            _unwind(stk, i)
        record(node._kind, t0, t1, i, p, lvl, stk.tid, extra)
        return r

    return wrapper


def wrap_async(fn: Any, obj: Any, gate: Any) -> Any:
    node = obj._node
    extra = obj._extra

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not gate._on:
            return await fn(*args, **kwargs)
        stk = resolve()
        i = next(ids)
        if not i & 0xFFF:  # CHECK_MASK, inlined
            pressure()
        p = stk[-1]
        lvl = len(stk)
        stk.append(i)
        t0 = clock()
        try:
            r = await fn(*args, **kwargs)
        except BaseException as e:
            t1 = clock()
            _unwind(stk, i)
            record(node._kind, t0, t1, i, p, lvl, stk.tid, _with_error(extra, e))
            raise
        t1 = clock()
        _unwind(stk, i)
        record(node._kind, t0, t1, i, p, lvl, stk.tid, extra)
        return r

    return wrapper


class _NoCapture:
    """Plays the capture spec for the uncaptured generator paths, which are not hot:
    no parameters, no result, ``args.error`` on an exception."""

    @staticmethod
    def params(args: tuple, kwargs: dict) -> None:
        return None

    @staticmethod
    def extra(extra: Any, params: Any, result: Any = None, error: BaseException | None = None) -> Any:
        return extra if error is None else _with_error(extra, error)


_NO_CAPTURE = _NoCapture()


def wrap_generator(fn: Any, obj: Any, gate: Any) -> Any:
    """A generator function: one span from its first ``next`` until it ends or closes
    (not a parent of what the consumer does between items)."""
    return wrap_generator_capture(fn, obj, gate, _NO_CAPTURE)


def wrap_asyncgen(fn: Any, obj: Any, gate: Any) -> Any:
    """An async generator function: one span for its whole iteration."""
    return wrap_asyncgen_capture(fn, obj, gate, _NO_CAPTURE)


# ---------------------------------------------------------------------------
# Context managers and hooks: the start time waits in the stack's ``open`` map.
# ``cm_enter``/``cm_exit`` are installed directly as ``__enter__``/``__exit__``.
# ---------------------------------------------------------------------------

def _open(stk: Stack, obj: Any) -> int:
    i = next(ids)
    if not i & CHECK_MASK:
        pressure()
    stk.open[i] = (clock(), obj, obj._extra, stk[-1], len(stk))
    stk.append(i)
    return i


def _close(stk: Stack, i: int, t1: int, x: Any = None, incomplete: bool = False) -> None:
    ent = stk.open.pop(i, None)
    if ent is None:
        return
    if stk and stk[-1] == i:
        stk.pop()
    else:
        # Spans opened inside this one and still open (a start() whose stop never
        # came) end here too, flagged incomplete, so nesting stays valid.
        try:
            above = stk[stk.index(i) + 1:]
        except ValueError:
            above = []
        for j in reversed(above):
            if j in stk.open:
                STATE.open_spans.pop(j, None)
                _close(stk, j, t1, incomplete=True)
        _unwind(stk, i)
    t0, obj, extra, p, lvl = ent
    if x is None:
        x = extra
    if incomplete:
        x = {**(x if isinstance(x, dict) else (x.args if x is not None else {})),
             "incomplete": True}
    record(obj._node._kind, t0, t1, i, p, lvl, stk.tid, x)


def cm_enter(self: Any) -> Any:
    if self._on:
        try:
            stk = LOCAL.stk
            if stk is None or _get_running_loop() is not None:
                stk = resolve()
            _open(stk, self)
        except Exception:
            pass
    return self


def cm_exit(self: Any, et: Any, ev: Any, tb: Any) -> bool:
    t1 = clock()
    try:
        stk = LOCAL.stk
        if stk is None or _get_running_loop() is not None:
            if not self._on and not STATE.open_spans and LOCAL.thread_stk is None:
                return False
            stk = resolve()
        if not stk.open:
            return False
        i = stk[-1]
        ent = stk.open.get(i)
        if ent is None or ent[1] is not self:
            i = 0
            for j in reversed(stk):  # not the innermost: an exit out of order
                ent = stk.open.get(j)
                if ent is not None and ent[1] is self:
                    i = j
                    break
            if not i:
                return False
        _close(stk, i, t1, None if ev is None else _with_error(ent[2], ev))
    except Exception:
        pass
    return False


def start(obj: Any) -> tuple[Stack, int] | None:
    """Hook style: open a span that stays open until ``stop`` (any later call).
    None (nothing recorded, counted) past ``STATE.max_open_spans`` open spans."""
    if len(STATE.open_spans) >= STATE.max_open_spans:
        STATE.open_refused += 1
        STATE.warn_once("open-spans", f"{STATE.max_open_spans} spans started with start() "
                        "are still open; further start() calls record nothing (counted in "
                        "the trace as dropped, reason 'open spans')")
        return None
    stk = LOCAL.stk
    if stk is None or _get_running_loop() is not None:
        stk = resolve()
    i = next(ids)
    if not i & 0xFFF:  # CHECK_MASK, inlined
        pressure()
    stk.open[i] = (clock(), obj, obj._extra, stk[-1], len(stk))
    stk.append(i)
    STATE.open_spans[i] = stk
    return stk, i


def _find_open(obj: Any) -> tuple[Stack, int] | None:
    # Prefer the innermost open span of obj on the caller's own stack ...
    opened = STATE.open_spans
    stk = current_stack()
    for j in reversed(stk):
        ent = stk.open.get(j)
        if ent is not None and ent[1] is obj and j in opened:
            return stk, j
    # ... else the most recent one anywhere (a hook called from another thread).
    for j in sorted(opened, reverse=True):
        s = opened.get(j)
        if s is not None:
            ent = s.open.get(j)
            if ent is not None and ent[1] is obj:
                return s, j
    return None


def stop(obj: Any, token: tuple[Stack, int] | None = None,
         args: dict[str, Any] | None = None) -> bool:
    """Close a span opened by ``start``. Spans started inside it with ``start`` and
    still open are closed too, flagged ``incomplete``. ``args`` (known only now)
    join the span's own. False when nothing was open."""
    t1 = clock()
    if token is None:
        # The common case: the innermost span on this thread's stack is obj's start().
        stk = LOCAL.stk
        if stk is not None and len(stk) > 1:
            i = stk[-1]
            ent = stk.open.get(i)
            if ent is not None and ent[1] is obj and STATE.open_spans.pop(i, None) is not None:
                del stk.open[i]
                stk.pop()
                record(obj._node._kind, ent[0], t1, i, ent[3], ent[4], stk.tid, ent[2])
                return True
        token = _find_open(obj)
        if token is None:
            return False
    stk, i = token
    if STATE.open_spans.pop(i, None) is None:
        return False
    if i in stk:
        for j in stk[stk.index(i) + 1:][::-1]:
            if STATE.open_spans.pop(j, None) is not None:
                _close(stk, j, t1, incomplete=True)
    x = None
    if args:
        ent = stk.open.get(i)
        base = ent[2] if ent is not None else None
        x = {**(base if isinstance(base, dict) else (base.args if base is not None else {})),
             **args}
    _close(stk, i, t1, x)
    return True


def close_all_open() -> int:
    """At finalize: close every span still open from ``start`` as incomplete."""
    t1 = clock()
    n = 0
    for i in sorted(STATE.open_spans, reverse=True):
        stk = STATE.open_spans.pop(i, None)
        if stk is not None:
            _close(stk, i, t1, incomplete=True)
            n += 1
    return n


# ---------------------------------------------------------------------------
# Iterators
# ---------------------------------------------------------------------------

def iterate(obj: Any, gate: Any, iterable: Any) -> Any:
    """``.iter()``: per item, a ``<leaf>.iter`` span (getting it) and a ``<leaf>.block``
    span (the loop body holding it), both with ``count``. Closes on break/close/error."""
    if speedups is not None:
        return speedups.SpanIter(obj._node, gate, obj._extra or None, iterable)
    return _iterate(obj, gate, iterable)


def _iterate(obj: Any, gate: Any, iterable: Any) -> Any:
    node = obj._node
    extra = obj._extra
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
        if stk is None or _get_running_loop() is not None:
            stk = resolve()
        i = next(ids)
        if not i & 0xFFF:  # CHECK_MASK, inlined
            pressure()
        p = stk[-1]
        lvl = len(stk)
        stk.append(i)
        t0 = clock()
        try:
            item = next(it)
        except StopIteration:
            _unwind(stk, i)
            return
        except BaseException as e:
            t1 = clock()
            _unwind(stk, i)
            record(node._iter_kind, t0, t1, i, p, lvl, stk.tid, _with_error(extra, e))
            raise
        t1 = clock()
        if stk.pop() is not i:
            _unwind(stk, i)
        count += 1
        x = count if extra is None else {**extra.args, "count": count}
        record(node._iter_kind, t0, t1, i, p, lvl, stk.tid, x)
        j = next(ids)
        stk.append(j)
        try:
            yield item
        finally:
            t2 = clock()
            if stk and stk[-1] is j:
                stk.pop()
            else:
                _unwind(stk, j)
            record(node._block_kind, t1, t2, j, p, lvl, stk.tid, x)


async def aiterate(obj: Any, gate: Any, aiterable: Any) -> Any:
    """``.aiter()``: the ``async for`` twin of :func:`iterate`."""
    node = obj._node
    extra = obj._extra
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
        i = next(ids)
        p = stk[-1]
        lvl = len(stk)
        stk.append(i)
        t0 = clock()
        try:
            item = await it.__anext__()
        except StopAsyncIteration:
            _unwind(stk, i)
            return
        except BaseException as e:
            t1 = clock()
            _unwind(stk, i)
            record(node._iter_kind, t0, t1, i, p, lvl, stk.tid, _with_error(extra, e))
            raise
        t1 = clock()
        _unwind(stk, i)
        count += 1
        x = count if extra is None else {**extra.args, "count": count}
        record(node._iter_kind, t0, t1, i, p, lvl, stk.tid, x)
        j = next(ids)
        stk.append(j)
        try:
            yield item
        finally:
            t2 = clock()
            _unwind(stk, j)
            record(node._block_kind, t1, t2, j, p, lvl, stk.tid, x)


def record_cm(name: str) -> None:
    """Metadata mode: a ``CM`` event ``<name>`` whose value is the current time (µs)."""
    stk = current_stack()
    record(META, clock(), 0, next(ids), 0, 0, stk.tid,
           {"name": "CM", "args": {"name": name}, "ts_value": True})


# ---------------------------------------------------------------------------
# Capturing uses (``node(capture=..., capture_result=...)``). ``_nodes`` picks these
# at decoration time, so a node without ``capture`` never runs any of this. ``cap``
# is a ``_values.FunctionCapture``: ``cap.params(args, kwargs)`` summarises the
# arguments before the clock starts, ``cap.extra(...)`` builds the event's args
# after it stops. Neither raises, and neither keeps a reference to a value.
# ---------------------------------------------------------------------------

def wrap_sync_capture(fn: Any, obj: Any, gate: Any, cap: Any) -> Any:
    node = obj._node
    extra = obj._extra

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not gate._on:
            return fn(*args, **kwargs)
        params = cap.params(args, kwargs)
        stk = LOCAL.stk
        if stk is None:
            stk = resolve()
        i = next(ids)
        if not i & CHECK_MASK:
            pressure()
        p = stk[-1]
        lvl = len(stk)
        stk.append(i)
        t0 = clock()
        try:
            r = fn(*args, **kwargs)
        except BaseException as e:
            t1 = clock()
            _unwind(stk, i)
            record(node._kind, t0, t1, i, p, lvl, stk.tid, cap.extra(extra, params, error=e))
            raise
        t1 = clock()
        if stk.pop() is not i:
            _unwind(stk, i)
        record(node._kind, t0, t1, i, p, lvl, stk.tid, cap.extra(extra, params, r))
        return r

    return wrapper


def wrap_async_capture(fn: Any, obj: Any, gate: Any, cap: Any) -> Any:
    node = obj._node
    extra = obj._extra

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not gate._on:
            return await fn(*args, **kwargs)
        params = cap.params(args, kwargs)
        stk = resolve()
        i = next(ids)
        if not i & CHECK_MASK:
            pressure()
        p = stk[-1]
        lvl = len(stk)
        stk.append(i)
        t0 = clock()
        try:
            r = await fn(*args, **kwargs)
        except BaseException as e:
            t1 = clock()
            _unwind(stk, i)
            record(node._kind, t0, t1, i, p, lvl, stk.tid, cap.extra(extra, params, error=e))
            raise
        t1 = clock()
        _unwind(stk, i)
        record(node._kind, t0, t1, i, p, lvl, stk.tid, cap.extra(extra, params, r))
        return r

    return wrapper


def wrap_generator_capture(fn: Any, obj: Any, gate: Any, cap: Any) -> Any:
    """A generator function: its arguments, and its ``return`` value as the result."""
    node = obj._node
    extra = obj._extra

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        gen = fn(*args, **kwargs)
        if not gate._on:
            return gen
        return _generator_span_capture(gen, node, extra, cap, cap.params(args, kwargs))

    return wrapper


def _generator_span_capture(gen: Any, node: Any, extra: Any, cap: Any, params: Any) -> Any:
    stk = current_stack()
    p, lvl, tid = stk[-1], len(stk), stk.tid
    i = next(ids)
    t0 = clock()
    try:
        r = yield from gen
    except BaseException as e:
        record(node._kind, t0, clock(), i, p, lvl, tid, cap.extra(extra, params, error=e))
        raise
    record(node._kind, t0, clock(), i, p, lvl, tid, cap.extra(extra, params, r))
    return r


def wrap_asyncgen_capture(fn: Any, obj: Any, gate: Any, cap: Any) -> Any:
    node = obj._node
    extra = obj._extra

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        agen = fn(*args, **kwargs)
        if not gate._on:
            return agen
        return _asyncgen_span_capture(agen, node, extra, cap, cap.params(args, kwargs))

    return wrapper


async def _asyncgen_span_capture(agen: Any, node: Any, extra: Any, cap: Any, params: Any) -> Any:
    stk = current_stack()
    p, lvl, tid = stk[-1], len(stk), stk.tid
    i = next(ids)
    t0 = clock()
    x = None
    try:
        async for item in agen:
            yield item
    except BaseException as e:
        x = cap.extra(extra, params, error=e)
        raise
    finally:
        if x is None:
            x = cap.extra(extra, params)
        record(node._kind, t0, clock(), i, p, lvl, tid, x)


def iterate_capture(obj: Any, gate: Any, iterable: Any, cap: Any) -> Any:
    """:func:`iterate` for ``capture_result=True``: each ``<leaf>.iter`` span also
    carries ``result``, the summary of the item the iterable produced."""
    node = obj._node
    extra = obj._extra
    base = extra.args if extra is not None else {}
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
        stk = current_stack()
        i = next(ids)
        if not i & CHECK_MASK:
            pressure()
        p = stk[-1]
        lvl = len(stk)
        stk.append(i)
        t0 = clock()
        try:
            item = next(it)
        except StopIteration:
            _unwind(stk, i)
            return
        except BaseException as e:
            t1 = clock()
            _unwind(stk, i)
            record(node._iter_kind, t0, t1, i, p, lvl, stk.tid,
                   cap.extra(extra, None, error=e))
            raise
        t1 = clock()
        _unwind(stk, i)
        count += 1
        x = count if extra is None else {**base, "count": count}
        record(node._iter_kind, t0, t1, i, p, lvl, stk.tid, cap.item_extra(extra, count, item))
        j = next(ids)
        stk.append(j)
        try:
            yield item
        finally:
            t2 = clock()
            _unwind(stk, j)
            record(node._block_kind, t1, t2, j, p, lvl, stk.tid, x)


def cm_open(opener: Any) -> Stack:
    """Open a ``with`` span on the caller's stack whose opener is ``opener``
    (anything with ``_node`` and ``_extra``: a capturing use's per-call scope)."""
    stk = current_stack()
    _open(stk, opener)
    return stk


def cm_find(match: Any) -> tuple[Stack, int, Any] | None:
    """The innermost open ``with`` span on the caller's stack whose opener satisfies
    ``match``, as ``(stack, id, opener)``; None when there is none."""
    stk = current_stack()
    for j in reversed(stk):
        ent = stk.open.get(j)
        if ent is not None and match(ent[1]):
            return stk, j, ent[1]
    return None


def cm_close(stk: Stack, i: int, t1: int, x: Any) -> None:
    """Close span ``i`` (from :func:`cm_open`) at ``t1`` with args ``x``."""
    _close(stk, i, t1, x)


def _load_speedups() -> Any:
    """The C twin of ``wrap_sync`` and of the encoder loop, when it was built, uses the
    same clock, and ``DFTRACE_NO_SPEEDUPS`` is not set; else None (pure Python)."""
    if os.environ.get("DFTRACE_NO_SPEEDUPS", "").strip() not in ("", "0"):
        return None
    try:
        from . import _speedups as mod
    except ImportError:
        return None
    # Spans mix both clocks (C wrappers, Python context managers): they must agree.
    if abs(mod.clock_ns() - clock()) > 1_000_000:
        return None
    mod.configure(LOCAL, BUFFER, resolve, pressure, _unwind, _with_error, ids.__next__, cm_exit)
    return mod


speedups = _load_speedups()
if speedups is not None:
    record = speedups.record  # noqa: F811 - the C twin of the function above
