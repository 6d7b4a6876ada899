"""The spans still open when finalize runs: the stacks finalize stands on (they cannot
move while it runs), the calls that closing their spans unwinds, the grace given to
other threads' spans, and writing (from the ring's open-span table) or counting
(``dropped``, reason ``late``) what is left."""

from __future__ import annotations

import sys
import time
from typing import Any

from . import engine as _engine, iterators as _iterators
from .drain.process_writer import ProcessWriter
from .records import Extra

__all__ = ["LATE_GRACE_S", "calls_unwound", "late_spans", "stacks_stuck_here"]


#: How long finalize waits for spans still open on other threads: those that end
#: in time are written, the rest are counted in a ``dropped`` line (reason "late").
LATE_GRACE_S = 0.2


def stacks_stuck_here() -> set[int]:
    """Stacks that cannot move while this thread is in finalize: its own, and
    those of the tasks of the event loop it runs (if any)."""
    out = set()
    own = _engine.LOCAL.thread_stk
    if own is not None:
        out.add(id(own))
    loop = _engine._get_running_loop()
    if loop is not None:
        for stk in list(_engine.STACKS.values()):
            try:
                if stk.owner is not None and stk.owner.get_loop() is loop:
                    out.add(id(stk))
            except Exception:
                pass
    return out


def _open_span_count(exclude: set[int] = frozenset(),  # type: ignore[assignment]
                     written: set[int] = frozenset()) -> int:  # type: ignore[assignment]
    """Spans open on the stacks but those ``exclude`` names, less those ``written``."""
    # Every stack starts with one root link; the rest are ids of open spans.
    stacks = [stk for stk in list(_engine.STACKS.values()) if id(stk) not in exclude]
    if written:
        return sum(1 for stk in stacks for i in stk[1:] if i not in written)
    return sum(len(stk) - 1 for stk in stacks)


def late_spans(writer: Any, deadline: float, here: set[int], t_here: int,
               unwound: set[int]) -> int:
    """How many spans will end too late for the file, or never. Spans still open on
    other threads get LATE_GRACE_S (not past ``deadline``) to end and be written. Then,
    where something is left (``unwound`` calls included, see :func:`calls_unwound`),
    the default writer writes what the ring's open-span table holds, incomplete,
    ending now (those of this thread's tracks ``here`` at ``t_here``, when the others
    of its tracks ended); the rest are counted."""
    stuck = stacks_stuck_here()
    until = min(deadline, time.monotonic() + LATE_GRACE_S)
    while _open_span_count(stuck) and time.monotonic() < until:
        time.sleep(0.005)
    late = _open_span_count()
    if not (late or unwound):
        return 0
    if not isinstance(writer, ProcessWriter):
        return late + len(unwound)
    written = writer.end_open_spans(_engine.clock(), here, t_here, _kept_args())
    return _open_span_count(written=written) + len(unwound - written)


def _kept_args() -> dict[int, bytes]:
    """The args of each span a ``with`` or ``start()`` keeps open, by id, as its end
    would write them: its sticky args, then its own (the open-span table has no room
    for args; a decorated call's span is written without them); and automatic
    tracing's open backward and optimizer step, this step's args."""
    out: dict[int, bytes] = _open_in_step()
    for stk in list(_engine.STACKS.values()):
        try:
            for i, s in stk.open.items():
                own = s.extra if s.extra is None or isinstance(s.extra, Extra) else _engine.to_extra(s.extra)
                x = Extra.joined(s.sticky, own)
                if x is not None and x.frag:
                    out[i] = x.frag
        except Exception:
            continue
    return out


def _open_in_step() -> dict[int, bytes]:
    """Automatic tracing's spans open now that end with its step's args (C engine)."""
    state = getattr(sys.modules.get("dftrace.torch._auto"), "STATE", None)
    try:
        ids = getattr(state, "open_in_step", None)
        frag = _engine.to_extra(state.position).frag if ids else None
        return {i: frag for i in ids} if frag else {}
    except Exception:
        return {}


def calls_unwound(closing: list[tuple[_engine.Stack, int]]) -> set[int]:
    """The spans that closing each ``(stack, id)`` takes off its stack unwritten:
    calls of decorated functions running inside it (a closed ``with`` or ``start()``
    span unwinds what is above it; loop bodies among them are written). On the
    stacks finalize stands on they never end: each is written from the ring's
    table, or counted."""
    if not closing:
        return set()
    by_stack: dict[int, tuple[_engine.Stack, set[int]]] = {}
    for stk, i in closing:
        by_stack.setdefault(id(stk), (stk, set()))[1].add(i)
    blocks = _iterators.open_block_kinds()
    out: set[int] = set()
    for stk, closed in by_stack.values():
        ids = list(stk)
        at = next((k for k, i in enumerate(ids) if i in closed), None)
        if at is not None:  # the lowest span closed: all above it leave the stack
            out.update(i for i in ids[at + 1:] if i not in stk.open and i not in blocks)
    return out
