"""The recording engine: one primitive, :func:`record`, under every style.

Recording one span is: read the clock, run the user's code, read the clock, append
one record. Decorators (sync, async, generators), ``with``, ``.iter``/``.aiter``,
start/stop, ``Span.stop(args=)``, captured values, the DFTracer-compatible logger
and the integrations all end in :func:`record`; nothing else builds records. The C
twin (``_speedups``, used when it was built) keeps records as 64-byte structs in
native memory and implements the hot styles itself; this module is the pure-Python
engine and the slow paths of both.

A span's lifecycle (id, parent, level, sticky args, push, NVTX, t0; t1, pop or
unwind, ``args.error``, the incomplete flag, the record) is written once:
:func:`open_span` / :func:`close_span`, which every style calls (the C engine's
twin is ``span_open`` / ``span_close`` in ``engine_c/span_lifecycle.h``). A span opened by
``with`` or ``start()`` waits in its stack's ``open`` map as an :class:`OpenSpan`
(with the C engine the map is a ``_speedups.KeptSpans``, which holds the spans
themselves in the order they opened and hands Python a ``_speedups.OpenSpan``: the
same names), so either engine can close what the other opened; :func:`close_kept` ends one, and the ones left open
inside it.

A span carries the sticky args in force when it *started* (:func:`sticky_of`,
refreshed once per ``update()``) and its own args, encoded when given
(:class:`~.records.Extra`). Records go to the buffer (:mod:`.buffer`, which also
says who takes them out); its limit is checked where a record is appended: block
mode waits for the consumer there (a KeyboardInterrupt raised meanwhile
propagates), drop mode counts. The styles live above this module: decorated
functions in :mod:`.functions`, generators in :mod:`.generators`, ``.iter``/``.aiter``
in :mod:`.iterators`, ``with`` and start/stop in :mod:`.kept_styles`.

Nesting lives on a :class:`Stack` (a list of the ids of the open spans) that belongs
to one thread, or to one asyncio task. Plain threads find theirs in a
``threading.local`` (one attribute read). Code running inside an event loop finds
its task's stack through a ``ContextVar``; each task gets a stack of its own and a
*track*: a virtual tid, so Perfetto draws concurrent tasks on separate rows instead
of overlapping them on one. Nodes hold no per-call state, so one node can be used
by many threads, tasks and recursive calls at once.
"""

from __future__ import annotations

import functools
import itertools
import threading
import weakref
import sys
from contextvars import ContextVar
from time import perf_counter_ns
from typing import Any, NamedTuple

from .._c_parts import speedups_allowed
from ..format import names as fmt
from . import state as _state
from .buffer import BUFFER, SPECIALS, discard_buffered, room as _room, wait_for_room, wake_consumer
from .nvtx_ranges import close_range as nvtx_close, open_range as nvtx_open
from .records import INCOMPLETE, META, Extra, use_native
from .state import STATE  # also read as engine.STATE where tree.py registers with the C engine

__all__ = ["LOCAL", "Stack", "VTID_BASE", "current_stack", "new_id", "record", "record_special",
           "sticky_of"]

clock = perf_counter_ns
new_id = itertools.count(1).__next__

#: Virtual tids for asyncio tasks start here (real Linux tids stay below 2**22).
VTID_BASE = 0x40000000
_vtids = itertools.count(VTID_BASE + 1)


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
    maps the id of each span opened by ``with``/``start()`` to its :class:`OpenSpan`
    (a dict, or with the C engine a ``KeptSpans``: the same mapping, read in place
    by the C styles)."""

    __slots__ = ("tid", "owner", "open", "__weakref__")

    def __init__(self, tid: int, owner: Any):
        super().__init__((0,))
        self.tid = tid
        self.owner = owner
        self.open: dict[int, OpenSpan] = new_open_map()


class _ThreadLocal(threading.local):
    stk: Stack | None = None  # the stack spans use right now (None: ask resolve())
    thread_stk: Stack | None = None  # this thread's own stack


LOCAL = _ThreadLocal()
TASK_STACK: ContextVar[Stack | None] = ContextVar("dftrace_task_stack", default=None)


#: NVTX ranges are on (``nvtx=True``): each span also opens and closes one (see
#: ``nvtx_ranges``). Off, every span pays one test of this flag.
NVTX_ON = False


def use_nvtx(on: bool) -> None:
    """Open an NVTX range with every span from now on (or stop)."""
    global NVTX_ON
    NVTX_ON = bool(on)
    if speedups is not None:
        speedups.set_nvtx(nvtx_open if on else None, nvtx_close if on else None)

#: Every live thread and task stack, so finalize can tell how many spans are still
#: open on other threads (added once per thread/task, on the slow path).
STACKS: weakref.WeakValueDictionary[int, Stack] = weakref.WeakValueDictionary()


# ---------------------------------------------------------------------------
# The recording primitive (the pure-Python twin of the C engine's ``record``).
# ---------------------------------------------------------------------------

def record(kid: int, t0: int, t1: int, i: int, p: int, lvl: int, tid: int,
           sticky: Extra | None = None, x: Any = None, count: int = -1, flags: int = 0) -> None:
    """Record one span: ``sticky`` are the sticky args in force when it started,
    ``x`` its own args (an :class:`Extra`, or a dict encoded now). At the buffer
    limit, block mode waits for the writer (a KeyboardInterrupt raised meanwhile
    propagates) and drop mode counts."""
    if NVTX_ON:
        nvtx_close(i)
    if len(BUFFER) >= STATE.buffer_limit and not _room():
        STATE._dropped += 1
        return
    try:
        if x is not None and type(x) is not Extra:
            x = to_extra(x)
        if sticky is None:
            frag = x.frag if x is not None else b""
        elif x is None:
            frag = sticky.frag
        elif sticky.mask & x.mask:
            frag = Extra.joined(sticky, x).frag  # type: ignore[union-attr]
        else:
            frag = sticky.frag + x.frag
    except Exception:
        STATE._dropped += 1
        return
    BUFFER.append((kid, t0, t1, i, p, lvl, tid, frag, count, flags))
    n = len(BUFFER)
    if n >= STATE.batch_size and (not STATE.woken or not n & 0xFFF):
        wake_consumer()  # once per batch, then every 4096 records (see the C twin)


def to_extra(x: Any) -> Extra:
    """Args given as a mapping (or a bare value) as an :class:`Extra` (one given
    already encoded, as automatic tracing does, as it is)."""
    if type(x) is Extra:
        return x
    return Extra(x if isinstance(x, dict) else {"value": x})


_ERRORS: dict[str, Extra] = {}


def with_error(extra: Extra | None, exc: BaseException) -> Extra | None:
    """``extra`` plus ``error: <exception type>``, for an ``Exception`` and a task's
    cancellation (``asyncio.CancelledError``); a KeyboardInterrupt is no span's error."""
    if not isinstance(exc, Exception) and not any(c.__name__ == "CancelledError" for c in type(exc).__mro__):
        return extra
    name = type(exc).__name__
    err = _ERRORS.get(name)
    if err is None:
        err = _ERRORS[name] = Extra({"error": name})
    return Extra.joined(extra, err)


def sticky_of(node: Any) -> Extra | None:
    """The sticky args of ``node`` now: its ancestors' then its own, rebuilt once per
    ``update()`` generation (``update`` itself is O(1))."""
    gen = STATE.sgen
    if node._sgen == gen:
        return node._sticky
    if node._pending:
        node._flush_pending()
    parent = node._parent
    s = Extra.joined(sticky_of(parent) if parent is not None else None, node._own)
    node._sticky = s
    node._sgen = gen
    return s


def bump_sticky() -> None:
    """Sticky args changed somewhere: every node refreshes its own on next use."""
    STATE._sgen += 1


def record_special(kind: Any, payload: dict, tid: int | None = None, t_ns: int | None = None) -> None:
    """Record a non-span event (metadata, counter, instant)."""
    if tid is None:
        tid = threading.get_native_id()
    rec = (kind, clock() if t_ns is None else t_ns, new_id(), tid, payload)
    to_ring = STATE.special_to_ring
    if to_ring is not None:
        to_ring(rec)  # writer="process": encoded now, in order with the spans
    else:
        SPECIALS.append(rec)


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
        record_special(META, {"name": fmt.META_THREAD_NAME, "args": {"name": name}}, tid)
    return stk


def install_stack(stk: Stack | None) -> None:
    """Make ``stk`` the stack of the calling thread's next spans (None: the next
    span asks :func:`resolve`). The only way ``LOCAL.stk`` is set: the C engine
    keeps each thread's in a cache that this invalidates."""
    if LOCAL.stk is stk:  # inside an event loop every span asks again: nothing changes
        return
    LOCAL.stk = stk
    if speedups is not None:
        speedups.stacks_changed()


def _current_task(loop: Any) -> Any:
    """asyncio's task running on ``loop``, or None; rebound at the first call to what
    ``asyncio.current_task`` reads, in C (3.12 on: a function; before, a dict's get)."""
    global _current_task
    import asyncio

    tasks = getattr(asyncio.tasks, "_current_tasks", None)
    _current_task = getattr(sys.modules.get("_asyncio"), "current_task", None) or (
        tasks.get if type(tasks) is dict else asyncio.current_task)
    return _current_task(loop)


def resolve() -> Stack:
    """The stack of the calling thread, or of the calling asyncio task (slow path).

    Outside an event loop the thread's stack is installed in ``LOCAL.stk`` so the
    next span takes the fast path. Inside one, ``LOCAL.stk`` stays ``None`` so every
    span comes here and finds its own task's stack.
    """
    loop = _get_running_loop()
    if loop is None:
        stk = _thread_stack()
        install_stack(stk)
        return stk
    if LOCAL.stk is not None:
        install_stack(None)
    task = _current_task(loop)
    if task is None:  # a plain loop callback: the thread's own track
        return _thread_stack()
    stk = TASK_STACK.get()
    if stk is not None and stk.owner is task:
        return stk
    thread_stk = _thread_stack()
    # A new task: its own track and its own nesting (p_idx never crosses tracks).
    vtid = next(_vtids)
    stk = Stack(vtid, task)
    STACKS[id(stk)] = stk
    try:
        tname = task.get_name()
    except Exception:
        tname = "task"
    record_special(META, {"name": fmt.META_THREAD_NAME,
                          "args": {"name": f"{tname} (asyncio, thread {thread_stk.tid})"}}, vtid)
    TASK_STACK.set(stk)
    return stk


def current_stack() -> Stack:
    """The stack spans of the caller nest on (for ``with``/``start``/``iter``)."""
    stk = LOCAL.stk
    if stk is None or _get_running_loop() is not None:
        stk = resolve()
    return stk


def _unwind(stk: Stack, i: int, t: int | None = None) -> None:
    """Remove span ``i`` and anything left above it (spans that never closed), as span
    ``i`` ends at ``t``: the ``start()`` spans among them end then, incomplete (as in a
    ``with`` block: a loop body or a decorated call ending leaves none open to outlive
    it), and so do the loop bodies of ``.iter()`` loops (an exception or a signal left
    their generators suspended; :data:`UNWOUND_BLOCKS` closes them)."""
    try:
        at = stk.index(i)
    except ValueError:
        return
    kept = [j for j in stk[at + 1:] if j in stk.open]
    if kept:
        t = clock() if t is None else t
        for j in reversed(kept):
            STATE.open_spans.pop(j, None)
            close_kept(stk, j, t, incomplete=True)
        try:
            at = stk.index(i)
        except ValueError:
            return
    above = stk[at + 1:]
    del stk[at:]
    if above and UNWOUND_BLOCKS is not None:
        try:
            UNWOUND_BLOCKS(above, clock() if t is None else t)
        except Exception:
            pass


#: ``(ids, t)``: close the ``.iter()`` loop bodies among span ids ``ids`` (just
#: unwound from their stack) at ``t``, incomplete; set by the iterators module.
UNWOUND_BLOCKS: Any = None


def _sticky(node: Any) -> Extra | None:
    return node._sticky if node._sgen == STATE.sgen else sticky_of(node)


# ---------------------------------------------------------------------------
# A span's lifecycle: open_span / close_span, the only place it is written (the
# C engine's twin is span_open / span_close in engine_c/span_lifecycle.h).
# ---------------------------------------------------------------------------

class OpenSpan(NamedTuple):
    """A span from its start to its end: its id and kind, its parent and level, the
    sticky args when it started, who opened it and with which args of its own, and
    t0. The spans ``with`` and ``start()`` open wait in their stack's ``open`` map as
    one of these. Made by :func:`new_open` from a tuple of the fields; with the C
    engine that makes its ``_speedups.OpenSpan`` (the same names, read-only), which
    both engines' closes read."""

    id: int
    kid: int
    parent: int
    level: int
    sticky: Extra | None
    opener: Any
    extra: Any
    t0: int


#: A stack's ``open`` map (with the C engine, its ``_speedups.KeptSpans``).
new_open_map = dict
#: ``new_open((id, kid, parent, level, sticky, opener, extra, t0))``: an OpenSpan
#: (a tuple made in C, not through a Python ``__new__``).
new_open = functools.partial(tuple.__new__, OpenSpan)


def open_span(stk: Stack, node: Any, kid: int, opener: Any = None, extra: Any = None,
              push: bool = True, pairs: bool = True, keep: bool = False,
              t0: int | None = None) -> OpenSpan:
    """Open a span of kind ``kid`` for ``node`` on ``stk``: a new id, the top of the
    stack as its parent, the depth as its level, the node's sticky args now. ``push``:
    it nests (spans opened meanwhile are its children; a generator's does not);
    ``keep``: it waits in ``stk.open`` (``with``, ``start()``); ``pairs``: it closes
    after the spans opened inside it (for NVTX). t0 is ``t0``, or the clock, read
    last."""
    i = new_id()
    p = stk[-1]
    lvl = len(stk)
    sticky = _sticky(node)
    if push:
        stk.append(i)
    if NVTX_ON:
        nvtx_open(kid, i, stk, pairs)
    s = new_open((i, kid, p, lvl, sticky, opener, extra, clock() if t0 is None else t0))
    if keep:
        stk.open[i] = s
    return s


def close_span(stk: Stack, s: OpenSpan, t1: int, x: Any = None,
               error: BaseException | None = None, count: int = -1, incomplete: bool = False,
               pushed: bool = True, recorded: bool = True) -> None:
    """Close span ``s`` at ``t1`` and record it with args ``x`` (an Extra, a dict or
    None), tagged ``error: <type>`` when ``error`` is given (an ``Exception``),
    ``count`` (-1: none) and flagged ``incomplete``. ``pushed``: it is on ``stk``,
    popped here with anything left above it; else (a generator's) it is recorded
    where it started if it nests there, else on a track of its own. ``recorded``
    False: it ended without a record (an iterator's end)."""
    i = s.id
    p = s.parent
    lvl = s.level
    if pushed:
        if stk and stk[-1] == i:
            stk.pop()
        else:
            _unwind(stk, i, t1)
    elif not _nests(stk, p, lvl):
        stk, p, lvl = _side_stack(stk), 0, 1
    if not recorded:
        if NVTX_ON:
            nvtx_close(i)
        return
    if error is not None:
        x = with_error(x, error)
    record(s.kid, s.t0, t1, i, p, lvl, stk.tid, s.sticky, x, count, INCOMPLETE if incomplete else 0)


def close_ended(stk: Stack, s: OpenSpan, extra: Any, capture: Any, params: Any,
                  error: BaseException | None, pushed: bool = True) -> None:
    """Close the span ``s`` of a call that ended by raising ``error`` (None: without
    one, an async generator's): ``args.error``, or what the capture spec makes of it."""
    if capture is None:
        close_span(stk, s, clock(), extra, error, pushed=pushed)
    else:
        close_span(stk, s, clock(), capture.extra(extra, params, error=error), pushed=pushed)


def close_returned(stk: Stack, s: OpenSpan, extra: Any, capture: Any, params: Any,
                   result: Any, pushed: bool = True) -> None:
    """Close the span ``s`` of a call that returned ``result``: the use's args, or
    what the capture spec makes of them, the arguments and the result."""
    close_span(stk, s, clock(), extra if capture is None else capture.extra(extra, params, result),
               pushed=pushed)


def _side_stack(stk: Stack) -> Stack:
    """A track of its own for a span that does not nest where it started (a
    generator finishing inside a block opened after it started)."""
    vtid = next(_vtids)
    side = Stack(vtid, None)
    record_special(META, {"name": fmt.META_THREAD_NAME,
                          "args": {"name": f"generators (thread {stk.tid})"}}, vtid)
    return side


def _nests(stk: Stack, p: int, lvl: int) -> bool:
    """True when a span that started at (parent ``p``, level ``lvl``) on ``stk`` and
    is not on it can end now without crossing another span: its parent is still open
    below it and nothing opened since is still open."""
    return len(stk) == lvl and stk[-1] == p


# ---------------------------------------------------------------------------
# Kept spans (``with``, ``start()``; their styles are in kept_styles): the span
# waits in the stack's ``open`` map, as an OpenSpan under its id, until its end
# (``close_kept``).
# ---------------------------------------------------------------------------

def open_kept(stk: Stack, obj: Any) -> OpenSpan:
    """Open a span of ``obj`` (a node or a use) on ``stk``, kept in ``stk.open``."""
    node = obj._node
    return open_span(stk, node, node._kid, obj, obj._extra, keep=True)


def close_kept(stk: Stack, i: int, t1: int, x: Any = None, error: BaseException | None = None,
               incomplete: bool = False) -> None:
    """Close span ``i``, kept in ``stk.open`` (``with``, ``start()``), at ``t1`` with
    args ``x`` (None: its opener's own). Spans opened inside it and still open (a
    start() whose stop never came) end here too, flagged incomplete, so nesting
    stays valid (:func:`_unwind`)."""
    s = stk.open.pop(i, None)
    if s is None:
        return
    close_span(stk, s, t1, s.extra if x is None else x, error, incomplete=incomplete)


def record_finished(kid: int, t0: int, t1: int, args: Any = None, sticky: Any = None,
                    tid: int | None = None, incomplete: bool = False) -> None:
    """A span that already ended, given by its times: inside the caller's open span,
    or at the top of track ``tid`` (DFTracer's ``log_event``, completions of
    asynchronous work); ``incomplete``: it had not ended when it was written."""
    flags = INCOMPLETE if incomplete else 0
    if tid is None:
        stk = current_stack()
        record(kid, t0, t1, new_id(), stk[-1], len(stk), stk.tid, sticky, args or None, -1, flags)
    else:
        record(kid, t0, t1, new_id(), 0, 1, tid, sticky, args or None, -1, flags)


def new_track(name: str) -> int:
    """A virtual tid for spans that run beside the threads (a track of its own)."""
    tid = next(_vtids)
    record_special(META, {"name": fmt.META_THREAD_NAME, "args": {"name": name}}, tid)
    return tid


def restick_open(node: Any) -> None:
    """Give the spans of ``node`` open on the caller's stack the sticky args in force
    now (DFTracer's ``dft_fn.update`` inside its own ``with`` block)."""
    try:
        stk = current_stack()
        sticky = sticky_of(node)
        for j, s in list(stk.open.items()):
            if s.opener._node is node:
                stk.open[j] = new_open((s.id, s.kid, s.parent, s.level, sticky, s.opener,
                                        s.extra, s.t0))
    except Exception:
        pass


def cm_open(opener: Any) -> Stack:
    """Open a ``with`` span on the caller's stack whose opener is ``opener``
    (anything with ``_node`` and ``_extra``: a capturing use's per-call scope)."""
    stk = current_stack()
    open_kept(stk, opener)
    return stk


def cm_find(match: Any) -> tuple[Stack, int, Any] | None:
    """The innermost open ``with`` span on the caller's stack whose opener satisfies
    ``match``, as ``(stack, id, opener)``; None when there is none."""
    stk = current_stack()
    for j in reversed(stk):
        s = stk.open.get(j)
        if s is not None and match(s.opener):
            return stk, j, s.opener
    return None


def cm_close(stk: Stack, i: int, t1: int, x: Any) -> None:
    """Close span ``i`` (from :func:`cm_open`) at ``t1`` with args ``x``."""
    close_kept(stk, i, t1, x)


def _clocks_agree(native_clock: Any, tries: int = 5) -> bool:
    """True when the C engine's clock reads between two reads of :data:`clock`, within
    a millisecond. A thread preempted between the reads (a loaded machine, a program
    run under valgrind) makes one try fail, not the check: any of ``tries`` passing
    is enough, while clocks that truly differ fail every try."""
    for _ in range(tries):
        before = clock()
        native = native_clock()
        after = clock()
        if before - 1_000_000 <= native <= after + 1_000_000:
            return True
    return False


def _load_speedups() -> Any:
    """The C engine, when it was built, uses the same clock, and
    ``DFTRACE_NO_SPEEDUPS`` is not set; else None (pure Python)."""
    if not speedups_allowed():
        return None
    try:
        from . import _speedups as mod
    except ImportError:
        from .source_tree import say_if_a_source_tree_shadows_the_engine

        say_if_a_source_tree_shadows_the_engine()
        return None
    # Spans mix both clocks (C wrappers, Python context managers): they must agree.
    if not _clocks_agree(mod.clock_ns):
        return None
    mod.register(local=LOCAL, resolve=resolve, wait_room=wait_for_room, wake=wake_consumer,
                 unwind=_unwind, with_error=with_error, merge=Extra.joined, to_extra=to_extra,
                 sticky_of=sticky_of, extra_type=Extra, task_stack=TASK_STACK)
    mod.set_limits(STATE._batch_size, STATE._buffer_limit, STATE._drop_when_full)
    use_native(mod.add_kind, mod.plain_fragment)
    return mod


speedups = _load_speedups()
if speedups is not None:
    record = speedups.record  # noqa: F811 - the C twin of the function above
    new_open = speedups.OpenSpan  # noqa: F811 - kept spans the C styles read in place
    new_open_map = speedups.KeptSpans  # noqa: F811 - the kept spans themselves, in C
    new_id = speedups.new_id  # noqa: F811 - one id counter for both engines' paths
    bump_sticky = speedups.bump_sticky_gen  # noqa: F811
_state.bind_native(speedups)


def _forget_parent() -> None:
    # Only the forking thread lives on in the child: give it a fresh stack so no
    # span of the parent is anyone's parent here.
    install_stack(None)
    LOCAL.thread_stk = None
    TASK_STACK.set(None)
    if speedups is not None:
        speedups.after_fork()
        speedups.shm_detach()  # the parent's shared-memory ring is never written here
    discard_buffered()
    STACKS.clear()


def _reset() -> None:
    use_nvtx(False)
    if speedups is not None:
        speedups.shm_detach()
    install_stack(None)
    LOCAL.thread_stk = None
    TASK_STACK.set(None)
    discard_buffered()


STATE.on_fork(_forget_parent)
STATE.on_reset(_reset)
