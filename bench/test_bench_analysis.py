"""Load + summary of 1M and 10M events (16 zstd files, one per rank), embedded and on Dask;
and ``dftrace summary`` side by side with dftracer-utils' ``dftracer_stats``.

    pytest bench/test_bench_analysis.py --benchmark-json=analysis.json

The side-by-side cases run whole processes one after the other and record each
one's CPU time (user + system) and peak resident memory from the kernel's
accounting of the finished process: ``dftracer_stats --report detailed --group-by
name`` once building its index and once reading it, and ``dftrace summary`` once
reading every file (and writing its index) and once reading its index: what a
repeated question costs. They need dftracer-utils
(``pip install 'dftrace[bench]'``) and are skipped without it; dftracer_stats reads
gzip and plain files, so they compare on gzip traces (8 files of 4M events, 16
files of 10M events).

Each benchmark runs ``summarize`` (parse every file, aggregate, combine) on a trace
of 16 processes; the 10M-event trace is about 1.9 GB of JSON, 140 MB compressed.
The traces are generated once into ``<pytest temp root>/dftrace-analysis-bench``
and reused by later runs. ``extra_info`` records, next to the uncompressed trace
size: the resident memory before a round and at its peak and the CPU seconds of the
least costly round (this process plus Dask workers), and the Dask cluster's start-up
time, which the timed rounds leave out.

The 10M-event cases take a few minutes with data generation; set
``DFTRACE_BENCH_SKIP_BIG=1`` to run only the 1M-event ones.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import zstandard

pytest.importorskip("polars")

from dftrace.analysis import DaskExecutor, load_traces, summarize  # noqa: E402

RANKS = 16
T0_US = 1_795_331_512_000_000
LINES_PER_FRAME = 4096
skip_big = pytest.mark.skipif(os.environ.get("DFTRACE_BENCH_SKIP_BIG") == "1", reason="DFTRACE_BENCH_SKIP_BIG=1")


# --- trace generation ----------------------------------------------------------------

_META = (
    '{{"name":"process_name","cat":"dftrace","pid":{pid},"tid":{pid},"ph":"M",'
    '"args":{{"name":"rank {rank} · {host} · pid {pid}"}}}}\n'
    '{{"name":"thread_name","cat":"dftrace","pid":{pid},"tid":{pid},"ph":"M","args":{{"name":"MainThread"}}}}\n'
    '{{"name":"HH","cat":"dftrace","pid":{pid},"tid":{pid},"ph":"M","args":{{"name":"{host}","value":"{hhash}"}}}}\n'
    '{{"name":"clock_anchor","cat":"dftrace","pid":{pid},"tid":{pid},"ph":"M","args":{{"wall_ns":{wall},"mono_ns":5000000000}}}}\n'
    '{{"name":"PR","cat":"dftrace","pid":{pid},"tid":{pid},"ph":"M","args":{{"hostname":"{host}","rank":{rank},"cmdline":["python","train.py"]}}}}\n'
)
_SPAN = ('{{"id":{id},"name":"{name}","cat":"{cat}","pid":{pid},"tid":{tid},"ts":{ts},"dur":{dur},"ph":"X",'
         '"args":{{"hhash":"{hhash}","level":{level},"p_idx":{parent},"epoch":{epoch}{extra}}}}}\n')
# One training step: (name, cat, offset from the step start, duration, level, inside the
# step's fetch.block, extra args, thread). The block is written last, as it ends last.
_STEP = (
    ("fetch.iter", "dataloader", 0, 40, 1, False, ',"count":{count}', 0),
    ("transfer", "device", 40, 10, 2, True, ',"step":{step}', 0),
    ("forward", "compute", 55, 100, 2, True, ',"step":{step}', 0),
    ("preprocess", "data", 55, 150, 1, False, "", 1),
    ("backward", "compute", 160, 200, 2, True, ',"step":{step}', 0),
    ("all_reduce", "comm", 365, 50, 2, True, ',"step":{step}', 0),
    ("step", "compute", 420, 20, 2, True, ',"step":{step}', 0),
    ("fetch.block", "dataloader", 40, 405, 1, False, ',"count":{count}', 0),
)
_STEP_US = 445
_STEPS_PER_EPOCH = 1000


def _rank_lines(rank: int, events: int) -> Iterator[str]:
    """One rank's trace as its writer writes it, line by line: the opening bracket and
    metadata (one string), then ``events`` events, without the closing bracket."""
    pid, host = 10_000 + rank, f"node{rank % 2}"
    hhash = f"{rank % 2:016x}"
    yield "[\n" + _META.format(pid=pid, rank=rank, host=host, hhash=hhash, wall=T0_US * 1000)
    event_id = 0
    step = 0
    while event_id < events:
        # Ranks drift apart a little: rank r's step is r us longer every 7th step.
        start = T0_US + step * _STEP_US + (step // 7) * rank
        block_id = event_id + len(_STEP)
        for name, cat, offset, dur, level, inside, extra, thread in _STEP:
            event_id += 1
            yield _SPAN.format(
                id=event_id, name=name, cat=cat, pid=pid, tid=pid + thread, ts=start + offset, dur=dur,
                hhash=hhash, level=level, parent=block_id if inside else 0,
                epoch=step // _STEPS_PER_EPOCH, extra=extra.format(count=step + 1, step=step),
            )
            if event_id >= events:
                break
        step += 1


def _write_rank(args: tuple[Path, int, int]) -> int:
    """Write one rank's file of ``events`` events (zstd frames, or gzip members at
    level 1 as dftrace writes by default, by the file's suffix); return its
    uncompressed size."""
    path, rank, events = args
    cctx = _Gzip() if str(path).endswith(".gz") else zstandard.ZstdCompressor(level=3)
    size = 0
    lines: list[str] = []
    with open(path, "wb") as fh:
        for line in _rank_lines(rank, events):
            lines.append(line)
            if len(lines) >= LINES_PER_FRAME:
                data = "".join(lines).encode()
                size += len(data)
                fh.write(cctx.compress(data))
                lines = []
        data = ("".join(lines) + "]\n").encode()
        size += len(data)
        fh.write(cctx.compress(data))
    return size


class _Gzip:
    """Each flush its own gzip member, like dftrace's writer."""

    def compress(self, data: bytes) -> bytes:
        member = zlib.compressobj(1, wbits=31)
        return member.compress(data) + member.flush()


def _trace(root: Path, events: int, ranks: int = RANKS, compression: str = "zst") -> tuple[Path, int]:
    """The cached trace of ``events`` events in ``ranks`` files and its uncompressed size."""
    directory = root / (f"{events // 1_000_000}M" if (ranks, compression) == (RANKS, "zst")
                        else f"{events // 1_000_000}M-{ranks}-{compression}")
    marker = directory / "uncompressed_bytes"
    if not marker.exists():
        directory.mkdir(parents=True, exist_ok=True)
        jobs = [(directory / f"train-rank{r}-node{r % 2}-{10_000 + r}.pfw.{compression}", r, events // ranks)
                for r in range(ranks)]
        with ProcessPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as pool:
            marker.write_text(str(sum(pool.map(_write_rank, jobs))))
    return directory, int(marker.read_text())


@pytest.fixture(scope="session")
def bench_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Outside the per-session directory so later runs reuse the traces.
    return tmp_path_factory.getbasetemp().parent / "dftrace-analysis-bench"


@pytest.fixture(scope="module")
def dask2():
    start = time.perf_counter()
    executor = DaskExecutor(workers=2, threads_per_worker=1)
    executor.startup_s = time.perf_counter() - start
    yield executor
    executor.close()


# --- measuring -----------------------------------------------------------------------


class _Usage:
    """Peak resident memory and CPU time of this process and its children (Dask
    workers) while the block runs; memory is sampled every ``interval`` seconds."""

    def __init__(self, interval: float = 0.02):
        import psutil

        self._process = psutil.Process()
        self._interval = interval
        self.baseline = self.peak = self._rss()
        self.cpu_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _family(self):
        return [self._process, *self._process.children(recursive=True)]

    def _rss(self) -> int:
        total = 0
        for process in self._family():
            try:
                total += process.memory_info().rss
            except Exception:  # a worker that just exited
                pass
        return total

    def _cpu(self) -> float:
        total = 0.0
        for process in self._family():
            try:
                times = process.cpu_times()
                total += times.user + times.system
            except Exception:
                pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            self._stop.wait(self._interval)

    def __enter__(self) -> _Usage:
        self._cpu_start = self._cpu()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())
        self.cpu_s = self._cpu() - self._cpu_start


def _measured(benchmark, fn, rounds: int) -> tuple[object, list[_Usage]]:
    """Run ``fn`` ``rounds`` times under the benchmark, recording usage per round."""
    usages: list[_Usage] = []
    result = {}

    def once():
        with _Usage() as usage:
            result["value"] = fn()
        usages.append(usage)

    benchmark.pedantic(once, rounds=rounds, iterations=1)
    return result["value"], usages


def _record(benchmark, usages: list[_Usage], events: int, size: int, **info) -> None:
    fastest = min(usages, key=lambda u: u.cpu_s)
    benchmark.extra_info.update(
        events=events,
        uncompressed_mb=round(size / 2**20),
        baseline_rss_mb=round(min(u.baseline for u in usages) / 2**20),
        peak_rss_mb=round(max(u.peak for u in usages) / 2**20),
        # What the analysis itself added: memory earlier rounds left in the process
        # (allocators keep freed pages) is not the analysis's.
        added_rss_mb=round(max(u.peak - u.baseline for u in usages) / 2**20),
        cpu_s=round(fastest.cpu_s, 2),
        events_per_s=round(events / benchmark.stats.stats.min),
        **info,
    )


def _summary(benchmark, bench_root: Path, events: int, rounds: int, dask=None) -> None:
    """``summarize`` of the trace of ``events`` events, in this process or on ``dask``."""
    directory, size = _trace(bench_root, events)
    info = {} if dask is None else {"dask_startup_s": round(dask.startup_s, 2)}
    summary, usages = _measured(
        benchmark, lambda: summarize(directory, executor=dask, progress=False, index=False), rounds)
    assert summary.overview["events"] == events
    _record(benchmark, usages, events, size, **info)


# --- benchmarks ----------------------------------------------------------------------


@skip_big
@pytest.mark.timeout(1800)
@pytest.mark.benchmark(group="analysis-10M")
def test_summary_embedded_10m(benchmark, bench_root):
    _summary(benchmark, bench_root, 10_000_000, rounds=2)


@skip_big
@pytest.mark.timeout(1800)
@pytest.mark.benchmark(group="analysis-10M")
def test_summary_dask2_10m(benchmark, bench_root, dask2):
    _summary(benchmark, bench_root, 10_000_000, rounds=2, dask=dask2)


@pytest.mark.benchmark(group="analysis-1M")
def test_summary_embedded_1m(benchmark, bench_root):
    _summary(benchmark, bench_root, 1_000_000, rounds=3)


@pytest.mark.benchmark(group="analysis-1M")
def test_summary_dask2_1m(benchmark, bench_root, dask2):
    _summary(benchmark, bench_root, 1_000_000, rounds=3, dask=dask2)


@pytest.mark.benchmark(group="analysis-1M")
def test_load_table_embedded_1m(benchmark, bench_root):
    """The full events table (every column, args as JSON text) rather than the summary."""
    directory, size = _trace(bench_root, 1_000_000)
    trace, usages = _measured(benchmark, lambda: load_traces(directory, progress=False), rounds=2)
    assert trace.events.height == 1_000_000
    _record(benchmark, usages, 1_000_000, size)


# --- side by side with dftracer-utils -------------------------------------------------------

_STATS = shutil.which("dftracer_stats") or shutil.which("dftracer_stats", path=os.path.dirname(sys.executable))
needs_stats = pytest.mark.skipif(_STATS is None, reason="dftracer-utils is not installed: pip install 'dftrace[bench]'")


def _whole_process(command: list[str], log: Path, env: dict[str, str] | None = None) -> dict[str, float]:
    """CPU seconds (user + system) and peak RSS (MB) of one finished process, started
    with the environment a shell would give it: without the allocator setting polars
    leaves in this process's environment when it loads."""
    shell = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    with open(log, "wb") as err:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, env={**shell, **(env or {})})
        _, status, usage = os.wait4(proc.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, log.read_text()[-2000:]
    return {"cpu_s": round(usage.ru_utime + usage.ru_stime, 2), "peak_rss_mb": round(usage.ru_maxrss / 1024)}


def _side_by_side(benchmark, bench_root: Path, tmp_path: Path, events: int, ranks: int) -> None:
    directory, size = _trace(bench_root, events, ranks, "gz")
    stats = [_STATS, "--directory", str(directory), "--index-dir", str(tmp_path / "dftindex"),
             "--report", "detailed", "--group-by", "name"]
    ours = [sys.executable, "-m", "dftrace", "summary", str(directory), "--json", "--no-progress"]
    figures = {
        "dftracer_stats_first": _whole_process(stats, tmp_path / "stats1.log"),
        "dftracer_stats_indexed": _whole_process(stats, tmp_path / "stats2.log"),
    }
    # The first run reads every file and writes the index, the second reads the index.
    index = {"DFTRACE_INDEX_DIR": str(tmp_path / "dftrace-index")}
    runs = []
    benchmark.pedantic(lambda: runs.append(_whole_process(ours, tmp_path / "summary.log", index)), rounds=2,
                       iterations=1)
    figures["dftrace_summary"], figures["dftrace_summary_indexed"] = runs
    benchmark.extra_info.update(events=events, files=ranks, uncompressed_mb=round(size / 2**20),
                                load_1min=round(os.getloadavg()[0], 2), **figures)


@needs_stats
@pytest.mark.timeout(3600)
@pytest.mark.benchmark(group="side-by-side")
@pytest.mark.parametrize("events, files", [pytest.param(4_000_000, 8, id="4m"),
                                           pytest.param(10_000_000, 16, id="10m", marks=skip_big)])
def test_side_by_side_gzip(benchmark, bench_root, tmp_path, events, files):
    _side_by_side(benchmark, bench_root, tmp_path, events, files)


@skip_big
@pytest.mark.timeout(1800)
@pytest.mark.benchmark(group="side-by-side")
@pytest.mark.parametrize("compression", ["zst", "gz"])
def test_summary_process_10m(benchmark, bench_root, tmp_path, compression):
    """The 10M-event trace in 16 files, zstd (which dftracer_stats does not read) and
    gzip (without dftracer_stats installed, dftrace's side alone): the whole
    ``dftrace summary`` process."""
    directory, size = _trace(bench_root, 10_000_000, RANKS, compression)
    ours = [sys.executable, "-m", "dftrace", "summary", str(directory), "--json", "--no-progress", "--no-index"]
    runs = []
    benchmark.pedantic(lambda: runs.append(_whole_process(ours, tmp_path / "summary.log")), rounds=2, iterations=1)
    benchmark.extra_info.update(events=10_000_000, files=RANKS, compression=compression,
                                uncompressed_mb=round(size / 2**20), load_1min=round(os.getloadavg()[0], 2), runs=runs)


@skip_big
@pytest.mark.timeout(1800)
@pytest.mark.benchmark(group="side-by-side")
def test_summary_one_long_process(benchmark, bench_root, tmp_path):
    """One process of 5M events (625,000 steps) in one zstd file, beside the 16-file set's
    figures (``test_summary_process_10m``): the whole ``dftrace summary`` process, the
    file read in its default parts and read whole."""
    directory, size = _trace(bench_root, 5_000_000, 1, "zst")
    ours = [sys.executable, "-m", "dftrace", "summary", str(directory), "--json", "--no-progress", "--no-index"]
    runs: dict[str, list[dict[str, float]]] = {"parts": [], "whole": []}

    def once() -> None:
        runs["parts"].append(_whole_process(ours, tmp_path / "summary.log"))
        runs["whole"].append(_whole_process([*ours, "--partition-mb", "1024"], tmp_path / "summary.log"))

    benchmark.pedantic(once, rounds=2, iterations=1)
    benchmark.extra_info.update(events=5_000_000, files=1, uncompressed_mb=round(size / 2**20),
                                load_1min=round(os.getloadavg()[0], 2), **runs)


@skip_big
@pytest.mark.timeout(1800)
@pytest.mark.benchmark(group="sql")
@pytest.mark.parametrize("events, files", [(10_000_000, RANKS), (40_000_000, 1)])
def test_sql_group_by_name(benchmark, bench_root, tmp_path, events, files):
    """``dftrace sql`` summing the events by name: the whole process's CPU and peak
    memory, on the 16-file 10M set and on 40M events in one file (the events reach the
    query a few partitions at a time)."""
    directory, size = _trace(bench_root, events, files, "zst")
    query = "SELECT name, count(*) AS n, sum(dur) AS us FROM events GROUP BY name ORDER BY name"
    command = [sys.executable, "-m", "dftrace", "sql", query, str(directory), "--no-progress"]
    runs = []
    benchmark.pedantic(lambda: runs.append(_whole_process(command, tmp_path / "sql.log")), rounds=2, iterations=1)
    benchmark.extra_info.update(events=events, files=files, uncompressed_mb=round(size / 2**20),
                                load_1min=round(os.getloadavg()[0], 2), runs=runs)


#: A million steps of five spans, written by dftrace's own writer (zstd) in one process:
#: a fetch, three decorated calls and an all-reduce, each step numbered by ``update``.
_MILLION_STEPS = """
import sys
import dftrace
from dftrace import ai

dftrace.initialize(log_file=sys.argv[1], compression="zstd")

@ai.compute.forward
def forward():
    pass

@ai.compute.backward
def backward():
    pass

@ai.compute.step
def step():
    pass

for i in range(1_000_000):
    ai.update(epoch=i // 10_000, step=i)
    with ai.dataloader.fetch:
        pass
    forward()
    backward()
    step()
    with ai.comm.all_reduce:
        pass
dftrace.finalize()
"""


def _million_steps(root: Path) -> Path:
    """The cached directory of one process's trace of ``_MILLION_STEPS``."""
    directory = root / "1M-steps-dftrace"
    if not any(directory.glob("*.pfw.zst")):
        directory.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-c", _MILLION_STEPS, str(directory / "long")], check=True)
    return directory


@skip_big
@pytest.mark.timeout(1800)
@pytest.mark.benchmark(group="side-by-side")
def test_summary_million_steps_written_by_dftrace(benchmark, bench_root, tmp_path):
    """One process's million steps (5M events) as dftrace's writer leaves them: steps
    a few µs long, two rows a step for the step model (its work and its fetch), in
    one zstd file that compresses about 45-fold and is read in parts cut by its text."""
    directory = _million_steps(bench_root)
    ours = [sys.executable, "-m", "dftrace", "summary", str(directory), "--json", "--no-progress", "--no-index"]
    runs: list[dict[str, float]] = []
    benchmark.pedantic(lambda: runs.append(_whole_process(ours, tmp_path / "summary.log")), rounds=2, iterations=1)
    benchmark.extra_info.update(events=5_000_000, steps=1_000_000, files=1,
                                load_1min=round(os.getloadavg()[0], 2), runs=runs)


#: Every line of the files named on the command line inflated (zstandard) and parsed by
#: the fastest JSON parser there is (simdjson's, else orjson): the least a reader of
#: the text must do.
_DECODE_AND_PARSE = """
import sys, zstandard
try:
    import simdjson
except ImportError:
    import orjson
    parse, parser = orjson.loads, "orjson"
else:
    parse, parser = simdjson.Parser().parse, "simdjson"
lines = 0
for path in sys.argv[1:]:
    with open(path, "rb") as fh, zstandard.ZstdDecompressor().stream_reader(fh, read_size=1 << 20) as raw:
        rest = b""
        while chunk := raw.read(8 << 20):
            *whole, rest = (rest + chunk).split(b"\\n")
            for line in whole:
                line = line.rstrip(b",")
                if line.startswith(b"{"):
                    parse(line)
                    lines += 1
print(parser, lines)
"""


@skip_big
@pytest.mark.timeout(1800)
@pytest.mark.benchmark(group="side-by-side")
def test_summary_beside_the_floor(benchmark, bench_root, tmp_path):
    """The 10M-event zstd set: ``dftrace summary``'s CPU beside what reading the text
    costs at least, each a whole process: inflating it (``zstd -dc``, where installed),
    and inflating it and parsing every line with the fastest parser installed
    (``pip install pysimdjson``; orjson otherwise), which the summary must also do."""
    directory, size = _trace(bench_root, 10_000_000, RANKS, "zst")
    files = sorted(str(p) for p in directory.glob("*.pfw.zst"))
    ours = [sys.executable, "-m", "dftrace", "summary", str(directory), "--json", "--no-progress", "--no-index"]
    figures: dict[str, list[dict[str, float]]] = {"summary": [], "inflate_and_parse": [], "zstd_dc": []}

    def once() -> None:
        figures["summary"].append(_whole_process(ours, tmp_path / "summary.log"))
        figures["inflate_and_parse"].append(
            _whole_process([sys.executable, "-c", _DECODE_AND_PARSE, *files], tmp_path / "parse.log"))
        if shutil.which("zstd"):
            figures["zstd_dc"].append(_whole_process(["zstd", "-dcq", *files], tmp_path / "zstd.log"))

    benchmark.pedantic(once, rounds=2, iterations=1)
    floor = min(run["cpu_s"] for run in figures["inflate_and_parse"])
    parser = "simdjson" if importlib.util.find_spec("simdjson") else "orjson"
    benchmark.extra_info.update(events=10_000_000, files=RANKS, uncompressed_mb=round(size / 2**20), parser=parser,
                                load_1min=round(os.getloadavg()[0], 2), **figures,
                                summary_over_floor=round(min(run["cpu_s"] for run in figures["summary"]) / floor, 2))


#: Events appended to each file between two refreshes of the watch benchmark.
_APPENDED = 64
_WATCH_ROUNDS = 8


@pytest.mark.timeout(1800)
@pytest.mark.benchmark(group="watch")
@pytest.mark.parametrize("events", [100_000, pytest.param(5_000_000, marks=skip_big)], ids=["100k", "5M"])
def test_watch_refresh(benchmark, tmp_path, events):
    """One refresh of ``dftrace watch`` (the look and the live view's summary) of 8
    ranks' growing zstd files after ``events`` events were read, with 64 events
    appended to each file before each refresh: what a refresh costs should not grow
    with what was read before it. ``extra_info`` has the first look's time (catching up
    with the files) and the events the last refresh summarized (``held``)."""
    from dftrace.analysis.render.watch import Watcher

    ranks = 8
    cctx = zstandard.ZstdCompressor(level=3)
    paths, tails = [], []
    for rank in range(ranks):
        lines = list(_rank_lines(rank, events // ranks + _APPENDED * _WATCH_ROUNDS))
        head, tail = lines[:-_APPENDED * _WATCH_ROUNDS], lines[-_APPENDED * _WATCH_ROUNDS:]
        path = tmp_path / f"train-rank{rank}-node{rank % 2}-{10_000 + rank}.pfw.zst"
        with open(path, "wb") as fh:
            for at in range(0, len(head), LINES_PER_FRAME):
                fh.write(cctx.compress("".join(head[at:at + LINES_PER_FRAME]).encode()))
        paths.append(path)
        tails.append([cctx.compress("".join(tail[at:at + _APPENDED]).encode())
                      for at in range(0, len(tail), _APPENDED)])
    watcher = Watcher([str(tmp_path)])
    start = time.perf_counter()
    watcher.poll()
    catch_up_s = time.perf_counter() - start
    looks = iter(range(_WATCH_ROUNDS))

    def append():
        look = next(looks)
        for path, frames in zip(paths, tails):
            with open(path, "ab") as fh:
                fh.write(frames[look])

    benchmark.pedantic(watcher.poll, setup=append, rounds=_WATCH_ROUNDS, iterations=1)
    snapshot = watcher.snapshot()
    assert snapshot["last_read"]["events"] == ranks * _APPENDED
    assert snapshot["totals"]["events"] == events + ranks * _APPENDED * _WATCH_ROUNDS
    benchmark.extra_info.update(events=events, files=ranks, catch_up_s=round(catch_up_s, 2),
                                held_events=snapshot["held"]["events"], load_1min=round(os.getloadavg()[0], 2))
