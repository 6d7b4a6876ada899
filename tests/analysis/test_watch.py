"""dftrace watch: a running job's trace files, read as they grow."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import tracegen
from _requirements import needs
from _signals import default_signals

pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")
pytest.importorskip("rich", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from dftrace.analysis import summarize  # noqa: E402
from dftrace.analysis.render import watch as watching  # noqa: E402
from dftrace.analysis.render import following  # noqa: E402
from dftrace.analysis.render.following import FileFollower, Watcher  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

#: A traced loop that, after step PAUSE_AT of epoch 1, writes "epoch step" to a side
#: file and waits for a "go" file: a job caught mid-run at a known step.
LOOP = textwrap.dedent("""
    import os, sys, time
    import dftrace
    from dftrace import ai

    out, side = sys.argv[1], sys.argv[2]
    pause_at, steps = int(sys.argv[3]), int(sys.argv[4])
    dftrace.initialize(log_file=out, flush_interval=0.05)
    for epoch in ai.pipeline.epoch.iter(range(2)):
        for step in range(steps):
            ai.update(epoch=epoch, step=step)
            with ai.compute.forward:
                time.sleep(0.002)
            with ai.comm.all_reduce:
                time.sleep(0.001)
            if epoch == 1 and step == pause_at:
                with open(side + ".tmp", "w") as fh:
                    fh.write(f"{epoch} {step}")
                os.replace(side + ".tmp", side)
                while not os.path.exists(side + ".go"):
                    time.sleep(0.01)
    dftrace.finalize()
""")
PAUSE_AT, STEPS = 6, 10


def _wait_for(condition, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def _watch(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dftrace", "watch", *args], capture_output=True, text=True,
                          env=ENV, timeout=60, **kwargs)


@pytest.fixture
def paused_job(tmp_path: Path):
    """A real traced process stopped after a known step, its trace file still open."""
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    side = tmp_path / "counter"
    traces = tmp_path / "traces"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(traces / "train"), str(side), str(PAUSE_AT), str(STEPS)],
        env={**ENV, "RANK": "0"},
    )
    try:
        _wait_for(side.exists, "the loop to reach its pause")
        yield proc, traces, side
    finally:
        Path(str(side) + ".go").touch()
        proc.wait(timeout=30)


def _snapshot(traces: Path) -> dict:
    result = _watch(str(traces), "--once", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_once_shows_a_running_job_where_it_is(paused_job):
    """--once on a live job: the rank's epoch and step are the loop's own counters, the
    file is open, and once the job ends the file is closed."""
    proc, traces, side = paused_job
    epoch, step = map(int, side.read_text().split())
    # The writer flushes on its own thread: wait until the paused step is on disk.
    snap = _wait_for(lambda: (s := _snapshot(traces))["ranks"] and s["ranks"][0]["step"] == step and s,
                     "the paused step in the trace")
    (rank,) = snap["ranks"]
    assert rank["rank"] == "rank 0"
    assert (rank["epoch"], rank["step"]) == (epoch, step)
    assert rank["steps"] == STEPS + PAUSE_AT + 1
    assert rank["steps_per_s"] > 0 and rank["step_p50_us"] <= rank["step_p95_us"]
    (file,) = snap["files"]
    assert file["state"] == "open" and file["events"] > 0
    assert snap["totals"]["files_open"] == 1 and snap["totals"]["ranks"] == 1
    Path(str(side) + ".go").touch()
    proc.wait(timeout=30)
    snap = _snapshot(traces)
    assert snap["files"][0]["state"] == "closed"
    assert (snap["ranks"][0]["epoch"], snap["ranks"][0]["step"]) == (1, STEPS - 1)


def test_live_watch_exits_when_the_job_finishes(paused_job):
    """Without a terminal, watch prints plain snapshots and exits by itself (code 0) when
    every file is closed."""
    proc, traces, side = paused_job
    _wait_for(lambda: list(traces.glob("*.pfw*")), "the trace file")
    watcher = subprocess.Popen([sys.executable, "-m", "dftrace", "watch", str(traces), "--interval", "0.1"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    time.sleep(0.3)
    assert watcher.poll() is None  # still watching: the file is open
    Path(str(side) + ".go").touch()
    out, err = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, err
    last = out.split("\n\n")[-1]
    row = next(line for line in last.splitlines() if line.strip().startswith("rank 0 "))
    assert "1 closed" in last and row.split()[2:5] == ["1", str(STEPS - 1), str(2 * STEPS)]


class _EndingJob:
    """A watcher of a job that ends right after the first read: each read sees more
    (its count), and the job is finished from then on."""

    def __init__(self):
        self.reads = 0

    def poll(self):
        self.reads += 1
        return True

    @property
    def finished(self):
        return self.reads >= 1

    def snapshot(self):
        return {"reads": self.reads}


@pytest.mark.parametrize("loop", ["_lines", "_live"])
def test_the_last_view_is_read_after_the_job_ended(loop, monkeypatch, capsys):
    """A job that ends while the view is drawn (between a read and the check whether it
    finished): watch reads once more before it exits, so the last view is the whole trace."""
    shown = []
    monkeypatch.setattr(watching, "render_plain", lambda snapshot: shown.append(snapshot["reads"]) or "")
    monkeypatch.setattr(watching, "render_rich", lambda snapshot: shown.append(snapshot["reads"]) or "")
    getattr(watching, loop)(_EndingJob(), 0.0)
    assert shown[-1] == 2, shown


def test_finished_trace_exits_at_once(run_dir):
    """A finished run (every file closed): watch shows it and exits by itself."""
    result = _watch(str(run_dir))
    assert result.returncode == 0, result.stderr
    assert "4 files (0 open, 0 stalled, 0 cut off, 0 unfinished, 4 closed) · 4 ranks" in result.stdout
    for rank in range(4):
        row = next(line for line in result.stdout.splitlines() if line.strip().startswith(f"rank {rank} "))
        assert row.split()[2:5] == ["1", "3", "8"]  # epoch 1, step 3, 8 steps


def test_cut_off_file_is_reported(tmp_path):
    """A file whose last frame was cut (a writer killed mid-flush) is shown as cut off,
    with what came before it read."""
    proc = tracegen.training_process(1000, rank=0)
    tracegen.write_process(tmp_path, proc, cut="frame")
    snap = _snapshot(tmp_path)
    (file,) = snap["files"]
    assert file["state"] == "cut off" and file["pending_bytes"] > 0 and file["events"] > 0
    assert snap["totals"]["files_cut_off"] == 1


def test_a_file_its_killed_writer_left_whole_is_unfinished_not_cut_off(tmp_path):
    """A writer killed between two flushes leaves whole frames without the closing ']':
    unfinished, and not called cut off (which is a frame cut in the middle)."""
    dead = subprocess.Popen(["true"])  # a pid that no longer runs
    dead.wait()
    proc = tracegen.training_process(dead.pid, rank=0, host=socket.gethostname())
    tracegen.write_process(tmp_path, proc, finalize=False)
    snap = _snapshot(tmp_path)
    (file,) = snap["files"]
    assert file["state"] == "unfinished" and file["pending_bytes"] == 0 and file["events"] > 0
    assert snap["totals"]["files_unfinished"] == 1 and snap["totals"]["files_cut_off"] == 0


@pytest.mark.parametrize("compression", ["zstd", "gzip"])
def test_a_file_cut_by_a_writer_that_is_gone_is_read_as_the_summary_reads_it(tmp_path, compression):
    """The last frame of a file whose writer is gone was cut mid-flush: the watch reads
    its whole lines as the summary does (the same events and broken lines), and still
    calls it cut off. It read no event of that frame (a file of one frame: 0 events)."""
    dead = subprocess.Popen(["true"])  # a pid that no longer runs
    dead.wait()
    proc = tracegen.training_process(dead.pid, rank=0, host=socket.gethostname())
    path = tracegen.write_process(tmp_path, proc, compression=compression, cut="frame")
    snap = _snapshot(tmp_path)
    (file,) = snap["files"]
    summary = summarize(path, index=False, progress=False)
    assert file["state"] == "cut off"
    assert file["events"] == summary.overview["events"] > 0
    assert snap["totals"]["broken_lines"] == summary.overview["broken_lines"]


@pytest.mark.parametrize("compression", ["zstd", "gzip", "none"])
def test_reads_only_new_bytes_and_matches_the_summary(tmp_path, compression, monkeypatch):
    """A file written a few hundred bytes at a time (frames cut anywhere) is read on from
    where the last look stopped; the partials read, all held, equal a summary of the
    whole file."""
    hold_all = FileFollower.let_go
    monkeypatch.setattr(FileFollower, "let_go", lambda self, ended_by: hold_all(self, -sys.maxsize))
    whole = tmp_path / "whole"
    whole.mkdir()
    source = tracegen.write_process(whole, tracegen.training_process(1000, rank=0, epochs=3),
                                    compression=compression, lines_per_frame=8)
    data = source.read_bytes()
    live = tmp_path / "live"
    live.mkdir()
    target = live / source.name
    watcher = Watcher([str(live)])
    offsets = []
    with open(target, "wb") as fh:
        for at in range(0, len(data), 300):
            fh.write(data[at:at + 300])
            fh.flush()
            watcher.poll()
            follower = watcher.followers[str(target)]
            assert follower.offset <= at + 300 and follower.scanned == min(at + 300, len(data))
            offsets.append(follower.offset)
    assert offsets == sorted(offsets) and offsets[-1] == len(data)
    follower = watcher.followers[str(target)]
    assert follower.closed and len(follower.partials) <= 8  # folded as it grew
    expected = summarize(str(whole))
    got = watcher._summary
    assert got.categories == expected.categories
    assert got.step_stats == expected.step_stats
    assert got.breakdown["groups"] == expected.breakdown["groups"]
    assert got.overview["events"] == expected.overview["events"]


@pytest.mark.parametrize("epochs", [2, 20])
def test_a_refresh_decodes_only_what_was_added(tmp_path, epochs, monkeypatch):
    """However much a file held at the look before (800 or 8,000 events), the next look
    after 64 events were appended decodes those 64 events and their bytes, no more, and
    the refresh summarizes the last steps alone: the events held whole are as few after
    8,000 events as after 800."""
    import orjson
    import zstandard

    monkeypatch.setattr(following, "_PARTITION_DECODED", 8192)  # partitions of a few dozen steps
    proc = tracegen.training_process(1000, rank=0, epochs=epochs, steps=50)
    lines = [b"["] + [orjson.dumps(e) for e in proc.metadata() + proc.events]
    head, tail = lines[:-64], lines[-64:]
    cctx = zstandard.ZstdCompressor()
    path = tmp_path / "train-rank0-node0-1000.pfw.zst"
    path.write_bytes(b"".join(cctx.compress(b"\n".join(head[at:at + 16]) + b"\n") for at in range(0, len(head), 16)))
    watcher = Watcher([str(tmp_path)], window=10)
    watcher.poll()
    before = len(proc.events) - 64
    assert watcher.last_refresh == {"bytes": path.stat().st_size, "events": before}
    appended = cctx.compress(b"\n".join(tail) + b"\n")
    with open(path, "ab") as fh:
        fh.write(appended)
    assert watcher.poll()
    assert watcher.last_refresh == {"bytes": len(appended), "events": 64}
    assert watcher.snapshot()["last_read"] == {"bytes": len(appended), "events": 64}
    snap = watcher.snapshot()
    assert snap["totals"]["events"] == snap["files"][0]["events"] == len(proc.events)
    # The last 10 steps and the one running (9 events a step), the partition they begin
    # in (8 KiB: about 40 events) and the look after it.
    assert snap["held"]["events"] <= 11 * 9 + 2 * 40 + 64
    (rank,) = snap["ranks"]
    assert rank["steps"] == epochs * 50 and (rank["epoch"], rank["step"]) == (epochs - 1, 49)
    assert not watcher.poll() and watcher.last_refresh == {"bytes": 0, "events": 0}


def _growing(directory: Path, procs: list, close: bool = True) -> list[tuple[Path, list[bytes]]]:
    """Each process's trace as the zstd frames its writer would append (16 lines each),
    the last one closing the file (unless not ``close``)."""
    return [(tracegen.trace_path(directory, proc), tracegen.units_of(proc, finalize=close)) for proc in procs]


def test_a_long_run_shows_its_last_steps_as_the_whole_trace_would(tmp_path):
    """Two ranks written a few frames a look, watched with a window of 5 steps: at every
    look, each rank's row (its step, step count and last steps' times) equals the one a
    summary of everything written so far gives, though the watcher holds only the last
    steps whole; the straggler is the one of those steps. Rank 1 is slower in each step
    of epoch 0 (20 steps), rank 0 in the last 8 steps of epoch 1."""
    slow = {**{(1, 0, s): 300 for s in range(20)}, **{(0, 1, s): 300 for s in range(12, 20)}}
    procs = []
    for rank in range(2):
        mine = {(e, s): us for (r, e, s), us in slow.items() if r == rank}
        procs.append(tracegen.training_process(1000 + rank, rank=rank, host=f"node{rank % 2}", epochs=2, steps=20,
                                               slow=mine))
    live = tmp_path / "live"
    live.mkdir()
    files = _growing(live, procs)
    watcher = Watcher([str(live)], window=5)
    looks = max(len(frames) for _, frames in files)
    for look in range(0, looks, 3):
        for path, frames in files:
            with open(path, "ab") as fh:
                fh.write(b"".join(frames[look:look + 3]))
        watcher.poll()
        snap = watcher.snapshot()
        expected = following.rank_rows(summarize(str(live)), 5, drop_last=look + 3 < looks, settled={})
        assert snap["ranks"] == expected, f"look {look}"
    held = snap["held"]["events"]
    assert held <= snap["totals"]["events"] / 2 and all(f.history is not None for f in watcher.followers.values())
    # Ground truth from the runs' own clocks: 40 steps each, the last is epoch 1's 20th,
    # and the slowest rank of the steps shown (the last 5 and the one that was running,
    # ended since) is rank 0 in each of them (of the whole run, rank 1).
    assert [(r["rank"], r["steps"], r["epoch"], r["step"]) for r in snap["ranks"]] == [
        ("rank 0", 40, 1, 19), ("rank 1", 40, 1, 19)]
    straggler = snap["straggler"]
    assert (straggler["rank"], straggler["slowest_steps"], straggler["steps"]) == ("rank 0", 6, 6)
    assert "straggler: rank 0 was the slowest rank in 6 of the last 6 steps" in watching.render_plain(snap)
    whole = summarize(str(live))
    assert max(whole.imbalance["ranks"], key=lambda r: r["slowest_count"])["rank"] == "rank 1"


def test_new_file_between_two_looks(tmp_path):
    """A file that appears after the first look (a new rank) is followed from the next."""
    tracegen.write_process(tmp_path, tracegen.training_process(1000, rank=0), finalize=False)
    watcher = Watcher([str(tmp_path)])
    watcher.poll()
    assert [r["rank"] for r in watcher.snapshot()["ranks"]] == ["rank 0"]
    tracegen.write_process(tmp_path, tracegen.training_process(1001, rank=1, host="node1"), finalize=False)
    assert watcher.poll()
    snap = watcher.snapshot()
    assert [r["rank"] for r in snap["ranks"]] == ["rank 0", "rank 1"]
    assert snap["totals"]["files"] == 2 and not watcher.finished


def test_watch_json_needs_once(tmp_path):
    """--json is for one snapshot; a directory with no trace files is an error with --once."""
    result = _watch(str(tmp_path), "--json")
    assert result.returncode == 2 and "--json needs --once" in result.stderr
    result = _watch(str(tmp_path), "--once")
    assert result.returncode == 2 and "no trace files found" in result.stderr


def test_a_watch_with_nothing_to_follow_yet_says_what_it_waits_for(tmp_path):
    """Started before the job writes anything, the watch names each path it waits on
    and whether it is there, then takes the files that appear; Ctrl-C ends it with 0."""
    missing, empty = tmp_path / "traces", tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "dftrace", "watch", str(missing), str(empty), "--interval", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, preexec_fn=default_signals)
    try:
        ready, _, _ = select.select([proc.stderr], [], [], 60)
        line = proc.stderr.readline() if ready else "(nothing said in 60 s)"
        assert line.startswith("dftrace watch: waiting for trace files at "), line
        assert f"{str(missing)!r} (does not exist yet)" in line
        assert f"{str(empty)!r} (a directory with no trace files yet)" in line
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err


@needs("tmux", None if shutil.which("tmux") else "tmux is not installed (Debian: apt-get install tmux)")
def test_terminal_view_and_ctrl_c(paused_job, tmp_path):
    """In a real terminal (tmux): the live view shows the rank, and Ctrl-C ends it with
    exit code 0 and no traceback."""
    _, traces, side = paused_job
    session = f"dftrace-watch-{os.getpid()}"
    command = (f"cd {tmp_path} && PYTHONPATH={os.pathsep.join(sys.path)} {sys.executable} -m dftrace watch "
               f"{traces} --interval 0.2; echo EXIT=$?; sleep 60")
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "40", command], check=True)
    try:
        def screen() -> str:
            return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                                  text=True).stdout

        shown = _wait_for(lambda: "rank 0" in (s := screen()) and "Ctrl-C to stop" in s and s,
                          "the live view")
        assert "dftrace watch: 1 file (1 open" in shown
        subprocess.run(["tmux", "send-keys", "-t", session, "C-c"], check=True)
        ended = _wait_for(lambda: "EXIT=" in (s := screen()) and s, "watch to exit")
        assert "EXIT=0" in ended and "Traceback" not in ended
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def test_a_file_replaced_counts_its_own_steps(tmp_path):
    """A file replaced by a shorter one (the job started again): its rank's steps are
    those of the new file alone, not added to those counted of the old one."""
    first = tracegen.training_process(1000, rank=0, epochs=2, steps=20)
    ((path, frames),) = _growing(tmp_path, [first], close=False)  # killed: the new job takes its name
    watcher = Watcher([str(tmp_path)], window=5)
    for look in range(0, len(frames), 4):
        with open(path, "ab") as fh:
            fh.write(b"".join(frames[look:look + 4]))
        watcher.poll()
    assert [(r["steps"], r["epoch"], r["step"]) for r in watcher.snapshot()["ranks"]] == [(40, 1, 19)]
    again = tracegen.training_process(1000, rank=0, epochs=1, steps=4, t0=tracegen.T0_US + 10_000_000)
    ((_, frames),) = _growing(tmp_path, [again])
    path.write_bytes(b"".join(frames))
    assert watcher.poll()
    assert [(r["steps"], r["epoch"], r["step"]) for r in watcher.snapshot()["ranks"]] == [(4, 0, 3)]


def test_what_a_refresh_holds_does_not_grow_with_the_run(tmp_path):
    """Looks far more frequent than the window's steps (a frame of 16 lines a look, 30
    steps of 8 events shown) over 240 steps: the events a refresh summarizes stay
    within twice those of the steps shown at every look, the end of the run as its
    start, however often the partials held are folded."""
    proc = tracegen.training_process(1000, rank=0, epochs=12, steps=20)
    ((path, frames),) = _growing(tmp_path, [proc], close=False)
    watcher = Watcher([str(tmp_path)], window=30)
    held = []
    for frame in frames:
        with open(path, "ab") as fh:
            fh.write(frame)
        watcher.poll()
        held.append(watcher.held["events"])
    assert max(held) <= 2 * 31 * 8 < len(proc.events) / 3
    (rank,) = watcher.snapshot()["ranks"]
    assert (rank["steps"], rank["epoch"], rank["step"]) == (240, 11, 19)
