"""Capturing uses: what ``node(capture=..., capture_result=...)`` returns.

As a decorator a capturing use records each call's arguments (bound by the
signature) and return value as summaries under ``args.params`` / ``args.result``; as
a ``with`` block it records variables of the enclosing code; with ``.iter()`` each
item. Summaries never hold a reference to the value (see :mod:`.values`).

Importing this module is cheap: the value summaries load on the first capturing use.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .._core import tree as _tree
from .._core import engine as _engine
from .._core import iterators as _iterators
from .._core.tree import Use

if TYPE_CHECKING:
    from .binding import CaptureOptions

__all__ = ["CallScope", "CapturingUse"]

_NOTHING: Any = None  # binding._NOTHING, once loaded


def _binding() -> Any:
    global _NOTHING
    from . import binding

    _NOTHING = binding._NOTHING
    return binding


class CallScope:
    """What ``with node(capture=...) as call:`` binds: one call's record, open until
    the block ends. Values given here are summarised at once (none is kept)."""

    __slots__ = ("_use", "_node", "_extra", "_params", "_result", "_snapshot")

    def __init__(self, use: CapturingUse, params: dict[str, Any] | None):
        self._use = use
        self._node = use._node  # the recorder names the span after it
        self._extra = None
        self._params = params
        self._result: Any = _NOTHING
        self._snapshot: dict[str, int] | None = None

    def capture(self, **values: Any) -> None:
        """Record more parameters of this call: ``call.capture(batch=batch)``."""
        try:
            max_len = _tree._max_arg_length
            params = dict(self._params or {})
            for k, v in values.items():
                params[k] = self._use._capture.describe(v, max_len)
            self._params = params
        except Exception:
            pass

    def set_result(self, value: Any) -> None:
        """Record ``value`` as this call's result (replaces an automatic one)."""
        try:
            self._result = self._use._capture.describe(value, _tree._max_arg_length)
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"<dftrace call scope of {self._node.path}>"


class _NullScope:
    """The scope of a ``with`` that records nothing (tracing off): same methods."""

    __slots__ = ()

    def capture(self, **values: Any) -> None:
        """Nothing is recorded while this node is off."""

    def set_result(self, value: Any) -> None:
        """Nothing is recorded while this node is off."""

    def __repr__(self) -> str:
        return "<dftrace call scope (not recording)>"


_NULL_SCOPE = _NullScope()


def _snapshot(frame: Any) -> dict[str, int]:
    # Identities only: holding the values would keep them alive past the block.
    return {k: id(v) for k, v in list(frame.f_locals.items())}


def _assigned(frame: Any, before: dict[str, int], opts: CaptureOptions, max_len: int) -> Any:
    """The variables a ``with`` block bound or rebound, summarised; _NOTHING if none."""
    out: dict[str, Any] = {}
    for k, v in list(frame.f_locals.items()):
        if (k.startswith("_") or before.get(k) == id(v)
                or isinstance(v, (CallScope, _NullScope))):
            continue
        out[k] = opts.describe(v, max_len)
        if len(out) >= 16:
            break
    return out if out else _NOTHING


def _is_scope_of(use: CapturingUse) -> Any:
    return lambda o: type(o) is CallScope and o._use is use


class CapturingUse(Use):
    """A use that records the values going through it (``node(capture=...)``).

    * decorator: the call's arguments under ``args.params`` (by parameter name,
      defaults applied; ``capture=True`` means all but ``self``/``cls``) and, with
      ``capture_result=True``, its return value under ``args.result``;
    * ``with ... as call``: the variables named in ``capture`` as the block starts
      (``capture=True``: the arguments of the enclosing function); with
      ``capture_result=True`` the variables the block assigned; ``call.capture(...)``
      and ``call.set_result(...)`` add values by hand;
    * ``.iter()`` with ``capture_result=True``: each item under the ``<leaf>.iter``
      span's ``args.result``.

    ``capture_hash=True`` adds a deterministic content hash to tensor and array
    summaries. Summaries never hold a reference to the value.
    """

    __slots__ = ("_capture",)

    def __init__(self, node: Any, args: dict[str, Any] | None = None,
                 enable: bool | None = None, capture: Any = None,
                 capture_result: bool = False, capture_hash: bool = False, **unknown: Any):
        super().__init__(node, args, enable, **unknown)
        self._capture = _binding().CaptureOptions(capture, capture_result, capture_hash)

    def _merge_options(self, options: dict[str, Any]) -> dict[str, Any]:
        return {**self._capture.as_options(), **super()._merge_options(options)}

    # -- with ------------------------------------------------------------------------
    def _enter(self, frame: Any) -> Any:
        if not self._on:
            return _NULL_SCOPE
        try:
            opts = self._capture
            max_len = _tree._max_arg_length
            scope = CallScope(self, opts.frame_params(frame, max_len))
            if opts.result:
                scope._snapshot = _snapshot(frame)
            # Plain dicts here: if the span is never closed, the core flags it
            # incomplete by re-reading these args as a dict.
            scope._extra = opts.extra(self._extra, scope._params, max_len, compact=False)
            _engine.cm_open(scope)
            return scope
        except Exception:
            return _NULL_SCOPE

    def _exit(self, t1: int, frame: Any, ev: Any) -> None:
        try:
            if not self._on and _engine.LOCAL.thread_stk is None:
                return  # nothing was ever opened on this thread: do not make a stack
            found = _engine.cm_find(_is_scope_of(self))
            if found is None:
                return
            stk, i, scope = found
            opts = self._capture
            max_len = _tree._max_arg_length
            result = scope._result
            if result is _NOTHING and scope._snapshot is not None:
                result = _assigned(frame, scope._snapshot, opts, max_len)
            error = ev if isinstance(ev, BaseException) else None
            x = opts.extra(self._extra, scope._params, max_len, result, error, summarized=True)
            _engine.cm_close(stk, i, t1, x)
        except Exception:
            pass

    def __enter__(self) -> Any:
        return self._enter(sys._getframe(1))

    def __exit__(self, et: Any, ev: Any, tb: Any) -> bool:
        t1 = _engine.clock()
        self._exit(t1, sys._getframe(1), ev)
        return False

    async def __aenter__(self) -> Any:
        return self._enter(sys._getframe(1))

    async def __aexit__(self, et: Any, ev: Any, tb: Any) -> bool:
        t1 = _engine.clock()
        self._exit(t1, sys._getframe(1), ev)
        return False

    # -- iterators ----------------------------------------------------------------------
    def iter(self, iterable: Iterable[Any]) -> Any:
        """:meth:`Node.iter`; with ``capture_result=True`` each item is recorded as
        the result of its ``<leaf>.iter`` span."""
        if not self._capture.result:
            return super().iter(iterable)
        if _tree._max_items is not None:
            iterable = itertools.islice(iterable, _tree._max_items)
        gate = self._gate()
        if _tree._off_for_good or gate is None or not gate._on:
            return iterable
        return _iterators.iterate(self, gate, iterable, self._capture.for_items())

    def __repr__(self) -> str:
        extra = self._extra.args if self._extra else {}
        return (f"<dftrace use of {self._node.path} args={extra!r} enable={self._forced!r} "
                f"{self._capture!r}>")



_tree.register_capturing_use(CapturingUse)
