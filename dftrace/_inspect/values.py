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
import math
import sys
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from .._core.args import _cut, distinct_key

__all__ = ["content_hash", "describe_value", "render", "type_name"]

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
    items: dict[str, Any] = {}
    for k, x in _head(v.items(), MAX_KEYS):
        items[distinct_key(_key(k), k, items)] = describe_value(x, **sub)
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
    # A 0-d tensor on the CPU is a loss or a metric: the number is the point (read
    # without a device sync).
    return _array(v, _name_of(v.dtype, _torch_dtype_name), _name_of(device, str),
                  v.dim() == 0 and device.type == "cpu", _torch_hash if hash_values else None,
                  requires_grad=bool(v.requires_grad))


def _ndarray(v: Any, hash_values: bool) -> dict[str, Any]:
    return _array(v, _name_of(v.dtype, _numpy_dtype_name), "cpu",
                  v.ndim == 0 and v.dtype.kind in "biuf", _numpy_hash if hash_values else None)


def _array(v: Any, dtype: str, device: str, scalar: bool, hasher: Any,
           requires_grad: bool = False) -> dict[str, Any]:
    """What a tensor's and an array's summaries share: type, shape, dtype, device (and
    ``requires_grad`` when set); the value itself when ``scalar``; the content hash
    from ``hasher`` (None: no hash; a hasher's None: none could be made)."""
    out: dict[str, Any] = {
        "type": _name_of(type(v), _type_name_of),
        "shape": list(v.shape),
        "dtype": dtype,
        "device": device,
    }
    if requires_grad:
        out["requires_grad"] = True
    if scalar:
        out["value"] = describe_value(v.item())
    if hasher is not None:
        h = hasher(v)
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
