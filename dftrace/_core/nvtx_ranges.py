"""NVTX ranges for Nsight Systems (``nvtx=True``, ``DFTRACE_NVTX=1``): every span also
opens an NVTX range named ``<cat>.<name>`` (``compute.forward``), so Nsight shows the
``ai`` tree above the CUDA kernels.

Both engines call :func:`open_range` where a span opens and :func:`close_range` where
it is recorded, behind one flag (``engine.NVTX_ON``, ``nvtx_on`` in the C engine):
off, a span pays one predictable branch and nothing is called. The ranges go through
NVIDIA's ``nvtx`` package (``pip install 'dftrace[nvtx]'``), in NVTX's default domain,
with one registered string per event kind.

NVTX has two kinds of ranges. Push/pop ranges nest on a stack of their thread and
must be popped by that thread; start/end ranges end anywhere and nest with nothing.
A span on a thread's own stack (a decorated function, ``with``, ``.iter()``,
``start()``) pushes; a span of an asyncio task (tasks take turns on one thread) or a
generator span (its consumer runs in between) starts a range. The ids of a thread's
pushed ranges are kept in the order pushed, which is its span stack: a span that
closes while spans opened after it are still open (an exit out of order, a span never
closed) pops theirs too, as the engine unwinds them from its stack, so a thread's NVTX
nesting always matches its spans. A pushed span closed by another thread (a
``stop()`` called there) cannot be popped there: its range, and those above it, end
when the thread that opened it next opens or closes a span.
"""

from __future__ import annotations

import threading
from typing import Any

from .records import kind_names

__all__ = ["load", "open_range", "close_range"]


class _Pushed(threading.local):
    ids: list[Any] | None = None  # span ids whose push range this thread has open


_pushed = _Pushed()
#: Span id -> NVTX range id of the start/end ranges open now (any thread).
_started: dict[Any, int] = {}
#: Ids of the push ranges open now (all threads), and those of them closed by a
#: thread other than the one that pushed them, left for that one to pop.
_pushed_all: set[Any] = set()
_stray: set[Any] = set()
#: The event attributes of each event kind (by kind id), made on first use.
_attrs: list[Any] = []
_attrs_lock = threading.Lock()
_domain: Any = None


def load() -> bool:
    """Ready the NVTX client: True when a tool (Nsight Systems, or any library named
    by ``NVTX_INJECTION64_PATH``) receives the ranges; False when none is attached
    (the program runs outside Nsight: ranges would go nowhere, so none are made).
    Raises ImportError when the ``nvtx`` package is missing."""
    global _domain
    import nvtx

    domain = nvtx.get_domain() if nvtx.enabled() else None
    if not isinstance(domain, nvtx.Domain):  # no tool: the package's do-nothing domain
        return False
    if domain is not _domain:
        with _attrs_lock:
            _attrs.clear()
        _domain = domain
    return True


def _attributes(kid: int) -> Any:
    """The event attributes of kind ``kid``: its ``<cat>.<name>``, registered once."""
    with _attrs_lock:
        if kid >= len(_attrs):
            names = kind_names()
            if kid not in names:
                raise KeyError(kid)
            for k in range(len(_attrs), kid + 1):
                name, cat = names.get(k, ("?", "?"))
                _attrs.append(_domain.get_event_attributes(message=f"{cat}.{name}"))
        return _attrs[kid]


def _pop_from(ids: list[Any], k: int) -> None:
    """Pop this thread's push ranges from the ``k``-th on (``ids``: this thread's)."""
    for j in ids[k:]:
        _pushed_all.discard(j)
        _stray.discard(j)
        _domain.pop_range()
    del ids[k:]


def _settle() -> None:
    """Pop this thread's ranges that other threads closed (and those above them)."""
    ids = _pushed.ids
    if ids:
        for k, j in enumerate(ids):
            if j in _stray:
                _pop_from(ids, k)
                return


def open_range(kid: int, i: Any, stk: Any, pairs: bool) -> None:
    """Span ``i`` of kind ``kid`` opened on stack ``stk``. ``pairs``: it closes after
    the spans opened inside it (not a generator's or an async function's span); it
    pushes a range where ``stk`` is the thread's own, else it starts one."""
    try:
        if _stray:
            _settle()
        a = _attrs[kid] if kid < len(_attrs) else _attributes(kid)
        if pairs and stk.owner is None:
            ids = _pushed.ids
            if ids is None:
                ids = _pushed.ids = []
            _domain.push_range(a)
            ids.append(i)
            _pushed_all.add(i)
        else:
            _started[i] = _domain.start_range(a)
    except Exception:
        pass


def close_range(i: Any) -> None:
    """Span ``i`` closed (any span recorded: those that opened no range pass)."""
    try:
        r = _started.pop(i, None)
        if r is not None:
            _domain.end_range(r)
            return
        ids = _pushed.ids
        if ids and ids[-1] == i:
            ids.pop()
            _pushed_all.discard(i)
            _domain.pop_range()
        elif i in _pushed_all:
            k = len(ids) - 2 if ids else -1
            while k >= 0 and ids[k] != i:
                k -= 1
            if k >= 0:
                _pop_from(ids, k)  # it and the ranges left open above it
            else:
                _stray.add(i)  # pushed by another thread: popped there
        if _stray:
            _settle()
    except Exception:
        pass
