"""Each file's counters (the ``io_file`` records) against what the program did: the
access pattern counted from each open, and a process that reads more files than the
counters' table holds at a time (its counters written when it is full and counted
afresh: records that add up to the truth)."""

from __future__ import annotations

import importlib.util
from collections import defaultdict

from _io_util import NEEDS_IO, START, IOTrace, run_traced
from _requirements import needs

pytestmark = NEEDS_IO

#: Files the counters' table holds at a time (dftrace/_core/io_c/counters.h).
FILES_AT_A_TIME = 4096

#: Two files: one read whole in 4 KiB reads, opened again and read whole again, then
#: through STDIO (freads carry no offset); the other read in 4 KiB preads from its
#: end back to its start, each at an offset before the one before.
ACCESS = START + """
    in_order = data_file("in_order.bin", b"o" * 65536)
    backwards = data_file("backwards.bin", b"b" * 65536)
    dftrace.initialize(log_file=out, io=True, data_dir=data, compression="none")
    for _ in range(2):
        fd = os.open(in_order, os.O_RDONLY)
        while os.read(fd, 4096):
            pass
        os.close(fd)
    with open(in_order, "rb", buffering=0) as f:
        f.read(100)
    fd = os.open(backwards, os.O_RDONLY)
    for block in range(15, -1, -1):
        os.pread(fd, 4096, block * 4096)
    os.close(fd)
    print(json.dumps({"pid": os.getpid(), "in_order": in_order, "backwards": backwards,
                      "placed_in_order": 2 * 15, "placed_backwards": 15}))
"""


def _access_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, ACCESS)
    return truth, IOTrace(tmp_path / "trace")


def test_the_access_pattern_counts_each_pass_from_its_open(tmp_path, monkeypatch):
    """A file read again from its start after it is opened again is read in order:
    the counters count an access pattern from each open, over the calls with an
    offset (here every pread of the file read backwards starts before the one before)."""
    truth, trace = _access_run(tmp_path, monkeypatch)
    counters = {m["args"]["path"]: m["args"] for m in trace.meta[truth["pid"]] if m["name"] == "io_file"}
    in_order, backwards = counters[truth["in_order"]], counters[truth["backwards"]]
    # 16 reads that move bytes per pass: each pass's first is no one's successor
    assert (in_order["placed_reads"], in_order["seq_reads"], in_order["consec_reads"]) == (
        truth["placed_in_order"], truth["placed_in_order"], truth["placed_in_order"])
    assert (backwards["placed_reads"], backwards["seq_reads"], backwards["consec_reads"]) == (
        truth["placed_backwards"], 0, 0)


@needs("analysis", None if importlib.util.find_spec("polars") else
       "needs the analysis extra: pip install 'dftrace[analysis]'")
def test_the_summary_calls_random_only_what_went_back(tmp_path, monkeypatch):
    """The summary's random share is of the accesses the counters placed; a run with
    no span takes its time from its file calls."""
    from dftrace.analysis import summarize

    truth, trace = _access_run(tmp_path, monkeypatch)
    summary = summarize(tmp_path / "trace", index=False)
    access = summary.io["access"]
    placed = truth["placed_in_order"] + truth["placed_backwards"]
    assert access["after_first"] == placed
    assert access["random_share"] == round(truth["placed_backwards"] / placed, 4)
    # no span in this run: its time is its file calls'
    calls = [e for path in (truth["in_order"], truth["backwards"]) for e in trace.of(path)]
    first, last = min(e["ts"] for e in calls), max(e["ts"] + e["dur"] for e in calls)
    assert summary.overview["wall_us"] == last - first > 0


#: More files than the counters' table holds, each read whole twice (one os.read of
#: more than its size), the second pass after every file's first.
MANY_FILES_TWICE = START + """
    n = int(sys.argv[2])
    sizes = {data_file(f"f{i:05d}.bin", b"x" * (1 + i % 300)): 1 + i % 300 for i in range(n)}
    dftrace.initialize(log_file=out, io=True, data_dir=data, compression="none")
    for _ in range(2):
        for path, size in sizes.items():
            fd = os.open(path, os.O_RDONLY)
            assert len(os.read(fd, size + 1)) == size
            os.close(fd)
    dftrace.finalize()
    print(json.dumps({"pid": os.getpid(), "sizes": sizes}))
"""


def test_more_files_than_the_table_holds_add_up_to_the_truth(tmp_path, monkeypatch):
    """The counters of a process that reads more files than the table holds come in
    several records per file (written each time the table is full), and they add up
    to what the program read; the trace's io record says how often the table was cut."""
    monkeypatch.chdir(tmp_path)
    n = FILES_AT_A_TIME + 1000
    truth = run_traced(tmp_path, MANY_FILES_TWICE, str(n))
    trace = IOTrace(tmp_path / "trace")
    per_file = defaultdict(list)
    for m in trace.meta[truth["pid"]]:
        if m["name"] == "io_file":
            per_file[m["args"]["fhash"]].append(m["args"])
    named = {args["path"]: records for records in per_file.values() for args in records if args["path"]}
    assert set(named) == set(truth["sizes"])
    for path, size in truth["sizes"].items():
        records = named[path]
        assert sum(r["read_bytes"] for r in records) == 2 * size, path
        assert sum(r["read_ops"] for r in records) == 2, path
        assert sum(r["metadata_ops"] for r in records) == 4, path  # the opens and closes
        hist = [sum(column) for column in zip(*(r["read_hist"] for r in records))]
        assert hist[0 if size < 100 else 1] == 2, path
    # 10,192 files counted in all, 4,096 at a time: the table was cut twice
    records = sum(len(r) for r in per_file.values())
    assert n < records <= 2 * n
    (io,) = [m["args"] for m in trace.meta[truth["pid"]] if m["name"] == "io"]
    assert io["counter_cuts"] == (2 * n) // FILES_AT_A_TIME
