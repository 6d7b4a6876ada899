"""The kept styles, whose span outlives the call that opened it: ``with node:`` and
``node.start()`` / ``node.stop()`` (with its token, :class:`Span`).

Such a span waits in its stack's ``open`` map, as an OpenSpan under its id, until
its end (:func:`~.engine.open_kept` / :func:`~.engine.close_kept`). ``cm_enter`` and
``cm_exit`` are installed directly as a node's ``__enter__``/``__exit__`` by the
pure-Python engine; the C engine's ``TraceableBase`` has its own and calls
``cm_exit`` for all but the common case. The spans ``start()`` opens are also listed,
process-wide, in ``STATE.open_spans`` (id -> stack): ``max_open_spans`` bounds it and
finalize ends what is left in it (:func:`close_all_open`).
"""

from __future__ import annotations

from typing import Any

from . import engine as _engine
from .engine import (LOCAL, STATE, Stack, clock, close_kept, current_stack, open_kept,
                     record_special, resolve, speedups, to_extra)
from .records import META, Extra

__all__ = ["Span", "close_all_open", "cm_enter", "cm_exit", "record_cm", "start", "stop"]


def cm_enter(self: Any) -> Any:
    """``with node:`` (or a use): open its span on the caller's stack, kept there."""
    if self._on:
        try:
            stk = LOCAL.stk
            if stk is None or _engine._get_running_loop() is not None:
                stk = resolve()
            open_kept(stk, self)
        except Exception:
            pass
    return self


def cm_exit(self: Any, et: Any, ev: Any, tb: Any) -> bool:
    """The end of ``with node:``: close the innermost span it kept on the caller's
    stack, tagged with the exception that ended the block (never suppressed)."""
    t1 = clock()
    try:
        stk = LOCAL.stk
        if stk is None or _engine._get_running_loop() is not None:
            if not self._on and not STATE.open_spans and LOCAL.thread_stk is None:
                return False
            stk = resolve()
        if not stk.open:
            return False
        i = stk[-1]
        s = stk.open.get(i)
        if s is None or s.opener is not self:
            i = 0
            for j in reversed(stk):  # not the innermost: an exit out of order
                s = stk.open.get(j)
                if s is not None and s.opener is self:
                    i = j
                    break
            if not i:
                return False
        close_kept(stk, i, t1, error=ev)
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
    if stk is None or _engine._get_running_loop() is not None:
        stk = resolve()
    i = open_kept(stk, obj).id
    STATE.open_spans[i] = stk
    return stk, i


def _find_open(obj: Any) -> tuple[Stack, int] | None:
    # Prefer the innermost open span of obj on the caller's own stack ...
    opened = STATE.open_spans
    stk = current_stack()
    for j in reversed(stk):
        s = stk.open.get(j)
        if s is not None and s.opener is obj and j in opened:
            return stk, j
    # ... else the most recent one anywhere (a hook called from another thread).
    for j in sorted(opened, reverse=True):
        stk = opened.get(j)
        if stk is not None:
            s = stk.open.get(j)
            if s is not None and s.opener is obj:
                return stk, j
    return None


def stop(obj: Any, token: tuple[Stack, int] | None = None,
         args: dict[str, Any] | None = None) -> bool:
    """Close a span opened by ``start``. Spans started inside it with ``start`` and
    still open are closed too, flagged ``incomplete``. ``args`` (known only now) join
    the span's own; they are encoded here, so later changes to them are not written.
    False when nothing was open."""
    t1 = clock()
    if token is None:
        token = _find_open(obj)
        if token is None:
            return False
    stk, i = token
    if STATE.open_spans.pop(i, None) is None:
        return False
    x = None
    if args:
        s = stk.open.get(i)
        x = Extra.joined(s.extra if s is not None else None, to_extra(args))
    close_kept(stk, i, t1, x)
    return True


def close_all_open(t1: int | None = None) -> int:
    """At finalize: close every span still open from ``start`` as incomplete, at
    ``t1`` (None: now)."""
    t1 = clock() if t1 is None else t1
    n = 0
    for i in sorted(STATE.open_spans, reverse=True):
        stk = STATE.open_spans.pop(i, None)
        if stk is not None:
            close_kept(stk, i, t1, incomplete=True)
            n += 1
    return n


def record_cm(name: str) -> None:
    """Metadata mode: a ``CM`` event ``<name>`` whose value is the current time (µs)."""
    stk = current_stack()
    record_special(META, {"name": "CM", "args": {"name": name}, "ts_value": True}, stk.tid)


# With the C engine, ``Span.stop`` comes from its base class.
_SpanBase: type = speedups.SpanBase if speedups is not None else object


class Span(_SpanBase):  # type: ignore[misc,valid-type]
    """Token returned by ``start()``; ``stop()`` it (or pass it to ``node.stop``)."""

    # What started it, and (while it is open) its stack and id: start()'s token
    # (stack, id), in two slots, so that the C engine's start() builds no tuple.
    __slots__ = ("_obj", "_stk", "_id")

    def __init__(self, obj: Any, token: tuple | None):
        self._obj = obj
        self._stk, self._id = token if token is not None else (None, None)

    @property
    def id(self) -> int | None:
        """The span's event id in the trace (None when nothing was recorded)."""
        return self._id if self._stk is not None else None

    def _stop_py(self, args: dict[str, Any] | None = None) -> None:
        """Close this span (safe to call twice). ``args`` known only at the end
        (output shapes, bytes written) are added to the span's args, encoded now."""
        if self._stk is not None and self._obj is not None:
            try:
                stop(self._obj, (self._stk, self._id), args)  # the module's stop()
            except Exception:
                pass
            self._stk = self._id = None

    if _SpanBase is object:
        stop = _stop_py

    def __enter__(self) -> Span:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<dftrace.Span id={self.id}>"


#: The Span returned when nothing is recorded.
NO_SPAN = Span(None, None)

if speedups is not None:
    speedups.register(slow_exit=cm_exit)
