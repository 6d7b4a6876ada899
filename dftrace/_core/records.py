"""What a record is made of, and how records become trace lines.

A span record is ``(kid, t0_ns, t1_ns, id, parent_id, level, tid, args, count, flags)``:

- ``kid`` names the event: an index into the kind table (:func:`kind_id`), whose
  entry is the ``,"name":..,"cat":..`` piece of every line of that kind;
- ``args`` is the JSON fragment ``,"k":v,...`` of the span's args (the sticky args in
  force when it started, then its own), encoded when they were given;
- ``count`` is the item number of an ``.iter()`` span (-1: none); ``flags`` has
  :data:`INCOMPLETE` for a span that never ended.

With the C engine records are 64-byte structs in native memory (see
``engine_c/common.h``); without it, tuples in a list. Either way the line written is::

    {"id":I,"name":..,"cat":..,"pid":P,"tid":T,"ts":S,"dur":D,"ph":"X",
     "args":{"hhash":H,"level":L,"p_idx":P<args>[,"count":C][,"incomplete":true]}}

Records that are not spans (metadata, counters, instants) are rare; they keep a
payload dict and are encoded in Python by :meth:`Encoder.special_line`.
"""

from __future__ import annotations

from typing import Any

from ..format import names as fmt
from .args import _cut, encode_fragment, key_mask, plain_fragment, sanitize_args

__all__ = ["Extra", "Encoder", "SpecialKind", "META", "COUNTER", "INSTANT", "INCOMPLETE",
           "kind_id", "kind_names", "json_str"]

#: Flag of a span closed by finalize or by its parent before it ended.
INCOMPLETE = 1

#: Longest event name or category kept (longer ones are cut with a visible marker).
_NAME_MAX = 1024


def _text(s: Any) -> str:
    if type(s) is str and len(s) <= _NAME_MAX and s.isascii():
        return s
    try:
        return _cut(s if isinstance(s, str) else str(s), _NAME_MAX)
    except Exception:
        return f"<{type(s).__name__}>"


_PLAIN = frozenset(range(0x20, 0x7F)) - {ord('"'), ord("\\")}


def json_str(s: str) -> bytes:
    """``s`` as a JSON string literal (no import for plain ASCII names)."""
    b = s.encode("utf-8", "replace") if not s.isascii() else s.encode()
    if s.isascii() and all(c in _PLAIN for c in b):
        return b'"' + b + b'"'
    import json

    return json.dumps(s, ensure_ascii=False).encode("utf-8", "replace")


# -- the kind table ---------------------------------------------------------------
_KIND_IDS: dict[tuple[str, str], int] = {}
_KIND_PIECES: list[bytes] = []
_native_add: Any = None  # the C engine's add_kind, set by the engine when it loads


def kind_id(name: Any, cat: Any) -> int:
    """The id of the event kind ``(name, cat)``, registered on first use."""
    name, cat = _text(name), _text(cat)
    key = (name, cat)
    kid = _KIND_IDS.get(key)
    if kid is None:
        piece = b',"name":' + json_str(name) + b',"cat":' + json_str(cat)
        if _native_add is not None:
            _native_add(piece)
        kid = len(_KIND_PIECES)
        _KIND_PIECES.append(piece)
        _KIND_IDS[key] = kid
    return kid


def kind_names() -> dict[int, tuple[str, str]]:
    """Every registered event kind: its id -> ``(name, cat)``."""
    return {kid: key for key, kid in list(_KIND_IDS.items())}


_native_plain: Any = None  # the C engine's plain_fragment


def use_native(add_kind: Any, plain: Any) -> None:
    """Mirror the kind table into the C engine (every kind so far, then each new
    one) and encode plain args with it."""
    global _native_add, _native_plain
    for piece in _KIND_PIECES:
        add_kind(piece)
    _native_add = add_kind
    _native_plain = plain


# -- args ---------------------------------------------------------------------------
#: Longest string arg kept (``max_arg_length``; set through :mod:`.tree`).
max_arg_length = 1024


class Extra:
    """Args of one span or one use (``node(args=...)``, ``update()``, ``stop(args=)``),
    snapshotted when given: ``args`` (sanitized copies), ``frag`` (their JSON
    fragment) and ``mask`` (a 64-bit summary of their keys that tells, in one AND,
    that two Extras cannot share a key)."""

    __slots__ = ("_args", "frag", "mask")

    def __init__(self, args: dict[str, Any], max_len: int | None = None, sanitized: bool = False):
        if max_len is None:
            max_len = max_arg_length
        if not sanitized and _native_plain is not None:
            fast = _native_plain(args)
            if fast is not None:
                self.frag, self.mask, nested = fast
                # with containers, the copy would share them: decode when asked
                self._args = None if nested else dict(args)
                return
        frag = None if sanitized else plain_fragment(args, max_len)
        if frag is not None:
            self._args = dict(args)
        else:
            self._args = args if sanitized else sanitize_args(args, max_len)
            frag = encode_fragment(self._args, sanitized=True)
        self.frag = frag
        self.mask = key_mask(self._args)

    @property
    def args(self) -> dict[str, Any]:
        """The args as values (decoded from the fragment when they held containers)."""
        a = self._args
        if a is None:
            import orjson

            a = self._args = orjson.loads(b"{" + self.frag[1:] + b"}") if self.frag else {}
        return a

    @args.setter
    def args(self, value: dict[str, Any]) -> None:
        self._args = value

    @classmethod
    def joined(cls, base: Extra | None, own: Extra | None) -> Extra | None:
        """``base`` then ``own``; on a shared key ``own`` wins."""
        if base is None or not base.args:
            return own
        if own is None or not own.args:
            return base
        x = cls.__new__(cls)
        if base.mask & own.mask and not base.args.keys().isdisjoint(own.args):
            x.args = {**base.args, **own.args}
            x.frag = encode_fragment(x.args, sanitized=True)
        else:
            x.args = {**base.args, **own.args}
            x.frag = base.frag + own.frag
        x.mask = base.mask | own.mask
        return x

    def __repr__(self) -> str:
        return f"Extra({self.args!r})"


class SpecialKind:
    """Records that are not spans: metadata (``ph`` M), counters (C), instants (i)."""

    __slots__ = ("ph",)

    def __init__(self, ph: str):
        self.ph = ph


META = SpecialKind(fmt.PH_METADATA)
COUNTER = SpecialKind(fmt.PH_COUNTER)
INSTANT = SpecialKind(fmt.PH_INSTANT)


class Encoder:
    """The per-process pieces of every line (pid, host hash, clock offset), and the
    pure-Python encoding of records."""

    def __init__(self, pid: int, hhash: str, offset_ns: int, max_arg_length: int = 1024):
        self.pid = pid
        self.hhash = hhash
        #: wall_ns - mono_ns at the anchor: ts_us = (mono_ns + offset_ns) // 1000
        self.offset_ns = offset_ns
        self.max_arg_length = max_arg_length
        #: span ids at or below this were started before a fork and belong to the parent
        self.min_id = 0
        hh = json_str(hhash)
        self.pid_piece = b',"pid":' + str(pid).encode() + b',"tid":'
        self.hh_piece = b',"ph":"%s","args":{"%s":%s,"%s":' % (
            fmt.PH_COMPLETE.encode(), fmt.ARG_HOSTNAME_HASH.encode(), hh, fmt.ARG_LEVEL.encode())

    def encode_spans(self, batch: list[tuple]) -> bytes:
        """Encode tuple records (the pure-Python engine's)."""
        out: list[bytes] = []
        ap = out.append
        off = self.offset_ns
        min_id = self.min_id
        pieces = _KIND_PIECES
        pidp, hhp = self.pid_piece, self.hh_piece
        for kid, t0, t1, i, p, lvl, tid, frag, count, flags in batch:
            if i <= min_id:
                continue
            s = (t0 + off) // 1000
            line = b'{"id":%d%b%b%d,"ts":%d,"dur":%d%b%d,"p_idx":%d%b' % (
                i, pieces[kid], pidp, tid, s, (t1 + off) // 1000 - s, hhp, lvl, p, frag)
            if count >= 0:
                line += b',"count":%d' % count
            if flags & INCOMPLETE:
                line += b',"incomplete":true'
            ap(line + b"}}\n")
        return b"".join(out)

    def special_line(self, rec: tuple) -> bytes:
        """One metadata/counter/instant record ``(kind, t_ns, id, tid, payload)``."""
        import orjson

        k, t0, i, tid, payload = rec
        if i <= self.min_id:
            return b""
        if "lines" in payload:  # lines made whole already (file I/O's FH, io_file)
            return payload["lines"]
        named = _thread_named(payload, self.max_arg_length) if k.ph == fmt.PH_METADATA else None
        if named is not None:  # a thread's or task's name: one per asyncio task, made here at once
            return b'{"id":%d,"name":"%b","cat":"%b","pid":%d,"tid":%d,"ph":"M","args":{"hhash":%b,"name":%b}}\n' % (
                i, _THREAD_NAME, _CAT_TRACER, self.pid, tid, orjson.dumps(self.hhash), named)
        try:
            ev: dict[str, Any] = {
                "id": i,
                "name": payload.get("name", "?"),
                "cat": payload.get("cat", fmt.CAT_TRACER),
                "pid": self.pid,
                "tid": tid,
            }
            if k.ph != fmt.PH_METADATA:
                ev["ts"] = (t0 + self.offset_ns) // 1000
            ev["ph"] = k.ph
            if k.ph == fmt.PH_INSTANT:
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


_THREAD_NAME = fmt.META_THREAD_NAME.encode()
_CAT_TRACER = fmt.CAT_TRACER.encode()


def _thread_named(payload: dict, max_len: int) -> bytes | None:
    """The JSON of the name a thread-name record gives (``{"name": "thread_name",
    "args": {"name": <str>}}``, nothing else), or None for any other record or a name
    that needs more than JSON's own escaping (cut, or a lone surrogate)."""
    if payload.get("name") != fmt.META_THREAD_NAME or len(payload) != 2:
        return None
    args = payload.get("args")
    if type(args) is not dict or len(args) != 1:
        return None
    name = args.get("name")
    if type(name) is not str or len(name) > max_len:
        return None
    try:
        import orjson

        return orjson.dumps(name)
    except Exception:
        return None
