"""File I/O tracing where a program's processes come and go: a child started after a
``chdir``, a child that touches no file, and ends without ``atexit`` (``os._exit``)
or without a word (SIGKILL), each checked on the trace against what the program did."""

from __future__ import annotations

import importlib.util
import json

from _io_util import NEEDS_IO, READS, START, IOTrace, run_traced
from _requirements import needs
from reliability._util import drainer_writes, run, wait_for_end, write_script

pytestmark = NEEDS_IO


#: A relative data_dir, then the program changes directory and starts a Python child.
RELATIVE_DATA_DIR = START + """
    import subprocess
    p = data_file("shared.bin", b"0123456789" * 100)
    dftrace.initialize(log_file=out, io=True, data_dir="data", compression="none")
    os.makedirs("elsewhere", exist_ok=True)
    os.chdir("elsewhere")
    child = subprocess.run([sys.executable, "-c", "print(len(open('../data/shared.bin', 'rb').read()))"],
                           capture_output=True, text=True)
    print(json.dumps({"child": int(child.stdout), "path": p, "pid": os.getpid()}))
"""


def test_a_child_started_in_another_directory_traces_the_same_files(tmp_path, monkeypatch):
    """``data_dir`` names its directories as the program saw them when tracing
    started: a child started after a ``chdir`` traces those, not others."""
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, RELATIVE_DATA_DIR)
    assert truth["child"] == 1000
    trace = IOTrace(tmp_path / "trace")
    child = [e for e in trace.of(truth["path"]) if e["name"] in READS and e["pid"] != truth["pid"]]
    assert sum(max(e["args"]["ret"], 0) for e in child) == 1000


#: A Python child that touches no file (as multiprocessing's resource tracker).
IDLE_CHILD = START + """
    import subprocess
    p = data_file("one.bin", b"1" * 100)
    dftrace.initialize(log_file=out, io=True, data_dir=data, compression="none")
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    n = len(open(p, "rb").read())
    print(json.dumps({"read": n, "pid": os.getpid()}))
"""


def test_a_child_that_touches_no_file_writes_no_file(tmp_path, monkeypatch):
    """With file I/O traced, a Python child that records nothing and calls no traced
    file writes no trace file, as without ``io``: an empty file of multiprocessing's
    resource tracker came late, after ``dftrace run`` had listed the files, and made a
    one-process run two in ``dftrace diff``."""
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, IDLE_CHILD)
    assert truth["read"] == 100
    assert IOTrace(tmp_path / "trace").pids == {truth["pid"]}


#: data_dir is the current directory, where the script is: a spawned child (and
#: multiprocessing's resource tracker, a Python child too) imports modules, and the
#: import system looks at each directory of its path, which the child's tracing
#: starts before the interpreter and multiprocessing have put there.
SPAWNED_IMPORTS = """
    import json, multiprocessing as mp, os, sys
    import dftrace

    def work(path):
        import csv, decimal, fractions, json  # noqa: F401
        return len(open(path, "rb").read())

    if __name__ == "__main__":
        out, here = sys.argv[1], os.getcwd()
        path = os.path.join(here, "read_by_child.bin")
        with open(path, "wb") as f:
            f.write(b"c" * 700)
        dftrace.initialize(log_file=out, io=True, data_dir=here, compression="none")
        with mp.get_context("spawn").Pool(1) as pool:
            got = pool.apply(work, (path,))
        print(json.dumps({"read": got, "path": path, "dirs": sorted({here, os.path.dirname(os.path.abspath(__file__))}),
                          "pid": os.getpid()}))
"""


def test_a_spawned_childs_imports_are_not_its_file_io(tmp_path, monkeypatch):
    """The import system's looks at the directories of ``sys.path`` are never traced,
    in a spawned child either, where its path is made after tracing started: the
    child's calls on its files are, and none is on a directory of the path."""
    monkeypatch.chdir(tmp_path)
    truth = run_traced(tmp_path, SPAWNED_IMPORTS)
    trace = IOTrace(tmp_path / "trace")
    child = [e for e in trace.of(truth["path"]) if e["pid"] != truth["pid"]]
    assert sum(e["args"]["ret"] for e in child if e["name"] in READS) == truth["read"] == 700
    on_dirs = [(e["name"], trace.path_of(e)) for d in truth["dirs"] for e in trace.of(d)]
    assert on_dirs == []


#: Reads, then os._exit at once: no atexit, no finalize.
EXIT_AT_ONCE = START + """
    p = data_file("last.bin", b"x" * 3000)
    dftrace.initialize(log_file=out, io=True, data_dir=data, compression="none")
    with open(p, "rb") as f:
        n = len(f.read(1000)) + len(f.read())
    print(json.dumps({"read": n, "path": p, "pid": os.getpid()}), flush=True)
    os._exit(3)
"""


def test_os_exit_right_after_the_calls_keeps_them(tmp_path, monkeypatch):
    """A program that ends with ``os._exit`` straight after its calls: its exit status
    is its own, and its calls and counters are in the trace."""
    monkeypatch.chdir(tmp_path)
    prog = write_script(tmp_path, EXIT_AT_ONCE)
    done = run([prog, str(tmp_path / "trace" / "t")], timeout=120)
    assert done.returncode == 3, done.stderr
    truth = json.loads(done.stdout.strip().splitlines()[-1])
    if drainer_writes():  # the drainer ends the file after the process (the writer thread wrote it before)
        wait_for_end(tmp_path / "trace")
    trace = IOTrace(tmp_path / "trace")
    reads = [e for e in trace.of(truth["path"]) if e["name"] in READS]
    assert sum(max(e["args"]["ret"], 0) for e in reads) == truth["read"] == 3000
    assert trace.totals(truth["pid"])["calls"] >= 4  # open, two reads, close


#: Reads for a while, then SIGKILL: the calls since the last drain die with it.
KILLED = START + """
    import signal, time
    p = data_file("hot.bin", b"k" * 4096)
    dftrace.initialize(log_file=out, io=True, data_dir=data, compression="none")
    fd = os.open(p, os.O_RDONLY)
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < 0.3:
        n += len(os.pread(fd, 4096, 0))
    print(json.dumps({"read": n, "path": p, "pid": os.getpid()}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@needs("analysis", None if importlib.util.find_spec("polars") else
       "needs the analysis extra: pip install 'dftrace[analysis]'")
def test_a_killed_process_is_said_to_have_lost_its_last_calls(tmp_path, monkeypatch):
    """SIGKILL between two drains: the calls since the last one and the counters are
    lost with the process, and the summary says so (never a silent shortfall). The
    drainer tells how a killed process ended: it writes its file, whatever the writer
    of the other tests."""
    from dftrace.analysis import summarize

    monkeypatch.chdir(tmp_path)
    prog = write_script(tmp_path, KILLED)
    done = run([prog, str(tmp_path / "trace" / "t")], timeout=120, DFTRACE_WRITER="process")
    assert done.returncode == -9, done.stderr
    truth = json.loads(done.stdout.strip().splitlines()[-1])
    wait_for_end(tmp_path / "trace")
    io = summarize(str(tmp_path / "trace")).io
    assert 0 < io["read_bytes"] <= truth["read"]
    assert io["recorded"]["cut_short"] == 1
    assert any("ended (killed) before the last drain" in line for line in io["findings"])
