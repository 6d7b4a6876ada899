"""Summaries of captured values, and binding a call's arguments to parameter names.

``node(capture=...)`` records *what went through* a call, never the value itself:
a summary made of JSON types only, so no captured object outlives the call and the
summary encodes like any other arg. Numbers, ``None`` and short strings are kept as
they are; long strings are cut; containers keep up to a few items; tensors and
arrays become ``{"type", "shape", "dtype", "device"}`` plus, when asked for, a
content hash that is the same in every process for the same dtype, shape and bytes.

torch and numpy are never imported here: a value is only treated as a tensor or an
array when its framework is already in ``sys.modules`` (a tensor cannot exist
otherwise). Nothing in this module raises into the traced program.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import math
import sys
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from .._core import tree as _tree
from .._core.args import _cut, _dump, key_mask
from .._core.records import Extra

__all__ = [
    "CaptureOptions",
    "FunctionCapture",
    "ItemCapture",
    "content_hash",
    "make_extra",
    "render",
    "describe_value",
    "type_name",
]

#: Items kept from a list/tuple/set, and keys from a mapping, before summarising.
MAX_ITEMS = 8
MAX_KEYS = 16
#: Containers nested deeper than this are described by type and length only.
MAX_DEPTH = 3
#: Longest text kept from the ``repr`` of an object that has no better summary.
MAX_REPR = 200
_SEQUENCES = (list, tuple, set, frozenset, deque)


def type_name(v: Any) -> str:
    """``torch.Tensor``, ``numpy.ndarray``, ``list``: the top-level package and the
    class name, which is how users spell the type."""
    return _type_name_of(type(v))


def _type_name_of(t: type) -> str:
    mod = getattr(t, "__module__", "") or ""
    return t.__qualname__ if mod == "builtins" else f"{mod.split('.')[0]}.{t.__qualname__}"


def _torch_tensor_type() -> Any:
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None) if torch is not None else None


def _numpy() -> Any:
    return sys.modules.get("numpy")


def describe_value(v: Any, *, hash_values: bool = False, max_len: int = 1024, _depth: int = 0) -> Any:
    """A JSON-safe description of ``v`` that holds no reference to it."""
    t = type(v)
    if v is None or t is bool or t is int:
        return v
    if t is float:
        return _float(v)
    if t is str:
        return _cut(v, max_len)
    try:
        return _describe_other(v, t, hash_values, max_len, _depth)
    except Exception:
        return f"<{t.__name__}>"


def _float(v: float) -> Any:
    if math.isfinite(v):
        return v
    return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")


def _describe_other(v: Any, t: type, hash_values: bool, max_len: int, depth: int) -> Any:
    tensor = _torch_tensor_type()
    if tensor is not None and isinstance(v, tensor):
        return _tensor(v, hash_values)
    np = _numpy()
    if np is not None:
        if isinstance(v, np.ndarray):
            return _ndarray(v, hash_values)
        if isinstance(v, np.generic):
            return describe_value(v.item(), max_len=max_len)
    if isinstance(v, enum.Enum):
        return f"{t.__qualname__}.{v.name}"
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return _float(float(v))
    if isinstance(v, str):
        return _cut(str(v), max_len)
    if isinstance(v, (bytes, bytearray, memoryview)):
        out: dict[str, Any] = {"type": type_name(v), "len": len(v)}
        if hash_values:
            out["hash"] = _digest(b"bytes", memoryview(v).cast("B"))
        return out
    if depth >= MAX_DEPTH and isinstance(v, (Mapping, *_SEQUENCES)):
        return f"<{type_name(v)} len={len(v)}>"
    sub = {"hash_values": hash_values, "max_len": max_len, "_depth": depth + 1}
    if isinstance(v, Mapping):
        return _mapping(v, sub)
    if isinstance(v, tuple) and hasattr(t, "_fields"):  # a namedtuple: keep field names
        return {str(k): describe_value(x, **sub) for k, x in zip(t._fields, v)}
    if isinstance(v, _SEQUENCES):
        items = [describe_value(x, **sub) for x in _head(v, MAX_ITEMS)]
        if len(v) <= MAX_ITEMS:
            return items
        return {"type": type_name(v), "len": len(v), "head": items}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        if depth >= MAX_DEPTH:
            return f"<{type_name(v)}>"
        fields = dataclasses.fields(v)[:MAX_KEYS]
        return {"type": type_name(v), **{f.name: describe_value(getattr(v, f.name), **sub) for f in fields}}
    shaped = _shaped(v)
    if shaped is not None:
        return shaped
    return _repr(v, min(max_len, MAX_REPR))


def _head(items: Iterable[Any], n: int) -> list[Any]:
    out = []
    for x in items:
        if len(out) >= n:
            break
        out.append(x)
    return out


def _mapping(v: Mapping[Any, Any], sub: dict[str, Any]) -> dict[str, Any]:
    items = {_key(k): describe_value(x, **sub) for k, x in _head(v.items(), MAX_KEYS)}
    if len(v) <= MAX_KEYS:
        return items
    return {"type": type_name(v), "len": len(v), "head": items}


def _key(k: Any) -> str:
    if type(k) is str:
        return _cut(k, 200)
    try:
        return _cut(str(k), 200)
    except Exception:
        return f"<{type(k).__name__}>"


def _repr(v: Any, max_len: int) -> str:
    try:
        r = repr(v)
    except Exception:
        return f"<{type_name(v)} (repr failed)>"
    return _cut(r, max_len) if isinstance(r, str) else f"<{type_name(v)}>"


# numpy's dtype.name is computed in Python on every access (microseconds): dtypes
# and devices are few, so their names are looked up once.
_names: dict[Any, str] = {}


def _name_of(key: Any, make: Any) -> str:
    name = _names.get(key)
    if name is None:
        name = _names[key] = make(key)
    return name


def _torch_dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _tensor(v: Any, hash_values: bool) -> dict[str, Any]:
    device = v.device
    out: dict[str, Any] = {
        "type": _name_of(type(v), _type_name_of),
        "shape": list(v.shape),
        "dtype": _name_of(v.dtype, _torch_dtype_name),
        "device": _name_of(device, str),
    }
    if v.requires_grad:
        out["requires_grad"] = True
    if v.dim() == 0 and device.type == "cpu":
        # A loss or a metric: the number is the point (no device sync on CPU).
        out["value"] = describe_value(v.item())
    if hash_values:
        h = _torch_hash(v)
        if h is not None:
            out["hash"] = h
    return out


def _ndarray(v: Any, hash_values: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": _name_of(type(v), _type_name_of),
        "shape": list(v.shape),
        "dtype": _name_of(v.dtype, _numpy_dtype_name),
        "device": "cpu",
    }
    if v.ndim == 0 and v.dtype.kind in "biuf":
        out["value"] = describe_value(v.item())
    if hash_values:
        h = _numpy_hash(v)
        if h is not None:
            out["hash"] = h
    return out


def _numpy_dtype_name(dtype: Any) -> str:
    return dtype.name


def _shaped(v: Any) -> dict[str, Any] | None:
    """Other array-likes (JAX, TensorFlow, CuPy, pandas): type and shape, dtype and
    device when they have them, column names for data frames."""
    shape = getattr(v, "shape", None)
    if not isinstance(shape, tuple) or not all(isinstance(d, int) for d in shape):
        return None
    out: dict[str, Any] = {"type": type_name(v), "shape": list(shape)}
    dtype = getattr(v, "dtype", None)
    if dtype is not None:
        out["dtype"] = str(getattr(dtype, "name", dtype))
    device = getattr(v, "device", None)
    if device is not None and not callable(device):
        out["device"] = str(device)
    columns = getattr(v, "columns", None)
    if columns is not None:
        out["columns"] = [_key(c) for c in _head(columns, MAX_KEYS)]
    return out


# -- content hashes ---------------------------------------------------------------------

def _digest(header: bytes, data: Any) -> str:
    # Imported here, not with dftrace: hashlib aborts a Python 3.12.1 process at exit
    # once a sub-interpreter imported it.
    import hashlib

    h = hashlib.blake2b(header, digest_size=8)
    h.update(data)
    return h.hexdigest()


def _array_header(dtype_name: str, shape: Any) -> bytes:
    # dtype and shape are part of the content: the same bytes as float32[4] and
    # int32[4] (or [2, 2]) are different values.
    return f"{dtype_name}{list(shape)}".encode()


def _numpy_hash(a: Any) -> str | None:
    np = _numpy()
    if a.dtype.hasobject:  # pointers, not content
        return None
    c = np.ascontiguousarray(a)
    if c.dtype.byteorder == ">":
        c = c.astype(c.dtype.newbyteorder("<"))
    return _digest(_array_header(c.dtype.name, c.shape), c.reshape(-1).view(np.uint8).data)


def _torch_hash(t: Any) -> str | None:
    import torch  # already imported: t is a tensor

    try:
        c = t.detach()
        if c.device.type != "cpu":
            c = c.cpu()
        if c.is_conj():
            c = c.resolve_conj()
        flat = c.contiguous().reshape(-1).view(torch.uint8)
        dtype = str(t.dtype).removeprefix("torch.")
        header = _array_header(dtype, t.shape)
        try:
            return _digest(header, flat.numpy().data)
        except Exception:  # torch built without numpy
            return _digest(header, bytes(flat.tolist()))
    except Exception:  # sparse, nested, meta tensors: no plain bytes to hash
        return None


def content_hash(v: Any) -> str | None:
    """The deterministic content hash ``capture_hash=True`` records: 16 hex digits
    of BLAKE2b over dtype, shape and bytes (None for values that have no bytes).
    A torch tensor and a numpy array with the same dtype, shape and data match."""
    try:
        tensor = _torch_tensor_type()
        if tensor is not None and isinstance(v, tensor):
            return _torch_hash(v)
        np = _numpy()
        if np is not None and isinstance(v, np.ndarray):
            return _numpy_hash(v)
        if isinstance(v, (bytes, bytearray, memoryview)):
            return _digest(b"bytes", memoryview(v).cast("B"))
    except Exception:
        pass
    return None


# -- short text for tables ------------------------------------------------------------

def render(s: Any, width: int = 60) -> str:
    """One line describing a summary: ``Tensor[4, 3] float32 cpu``, ``'abc'``, ``[1, 2]``."""
    try:
        text = _render(s, width)
    except Exception:
        text = "?"
    if len(text) > width:
        text = text[: max(width - 1, 1)] + "…"
    return text


def _render(s: Any, width: int) -> str:
    if isinstance(s, str):
        return repr(s)
    if isinstance(s, dict):
        if "shape" in s and "type" in s:
            text = f"{str(s['type']).rsplit('.', 1)[-1]}{list(s['shape'])}"
            for key in ("dtype", "device"):
                if s.get(key):
                    text += f" {s[key]}"
            if "value" in s:
                text += f" ={_render(s['value'], width)}"
            if "hash" in s:
                text += f" #{s['hash'][:8]}"
            return text
        if "type" in s and "len" in s:
            return f"{str(s['type']).rsplit('.', 1)[-1]} len={s['len']}"
        parts = []
        for k, v in s.items():
            parts.append(f"{k}: {_render(v, width)}")
            if sum(len(p) + 2 for p in parts) > width:
                break
        return "{" + ", ".join(parts) + "}"
    if isinstance(s, list):
        parts = []
        for v in s:
            parts.append(_render(v, width))
            if sum(len(p) + 2 for p in parts) > width:
                break
        return "[" + ", ".join(parts) + "]"
    if isinstance(s, float):
        text = f"{s:.6g}"
        return text if any(c in text for c in ".ein") else text + ".0"  # 1.0 stays a float
    return str(s).lower() if isinstance(s, bool) or s is None else str(s)


# -- what a capturing use captures ------------------------------------------------------

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
