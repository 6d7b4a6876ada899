"""The trace file contract shared by dftrace's writer and its readers.

This module holds the names and codes that appear in trace files (categories,
metadata event names, phase codes including DFTracer's integer ones, file suffixes
and the file-name pattern), a tolerant reader, :func:`iter_trace_lines`, and the
checker, :func:`validate_file`, for the rules in docs/format.md (section 5).

It depends on the standard library, ``orjson`` and, for ``.zst`` files only,
``zstandard``, so the core and the tests can import it without pulling in the
analysis stack.
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Iterable, Iterator
from typing import IO, Any, NamedTuple

import orjson

from ._nesting import SpanChecker

__all__ = [
    "AI_CATEGORIES",
    "ARG_COUNT",
    "ARG_EPOCH",
    "ARG_HOSTNAME_HASH",
    "ARG_INCOMPLETE",
    "ARG_LEVEL",
    "ARG_PARENT",
    "ARG_STEP",
    "BLOCK_SUFFIX",
    "CAT_CHECKPOINT",
    "CAT_COMM",
    "CAT_COMPUTE",
    "CAT_DATA",
    "CAT_DATALOADER",
    "CAT_DEVICE",
    "CAT_DFTRACER",
    "CAT_PIPELINE",
    "CAT_SYSTEM",
    "CAT_TRACER",
    "CHROME_SUFFIXES",
    "COMMON_ARGS",
    "DFTRACER_PHASES",
    "DONE_SUFFIX",
    "DecodedTrace",
    "LinePiece",
    "MemberReader",
    "EPOCH_NAMES",
    "INIT_SUFFIX",
    "ITER_SUFFIX",
    "META_CLOCK_ANCHOR",
    "META_CUSTOM",
    "META_DROPPED",
    "META_PROCESS_END",
    "META_FILE_HASH",
    "META_HOSTNAME_HASH",
    "META_PROCESS_INFO",
    "META_PROCESS_NAME",
    "META_PROCESS_SORT_INDEX",
    "META_STRING_HASH",
    "META_THREAD_NAME",
    "META_THREAD_SORT_INDEX",
    "PERFETTO_METADATA",
    "PH_AGGREGATED",
    "PH_COMPLETE",
    "PH_COUNTER",
    "PH_INSTANT",
    "PH_METADATA",
    "TRACE_SUFFIXES",
    "TraceFileName",
    "TraceLine",
    "UINT32_MAX",
    "VIRTUAL_TID_BASE",
    "Violation",
    "WAIT_SUFFIX",
    "is_trace_file",
    "iter_decoded_chunks",
    "iter_line_pieces",
    "iter_trace_lines",
    "member_decoder",
    "normalize_phase",
    "parse_line",
    "parse_trace_filename",
    "read_trace_bytes",
    "validate_file",
]

# --- categories ----------------------------------------------------------------------

CAT_COMPUTE = "compute"
CAT_DATA = "data"
CAT_DATALOADER = "dataloader"
CAT_COMM = "comm"
CAT_DEVICE = "device"
CAT_CHECKPOINT = "checkpoint"
CAT_PIPELINE = "pipeline"
#: The categories of the ``ai`` tree, in the order reports list them.
AI_CATEGORIES = (
    CAT_PIPELINE,
    CAT_COMPUTE,
    CAT_DATA,
    CAT_DATALOADER,
    CAT_COMM,
    CAT_DEVICE,
    CAT_CHECKPOINT,
)
#: Resource samples (counter events: cpu_percent, rss_bytes, ...).
CAT_SYSTEM = "sys"
#: dftrace's own bookkeeping events (clock anchor, dropped counts).
CAT_TRACER = "dftrace"
#: DFTracer's bookkeeping category (its ``start``/``end`` events and metadata).
CAT_DFTRACER = "dftracer"

#: ``.iter()`` writes ``<leaf>.iter`` (time to obtain an item) and ``<leaf>.block``
#: (time the loop body held it); ``.init`` writes ``<leaf>.init``.
ITER_SUFFIX = ".iter"
BLOCK_SUFFIX = ".block"
INIT_SUFFIX = ".init"
#: A collective's span from an asynchronous call to its completion is ``<leaf>.done``;
#: the time DDP's backward waits for its gradient buckets is ``all_reduce.wait``.
DONE_SUFFIX = ".done"
WAIT_SUFFIX = ".wait"
#: Epoch spans are ``cat == "pipeline"`` with one of these names.
EPOCH_NAMES = ("epoch", "epoch.block")

# --- phases --------------------------------------------------------------------------

PH_COMPLETE = "X"
PH_COUNTER = "C"
PH_METADATA = "M"
PH_INSTANT = "i"
#: DFTracer's aggregated records; no Chrome-trace viewer knows this phase.
PH_AGGREGATED = "A"
#: DFTracer 2.2 writes ``ph`` as an integer (``TracePhaseType``): these are its codes.
DFTRACER_PHASES = {1: PH_COMPLETE, 2: PH_COUNTER, 3: PH_AGGREGATED, 4: PH_METADATA}


def normalize_phase(ph: Any) -> str | None:
    """Return the Chrome-trace phase letter for ``ph``, mapping DFTracer's integers."""
    if isinstance(ph, str):
        return ph
    if isinstance(ph, int) and not isinstance(ph, bool):
        return DFTRACER_PHASES.get(ph)
    return None


# --- metadata event names ------------------------------------------------------------

META_PROCESS_NAME = "process_name"
META_THREAD_NAME = "thread_name"
META_PROCESS_SORT_INDEX = "process_sort_index"
META_THREAD_SORT_INDEX = "thread_sort_index"
#: The only metadata names Perfetto acts on.
PERFETTO_METADATA = frozenset(
    {META_PROCESS_NAME, META_THREAD_NAME, META_PROCESS_SORT_INDEX, META_THREAD_SORT_INDEX}
)
#: Hostname hash: ``args.name`` is the host, ``args.value`` the hash events carry.
META_HOSTNAME_HASH = "HH"
META_FILE_HASH = "FH"
META_STRING_HASH = "SH"
#: Process information: ``args`` has cmdline, cwd, python, hostname, rank, ...
META_PROCESS_INFO = "PR"
#: Custom metadata: ``args.name`` / ``args.value`` (value written as a string).
META_CUSTOM = "CM"
#: Wall and monotonic clocks read at one instant: ``args.wall_ns``, ``args.mono_ns``.
META_CLOCK_ANCHOR = "clock_anchor"
#: Events the writer had to drop: ``args.count``.
META_DROPPED = "dropped"
#: Written by the process writer when a traced process ended without finalize:
#: ``args.how`` ("killed by signal 9", "exited with status 3 without finalize").
META_PROCESS_END = "process_end"

# --- args ----------------------------------------------------------------------------

ARG_HOSTNAME_HASH = "hhash"
ARG_LEVEL = "level"
ARG_PARENT = "p_idx"
ARG_EPOCH = "epoch"
ARG_STEP = "step"
ARG_COUNT = "count"
ARG_INCOMPLETE = "incomplete"
#: Args that analysis lifts into columns of their own.
COMMON_ARGS = (ARG_EPOCH, ARG_STEP, ARG_COUNT, ARG_LEVEL, ARG_PARENT, ARG_INCOMPLETE)

#: asyncio tasks are recorded on virtual thread ids from here up.
VIRTUAL_TID_BASE = 0x40000000
#: Perfetto stores pid and tid as uint32 and turns larger values into 0.
UINT32_MAX = 2**32 - 1

# --- files ---------------------------------------------------------------------------

#: Suffixes of the files dftrace writes (and DFTracer's ``.pfw`` / ``.pfw.gz``).
TRACE_SUFFIXES = (".pfw", ".pfw.gz", ".pfw.zst")
#: Strict Chrome-trace JSON, as written by ``dftrace convert`` and ``dftrace merge``.
CHROME_SUFFIXES = (".json", ".json.gz")

_FILENAME = re.compile(
    r"^(?P<prefix>.*?)(?:-rank(?P<rank>\d+))?-(?P<host>[^/]+?)-(?P<pid>\d+)(?:\.\d+)?"
    r"(?:\.part(?P<part>\d+))?\.pfw(?:\.gz|\.zst)?$"
)


class TraceFileName(NamedTuple):
    """The parts of ``<prefix>[-rank<R>]-<host>-<pid>[.part<N>].pfw[.gz|.zst]``."""

    prefix: str
    rank: int | None
    host: str
    pid: int
    part: int


def parse_trace_filename(name: str | os.PathLike[str]) -> TraceFileName | None:
    """Split a dftrace file name into its parts, or return None if it does not match.

    Hosts may contain dashes; the rank, when present, is the ``rank<R>`` component
    that follows the prefix. The file's metadata is authoritative; this is the
    fallback for files that lost their first lines.
    """
    match = _FILENAME.match(os.path.basename(os.fspath(name)))
    if match is None:
        return None
    rank = match["rank"]
    return TraceFileName(
        prefix=match["prefix"],
        rank=int(rank) if rank is not None else None,
        host=match["host"],
        pid=int(match["pid"]),
        part=int(match["part"] or 0),
    )


def is_trace_file(name: str | os.PathLike[str]) -> bool:
    """Tell whether a file name has a trace suffix (pfw, Chrome JSON, or ``.jsonl``)."""
    base = os.path.basename(os.fspath(name))
    return base.endswith(TRACE_SUFFIXES + CHROME_SUFFIXES + (".jsonl",))


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


_gunzip_members: Any = False  # not looked up yet


def _fast_gunzip() -> Any:
    """The C engine's whole-member gzip decoder (libdeflate), or None."""
    global _gunzip_members
    if _gunzip_members is False:
        _gunzip_members = None
        if os.environ.get("DFTRACE_NO_SPEEDUPS", "").strip() in ("", "0"):
            try:
                from ._core import _speedups
            except ImportError:
                pass
            else:
                found = getattr(_speedups, "gunzip_members", None)
                if found is not None and found(b"", 0, 1) is not None:
                    _gunzip_members = found
    return _gunzip_members


class MemberReader:
    """Decodes a stream of gzip members or zstd frames fed in any pieces, keeping
    each call's output bounded (gzip by ``max_length``, zstd by feeding whole
    blocks, which regenerate at most 128 KiB each): a small file that expands to
    gigabytes is decoded piece by piece. Offsets count from the first byte fed."""

    def __init__(self, magic: bytes):
        self.gzip = magic.startswith(_GZIP_MAGIC)
        self._gunzip = _fast_gunzip() if self.gzip else None
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
            if self.gzip and not self._in_member and self._gunzip is not None:
                # Whole members at once through libdeflate; one it cannot take whole
                # (cut by the end of what was fed, damaged) goes through zlib below.
                out, used = self._gunzip(data, 0, DECODED_PIECE)
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
#: The decoded bytes of a file are handed over in pieces of about this size (whole lines).
LINE_PIECE_BYTES = 64 << 20
#: Violations ``validate_file`` keeps per file (those of the lowest lines; all are counted).
MAX_VIOLATIONS = 100_000


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
            data = b"".join(chunks)
            lines = data.count(b"\n") if long_lines else 0  # numbers of long lines only
            yield LinePiece(data, [n for n in long_lines if n <= lines], None)
            del data
            long_lines = [n - lines for n in long_lines if n > lines]
            chunks, size = rest, tail
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
        event = _with_big_numbers(body) if "number" in str(exc) else None
        if event is None:
            return TraceLine(number, text, None, f"not valid JSON: {exc}")
    if not isinstance(event, dict):
        return TraceLine(number, text, None, "not a JSON object")
    return TraceLine(number, text, event, None)


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
                yield TraceLine(number, b"", None, f"a line longer than {MAX_LINE_BYTES >> 20} MiB")
            else:
                yield parse_line(raw.strip(), number)
    if pending.strip():
        number += 1
        line = parse_line(pending.strip(), number)
        if cut is not None and line.error is not None:
            line = line._replace(error=f"{line.error} ({cut})")
            cut = None
        yield line
    if cut is not None:
        yield TraceLine(number + 1, b"", None, cut)


# --- validation ----------------------------------------------------------------------


class Violation(NamedTuple):
    """A broken rule of docs/format.md (section 5) at a line of a trace file (0: the file as a whole)."""

    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line else "file"
        return f"{where}: [{self.rule}] {self.message}"


# An escaped surrogate (\ud800-\udfff) not preceded by an escaped backslash.
_SURROGATE = re.compile(rb"(?<!\\)(?:\\\\)*\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _is_uint32(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= UINT32_MAX


def _is_time(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


class TornTail(NamedTuple):
    """A compressed trace whose last frame/member was cut off (a process killed
    mid-write): the file ends at ``offset``, inside the frame/member that starts at
    ``frame``; the whole lines before the cut decode."""

    #: File offset where the file was cut (its end).
    offset: int
    #: Events on the whole lines before the cut.
    events: int
    #: File offset where the cut frame/member starts.
    frame: int | None = None

    def __str__(self) -> str:
        where = f" in the frame that starts at byte {self.frame}" if self.frame is not None else ""
        return f"cut off at byte {self.offset}{where}, {self.events} events readable"


_CUT = re.compile(r"compressed stream cut off at byte (\d+), in the frame/member that starts at byte (\d+)")


def validate_file(path: str | os.PathLike[str], *, strict: bool = False,
                  torn: list[TornTail] | None = None) -> list[Violation]:
    """Check a trace file against docs/format.md and return the violations in line order.

    Rules: the file opens with a ``[`` line and nothing follows a closing ``]``; one
    JSON object per line with no separating commas (``.json`` files, Chrome's array
    layout, may have them); valid UTF-8 without escaped surrogates; a metadata event
    first; ``ph`` a Chrome phase letter; ``pid``/``tid`` unsigned 32-bit integers;
    ``ts >= 0`` and ``dur >= 0`` on complete events; spans on each thread nested or
    disjoint, never partly overlapping; ``p_idx``/``level`` consistent with the
    enclosing span. A file cut off by a crash (no ``]``) is valid as long as every
    line it has is whole. A compressed file whose last frame/member was cut
    mid-write is normal after a kill: unless ``strict``, the cut (and the partial
    line it leaves) is no violation, and is reported in ``torn`` if a list is given;
    with ``strict``, an empty file (no ``[``, no event) is a violation too.
    An empty list means the file follows the contract.
    """
    allow_commas = os.fspath(path).endswith(CHROME_SUFFIXES)
    violations = _Violations()
    spans = SpanChecker()
    state = "start"  # -> "open" after "[" (or the first event), -> "closed" after "]"
    first_event = True
    events = 0
    for line in iter_trace_lines(path):
        n, text = line.number, line.text
        cut = _CUT.search(line.error) if line.error is not None else None
        if cut is not None and not strict:
            if torn is not None:
                torn.append(TornTail(int(cut[1]), events, int(cut[2])))
            continue
        events += line.event is not None
        if state == "closed":
            if text:
                violations.add(Violation(n, "after-close", "content after the closing ']'"))
            continue
        if line.is_structural:
            if text == b"[" and state == "start":
                state = "open"
            elif text == b"]" and state == "open":
                state = "closed"
            elif text:
                violations.add(Violation(n, "brackets", f"stray {text.decode(errors='replace')!r}"))
            continue
        if state == "start":
            violations.add(Violation(n, "open", "the file must start with a '[' line"))
            state = "open"
        text_violations = _check_text(n, text, allow_commas)
        violations.extend(text_violations)
        if line.error is not None:
            if not any(v.rule in ("utf8", "surrogate") for v in text_violations):
                violations.add(Violation(n, "json", line.error))
            first_event = False
            continue
        event = line.event
        assert event is not None
        if first_event and normalize_phase(event.get("ph")) != PH_METADATA:
            violations.add(Violation(n, "metadata-first", "the first event must be metadata (ph 'M')"))
        first_event = False
        violations.extend(_check_event(n, event))
        _collect_span(n, event, spans)
    if strict and state == "start":
        violations.add(Violation(0, "empty", "the file holds nothing: no '[' line and no event"))
    violations.extend(Violation(*found) for found in spans.check())
    return violations.result()


def _check_text(n: int, text: bytes, allow_commas: bool) -> list[Violation]:
    found = []
    try:
        text.decode("utf-8")
    except UnicodeDecodeError as exc:
        found.append(Violation(n, "utf8", f"invalid UTF-8 at byte {exc.start}"))
    if _SURROGATE.search(text):
        found.append(
            Violation(n, "surrogate", "escaped surrogate (\\uD800-\\uDFFF); write raw UTF-8")
        )
    if text.endswith(b",") and not allow_commas:
        found.append(Violation(n, "comma", "events are not separated by commas in .pfw files"))
    return found


_PHASES = frozenset("BEXiIbenstfCMPONDRcvV()=")


def _check_event(n: int, event: dict[str, Any]) -> list[Violation]:
    found = []
    ph = event.get("ph")
    if not isinstance(ph, str):
        hint = " (DFTracer 2.2's integer code)" if normalize_phase(ph) else ""
        found.append(Violation(n, "ph", f"ph must be a phase letter, got {ph!r}{hint}"))
    elif ph not in _PHASES:
        found.append(Violation(n, "ph", f"unknown phase {ph!r}"))
    if not isinstance(event.get("name"), str):
        found.append(Violation(n, "name", "name must be a string"))
    for key in ("pid", "tid"):
        if key in event:
            if not _is_uint32(event[key]):
                found.append(Violation(n, key, f"{key} must be an integer in [0, 2**32), got {event[key]!r}"))
        elif key == "pid" or ph != PH_METADATA:
            found.append(Violation(n, key, f"{key} is missing"))
    if ph in (PH_COMPLETE, PH_COUNTER, PH_INSTANT) and not _is_time(event.get("ts")):
        found.append(Violation(n, "ts", f"ts must be a number >= 0, got {event.get('ts')!r}"))
    if ph == PH_COMPLETE and not _is_time(event.get("dur")):
        found.append(Violation(n, "dur", f"dur must be a number >= 0, got {event.get('dur')!r}"))
    if "args" in event and not isinstance(event["args"], dict):
        found.append(Violation(n, "args", "args must be a JSON object"))
    return found


def _collect_span(n: int, event: dict[str, Any], spans: SpanChecker) -> None:
    if event.get("ph") != PH_COMPLETE:
        return
    ts, dur = event.get("ts"), event.get("dur")
    pid, tid = event.get("pid"), event.get("tid")
    if not (_is_time(ts) and _is_time(dur) and _is_uint32(pid) and _is_uint32(tid)):
        return
    args = event.get("args")
    args = args if isinstance(args, dict) else {}
    spans.add(pid, tid, ts, ts + dur, n, event.get("id"), args.get(ARG_PARENT), args.get(ARG_LEVEL))


class _Violations:
    """The violations of one file, at most :data:`MAX_VIOLATIONS` kept (those of the
    lowest lines), all counted: a file broken on every line needs no more memory."""

    def __init__(self) -> None:
        self.kept: list[Violation] = []
        self.count = 0

    def add(self, found: Violation) -> None:
        self.count += 1
        self.kept.append(found)
        if len(self.kept) >= 2 * MAX_VIOLATIONS:
            self.kept.sort(key=lambda v: v.line)
            del self.kept[MAX_VIOLATIONS:]

    def extend(self, found: Iterable[Violation]) -> None:
        for v in found:
            self.add(v)

    def result(self) -> list[Violation]:
        self.kept.sort(key=lambda v: v.line)
        del self.kept[MAX_VIOLATIONS:]
        if self.count > len(self.kept):
            self.kept.append(Violation(0, "more", f"{self.count - len(self.kept)} more violations not listed "
                                                  f"(the first {MAX_VIOLATIONS} by line are)"))
        return self.kept
