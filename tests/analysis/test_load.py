"""Loading traces into one table: dftrace files, broken files, DFTracer's files, Parquet."""

from __future__ import annotations

import json

import orjson
import pytest
import tracegen

pl = pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from polars.testing import assert_frame_equal  # noqa: E402

from dftrace.analysis import EVENT_COLUMNS, load_traces, write_trace  # noqa: E402
from dftrace.analysis.read.sources import plan_partitions  # noqa: E402


def test_events_table_has_the_documented_schema(run_dir):
    """Every column of EVENT_COLUMNS is present, in order, with its type."""
    trace = load_traces(run_dir)
    assert dict(trace.events.schema) == EVENT_COLUMNS


def test_multi_rank_run_loads_every_event_with_rank_and_host(run_dir):
    """Four rank files give four processes in rank order, hosts from their HH records."""
    trace = load_traces(run_dir)
    expected = len(tracegen.training_process(1000).events)
    assert trace.events.height == 4 * expected
    procs = trace.processes.select("rank", "host", "pid", "label").rows()
    assert procs == [
        (0, "node0", 1000, "rank 0 · node0 · pid 1000"),
        (1, "node1", 1001, "rank 1 · node1 · pid 1001"),
        (2, "node0", 1002, "rank 2 · node0 · pid 1002"),
        (3, "node1", 1003, "rank 3 · node1 · pid 1003"),
    ]
    per_rank = trace.events.group_by("rank", "host").len().sort("rank").rows()
    assert per_rank == [(0, "node0", expected), (1, "node1", expected), (2, "node0", expected), (3, "node1", expected)]


def test_common_args_become_columns_and_the_rest_is_kept(tmp_path):
    """epoch/step/count/level/parent are columns; args keeps every key as JSON."""
    proc = tracegen.training_process(1000, epochs=1, steps=1)
    # Written by hand: orjson (like JSON in most languages) stops at 64-bit integers.
    custom_line = (f'{{"id":99,"name":"custom","cat":"compute","pid":1000,"tid":1000,"ts":{tracegen.T0_US},'
                   f'"dur":5,"ph":"X","args":{{"level":1,"p_idx":0,"lr":0.1,"note":"héllo","big":{2**70}}}}}')
    trace = load_traces(tracegen.write_process(tmp_path, proc, extra_lines=[custom_line.encode()]))
    forward = trace.events.filter(pl.col("name") == "forward").row(0, named=True)
    assert (forward["epoch"], forward["step"], forward["level"]) == (0, 0, 3)
    block = trace.events.filter(pl.col("name") == "fetch.block").row(0, named=True)
    assert forward["parent_id"] == block["id"] and block["count"] == 1
    epoch = trace.events.filter(pl.col("name") == "epoch").row(0, named=True)
    assert epoch["parent_id"] is None and epoch["level"] == 1
    custom = trace.events.filter(pl.col("name") == "custom").row(0, named=True)
    assert json.loads(custom["args"]) == {"level": 1, "p_idx": 0, "lr": 0.1, "note": "héllo", "big": 2**70}


def test_threads_and_metadata_are_resolved(run_dir):
    """Thread names, clock anchors and PR info come from each file's metadata."""
    trace = load_traces(run_dir)
    assert trace.threads.filter(pl.col("pid") == 1001).select("tid", "name").sort("tid").rows() == [
        (1001, "MainThread"), (1002, "loader")
    ]
    proc = trace.processes.row(0, named=True)
    assert proc["wall_ns"] == tracegen.T0_US * 1000 - 1_000_000 and proc["mono_ns"] == 5_000_000_000
    assert orjson.loads(proc["info"])["cmdline"] == ["python", "train.py"]
    assert set(trace.meta.get_column("name")) >= {"process_name", "thread_name", "HH", "PR", "clock_anchor"}


@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_compressions_load_the_same_table(tmp_path, compression):
    """.pfw.gz and .pfw hold the same events as .pfw.zst."""
    proc = tracegen.training_process(1000)
    (tmp_path / "zstd").mkdir()
    reference = load_traces(tracegen.write_process(tmp_path / "zstd", proc, compression="zstd"))
    other = load_traces(tracegen.write_process(tmp_path, proc, compression=compression))
    assert_frame_equal(reference.events, other.events)


def test_cut_off_file_keeps_complete_frames_and_counts_the_cut(tmp_path):
    """A zstd file cut mid-frame loads what was flushed and reports one broken line."""
    proc = tracegen.training_process(1000, epochs=2, steps=4)
    path = tracegen.write_process(tmp_path, proc, cut="frame", lines_per_frame=10)
    trace = load_traces(path)
    report = trace.files[0]
    assert report.broken_count == 1 and report.cut_off and not report.closed
    assert 0 < trace.events.height < len(proc.events)


def test_unfinished_file_loads_completely(tmp_path):
    """A file without ']' but with whole lines loses nothing."""
    proc = tracegen.training_process(1000)
    trace = load_traces(tracegen.write_process(tmp_path, proc, finalize=False))
    assert trace.events.height == len(proc.events)
    assert (trace.files[0].broken_count, trace.files[0].closed) == (0, False)


def test_broken_lines_are_counted_with_line_numbers(tmp_path):
    """Garbage lines in the middle are reported by number and the rest still loads."""
    proc = tracegen.training_process(1000, epochs=1, steps=2)
    path = tracegen.write_process(tmp_path, proc, compression="none", extra_lines=[b'{"name": oops', b"not json"])
    trace = load_traces(path)
    n_meta = len(proc.metadata())
    first_extra = 1 + n_meta + len(proc.events) + 1
    assert [number for number, _ in trace.files[0].broken] == [first_extra, first_extra + 1]
    assert trace.events.height == len(proc.events)


def test_indented_event_lines_load(tmp_path):
    """Chrome JSON with indented one-line events (`  {...},`) loads every event."""
    events = [{"name": "process_name", "ph": "M", "pid": 5, "tid": 5, "args": {"name": "p"}}] + [
        {"name": "op", "cat": "compute", "ph": "X", "pid": 5, "tid": 5, "ts": 10 * i, "dur": 3} for i in range(4)
    ]
    path = tmp_path / "indented.json"
    path.write_bytes(b"[\n" + b",\n".join(b"  " + orjson.dumps(e) for e in events) + b"\n]\n")
    trace = load_traces(path)
    assert trace.events.height == 4 and trace.broken_lines == 0
    assert trace.processes.item(0, "name") == "p"


def test_values_of_odd_types_take_the_slow_path(tmp_path):
    """An event whose step is a string still loads (step null) instead of failing the
    file; one whose pid is a string breaks a rule of every reader: one broken line."""
    proc = tracegen.training_process(1000, epochs=1, steps=1)
    odd = orjson.dumps({"name": "odd", "cat": "compute", "pid": 1, "tid": 1, "ts": 5, "dur": 1, "ph": "X",
                        "args": {"step": "x"}})
    bad = orjson.dumps({"name": "bad", "cat": "compute", "pid": "x", "tid": 1, "ts": 5, "dur": 1, "ph": "X"})
    trace = load_traces(tracegen.write_process(tmp_path, proc, extra_lines=[odd, bad]))
    assert trace.events.height == len(proc.events) + 1
    assert trace.events.filter(pl.col("name") == "odd").get_column("step").to_list() == [None]
    assert [reason for _, reason in trace.files[0].broken] == ["pid must be an integer in [0, 2**32), got 'x'"]


def test_big_files_split_into_partitions_load_the_same(tmp_path):
    """Frame/member/line-range partitions give the same table as whole files."""
    proc = tracegen.training_process(1000, epochs=3, steps=20)
    for compression in ("zstd", "gzip", "none"):
        directory = tmp_path / compression
        directory.mkdir()
        path = tracegen.write_process(directory, proc, compression=compression, lines_per_frame=8)
        whole = load_traces(path)
        split = load_traces(path, partition_bytes=512)
        assert split.files[0].partitions > 5
        assert_frame_equal(whole.events, split.events)


def test_a_file_that_compresses_far_better_than_most_is_cut_by_its_text(tmp_path):
    """zstd frames record how much text they hold: a file is cut where a partition's
    text reaches eight times the partition size, though its bytes on disk are fewer
    than one partition's, and reads the same as whole."""
    import zstandard

    proc = tracegen.training_process(1000, epochs=3, steps=400)
    path = tracegen.write_process(tmp_path, proc, lines_per_frame=1000)
    size = path.stat().st_size
    with open(path, "rb") as fh:
        text = len(zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True).read())
    split = load_traces(path, partition_bytes=size + 1)
    assert split.files[0].partitions == len(plan_partitions([str(path)], size + 1)) >= text // (8 * (size + 1)) >= 2
    assert_frame_equal(load_traces(path, partition_bytes=1 << 30).events, split.events)


def test_broken_line_numbers_are_absolute_across_partitions(tmp_path):
    """A broken line late in a split file is numbered from the top of the file."""
    proc = tracegen.training_process(1000, epochs=2, steps=10)
    path = tracegen.write_process(tmp_path, proc, compression="none", extra_lines=[b"garbage"], finalize=False)
    trace = load_traces(path, partition_bytes=256)
    total_lines = 1 + len(proc.metadata()) + len(proc.events) + 1
    assert trace.files[0].broken == [(total_lines, trace.files[0].broken[0][1])]


def test_part_files_of_one_process_are_one_process(tmp_path):
    """Rotation part files (`.part1`) of a pid join their process."""
    proc = tracegen.training_process(1000, rank=2)
    first = tracegen.training_process(1000, rank=2, epochs=1)
    path = tracegen.write_process(tmp_path, first)
    later = tracegen.Process(1000, rank=2, events=proc.events[len(first.events):])
    part = tracegen.write_process(tmp_path, later, prefix="later")
    part.rename(part.with_name(path.name.replace(".pfw.zst", ".part1.pfw.zst")))
    trace = load_traces(tmp_path)
    assert trace.processes.height == 1 and trace.processes.item(0, "rank") == 2
    assert len(trace.processes.item(0, "files")) == 2


def test_rank_comes_from_the_file_name_without_metadata(tmp_path):
    """A file that lost its metadata still gets its rank and host from its name."""
    proc = tracegen.training_process(1000, rank=5, host="node1")
    path = tmp_path / "train-rank5-node1-1000.pfw"
    path.write_bytes(b"\n".join(orjson.dumps(e) for e in proc.events) + b"\n")
    trace = load_traces(path)
    assert trace.processes.select("rank", "host").row(0) == (5, "node1")


def test_counters_and_async_tracks_are_kept(tmp_path):
    """Counter events stay with a null dur; asyncio task tracks keep their names."""
    proc = tracegen.training_process(1000, epochs=1, steps=1)
    proc.events.append({"name": "resources", "cat": "sys", "ph": "C", "pid": 1000, "tid": 1000,
                        "ts": tracegen.T0_US, "args": {"cpu_percent": 50.0, "rss_bytes": 1 << 30}})
    task_tid = 0x40000001
    proc.span("fetch", "data", tracegen.T0_US, 10, tid=task_tid)
    meta = orjson.dumps({"name": "thread_name", "ph": "M", "pid": 1000, "tid": task_tid, "args": {"name": "Task-1"}})
    trace = load_traces(tracegen.write_process(tmp_path, proc, extra_lines=[meta]))
    counter = trace.events.filter(pl.col("ph") == "C").row(0, named=True)
    assert counter["dur"] is None and orjson.loads(counter["args"])["rss_bytes"] == 1 << 30
    assert trace.threads.filter(pl.col("tid") == task_tid).item(0, "name") == "Task-1"


def test_columns_limit_what_is_decoded(run_dir):
    """Asking for some columns returns those plus pid, host and rank."""
    trace = load_traces(run_dir, columns=["name", "dur"])
    assert trace.events.columns == ["pid", "rank", "host", "name", "dur"]


def test_unknown_paths_and_columns_raise(tmp_path):
    """A path that matches nothing, or an unknown column, is an error, not an empty trace."""
    with pytest.raises(FileNotFoundError):
        load_traces(tmp_path / "nothing-*.pfw")
    with pytest.raises(ValueError, match="unknown event columns"):
        load_traces(tracegen.write_process(tmp_path, tracegen.training_process(1)), columns=["nope"])


def test_globs_and_directories_select_trace_files(run_dir):
    """A glob picks matching files; a directory is searched recursively."""
    assert len(load_traces(str(run_dir / "*rank1*")).files) == 1
    assert len(load_traces(run_dir).files) == 4


def test_parquet_round_trip_keeps_events_and_processes(run_dir, tmp_path):
    """convert to Parquet and load back: same events, ranks, hosts and metadata."""
    trace = load_traces(run_dir)
    write_trace(trace, tmp_path / "t.parquet")
    back = load_traces(tmp_path / "t.parquet")
    assert_frame_equal(trace.events, back.events)
    assert_frame_equal(trace.processes.drop("files"), back.processes.drop("files"))
    assert_frame_equal(trace.meta, back.meta)


def test_dftracer_2_2_integer_phases_load_as_complete_events(samples):
    """DFTracer 2.2.0 (integer ph, no brackets) loads with ph 'X' and its host."""
    trace = load_traces(samples / "dftracer-2.2.0_meta" / "toy-1629759c158d1f1f-app.pfw.gz")
    assert set(trace.events.get_column("ph")) == {"X"}
    assert trace.events.height == 204 and trace.files[0].broken_count == 0
    assert trace.processes.select("host", "pid").row(0) == ("vm", 22426)
    assert trace.events.filter(pl.col("name") == "fetch.iter").get_column("count").to_list()[:3] == [1, 2, 3]


def test_dftracer_2_0_loads_with_custom_metadata(samples):
    """DFTracer 2.0.3 (string ph, brackets) loads, CM records become custom metadata."""
    trace = load_traces(samples / "dftracer-2.0.3" / "toy.pfw.gz")
    assert trace.events.height == 204 and trace.files[0].closed
    custom = orjson.loads(trace.processes.item(0, "custom"))
    assert custom["run_id"] == "abc123" and "train.start" in custom


def test_dftracer_1_0_hashes_and_root_parents(samples):
    """DFTracer 1.0.5 (integer hhash, p_idx -1) loads; the omitted-lines note is one broken line."""
    trace = load_traces(samples / "dftracer-1.0.5_repo-example")
    assert trace.processes.select("host", "pid").row(0) == ("corona173", 3537780)
    assert trace.events.get_column("parent_id").null_count() == trace.events.height
    assert trace.files[0].broken_count == 1


def test_dftracer_fork_duplication_excerpt_counts_its_broken_lines(samples):
    """The 2.0.3 fork-duplication excerpt (']['  and a note line) loads with one broken line."""
    trace = load_traces(samples / "dftracer-2.0.3" / "toy_fork-duplication.excerpt.pfw")
    assert trace.files[0].broken_count == 1 and trace.events.height == 17
