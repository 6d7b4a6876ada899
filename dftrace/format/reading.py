"""Reading trace files tolerantly: decoding gzip members and zstd frames up to the
first damage (:func:`iter_decoded_chunks`), cutting the text into pieces at line ends
(:func:`iter_line_pieces`) and parsing lines (:func:`iter_trace_lines`). Public as
:mod:`dftrace.format`."""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Iterator
from typing import IO, Any, NamedTuple

import orjson

from .._c_parts import speedups_allowed

# --- tolerant decoding ---------------------------------------------------------------

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_CHUNK = 1 << 20


def member_decoder(magic: bytes) -> Any:
    """A factory of one-member decompressors (``.decompress``, ``.eof``, ``.unused_data``)
    for a stream starting with ``magic`` (gzip or zstd), or None for plain text."""
    if magic.startswith(_GZIP_MAGIC):
        return lambda: zlib.decompressobj(wbits=31)
    if magic.startswith(_ZSTD_MAGIC):
        import zstandard

        dctx = zstandard.ZstdDecompressor()
        return dctx.decompressobj
    return None


class DecodedTrace(NamedTuple):
    """The decodable content of a trace file (or a byte range of it)."""

    data: bytes
    #: Why decoding stopped early (a cut-off gzip member or zstd frame, or garbage
    #: after the last complete one); None when the stream ended cleanly.
    cut_off: str | None


def iter_decoded_chunks(
    path: str | os.PathLike[str],
    start: int = 0,
    end: int | None = None,
    *,
    status: list[str] | None = None,
) -> Iterator[bytes]:
    """Yield the decompressed bytes of ``path`` from byte ``start`` to ``end``.

    ``.gz`` and ``.zst`` are recognised by their magic bytes, anything else is read
    as is. Each gzip member or zstd frame is decoded on its own, so a stream cut
    off by a crash yields everything up to the cut. If ``status`` is given, the
    reason decoding stopped early is appended to it.
    """
    with open(path, "rb") as fh:
        fh.seek(start)
        remaining = None if end is None else end - start
        yield from _decode_stream(fh, start, remaining, status)


def _read(fh: IO[bytes], remaining: int | None) -> bytes:
    return fh.read(_CHUNK if remaining is None else min(_CHUNK, remaining))


#: At most this many decompressed bytes come out of one call into a decompressor
#: (a zstd block regenerates at most 128 KiB; gzip is told its limit), so a small
#: file that expands to gigabytes is read piece by piece, never all at once.
DECODED_PIECE = 8 << 20
_ZSTD_BLOCK_MAX = 128 << 10


def _decode_stream(
    fh: IO[bytes], start: int, remaining: int | None, status: list[str] | None
) -> Iterator[bytes]:
    head = _read(fh, remaining)
    if remaining is not None:
        remaining -= len(head)
    if member_decoder(head) is None:
        while head:
            yield head
            head = _read(fh, remaining)
            if remaining is not None:
                remaining -= len(head)
        return
    reader = MemberReader(head)
    data = head
    while data:
        try:
            for out, _ in reader.feed(data):
                if out:
                    yield out
        except ValueError as exc:
            if status is not None:
                status.append(f"undecodable data in the frame/member at byte {start + reader.member_start}: "
                              f"{exc.__cause__ or exc}")
            return
        data = _read(fh, remaining)
        if remaining is not None:
            remaining -= len(data)
    if reader.unfinished and status is not None:
        status.append(f"compressed stream cut off at byte {start + reader.offset + len(reader.held)}, in the "
                      f"frame/member that starts at byte {start + reader.member_start}")


_whole_decoders: dict[str, Any] = {}  # looked up once each


def _fast_whole(name: str) -> Any:
    """The decoder of whole gzip members (``gunzip_members``, libdeflate) or zstd
    frames (``unzstd_frames``, libzstd) of the C module built with the package
    (``members.c``), which decodes without the GIL; None without the module or the
    library."""
    if name not in _whole_decoders:
        found = None
        if speedups_allowed():
            try:
                from . import _members
            except ImportError:
                pass
            else:
                found = getattr(_members, name, None)
                if found is not None and found(b"", 0, 1) is None:
                    found = None
        _whole_decoders[name] = found
    return _whole_decoders[name]


class MemberReader:
    """Decodes a stream of gzip members or zstd frames fed in any pieces, keeping
    each call's output bounded (gzip by ``max_length``, zstd by feeding whole
    blocks, which regenerate at most 128 KiB each): a small file that expands to
    gigabytes is decoded piece by piece. Offsets count from the first byte fed."""

    def __init__(self, magic: bytes, *, piece: int = DECODED_PIECE):
        self.gzip = magic.startswith(_GZIP_MAGIC)
        #: Decoded bytes of whole frames/members one step yields (about: a unit is
        #: never split): a caller that cuts the stream at unit ends cuts it this finely.
        self.piece = piece
        self._whole = _fast_whole("gunzip_members" if self.gzip else "unzstd_frames")
        self._factory = member_decoder(magic)
        self._decoder = self._factory()
        self._blocks = _ZstdBlocks()
        #: Bytes fed but not yet decoded (the start of an incomplete block).
        self.held = b""
        #: Offset of the next byte to decode, and of the frame/member it is in.
        self.offset = 0
        self.member_start = 0
        self._in_member = False

    @property
    def unfinished(self) -> bool:
        """True when the stream so far ends inside a frame/member."""
        return self._in_member or bool(self.held)

    def feed(self, data: bytes) -> Iterator[tuple[bytes, bool]]:
        """(decoded bytes, whether a frame/member ended there) for ``data``; raises
        ValueError (from the decompressor's error) on undecodable data."""
        data = self.held + data
        self.held = b""
        while data:
            if not self._in_member and self._whole is not None:
                # Whole members or frames at once in C; one it cannot take whole (cut
                # by the end of what was fed, damaged) goes through the decoder below.
                out, used = self._whole(data, 0, self.piece)
                if used:
                    self.offset += used
                    self.member_start = self.offset
                    data = data[used:]
                    yield out, True
                    continue
            if self.gzip:
                piece, rest = data, b""
            else:
                cut = self._blocks.cut(data, DECODED_PIECE // _ZSTD_BLOCK_MAX)
                if not cut:
                    self.held = data
                    return
                piece, rest = data[:cut], data[cut:]
            try:
                if self.gzip:
                    out = self._decoder.decompress(piece, DECODED_PIECE)
                    rest = self._decoder.unconsumed_tail + rest
                    piece = piece[:len(piece) - len(self._decoder.unconsumed_tail)]
                else:
                    out = self._decoder.decompress(piece)
            except Exception as exc:  # zlib.error / zstandard.ZstdError
                raise ValueError(str(exc)) from exc
            self._in_member = True
            if self._decoder.eof:
                tail = self._decoder.unused_data
                self.offset += len(piece) - len(tail)
                data = tail + rest
                self._decoder = self._factory()
                self._blocks = _ZstdBlocks()
                self._in_member = False
                self.member_start = self.offset
                yield out, True
            else:
                self.offset += len(piece)
                data = rest
                yield out, False


class _ZstdBlocks:
    """Where the blocks of a zstd frame end, read from their headers as the bytes
    come (RFC 8878): so a decompressor can be fed whole blocks, whose output is
    bounded, rather than whatever was read."""

    def __init__(self) -> None:
        self.state = "header"  # -> "blocks" -> "checksum" -> "done"
        self.checksum = 0

    def cut(self, data: bytes, max_blocks: int) -> int:
        """How many bytes of ``data`` (the frame's next bytes) hold at most
        ``max_blocks`` whole blocks; the frame's header and end ride along. Past the
        frame (or in bytes it cannot follow) everything is handed over: the
        decompressor reports what it makes of it."""
        pos = 0
        blocks = 0
        while pos < len(data):
            if self.state == "header":
                header = _zstd_header(data[pos:])
                if header is None:
                    return pos
                if header[0] < 0:  # a skippable frame or not zstd: not ours to cut
                    self.state = "done"
                    return len(data)
                pos += header[0]
                self.checksum = header[1]
                self.state = "blocks"
            elif self.state == "blocks":
                if len(data) - pos < 3:
                    return pos
                header = int.from_bytes(data[pos:pos + 3], "little")
                last, kind, size = header & 1, (header >> 1) & 3, header >> 3
                length = 3 + (1 if kind == 1 else size)
                if len(data) - pos < length or blocks >= max_blocks:
                    return pos
                pos += length
                blocks += 1
                if last:
                    self.state = "checksum" if self.checksum else "done"
            elif self.state == "checksum":
                if len(data) - pos < 4:
                    return pos
                pos += 4
                self.state = "done"
            else:
                return len(data)
        return pos


def _zstd_header(data: bytes) -> tuple[int, bool] | None:
    """(size, has a checksum) of the zstd frame header at the start of ``data``;
    None when more bytes are needed, size -1 for anything but a zstd frame."""
    if len(data) < 5:
        return None if _ZSTD_MAGIC.startswith(data[:4]) else (-1, False)
    if not data.startswith(_ZSTD_MAGIC):
        return -1, False
    descriptor = data[4]
    single = (descriptor >> 5) & 1
    content = [1 if single else 0, 2, 4, 8][descriptor >> 6]
    dictionary = [0, 1, 2, 4][descriptor & 3]
    return 5 + (0 if single else 1) + dictionary + content, bool(descriptor & 4)


#: Lines longer than this (decoded) are broken lines: counted, never held in memory.
MAX_LINE_BYTES = 16 << 20
#: A line nested deeper than this (its own object is level 1, its ``args`` 2) is
#: broken: every reader stops there, and whatever dftrace reads it can write again
#: (orjson writes at most 255 levels).
MAX_DEPTH = 64
#: The decoded bytes of a file are handed over in pieces of about this size (whole lines).
LINE_PIECE_BYTES = 64 << 20


class LinePiece(NamedTuple):
    """Whole lines of a decoded stream, one piece of it (see :func:`iter_line_pieces`)."""

    #: The lines, each ending with a line break (but perhaps the stream's last one);
    #: a line longer than the cap is left empty here.
    data: bytes
    #: 1-based numbers, within this piece, of the lines longer than the cap.
    long_lines: list[int]
    #: Why decoding stopped early, on the last piece; else None.
    cut_off: str | None


def iter_line_pieces(path: str | os.PathLike[str], start: int = 0, end: int | None = None, *,
                     piece_bytes: int = LINE_PIECE_BYTES, max_line: int = MAX_LINE_BYTES) -> Iterator[LinePiece]:
    """The decoded lines of ``path`` (or of ``[start, end)``) in pieces of about
    ``piece_bytes``, each made of whole lines; at least one piece. Memory stays
    bounded by the piece size whatever the file expands to: a line longer than
    ``max_line`` is dropped as it streams by (an empty line stands in for it, and
    its number is listed)."""
    status: list[str] = []
    # The decoded chunks of the piece being gathered, joined once when it is handed
    # over; ``tail``: bytes after their last line break (an unfinished line).
    chunks: list[bytes | memoryview] = []
    size = tail = 0
    long_lines: list[int] = []
    skipping = False
    for chunk in iter_decoded_chunks(path, start, end, status=status):
        if skipping:
            newline = chunk.find(b"\n")
            if newline < 0:
                continue
            chunk = chunk[newline:]  # the long line's break ends its (empty) stand-in
            skipping = False
        if not chunk:
            continue
        newline = chunk.rfind(b"\n")
        tail = len(chunk) - newline - 1 if newline >= 0 else tail + len(chunk)
        chunks.append(chunk)
        size += len(chunk)
        if tail > max_line:
            _split_tail(chunks, tail)
            size -= tail
            tail = 0
            long_lines.append(sum(bytes(c).count(b"\n") if isinstance(c, memoryview) else c.count(b"\n")
                                  for c in chunks) + 1)
            skipping = True
        if size >= piece_bytes and size > tail:
            rest = _split_tail(chunks, tail)
            piece = [b"".join(chunks)]
            chunks, size = rest, tail
            lines = piece[0].count(b"\n") if long_lines else 0  # numbers of long lines only
            kept, long_lines = [n for n in long_lines if n <= lines], [n - lines for n in long_lines if n > lines]
            # Handed over without a reference kept here: the consumer frees the piece.
            yield LinePiece(piece.pop(), kept, None)
    yield LinePiece(b"".join(chunks), long_lines, status[0] if status else None)


def _split_tail(chunks: list[bytes | memoryview], tail: int) -> list[bytes | memoryview]:
    """Take the last ``tail`` bytes off ``chunks`` (in place, without copying); return them."""
    rest: list[bytes | memoryview] = []
    while tail:
        last = chunks.pop()
        if len(last) <= tail:
            rest.insert(0, last)
            tail -= len(last)
        else:
            view = memoryview(last)
            chunks.append(view[:len(last) - tail])
            rest.insert(0, view[len(last) - tail:])
            tail = 0
    return rest


def read_trace_bytes(
    path: str | os.PathLike[str], start: int = 0, end: int | None = None
) -> DecodedTrace:
    """Decode ``path`` (or the byte range ``[start, end)``) into memory, tolerating a cut."""
    status: list[str] = []
    data = b"".join(iter_decoded_chunks(path, start, end, status=status))
    return DecodedTrace(data, status[0] if status else None)


# --- lines ---------------------------------------------------------------------------

_STRUCTURAL = re.compile(rb"^[\[\],\s]*$")


class TraceLine(NamedTuple):
    """One physical line of a trace file, with its parsed event or why it is broken."""

    #: 1-based line number in the decompressed stream.
    number: int
    #: The line without its line break and surrounding whitespace.
    text: bytes
    #: The parsed event for a line holding one JSON object, else None.
    event: dict[str, Any] | None
    #: Why the line could not be read as an event; None for events and for the
    #: structural lines ``[``, ``]`` and blank ones.
    error: str | None

    @property
    def is_structural(self) -> bool:
        """True for array brackets, commas and blank lines, which carry no event."""
        return self.event is None and self.error is None


def parse_line(text: bytes, number: int = 0) -> TraceLine:
    """Classify one stripped line: an event, a structural line, or broken (with why)."""
    if _STRUCTURAL.match(text):
        return TraceLine(number, text, None, None)
    body = text[:-1] if text.endswith(b",") else text
    try:
        event = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):  # the parser's limit, deeper than dftrace's
            return TraceLine(number, text, None, f"nested deeper than {MAX_DEPTH} levels")
        event = _with_big_numbers(body) if "number" in str(exc) else None
        if event is None:
            return TraceLine(number, text, None, f"not valid JSON: {exc}")
    if not isinstance(event, dict):
        return TraceLine(number, text, None, "not a JSON object")
    if body.count(b"{") + body.count(b"[") > MAX_DEPTH and _depth(event) > MAX_DEPTH:
        return TraceLine(number, text, None, f"nested deeper than {MAX_DEPTH} levels")
    return TraceLine(number, text, event, None)


def _depth(value: Any) -> int:
    """How deep ``value`` nests (a scalar 0, an empty object or list 1), without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _with_big_numbers(body: bytes) -> Any:
    """``body`` parsed with integers beyond 64 bits kept as strings of their digits
    (how dftrace writes them) and floats beyond double range as infinities; None
    when it is not valid JSON even so."""
    import json

    def integer(digits: str) -> int | str:
        value = int(digits) if len(digits) < 40 else None
        return value if value is not None and -(2**63) <= value < 2**64 else digits

    try:
        return json.loads(body, parse_int=integer)
    except ValueError:
        return None


def iter_trace_lines(path: str | os.PathLike[str]) -> Iterator[TraceLine]:
    """Yield every line of a ``.pfw``, ``.pfw.gz``, ``.pfw.zst`` or ``.json[.gz]`` file.

    Never raises on bad content: a line that is not one JSON object comes back with
    ``error`` set, a line longer than ``MAX_LINE_BYTES`` comes back empty with
    ``error`` set (it is never held in memory), and a compressed stream cut off by a
    crash ends with one extra broken line saying so (merged into the last line when
    that line was cut too). A trailing comma (Chrome's array layout) is accepted.
    """
    number = 0
    cut = None
    pending = b""
    for piece in iter_line_pieces(path, piece_bytes=_CHUNK * 8):
        cut = piece.cut_off
        long_lines = set(piece.long_lines)
        lines = piece.data.split(b"\n")
        pending = lines.pop()  # the stream's last line has no break: it comes last
        for index, raw in enumerate(lines, 1):
            number += 1
            if index in long_lines:
                yield TraceLine(number, b"", None, LONG_LINE)
            else:
                yield parse_line(raw.strip(), number)
    yield from trace_tail_lines(pending, number, cut)


#: Why a line longer than :data:`MAX_LINE_BYTES` is broken.
LONG_LINE = f"a line longer than {MAX_LINE_BYTES >> 20} MiB"


def trace_tail_lines(pending: bytes, number: int, cut: str | None) -> list[TraceLine]:
    """The lines after line ``number`` that end a decoded stream: ``pending`` (its
    last line, without a line break) and, for a stream cut off (``cut``: why), a
    broken line saying so, merged into ``pending`` when that line was cut too."""
    tail = []
    if pending.strip():
        number += 1
        line = parse_line(pending.strip(), number)
        if cut is not None and line.error is not None:
            line = line._replace(error=f"{line.error} ({cut})")
            cut = None
        tail.append(line)
    if cut is not None:
        tail.append(TraceLine(number + 1, b"", None, cut))
    return tail
