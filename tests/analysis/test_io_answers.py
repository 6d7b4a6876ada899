"""The file-I/O answers: traces written with known I/O calls (several ranks, a
DataLoader worker, aggregated events, odd paths, damaged args), every figure checked
against the calls as written."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import tracegen

pl = pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from dftrace.analysis import load_traces, render_text, summarize  # noqa: E402
from dftrace.analysis.commands import main  # noqa: E402
from dftrace.analysis.answers.diff import compare_summaries  # noqa: E402
from dftrace.analysis.answers.sql import run_sql  # noqa: E402

KIB, MIB = 1 << 10, 1 << 20
FILE_A = "/data/train (1).bin"
FILE_B = "/data/it's \"quoted\" | piped.idx"
FILE_C = "/ckpt/ümlaut-😀/model.pt"
FILE_D = "/tmp/a\\b\tc.txt"
FILE_E = "/data/shard-(0)|'e'.rec"
HASHES = {FILE_A: "00000000000000a1", FILE_B: "00000000000000b2", FILE_C: "00000000000000c3",
          FILE_D: "00000000000000d4", FILE_E: "00000000000000e5"}
READS = {"read", "pread", "readv", "preadv", "fread", "fgets"}
WRITES = {"write", "pwrite", "writev", "pwritev", "fwrite", "fputs"}
#: Darshan's size buckets: lower bounds, inclusive.
EDGES = (100, KIB, 10 * KIB, 100 * KIB, MIB, 4 * MIB, 10 * MIB, 100 * MIB, 1 << 30)


@dataclass
class Call:
    """One I/O event as written, with where it was placed."""

    pid: int
    rank: int
    tid: int
    name: str
    ts: int
    dur: int
    args: dict[str, Any]
    cat: str = "POSIX"
    #: loader, checkpoint, compute: the spans it starts in (or a worker's, loader).
    inside: set[str] = field(default_factory=set)

    @property
    def kind(self) -> str:
        if self.name in READS:
            return "read"
        if self.name in WRITES:
            return "write"
        if self.name in ("fsync", "fdatasync"):
            return "sync"
        return "other" if self.name == "mmap" else "metadata"

    @property
    def ops(self) -> int:
        calls = self.args.get("calls")
        return calls if isinstance(calls, int) and calls >= 1 else 1

    @property
    def bytes(self) -> int:
        ret = self.args.get("ret")
        ok = isinstance(ret, int) and not isinstance(ret, bool) and 0 < ret <= 1 << 50
        return ret if ok and self.kind in ("read", "write") else 0

    @property
    def path(self) -> str | None:
        return next((p for p, h in HASHES.items() if h == self.args.get("fhash")), None)


def _span(proc: tracegen.Process, name: str, index: int = 0) -> dict[str, Any]:
    return [e for e in proc.events if e["name"] == name][index]


def _add(proc: tracegen.Process, written: list[Call], name: str, ts: int, dur: int, *, tid: int | None = None,
         inside: set[str] | None = None, cat: str = "POSIX", raw_args: Any = None, **args: Any) -> None:
    tid = proc.pid if tid is None else tid
    call = Call(proc.pid, proc.rank, tid, name, ts, dur, args, cat, inside or set())
    written.append(call)
    line_args = raw_args if raw_args is not None else {"hhash": proc.hhash, "level": 0, "p_idx": 0, **args}
    event = {"id": proc.next_id, "name": name, "cat": cat, "pid": proc.pid, "tid": tid, "ts": ts, "dur": dur,
             "ph": "X"}
    if raw_args != "absent":
        event["args"] = line_args
    proc.events.append(event)
    proc.next_id += 1


def _meta(proc: tracegen.Process, name: str, args: dict[str, Any]) -> None:
    proc.events.append({"name": name, "cat": "dftrace", "pid": proc.pid, "tid": proc.pid, "ph": "M",
                        "args": {"hhash": proc.hhash, **args}})


def _names(proc: tracegen.Process, *paths: str) -> None:
    for path in paths:
        _meta(proc, "FH", {"name": path, "value": HASHES[path]})


def _dataloader_worker(pid: int, ppid: int) -> tracegen.Process:
    """A child of ``ppid`` that says it is a DataLoader worker, as every worker's file does."""
    worker = tracegen.Process(pid, "node0", 0, ppid=ppid)
    _meta(worker, "CM", {"name": "dataloader.worker", "value": "0", "num_workers": 1})
    return worker


def build(directory: Path, *, with_io: bool = True, extra_read: int = 0) -> list[Call]:
    """Two ranks, a DataLoader worker of rank 0 and another child of it (a pool's
    helper, whose I/O is no data loading); returns the I/O calls written."""
    calls: list[Call] = []
    rank0 = tracegen.training_process(1000, rank=0, epochs=1, steps=3)
    rank1 = tracegen.training_process(1001, rank=1, host="node1", epochs=1, steps=3)
    worker = _dataloader_worker(1100, 1000)
    helper = tracegen.Process(1200, "node0", 0, ppid=1000)
    if with_io:
        t0 = tracegen.T0_US
        _names(rank0, FILE_A, FILE_B, FILE_C, FILE_D)
        _add(rank0, calls, "open", t0 - 1000, 4, fhash=HASHES[FILE_A], ret=3)
        _add(rank0, calls, "stat", t0 - 990, 6, fhash=HASHES[FILE_B], ret=0)
        _add(rank0, calls, "read", t0 - 980, 2, fhash=HASHES[FILE_A], ret=-1, errno=5, count=4096, offset=0)
        _add(rank0, calls, "mmap", t0 - 970, 1, fhash=HASHES[FILE_A], ret=0)
        for step in range(3):
            fetch, forward = _span(rank0, "fetch.iter", step), _span(rank0, "forward", step)
            _add(rank0, calls, "read", fetch["ts"] + 2, 7, inside={"loader"}, fhash=HASHES[FILE_A],
                 ret=128 * KIB, count=128 * KIB, offset=step * 128 * KIB)
            _add(rank0, calls, "pread", forward["ts"] + 3, 11, inside={"compute"}, fhash=HASHES[FILE_B],
                 ret=1000, count=1000, offset=step * 1000)
            # The loader thread's data span runs during the forward pass: aggregated reads.
            preprocess = [e for e in rank0.events if e["name"] == "preprocess"][step]
            _add(rank0, calls, "pread", preprocess["ts"] + 1, 200, tid=preprocess["tid"],
                 inside={"loader", "compute"}, fhash=HASHES[FILE_A], ret=10 * 8 * KIB, count=10 * 8 * KIB,
                 offset=0, calls=10, aggregated=True)
        save = _span(rank0, "save")
        _add(rank0, calls, "write", save["ts"] + 5, 50, inside={"checkpoint"}, fhash=HASHES[FILE_C],
             ret=4 * MIB, count=4 * MIB, offset=0)
        _add(rank0, calls, "fsync", save["ts"] + 60, 30, inside={"checkpoint"}, fhash=HASHES[FILE_C], ret=0)
        end = max(e["ts"] + e["dur"] for e in rank0.events if e.get("ph") == "X")
        _add(rank0, calls, "fopen", end + 10, 3, cat="STDIO", fhash=HASHES[FILE_D], ret=0)
        _add(rank0, calls, "fread", end + 20, 5, cat="STDIO", fhash=HASHES[FILE_D], ret=100, count=100)
        _add(rank0, calls, "fgets", end + 30, 2, cat="STDIO", fhash=HASHES[FILE_D], ret=50, count=4096)
        _add(rank0, calls, "fclose", end + 40, 1, cat="STDIO", fhash=HASHES[FILE_D], ret=0)
        # Damaged args: text for a number, calls below one, a hash not named, no args at all.
        _add(rank0, calls, "read", end + 50, 3, fhash=HASHES[FILE_A], ret="many", calls="ten")
        _add(rank0, calls, "write", end + 60, 4, fhash=HASHES[FILE_D], ret=10, calls=-3)
        _add(rank0, calls, "pwrite", end + 70, 4, fhash="ffffffffffffffff", ret=2 * KIB, calls=0)
        _add(rank0, calls, "read", end + 80, 1, raw_args="absent")
        _add(rank0, calls, "lseek", end + 90, 1, fhash=HASHES[FILE_A], ret=True)
        if extra_read:
            _add(rank0, calls, "read", end + 100, 9, fhash=HASHES[FILE_A], ret=extra_read, count=extra_read)
        _meta(rank0, "io_file", {"fhash": HASHES[FILE_A], "path": FILE_A, "read_ops": 6, "seq_reads": 1,
                                 "consec_reads": 1, "write_ops": 0, "seq_writes": 0,
                                 "read_hist": [0, 0, 0, 0, 5, 0, 0, 0, 0, 0], "write_hist": [0] * 10})
        _meta(rank0, "io_file", {"fhash": HASHES[FILE_B], "path": FILE_B, "read_ops": 3, "seq_reads": 2,
                                 "consec_reads": 2, "write_ops": "x", "read_hist": [0, 3, "x", None] + [0] * 6})
        _meta(rank0, "io_file", {"fhash": HASHES[FILE_C], "path": FILE_C, "write_ops": 1, "seq_writes": 1,
                                 "write_hist": [0, 0, 0, 0, 0, 0, 1, 0, 0, 0]})
        _meta(rank0, "io", {"calls": 40, "events": 31, "aggregated_calls": 30, "dropped": 2})
        _names(rank1, FILE_A)
        for step in range(3):
            forward = _span(rank1, "forward", step)
            _add(rank1, calls, "pread", forward["ts"] + 4, 13, inside={"compute"}, fhash=HASHES[FILE_A],
                 ret=2 * MIB, count=2 * MIB, offset=step * 2 * MIB)
        # The worker reads while its rank computes, and before the first step.
        _names(worker, FILE_E)
        backward = _span(rank0, "backward", 1)
        _add(worker, calls, "openat", backward["ts"] + 1, 5, inside={"loader", "compute"},
             fhash=HASHES[FILE_E], ret=7)
        _add(worker, calls, "read", backward["ts"] + 10, 40, inside={"loader", "compute"},
             fhash=HASHES[FILE_E], ret=64 * KIB, count=64 * KIB)
        _add(worker, calls, "read", t0 - 500, 20, inside={"loader"}, fhash=HASHES[FILE_E], ret=32 * KIB,
             count=32 * KIB)
        _names(helper, FILE_D)
        _add(helper, calls, "write", end + 200, 8, fhash=HASHES[FILE_D], ret=3 * KIB, count=3 * KIB)
    for proc in (rank0, rank1):
        tracegen.write_process(directory, proc)
    tracegen.write_process(directory, worker, prefix="worker")
    tracegen.write_process(directory, helper, prefix="helper")
    return calls


def figures(calls: list[Call]) -> dict[str, int]:
    """The figures of ``calls`` by the documented rules, counted here."""

    def total(attr: str, kind: str | None = None) -> int:
        return sum(getattr(c, attr) for c in calls if kind is None or c.kind == kind)

    return {
        "read_bytes": total("bytes", "read"), "write_bytes": total("bytes", "write"),
        "read_ops": total("ops", "read"), "write_ops": total("ops", "write"),
        "metadata_ops": total("ops", "metadata"), "sync_ops": total("ops", "sync"),
        "other_ops": total("ops", "other"), "ops": total("ops"), "io_time_us": total("dur"),
        "read_time_us": total("dur", "read"), "write_time_us": total("dur", "write"),
        "metadata_time_us": total("dur", "metadata"), "sync_time_us": total("dur", "sync"),
    }


def _bucket(size: int) -> int:
    return sum(size >= edge for edge in EDGES)


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Call]]:
    directory = tmp_path_factory.mktemp("io")
    return directory, build(directory)


@pytest.fixture(scope="module")
def summary(traced):
    return summarize(traced[0], index=False)


def test_totals_equal_the_calls_written(traced, summary):
    calls = traced[1]
    io = summary.io
    assert {key: io[key] for key in figures(calls)} == figures(calls)
    assert all(type(io[key]) is int for key in ("read_bytes", "write_bytes", "read_ops", "write_ops",
                                                "metadata_ops", "io_time_us"))
    moved = io["read_bytes"] + io["write_bytes"]
    assert io["bandwidth_bytes_per_s"] == round(moved * 1e6 / io["io_time_us"], 1)
    assert io["read_bytes_per_s"] == round(io["read_bytes"] * 1e6 / io["read_time_us"], 1)
    assert io["metadata_share"] == round(io["metadata_time_us"] / io["io_time_us"], 4)
    # Rank 0's from its per-file counters (A: 5 reads 100K-1M, B: 3 reads 100-1K, C: 1 write
    # 4M-10M), the others' from their events.
    counted = {"read": [0, 3, 0, 0, 5, 0, 0, 0, 0, 0], "write": [0, 0, 0, 0, 0, 0, 1, 0, 0, 0]}
    for kind in ("read", "write"):
        sizes = counted[kind]
        for c in calls:
            if c.kind == kind and c.bytes and c.pid != 1000:
                sizes[_bucket(c.bytes // c.ops)] += c.ops
        assert io["sizes"][kind] == sizes
    # Small reads moved bytes: the failed read (no bytes) is left out, as the sizes leave it.
    small = sum(c.dur for c in calls if c.kind == "read" and 0 < c.bytes and c.bytes // c.ops < 64 * KIB)
    assert io["small_read_time_us"] == small
    assert io["small_read_share"] == round(small / io["read_time_us"], 4)
    assert io["access"]["after_first"] == 6  # A: 5 reads, B: 3, C: 1 write; the first of each left out
    assert io["access"]["random_share"] == round(3 / 6, 4)  # A: 1 of 4 sequential, B: 2 of 2
    assert io["recorded"] == {"calls": 40, "events": 31, "aggregated_calls": 30, "dropped": 2, "cut_short": 0}


def test_placed_in_spans_and_workers(traced, summary):
    calls = traced[1]
    io = summary.io
    for part in ("loader", "checkpoint"):
        assert io[part] == figures([c for c in calls if part in c.inside]), part
    outside = sum(c.dur for c in calls if "compute" not in c.inside)
    assert io["not_overlapped_us"] == outside
    assert io["not_overlapped_share"] == round(outside / io["io_time_us"], 4)


def test_files_and_ranks(traced, summary):
    calls = traced[1]
    io = summary.io
    by_path = {(f["path"], f["fhash"]): {k: v for k, v in f.items() if k not in ("path", "fhash")}
               for f in io["files"]}
    expected = {}
    for c in calls:
        key = (c.path, None) if c.path else (None, c.args.get("fhash"))
        expected.setdefault(key, []).append(c)
    assert by_path == {key: figures(group) for key, group in expected.items()}
    assert io["files_total"] == len(expected)
    times = [f["io_time_us"] for f in io["files"]]
    assert times == sorted(times, reverse=True)
    ranks = {r["rank"]: {k: v for k, v in r.items() if k != "rank"} for r in io["ranks"]}
    assert ranks == {rank: figures([c for c in calls if c.rank == rank]) for rank in (0, 1)}


def test_steps_hold_the_calls_of_their_windows(traced, summary):
    calls = traced[1]
    windows = run_sql('select unit, epoch, step, ts, "end" from steps', traced[0]).rows()
    main_pid = {"rank 0": 1000, "rank 1": 1001}
    expected: dict[tuple[int, int], list[Call]] = {}
    for c in calls:
        for rank, epoch, step, start, end in windows:
            if c.pid == main_pid[rank] and start <= c.ts < end:
                expected.setdefault((epoch, step), []).append(c)
    steps = {(s["epoch"], s["step"]): {k: v for k, v in s.items() if k not in ("epoch", "step")}
             for s in summary.io["steps"]}
    assert steps == {key: figures(group) for key, group in expected.items()}
    # Each forward pass's read is in its own step.
    for step in range(3):
        assert steps[(0, step)]["read_bytes"] >= 1000 + 2 * MIB


def test_findings_say_what_the_figures_show(summary, tmp_path):
    said = summary.io["findings"]
    assert said[0] == f"{summary.io['small_read_share'] * 100:.0f} % of read time is in reads under 64 KiB: " \
                      "batch them or read larger blocks"
    assert said[1].startswith("50 % of reads and writes go back")  # half go back: as uniformly random access
    # The mmap of FILE_A: bytes through a mapping no call shows.
    assert said[2] == ("1 mmap call mapped files into memory: what is read or written through a mapping is "
                       "page faults, which no call shows, and is not in these figures")
    assert said[3].startswith("2 I/O calls were dropped")
    assert len(said) == 4  # metadata 2 %, not overlapped 18 %: not beyond the thresholds
    assert ", 1 mmap calls" in render_text(summary)  # the calls line counts them too
    # Metadata-bound, outside compute, random: every finding.
    proc = tracegen.Process(1, "node0", 0)
    t0 = tracegen.T0_US
    proc.span("forward", "compute", t0, 100)
    calls: list[Call] = []
    _names(proc, FILE_A)
    _add(proc, calls, "open", t0 + 200, 30, fhash=HASHES[FILE_A], ret=3)
    _add(proc, calls, "read", t0 + 10, 10, inside={"compute"}, fhash=HASHES[FILE_A], ret=MIB)
    _add(proc, calls, "read", t0 + 300, 5, fhash=HASHES[FILE_A], ret=512)
    _add(proc, calls, "close", t0 + 400, 20, fhash=HASHES[FILE_A], ret=0)
    _meta(proc, "io_file", {"fhash": HASHES[FILE_A], "read_ops": 2, "seq_reads": 0,
                            "read_hist": [0, 1, 0, 0, 0, 1, 0, 0, 0, 0]})
    tracegen.write_process(tmp_path, proc)
    io = summarize(tmp_path, index=False).io
    assert (io["metadata_share"], io["not_overlapped_share"], io["access"]["random_share"]) == (
        round(50 / 65, 4), round(55 / 65, 4), 1.0)
    assert io["findings"] == [
        "metadata is 77 % of I/O time (open, stat, close, seek ...): open files once, keep listings",
        "I/O not overlapped with compute is 85 % of I/O time: prefetch, or read in DataLoader workers",
        "100 % of reads and writes go back (start before the end of the one before): the access is random "
        "(uniformly random access goes back about half the time); read in order, or larger blocks",
    ]


def _io_of(directory: Path, proc: tracegen.Process) -> dict[str, Any]:
    """The I/O answers of ``proc`` alone, written under ``directory``."""
    directory.mkdir()
    tracegen.write_process(directory, proc)
    return summarize(directory, index=False).io


def test_small_files_read_whole_are_said_to_be_small_files(tmp_path):
    """Small reads that are each their file's first since its open (files read whole,
    one read each) are small files, not reads to batch; the same reads spread over a
    big file are reads to make larger."""
    proc = tracegen.Process(1, "node0", 0)
    t0 = tracegen.T0_US
    proc.span("forward", "compute", t0, 10)
    calls: list[Call] = []
    for i, path in enumerate(HASHES):  # five files of 4 KiB, each read whole twice
        _names(proc, path)
        for n in range(2):
            at = t0 + 100 + 100 * (2 * i + n)
            _add(proc, calls, "open", at, 2, fhash=HASHES[path], ret=3)
            _add(proc, calls, "read", at + 10, 9, fhash=HASHES[path], ret=4 * KIB, count=4 * KIB + 1, offset=0)
            _add(proc, calls, "read", at + 20, 1, fhash=HASHES[path], ret=0, count=1, offset=4 * KIB)
            _add(proc, calls, "close", at + 30, 1, fhash=HASHES[path], ret=0)
        _meta(proc, "io_file", {"fhash": HASHES[path], "path": path, "read_ops": 4, "placed_reads": 0,
                                "seq_reads": 0, "read_hist": [0, 0, 2, 0, 0, 0, 0, 0, 0, 0]})
    io = _io_of(tmp_path / "files", proc)
    assert io["access"]["first_read_share"] == 1.0
    assert io["findings"][0] == (  # the end-of-file reads (1 us of each 10) are no small reads
        "90 % of read time is in reads under 64 KiB, and 100 % of reads are the first of their file since "
        "its open (files read whole): the files are small; pack them into larger ones (tar shards, "
        "WebDataset, HDF5, Arrow) read in large blocks")
    # One big file read in 4 KiB reads after one open: reads to make larger.
    proc = tracegen.Process(1, "node0", 0)
    proc.span("forward", "compute", t0, 10)
    _names(proc, FILE_A)
    _add(proc, calls, "open", t0 + 100, 2, fhash=HASHES[FILE_A], ret=3)
    for n in range(10):
        _add(proc, calls, "read", t0 + 200 + 20 * n, 9, fhash=HASHES[FILE_A], ret=4 * KIB, count=4 * KIB,
             offset=4 * KIB * n)
    _meta(proc, "io_file", {"fhash": HASHES[FILE_A], "path": FILE_A, "read_ops": 10, "placed_reads": 9,
                            "seq_reads": 9, "read_hist": [0, 0, 10, 0, 0, 0, 0, 0, 0, 0]})
    io = _io_of(tmp_path / "big", proc)
    assert io["access"]["first_read_share"] == 0.1
    assert io["findings"][0] == "100 % of read time is in reads under 64 KiB: batch them or read larger blocks"


def test_dftracer_fread_counts_items_of_its_size(tmp_path):
    """DFTracer's ``fread``/``fwrite`` carry ``size`` (an item's bytes) and ``ret`` (the
    items moved): 100 items of 4 bytes are 400 bytes (counted 100), in the summary and
    in sql; dftrace's own (``ret`` in bytes, no ``size``) are as they were."""
    proc = tracegen.Process(1, "node0", 0)
    t0 = tracegen.T0_US
    proc.span("forward", "compute", t0, 10)
    _names(proc, FILE_A, FILE_B)
    calls: list[Call] = []
    _add(proc, calls, "fread", t0 + 100, 5, cat="STDIO", fhash=HASHES[FILE_A], size=4, count=100, ret=100)
    _add(proc, calls, "fwrite", t0 + 200, 5, cat="STDIO", fhash=HASHES[FILE_A], size=8, count=10, ret=10)
    _add(proc, calls, "fread", t0 + 300, 5, cat="STDIO", fhash=HASHES[FILE_B], count=4096, ret=4096)
    io = _io_of(tmp_path / "run", proc)
    assert (io["read_bytes"], io["write_bytes"], io["read_ops"], io["write_ops"]) == (400 + 4096, 80, 2, 1)
    rows = run_sql("SELECT name, bytes FROM io ORDER BY ts", tmp_path / "run").rows()
    assert rows == [("fread", 400), ("fwrite", 80), ("fread", 4096)]


def test_io_outside_compute_in_dataloader_workers_is_said_to_be_theirs(tmp_path):
    """Reads outside compute made by DataLoader workers are where they should be: the
    finding says how much of it is theirs and what to do, not to move it there."""
    trainer = tracegen.Process(1000, "node0", 0)
    worker = _dataloader_worker(1100, 1000)
    t0 = tracegen.T0_US
    calls: list[Call] = []
    trainer.span("forward", "compute", t0, 100)
    _names(worker, FILE_E)
    for k in range(4):  # the worker reads while the trainer computes nothing
        _add(worker, calls, "read", t0 + 200 + 100 * k, 50, fhash=HASHES[FILE_E], ret=64 * KIB, count=64 * KIB)
    _add(worker, calls, "read", t0 + 10, 10, fhash=HASHES[FILE_E], ret=64 * KIB, count=64 * KIB)  # inside
    _add(trainer, calls, "read", t0 + 900, 20, fhash=HASHES[FILE_E], ret=64 * KIB, count=64 * KIB)
    _names(trainer, FILE_E)
    tracegen.write_process(tmp_path, trainer)
    tracegen.write_process(tmp_path, worker, prefix="worker")
    io = summarize(tmp_path, index=False).io
    assert (io["not_overlapped_us"], io["not_overlapped_in_workers_us"]) == (220, 200)
    assert io["findings"][-1] == (
        "I/O not overlapped with compute is 96 % of I/O time, 91 % of it in DataLoader workers: the training "
        "process computes nothing while they read; if its steps wait for data, use more workers, a larger "
        "prefetch_factor or faster storage")


def test_workers_reads_are_placed_in_compute_of_a_trainer_that_reads_nothing(tmp_path):
    """The usual DataLoader job: the workers read, the training process makes no file
    call of its own. The workers' reads during its forward are overlapped with compute
    (its busy time is read from its file although that file holds no I/O), the one
    between its forwards is not."""
    trainer = tracegen.Process(1000, "node0", 0)
    worker = _dataloader_worker(1100, 1000)
    t0 = tracegen.T0_US
    calls: list[Call] = []
    trainer.span("forward", "compute", t0, 100)
    trainer.span("forward", "compute", t0 + 300, 100)
    _names(worker, FILE_E)
    _add(worker, calls, "read", t0 + 10, 10, fhash=HASHES[FILE_E], ret=64 * KIB, count=64 * KIB)  # inside
    _add(worker, calls, "read", t0 + 150, 50, fhash=HASHES[FILE_E], ret=64 * KIB, count=64 * KIB)  # between
    _add(worker, calls, "read", t0 + 320, 20, fhash=HASHES[FILE_E], ret=64 * KIB, count=64 * KIB)  # inside
    tracegen.write_process(tmp_path, trainer)
    tracegen.write_process(tmp_path, worker, prefix="worker")
    io = summarize(tmp_path, index=False).io
    assert (io["io_time_us"], io["not_overlapped_us"], io["not_overlapped_in_workers_us"]) == (80, 50, 50)
    assert io["not_overlapped_share"] == round(50 / 80, 4)


def test_same_answers_whatever_the_partitions_and_paths(traced, summary, tmp_path, monkeypatch):
    """Small partitions, the index, a loaded table, Parquet: the same figures."""
    directory = traced[0]
    expected = {k: v for k, v in summary.io.items()}
    assert summarize(directory, partition_bytes=2048, index=False).io == expected
    monkeypatch.setenv("DFTRACE_INDEX_DIR", str(tmp_path / "index"))
    assert summarize(directory).io == expected
    assert summarize(directory).io == expected  # from the index
    assert summarize(load_traces(directory)).io == expected
    converted = tmp_path / "all.parquet"
    assert main(["convert", str(directory), "-o", str(converted)]) == 0
    assert summarize(converted, index=False).io == expected


def test_a_call_is_placed_in_busy_time_read_in_another_partition(tmp_path, monkeypatch):
    """A part of a file without file calls leaves its threads' busy time out; where a
    call written in another part falls in it, that part is read again: the call is
    inside compute, as when the file is read whole."""
    from dftrace.analysis.reduce import combine as _combine

    proc = tracegen.Process(1, "node0", 0)
    t0 = tracegen.T0_US
    calls: list[Call] = []
    _names(proc, FILE_A)
    proc.span("forward", "compute", t0, 100_000)
    for k in range(200):  # parts of spans without calls between the forward and the call
        proc.span("preprocess", "data", t0 + 200_000 + 10 * k, 5)
    _add(proc, calls, "read", t0 + 50_000, 10, inside={"compute"}, fhash=HASHES[FILE_A], ret=MIB)
    _add(proc, calls, "read", t0 + 150_000, 10, fhash=HASHES[FILE_A], ret=MIB)
    tracegen.write_process(tmp_path, proc, lines_per_frame=3)
    whole = summarize(tmp_path, index=False).io
    assert whole["not_overlapped_share"] == 0.5
    read_again = []
    read = _combine.aggregate_partition
    monkeypatch.setattr(_combine, "aggregate_partition",
                        lambda partition, model: read_again.append(partition.index) or read(partition, model=model))
    assert summarize(tmp_path, partition_bytes=1024, index=False).io == whole
    assert read_again and 0 in read_again


def test_dask_gives_the_same_answers(traced, summary, dask_executor):
    assert summarize(traced[0], executor=dask_executor, partition_bytes=4096, index=False).io == summary.io


def test_io_events_leave_the_other_answers_alone(tmp_path, summary):
    plain = tmp_path / "plain"
    plain.mkdir()
    build(plain, with_io=False)
    without = summarize(plain, index=False).to_dict()
    with_io = summary.to_dict()
    assert without["io"] == {}
    for name in ("categories", "epochs", "steps", "step_stats", "rank_steps", "breakdown", "dataloader",
                 "imbalance", "distributions", "stragglers", "collectives", "processes"):
        assert with_io[name] == without[name], name
    for key in ("spans", "wall_us", "start_us", "end_us", "processes", "ranks", "incomplete_spans"):
        assert with_io["overview"][key] == without["overview"][key], key


def test_summary_text_and_json(traced, capsys):
    assert main(["summary", str(traced[0]), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["io"]["read_bytes"] == figures(traced[1])["read_bytes"]
    assert main(["summary", str(traced[0])]) == 0
    out = capsys.readouterr().out
    assert "I/O (traced file calls: POSIX and STDIO)" in out
    assert "/data/train (1).bin" in out and "/ckpt/ümlaut-😀/model.pt" in out
    assert "/tmp/a\\b\\x09c.txt" in out  # a tab in a path is shown escaped
    assert "I/O calls were dropped" in out


def test_sql_io_table(traced, summary):
    calls = traced[1]
    rows = run_sql("select * from io order by pid, ts", traced[0])
    assert rows.height == len(calls)
    assert rows.columns == ["pid", "host", "rank", "tid", "ts", "dur", "name", "cat", "category", "path", "bytes",
                            "count", "offset", "calls", "ret", "errno"]
    ordered = sorted(calls, key=lambda c: (c.pid, c.ts))
    assert rows.get_column("bytes").to_list() == [c.bytes for c in ordered]
    assert rows.get_column("calls").to_list() == [c.ops for c in ordered]
    assert rows.get_column("path").to_list() == [c.path for c in ordered]
    assert rows.get_column("category").to_list() == [c.kind for c in ordered]
    per = run_sql("select category, sum(bytes) as b, sum(calls) as n from io group by category order by category",
                  traced[0])
    truth = figures(calls)
    got = {row["category"]: row for row in per.to_dicts()}
    assert got["read"]["b"] == truth["read_bytes"] and got["write"]["n"] == truth["write_ops"]
    assert got["metadata"]["n"] == truth["metadata_ops"]
    # The spans view holds the user's spans alone.
    spans = run_sql("select count(*) as n, sum(case when cat in ('POSIX', 'STDIO') then 1 else 0 end) as io "
                    "from spans", traced[0]).row(0)
    assert spans == (summary.overview["spans"], 0)


def test_diff_compares_io(traced, tmp_path, summary, capsys):
    more = tmp_path / "more"
    more.mkdir()
    build(more, extra_read=3 * MIB)
    diff = compare_summaries(summary, summarize(more, index=False))
    row = diff.row("io.read_bytes")
    assert row.base == summary.io["read_bytes"] and row.change == 3 * MIB and row.flagged
    assert diff.row("io.read_ops").change == 1
    assert diff.row("io.metadata_ops").change == 0
    assert diff.row("io.io_time_us").change == 9
    assert main(["diff", str(traced[0]), str(more), "--rows", "50"]) == 0
    out = capsys.readouterr().out
    assert "File I/O (traced POSIX and STDIO calls)" in out
    assert "+3.0 MiB" in next(line for line in out.splitlines() if "io.read_bytes" in line)


def test_report_and_watch_show_io(traced, summary, tmp_path):
    pytest.importorskip("plotly")
    from dftrace.analysis.answers.units import format_bytes
    from dftrace.analysis.render.html import render_html
    from dftrace.analysis.render.following import Watcher
    from dftrace.analysis.render.watch import render_plain

    page = render_html(summary)
    assert "File I/O over time" in page and "Files by I/O time" in page
    assert format_bytes(summary.io["read_bytes"]) in page
    assert "/ckpt/ümlaut-😀/model.pt" in page and "it&#x27;s &quot;quoted&quot; | piped.idx" in page
    total = sum(summary.io["timeline"]["read_bytes"])
    assert total == summary.io["read_bytes"]
    watcher = Watcher([str(p) for p in sorted(traced[0].iterdir())])
    watcher.poll()
    snapshot = watcher.snapshot()
    assert snapshot["io"]["read_bytes"] == summary.io["read_bytes"]
    assert "file I/O:" in render_plain(snapshot)


def test_hostile_numbers_are_damage_not_counts(tmp_path):
    """A return value out of range counts no bytes; the other calls are counted."""
    proc = tracegen.Process(1, "node0", 0)
    calls: list[Call] = []
    _names(proc, FILE_A)
    _add(proc, calls, "read", tracegen.T0_US, 5, fhash=HASHES[FILE_A], ret=1 << 60, calls=1 << 50)
    _add(proc, calls, "read", tracegen.T0_US + 10, 5, fhash=HASHES[FILE_A], ret=100)
    tracegen.write_process(tmp_path, proc)
    io = summarize(tmp_path, index=False).io
    assert io["read_bytes"] == 100 and io["read_ops"] == 2
    assert io["sizes"]["read"] == [0, 1, 0, 0, 0, 0, 0, 0, 0, 0]  # 100 bytes: the 100-1K bucket


def test_totals_outlive_the_calls_a_live_view_lets_go(traced, summary):
    """A watcher keeps each let-go partial's keyed tables: the I/O totals stay whole."""
    from dftrace.analysis.reduce.aggregate import aggregate_partitions
    from dftrace.analysis.reduce.combine import combine
    from dftrace.analysis.reduce.partial import keyed_only
    from dftrace.analysis.read.sources import expand_paths, plan_partitions
    from dftrace.analysis.answers.summary import build_summary

    plan = plan_partitions(expand_paths([str(traced[0])]), 1 << 20)
    io = build_summary(combine([keyed_only(p) for p in aggregate_partitions(plan)])).io
    assert {key: io[key] for key in figures(traced[1])} == figures(traced[1])
    assert io["files"] == summary.io["files"] and io["timeline"] == {}
