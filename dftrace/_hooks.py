"""Span bookkeeping shared by the hook-driven integrations (``dftrace.torch``,
``dftrace.lightning``, ``dftrace.transformers``, ``dftrace.keras``, ``dftrace.tensorflow``).

Frameworks call hooks in pairs (``on_X_start`` / ``on_X_end``) that may never both
run: an exception skips the closing hook. :class:`OpenSpans` keeps the tokens an
integration opened, keyed by what they stand for, so a closing hook finds its span,
a repeated opening hook closes the dangling one first (flagged incomplete), and an
error path closes everything still open. :func:`guarded` makes a hook body unable to
raise into the framework that called it. Nothing here imports torch.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
from typing import Any, Callable, TypeVar

from ._core import lifecycle as _lifecycle
from ._core.engine import clock
from ._core.state import STATE
from ._core.tree import Node, Span

__all__ = ["OpenSpans", "Wait", "add_callback", "bytes_at", "call_in_span", "error_args", "guarded", "warn_once"]

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R")


def warn_once(key: str, message: str) -> None:
    """A ``RuntimeWarning`` the first time ``key`` is seen in this process."""
    STATE.warn_once(key, message)


def guarded(fn: F) -> F:
    """Wrap a hook so an error inside it is reported once and swallowed: tracing
    must never break the training loop that called the hook. Returns None then."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            warn_once(fn.__qualname__, f"{fn.__qualname__} failed and was skipped: {exc!r}")
            return None

    return wrapper  # type: ignore[return-value]


def bytes_at(path: Any) -> dict[str, Any] | None:
    """``{"bytes": N}``: the size of a file a checkpoint wrote, or of a directory's
    files (sharded checkpoints); None where it cannot be read."""
    try:
        p = os.fspath(path)
        if os.path.isdir(p):
            return {"bytes": sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(p) for f in files)}
        return {"bytes": os.path.getsize(p)}
    except Exception:
        return None


def error_args(args: dict[str, Any] | None, exc: BaseException) -> dict[str, Any] | None:
    """``args`` plus ``error: <type>`` when ``exc`` is an ``Exception`` (the rule of
    every span: a KeyboardInterrupt or SystemExit ending a span is no error of it)."""
    if not isinstance(exc, Exception):
        return args
    return {**(args or {}), "error": type(exc).__name__}


def call_in_span(node: Node, fn: Callable[..., R], a: tuple = (), kw: dict[str, Any] | None = None,
                 args: dict[str, Any] | None = None,
                 after: Callable[[Any], dict[str, Any] | None] | None = None) -> R:
    """``fn(*a, **kw)`` as one span of ``node``: ``args`` known before the call, plus
    ``after(result)`` computed once it returned; an exception is tagged by
    :func:`error_args`. The call's result or exception reaches the caller unchanged."""
    if not node._on:
        return fn(*a, **(kw or {}))
    span = node.start()
    try:
        out = fn(*a, **(kw or {}))
    except BaseException as exc:
        span.stop(error_args(args, exc))
        raise
    if after is not None:
        try:
            more = after(out)
        except Exception:
            more = None
        if more:
            args = {**args, **more} if args else more
    span.stop(args)
    return out


class OpenSpans:
    """The spans one callback/hook object has open, by key, in opening order.

    Args given to :meth:`open` are written when the span closes, together with any
    given to :meth:`close`, so no per-call ``Use`` has to be built. Those still open
    when the session ends (an exception ended ``fit``) are closed then, incomplete,
    with their args (the session's end would close them without).
    """

    __slots__ = ("_spans",)

    def __init__(self) -> None:
        self._spans: dict[str, tuple[Span, dict[str, Any]]] = {}

    def open(self, key: str, node: Node, **args: Any) -> None:
        """Open a span of ``node`` under ``key``; one still open there is closed
        first, flagged incomplete (its closing hook never ran)."""
        prev = self._spans.pop(key, None)
        if prev is not None:
            prev[0].stop({**prev[1], "incomplete": True})
        if node.enabled:
            self._spans[key] = (node.start(), args)
            _HOLDING.add(self)  # (its callback may be let go with spans still open)
            _lifecycle.at_end(_close_every_open)

    def close(self, key: str, **more: Any) -> bool:
        """Close the span under ``key`` with its args plus ``more``; False when
        nothing was open there."""
        ent = self._spans.pop(key, None)
        if ent is None:
            return False
        span, args = ent
        if more:
            args = {**args, **more}
        if not self._spans:
            _HOLDING.discard(self)
        span.stop(args or None)
        return True

    def is_open(self, key: str) -> bool:
        return key in self._spans

    def close_all(self, **more: Any) -> int:
        """Close every open span, innermost first, flagged incomplete; the count."""
        n = 0
        for key in reversed(list(self._spans)):
            if self.close(key, incomplete=True, **more):
                n += 1
        return n

    def __len__(self) -> int:
        return len(self._spans)


#: The OpenSpans that hold open spans (they hold spans and args, not their callbacks).
_HOLDING: set[OpenSpans] = set()


def _close_every_open() -> None:
    """At a session's end: the spans every OpenSpans still holds, incomplete, with their args."""
    for spans in list(_HOLDING):
        spans.close_all()

    def __repr__(self) -> str:
        return f"<OpenSpans {list(self._spans)}>"


def add_callback(owner: Any, method: str, callback: str, *, hooks_stand_down: bool = False) -> None:
    """Make every call of ``owner``'s ``method`` that takes ``callbacks`` (a trainer's
    ``__init__``, Keras' ``fit``, ``evaluate``, ``predict``) also get a new callback of
    the class at ``callback`` (``"module:name"``), unless its callbacks already hold
    one (``auto=True``: the framework traces without the user adding the callback).
    The class is imported at the call, not now: this runs while the framework is
    imported, its package not whole yet. Callbacks given as anything but a list or a
    tuple (one callback, Keras' ``CallbackList``) are left as given. With
    ``hooks_stand_down``, PyTorch's automatic hooks record nothing during the call (the
    callback records the same: Keras on its torch backend)."""
    original = getattr(owner, method)
    if getattr(original, "__dftrace_adds__", None) is not None:
        return
    where, _, name = callback.partition(":")
    signature = inspect.signature(original)

    def call(self: Any, *a: Any, **kw: Any) -> Any:
        try:
            callback_type = getattr(importlib.import_module(where), name)
            bound = signature.bind_partial(self, *a, **kw)
            given = bound.arguments.get("callbacks")
            if (given is None or isinstance(given, (list, tuple))) and not any(
                    isinstance(c, callback_type) for c in given or ()):
                bound.arguments["callbacks"] = [*(given or ()), callback_type()]
                a, kw = bound.args[1:], bound.kwargs
        except Exception as exc:
            warn_once(f"callback:{callback}:{method}",
                      f"{callback} was not added to {owner.__name__}.{method}: {exc!r}")
        auto = sys.modules.get("dftrace.torch._auto") if hooks_stand_down else None
        if auto is None:
            return original(self, *a, **kw)
        auto.standing_down(+1)
        try:
            return original(self, *a, **kw)
        finally:
            auto.standing_down(-1)

    call.__dftrace_adds__ = callback  # type: ignore[attr-defined]
    functools.update_wrapper(call, original)
    setattr(owner, method, call)


#: The modules that define the trainers, and where the callback each trainer made gets is (named, not
#: imported here: the integrations import torch's automatic tracing). The older ``pytorch_lightning``
#: package is not one: dftrace.lightning's callback is a ``lightning.pytorch`` one.
TRAINER_CALLBACKS = (("transformers.trainer", "dftrace.transformers:TraceCallback"),
                     ("lightning.pytorch.trainer.trainer", "dftrace.lightning:TraceCallback"))


def give_trainer_callback(callback: str, module: Any) -> None:
    """``auto=True``: each ``module.Trainer`` made gets ``callback`` unless given one."""
    add_callback(module.Trainer, "__init__", callback)


def give_keras_callbacks(models: Any) -> None:
    """``auto=True``: every Keras ``fit``, ``evaluate`` and ``predict`` gets a
    :class:`dftrace.keras.TraceCallback` unless given one (``models``:
    ``keras.src.models.model``, as it is imported)."""
    for method in ("fit", "evaluate", "predict"):
        add_callback(models.Model, method, "dftrace.keras:TraceCallback", hooks_stand_down=True)


class Wait:
    """A wait the framework announces by its ends only (the time between one hook and
    another): :meth:`begin` when it may start, :meth:`end` records it as one span of
    ``node`` with ``args``, :meth:`cancel` forgets it (nothing was waited for)."""

    __slots__ = ("node", "since")

    def __init__(self, node: Node):
        self.node = node
        self.since: int | None = None

    def begin(self) -> None:
        self.since = clock()

    def cancel(self) -> None:
        self.since = None

    @property
    def waiting(self) -> bool:
        return self.since is not None

    def end(self, **args: Any) -> None:
        if self.since is not None:
            self.node.record(self.since, clock(), args or None)
            self.since = None
