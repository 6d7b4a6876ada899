"""Each file's counters (the ``io_file`` records) against what the program did: the
access pattern counted from each open, copies the kernel makes (``sendfile``,
``copy_file_range``: no read or write call, yet bytes read and written), and a process
that reads more files than the counters' table holds at a time (its counters written
when it is full and counted afresh: records that add up to the truth)."""

from __future__ import annotations

import importlib.util
from collections import defaultdict

from _io_util import NEEDS_IO, READS, START, WRITES, IOTrace, run_traced
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


#: Copies made by the kernel: shutil.copyfile (sendfile, in blocks), os.sendfile with
#: an offset (the source's position stays) into a file, os.copy_file_range from the
#: source's position (which moves), and a read after it, at the moved position.
COPIES = START + """
    import shutil
    size = 300_000
    src = data_file("src.bin", os.urandom(size))
    copy, sent, ranged = (os.path.join(data, n) for n in ("copy.bin", "sent.bin", "ranged.bin"))
    dftrace.initialize(log_file=out, io=True, data_dir=data, compression="none")
    shutil.copyfile(src, copy)
    fin = os.open(src, os.O_RDONLY)
    fout = os.open(sent, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    offset, sendfiles = 1000, 0
    while True:
        n = os.sendfile(fout, fin, offset, 65536)
        sendfiles += 1
        if not n:
            break
        offset += n
    os.close(fout)
    fout = os.open(ranged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        ranged_bytes = os.copy_file_range(fin, fout, 100_000)
    except OSError:  # a kernel or filesystem without it: the source's position stays
        ranged_bytes = 0
    os.close(fout)
    after = len(os.read(fin, 10))
    os.close(fin)
    dftrace.finalize()
    print(json.dumps({"pid": os.getpid(), "src": src, "copy": copy, "sent": sent, "ranged": ranged,
                      "size": size, "sendfiles": sendfiles, "ranged_bytes": ranged_bytes,
                      "after": after}))
"""


def _copies_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return run_traced(tmp_path, COPIES), IOTrace(tmp_path / "trace")


def test_copies_the_kernel_makes_count_on_both_files(tmp_path, monkeypatch):
    """sendfile and copy_file_range read one file and write another with no read or
    write call: each traced side is an event of its own (``*_read`` on the source,
    ``*_write`` on the destination) and its file's counters, to the byte."""
    truth, trace = _copies_run(tmp_path, monkeypatch)
    size, ranged = truth["size"], truth["ranged_bytes"]
    counters = {m["args"]["path"]: m["args"] for m in trace.meta[truth["pid"]] if m["name"] == "io_file"}
    assert counters[truth["copy"]]["write_bytes"] == size
    assert counters[truth["sent"]]["write_bytes"] == size - 1000
    assert counters[truth["ranged"]]["write_bytes"] == ranged
    assert counters[truth["src"]]["read_bytes"] == size + (size - 1000) + ranged + truth["after"]
    assert trace.bytes(truth["copy"], WRITES) == size
    assert trace.bytes(truth["src"], READS) == counters[truth["src"]]["read_bytes"]
    # one event a side per call: the sends the program counted, and shutil's own
    sent = trace.calls(truth["sent"])
    assert sent["sendfile_write"] == truth["sendfiles"]
    shutil_calls = trace.calls(truth["copy"])["sendfile_write"]
    assert shutil_calls >= 2
    assert trace.calls(truth["src"])["sendfile_read"] == truth["sendfiles"] + shutil_calls
    # offsets: the sends from 1000 on; the range copy from the source's own position
    # (0: sendfile with an offset left it), and the read after it where that moved
    src_events = sorted(trace.of(truth["src"]), key=lambda e: e["ts"])
    sends = [e for e in src_events if e["name"] == "sendfile_read"][shutil_calls:]
    assert sends[0]["args"]["offset"] == 1000
    (read,) = [e for e in src_events if e["name"] == "read"]
    assert read["args"]["offset"] == ranged
    if ranged:
        (copied,) = [e for e in src_events if e["name"] == "copy_file_range_read"]
        assert copied["args"]["offset"] == 0 and copied["args"]["ret"] == ranged


@needs("analysis", None if importlib.util.find_spec("polars") else
       "needs the analysis extra: pip install 'dftrace[analysis]'")
def test_the_summary_counts_kernel_copies_as_reads_and_writes(tmp_path, monkeypatch):
    from dftrace.analysis import summarize

    truth, _ = _copies_run(tmp_path, monkeypatch)
    io = summarize(tmp_path / "trace", index=False).io
    size, ranged = truth["size"], truth["ranged_bytes"]
    files = {f["path"]: f for f in io["files"]}
    assert files[truth["src"]]["read_bytes"] == size + (size - 1000) + ranged + truth["after"]
    assert [files[truth[k]]["write_bytes"] for k in ("copy", "sent")] == [size, size - 1000]
    assert io["write_bytes"] == size + (size - 1000) + ranged
