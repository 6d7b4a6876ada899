"""The summary's memory is bounded by what the trace holds distinct (names, ranks,
steps), not by its events; span-duration percentiles come from a sketch within the
error the summary states."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import zlib

import orjson
import pytest
import tracegen

pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

import numpy as np  # noqa: E402 (the analysis extra brings it)
import polars as pl  # noqa: E402

from dftrace.format import reading as _trace_reading  # noqa: E402
from dftrace.analysis import load_traces, summarize  # noqa: E402
from dftrace.analysis.runtime import kernels  # noqa: E402
from dftrace.analysis.reduce import aggregate as _aggregate  # noqa: E402
from dftrace.analysis.read.sources import expand_paths, plan_partitions  # noqa: E402


def _nearest_rank(values: np.ndarray, q: float) -> int:
    ordered = np.sort(values)
    return int(ordered[max(int(np.ceil(len(ordered) * q - 1e-9)), 1) - 1])


def test_duration_percentiles_within_the_stated_error(tmp_path):
    """Durations from 1 µs to minutes (log-normal, 40,000 spans over two ranks):
    count, total, min, max and mean are exact, the standard deviation is, and p50/p95
    are within the relative error the overview states of the exact nearest-rank
    values; durations below the exact bound come back exactly."""
    rng = np.random.default_rng(7)
    everything = {"wide": [], "short": []}
    for rank in range(2):
        proc = tracegen.Process(1000 + rank, rank=rank)
        t = tracegen.T0_US
        wide = np.maximum(rng.lognormal(8, 3, 20_000).astype(np.int64), 1)
        short = rng.integers(1, 900, 5_000)
        for name, durations in (("wide", wide), ("short", short)):
            for dur in durations.tolist():
                proc.span(name, "compute", t, dur)
                t += dur + 1
            everything[name].append(durations)
        tracegen.write_process(tmp_path, proc, lines_per_frame=4096)
    summary = summarize(tmp_path, progress=False)
    stated = summary.overview["duration_percentiles"]
    assert stated["relative_error"] == 0.01 and stated["exact_below_us"] == 1024
    rows = {r["name"]: r for r in summary.categories}
    for name, parts in everything.items():
        values = np.concatenate(parts)
        row = rows[name]
        assert row["count"] == values.size and row["total_us"] == int(values.sum())
        assert (row["min_us"], row["max_us"]) == (int(values.min()), int(values.max()))
        assert row["mean_us"] == pytest.approx(values.mean(), abs=1e-3)
        assert row["std_us"] == pytest.approx(values.std(ddof=1), rel=1e-6)
        for q in (0.5, 0.95):
            exact = _nearest_rank(values, q)
            got = row[f"p{round(q * 100)}_us"]
            if name == "short":
                assert got == exact
            else:
                assert abs(got - exact) <= stated["relative_error"] * exact, (name, q, got, exact)
    assert rows["wide"]["max_us"] > 1_000_000  # the buckets were exercised far above the exact bound


#: Data-segment limit of the summarising process (its resident memory stays well
#: below: allocators reserve more than they touch); the trace decodes to three times
#: as much.
LIMIT_MB = 800

#: ``python -m dftrace`` with the arguments after the first, which names the file where
#: the process writes its peak resident memory (kB) as it exits: VmHWM, that of the
#: program alone. (The kernel's ru_maxrss of a child also counts the pages of the
#: process it was forked from, before it ran Python: a test process of a few hundred
#: megabytes would pass for the summary's.)
_WITH_PEAK_RESIDENT = """
import atexit, runpy, sys
report = sys.argv.pop(1)

def peak():
    with open("/proc/self/status") as status, open(report, "w") as out:
        out.write(next(line for line in status if line.startswith("VmHWM:")).split()[1])

atexit.register(peak)
runpy.run_module("dftrace", run_name="__main__", alter_sys=True)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_DATA bounds every private mapping on Linux only")
def test_memory_is_bounded_by_keys_not_events(tmp_path):
    """A 2.4 GB (decoded) trace summarised in at most 800 MB: one process's steps
    repeated in gzip members, so its events keep growing and its names, steps and
    threads do not (collectives are left out: each call is a key of its own; a long
    argument the summary does not read makes the lines long, the test short). The
    summary counts every event and span, each name's count and total being the
    repeats' sum. The process's peak resident memory is held to the bound; with the
    C scanner it also runs under an 800 MB data limit (without it, polars' own parser
    reserves address space as its threads happen to run, 1.1-1.3 GB for 320 MB
    resident: no data limit holds)."""
    proc = tracegen.training_process(1000, rank=0, epochs=2, steps=500)
    for event in proc.events:
        event["args"].pop("seq", None)
        event["args"]["note"] = "x" * 600
    body = b"".join(orjson.dumps(e) + b"\n" for e in proc.events)
    head = b"[\n" + b"".join(orjson.dumps(e) + b"\n" for e in proc.metadata())

    def member(data: bytes) -> bytes:
        z = zlib.compressobj(1, wbits=31)
        return z.compress(data) + z.flush()

    repeats = -(-3 * (LIMIT_MB << 20) // len(body))
    path = tmp_path / "train-rank0-node0-1000.pfw.gz"
    packed = member(body)
    with open(path, "wb") as fh:
        fh.write(member(head))
        for _ in range(repeats):
            fh.write(packed)
        fh.write(member(b"]\n"))
    assert len(body) * repeats > 3 * (LIMIT_MB << 20)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (LIMIT_MB << 20, LIMIT_MB << 20))

    peak = tmp_path / "peak-kb"
    result = subprocess.run(
        [sys.executable, "-c", _WITH_PEAK_RESIDENT, str(peak), "summary", str(path), "--json", "--no-progress"],
        capture_output=True, text=True, preexec_fn=limit if kernels.C is not None else None, timeout=240,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert int(peak.read_text()) < LIMIT_MB << 10  # kB
    summary = json.loads(result.stdout)
    assert summary["overview"]["events"] == len(proc.events) * repeats
    per_name: dict[str, list[int]] = {}
    for e in proc.events:
        per_name.setdefault(e["name"], []).append(e["dur"])
    for row in summary["categories"]:
        durations = per_name[row["name"]]
        assert row["count"] == len(durations) * repeats
        assert row["total_us"] == sum(durations) * repeats


def test_a_process_in_several_files_has_the_steps_of_one(tmp_path):
    """A process's events split over two part files (rotation): files read whole have
    their steps modelled where they are read, which holds only for a process all in
    one file, so these are read again with their step rows; every answer equals
    that of the same events in one file."""
    slow = {(1, 2): 700, (2, 1): 400}
    proc = tracegen.training_process(1000, rank=0, epochs=3, steps=6, slow=slow)
    whole = tmp_path / "whole"
    whole.mkdir()
    tracegen.write_process(whole, proc)
    split = tmp_path / "split"
    split.mkdir()
    cut = len(proc.events) // 2 + 3  # inside an epoch, mid-step
    first = tracegen.Process(1000, rank=0, events=proc.events[:cut])
    path = tracegen.write_process(split, first, finalize=False)
    later = tracegen.Process(1000, rank=0, events=proc.events[cut:])
    part = tracegen.write_process(split, later, prefix="later")
    part.rename(part.with_name(path.name.replace(".pfw.zst", ".part1.pfw.zst")))
    one, two = summarize(whole, progress=False), summarize(split, progress=False)
    assert two.overview["files"] == 2 and two.overview["processes"] == 1
    assert len(one.steps) == 18
    for field in ("steps", "step_stats", "epochs", "categories", "breakdown", "imbalance", "dataloader"):
        assert getattr(two, field) == getattr(one, field), field


def test_rank_steps_held_narrow_keep_values_beyond_32_bits(tmp_path):
    """Each file's rank-step table is held in the narrowest integer types its values
    fit until the answers are built; values beyond 32 bits keep theirs. A global step
    count past 2**31 and a 40-minute step come back exact, as from the same events
    held in memory."""
    proc = tracegen.Process(1000, rank=0)
    first_step, long_us, comm_us, gap_us = 3_000_000_000, 2_400_000_000, 1_000, 100
    starts, t = [], tracegen.T0_US
    for i in range(6):
        compute_us = long_us if i == 2 else 5_000
        starts.append(t)
        proc.span("forward", "compute", t, compute_us, epoch=1, step=first_step + i)
        proc.span("all_reduce", "comm", t + compute_us, comm_us, epoch=1, step=first_step + i, group="0",
                  seq=i + 1)
        t += compute_us + comm_us + gap_us
    tracegen.write_process(tmp_path, proc)
    # A step lasts until the next one starts; the last one until its work ends.
    expected = {first_step + i: end - start for i, (start, end) in
                enumerate(zip(starts, [*starts[1:], t - gap_us]))}

    (partial,) = _aggregate.aggregate_partitions(plan_partitions(expand_paths([str(tmp_path)]), 1 << 30))
    held = partial.modelled.schema
    assert (held["epoch"], held["n"], held["blocked_us"]) == (pl.Int8, pl.Int8, pl.Int16)
    assert (held["step"], held["compute_us"]) == (pl.Int64, pl.Int64)

    read = summarize(tmp_path, progress=False, index=False)
    assert {row["step"]: row["max_us"] for row in read.steps} == expected
    assert sorted(row["step"] for row in read.rank_steps) == sorted(expected)
    in_memory = summarize(load_traces(tmp_path), progress=False)
    for field in ("steps", "step_stats", "epochs", "rank_steps", "breakdown"):
        assert getattr(read, field) == getattr(in_memory, field), field


#: The allocator settings a test's own process is started without.
_ALLOCATOR_VARIABLES = ("_RJEM_MALLOC_CONF", "MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def _python(code: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` run with ``args`` by this Python in a process of its own, without the
    allocator settings of this one's environment but those of ``env``."""
    environ = {k: v for k, v in os.environ.items() if k not in _ALLOCATOR_VARIABLES}
    environ.update(env, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=environ,
                          timeout=120)


def _succeeded(out: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def test_polars_allocator_setting_is_for_polars_alone():
    """The summary command loads polars with its allocator returning freed pages after
    0.3 s; the setting is read when polars loads, and the environment is left as the
    process inherited it, for the programs it starts."""
    check = (
        "import os, sys\n"
        "from dftrace.analysis.runtime.polars_loading import load_polars\n"
        "load_polars()\n"
        "print('polars' in sys.modules, os.environ.get('_RJEM_MALLOC_CONF'))\n"
    )
    assert _succeeded(_python(check)).stdout.split() == ["True", "None"]
    assert _succeeded(_python(check, _RJEM_MALLOC_CONF="narenas:1")).stdout.split() == ["True", "narenas:1"]


def _polars_own_allocator() -> str:
    """What polars leaves in ``_RJEM_MALLOC_CONF`` of a program that loaded it (and
    its children inherit)."""
    code = "import os, polars\nprint(os.environ['_RJEM_MALLOC_CONF'])\n"
    return _succeeded(_python(code)).stdout.strip()


@pytest.mark.parametrize("inherited", ["unset", "from a program that loaded polars", "the user's"])
def test_polars_allocator_takes_the_command_setting(inherited):
    """jemalloc itself reports the setting in force once polars is loaded for a
    command: freed pages returned after 0.3 s, and one arena for every thread (a
    misspelt or overridden option would leave jemalloc's own). So too in a command
    started by a program that loaded polars, whose default it inherits (it was taken
    for a user's setting, and the command's left out: 1.5 s of decay and an arena per
    thread); a user's own setting takes the command's place."""
    env = {}
    if inherited == "from a program that loaded polars":
        env["_RJEM_MALLOC_CONF"] = _polars_own_allocator()
    elif inherited == "the user's":
        env["_RJEM_MALLOC_CONF"] = "dirty_decay_ms:2000,stats_print:true"
    check = (
        "from dftrace.analysis.runtime import polars_loading\n"
        "polars_loading.POLARS_ALLOCATOR += ',stats_print:true'  # jemalloc reports its options at exit\n"
        "polars_loading.load_polars()\n"
        "import polars as pl\n"
        "pl.DataFrame({'a': list(range(1000))}).sum()\n"
    )
    if "jemalloc statistics" not in _succeeded(_python("import polars", _RJEM_MALLOC_CONF="stats_print:true")).stderr:
        pytest.skip("this polars build does not use jemalloc")
    out = _succeeded(_python(check, **env))
    assert "jemalloc statistics" in out.stderr  # the setting with stats_print in force
    options = dict(line.strip().split(": ", 1) for line in out.stderr.splitlines()
                   if line.strip().startswith("opt.") and ": " in line)
    assert "Invalid conf" not in out.stderr
    if inherited == "the user's":
        assert options["opt.dirty_decay_ms"].split()[0] == "2000"
        assert options["opt.narenas"] != "1"
        return
    assert options["opt.narenas"] == "1"
    assert options["opt.dirty_decay_ms"].split()[0] == "30"
    assert options["opt.muzzy_decay_ms"].split()[0] == "0"


_ARENAS_CHECK = """
import ctypes, sys, threading
from dftrace.analysis.runtime import heap as _heap
if sys.argv[1] == "one":
    _heap.command_heap()
held = []
def allocate():
    held.extend(bytes(4096) for _ in range(2000))  # C heap blocks, not Python's small-object pools
thread = threading.Thread(target=allocate)
thread.start()
thread.join()
ctypes.CDLL(None).malloc_stats()  # one "Arena N:" paragraph per arena, on stderr
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap arenas")
@pytest.mark.parametrize("setting, arenas", [("one", 1), ("default", 2)])
def test_the_command_keeps_the_c_heap_in_one_arena(setting, arenas):
    """The summary decodes a file's next piece on a thread of its own: the command
    keeps glibc's heap in one arena, so the pieces that thread decodes reuse the
    memory the others freed (an arena per thread held about 60 MB more). Without the
    setting, a thread's allocations open an arena of their own."""
    out = _python(_ARENAS_CHECK, setting)
    if out.returncode != 0 and "malloc_stats" in out.stderr:
        pytest.skip("not glibc")
    assert out.returncode == 0, out.stderr[-2000:]
    assert sum(line.startswith("Arena ") for line in out.stderr.splitlines()) == arenas


_PIECES_CHECK = """
import resource, sys
from dftrace.format.reading import LINE_PIECE_BYTES
from dftrace.analysis.runtime import heap as _heap
if sys.argv[1] == "heap":
    _heap.command_heap()
faults = []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    piece = b"".join([b"x" * (LINE_PIECE_BYTES // 2)] * 2)  # as a piece is joined
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del piece
print(min(faults[1:]), LINE_PIECE_BYTES // 4096)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap")
@pytest.mark.parametrize("setting", ["heap", "default"])
def test_each_piece_takes_the_place_of_the_one_before(setting):
    """A piece (64 MiB) is above the largest block glibc takes from its heap by
    itself: mapped on its own, each of its pages faulted in anew. The command has
    them taken from the heap: the second piece on reuses the first's pages (a few
    faults, where without the setting each piece faults all its pages in, and those
    of its parts)."""
    faults, pages = map(int, _succeeded(_python(_PIECES_CHECK, setting)).stdout.split())
    if setting == "heap":
        assert faults < pages // 20, (faults, pages)
    else:
        assert faults >= pages, (faults, pages)


_ANSWERS_HEAP_CHECK = """
import sys
from dftrace.analysis.runtime import heap as _heap
def anon():
    return int(open("/proc/self/status").read().split("RssAnon:")[1].split()[0]) << 10
def returned():
    block = bytearray(32 << 20)  # every page written, as an answer's work array
    held = anon()
    del block
    return held - anon()
_heap.command_heap()
if sys.argv[1] == "pieces":
    print(returned())
with _heap.heap_for_answers():
    if sys.argv[1] == "answers":
        print(returned())
if sys.argv[1] == "pieces again":  # files read after the answers (diff's other side)
    print(returned())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap")
@pytest.mark.parametrize("stage", ["pieces", "answers", "pieces again"])
def test_the_answers_hand_back_their_large_blocks_when_freed(stage):
    """While files are read, the command's heap keeps a freed piece's pages for the
    next one. While the answers are built (``heap_for_answers``), glibc's own sizes are back:
    a large block of the answers is handed back to the system as it is freed, where
    the kept heap held the pages of the largest ones to the end of the summary. The
    next files read keep the heap for their pieces again."""
    returned = int(_succeeded(_python(_ANSWERS_HEAP_CHECK, stage)).stdout)
    if stage == "answers":
        assert returned >= 30 << 20, returned
    else:
        assert returned < 4 << 20, returned


def test_summary_reads_half_the_cpus_files_at_a_time(monkeypatch):
    from dftrace.analysis import command_parts as _cli

    for cpus, threads in ((None, 1), (1, 1), (2, 1), (4, 2), (16, 8), (64, 8)):
        monkeypatch.setattr(os, "cpu_count", lambda cpus=cpus: cpus)
        assert _cli.file_threads() == threads


def _add_steps(proc: tracegen.Process, steps: range, spans) -> None:
    """Add ``steps`` to ``proc``, 1000 µs apart, each of ``spans`` (name, category,
    start within the step and duration in µs), each span carrying its step."""
    for step in steps:
        t = tracegen.T0_US + 1000 * step
        for name, cat, start, dur in spans:
            proc.span(name, cat, t + start, dur, epoch=0, step=step)


def _steps_with_an_enclosing_span(tmp_path, enclosing: bool) -> int:
    """A file of 60 steps, 1000 µs apart, each a forward, a backward and a fetch of
    data carrying the step; with ``enclosing``, a compute span carrying step 30's
    number runs from step 10's work to step 50's (a recorder's sticky step on a span
    around the loop), written in the middle of the file (after step 40's spans).
    Returns the steps."""
    steps = 60
    spans = (("forward", "compute", 100, 300), ("backward", "compute", 400, 300), ("fetch", "data", 750, 100))
    proc = tracegen.Process(4100, rank=0)
    _add_steps(proc, range(41), spans)
    if enclosing:
        proc.span("loop", "compute", tracegen.T0_US + 10_050, 40_000, epoch=0, step=30)
    _add_steps(proc, range(41, steps), spans)
    tracegen.write_process(tmp_path, proc, lines_per_frame=3)
    return steps


@pytest.mark.parametrize("enclosing", [False, True])
def test_a_files_steps_are_modelled_from_a_row_a_steps_work(monkeypatch, tmp_path, enclosing):
    """A whole file's steps are modelled from each step's work merged into one row as
    its pieces are read (its data loading keeps its own), not from a row per step and
    name; where a merged row holds other steps (a span carrying a step around the
    loop), the file is read again with a row a name, and the steps are the same."""
    steps = _steps_with_an_enclosing_span(tmp_path, enclosing)
    monkeypatch.setitem(_trace_reading._whole_decoders, "unzstd_frames", None)
    monkeypatch.setattr(_aggregate, "SUMMARY_PIECE_BYTES", 2500)  # several steps a piece
    modelled_from = []
    model = _aggregate.model_steps
    monkeypatch.setattr(_aggregate, "model_steps",
                        lambda rows, containers: modelled_from.append(rows.height) or model(rows, containers))
    summary = summarize(tmp_path, progress=False, index=False)
    # A step's fetch, after its work, loads the next step's batch: each step runs from
    # the fetch before it to the next one (the first from its forward pass, the last
    # to its backward's end), and the loop span is left out.
    assert summary.step_stats["count"] == steps
    assert [row["max_us"] for row in summary.steps] == [650] + [1000] * (steps - 2) + [950]
    # Work and data: two rows a step (and the loop's name apart from step 30's forward
    # and backward where the file is read again).
    assert modelled_from == [3 * steps + 1 if enclosing else 2 * steps]


@pytest.mark.parametrize("enclosing", [False, True])
def test_a_file_read_in_parts_has_the_steps_of_the_file_read_whole(monkeypatch, tmp_path, enclosing):
    """The parts of a file have each step's work merged into one row as well; where
    such a row, with the rows of the other parts, holds other steps (a span carrying
    a step around the loop, written parts after the steps it holds), the parts are
    read again with a row a name, and the steps are those of the file read whole."""
    from dftrace.analysis.reduce import combine as _combine

    _steps_with_an_enclosing_span(tmp_path, enclosing)
    monkeypatch.setitem(_trace_reading._whole_decoders, "unzstd_frames", None)
    whole = summarize(tmp_path, progress=False, index=False)
    part_bytes = 1500
    parts = len(plan_partitions(expand_paths([str(tmp_path)]), part_bytes))
    assert parts > 4
    read_again = []
    read = _combine.aggregate_partition
    monkeypatch.setattr(_combine, "aggregate_partition",
                        lambda partition, model: read_again.append(partition) or read(partition, model=model))
    in_parts = summarize(tmp_path, progress=False, index=False, partition_bytes=part_bytes)
    assert in_parts.steps == whole.steps and in_parts.step_stats == whole.step_stats
    assert in_parts.rank_steps == whole.rank_steps
    assert len(read_again) == (parts if enclosing else 0)


@pytest.mark.parametrize("piece_bytes", [None, 700, 2500])
def test_steps_straddling_pieces_are_whole(monkeypatch, tmp_path, piece_bytes):
    """A file read in pieces has the steps of one read at once, however its steps fall
    across pieces: each step's data loading has two spans of one name, a prefetch
    inside the step's work and the next batch's fetch after it (still carrying the
    step's number). Taken as one, the step's data loading begins inside its work, so
    the step keeps its span and the next one starts with its own work; a piece
    boundary between the two must not make the later fetch a step of its own data."""
    steps = 120
    proc = tracegen.Process(4000, rank=0)
    _add_steps(proc, range(steps), (("forward", "compute", 100, 300), ("fetch", "data", 200, 50),
                                    ("backward", "compute", 400, 300), ("fetch", "data", 800, 100)))
    tracegen.write_process(tmp_path, proc, lines_per_frame=3)
    if piece_bytes is not None:
        # Frames decoded one at a time (not many at once in C): a piece ends at a frame's end.
        monkeypatch.setitem(_trace_reading._whole_decoders, "unzstd_frames", None)
        monkeypatch.setattr(_aggregate, "SUMMARY_PIECE_BYTES", piece_bytes)
        pieces = _aggregate._each_partitions_pieces(plan_partitions(expand_paths([str(tmp_path)]), 1 << 30))
        assert sum(piece is not _aggregate._PARTITION_END for _, piece in pieces) > 20  # a few steps a piece
    summary = summarize(tmp_path, progress=False, index=False)
    assert summary.step_stats["count"] == steps
    # Each step runs from its forward pass to the next one's, the last to its fetch's end.
    assert [row["max_us"] for row in summary.steps] == [1000] * (steps - 1) + [800]
