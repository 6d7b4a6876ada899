"""The summary's index: each file's partial aggregates, kept beside the analysis so a
second summary of unchanged files skips reading them.

After a summary reads a file, the partials of its partitions are written to one
entry of the index directory (``$DFTRACE_INDEX_DIR``, else
``$XDG_CACHE_HOME/dftrace/index``, else ``~/.cache/dftrace/index``, and for a user
with no home ``<tmp>/dftrace-index-<uid>``), named by a hash of the file's real path. An entry is used only while the file is the one it
was made from: same size, same modification time (ns), same hash of its first and
last 64 KiB, read with the same partition size by the same version of the analysis.
Anything else (a file appended to, truncated, rewritten) reads the file again and
replaces the entry. An entry is written only when the file did not change while it
was read. The index is a cache: a directory that cannot be written, an entry that
cannot be read, is the same as no index, never an error. Entries hold tables
(Arrow IPC) and JSON, never code, and are read only from a directory of this user's
that no one else can write to.

Entries are small: the tables are zstd-compressed, their times and step numbers
stored as the gaps between rows (``start``, ``ts``, ``step``; the step rows put in
time order name by name first) and as durations (``end``), which compress to a few
bytes a row. An entry larger than a fifth of its file (and 64 KiB) is not kept: such
a file is read again. The whole index is held under ``$DFTRACE_INDEX_MAX_SIZE``
(256 MiB unless set; ``0``: no index is written), the entries used least recently
removed first (an entry read is marked used).
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
import tempfile
from collections.abc import Sequence
from typing import Any

import orjson
import polars as pl

from ...format import parse_trace_filename
from ..read.partition_data import PartitionData
from ..read.sources import DEFAULT_PARTITION_BYTES, Partition, PathsLike, expand_paths, first_events_of, plan_partitions
from ..read.trace import require_content
from ..runtime.executor import default_executor
from .aggregate import aggregate_partitions
from .partial import PARTIAL_TABLES, ROW_KEY, Partial, without_row_keys

#: Changes whenever what an entry holds changes.
INDEX_FORMAT = 5
_MAGIC = b"DFTRIDX1"
#: Bytes of the head and of the tail of a file hashed to tell a rewrite apart.
_EDGE_BYTES = 64 << 10
_OPTIONAL_TABLES = ("modelled", "blocked")
#: An entry is kept while it is no larger than this share of its file (or than
#: _SMALL_ENTRY): what is kept per file is aggregates, not rows.
_MAX_SHARE = 0.2
_SMALL_ENTRY = 64 << 10
#: The whole index's size unless DFTRACE_INDEX_MAX_SIZE says otherwise.
DEFAULT_MAX_SIZE = 256 << 20
#: Columns stored as the gaps between rows (times, step numbers); ``end`` is stored as a
#: duration.
_GAP_COLUMNS = ("start", "ts", "step")
#: The order the rows of a table are stored in where theirs is no order of time: the
#: rows of each name together, in time order, so that their gaps are small (a
#: million-step file's step rows, as a grouping left them, took 8 times the bytes).
_STORED_ORDER = {"steps": ["cat", "name", "start"]}
#: Integers of time beyond this are stored as they are (their gaps could overflow).
_GAP_LIMIT = 1 << 61


def partials_of(paths: PathsLike, skipped: list[str], executor: Any, partition_bytes: int, progress: bool | None,
                use_index: bool, duplicates: list[dict[str, str]] | None = None) -> list[Partial]:
    """The partials of the files ``paths`` names (those left out appended to
    ``skipped``, see ``expand_paths``), in file order: with ``use_index``, from the
    index where it holds those of an unchanged file, else read (and then kept in it).
    A file whose events are another's is left out (``copies_of_others``) and appended
    to ``duplicates``. Raises ValueError when no file holds an event
    (``require_content``)."""
    files = expand_paths(paths, skipped)
    known = {path: [without_row_keys(p) for p in load_partials(path, partition_bytes) or []] or None
             for path in files} if use_index else {}
    unread = [path for path in files if known.get(path) is None]
    identities = {path: file_identity(path) for path in unread} if use_index else {}
    read: dict[str, list[Partial]] = {}
    desc = f"reading {len(unread)} file" + ("" if len(unread) == 1 else "s")
    for partial in default_executor(executor).map_stream(aggregate_partitions, plan_partitions(unread, partition_bytes),
                                                           progress=progress, desc=desc):
        read.setdefault(partial.source.partition.path, []).append(without_row_keys(partial))
    for path, partials in read.items() if use_index else ():
        store_partials(path, identities[path], partition_bytes, partials)
    each_file = {path: known.get(path) or read.get(path, []) for path in files}
    for path, same_as in copies_of_others(each_file).items():
        del each_file[path]
        if duplicates is not None:
            duplicates.append({"path": path, "same_as": same_as})
    partials = [p for file_partials in each_file.values() for p in file_partials]
    require_content([p.source for p in partials], sum(p.events for p in partials))
    return partials


def without_copies(files: Sequence[str], executor: Any = None,
                   progress: bool | None = None) -> tuple[list[str], list[dict[str, str]]]:
    """``files`` but those whose events another holds (``copies_of_others``), as the
    summary leaves them out, and those left out (``path``, ``same_as``). The files are
    read for it (or their partials taken from the index) only where two of them begin
    with events of the same pid, as a copy begins with its original's."""
    seen: dict[Any, int] = {}
    unknown = False  # a Parquet file's events are not sampled: it may be any file's copy
    for path in files:
        first = plan_partitions([path], DEFAULT_PARTITION_BYTES)[:1]
        unknown = unknown or any(p.is_parquet for p in first)
        for pid in {event.get("pid") for p in first if not p.is_parquet for event in first_events_of(p)}:
            seen[pid] = seen.get(pid, 0) + 1
    if len(files) < 2 or not unknown and all(n < 2 for n in seen.values()):
        return list(files), []
    duplicates: list[dict[str, str]] = []
    try:
        partials_of(list(files), [], executor, DEFAULT_PARTITION_BYTES, progress, True, duplicates)
    except ValueError:  # no events at all: the command says so
        return list(files), []
    copies = {d["path"] for d in duplicates}
    return [path for path in files if path not in copies], duplicates


def copies_of_others(each_file: dict[str, list[Partial]]) -> dict[str, str]:
    """The files (path: a file that holds the same) whose processes all have their events
    in other files: the same pid, hosts, first start, last end and count of events (a copy, a trace
    converted or merged beside its files). Read twice they would count twice. Of files
    that hold the same, those with more processes (a merged one) go first, then those
    not named as a process's trace file, then the later."""
    held: dict[str, set[tuple]] = {}
    for path, partials in each_file.items():
        extents: dict[tuple, list[int]] = {}
        for partial in partials:
            table = partial.extents
            keyed = table.columns[:2] == ROW_KEY
            for row in table.select(*(ROW_KEY if keyed else []), "start", "end", "n").iter_rows():
                key, (start, end, n) = (row[:2], row[2:]) if keyed else (partial.keys[0], row)
                seen = extents.setdefault(tuple(key), [start, end, 0])
                seen[0], seen[1], seen[2] = min(seen[0], start), max(seen[1], end), seen[2] + n
        if extents:
            # The same pid and times on another host are another process.
            host = {record.get("pid"): str(record.get("args", {}).get("name")) for partial in partials
                    for record in partial.source.meta if record.get("name") == "HH"}
            held[path] = {(*key, *value, host.get(key[0])) for key, value in extents.items()}
    holders: dict[tuple, list[str]] = {}
    for path, processes in held.items():
        for process in processes:
            holders.setdefault(process, []).append(path)
    order = {path: place for place, path in enumerate(held)}
    copies: dict[str, str] = {}
    candidates = [path for path, processes in held.items() if all(len(holders[p]) > 1 for p in processes)]
    # A file named as one process's own trace is kept over a copy named otherwise.
    for path in sorted(candidates, key=lambda p: (-len(held[p]), parse_trace_filename(p) is not None, -order[p])):
        if all(len(holders[process]) > 1 for process in held[path]):
            for process in held[path]:
                holders[process].remove(path)
            copies[path] = holders[min(held[path])][0]
    return copies


def max_size() -> int:
    """The most bytes the index may hold (``DFTRACE_INDEX_MAX_SIZE``: bytes, or with a
    K, M or G suffix); a value that cannot be read is the default, and a warning says
    so (once)."""
    given = os.environ.get("DFTRACE_INDEX_MAX_SIZE", "")
    text = given.strip().upper().removesuffix("B").removesuffix("I")
    if not text:
        return DEFAULT_MAX_SIZE
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    try:
        size = float(text.rstrip("KMG"))
        if size != size or size in (float("inf"), float("-inf")) or size < 0:
            raise ValueError(given)
        return int(size * scale)
    except ValueError:
        global _told_bad_size
        if not _told_bad_size:
            _told_bad_size = True
            import warnings

            warnings.warn(f"dftrace: DFTRACE_INDEX_MAX_SIZE={given!r} is not a size (bytes, or "
                          f"with a K, M or G suffix, such as 512M): the index holds at most "
                          f"{DEFAULT_MAX_SIZE >> 20}M", RuntimeWarning, stacklevel=2)
        return DEFAULT_MAX_SIZE


def index_dir() -> str:
    """Where the index entries go."""
    chosen = os.environ.get("DFTRACE_INDEX_DIR")
    if chosen:
        return chosen
    cache = os.environ.get("XDG_CACHE_HOME")
    if not cache:
        home = os.path.expanduser("~")
        if not os.path.isabs(home):
            return _homeless_dir()
        cache = os.path.join(home, ".cache")
    return os.path.join(cache, "dftrace", "index")


_told_homeless = False
_told_bad_size = False


def _homeless_dir() -> str:
    """The index of a user with no home (no HOME, no passwd entry: a container's
    arbitrary uid): a directory of the temporary directory named by the uid, never
    ``~`` in the working directory. Used only while it is this user's and no one
    else's (see _trusted_dir); said once."""
    global _told_homeless
    directory = os.path.join(tempfile.gettempdir(), f"dftrace-index-{os.getuid()}")
    if not _told_homeless:
        _told_homeless = True
        import warnings

        warnings.warn(f"dftrace: this user has no home directory (HOME unset, no passwd "
                      f"entry): the summary's index is kept in {directory}", RuntimeWarning,
                      stacklevel=2)
    return directory


def _entry_path(path: str) -> str:
    digest = hashlib.sha256(os.path.realpath(path).encode("utf-8", "surrogateescape")).hexdigest()
    return os.path.join(index_dir(), digest[:32] + ".idx")


_fingerprint: str | None = None


def _analysis_fingerprint() -> str:
    """The version of the code that makes the partials: an entry made by other code is
    not used (installed releases and working copies alike)."""
    global _fingerprint
    if _fingerprint is None:
        from ... import __version__

        # Every module of the analysis and of the format's reader and rules decides
        # what a partial counts.
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        sources, stamps = [], []
        for top in (package, os.path.join(os.path.dirname(package), "format")):
            for folder, dirs, names in os.walk(top):
                dirs.sort()
                sources += [os.path.join(folder, name) for name in sorted(names)
                            if name.endswith((".py", ".so", ".pyd"))]
        for source in sources:
            stat = os.stat(source)
            stamps.append(f"{os.path.relpath(source, package)}:{stat.st_size}:{stat.st_mtime_ns}")
        _fingerprint = hashlib.sha256(
            "|".join([__version__, str(INDEX_FORMAT), pl.__version__, *stamps]).encode()).hexdigest()
    return _fingerprint


def file_identity(path: str) -> dict[str, Any] | None:
    """Size, modification time and a hash of the head and tail bytes of ``path``."""
    try:
        with open(path, "rb") as fh:
            stat = os.fstat(fh.fileno())
            digest = hashlib.blake2b(digest_size=16)
            digest.update(fh.read(_EDGE_BYTES))
            if stat.st_size > _EDGE_BYTES:
                fh.seek(max(_EDGE_BYTES, stat.st_size - _EDGE_BYTES))
                digest.update(fh.read(_EDGE_BYTES))
    except OSError:
        return None
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "edges": digest.hexdigest()}


def _trusted_dir(directory: str) -> bool:
    """True when ``directory`` is this user's and no one else can write to it."""
    try:
        stat = os.stat(directory)
    except OSError:
        return False
    return not hasattr(os, "getuid") or (stat.st_uid == os.getuid() and not stat.st_mode & 0o022)


def load_partials(path: str, partition_bytes: int) -> list[Partial] | None:
    """The partials of ``path`` from its entry, or None when there is no valid one."""
    entry = _entry_path(path)
    if not _trusted_dir(os.path.dirname(entry)):
        return None
    try:
        with open(entry, "rb") as fh:
            partials = _decoded(fh, path, partition_bytes)
        if partials is not None:
            os.utime(entry)  # used: the last to be evicted
        return partials
    except Exception:  # no entry, or a damaged one: the same as none
        return None


def store_partials(path: str, identity: dict[str, Any] | None, partition_bytes: int,
                   partials: Sequence[Partial]) -> bool:
    """Write the entry of ``path`` when the file still is as ``identity`` (taken before
    it was read) says; True when written."""
    if identity is None or not partials or identity != file_identity(path):
        return False
    if any(p.source.activity is not None for p in partials):
        return False  # profiler traces hold their events: not worth an entry
    directory, limit = index_dir(), max_size()
    if not limit:
        return False
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        if not _trusted_dir(directory):
            return False
        fd, temporary = tempfile.mkstemp(dir=directory, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                _write_entry(fh, path, identity, partition_bytes, partials)
                size = fh.tell()
            if size > max(_SMALL_ENTRY, _MAX_SHARE * identity["size"]) or size > limit:
                os.unlink(temporary)  # rows, not aggregates: reading the file again is cheaper
                return False
            os.replace(temporary, _entry_path(path))
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise
        _evict(directory, limit)
    except Exception:  # no room, no rights, metadata JSON cannot hold (an int beyond 64 bits): no entry
        return False
    return True


def _evict(directory: str, limit: int) -> None:
    """Remove the entries used least recently until the index holds at most ``limit`` bytes."""
    entries = []
    with os.scandir(directory) as found:
        for item in found:
            if item.name.endswith(".idx"):
                try:
                    stat = item.stat(follow_symlinks=False)
                except OSError:
                    continue
                entries.append((stat.st_mtime_ns, stat.st_size, item.path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= limit:
            break
        try:
            os.unlink(path)
        except OSError:
            continue
        total -= size


def _write_entry(fh: Any, path: str, identity: dict[str, Any], partition_bytes: int,
                 partials: Sequence[Partial]) -> None:
    """The tables one after the other (Arrow IPC), then the JSON header saying where
    each one is, then the header's length: written as made, never held whole."""
    fh.write(_MAGIC)
    spans: list[tuple[int, int]] = []

    def table(frame: pl.DataFrame | None, kind: str = "") -> int | None:
        if frame is None:
            return None
        start = fh.tell()
        if kind in _STORED_ORDER:  # then by every column: the same rows are stored the same
            first = _STORED_ORDER[kind]
            frame = frame.sort([*first, *(c for c in frame.columns if c not in first)], nulls_last=True)
        packed, gaps = _packed(frame)
        packed.write_ipc(fh, compression="zstd")
        spans.append((start, fh.tell(), gaps))
        return len(spans) - 1

    described = []
    for p in partials:
        s = p.source
        described.append({
            "partition": [s.partition.index, s.partition.start, s.partition.end],
            "meta": s.meta, "n_lines": s.n_lines, "broken": s.broken, "broken_count": s.broken_count,
            "cut_off": s.cut_off, "closed": s.closed, "keys": p.keys,
            "events": table(s.events), "phases": table(p.phases),
            "tables": {kind: table(getattr(p, kind), kind) for kind in (*PARTIAL_TABLES, *_OPTIONAL_TABLES)},
        })
    header = orjson.dumps({
        "fingerprint": _analysis_fingerprint(), "path": os.path.realpath(path), "identity": identity,
        "partition_bytes": partition_bytes, "partials": described, "spans": spans,
    })
    fh.write(header)
    fh.write(struct.pack("<Q", len(header)))


def _decoded(fh: Any, path: str, partition_bytes: int) -> list[Partial] | None:
    """The partials of the entry open as ``fh``, a table read at a time."""
    if fh.read(len(_MAGIC)) != _MAGIC:
        return None
    size = fh.seek(0, os.SEEK_END)
    fh.seek(size - 8)
    (length,) = struct.unpack("<Q", fh.read(8))
    fh.seek(size - 8 - length)
    header = orjson.loads(fh.read(length))
    if (header["fingerprint"] != _analysis_fingerprint() or header["path"] != os.path.realpath(path)
            or header["partition_bytes"] != partition_bytes or header["identity"] != file_identity(path)):
        return None
    spans = header["spans"]

    def table(i: int | None) -> pl.DataFrame | None:
        if i is None:
            return None
        begin, end, gaps = spans[i]
        fh.seek(begin)
        return _unpacked(pl.read_ipc(io.BytesIO(fh.read(end - begin))), gaps)

    partials = []
    for d in header["partials"]:
        index, first, last = d["partition"]
        source = PartitionData(
            Partition(path, index, first, last), table(d["events"]), meta=d["meta"], n_lines=d["n_lines"],
            broken=[(number, reason) for number, reason in d["broken"]], broken_count=d["broken_count"],
            cut_off=d["cut_off"], closed=d["closed"],
        )
        partials.append(Partial(source, [(pid, key) for pid, key in d["keys"]], phases=table(d["phases"]),
                                **{kind: table(i) for kind, i in d["tables"].items()}))
    return partials


def _packed(frame: pl.DataFrame) -> tuple[pl.DataFrame, list[list[str]]]:
    """``frame`` with its times and step numbers as gaps and durations (see the
    module's docstring), and the columns so stored with their types: only integers
    without nulls whose values stay far from overflowing."""
    def fits(column: str) -> bool:
        series = frame.get_column(column)
        return (series.dtype.is_integer() and series.dtype != pl.UInt64 and not series.null_count()
                and (series.is_empty() or -_GAP_LIMIT < series.min() and series.max() < _GAP_LIMIT))  # type: ignore[operator]

    gaps = [c for c in _GAP_COLUMNS if c in frame.columns and fits(c)]
    durations = "end" in frame.columns and "start" in gaps and fits("end")
    changed = [pl.col(c).cast(pl.Int64).diff().fill_null(pl.col(c).first()) for c in gaps]
    if durations:
        changed.append(pl.col("end").cast(pl.Int64) - pl.col("start"))
        gaps.append("end")
    stored = [[c, str(frame.schema[c])] for c in gaps]
    return (frame.with_columns(changed) if changed else frame), stored


def _unpacked(frame: pl.DataFrame, gaps: list[list[str]]) -> pl.DataFrame:
    """The table :func:`_packed` stored, as it was."""
    types = {column: getattr(pl, dtype) for column, dtype in gaps}
    sums = [pl.col(c).cum_sum() for c in types if c != "end"]
    if sums:
        frame = frame.with_columns(sums)
    if "end" in types:
        frame = frame.with_columns(pl.col("end") + pl.col("start"))
    return frame.with_columns(pl.col(c).cast(t) for c, t in types.items()) if types else frame
