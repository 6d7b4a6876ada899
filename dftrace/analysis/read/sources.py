"""Finding trace files and cutting them into partitions that can be read independently.

A partition is a whole file, or for a big file a byte range that starts at a zstd
frame, a gzip member or (uncompressed files) a line. dftrace's writer makes every
flush its own frame/member ending at a line break, so each range decodes alone and
holds whole lines; the same holds for DFTracer's files.
"""

from __future__ import annotations

import glob
import os
import re
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ...format.names import is_trace_file
from ...format.reading import iter_decoded_chunks, parse_line
from .kineto import first_events, is_document_file

#: Default on-disk size of one partition of a compressed file. TraceTable lines compress
#: about tenfold, so a partition decodes to roughly 150-250 MB of JSON.
DEFAULT_PARTITION_BYTES = 16 << 20
#: ``dftrace sql``'s: its events go to the query a few partitions at a time, so what it
#: holds is those partitions' columns (on a 10M-event trace, 277 MB at peak with these,
#: 603 MB with the default, the same CPU).
SQL_PARTITION_BYTES = 4 << 20
# Uncompressed files are cut into partitions this many times larger, and so are the
# JSON text of a zstd file's partitions where its frames say how much they hold: a
# trace that compresses far better than most is cut by its text.
_PLAIN_FACTOR = 8

PARQUET_SUFFIX = ".parquet"

_ZSTD_MAGIC = 0xFD2FB528
_GZIP_MEMBER = b"\x1f\x8b\x08"


@dataclass(frozen=True)
class Partition:
    """A piece of one input file: bytes ``[start, end)`` (``end`` None: to the end)."""

    path: str
    index: int = 0
    start: int = 0
    end: int | None = None

    @property
    def is_parquet(self) -> bool:
        return self.path.endswith(PARQUET_SUFFIX)


#: What the analysis takes as input: a file, directory or glob pattern, or several.
PathsLike = str | os.PathLike[str] | Iterable[str | os.PathLike[str]]


def expand_paths(paths: PathsLike, skipped: list[str] | None = None) -> list[str]:
    """Turn files, directories (searched recursively) and glob patterns into files.

    Files with a generic JSON name found in a directory or by a glob (``config.json``,
    ``metrics.json`` beside the traces) are traces only when their content says so
    (:func:`holds_events`); the others are left out and appended to ``skipped``.
    A file reached by several paths (a symbolic link to it or to a folder above it)
    is given once, by the first. Raises FileNotFoundError for an argument that names
    nothing, so a typo is not silently an empty analysis.
    """
    found: dict[str, str] = {}
    left_out: list[str] = []
    for raw in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        path = os.fspath(raw)
        if os.path.isdir(path):
            candidates = _walk(path)
        elif os.path.isfile(path):
            if path.endswith(PERFETTO_SUFFIXES):
                raise ValueError(f"{path} is in Perfetto's own format, which dftrace writes for the UI and does "
                                 "not read: give the trace files it was made from")
            candidates = [path]
        else:
            candidates = []
            for match in sorted(glob.glob(path, recursive=True)):
                candidates.extend(_walk(match) if os.path.isdir(match) else [match])
            candidates = [c for c in candidates if _is_input(c)]
        if not os.path.isfile(path):
            left_out += [c for c in candidates if not holds_events(c)]
            candidates = [c for c in candidates if c not in left_out]
        if not candidates:
            raise FileNotFoundError(f"no trace files found at {path!r}: {_why_nothing(path, len(left_out))}")
        for candidate in candidates:  # a file reached twice (a link to it, or to its folder) is read once,
            real = os.path.realpath(candidate)  # named by its own path where that is one of them
            if real not in found or real == os.path.abspath(candidate):
                found[real] = os.path.normpath(candidate)
    if skipped is not None:
        skipped.extend(os.path.normpath(p) for p in dict.fromkeys(left_out))
    return list(found.values())


#: Perfetto's own format's names: written (``export.perfetto``), never read.
PERFETTO_SUFFIXES = (".pftrace", ".perfetto-trace")
#: Names that say nothing of the content: such files are looked into.
_GENERIC_SUFFIXES = (".json", ".json.gz", ".jsonl")
#: How much of a file's decoded start is looked at for an event.
_SNIFF_BYTES = 1 << 16


def holds_events(path: str) -> bool:
    """Whether a file is a trace by its content: True for trace-specific names (.pfw,
    Parquet, which are reported as damaged when they hold none); for generic JSON
    names, whether the start of the (decoded) content holds an object with ``ph``
    (an event) or a ``traceEvents`` key."""
    if not path.endswith(_GENERIC_SUFFIXES):
        return True
    head = b""
    try:
        for chunk in iter_decoded_chunks(path):
            head += chunk
            if len(head) >= _SNIFF_BYTES:
                break
    except OSError:
        return True  # unreadable: reported when it is read
    return _EVENT_KEY.search(head[:_SNIFF_BYTES]) is not None


_EVENT_KEY = re.compile(rb'"(ph|traceEvents)"\s*:')


def runs_in(path: str | os.PathLike[str]) -> list[str]:
    """The runs ``path`` holds: its subdirectories when it is a directory of runs (no
    trace files of its own, two or more subdirectories with some), else ``[path]``."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        return [path]
    entries = sorted(os.listdir(path))
    if any(_is_input(e) and os.path.isfile(os.path.join(path, e)) for e in entries):
        return [path]
    runs = [os.path.join(path, e) for e in entries
            if os.path.isdir(os.path.join(path, e)) and _walk(os.path.join(path, e))]
    return runs if len(runs) >= 2 else [path]


def _is_input(path: str) -> bool:
    return is_trace_file(path) or path.endswith(PARQUET_SUFFIX)


def _why_nothing(path: str, not_traces: int) -> str:
    """Why ``path`` gave no trace file, said the way the next step follows from it."""
    also = f"; {not_traces} files there are not traces" if not_traces else ""
    if os.path.isdir(path):
        return f"the directory holds no trace files (.pfw, .pfw.gz, .pfw.zst, .json, .parquet){also}"
    if glob.has_magic(path):
        return f"no file matches the pattern{also}" if not not_traces else f"the files that match are not traces{also}"
    if os.path.exists(path):
        return "it is not a regular file or directory"
    parent = os.path.dirname(os.path.abspath(path))
    return "it does not exist" + ("" if os.path.isdir(parent) else f" (nor does {parent!r})")


def _walk(directory: str) -> list[str]:
    out = []
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        out.extend(os.path.join(root, f) for f in sorted(files) if _is_input(f))
    return out


def plan_paths(paths: PathsLike, partition_bytes: int = DEFAULT_PARTITION_BYTES) -> list[Partition]:
    """The partitions of the files ``paths`` names (see :func:`expand_paths`)."""
    return plan_partitions(expand_paths(paths), partition_bytes)


def plan_partitions(
    files: Sequence[str], partition_bytes: int = DEFAULT_PARTITION_BYTES
) -> list[Partition]:
    """Cut each file into partitions of about ``partition_bytes`` on disk (see ``_group``
    for zstd files, which may be cut by their text)."""
    plan: list[Partition] = []
    for path in files:
        size = os.path.getsize(path)
        if path.endswith(PARQUET_SUFFIX) or is_document_file(path):
            cuts = [0]  # Parquet, and JSON documents (PyTorch profiler traces), are read whole
        else:
            with open(path, "rb") as fh:
                magic = fh.read(4)
                if int.from_bytes(magic.ljust(4, b"\0"), "little") == _ZSTD_MAGIC:
                    cuts = _group(_zstd_frames(fh, size), partition_bytes)
                elif magic.startswith(_GZIP_MEMBER):
                    cuts = _gzip_cuts(fh, size, partition_bytes)
                else:
                    cuts = _line_cuts(fh, size, partition_bytes * _PLAIN_FACTOR)
        bounds = cuts + [None]
        plan.extend(
            Partition(path, i, start, end) for i, (start, end) in enumerate(zip(bounds, bounds[1:]))
        )
    return plan


def _group(frames: list[tuple[int, int]], target: int) -> list[int]:
    """Pick cut points among frame starts so each partition spans about ``target``
    bytes on disk, or ``target * _PLAIN_FACTOR`` bytes of text where the frames
    (start, content size: 0 where unknown) say what they hold, whichever comes first."""
    cuts, text = [0], 0
    for (start, _), (_, held) in zip(frames[1:], frames):
        text += held
        if start - cuts[-1] >= target or text >= target * _PLAIN_FACTOR:
            cuts.append(start)
            text = 0
    return cuts


def _zstd_frames(fh, size: int) -> list[tuple[int, int]]:
    """(offset, content size, 0 where the frame does not record it) of the zstd
    frames in a file, found by walking frame and block headers.

    Stops at the first thing that is not a whole frame (a cut-off last frame or
    garbage); the last partition then runs to the end and the decoder reports it.
    """
    starts: list[tuple[int, int]] = []
    pos = 0
    while pos < size:
        fh.seek(pos)
        head = fh.read(8)
        if len(head) < 5:
            break
        magic = int.from_bytes(head[:4], "little")
        if magic & 0xFFFFFFF0 == 0x184D2A50:  # skippable frame
            if len(head) < 8:
                break
            pos += 8 + int.from_bytes(head[4:8], "little")
            continue
        if magic != _ZSTD_MAGIC:
            break
        descriptor = head[4]
        single_segment = (descriptor >> 5) & 1
        header = 5 + (0 if single_segment else 1)
        header += (0, 1, 2, 4)[descriptor & 3]  # dictionary id
        width = (single_segment, 2, 4, 8)[descriptor >> 6]  # content size
        fh.seek(pos + header)
        held = int.from_bytes(fh.read(width), "little") + (256 if width == 2 else 0) if width else 0
        starts.append((pos, held))
        pos += header + width
        while True:
            fh.seek(pos)
            block = fh.read(3)
            if len(block) < 3:
                return starts
            value = int.from_bytes(block, "little")
            kind, block_size = (value >> 1) & 3, value >> 3
            if kind == 3:  # reserved: corrupt data
                return starts
            pos += 3 + (1 if kind == 1 else block_size)
            if value & 1:
                break
        pos += 4 if (descriptor >> 2) & 1 else 0
    return starts


def _gzip_cuts(fh, size: int, target: int) -> list[int]:
    """Cut points at gzip member starts near multiples of ``target``.

    Deflate streams do not record their length, so a candidate is a gzip header
    found by searching forward, accepted only if it decodes into the start of a line.
    """
    cuts = [0]
    offset = target
    while offset < size:
        found = _next_member(fh, offset, size)
        if found is None:
            break
        cuts.append(found)
        offset = found + target
    return cuts


def _next_member(fh, offset: int, size: int) -> int | None:
    window = 1 << 20
    while offset < size:
        fh.seek(offset)
        buf = fh.read(window + len(_GZIP_MEMBER))
        at = buf.find(_GZIP_MEMBER)
        while at != -1:
            if _is_member_start(fh, offset + at):
                return offset + at
            at = buf.find(_GZIP_MEMBER, at + 1)
        offset += window
    return None


def _is_member_start(fh, pos: int) -> bool:
    fh.seek(pos)
    probe = fh.read(1 << 16)
    try:
        out = zlib.decompressobj(wbits=31).decompress(probe, 64)
    except zlib.error:
        return False
    return out[:1] in (b"{", b"[", b"]")


def _line_cuts(fh, size: int, target: int) -> list[int]:
    cuts = [0]
    offset = target
    while offset < size:
        fh.seek(offset)
        chunk = fh.read(1 << 16)
        while chunk and b"\n" not in chunk:
            more = fh.read(1 << 16)
            if not more:
                break
            chunk += more
        newline = chunk.find(b"\n")
        if newline == -1 or offset + newline + 1 >= size:
            break
        cuts.append(offset + newline + 1)
        offset = cuts[-1] + target
    return cuts


#: Decoded from the start of a file for its first events (see ``first_events_of``).
_SAMPLE_BYTES = 1 << 20
#: Events of a PyTorch profiler trace (one JSON document) looked at.
_SAMPLE_EVENTS = 1000


def first_events_of(partition: Partition) -> Iterator[dict[str, Any]]:
    """The events of the first MiB of ``partition`` (of a JSON document: its first
    events), what a file holds learnt without reading it all."""
    if is_document_file(partition.path):
        yield from first_events(partition.path, _SAMPLE_EVENTS)
        return
    data = b""
    for chunk in iter_decoded_chunks(partition.path, partition.start, partition.end):
        data += chunk
        if len(data) >= _SAMPLE_BYTES:
            break
    for line in data.split(b"\n")[:-1] if len(data) >= _SAMPLE_BYTES else data.split(b"\n"):
        parsed = parse_line(line.strip())
        if parsed.event is not None:
            yield parsed.event
