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
A span on a thread's own stack that closes where it opened (a decorated function,
``with``, ``.iter()``) pushes; a span that may close on another thread or across
``await``s (``start()``/``stop()``, spans of asyncio tasks, generator spans) starts a
range. The ids of a thread's pushed ranges are kept in the order pushed, which is
its span stack: a span that closes while spans opened after it are still open (an
exit out of order, a span never closed) pops theirs too, as the engine unwinds them
from its stack, so a thread's NVTX nesting always matches its spans. A pushed span
closed from another thread (no program of ours does that) cannot be popped there:
its range ends when the span below it ends.
"""

from __future__ import annotations

import threading
from typing import Any

from .records import kind_names

__all__ = ["INSTALL", "load", "open_range", "close_range"]

#: How to get the NVTX client.
INSTALL = "pip install 'dftrace[nvtx]'"


class _Pushed(threading.local):
    ids: list[Any] | None = None  # span ids whose push range this thread has open


_pushed = _Pushed()
#: Span id -> NVTX range id of the start/end ranges open now (any thread).
_started: dict[Any, int] = {}
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
            for k in range(len(_attrs), kid + 1):
                name, cat = names.get(k, ("?", "?"))
                _attrs.append(_domain.get_event_attributes(message=f"{cat}.{name}"))
        return _attrs[kid]


def open_range(kid: int, i: Any, stk: Any, pairs: bool) -> None:
    """Span ``i`` of kind ``kid`` opened on stack ``stk``. ``pairs``: it closes on
    this thread, after the spans opened inside it (decorator, ``with``, ``.iter``);
    it pushes a range where ``stk`` is the thread's own, else it starts one."""
    try:
        a = _attrs[kid] if kid < len(_attrs) else _attributes(kid)
        if pairs and stk.owner is None:
            ids = _pushed.ids
            if ids is None:
                ids = _pushed.ids = []
            _domain.push_range(a)
            ids.append(i)
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
        if not ids:
            return
        if ids[-1] == i:
            ids.pop()
            _domain.pop_range()
            return
        k = len(ids) - 2
        while k >= 0 and ids[k] != i:
            k -= 1
        if k < 0:
            return  # not pushed on this thread
        for _ in range(len(ids) - k):  # it and the ranges left open above it
            _domain.pop_range()
        del ids[k:]
    except Exception:
        pass
