"""Event records and their encoding into trace lines.

The hot path appends raw 8-tuples to the shared buffer::

    (kind, t0_ns, t1_ns, id, parent_id, level, tid, extra)

``kind`` is an :class:`EventKind` (a span) or a :class:`SpecialKind` (metadata,
counters). ``extra`` is ``None``, an ``int`` (the ``count`` of an ``.iter`` item),
an :class:`Extra` (per-use args, encoded once) or a ``dict`` (args known only at
record time, encoded here). Nothing is encoded until the writer asks for it.

Encoding is template based: each kind carries its name, category and static args
pre-rendered into ``bytes`` templates, so one event costs one ``%`` format.
"""

from __future__ import annotations

from typing import Any

from ._args import _cut, encode_fragment, sanitize_args

try:  # the optional C encoder (see _speedups.c); DFTRACE_NO_SPEEDUPS=1 disables it
    import os as _os

    if _os.environ.get("DFTRACE_NO_SPEEDUPS", "").strip() not in ("", "0"):
        raise ImportError
    from . import _speedups
except ImportError:
    _speedups = None

__all__ = ["EventKind", "SpecialKind", "Extra", "Encoder", "META", "COUNTER", "INSTANT"]


class EventKind:
    """Name, category and sticky args of a span; immutable once built."""

    __slots__ = ("name", "cat", "args", "frag", "keys", "tmpl", "special")

    def __init__(self, name: str, cat: str, args: dict[str, Any] | None = None):
        # Names come from user code: valid UTF-8 and bounded like string args, or
        # the encoder could not write this kind's events at all.
        self.name = _text(name)
        self.cat = _text(cat)
        self.args = args or {}
        self.frag = encode_fragment(self.args, sanitized=True)
        self.keys = frozenset(self.args)
        self.tmpl: tuple[bytes, bytes, bytes] | None = None  # built by the encoder
        self.special = False

    def __repr__(self) -> str:
        return f"EventKind({self.name!r}, {self.cat!r}, {self.args!r})"


def _text(s: Any) -> str:
    if type(s) is str and len(s) <= _NAME_MAX and s.isascii():
        return s
    try:
        return _cut(s if isinstance(s, str) else str(s), _NAME_MAX)
    except Exception:
        return f"<{type(s).__name__}>"


#: Longest event name or category kept (longer ones are cut with a visible marker).
_NAME_MAX = 1024


class Extra:
    """Args given to one use of a node (``node(args=...)``), encoded once."""

    __slots__ = ("args", "frag", "keys")

    def __init__(self, args: dict[str, Any], max_len: int = 1024):
        self.args = sanitize_args(args, max_len)
        self.frag = encode_fragment(self.args, sanitized=True)
        self.keys = frozenset(self.args)


class SpecialKind:
    """Records that are not spans: metadata (``ph`` M), counters (C), instants (i).

    For these records the tuple slots mean ``(kind, t_ns, _, id, _, _, tid, payload)``
    where ``payload`` is a dict with ``name``, ``cat`` and ``args``.
    """

    __slots__ = ("ph", "tmpl", "special")

    def __init__(self, ph: str):
        self.ph = ph
        self.tmpl = None
        self.special = True


META = SpecialKind("M")
COUNTER = SpecialKind("C")
INSTANT = SpecialKind("i")


def _esc(b: bytes) -> bytes:
    return b.replace(b"%", b"%%")


class Encoder:
    """Turns batches of raw records into newline-terminated JSON lines (bytes)."""

    def __init__(self, pid: int, hhash: str, offset_ns: int, max_arg_length: int = 1024):
        self.pid = pid
        self.hhash = hhash
        #: wall_ns - mono_ns at the anchor: ts_us = (mono_ns + offset_ns) // 1000
        self.offset_ns = offset_ns
        self.max_arg_length = max_arg_length
        #: span ids at or below this were started before a fork and belong to the parent
        self.min_id = 0
        import orjson  # sessions encode; ``import dftrace`` alone does not

        self._hh = orjson.dumps(hhash)

    # -- templates -------------------------------------------------------
    def _build(self, k: EventKind) -> tuple[bytes, bytes, bytes]:
        import orjson

        head = (
            b'{"id":%d,"name":' + _esc(orjson.dumps(k.name))
            + b',"cat":' + _esc(orjson.dumps(k.cat))
            + b',"pid":' + str(self.pid).encode()
            + b',"tid":%d,"ts":%d,"dur":%d,"ph":"X","args":{"hhash":' + _esc(self._hh)
            + b',"level":%d,"p_idx":%d' + _esc(k.frag)
        )
        # Items 3-5 are the pieces the C encoder splices numbers between.
        p1 = (b',"name":' + orjson.dumps(k.name) + b',"cat":' + orjson.dumps(k.cat)
              + b',"pid":' + str(self.pid).encode() + b',"tid":')
        p4 = b',"ph":"X","args":{"hhash":' + self._hh + b',"level":'
        t = (head + b"}}\n", head + b',"count":%d}}\n', head + b"%b}}\n", p1, p4, k.frag)
        k.tmpl = t
        return t

    # -- encoding --------------------------------------------------------
    def encode(self, batch: list[tuple]) -> bytes:
        """Encode a batch; a record that cannot be encoded is dropped, never raised."""
        if _speedups is not None:
            try:
                return _speedups.encode(batch, self.offset_ns, self.min_id, self._one, Extra)
            except Exception:
                pass  # fall back to the Python loop for this batch
        return self._encode_py(batch)

    def _one(self, rec: tuple) -> bytes:
        """One record the C loop leaves to Python (metadata, record-time args...)."""
        try:
            k = rec[0]
            if k.tmpl is None and not k.special:
                self._build(k)
            return self._encode_py([rec])
        except Exception:
            return b""

    def _encode_py(self, batch: list[tuple]) -> bytes:
        out: list[bytes] = []
        ap = out.append
        off = self.offset_ns
        min_id = self.min_id
        for rec in batch:
            k, t0, t1, i, p, lvl, tid, x = rec
            tm = k.tmpl
            if tm is None:
                if k.special:
                    ap(self._special(rec))
                    continue
                tm = self._build(k)
            if i <= min_id:
                continue
            s = (t0 + off) // 1000
            d = (t1 + off) // 1000 - s
            if x is None:
                ap(tm[0] % (i, tid, s, d, lvl, p))
            elif type(x) is int:
                ap(tm[1] % (i, tid, s, d, lvl, p, x))
            elif type(x) is Extra and x.keys.isdisjoint(k.keys):
                ap(tm[2] % (i, tid, s, d, lvl, p, x.frag))
            else:
                ap(self._slow(k, x, (i, tid, s, d, lvl, p)))
        return b"".join(out)

    def _slow(self, k: EventKind, x: Any, nums: tuple) -> bytes:
        """Args known only at record time; on a key clash they override the static ones."""
        try:
            if type(x) is Extra:
                extra = x.args
            elif isinstance(x, dict):
                extra = sanitize_args(x, self.max_arg_length)
            else:
                extra = {"value": x}
            if k.keys.isdisjoint(extra):
                return k.tmpl[2] % (*nums, encode_fragment(extra, sanitized=True))
            merged = dict(k.args)
            merged.update(extra)
            return self._build(EventKind(k.name, k.cat, merged))[0] % nums
        except Exception:
            return k.tmpl[0] % nums

    def _special(self, rec: tuple) -> bytes:
        import orjson

        k, t0, _t1, i, _p, _lvl, tid, payload = rec
        try:
            ev: dict[str, Any] = {
                "id": i,
                "name": payload.get("name", "?"),
                "cat": payload.get("cat", "dftrace"),
                "pid": self.pid,
                "tid": tid,
            }
            if k.ph != "M":
                ev["ts"] = (t0 + self.offset_ns) // 1000
            ev["ph"] = k.ph
            if k.ph == "i":
                ev["s"] = payload.get("scope", "t")
            args = sanitize_args(payload.get("args"), self.max_arg_length)
            if payload.get("ts_value"):  # metadata mode: the value is the time, as text
                args["value"] = str((t0 + self.offset_ns) // 1000)
            if payload.get("hhash", True):
                args = {"hhash": self.hhash, **args}
            ev["args"] = args
            return orjson.dumps(ev) + b"\n"
        except Exception:
            return b""
