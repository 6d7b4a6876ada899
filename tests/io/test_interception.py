"""File I/O tracing against the truth each program counts itself: the bytes of files
of known sizes, the number of calls it made, from the main thread, threads, every
worker start method and Python children; the right file at any fd number; errno
untouched; children that are not Python untouched; nothing lost without a count."""

from __future__ import annotations

import os
import sys

import pytest

from _io_util import NEEDS_IO, READS, START, WRITES, IOTrace, run_traced

pytestmark = NEEDS_IO

#: Writes files of known sizes under data/, reads them back every way Python and C
#: extensions do, from this thread and four others, and prints what it did.
EVERY_WAY = START + """
    import threading
    dftrace.initialize(log_file=out, io=True, data_dir=data, compression="none")
    sizes = {"whole.bin": 10000, "pread.bin": 4096 * 7 + 5, "into.bin": 3000,
             "np.bin": 12345, "t0.bin": 777, "t1.bin": 778, "t2.bin": 779, "t3.bin": 780}
    truth = {"written": {}, "read": {}, "pread_calls": 0, "thread_preads": 0}
    for name, n in sizes.items():
        with open(os.path.join(data, name), "wb") as f:
            f.write(os.urandom(n))
        truth["written"][name] = n
    with open(os.path.join(data, "whole.bin"), "rb") as f:       # FileIO.readall: read
        truth["read"]["whole.bin"] = len(f.read())
    fd = os.open(os.path.join(data, "pread.bin"), os.O_RDONLY)    # os.pread: pread64
    got = off = 0
    while True:
        b = os.pread(fd, 4096, off)
        truth["pread_calls"] += 1
        if not b:
            break
        got += len(b)
        off += len(b)
    os.close(fd)
    truth["read"]["pread.bin"] = got
    buf = bytearray(3000)
    with open(os.path.join(data, "into.bin"), "rb", buffering=0) as f:  # readinto
        truth["read"]["into.bin"] = f.readinto(buf)
    try:
        import numpy                                                # C: fopen/fread
        truth["read"]["np.bin"] = numpy.fromfile(os.path.join(data, "np.bin"), dtype=numpy.uint8).size
    except ImportError:
        pass
    def worker(i):
        fd = os.open(os.path.join(data, f"t{i}.bin"), os.O_RDONLY)
        n = 0
        for _ in range(50):
            n = len(os.pread(fd, 1 << 16, 0))
        os.close(fd)
        truth["read"][f"t{i}.bin"] = n * 50
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    truth["thread_preads"] = 4 * 50
    outside = os.path.abspath("outside.bin")                      # not under data_dir
    with open(outside, "wb") as f:
        f.write(b"x" * 100)
    with open(outside, "rb") as f:
        f.read()
    truth["data"] = data
    print(json.dumps(truth))
"""


def test_bytes_and_calls_of_every_way_python_reads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, EVERY_WAY)
    trace = IOTrace(tmp_path / "trace")
    data = truth["data"]
    seen = {os.path.basename(p) for p in trace.paths.values()}
    assert "outside.bin" not in seen  # outside data_dir: untraced
    for name, n in truth["written"].items():
        assert trace.bytes(os.path.join(data, name), WRITES) == n, name
    for name, n in truth["read"].items():
        path = os.path.join(data, name)
        assert trace.bytes(path, READS) == n, (name, trace.calls(path))
    assert trace.calls(os.path.join(data, "pread.bin"))["pread"] == truth["pread_calls"]
    assert sum(trace.calls(os.path.join(data, f"t{i}.bin"))["pread"] for i in range(4)) \
        == truth["thread_preads"]
    # the four threads' calls carry their own thread ids, not the main thread's
    tids = {e["tid"] for i in range(4) for e in trace.of(os.path.join(data, f"t{i}.bin"))
            if e["name"] == "pread"}
    assert len(tids) == 4
    if "np.bin" in truth["read"]:
        assert trace.calls(os.path.join(data, "np.bin"))["fread"] >= 1
        assert {e["cat"] for e in trace.of(os.path.join(data, "np.bin"))} >= {"POSIX", "STDIO"}
    # the per-file counters (kept whatever is written) agree with the events
    (pid,) = trace.pids
    counters = {m["args"]["path"]: m["args"] for m in trace.meta[pid] if m["name"] == "io_file"}
    for name, n in truth["read"].items():
        assert counters[os.path.join(data, name)]["read_bytes"] == n
    assert trace.totals(pid)["dropped"] == 0


#: Each worker (the start method given) reads one file of its own in 1000-byte reads.
WORKERS = """
    import json, multiprocessing as mp, os, sys
    import dftrace

    def work(path):
        n = 0
        with open(path, "rb", buffering=0) as f:
            while True:
                b = f.read(1000)
                if not b:
                    return n
                n += len(b)

    if __name__ == "__main__":
        out, method = sys.argv[1], sys.argv[2]
        data = os.path.abspath("data")
        os.makedirs(data, exist_ok=True)
        dftrace.initialize(log_file=out, io=True, data_dir=data, compression="none")
        paths = []
        for i in range(4):
            p = os.path.join(data, f"w{i}.bin")
            with open(p, "wb") as f:
                f.write(b"z" * (5000 + 1111 * i))
            paths.append(p)
        with mp.get_context(method).Pool(2) as pool:
            got = pool.map(work, paths)
        print(json.dumps({"read": dict(zip(paths, got)), "parent": os.getpid()}))
"""


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_every_worker_start_method_is_traced(tmp_path, method, monkeypatch):
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, WORKERS, method)
    trace = IOTrace(tmp_path / "trace")
    for path, n in truth["read"].items():
        events = [e for e in trace.of(path) if e["name"] == "read"]
        assert sum(e["args"]["ret"] for e in events) == n, path
        assert {e["pid"] for e in events} - {truth["parent"]}, "read in the workers"
        assert sum(e["args"]["calls"] if "calls" in e["args"] else 1 for e in events) \
            == -(-n // 1000) + 1  # the reads that returned data, and the one at the end


#: 2000 files open at once (fds past 1024), each of its own size, read in an order
#: unrelated to their fds.
MANY_FILES = START + """
    import random, resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2200:
        print(json.dumps({"skip": f"RLIMIT_NOFILE hard limit {hard} < 2200"}))
        sys.exit(0)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2200), hard))
    for i in range(2000):
        data_file(f"f{i}", b"a" * (i + 1))
    dftrace.initialize(log_file=out, io=True, data_dir=data, compression="none")
    fds = [os.open(os.path.join(data, f"f{i}"), os.O_RDONLY) for i in range(2000)]
    order = list(range(2000))
    random.Random(7).shuffle(order)
    for i in order:
        assert len(os.read(fds[i], 1 << 20)) == i + 1
    top = max(fds)
    for fd in fds:
        os.close(fd)
    print(json.dumps({"top_fd": top}))
"""


def test_no_event_on_the_wrong_file_with_2000_open(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, MANY_FILES)
    if "skip" in truth:
        pytest.skip(truth["skip"])
    assert truth["top_fd"] > 1024
    trace = IOTrace(tmp_path / "trace")
    reads = [e for e in trace.events if e["name"] == "read"]
    assert len(reads) == 2000
    for e in reads:  # file f<i> holds i + 1 bytes
        assert e["args"]["ret"] == int(os.path.basename(trace.path_of(e))[1:]) + 1


#: Relative paths, openat with a directory fd, a relative data_dir, and names with
#: characters other tracers mangle.
PATHS = """
    import json, os, sys
    import dftrace
    out = sys.argv[1]
    os.makedirs("data/sub", exist_ok=True)
    names = ["plain.bin", "a (1) 'q' \\"d\\" |p.bin", "ü\\nnew line.bin"]
    dftrace.initialize(log_file=out, io=True, data_dir="data", compression="none")
    for n in names:
        with open(os.path.join("data", "sub", "..", n), "wb") as f:   # relative, with ..
            f.write(b"r" * 10)
    d = os.open("data", os.O_RDONLY | os.O_DIRECTORY)
    fd = os.open("plain.bin", os.O_RDONLY, dir_fd=d)                  # openat(dirfd, ...)
    os.read(fd, 100)
    os.close(fd)
    os.close(d)
    print(json.dumps({"paths": [os.path.abspath(os.path.join("data", n)) for n in names],
                      "at": os.path.abspath("data/plain.bin")}))
"""


def test_paths_are_absolute_and_exact(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, PATHS)
    trace = IOTrace(tmp_path / "trace")
    for p in truth["paths"]:
        assert trace.bytes(p, WRITES) == 10, (p, sorted(trace.paths.values()))
    assert trace.bytes(truth["at"], READS) == 10
    assert [e["name"] for e in trace.of(truth["at"]) if e["name"].startswith("open")] \
        == ["open", "openat"]


#: Failing calls: the program sees libc's errno; the trace has the failure.
ERRNO = START + """
    import errno
    dftrace.initialize(log_file=out, io=True, data_dir=data, compression="none")
    seen = {}
    try:
        open(os.path.join(data, "missing"))
    except OSError as e:
        seen["open"] = e.errno
    d = os.open(data, os.O_RDONLY)
    try:
        os.read(d, 10)
    except OSError as e:
        seen["read"] = e.errno
    os.close(d)
    try:
        os.close(d)
    except OSError as e:
        seen["close"] = e.errno
    print(json.dumps({"seen": seen, "data": data}))
"""


def test_errno_is_what_libc_set(tmp_path, monkeypatch):
    import errno

    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, ERRNO)
    assert truth["seen"] == {"open": errno.ENOENT, "read": errno.EISDIR, "close": errno.EBADF}
    trace = IOTrace(tmp_path / "trace")
    (failed_open,) = [e for e in trace.of(os.path.join(truth["data"], "missing"))]
    assert failed_open["args"]["ret"] == -1 and failed_open["args"]["errno"] == errno.ENOENT
    (read,) = [e for e in trace.of(truth["data"]) if e["name"] == "read"]
    assert read["args"]["ret"] == -1 and read["args"]["errno"] == errno.EISDIR


#: Children: a program that is not Python (cat) runs untouched, a vfork child's
#: closing of fds leaves the parent's tracing as it was, a Python child traces itself.
CHILDREN = START + """
    import subprocess
    p = data_file("shared.bin", b"0123456789" * 100)
    dftrace.initialize(log_file=out, io=True, data_dir=data, compression="none")
    fd = os.open(p, os.O_RDONLY)
    cat = subprocess.run(["cat", p], capture_output=True, close_fds=True).stdout
    after = len(os.pread(fd, 50, 0))    # the fd still traced after the vfork child closed it
    os.close(fd)
    child = subprocess.run([sys.executable, "-c",
                            f"print(len(open({p!r}, 'rb').read()))"], capture_output=True, text=True)
    print(json.dumps({"cat": len(cat), "after": after, "child": int(child.stdout), "path": p,
                      "pid": os.getpid()}))
"""


def test_children_python_traced_others_untouched(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, CHILDREN)
    assert truth["cat"] == 1000 and truth["child"] == 1000 and truth["after"] == 50
    trace = IOTrace(tmp_path / "trace")
    by_pid = {}
    for e in trace.of(truth["path"]):
        if e["name"] in READS:
            by_pid[e["pid"]] = by_pid.get(e["pid"], 0) + max(e["args"]["ret"], 0)
    assert by_pid.pop(truth["pid"]) == 50  # the parent's pread after the subprocess
    assert list(by_pid.values()) == [1000]  # the Python child's own file; cat has none
    assert len(trace.pids) == 2


#: N preads (argv[2]) of one file under io_max_rate=2000 (100 calls in a 50 ms drain
#: interval), made at once, then finalize.
PREADS = START + """
    p = data_file("hot.bin", b"h" * 512)
    dftrace.initialize(log_file=out, io=True, data_dir=data, io_max_rate=2000,
                       compression="none")
    fd = os.open(p, os.O_RDONLY)
    n = int(sys.argv[2])
    for _ in range(n):
        os.pread(fd, 512, 0)
    os.close(fd)
    print(json.dumps({"preads": n, "path": p, "pid": os.getpid()}))
"""


def test_calls_over_the_rate_are_aggregated_and_counted(tmp_path, monkeypatch):
    """More calls than io_max_rate allows: the rest are folded into aggregates that
    count them."""
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, PREADS, "30000")
    trace = IOTrace(tmp_path / "trace")
    preads = [e for e in trace.of(truth["path"]) if e["name"] == "pread"]
    assert sum(e["args"].get("calls", 1) for e in preads) == truth["preads"]
    assert sum(e["args"]["ret"] for e in preads) == 512 * truth["preads"]
    folded = [e for e in preads if e["args"].get("aggregated")]
    assert folded and len(preads) < truth["preads"]
    io = trace.totals(truth["pid"])
    assert io["aggregated_calls"] == sum(e["args"]["calls"] for e in trace.of(truth["path"])
                                         if e["args"].get("aggregated"))
    assert io["dropped"] == 0


def test_a_short_burst_under_the_rate_is_written_call_by_call(tmp_path, monkeypatch):
    """The last drain, at finalize, comes sooner than the thread's: it still writes
    one interval's worth of calls one by one, so a burst the rate allows is not
    folded into aggregates (which tools that count events, DFAnalyzer's, miscount)."""
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, PREADS, "90")
    trace = IOTrace(tmp_path / "trace")
    preads = [e for e in trace.of(truth["path"]) if e["name"] == "pread"]
    assert len(preads) == truth["preads"]
    assert not any(e["args"].get("aggregated") for e in preads)
    assert trace.totals(truth["pid"])["aggregated_calls"] == 0


#: A ring too small for the calls between two drains: the calls it could not take
#: are counted, none lost without a count.
OVERFLOW = START + """
    from dftrace._core import io_tracing
    io_tracing.RING_SLOTS = 1024      # the smallest ring
    io_tracing.DRAIN_INTERVAL = 3600  # no drain until the end
    p = data_file("x.bin", b"h" * 64)
    # No rate cap: every call the ring took is an event of its own, however fast the loop.
    dftrace.initialize(log_file=out, io=True, data_dir=data, compression="none", io_max_rate=0)
    fd = os.open(p, os.O_RDONLY)
    for _ in range(5000):
        os.pread(fd, 64, 0)
    os.close(fd)
    print(json.dumps({"calls": 5002, "pid": os.getpid()}))
"""


def test_a_full_ring_counts_what_it_could_not_take(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, OVERFLOW)
    trace = IOTrace(tmp_path / "trace")
    io = trace.totals(truth["pid"])
    assert io["dropped"] > 0
    assert io["calls"] + io["dropped"] == truth["calls"]
    assert len(trace.events) == io["calls"]
    assert f"{io['dropped']} calls were not recorded" in truth["_stderr"]


#: After finalize the wrappers are unbound: I/O works and is not recorded.
AFTER_FINALIZE = START + """
    p = os.path.join(data, "x.bin")
    dftrace.initialize(log_file=out, io=True, data_dir=data, compression="none")
    with open(p, "wb") as f:
        f.write(b"1" * 10)
    dftrace.finalize()
    with open(p, "rb") as f:
        n = len(f.read())
    print(json.dumps({"after": n, "path": p}))
"""


def test_finalize_unbinds(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, AFTER_FINALIZE)
    assert truth["after"] == 10
    trace = IOTrace(tmp_path / "trace")
    assert trace.bytes(truth["path"], WRITES) == 10
    assert trace.bytes(truth["path"], READS) == 0


#: DFTracer's spelling: data_dir turns file I/O tracing on.
DFTRACER_SPELLING = """
    import json, os, sys
    from dftrace.logger import dftracer
    data = os.path.abspath("data")
    os.makedirs(data, exist_ok=True)
    log = dftracer.initialize_log(logfile=sys.argv[1] + ".pfw", data_dir=data, process_id=-1)
    p = os.path.join(data, "x.bin")
    with open(p, "wb") as f:
        f.write(b"1" * 33)
    log.finalize()
    print(json.dumps({"path": p}))
"""


def test_dftracer_spelling_traces_io_under_data_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, DFTRACER_SPELLING)
    assert IOTrace(tmp_path / "trace").bytes(truth["path"], WRITES) == 33


def test_dftrace_run_io_switch(tmp_path, monkeypatch):
    """``dftrace run --io script.py``: the switch alone, the script after it; the files
    of the script's children (two forked processes that write) are counted in what
    ``run`` says it wrote."""
    import subprocess

    from reliability._util import clean_env

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    script = tmp_path / "job.py"
    script.write_text("import multiprocessing as mp\n"
                      "def write(i):\n"
                      "    open(f'data/c{i}.bin', 'wb').write(b'2' * 5)\n"
                      "if __name__ == '__main__':\n"
                      "    open('data/x.bin', 'wb').write(b'1' * 21)\n"
                      "    for i in range(2):\n"
                      "        p = mp.get_context('fork').Process(target=write, args=(i,))\n"
                      "        p.start()\n"
                      "        p.join()\n")
    done = subprocess.run([sys.executable, "-m", "dftrace", "run", "--io", "--log-file",
                           str(tmp_path / "trace" / "t"), str(script)],
                          capture_output=True, text=True, env=clean_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    trace = IOTrace(tmp_path / "trace")
    assert trace.bytes(str(tmp_path / "data" / "x.bin"), WRITES) == 21
    assert [trace.bytes(str(tmp_path / "data" / f"c{i}.bin"), WRITES) for i in range(2)] == [5, 5]
    assert len(trace.pids) == 3
    assert " and 2 files of its child processes\n" in done.stderr, done.stderr


#: An fd closed where no close() wrapper sees it (os.closerange), its number then
#: given to a pipe: the pipe's reads are not the file's.
REUSED_FD = START + """
    p = data_file("x.bin", b"1" * 10)
    dftrace.initialize(log_file=out, io=True, data_dir=data, compression="none")
    fd = os.open(p, os.O_RDONLY)
    os.read(fd, 4)
    os.closerange(fd, fd + 1)
    r, w = os.pipe()
    os.write(w, b"pipe" * 100)
    got = len(os.read(r, 1000))
    print(json.dumps({"path": p, "reused": r == fd or w == fd, "got": got}))
"""


def test_a_reused_fd_number_is_not_the_old_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, REUSED_FD)
    assert truth["reused"] and truth["got"] == 400
    trace = IOTrace(tmp_path / "trace")
    assert trace.bytes(truth["path"], READS) == 4
    assert trace.bytes(truth["path"], WRITES) == 0


#: A file name that is not UTF-8, and io=True where the C engine is off.
ODD = START + """
    dftrace.initialize(log_file=out, io=True, data_dir=data, compression="none")
    with dftrace.ai.compute.forward:
        with open(os.path.join(data.encode(), b"caf\\xe9.bin"), "wb") as f:
            f.write(b"1" * 5)
    print(json.dumps({"data": data}))
"""


def test_a_name_that_is_not_utf8_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, ODD)
    trace = IOTrace(tmp_path / "trace")
    assert trace.bytes(os.path.join(truth["data"], "caf\\xe9.bin"), WRITES) == 5


def test_without_the_c_engine_one_warning_and_spans_still_traced(tmp_path, monkeypatch):
    from dftrace import testing

    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, ODD, DFTRACE_NO_SPEEDUPS="1")
    assert truth["_stderr"].count("file I/O is not traced") == 1
    events = testing.read_events(tmp_path / "trace")
    assert [e["name"] for e in testing.spans(events)] == ["forward"]
    assert not [e for e in events if e.get("cat") in ("POSIX", "STDIO")]


#: Every file (no data_dir): the program's data is traced, what the interpreter,
#: the import system and dftrace itself read and write is not.
EVERYTHING = """
    import json, os, sys
    import dftrace
    out = sys.argv[1]
    with open("mine.py", "w") as f:
        f.write("X = 1\\n")
    with open("input.bin", "wb") as f:
        f.write(b"i" * 300)
    dftrace.initialize(log_file=out, io=True, compression="none")
    sys.path.insert(0, os.getcwd())
    import mine                         # the import system's look-ups and reads
    import json as _json, email.parser  # modules of the interpreter's own
    # a package finding its own files (torch does): each directory above them looked up
    os.path.realpath(email.parser.__file__), os.path.realpath(dftrace.__file__)
    with open("input.bin", "rb") as f:
        n = len(f.read())
    with open("/proc/self/status") as f:
        f.read()
    print(json.dumps({"input": os.path.abspath("input.bin"), "n": n,
                      "trace": os.path.dirname(os.path.abspath(out)), "pid": os.getpid()}))
"""


def test_every_file_but_the_interpreters_and_dftraces_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, EVERYTHING)
    trace = IOTrace(tmp_path / "trace")
    assert trace.bytes(truth["input"], READS) == truth["n"] == 300
    paths = set(trace.paths.values())
    assert not [p for p in paths if p.endswith((".py", ".pyc")) or "__pycache__" in p
                or p.startswith(("/proc/", "/sys/", "/dev/", sys.prefix, sys.base_prefix,
                                 truth["trace"]))], sorted(paths)
    import dftrace

    above = set()  # the interpreter's directories, dftrace's, and every one above them
    for d in (sys.prefix, sys.base_prefix, os.path.dirname(dftrace.__file__)):
        while d != os.path.dirname(d):
            above.add(d)
            d = os.path.dirname(d)
    assert not paths & above, sorted(paths & above)
    assert trace.pids == {truth["pid"]}  # a drainer, if any, traces nothing of its own


#: Eight threads at once, each opening, reading and closing its own files in a loop
#: while the ring is drained: every call is counted once, on its own file.
THREADS = START + """
    import threading
    for t in range(8):
        data_file(f"t{t}.bin", b"t" * (100 + t))
    dftrace.initialize(log_file=out, io=True, data_dir=data, compression="none")
    ROUNDS, READS = 200, 10

    def work(t):
        p = os.path.join(data, f"t{t}.bin")
        for _ in range(ROUNDS):
            fd = os.open(p, os.O_RDONLY)
            for _ in range(READS):
                os.pread(fd, 4096, 0)
            os.close(fd)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print(json.dumps({"data": data, "rounds": ROUNDS, "reads": READS, "pid": os.getpid()}))
"""


def test_threads_at_once_every_call_once_on_its_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, THREADS)
    trace = IOTrace(tmp_path / "trace")
    rounds, reads = truth["rounds"], truth["reads"]
    for t in range(8):
        path = os.path.join(truth["data"], f"t{t}.bin")
        calls = trace.calls(path)
        assert (calls["open"], calls["pread"], calls["close"]) == (rounds, rounds * reads, rounds)
        assert trace.bytes(path, READS) == rounds * reads * (100 + t)
    assert trace.totals(truth["pid"])["dropped"] == 0
