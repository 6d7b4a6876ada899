"""The analysis commands: summary, convert, merge, validate (report: test_report.py)."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys

import orjson
import pytest
import tracegen
from _signals import default_signals

pl = pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from dftrace import format as fmt  # noqa: E402
from dftrace.analysis import load_traces, write_trace  # noqa: E402
from dftrace.analysis.commands import main  # noqa: E402
from dftrace.testing import read_events  # noqa: E402


def test_summary_prints_every_section(run_dir, capsys):
    """The terminal summary has the category table, epochs, steps, breakdown, stall, ranks."""
    assert main(["summary", str(run_dir)]) == 0
    out = capsys.readouterr().out
    for heading in ("Time per category and name", "Epochs", "Steps:", "Time breakdown",
                    "Data-loader stall", "Stragglers"):
        assert heading in out
    assert "4 files, 4 processes (4 ranks on 2 hosts)" in out
    forward = next(line for line in out.splitlines() if " forward " in line)
    assert forward.split()[:3] == ["compute", "forward", "32"]


def test_summary_json_is_the_summary(run_dir, capsys):
    """--json prints the whole summary as JSON."""
    assert main(["summary", str(run_dir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["overview"]["processes"] == 4
    assert {g["group"] for g in data["breakdown"]["groups"]} == {"compute", "data", "comm", "checkpoint", "device"}


def test_missing_input_is_a_clear_error(tmp_path, capsys):
    """A path that gives no trace exits 2 with a message that says why, not a traceback:
    a pattern that matches nothing, a path that does not exist, a directory without
    traces, and a Parquet file that is not one."""
    assert main(["summary", str(tmp_path / "none*.pfw")]) == 2
    assert f"no trace files found at {str(tmp_path / 'none*.pfw')!r}: no file matches the pattern" in capsys.readouterr().err
    assert main(["summary", str(tmp_path / "traces")]) == 2
    assert f"{str(tmp_path / 'traces')!r}: it does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    assert main(["summary", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "the directory holds no trace files" in err and "1 files there are not traces" in err
    (tmp_path / "empty" / "x.parquet").write_bytes(b"not parquet at all")
    assert main(["summary", str(tmp_path / "empty")]) == 2
    assert "x.parquet is not a readable Parquet file" in capsys.readouterr().err


def test_convert_to_chrome_json_is_strict_json(run_dir, tmp_path, capsys):
    """.json.gz output is one JSON array that starts with metadata and has every event."""
    out = tmp_path / "trace.json.gz"
    assert main(["convert", str(run_dir), "-o", str(out)]) == 0
    events = json.loads(gzip.decompress(out.read_bytes()))
    trace = load_traces(run_dir)
    assert len(events) == trace.events.height + trace.meta.height
    assert events[0]["ph"] == "M"
    assert all(isinstance(e["ph"], str) and 0 <= e["pid"] < 2**32 for e in events)
    assert fmt.validate_file(out) == []
    assert "wrote" in capsys.readouterr().out


def test_convert_round_trips_through_every_format(run_dir, tmp_path):
    """Chrome JSON, pfw.gz and Parquet outputs load back to the same events."""
    trace = load_traces(run_dir)
    for name in ("t.json", "t.json.gz", "t.pfw", "t.pfw.gz", "t.pfw.zst", "t.parquet"):
        assert main(["convert", str(run_dir), "-o", str(tmp_path / name)]) == 0
        back = load_traces(tmp_path / name)
        assert back.events.sort("pid", "id").equals(trace.events.sort("pid", "id")), name


@pytest.mark.parametrize("name", ["t.pfw", "t.pfw.gz", "t.pfw.zst"])
def test_convert_to_pfw_writes_dftrace_s_own_format(run_dir, tmp_path, name):
    """.pfw, .pfw.gz and .pfw.zst outputs are valid dftrace trace files that end with ']'."""
    out = tmp_path / name
    assert main(["convert", str(run_dir), "-o", str(out)]) == 0
    assert fmt.validate_file(out) == []
    lines = list(fmt.iter_trace_lines(out))
    assert lines[0].text == b"[" and lines[-1].text == b"]"
    assert sum(1 for line in lines if line.event and line.event["ph"] == "X") == load_traces(run_dir).events.filter(
        pl.col("ph") == "X").height


def test_validate_checks_a_converted_parquet_file_as_parquet(run_dir, tmp_path, capsys):
    """A Parquet file from convert validates OK (its table, not its bytes as JSON lines)."""
    out = tmp_path / "events.parquet"
    assert main(["convert", str(run_dir), "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["validate", str(out)]) == 0
    assert capsys.readouterr().out == f"{out}: OK\n"


def test_validate_reports_a_parquet_file_that_dftrace_did_not_write(tmp_path, capsys):
    """A Parquet table without dftrace's metadata or columns breaks the Parquet rules."""
    out = tmp_path / "other.parquet"
    pl.DataFrame({"pid": [1], "ts": [-5]}).write_parquet(out)
    assert main(["validate", str(out), "--json"]) == 1
    rules = {v["rule"] for v in json.loads(capsys.readouterr().out)[str(out)]}
    assert rules == {"parquet-metadata", "parquet-columns"}


def test_validate_reports_bad_rows_of_a_parquet_file(run_dir, tmp_path, capsys):
    """Negative durations in a converted table are found and the first bad row named."""
    good = tmp_path / "good.parquet"
    assert main(["convert", str(run_dir), "-o", str(good)]) == 0
    trace = load_traces(good)
    trace.events = trace.events.with_columns(
        pl.when(pl.int_range(pl.len()) == 3).then(-1).otherwise(pl.col("dur")).alias("dur"))
    bad = tmp_path / "bad.parquet"
    write_trace(trace, bad)
    capsys.readouterr()
    assert main(["validate", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "file: [dur] 1 rows with a bad dur, first row 4: -1" in out


def test_validate_of_a_file_that_is_not_parquet_is_a_violation(tmp_path, capsys):
    """Bytes that are not Parquet under a .parquet name fail validation, without a traceback."""
    out = tmp_path / "broken.parquet"
    out.write_bytes(b"not parquet at all")
    assert main(["validate", str(out)]) == 1
    assert "file: [parquet] not a readable Parquet file" in capsys.readouterr().out


def test_summary_of_a_converted_parquet_file_has_no_unfinished_files(run_dir, tmp_path, capsys):
    """A Parquet file is whole: its summary reports no unfinished file, like the clean run it came from."""
    out = tmp_path / "events.parquet"
    assert main(["convert", str(run_dir), "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["summary", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert main(["summary", str(run_dir), "--json"]) == 0
    original = json.loads(capsys.readouterr().out)
    assert original["overview"]["unfinished_files"] == 0
    assert summary["overview"]["unfinished_files"] == 0


def test_convert_keeps_ranks_and_hosts_known_only_from_file_names(tmp_path):
    """A rank and host that only the input's file name gave survive conversion."""
    proc = tracegen.training_process(1000, rank=5, host="node1", epochs=1)
    source = tmp_path / "train-rank5-node1-1000.pfw"
    source.write_bytes(b"[\n" + b"\n".join(orjson.dumps(e) for e in proc.events) + b"\n")
    out = tmp_path / "out.json"
    assert main(["convert", str(source), "-o", str(out)]) == 0
    assert load_traces(out).processes.select("rank", "host").row(0) == (5, "node1")


def test_convert_dftracer_2_2_to_pfw_for_dfanalyzer(samples, tmp_path):
    """DFTracer 2.2.0's integer phases become letters in a valid pfw.gz."""
    out = tmp_path / "toy.pfw.gz"
    source = samples / "dftracer-2.2.0_meta" / "toy-1629759c158d1f1f-app.pfw.gz"
    assert main(["convert", str(source), "-o", str(out)]) == 0
    lines = [line for line in fmt.iter_trace_lines(out) if line.event]
    assert {line.event["ph"] for line in lines} == {"M", "X"}
    assert not any("type" in line.event for line in lines)
    assert fmt.validate_file(out) == []


@pytest.mark.parametrize("command, name", [("convert", "x.pfw.zst"), ("merge", "m.json.gz"),
                                           ("report", "r.html")])
def test_an_output_s_missing_folder_is_made(run_dir, tmp_path, command, name):
    """As --log-file's: ``-o new/folder/FILE`` makes the folders."""
    out = tmp_path / "new" / "folder" / name
    assert main([command, str(run_dir), "-o", str(out)]) == 0
    assert out.stat().st_size > 0


@pytest.mark.parametrize("command", ["summary", "validate", "convert"])
def test_perfetto_s_format_is_not_read_as_lines(run_dir, tmp_path, capsys, command):
    """A .pftrace dftrace wrote is said to be Perfetto's format, not read as broken lines."""
    pftrace = tmp_path / "t.pftrace"
    assert main(["convert", str(run_dir), "-o", str(pftrace)]) == 0
    capsys.readouterr()
    args = ["-o", str(tmp_path / "back.pfw.zst")] if command == "convert" else []
    assert main([command, str(pftrace), *args]) == 2
    assert "Perfetto's own format" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["summary", "validate", "diff"])
@pytest.mark.parametrize("rows", ["0", "-1", "x"])
def test_rows_below_one_are_refused(run_dir, capsys, command, rows):
    """--rows is a number of rows, 1 or more (0 and -1 printed one row); sql's -1 is all rows."""
    paths = [str(run_dir)] * (2 if command == "diff" else 1)
    with pytest.raises(SystemExit) as refused:
        main([command, *paths, "--rows", rows])
    assert refused.value.code == 2
    assert "wants a number of rows, 1 or more" in capsys.readouterr().err


def test_a_cut_file_is_said_to_be_cut_once(tmp_path, capsys):
    """The damaged files' list gives the cut of a file once (it came as its broken line
    and again as the file's cut)."""
    tracegen.write_process(tmp_path, tracegen.training_process(1000), cut="frame")
    assert main(["summary", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("compressed stream cut off at byte") == 1


def test_convert_rejects_an_unknown_suffix(run_dir, tmp_path, capsys):
    """An output suffix that names no format fails before reading anything."""
    assert main(["convert", str(run_dir), "-o", str(tmp_path / "out.txt")]) == 2
    assert "output format" in capsys.readouterr().err


def test_convert_refuses_to_write_over_its_input(run_dir, tmp_path, capsys):
    """An output that is also an input would be destroyed as it is read: refused, the
    file left as it was."""
    source = sorted(run_dir.iterdir())[0]
    copy = tmp_path / source.name
    copy.write_bytes(source.read_bytes())
    for command in ("convert", "merge"):
        assert main([command, str(copy), "-o", str(copy)]) == 2
        assert "both an input and the output" in capsys.readouterr().err
        assert copy.read_bytes() == source.read_bytes()


@pytest.mark.parametrize("command", ["convert", "merge"])
def test_an_output_in_a_folder_read_is_not_read_back(run_dir, tmp_path, command):
    """Writing into the folder that is read, twice: the second run does not read the
    first one's output as a trace (it counted every event twice)."""
    folder = tmp_path / "run"
    folder.mkdir()
    for path in run_dir.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    out = folder / "all.pfw.gz"
    counts = []
    for _ in range(2):
        assert main([command, str(folder), "-o", str(out)]) == 0
        counts.append(sum(1 for e in read_events(str(out)) if e.get("ph") == "X"))
    assert counts[0] == counts[1] > 0


def _merged(tmp_path, *args):
    out = tmp_path / "merged.json.gz"
    assert main(["merge", *args, "-o", str(out)]) == 0
    return json.loads(gzip.decompress(out.read_bytes()))


@pytest.mark.parametrize("args, message", [
    (["--epoch", "1"], "give --steps A[:B] too"),
    (["--start", "0.5", "--end", "0.2"], "--start 0.5 is after --end 0.2"),
    (["--steps", "5:2"], "the first step is after the last"),
])
def test_merge_refuses_a_filter_that_says_nothing(run_dir, tmp_path, capsys, args, message):
    """An --epoch without --steps was ignored (every event written); a reversed range
    matched nothing, said as "no events match"."""
    assert main(["merge", str(run_dir), "-o", str(tmp_path / "m.json.gz"), *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "m.json.gz").exists()


def test_merge_names_and_orders_processes_by_rank(run_dir, tmp_path):
    """Merged processes are named 'rank R · host · pid P' and sorted by rank."""
    events = _merged(tmp_path, str(run_dir))
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    order = {e["pid"]: e["args"]["sort_index"] for e in events if e["name"] == "process_sort_index"}
    assert sorted(names.values()) == [f"rank {r} · node{r % 2} · pid {1000 + r}" for r in range(4)]
    assert sorted(order.items(), key=lambda kv: kv[1]) == sorted(order.items())
    assert set(order.values()) == {0, 1, 2, 3}


def test_merge_makes_pids_unique(tmp_path):
    """Two processes with the same pid on different hosts get different pids."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    for rank, host in ((0, "node0"), (1, "node1")):
        tracegen.write_process(inputs, tracegen.training_process(4242, rank=rank, host=host, epochs=1))
    events = _merged(tmp_path, str(inputs))
    spans = [e for e in events if e["ph"] == "X"]
    assert len({e["pid"] for e in spans}) == 2
    labels = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert {e["pid"] for e in spans} == set(labels)
    assert sorted(labels.values()) == ["rank 0 · node0 · pid 4242", "rank 1 · node1 · pid 4242"]


def test_merge_aligns_clocks_of_one_host_from_anchors(tmp_path):
    """A process whose wall clock was 2 ms ahead at start-up is shifted back by 2 ms."""
    ahead_us = 2000
    ref = tracegen.training_process(1000, rank=0, epochs=1)
    late = tracegen.training_process(1001, rank=1, epochs=1, t0=tracegen.T0_US + ahead_us)
    wall, mono = ref.anchor
    # Same monotonic clock reading, wall clock 2 ms further: an NTP step between starts.
    late.anchor = (wall + ahead_us * 1000, mono)
    inputs = tmp_path / "in"
    inputs.mkdir()
    for proc in (ref, late):
        tracegen.write_process(inputs, proc)
    events = _merged(tmp_path, str(inputs))
    first = {e["pid"]: min(x["ts"] for x in events if x["ph"] == "X" and x["pid"] == e["pid"])
             for e in events if e["ph"] == "X"}
    assert set(first.values()) == {tracegen.T0_US}
    raw = _merged(tmp_path, str(inputs), "--no-align")
    assert {min(e["ts"] for e in raw if e["ph"] == "X" and e["pid"] == p) for p in first} == {
        tracegen.T0_US, tracegen.T0_US + ahead_us
    }


def test_merge_filters_categories(run_dir, tmp_path):
    """--cat keeps the named categories only (metadata stays)."""
    events = _merged(tmp_path, str(run_dir), "--cat", "comm", "--cat", "checkpoint")
    assert {e["cat"] for e in events if e["ph"] != "M"} == {"comm", "checkpoint"}
    assert any(e["name"] == "process_name" for e in events)


def test_merge_keeps_the_time_of_selected_steps(run_dir, tmp_path):
    """--steps keeps, per rank, what overlaps those steps, including spans without step args."""
    events = [e for e in _merged(tmp_path, str(run_dir), "--steps", "1:2", "--epoch", "0") if e["ph"] == "X"]
    steps = {e["args"].get("step") for e in events if e["cat"] == "compute"}
    assert steps == {1, 2}
    names = {e["name"] for e in events}
    assert {"epoch", "preprocess", "fetch.block", "forward"} <= names and "save" not in names


def test_merge_keeps_the_selected_steps_of_every_epoch(run_dir, tmp_path):
    """--steps 1:2 without --epoch keeps steps 1 and 2 of each epoch, not all that lies
    between epoch 0's step 1 and the last epoch's step 2; the command (streamed) and
    ``merge`` on a loaded trace alike."""
    from dftrace.analysis import MergeFilter, merge

    wanted = {(e, s) for e in range(2) for s in (1, 2)}
    events = [e for e in _merged(tmp_path, str(run_dir), "--steps", "1:2") if e["ph"] == "X"]
    assert {(e["args"]["epoch"], e["args"]["step"]) for e in events if e["cat"] == "compute"} == wanted
    loaded = merge(load_traces(run_dir), MergeFilter(steps=(1, 2))).events
    compute = loaded.filter(pl.col("cat") == "compute").select("epoch", "step").unique().rows()
    assert set(compute) == wanted
    assert loaded.height == len(events)


@pytest.mark.parametrize("epochs", ["spans", "none"])
def test_merge_keeps_the_selected_steps_of_every_pass_numbered_without_an_epoch(tmp_path, epochs):
    """``ai.update(step=i)`` alone, ``i`` from 0 in each of three passes (in a loop over
    ``ai.pipeline.epoch.iter`` or over nothing): ``--steps 1:2`` keeps steps 1 and 2 of
    each pass, the command (streamed) and ``merge`` on a loaded trace alike (it kept
    pass 0's alone, or all between the first pass's step 1 and the last's step 2)."""
    from dftrace import ai, testing
    from dftrace.analysis import MergeFilter, merge

    import time

    with testing.trace_to(tmp_path / "trace") as result:
        for p in (ai.pipeline.epoch.iter(range(3)) if epochs == "spans" else range(3)):
            for i in range(4):
                with ai.dataloader.fetch:
                    time.sleep(0.001)
                ai.update(step=i)
                with ai.compute.forward(args={"pass": p}):
                    time.sleep(0.001)
    wanted = sorted((p, i) for p in range(3) for i in (1, 2))
    (path,) = result.paths
    events = [e for e in _merged(tmp_path, path, "--steps", "1:2") if e["ph"] == "X" and e["name"] == "forward"]
    assert sorted((e["args"]["pass"], e["args"]["step"]) for e in events) == wanted
    loaded = merge(load_traces(path), MergeFilter(steps=(1, 2))).events.filter(pl.col("name") == "forward")
    assert sorted(zip(loaded.get_column("args").map_elements(lambda a: orjson.loads(a)["pass"], return_dtype=pl.Int64),
                      loaded.get_column("step"))) == wanted


def test_merge_time_window(run_dir, tmp_path):
    """--start/--end keep events overlapping the window (seconds from the start)."""
    events = [e for e in _merged(tmp_path, str(run_dir), "--start", "0.001", "--end", "0.0015") if e["ph"] == "X"]
    lo, hi = tracegen.T0_US + 1000, tracegen.T0_US + 1500
    assert events and all(e["ts"] <= hi and e["ts"] + e["dur"] >= lo for e in events)


def test_merged_output_loads_back_with_ranks(run_dir, tmp_path):
    """A merged file is itself a trace: ranks and hosts survive."""
    out = tmp_path / "m.json.gz"
    assert main(["merge", str(run_dir), "-o", str(out)]) == 0
    back = load_traces(out)
    assert back.processes.select("rank", "host").rows() == [(r, f"node{r % 2}") for r in range(4)]


def test_validate_passes_clean_files(run_dir, capsys):
    """validate exits 0 and says OK for files that follow the format."""
    assert main(["validate", str(run_dir)]) == 0
    assert capsys.readouterr().out.count(": OK") == 4


def test_validate_fails_with_line_numbers(tmp_path, capsys):
    """validate exits 1 and prints each offending line number and rule."""
    bad = orjson.dumps({"name": "x", "cat": "c", "ph": "X", "pid": 1, "tid": 1, "ts": 5, "dur": -3})
    path = tracegen.write_process(tmp_path, tracegen.training_process(1, epochs=1, steps=1),
                                  compression="none", extra_lines=[bad])
    bad_line = path.read_bytes().split(b"\n").index(bad) + 1
    assert main(["validate", str(path)]) == 1
    assert f"line {bad_line}: [dur] dur must be a number in [0, 2**53], got -3" in capsys.readouterr().out
    assert main(["validate", str(path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report[str(path)] == [{"line": bad_line, "rule": "dur",
                                  "message": "dur must be a number in [0, 2**53], got -3"}]


def test_validate_needs_no_analysis_stack(tmp_path):
    """validate runs without importing polars."""
    path = tracegen.write_process(tmp_path, tracegen.training_process(1, epochs=1, steps=1))
    code = (
        "import sys; from dftrace.analysis.commands import main;"
        f"rc = main(['validate', {str(path)!r}]); print(rc, 'polars' in sys.modules)"
    )
    # Without the setting polars leaves in the environment of the processes started
    # after it loads (this one's, if it loaded polars).
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split()[-2:] == ["0", "False"]


def test_merge_output_is_sorted_by_rank_then_time(run_dir, tmp_path):
    """Events come rank by rank, each in time order."""
    events = [e for e in _merged(tmp_path, str(run_dir)) if e["ph"] == "X"]
    frame = pl.DataFrame({"pid": [e["pid"] for e in events], "ts": [e["ts"] for e in events]})
    assert frame.get_column("pid").to_list() == sorted(frame.get_column("pid").to_list())
    assert all(group.get_column("ts").is_sorted() for group in frame.partition_by("pid"))


def test_a_reader_that_stops_early_ends_the_command_quietly():
    """`dftrace summary --json | head` and the like: when the reader of the output
    goes away, the command stops with exit status 0 and says nothing."""
    from pathlib import Path

    job = Path(__file__).resolve().parents[1] / "data" / "gpu-h200"
    for argv in (["summary", "--json", "--no-index", str(job)], ["sql", "SELECT * FROM events", str(job)]):
        proc = subprocess.Popen([sys.executable, "-m", "dftrace", *argv], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.read(16)  # what `head -c 16` takes
        proc.stdout.close()
        err = proc.stderr.read()
        assert proc.wait(timeout=300) == 0, err
        assert b"Broken pipe" not in err and b"Traceback" not in err, err


_CTRL_C_CHECK = """
import os, signal, sys, threading, time
if sys.argv[1] == "command":
    from dftrace.analysis.runtime.polars_loading import load_polars
    load_polars()
import numpy as np
import polars as pl
frame = pl.DataFrame({"a": np.arange(4_000_000), "b": np.arange(4_000_000) % 100_000})
outcomes = []
def send_when(go):
    go.wait()
    time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGINT)

for trial in range(8):
    # The signal is sent 10 ms after the query starts, by a thread started before (on
    # a busy machine a timer's start could take longer than its delay, and the signal
    # land outside the try).
    go = threading.Event()
    sender = threading.Thread(target=send_when, args=(go,), daemon=True)
    sender.start()
    try:
        go.set()
        frame.group_by("b").agg(pl.col("a").sort().first())  # the signal lands inside this query
        start = time.time()
        while sender.is_alive() or time.time() - start < 1:  # sent, and a second more
            pass
        outcomes.append("continued")
    except KeyboardInterrupt:
        try:
            time.sleep(0.3)
            outcomes.append("once")
        except KeyboardInterrupt:
            outcomes.append("twice")
    sender.join()
print(" ".join(outcomes))
"""


@pytest.mark.parametrize("started_with, outcome", [("the default handler", "once"), ("SIGINT ignored", "continued")])
def test_ctrl_c_during_a_query_is_python_s_to_handle(started_with, outcome):
    """An analysis command gives SIGINT back to Python once polars (which installs a
    handler of its own when it loads) is loaded: a Ctrl-C that lands inside a query is
    raised once, in the main thread, when the query returns, and a process started
    with SIGINT ignored continues. With polars' handler it was raised twice, and raised
    in a process that ignores SIGINT."""
    def disposition() -> None:
        default_signals()  # a suite started from a background job has SIGINT ignored
        if started_with == "SIGINT ignored":
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", _CTRL_C_CHECK, "command"], capture_output=True, text=True,
                         env=env, timeout=120, preexec_fn=disposition)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [outcome] * 8


def test_merge_puts_a_file_read_in_parts_in_stable_time_order(tmp_path, monkeypatch):
    """One process's file, read in many parts and merged back a few rows at a time:
    its spans come out exactly as a stable sort by time of the file puts them (many
    spans share a time: those keep the file's order)."""
    import random

    from dftrace import testing
    from dftrace.analysis.export import streamed

    rng = random.Random(7)
    spans = [{"id": i + 1, "name": f"s{i}", "cat": "compute", "pid": 7, "tid": 7,
              "ts": 1_000_000 + rng.randrange(400), "dur": rng.randrange(50), "ph": "X",
              "args": {"level": 1, "p_idx": 0}} for i in range(40_000)]
    trace = tmp_path / "one.pfw"
    trace.write_bytes(b"[\n" + b"\n".join(orjson.dumps(s) for s in spans) + b"\n]\n")
    monkeypatch.setattr(streamed, "_MERGE_ROWS", 64)  # blocks of a few rows: ties at their edges
    out = tmp_path / "merged.pfw"
    assert main(["merge", str(trace), "-o", str(out), "--partition-mb", "0.25", "--no-progress"]) == 0
    merged = [e["name"] for e in testing.read_events(str(out)) if e.get("ph") == "X"]
    assert merged == [s["name"] for s in sorted(spans, key=lambda s: s["ts"])]
