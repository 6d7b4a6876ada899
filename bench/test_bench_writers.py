"""The two writers side by side: ``writer="thread"`` (a thread of the traced process
writes the file) and ``writer="process"`` (a drainer process writes it from shared
memory; the default, measured with no writer setting: "" below).

Each round runs a fresh traced process that records EVENTS decorator spans as fast
as it can and then finalizes; it reports, per event: the end-to-end wall time
(initialize to finalize returned, file complete), the CPU time of the traced
process, the CPU time of the writer (the writer thread, or the drainer process), and
the peak memory of each. ``python bench/test_bench_writers.py`` prints the table of
docs/performance.md, with the kill -9 loss of each writer.
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time

import pytest

EVENTS = 500_000
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PRODUCER = r"""
import json, os, sys, threading, time
import dftrace
from dftrace import ai

def cpu_ns(stat_path):
    fields = open(stat_path).read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 10**9 // os.sysconf("SC_CLK_TCK")

def hwm_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0

n, writer, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
compression = sys.argv[4] if len(sys.argv) > 4 else "zstd"
rank = int(sys.argv[5]) if len(sys.argv) > 5 else None
t_init = time.perf_counter_ns()
s = dftrace.initialize(log_file=out + "/t", writer=writer or None, inherit=False,
                       compression=compression, rank=rank)
t0 = time.perf_counter_ns()
drainer = hasattr(s.writer, "drainer_pid")  # the default is the process writer where it can be
if drainer:  # what the drainer spent starting (imports), not per event
    w_cpu0 = cpu_ns(f"/proc/{s.writer.drainer_pid}/stat")
else:
    w_cpu0 = cpu_ns(f"/proc/self/task/{s.writer._thread.native_id}/stat")
f = ai.compute.forward(lambda: None)
for _ in range(n):
    f()
if drainer:
    s.writer.flush()  # the drainer wrote everything: read its CPU before it exits
    w_cpu, w_mem = cpu_ns(f"/proc/{s.writer.drainer_pid}/stat"), hwm_kib(s.writer.drainer_pid)
else:
    s.writer.sync(60)  # the writer thread wrote everything
    tid = s.writer._thread.native_id
    w_cpu, w_mem = cpu_ns(f"/proc/self/task/{tid}/stat"), 0
dftrace.finalize()
t1 = time.perf_counter_ns()
print(json.dumps({"wall_ns": t1 - t0, "init_ns": t0 - t_init, "writer_cpu_ns": w_cpu - w_cpu0,
                  "writer_hwm_kib": w_mem, "drainer": drainer,
                  "paths": s.paths}))
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACE_")}
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def measure(writer: str, events: int = EVENTS, compression: str = "zstd") -> dict[str, float]:
    """One traced process recording ``events`` spans with ``writer``; figures per event."""
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.Popen([sys.executable, "-c", PRODUCER, str(events), writer, d, compression],
                                stdout=subprocess.PIPE, env=_env())
        assert proc.stdout is not None
        out = proc.stdout.read()
        _, status, ru = os.wait4(proc.pid, 0)  # the traced process's own CPU time
        proc.returncode = os.waitstatus_to_exitcode(status)
        res = json.loads(out)
        size = sum(os.path.getsize(p) for p in res["paths"])
    producer_cpu = (ru.ru_utime + ru.ru_stime) * 1e9
    return {
        "init_ms": res["init_ns"] / 1e6,
        "e2e_ns": res["wall_ns"] / events,
        # the traced process's own CPU: interpreter start, recording, its writer thread
        "traced_cpu_ns": producer_cpu / events,
        "writer_cpu_ns": res["writer_cpu_ns"] / events,
        "writer_hwm_mib": res["writer_hwm_kib"] / 1024,
        "bytes_per_event": size / events,
        "drainer": res["drainer"],
    }


def more_ranks_than_cores(writer: str, compression: str, ranks: int = 8,
                          events: int = EVENTS) -> dict[str, float]:
    """``ranks`` traced processes at once (more than the machine's cores), each
    recording ``events`` spans at full rate and finalizing: events not on disk, files
    without their closing ``]``, loss warnings, and the slowest rank's wall time."""
    from dftrace import testing

    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-c", PRODUCER, str(events), writer, d,
                                   compression, str(r)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=_env()) for r in range(ranks)]
        outs = [p.communicate() for p in procs]
        wall = time.perf_counter() - t0
        paths = testing.trace_files(os.path.join(d, "t"))
        written = sum(1 for p in paths for e in testing.read_events(p) if e.get("name") == "forward")
        return {
            "lost": ranks * events - written,
            "unclosed": sum(1 for p in paths if not _ends(p)),
            "warnings": sum(err.count(b"not written") + err.count(b"did not finish") for _, err in outs),
            "failed": sum(1 for p in procs if p.returncode != 0),
            "wall_s": wall,
        }


def kill9_loss(writer: str, seconds: float = 1.5) -> dict[str, float]:
    """SIGKILL a process recording at full rate: spans that ended but are not in the
    file, and the newest of them (ms before the kill)."""
    from dftrace import testing

    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "count"), "wb") as fh:
            fh.write(b"\0" * 8)
        script = os.path.join(ROOT, "tests", "reliability", "_kill9.py")
        proc = subprocess.Popen([sys.executable, script, "emit", d, "1.0", "0", writer],
                                stdout=subprocess.PIPE, env=_env())
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(seconds)
        proc.send_signal(signal.SIGKILL)
        with open(os.path.join(d, "count"), "rb") as fh:
            emitted = struct.unpack("q", mmap.mmap(fh.fileno(), 8, prot=mmap.PROT_READ)[:8])[0]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the drainer ends the file of a killed process
            paths = testing.trace_files(os.path.join(d, "t"))
            if writer == "thread" or not sys.platform.startswith("linux") or \
                    (paths and _ends(paths[0])):
                break
            time.sleep(0.05)
        proc.wait()
        paths = testing.trace_files(os.path.join(d, "t"))
        kept = sum(1 for e in testing.read_events(paths[0]) if e.get("name") == "forward") \
            if paths else 0
    return {"emitted": emitted, "lost": max(0, emitted - kept)}


HUNG = r"""
import sys, time
import dftrace
from dftrace import ai
dftrace.initialize(log_file=sys.argv[1], writer=sys.argv[2] or None, flush_interval=0.05)
print("ready", flush=True)
while True:
    for i in range(1000):
        with ai.compute.forward:
            pass
    time.sleep(0.001)
"""


def hung_exit(writer: str) -> dict[str, float]:
    """Trace storage whose writes never return (a FUSE filesystem, see
    tests/reliability/_hung_fs.py): seconds from SIGTERM until the traced process is
    gone (its main thread has ended and no thread of it is left in the kernel), or
    -1 when it is still there after 15 s. Empty without FUSE."""
    import shutil

    if not os.path.exists("/dev/fuse") or shutil.which("fusermount") is None:
        return {}
    with tempfile.TemporaryDirectory() as d:
        mnt = os.path.join(d, "mnt")
        os.mkdir(mnt)
        daemon = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "tests", "reliability", "_hung_fs.py"), mnt],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while not os.path.ismount(mnt):
                if daemon.poll() is not None or time.monotonic() > deadline:
                    return {}
                time.sleep(0.05)
            proc = subprocess.Popen([sys.executable, "-c", HUNG, mnt + "/t", writer],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_env())
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
            time.sleep(0.5)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
                took = time.monotonic() - t0
            except subprocess.TimeoutExpired:
                took = -1.0
            return {"hung_exit_s": took}
        finally:
            daemon.kill()
            daemon.wait()
            subprocess.run(["fusermount", "-u", "-z", mnt], capture_output=True)


def _ends(path: str) -> bool:
    from dftrace.format import iter_trace_lines

    last = b""
    for line in iter_trace_lines(path):
        if line.text:
            last = line.text
    return last == b"]"


@pytest.mark.benchmark(group="writers")
@pytest.mark.parametrize("writer", ["thread", "process", ""])
def test_writer_end_to_end(benchmark, writer):
    """EVENTS spans and finalize in a fresh process, per writer ("": no setting)."""
    if writer != "thread" and not sys.platform.startswith("linux"):
        pytest.skip("writer='process' needs Linux")
    figures: dict[str, float] = {}

    def run() -> None:
        figures.update(measure(writer))

    benchmark.pedantic(run, rounds=3, iterations=1)
    benchmark.extra_info.update(figures)
    benchmark.extra_info["events_per_round"] = EVENTS


@pytest.mark.benchmark(group="writers")
@pytest.mark.parametrize("compression", ["zstd", "gzip"])
@pytest.mark.parametrize("writer", ["thread", "process", ""])
def test_more_ranks_than_cores(benchmark, writer, compression):
    """8 ranks on the machine's cores, 500,000 events each, then finalize: nothing is
    lost, every file is closed, no warning (the figure is the slowest rank's wall time);
    with each writer, and with no writer setting ("")."""
    if writer != "thread" and not sys.platform.startswith("linux"):
        pytest.skip("writer='process' needs Linux")
    result = benchmark.pedantic(more_ranks_than_cores, args=(writer, compression),
                                rounds=1, iterations=1)
    benchmark.extra_info.update(result)
    assert result == {**result, "lost": 0, "unclosed": 0, "warnings": 0, "failed": 0}


def main(rounds: int = 3) -> None:
    """The table of docs/performance.md: writer="thread" and the default (no setting)."""
    runs: dict[str, list[dict[str, float]]] = {"thread": [], "": []}
    for _ in range(rounds):  # interleaved: both writers see the same machine
        for writer in runs:
            runs[writer].append(measure(writer))
    rows = {w: {k: min(r[k] for r in rs) for k in rs[0]} for w, rs in runs.items()}
    for writer, row in rows.items():
        row["total_cpu_ns"] = row["traced_cpu_ns"] + (row["writer_cpu_ns"] if row["drainer"]
                                                      else 0)
        row.update({f"kill9_{k}": v for k, v in kill9_loss(writer).items()})
        row.update(hung_exit(writer))
    print("| | writer=\"thread\" | no setting (writer=\"process\") |")
    print("|---|---|---|")
    for key, label, fmt in (
            ("init_ms", "initialize() (starts the drainer)", "{:.0f} ms"),
            ("e2e_ns", "end to end, per event (first event to file complete)", "{:.0f} ns"),
            ("traced_cpu_ns", "CPU of the traced process per event (writer thread and "
             "start-up included)", "{:.0f} ns"),
            ("writer_cpu_ns", "CPU of the writer per event (thread, or drainer process, "
             "after its start)", "{:.0f} ns"),
            ("total_cpu_ns", "CPU of both per event", "{:.0f} ns"),
            ("writer_hwm_mib", "peak memory of the drainer process", "{:.0f} MiB"),
            ("bytes_per_event", "bytes per event in the file", "{:.1f}"),
            ("kill9_emitted", "kill -9 after 1.5 s: spans that had ended", "{:.0f}"),
            ("kill9_lost", "kill -9 after 1.5 s: of those, not in the file", "{:.0f}"),
            ("hung_exit_s", "hung storage: SIGTERM to process gone (-1: not gone after 15 s)",
             "{:.2f} s")):
        if all(key in rows[w] for w in rows):
            print(f"| {label} | " + " | ".join(fmt.format(rows[w][key]) for w in rows) + " |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
