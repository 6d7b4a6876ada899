"""Making user-supplied args safe to write.

Args keep their JSON types (ints of any size, floats, bools, strings, small lists and
dicts of those). Anything else becomes a short summary string. NaN/inf, lone
surrogates, control characters and huge strings all still give one valid UTF-8 JSON
line. Nothing in this module raises: a value that defeats every attempt is written as
``"<unprintable T>"``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any



def _is_fragment(t: type) -> bool:
    """orjson.Fragment (pre-encoded JSON from value capture), without importing orjson."""
    return t.__name__ == "Fragment" and t.__module__ == "orjson"

__all__ = ["RESERVED", "sanitize", "sanitize_args", "encode_fragment", "key_mask", "plain_fragment", "describe_object"]

#: Keys dftrace itself writes into ``args``; a user arg of the same name is renamed.
RESERVED = frozenset({"hhash", "level", "p_idx"})

_MAX_ITEMS = 32
_MAX_DEPTH = 3
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


def _cut(s: str, max_len: int) -> str:
    if len(s) > max_len:
        s = f"{s[:max_len]}…[+{len(s) - max_len} chars]"
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates cannot be written as UTF-8
            s = s.encode("utf-8", "replace").decode("utf-8")
    return s


def describe_object(v: Any, max_len: int = 200) -> str:
    """A short, safe description of an arbitrary object (never its full data)."""
    tname = type(v).__name__
    try:
        shape = getattr(v, "shape", None)
        dtype = getattr(v, "dtype", None)
        if shape is not None and dtype is not None:
            return _cut(f"<{tname} shape={tuple(shape)} dtype={dtype}>", max_len)
    except Exception:
        pass
    try:
        r = repr(v)
    except Exception:
        return f"<{tname} (repr failed)>"
    if not isinstance(r, str):
        return f"<{tname}>"
    return _cut(r, max_len)


def sanitize(v: Any, max_len: int = 1024, _depth: int = 0) -> Any:
    """Return a value orjson can encode (big ints excepted) that means the same as ``v``."""
    t = type(v)
    if t is str:
        return _cut(v, max_len)
    if _is_fragment(t):  # already-encoded JSON (captured values): written as is
        return v
    if t is bool or v is None:
        return v
    if t is int:
        if _I64_MIN <= v <= _I64_MAX:
            return v
        # beyond 64-bit signed: the digits as a string, which every reader keeps
        # (an int64 column would lose it, a JSON reader past 308 digits reject it)
        try:
            return str(v)
        except ValueError:  # more digits than int -> str allows
            return describe_object(v)
    if t is float:
        if math.isfinite(v):
            return v
        return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    try:
        if isinstance(v, bool):
            return bool(v)
        if isinstance(v, int):  # an int subclass (IntEnum, ...): the same rule as an int
            return sanitize(int(v), max_len)
        if isinstance(v, float):
            return sanitize(float(v), max_len)
        if isinstance(v, str):
            return _cut(str(v), max_len)
        if isinstance(v, (bytes, bytearray, memoryview)):
            return f"<{t.__name__} len={len(v)}>"
        # numpy / torch scalars: keep the number
        if getattr(v, "ndim", None) == 0 and hasattr(v, "item"):
            item = v.item()
            if isinstance(item, (int, float, bool)):
                return sanitize(item, max_len, _depth)
        if _depth < _MAX_DEPTH:
            if isinstance(v, Mapping):
                if len(v) <= _MAX_ITEMS:
                    out: dict[str, Any] = {}
                    for k, x in v.items():
                        out[distinct_key(_key(k, max_len), k, out)] = sanitize(x, max_len, _depth + 1)
                    return out
                return f"<{t.__name__} len={len(v)}>"
            if isinstance(v, (list, tuple, set, frozenset)):
                if len(v) <= _MAX_ITEMS:
                    return [sanitize(x, max_len, _depth + 1) for x in v]
                return f"<{t.__name__} len={len(v)}>"
    except Exception:
        pass
    return describe_object(v, min(max_len, 200))


def _key(k: Any, max_len: int) -> str:
    if type(k) is str:
        return _cut(k, max_len)
    try:
        return _cut(str(k), max_len)
    except Exception:
        return f"<{type(k).__name__}>"


def distinct_key(key: str, k: Any, taken: Mapping[str, Any]) -> str:
    """``key`` (what ``k`` reads as), or, where a key already in ``taken`` reads the
    same (``1`` and ``"1"``), ``k``'s repr: both entries are kept."""
    if key not in taken:
        return key
    try:
        other = repr(k)
    except Exception:
        other = f"<{type(k).__name__}>"
    n = 2
    alt = other
    while alt in taken:
        alt, n = f"{other}#{n}", n + 1
    return alt


def sanitize_args(args: Mapping[str, Any] | None, max_len: int = 1024) -> dict[str, Any]:
    """Sanitise a mapping of args; reserved keys are renamed ``arg_<key>``."""
    if not args:
        return {}
    out: dict[str, Any] = {}
    try:
        items = list(args.items())
    except Exception:
        return {"args": describe_object(args)}
    for k, v in items:
        key = _key(k, max_len)
        if key in RESERVED:
            key = "arg_" + key
        out[distinct_key(key, k, out)] = sanitize(v, max_len)
    return out


def _dump(v: Any) -> bytes:
    """orjson, falling back to hand encoding for ints beyond 64 bits, which are
    written as strings of their digits: a JSON reader (ours, the validator's) turns
    a longer number into a float, or rejects it past 308 digits."""
    import orjson  # at the first arg encoded, not at ``import dftrace``

    try:
        return orjson.dumps(v)
    except Exception:
        pass
    if isinstance(v, int) and not isinstance(v, bool):
        try:
            return b'"' + str(v).encode() + b'"'
        except ValueError:  # more digits than int -> str allows
            return orjson.dumps(describe_object(v))
    if isinstance(v, dict):
        return b"{" + b",".join(orjson.dumps(k) + b":" + _dump(x) for k, x in v.items()) + b"}"
    if isinstance(v, list):
        return b"[" + b",".join(_dump(x) for x in v) + b"]"
    return orjson.dumps(describe_object(v))


def encode_fragment(args: Mapping[str, Any] | None, max_len: int = 1024,
                    sanitized: bool = False) -> bytes:
    """``,"k":v,...`` for splicing into an event's args object (empty when no args)."""
    if not args:
        return b""
    try:
        clean = args if sanitized else sanitize_args(args, max_len)
        body = _dump(clean)
        return b"," + body[1:-1] if len(body) > 2 else b""
    except Exception:
        return b',"args":"<unprintable>"'


def key_mask(args: Mapping[str, Any]) -> int:
    """A 64-bit summary of the keys of ``args``: two mappings whose masks share no bit
    share no key (the engine checks this before splicing two fragments together)."""
    m = 0
    for k in args:
        m |= 1 << (hash(k) & 63)
    return m


_dumps: Any = None


def plain_fragment(args: Any, max_len: int = 1024) -> bytes | None:
    """The fragment of a small flat dict of plain keys and JSON scalars, encoded in one
    call (what ``update(step=s)`` and ``node(args={"bytes": n})`` pass); None when
    the mapping needs :func:`sanitize_args` first."""
    global _dumps
    if type(args) is not dict or len(args) > _MAX_ITEMS or not RESERVED.isdisjoint(args):
        return None
    for k, v in args.items():
        if type(k) is not str or len(k) > max_len or not k.isascii():
            return None
        t = type(v)
        if t is int:
            if not _I64_MIN <= v <= _I64_MAX:
                return None
        elif t is str:
            if len(v) > max_len or not v.isascii():
                return None
        elif t is float:
            if v - v != 0:  # NaN or infinity
                return None
        elif t is not bool and v is not None:
            return None
    if _dumps is None:
        import orjson

        _dumps = orjson.dumps
    body = _dumps(args)
    return b"," + body[1:-1] if len(body) > 2 else b""
