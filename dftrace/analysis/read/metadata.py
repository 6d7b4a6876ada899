"""Resolving hosts, ranks, process and thread names, and clock anchors across files.

Metadata lives at the top of each file, so it is gathered from every partition
first and resolved once. The host of a pid in a file comes from that pid's ``HH``
(hostname hash) or ``PR`` (process info) record in the file, else from any such
record in the file, else from the file name. A process is a (host, pid) pair,
wherever its events and part files are.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from ... import format as fmt

_RANK_IN_NAME = re.compile(r"\brank\s*(\d+)\b")


@dataclass
class Process:
    """One traced process and what its metadata says about it."""

    host: str
    pid: int
    rank: int | None = None
    #: ``process_name`` as written (e.g. ``rank 3 · host17 · pid 4242``).
    name: str | None = None
    #: Clock anchor: wall and monotonic clocks (ns) read at one instant at start-up.
    wall_ns: int | None = None
    mono_ns: int | None = None
    #: Every clock anchor of the process, (wall_ns, mono_ns), the first one above
    #: included: later ones (``profile_steps`` writes one per profiler window) say how
    #: far the wall clock had moved against dftrace's clock by then.
    anchors: list[tuple[int, int]] = field(default_factory=list)
    #: Events the writer reported as dropped.
    dropped: int = 0
    #: How the process ended when the trace says (``process_end``: "killed by signal 9").
    ended: str | None = None
    files: list[str] = field(default_factory=list)
    #: ``PR`` args: cmdline, cwd, python, hostname, rank, local_rank, ...
    info: dict[str, Any] = field(default_factory=dict)
    #: ``CM`` custom metadata, name -> value.
    custom: dict[str, Any] = field(default_factory=dict)

    #: For a helper process (a traced child: a DataLoader worker, a pool's): "worker 0 of rank 1".
    role: str | None = None

    @property
    def dataloader_worker(self) -> bool:
        """A PyTorch DataLoader worker: its file says so (``CM dataloader.worker``)."""
        return "dataloader.worker" in self.custom

    @property
    def label(self) -> str:
        """``rank R · host · pid P`` (without the rank part when it is unknown), or
        ``worker K of rank R · host · pid P`` for a DataLoader worker."""
        base = f"{self.host} · pid {self.pid}"
        if self.role is not None:
            return f"{self.role} · {base}"
        return base if self.rank is None else f"rank {self.rank} · {base}"


@dataclass
class FileMetadata:
    """What one partition contributes to resolution.

    Metadata records are ``{"pid", "tid", "name", "cat", "args"}`` dicts; a record
    may also carry ``host_key`` (its host, for tables that already resolved it) and
    ``synthetic: True`` (used for resolution only, not kept as a record).
    """

    path: str
    meta: list[dict[str, Any]]
    #: (pid, host_key) pairs its events carry; host_key is empty unless the host is
    #: already known.
    keys: Iterable[tuple[int, str]]


@dataclass
class Resolution:
    """Processes in rank order and the lookups that map partition keys onto them."""

    processes: list[Process]
    #: (file, pid, host_key) -> index into ``processes``.
    index: dict[tuple[str, int, str], int]
    #: (process index, tid) -> thread name.
    threads: dict[tuple[int, int], str]
    #: Every metadata record as (process index, record), in file order.
    records: list[tuple[int, dict[str, Any]]]

    def process_of(self, path: str, pid: int, host_key: str) -> int:
        return self.index[(path, pid, host_key)]

    def owners(self) -> dict[int, int]:
        """Each helper process (a traced child, see ``Process.role``) -> the index of
        the process it works for: a DataLoader worker's compute is its parent's."""
        by_key = {(p.host, p.pid): i for i, p in enumerate(self.processes)}
        owned = {i: by_key.get((p.host, _as_int(p.info.get("ppid")))) for i, p in enumerate(self.processes)
                 if p.role is not None}
        return {i: owner for i, owner in owned.items() if owner is not None}


def _host_key(record: dict[str, Any]) -> str:
    return record.get("host_key") or ""


def _hostname(record: dict[str, Any]) -> str | None:
    """The host a metadata record names (``HH`` args.name or ``PR`` args.hostname)."""
    if record["name"] == fmt.META_HOSTNAME_HASH:
        host = record["args"].get("name")
    elif record["name"] == fmt.META_PROCESS_INFO:
        host = record["args"].get("hostname")
    else:
        return None
    return host if isinstance(host, str) and host else None


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _name_workers(by_key: dict[tuple[str, int], Process]) -> None:
    """Name the traced children of a traced process (DataLoader workers) after it:
    ``worker K of rank R``, K the worker's id when its ``worker_init_fn`` recorded
    one, else its place among its siblings in start (pid) order."""
    children: dict[tuple[str, int], list[Process]] = {}
    for proc in by_key.values():
        ppid = _as_int(proc.info.get("ppid"))
        if ppid is not None and (proc.host, ppid) in by_key and ppid != proc.pid:
            parent = by_key[(proc.host, ppid)]
            if proc.rank is not None and proc.rank != parent.rank \
                    and "dataloader.worker" not in proc.custom:
                continue  # a rank a launcher started (Lightning's ranks are its children)
            children.setdefault((proc.host, ppid), []).append(proc)
    for key, kids in children.items():
        parent = by_key[key]
        owner = f"rank {parent.rank}" if parent.rank is not None else f"pid {parent.pid}"
        for k, kid in enumerate(sorted(kids, key=lambda p: p.pid)):
            worker = _as_int(kid.custom.get("dataloader.worker"))
            kid.role = f"worker {worker if worker is not None else k} of {owner}"


def resolve(files: Iterable[FileMetadata]) -> Resolution:
    """Resolve every partition's metadata together (see the module docstring)."""
    files = list(files)
    pid_host: dict[tuple[str, int | None], str] = {}
    file_host: dict[str, str] = {}
    for part in files:
        for record in part.meta:
            host = _hostname(record)
            if host is not None:
                pid_host.setdefault((part.path, _as_int(record.get("pid"))), host)
                file_host.setdefault(part.path, host)
    for part in files:
        if part.path not in file_host:
            parsed = fmt.parse_trace_filename(part.path)
            if parsed is not None:
                file_host[part.path] = parsed.host

    def host_of(path: str, pid: int, host_key: str) -> str:
        return host_key or pid_host.get((path, pid)) or file_host.get(path) or "unknown"

    by_key: dict[tuple[str, int], Process] = {}
    index_by_key: dict[tuple[str, int, str], tuple[str, int]] = {}
    per_process_records: list[tuple[tuple[str, int], dict[str, Any]]] = []

    def process(path: str, pid: int, host_key: str) -> tuple[str, int]:
        key = (host_of(path, pid, host_key), pid)
        proc = by_key.get(key)
        if proc is None:
            proc = by_key[key] = Process(host=key[0], pid=pid)
        if path not in proc.files:
            proc.files.append(path)
        index_by_key[(path, pid, host_key)] = key
        return key

    for part in files:
        for pid, host_key in part.keys:
            process(part.path, pid, host_key)
        for record in part.meta:
            pid = _as_int(record.get("pid"))
            if pid is None:
                continue
            key = process(part.path, pid, _host_key(record))
            if record.get("synthetic"):
                by_key[key].rank = _as_int(record["args"].get("rank"))
                continue
            _apply(by_key[key], record)
            per_process_records.append((key, record))
    for proc in by_key.values():
        if proc.rank is None:
            proc.rank = _rank_from_files(proc)
    _name_workers(by_key)

    ordered = sorted(
        by_key.values(), key=lambda p: (p.rank is None, p.rank if p.rank is not None else 0, p.host, p.pid)
    )
    position = {(p.host, p.pid): i for i, p in enumerate(ordered)}
    threads: dict[tuple[int, int], str] = {}
    records = []
    for key, record in per_process_records:
        i = position[key]
        records.append((i, record))
        tid = _as_int(record.get("tid"))
        name = record["args"].get("name")
        if record["name"] == fmt.META_THREAD_NAME and tid is not None and isinstance(name, str):
            threads[(i, tid)] = name
    index = {k: position[v] for k, v in index_by_key.items()}
    return Resolution(ordered, index, threads, records)


def _apply(proc: Process, record: dict[str, Any]) -> None:
    name, args = record["name"], record["args"]
    if name == fmt.META_PROCESS_NAME and isinstance(args.get("name"), str):
        proc.name = args["name"]
        match = _RANK_IN_NAME.search(proc.name)
        if match and proc.rank is None:
            proc.rank = int(match.group(1))
    elif name == fmt.META_PROCESS_INFO:
        proc.info.update(args)
        rank = _as_int(args.get("rank"))
        if rank is not None:
            proc.rank = rank
    elif name == fmt.META_CLOCK_ANCHOR:
        wall, mono = _as_int(args.get("wall_ns")), _as_int(args.get("mono_ns"))
        if proc.wall_ns is None:
            proc.wall_ns, proc.mono_ns = wall, mono
        if wall is not None and mono is not None and (wall, mono) not in proc.anchors:
            proc.anchors.append((wall, mono))
    elif name == fmt.META_DROPPED:
        proc.dropped += _as_int(args.get("count")) or 0
    elif name == fmt.META_PROCESS_END and isinstance(args.get("how"), str):
        proc.ended = args["how"]
    elif name == fmt.META_CUSTOM and isinstance(args.get("name"), str):
        proc.custom[args["name"]] = args.get("value")


def _rank_from_files(proc: Process) -> int | None:
    for path in proc.files:
        parsed = fmt.parse_trace_filename(path)
        if parsed is not None and parsed.rank is not None and parsed.pid == proc.pid:
            return parsed.rank
    return None


def synthetic_records(pid: int, host: str, rank: int | None) -> list[dict[str, Any]]:
    """Records that pin a process of already resolved data (Parquet, an in-memory
    :class:`TraceTable`) to its ``rank``, so resolution reproduces it."""
    if rank is None:
        return []
    return [
        {"pid": pid, "tid": None, "name": fmt.META_PROCESS_INFO, "cat": None,
         "args": {"rank": rank}, "host_key": host, "synthetic": True}
    ]


def resolved_records(
    processes: Iterable[dict[str, Any]], meta: Iterable[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Metadata records for data whose hosts and ranks are already resolved.

    ``processes`` rows have host, pid and rank; ``meta`` rows are ``TraceTable.meta``
    rows. Each record is keyed by its host, and synthetic records restore ranks.
    """
    records: list[dict[str, Any]] = []
    for proc in processes:
        records.extend(synthetic_records(proc["pid"], proc["host"], proc["rank"]))
    for row in meta:
        records.append(
            {"pid": row["pid"], "tid": row["tid"], "name": row["name"], "cat": row["cat"],
             "args": orjson.loads(row["args"]), "host_key": row["host"]}
        )
    return records
