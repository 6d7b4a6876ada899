"""What ``node(capture=...)`` records of one call: its options (:class:`CaptureOptions`),
its arguments bound to their parameter names, its result or error, summarised with
:func:`describe_value` and handed over as one pre-encoded :class:`Extra`
(:func:`make_extra`). Nothing here raises into the traced program."""

from __future__ import annotations

import inspect
from typing import Any

import orjson

from .._core import tree as _tree
from .._core.args import _cut, _dump, key_mask
from .._core.records import Extra
from .values import MAX_REPR, describe_value

__all__ = ["CaptureOptions", "FunctionCapture", "ItemCapture", "make_extra"]

_Fragment = getattr(orjson, "Fragment", None)  # orjson >= 3.9
_key_masks: dict[tuple[str, ...], int] = {}


def make_extra(payload: dict[str, Any], compact: bool = True) -> Extra:
    """An :class:`Extra` for args that are already JSON-safe summaries (they are not
    sanitised again: that would flatten nested summaries into strings).

    With ``compact``, nested values are kept as pre-encoded ``orjson.Fragment`` objects:
    a captured call then leaves one object the garbage collector tracks in the
    buffer (the Extra) instead of a tree of dicts and lists, which made collections
    cost more than the capture itself while events wait to be encoded.
    """
    parts = []
    args: dict[str, Any] = {}
    fragment = _Fragment if compact else None
    for k, v in payload.items():
        encoded = _dump(v)
        parts.append(b"," + orjson.dumps(k) + b":" + encoded)
        args[k] = fragment(encoded) if fragment is not None and isinstance(v, (dict, list)) else v
    x = Extra.__new__(Extra)
    x.args = args
    x.frag = b"".join(parts)
    names = tuple(args)
    mask = _key_masks.get(names)
    if mask is None:
        mask = _key_masks[names] = key_mask(args)
    x.mask = mask
    return x


_NOTHING: Any = object()
_SELF_NAMES = ("self", "cls")


def _error_args(payload: dict[str, Any], error: BaseException) -> None:
    payload["error"] = type(error).__name__
    try:
        payload["error_message"] = _cut(str(error), MAX_REPR)
    except Exception:
        pass


class CaptureOptions:
    """The ``capture=``, ``capture_result=`` and ``capture_hash=`` options of one use.

    ``params`` is True (every parameter but ``self``/``cls``), a tuple of names, or
    None (no parameters).
    """

    __slots__ = ("params", "result", "hash_values")

    def __init__(self, capture: Any = None, capture_result: bool = False,
                 capture_hash: bool = False):
        if capture is None or capture is False:
            params: tuple[str, ...] | bool | None = None
        elif capture is True:
            params = True
        elif isinstance(capture, str):
            params = (capture,)
        else:
            try:
                params = tuple(capture)
            except TypeError:
                params = None
            if params is None or not all(isinstance(n, str) and n for n in params):
                raise TypeError(
                    "capture= takes True (every parameter), a parameter name or a list of "
                    f"parameter names; got {capture!r}")
        self.params = params
        self.result = bool(capture_result)
        self.hash_values = bool(capture_hash)

    def as_options(self) -> dict[str, Any]:
        params = self.params
        return {"capture": list(params) if isinstance(params, tuple) else params,
                "capture_result": self.result, "capture_hash": self.hash_values}

    def __repr__(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.as_options().items())

    # -- values ---------------------------------------------------------------------
    def describe(self, v: Any, max_len: int) -> Any:
        return describe_value(v, hash_values=self.hash_values, max_len=max_len)

    def extra(self, base: Extra | None, params: dict[str, Any] | None, max_len: int,
              result: Any = _NOTHING, error: BaseException | None = None,
              summarized: bool = False, compact: bool = True) -> Extra | None:
        """The event's args: the use's own, ``params``, ``result`` (summarised here
        unless ``summarized``) or the error. Like every span, only an ``Exception``
        counts as an error (not a generator's close or a KeyboardInterrupt). Never
        raises: falls back to ``base``."""
        try:
            payload: dict[str, Any] = dict(base.args) if base is not None else {}
            if params is not None:
                payload["params"] = params
            if isinstance(error, Exception):
                _error_args(payload, error)
            elif result is not _NOTHING:
                payload["result"] = result if summarized else self.describe(result, max_len)
            return make_extra(payload, compact)
        except Exception:
            return base

    def for_items(self) -> ItemCapture:
        """For ``.iter()``: each item the iterable produces is the ``.iter`` span's result."""
        return ItemCapture(self)

    def bind(self, fn: Any) -> FunctionCapture:
        """Check the names against ``fn``'s signature (a misspelt name fails here, at
        decoration time, listing the real ones) and prepare per-call binding."""
        return FunctionCapture(self, fn)

    def frame_params(self, frame: Any, max_len: int) -> dict[str, Any] | None:
        """For ``with``: the variables named in ``capture`` as the block starts; with
        ``capture=True`` the arguments of the function the block is in."""
        if self.params is None:
            return None
        f_locals = frame.f_locals
        if self.params is True:
            code = frame.f_code
            n = code.co_argcount + code.co_kwonlyargcount
            n += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
            names = [x for i, x in enumerate(code.co_varnames[:n])
                     if not (i == 0 and x in _SELF_NAMES)]
        else:
            names = list(self.params)
        out: dict[str, Any] = {}
        for name in names:
            try:
                value = f_locals[name]
            except KeyError:
                g = frame.f_globals
                if name not in g:
                    continue
                value = g[name]
            out[name] = self.describe(value, max_len)
        return out


class _Bound:
    """What the recorder's capturing wrappers call; ``extra`` never raises."""

    __slots__ = ("options",)

    def __init__(self, options: CaptureOptions):
        self.options = options

    def extra(self, base: Extra | None, params: dict[str, Any] | None,
              result: Any = _NOTHING, error: BaseException | None = None) -> Extra | None:
        opts = self.options
        return opts.extra(base, params, _tree._max_arg_length,
                          result if opts.result else _NOTHING, error)


class ItemCapture(_Bound):
    """``CaptureOptions`` for the items of an ``.iter()``."""

    __slots__ = ()

    def item_extra(self, base: Extra | None, count: int, item: Any) -> Any:
        """The args of the ``.iter`` span of item number ``count`` (the count itself is
        written by the engine)."""
        try:
            payload: dict[str, Any] = dict(base.args) if base is not None else {}
            payload["result"] = self.options.describe(item, _tree._max_arg_length)
            return make_extra(payload)
        except Exception:
            return base


class FunctionCapture(_Bound):
    """``CaptureOptions`` bound to one function's signature (built at decoration).

    Binding a call is done with tables made here, as ``Signature.bind`` followed by
    ``apply_defaults`` would (extra positionals to ``*args``, unknown keywords to
    ``**kwargs``, defaults filled in) at a fraction of its cost.
    """

    __slots__ = ("signature", "names", "positional", "keywords", "var_pos", "var_kw",
                 "defaults", "required")

    def __init__(self, options: CaptureOptions, fn: Any):
        super().__init__(options)
        self.var_pos: str | None = None
        self.var_kw: str | None = None
        self.positional: tuple[str, ...] = ()
        self.keywords: frozenset[str] = frozenset()
        self.defaults: dict[str, Any] = {}
        self.required: tuple[str, ...] = ()
        try:
            sig: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            sig = None
        self.signature = sig
        requested = options.params
        if sig is None:
            if isinstance(requested, tuple):
                raise TypeError(
                    f"capture={list(requested)!r}: cannot read the signature of {fn!r}; "
                    "use capture=True to record its arguments by position")
            self.names: tuple[str, ...] | None = None
            return
        P = inspect.Parameter
        params = list(sig.parameters.values())
        self.positional = tuple(p.name for p in params
                                if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD))
        self.keywords = frozenset(p.name for p in params
                                  if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY))
        for p in params:
            if p.kind is P.VAR_POSITIONAL:
                self.var_pos = p.name
            elif p.kind is P.VAR_KEYWORD:
                self.var_kw = p.name
            elif p.default is not P.empty:
                self.defaults[p.name] = p.default
        self.required = tuple(p.name for p in params if p.default is P.empty
                              and p.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD))
        if requested is True:
            if params and params[0].name in _SELF_NAMES and params[0].kind in (
                    P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD):
                params = params[1:]
            self.names = tuple(p.name for p in params)
        elif isinstance(requested, tuple):
            unknown = [n for n in requested if n not in sig.parameters]
            if unknown and self.var_kw is None:
                name = getattr(fn, "__qualname__", repr(fn))
                raise TypeError(
                    f"capture= names {', '.join(map(repr, unknown))} that {name}{sig} does "
                    f"not have; its parameters are: {', '.join(sig.parameters) or '(none)'}")
            self.names = requested
        else:
            self.names = ()

    def _bind(self, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """Parameter name -> argument, or None when the call does not fit the
        signature (it is about to raise TypeError itself)."""
        positional = self.positional
        arguments = dict(zip(positional, args))
        if self.var_pos is not None:
            arguments[self.var_pos] = args[len(positional):]
        elif len(args) > len(positional):
            return None
        var_kw: dict[str, Any] | None = {} if self.var_kw is not None else None
        keywords = self.keywords
        for k, v in kwargs.items():
            if k in keywords:
                if k in arguments:
                    return None  # given twice
                arguments[k] = v
            elif var_kw is not None:
                var_kw[k] = v
            else:
                return None
        if var_kw is not None:
            arguments[self.var_kw] = var_kw  # type: ignore[index]
        for name in self.required:
            if name not in arguments:
                return None
        return arguments

    def params(self, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """Summaries of the call's arguments by parameter name (defaults applied).
        None when nothing is captured; never raises."""
        if self.options.params is None:
            return None
        max_len = _tree._max_arg_length
        try:
            describe = self.options.describe
            if self.signature is None:  # no signature: by position and keyword
                out = {f"arg{i}": describe(a, max_len) for i, a in enumerate(args)}
                out.update((k, describe(v, max_len)) for k, v in kwargs.items())
                return out
            arguments = self._bind(args, kwargs)
            if arguments is None:
                return None
            defaults = self.defaults
            extra_kw = arguments.get(self.var_kw, {}) if self.var_kw else {}
            out = {}
            for name in self.names or ():
                if name in arguments:
                    out[name] = describe(arguments[name], max_len)
                elif name in defaults:
                    out[name] = describe(defaults[name], max_len)
                elif name in extra_kw:
                    out[name] = describe(extra_kw[name], max_len)
            return out
        except Exception:
            return None
