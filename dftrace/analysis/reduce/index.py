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

from .partial import PARTIAL_TABLES, Partial
from ..read.decode import PartitionData
from ..read.sources import Partition

#: Changes whenever what an entry holds changes.
INDEX_FORMAT = 3
_MAGIC = b"DFTRIDX1"
#: Bytes of the head and of the tail of a file hashed to tell a rewrite apart.
_EDGE_BYTES = 64 << 10
_OPTIONAL_TABLES = ("modelled", "blocked")


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
            return _decoded(fh, path, partition_bytes)
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
    directory = index_dir()
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        if not _trusted_dir(directory):
            return False
        fd, temporary = tempfile.mkstemp(dir=directory, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                _write_entry(fh, path, identity, partition_bytes, partials)
            os.replace(temporary, _entry_path(path))
        except BaseException:
            os.unlink(temporary)
            raise
    except Exception:  # no room, no rights, metadata JSON cannot hold (an int beyond 64 bits): no entry
        return False
    return True


def _write_entry(fh: Any, path: str, identity: dict[str, Any], partition_bytes: int,
                 partials: Sequence[Partial]) -> None:
    """The tables one after the other (Arrow IPC), then the JSON header saying where
    each one is, then the header's length: written as made, never held whole."""
    fh.write(_MAGIC)
    spans: list[tuple[int, int]] = []

    def table(frame: pl.DataFrame | None) -> int | None:
        if frame is None:
            return None
        start = fh.tell()
        frame.write_ipc(fh, compression="uncompressed")
        spans.append((start, fh.tell()))
        return len(spans) - 1

    described = []
    for p in partials:
        s = p.source
        described.append({
            "partition": [s.partition.index, s.partition.start, s.partition.end],
            "meta": s.meta, "n_lines": s.n_lines, "broken": s.broken, "broken_count": s.broken_count,
            "cut_off": s.cut_off, "closed": s.closed, "keys": p.keys,
            "events": table(s.events), "phases": table(p.phases),
            "tables": {kind: table(getattr(p, kind)) for kind in (*PARTIAL_TABLES, *_OPTIONAL_TABLES)},
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
        begin, end = spans[i]
        fh.seek(begin)
        return pl.read_ipc(io.BytesIO(fh.read(end - begin)))

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
