"""writer="process": a drainer process writes each traced process's file from shared memory."""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time

import pytest
from _requirements import native_engine_missing, needs_marks

import dftrace
from dftrace import ai, testing
from dftrace._core import engine as _engine

from ._util import HERE, assert_valid, clean_env, events_by_pid, files, fuse_dir, \
    meta, run, spans, start, wait_for_end, write_script

pytestmark = [
    *needs_marks("native", native_engine_missing()),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="writer='process' needs Linux (memfd)")]

DETERMINISTIC = """
    import sys

    import dftrace
    from dftrace import ai

    dftrace.initialize(log_file=sys.argv[1], writer=sys.argv[2], compression="gzip",
                       flush_interval=0.05)

    @ai.compute.forward
    def forward(i):
        return i

    with ai.pipeline.epoch(args={"epoch": 0}):
        for i in range(9000):  # more than two slots of the ring
            forward(i)
        for i in range(3):
            with ai.data.item(args={"i": i, "s": "x" * i}):
                ai.data.item.update(step=i)
    ai.compute.forward.update(phase="eval")
    forward(-1)
"""


def _comparable(path: str) -> list[tuple]:
    """The events of a file without what differs between runs (ids, times, pids)."""
    out = []
    for e in testing.read_events(path):
        args = {k: v for k, v in e.get("args", {}).items()
                if k not in ("hhash", "p_idx", "wall_ns", "mono_ns", "ppid", "pid", "start_time",
                             "cmdline", "name", "sort_index", "value", "memory_total")}
        out.append((e.get("ph"), e.get("name"), e.get("cat"), json.dumps(args, sort_keys=True)))
    return out


def test_same_file_as_the_thread_writer(tmp_path):
    """A deterministic program leaves the same events with either writer."""
    script = write_script(tmp_path, DETERMINISTIC)
    got = {}
    for writer in ("thread", "process"):
        out = run([script, str(tmp_path / writer / "t"), writer])
        assert out.returncode == 0, out.stderr
        assert "not available" not in out.stderr
        (path,) = files(tmp_path / writer)
        assert path.endswith(".pfw.gz")
        assert_valid([path])
        got[writer] = _comparable(path)
    assert len(got["process"]) > 9000
    assert got["process"] == got["thread"]


def test_in_process_session_writes_through_the_drainer(tmp_path):
    """In this process: finalize returns with the drainer's file complete, metadata included."""
    s = dftrace.initialize(log_file=str(tmp_path / "t"), writer="process")
    assert type(s.writer).__name__ == "ProcessWriter"
    for i in range(5000):
        with ai.compute.forward(args={"i": i}):
            pass

    def load() -> None:
        with ai.data.item:
            pass

    t = threading.Thread(target=load, name="loader")
    t.start()
    t.join()
    dftrace.finalize()
    (path,) = s.paths
    assert_valid([path])
    events = testing.read_events(path)
    assert [e["args"]["i"] for e in spans(events, "forward")] == list(range(5000))
    assert "loader" in [e["args"]["name"] for e in meta(events, "thread_name")]
    assert len(spans(events, "item")) == 1


def test_drainer_runs_the_installed_dftrace_whatever_the_working_directory(tmp_path):
    """From a directory holding another ``dftrace`` folder (a clone, say), the drainer
    still runs the dftrace the program imported: no fallback, the file is whole."""
    script = write_script(tmp_path, DETERMINISTIC + """
    import dftrace._core.lifecycle as _lifecycle
    print(type(_lifecycle.session().writer).__name__ if _lifecycle.session() else "none")
    """)
    clone = tmp_path / "clone"
    (clone / "dftrace").mkdir(parents=True)
    (clone / "dftrace" / "__init__.py").write_text("raise SystemExit('the wrong dftrace')\n")
    out = subprocess.run([sys.executable, script, str(tmp_path / "out" / "t"), "process"],
                         capture_output=True, text=True, timeout=120, cwd=clone, env=clean_env())
    assert out.returncode == 0, out.stderr
    assert "not available" not in out.stderr and "itself" not in out.stderr, out.stderr
    assert out.stdout.split() == ["ProcessWriter"]
    (path,) = files(tmp_path / "out")
    assert_valid([path])
    assert len(spans(testing.read_events(path), "forward")) == 9001


def test_writer_setting_is_validated_at_initialize():
    """A wrong DFTRACE_WRITER fails at initialize naming the setting."""
    with pytest.raises(dftrace.ConfigError, match="DFTRACE_WRITER"):
        dftrace.initialize(writer="disk")


def test_without_the_c_engine_the_thread_writer_is_used_with_one_warning(tmp_path):
    """DFTRACE_NO_SPEEDUPS=1: the process writer falls back, says so once, and the file is whole."""
    script = write_script(tmp_path, DETERMINISTIC)
    out = run([script, str(tmp_path / "t"), "process"], DFTRACE_NO_SPEEDUPS="1")
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("writer='process' (env DFTRACE_WRITER) is not available") == 1
    (path,) = files(tmp_path)
    assert_valid([path])
    assert len(spans(testing.read_events(path), "forward")) == 9001


# -- kill -9 -------------------------------------------------------------------------

def _kernel() -> tuple[int, ...]:
    """The running Linux kernel's version, as numbers."""
    release = os.uname().release.split("-")[0].split(".")
    return tuple(int(p) for p in release[:2] if p.isdigit())


@pytest.mark.parametrize("run_no", range(2))
@pytest.mark.parametrize("writer", ["process", ""])
def test_kill9_loses_nothing_committed(tmp_path, run_no, writer):
    """SIGKILL at a random moment under full load, with writer="process" or no writer
    setting: every span that ended is in the file, the file is complete and valid, and
    a metadata line says the process was killed, also when the parent reaps the
    process before the drainer looks (no setting: the test reaps it at once, where the
    kernel keeps the exit status for a pidfd, Linux 6.15 on)."""
    reap_first = not writer and _kernel() >= (6, 15)
    out = str(tmp_path)
    with open(os.path.join(out, "count"), "w+b") as fh:
        fh.write(b"\0" * 8)
        fh.flush()
        # Read through a mapping of our own: the victim's stores are seen at once.
        counter = mmap.mmap(fh.fileno(), 8, prot=mmap.PROT_READ)
    proc = start([os.path.join(HERE, "_kill9.py"), "emit", out, "1.0", "0", writer],
                 DFTRACE_WRITER="")  # blank: no setting
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()

    def ended() -> int:
        return struct.unpack_from("q", counter, 0)[0]

    deadline = time.monotonic() + 60  # a loaded machine may not run it at once
    while ended() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if ended() == 0:
        proc.send_signal(signal.SIGUSR2)  # the victim prints every thread's stack
        time.sleep(1.0)
        proc.kill()
        pytest.fail(f"no span ended within 60 s of 'ready'; the victim's stacks:\n"
                    f"{proc.communicate()[1]}")
    time.sleep(random.uniform(0.05, 0.3))  # some hundred thousand spans
    proc.send_signal(signal.SIGKILL)
    emitted = ended()
    if reap_first:
        proc.wait()  # reaped before the drainer looks: its pidfd still tells the signal
    path = wait_for_end(out)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert_valid([path])
    events = testing.read_events(path)
    ids = sorted(e["id"] for e in spans(events, "forward"))
    # The counter is stored after each span is committed: all of them are here (the
    # span in flight at the kill may be too, or may be dropped, never cut).
    assert len(ids) in (emitted, emitted + 1)
    assert ids == list(range(ids[0], ids[0] + len(ids)))
    (end,) = meta(events, "process_end")
    assert end["args"]["finalized"] is False
    assert end["args"]["signal"] == signal.SIGKILL
    assert end["args"]["how"] == "killed by signal 9"


def test_exit_without_finalize_is_said_in_the_file(tmp_path):
    """os._exit skips finalize: the drainer ends the file and says how the process ended."""
    script = write_script(tmp_path, """
        import os, sys
        import dftrace
        from dftrace import ai
        dftrace.initialize(log_file=sys.argv[1], writer="process")
        for i in range(10):
            with ai.compute.forward:
                pass
        print("done", flush=True)
        sys.stdin.readline()
        os._exit(3)
    """)
    proc = subprocess.Popen([sys.executable, script, str(tmp_path / "t")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True,
                            env=clean_env())
    assert proc.stdout.readline().strip() == "done"
    proc.stdin.write("\n")
    proc.stdin.flush()
    path = wait_for_end(tmp_path)
    assert proc.wait() == 3
    events = testing.read_events(path)
    assert len(spans(events, "forward")) == 10
    (end,) = meta(events, "process_end")
    assert end["args"]["exit_status"] == 3


# -- children ------------------------------------------------------------------------

def test_drainer_is_shared_by_children_and_exits_after_the_last(tmp_path):
    """multiprocessing children register with their parent's drainer; it exits after them."""
    script = write_script(tmp_path, """
        import multiprocessing as mp, os, sys
        import dftrace
        from dftrace import ai

        def child(k, out):
            for i in range(5):
                with ai.data.item(args={"k": k}):
                    pass
            with open(f"{out}/drainer{k}", "w") as fh:
                fh.write(str(dftrace.session().writer.drainer_pid))

        if __name__ == "__main__":
            s = dftrace.initialize(log_file=sys.argv[1] + "/t", writer="process")
            with ai.compute.forward:
                pass
            procs = [mp.get_context("spawn").Process(target=child, args=(k, sys.argv[2]))
                     for k in range(2)]
            for p in procs:
                p.start()
            for p in procs:
                p.join()
            print(s.writer.drainer_pid)
    """)
    side = tmp_path / "side"
    side.mkdir()
    out = run([script, str(tmp_path / "traces"), str(side)])
    assert out.returncode == 0, out.stderr
    drainer = int(out.stdout)
    assert {int((side / f"drainer{k}").read_text()) for k in range(2)} == {drainer}
    tmp_path = tmp_path / "traces"
    by_pid = events_by_pid(tmp_path)
    assert len(by_pid) == 3
    assert_valid(files(tmp_path))
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{drainer}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{drainer}")


# -- the drainer dies ----------------------------------------------------------------

def test_killed_drainer_is_replaced_by_writing_in_process(tmp_path):
    """SIGKILL to the drainer: the process notices, warns once, writes the rest of
    its ring itself into the next free file name, and no longer names the drainer
    to its children (DFTRACE_DRAINER is removed)."""
    script = write_script(tmp_path, """
        import os, signal, sys, time
        import dftrace
        from dftrace import ai
        s = dftrace.initialize(log_file=sys.argv[1] + "/t", writer="process")
        for i in range(100):
            with ai.compute.forward(args={"i": i}):
                pass
        s.writer.flush()
        os.kill(s.writer.drainer_pid, signal.SIGKILL)
        while os.path.exists(f"/proc/{s.writer.drainer_pid}/cmdline") and \\
                open(f"/proc/{s.writer.drainer_pid}/stat").read().split()[2] != "Z":
            time.sleep(0.01)
        for i in range(100, 20000):
            with ai.compute.forward(args={"i": i}):
                pass
        dftrace.finalize()
        print(*s.paths)
        print(os.environ.get("DFTRACE_DRAINER", "none"))
    """)
    out = run([script, str(tmp_path)])
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("the trace drainer") == 1, out.stderr
    first, second = sorted(files(tmp_path), key=len)
    paths, drainer = out.stdout.split("\n")[:2]
    assert paths.split() == [second]
    assert drainer == "none"  # children started from now on do not look for it
    assert_valid([second])
    before = [e["args"]["i"] for e in spans(testing.read_events(first), "forward")]
    after = [e["args"]["i"] for e in spans(testing.read_events(second), "forward")]
    assert before == list(range(100))
    assert after == list(range(100, 20000))


# -- storage that hangs ---------------------------------------------------------------

@pytest.fixture
def hung_mount(tmp_path):
    """A mounted filesystem whose writes never return; unmounted whatever happens."""
    with fuse_dir(tmp_path, "_hung_fs.py") as (mnt, _):
        yield mnt


@contextlib.contextmanager
def slow_storage(tmp_path, **kw):
    """A FUSE mount over ``tmp_path/backing`` whose every write takes 0.2 s: yields
    (backing, mount point, the daemon); the test skips where FUSE cannot mount."""
    backing = tmp_path / "backing"
    backing.mkdir()
    with fuse_dir(tmp_path, "_slow_fs.py", str(backing), "{mnt}", "0.2", **kw) as (mnt, fs):
        yield backing, mnt, fs


HUNG = """
    import sys, time
    import dftrace
    from dftrace import ai
    dftrace.initialize(log_file=sys.argv[1], writer=sys.argv[3] or None, flush_interval=0.05)
    print("ready", flush=True)
    for _ in range(int(sys.argv[2])):
        for i in range(1000):
            with ai.compute.forward:
                pass
        time.sleep(0.001)
    print("done", flush=True)
"""


@pytest.mark.needs("fuse")
@pytest.mark.parametrize("writer", ["process", ""])
@pytest.mark.parametrize("end", ["sigterm", "exit"])
def test_hung_storage_never_holds_the_traced_process(tmp_path, hung_mount, end, writer):
    """With the trace storage hung, SIGTERM ends the process with its SIGTERM death and
    a normal exit ends it with status 0, and the process is gone (no thread of it is
    stuck in the kernel): with writer="process", and with no writer setting."""
    script = write_script(tmp_path, HUNG)
    rounds = 10**9 if end == "sigterm" else 400
    proc = start([script, str(hung_mount / "t"), str(rounds), writer], DFTRACE_WRITER="")
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    time.sleep(0.5)  # the drainer's first write is under way, and hangs
    if end == "sigterm":
        proc.send_signal(signal.SIGTERM)
        expected = -signal.SIGTERM
    else:
        expected = 0
    try:
        rc = proc.wait(timeout=30)  # a process stuck on the storage would never end
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the traced process did not end while the storage hung")
    assert rc == expected, proc.stderr.read()
    assert not os.path.exists(f"/proc/{proc.pid}")
    assert "storage stalled" in proc.stderr.read()


#: A process of a job: with the umask given (octal) if one is, it records a span with
#: the process writer into the folder given, prints its drainer's pid and ends at a line.
JOB_PROCESS = """
    import os, sys
    if len(sys.argv) > 2:
        os.umask(int(sys.argv[2], 8))
    import dftrace
    from dftrace import ai
    s = dftrace.initialize(log_file=sys.argv[1] + "/t", writer="process")
    with ai.compute.forward:
        pass
    print(s.writer.drainer_pid, flush=True)
    sys.stdin.readline()
"""


def _drainers_of_one_job(tmp_path, args: list[list[str]]) -> set[int]:
    """Run a process of one job (the launcher's job id in its environment, siblings
    not each other's children) per item of ``args`` (:data:`JOB_PROCESS`'s arguments),
    all at once; once each has ended well, return their drainers' pids."""
    script = write_script(tmp_path, JOB_PROCESS)
    env = clean_env(TORCHELASTIC_RUN_ID=f"job-{os.getpid()}-{time.time_ns()}")
    procs = [subprocess.Popen([sys.executable, script, *a], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env) for a in args]
    drainers = {int(p.stdout.readline()) for p in procs}
    for p in procs:
        p.communicate("\n", timeout=60)
        assert p.returncode == 0
    return drainers


def test_processes_of_one_job_share_one_drainer(tmp_path):
    """Siblings of one job (torchrun ranks, srun tasks: not each other's children)
    find the job's drainer through the launcher's job id."""
    drainers = _drainers_of_one_job(tmp_path, [[str(tmp_path)]] * 3)
    assert len(drainers) == 1
    assert len(files(tmp_path)) == 3
    assert_valid(files(tmp_path))


def test_dftrace_run_with_a_subprocess_child_shares_the_drainer(tmp_path):
    """``dftrace run --writer process``: the script and the subprocess it starts (traced
    through the exported configuration) write through one drainer."""
    script = write_script(tmp_path, """
        import subprocess, sys
        import dftrace
        from dftrace import ai
        with ai.pipeline.train:
            pass
        if sys.argv[1:] != ["child"]:
            subprocess.run([sys.executable, __file__, "child"], check=True)
        print(dftrace.session().writer.drainer_pid, flush=True)
    """)
    out = run(["-m", "dftrace", "run", "--writer", "process", "--log-file",
               str(tmp_path / "traces" / "t"), script])
    assert out.returncode == 0, out.stderr
    assert len(set(out.stdout.split())) == 1
    by_pid = events_by_pid(tmp_path / "traces")
    assert len(by_pid) == 2
    assert all(len(spans(evs, "train")) == 1 for evs in by_pid.values())
    assert_valid(files(tmp_path / "traces"))


# -- the drainer killed inside a write -------------------------------------------------

SLOW_WRITER = """
    import sys
    import dftrace
    from dftrace import ai
    s = dftrace.initialize(log_file=sys.argv[1], writer="process", compression=sys.argv[3],
                           flush_interval=0.05, buffer_limit=400_000, shutdown_timeout=120)
    print(s.writer.drainer_pid, flush=True)
    for i in range(int(sys.argv[2])):
        with ai.compute.forward(args={"i": i}):
            pass
    print("recorded", flush=True)
    sys.stdin.readline()
    dftrace.finalize()
    print(*s.paths, flush=True)
"""


@pytest.mark.needs("fuse")
@pytest.mark.parametrize("compression", ["zstd", "gzip"])
def test_drainer_killed_inside_a_write_loses_and_duplicates_nothing(tmp_path, compression):
    """On slow storage (each write takes 0.2 s), SIGKILL to the drainer while one of
    its writes is under way: the process writes the rest of its trace itself, and
    between the drainer's file (cut back to its last whole frame written) and its
    own, every span is there exactly once."""
    n = 200_000
    with slow_storage(tmp_path, stdout=subprocess.PIPE) as (backing, mnt, fs):
        script = write_script(tmp_path, SLOW_WRITER)
        proc = start([script, str(mnt / "t"), str(n), compression])
        drainer = int(proc.stdout.readline())
        writes = 0
        while writes < 8:  # the header, then frames (a few requests each)
            assert fs.stdout.readline().strip() == "write"
            writes += 1
        os.kill(drainer, signal.SIGKILL)
        assert proc.stdout.readline().strip() == "recorded", proc.stderr.read()
        out, err = proc.communicate("\n", timeout=300)
    assert proc.returncode == 0, err
    assert err.count(f"the trace drainer (pid {drainer}) ended") == 1, err
    first, second = sorted(files(backing), key=len)
    assert out.split() == [str(mnt / os.path.relpath(second, backing))]
    assert_valid([first], complete=False)  # cut back to its last whole frame
    assert_valid([second])
    got = [e["args"]["i"] for path in (first, second)
           for e in spans(testing.read_events(path), "forward")]
    assert len(spans(testing.read_events(first), "forward")) > 0
    assert sorted(got) == list(range(n))


# -- hung storage never reaches the program ---------------------------------------------

WORKERS = """
    import multiprocessing as mp, os, sys
    import dftrace
    from dftrace import ai

    def work(name, q):
        for i in range(100):
            with ai.data.item(args={"w": name}):
                pass
        q.put(name)

    if __name__ == "__main__":
        dftrace.initialize(log_file=sys.argv[1], writer="process", shutdown_timeout=1)
        print("initialized", flush=True)
        done = []
        for method in ("fork", "spawn"):
            ctx = mp.get_context(method)
            q = ctx.Queue()
            procs = [ctx.Process(target=work, args=(f"{method}{k}", q)) for k in range(2)]
            for p in procs:
                p.start()
            done += [q.get() for _ in procs]
            for p in procs:
                p.join()
        print("workers", *sorted(done), flush=True)
"""


@pytest.mark.needs("fuse")
def test_hung_storage_never_holds_initialize_or_forked_and_spawned_workers(tmp_path):
    """Every request to the trace's mount hangs (the directory check, the file's
    creation, its writes): initialize() goes on after its directory check's
    deadline, forked workers start without touching the mount, spawned workers
    take the parent's check and start, work and end, and the program ends with its
    own status."""
    with fuse_dir(tmp_path, "_hung_fs.py", "all") as (mnt, _):
        script = write_script(tmp_path, WORKERS)
        proc = start([script, str(mnt / "sub" / "t")])
        try:
            out, err = proc.communicate(timeout=120)  # a hang never ends: the test fails
        except subprocess.TimeoutExpired:
            proc.kill()  # its stuck children may hold its pipes: not read
            pytest.fail("the program hung on the storage")
    assert proc.returncode == 0, err
    assert out.split("\n")[:2] == ["initialized", "workers fork0 fork1 spawn0 spawn1"], (out, err)
    # only initialize() waited for the directory: the workers took its answer
    assert err.count("did not answer within") == 1, err


# -- every drop counted -----------------------------------------------------------------

STOPPED_DRAINER = """
    import os, signal, sys, threading
    import dftrace
    from dftrace import ai
    s = dftrace.initialize(log_file=sys.argv[1], writer="process", on_full=sys.argv[2],
                           buffer_limit=8192, flush_interval=0.05)
    os.kill(s.writer.drainer_pid, signal.SIGSTOP)  # stuck without looking busy
    for i in range(int(sys.argv[3])):
        with ai.compute.forward(args={"i": i}):
            pass
    # finalize finds the ring full; the drainer goes on meanwhile
    threading.Timer(0.3, os.kill, (s.writer.drainer_pid, signal.SIGCONT)).start()
    dftrace.finalize()
"""


@pytest.mark.parametrize("on_full", ["drop", "block"])
def test_drops_under_a_full_ring_and_a_stopped_drainer_are_counted_exactly(tmp_path, on_full):
    """The drainer is stopped (SIGSTOP: not busy, not reading) while the process
    records far more than its ring holds: block mode gives up after the stall limit
    instead of waiting on every span, and the file counts exactly the spans it
    lacks (the count reaches the file although the ring is full when finalize
    writes its last lines)."""
    n = 60_000
    script = write_script(tmp_path, STOPPED_DRAINER)
    out = run([script, str(tmp_path / "t"), on_full, str(n)], timeout=600)
    assert out.returncode == 0, out.stderr
    path = wait_for_end(tmp_path)
    assert_valid([path])
    events = testing.read_events(path)
    written = len(spans(events, "forward"))
    dropped = sum(e["args"]["count"] for e in meta(events, "dropped")
                  if e["args"]["reason"] == "buffer full")
    assert 0 < written < n
    assert written + dropped == n
    # said on stderr as well, with the count the file has
    assert f"dftrace: {dropped} events were dropped, the buffer full (" in out.stderr, out.stderr


@pytest.mark.parametrize("limit", [1024, 3000])
def test_drop_mode_under_a_limit_smaller_than_a_slot_records_again_once_written(tmp_path, limit):
    """buffer_limit under a slot of the ring (4096 records), on_full="drop": a burst
    reaches it and what the drainer has not written by then is dropped, counted, but
    once the drainer wrote what was held the calls after it are recorded again (they
    were all dropped: the slot being filled, which the drainer may not free, held the
    limit for the rest of the run)."""
    script = write_script(tmp_path, """
        import sys, time
        import dftrace
        from dftrace import ai
        dftrace.initialize(log_file=sys.argv[1], writer="process", on_full="drop",
                           buffer_limit=int(sys.argv[2]))
        for i in range(20_000):  # a burst far beyond the limit
            with ai.compute.forward:
                pass
        time.sleep(1.5)  # the drainer writes at least once meanwhile
        for i in range(100):
            with ai.compute.backward(args={"i": i}):
                pass
        time.sleep(1.5)
        train = ai.pipeline.train.start()  # open at the end: written incomplete
    """)
    out = run([script, str(tmp_path / "t"), str(limit)])
    assert out.returncode == 0, out.stderr
    path = wait_for_end(tmp_path)
    assert_valid([path])
    events = testing.read_events(path)
    forwards = len(spans(events, "forward"))
    dropped = sum(e["args"]["count"] for e in meta(events, "dropped") if e["args"]["reason"] == "buffer full")
    assert limit <= forwards <= 20_000 and forwards + dropped == 20_000  # (a drainer keeping up drops none)
    assert [e["args"]["i"] for e in spans(events, "backward")] == list(range(100))
    [train] = spans(events, "train")
    assert train["args"]["incomplete"] is True


# -- fork() from C ----------------------------------------------------------------------

def test_a_child_forked_from_c_never_writes_into_the_parents_ring(tmp_path):
    """A child created by fork() from C (no Python at-fork hook runs) records spans:
    none reach the parent's ring, and the parent's file is valid and holds exactly
    the parent's spans."""
    script = write_script(tmp_path, """
        import ctypes, os, sys
        import dftrace
        from dftrace import ai
        dftrace.initialize(log_file=sys.argv[1], writer="process")
        for i in range(3000):
            with ai.compute.forward(args={"who": "parent"}):
                pass
        pid = ctypes.CDLL(None).fork()
        if pid == 0:
            for i in range(20000):
                with ai.compute.forward(args={"who": "child"}):
                    pass
            os._exit(0)
        os.waitpid(pid, 0)
        for i in range(3000):
            with ai.compute.forward(args={"who": "parent"}):
                pass
    """)
    out = run([script, str(tmp_path / "t")])
    assert out.returncode == 0, out.stderr
    (path,) = files(tmp_path)
    assert_valid([path])
    who = [e["args"]["who"] for e in spans(testing.read_events(path), "forward")]
    assert who == ["parent"] * 6000


# -- files carry their producer's umask --------------------------------------------------

def test_each_file_has_its_producers_umask(tmp_path):
    """Two processes of one job share a drainer, started by the first: each file is
    created with its own process's umask, not the drainer's."""
    for sub in ("open", "private"):
        os.makedirs(tmp_path / sub)
    drainers = _drainers_of_one_job(tmp_path, [[str(tmp_path / "open"), "022"],
                                               [str(tmp_path / "private"), "077"]])
    assert len(drainers) == 1
    (open_file,) = files(tmp_path / "open")
    (private_file,) = files(tmp_path / "private")
    assert os.stat(open_file).st_mode & 0o777 == 0o644
    assert os.stat(private_file).st_mode & 0o777 == 0o600


# -- records too long for one slot -------------------------------------------------------

def test_records_longer_than_a_slot_are_written_as_by_the_thread_writer(tmp_path):
    """Spans whose args take 300 kB and 2 MB (a slot's arena is 256 KiB), among short
    ones: the process writer writes them whole, in order, like the thread writer, and
    counts no drop."""
    script = write_script(tmp_path, """
        import sys
        import dftrace
        from dftrace import ai
        dftrace.initialize(log_file=sys.argv[1], writer=sys.argv[2], max_arg_length=1 << 20)
        for size in (100, 300_000, 1_000_000):
            with ai.compute.forward(args={"size": size, "a": "x" * size, "b": "y" * size}):
                pass
            for i in range(5000):
                with ai.compute.backward(args={"i": i}):
                    pass
    """)
    got = {}
    for writer in ("thread", "process"):
        out = run([script, str(tmp_path / writer / "t"), writer])
        assert out.returncode == 0, out.stderr
        (path,) = files(tmp_path / writer)
        assert_valid([path])
        events = testing.read_events(path)
        assert meta(events, "dropped") == []
        got[writer] = [(e["name"], e["args"].get("size"), len(e["args"].get("a", "")),
                        len(e["args"].get("b", ""))) for e in spans(events)]
    assert [g for g in got["process"] if g[0] == "forward"] == [
        ("forward", n, n, n) for n in (100, 300_000, 1_000_000)]
    assert got["process"] == got["thread"]


def test_a_line_in_pieces_is_read_only_once_whole():
    """A line longer than a slot is in the ring in pieces, one slot each: a reader
    that finds its last piece not yet committed reads nothing of it (and the records
    before it), and reads the whole line once it is."""
    sp = _engine.speedups
    mm = mmap.mmap(-1, sp.SHM_FIXED_BYTES + 6 * sp.SHM_SLOT_BYTES)
    try:
        sp.shm_attach(mm, os.getpid(), b"", b"", 0, 0)
        assert sp.shm_append_line(b'{"short":1}\n')
        line = b'{"long":"' + b"x" * 600_000 + b'"}\n'  # three slots
        assert sp.shm_append_line(line)
        sp.shm_finish()
        sp.shm_detach()
        last = sp.SHM_FIXED_BYTES + 3 * sp.SHM_SLOT_BYTES  # slot 0: the short line
        state, n = struct.unpack_from("<II", mm, last)
        assert (state, n) == (2, 1)  # FULL, one record: the last piece
        struct.pack_into("<II", mm, last, 1, 0)  # as while it is being written
        reader = sp.ShmReader(mm)
        assert reader.drain(100, b"", b"", 0, 0, True) == (b'{"short":1}\n', 1)
        assert reader.drain(100, b"", b"", 0, 0, True) == (b"", 0)
        struct.pack_into("<II", mm, last, 2, 1)  # committed
        assert reader.drain(100, b"", b"", 0, 0, True) == (line, 3)
        reader.close()
    finally:
        mm.close()


# -- slow is not stuck -------------------------------------------------------------------

SLOW_FINISH = """
    import sys
    import dftrace
    from dftrace import ai

    dftrace.initialize(log_file=sys.argv[1], writer=sys.argv[2], compression=sys.argv[3],
                       shutdown_timeout=1, flush_interval=600)

    @ai.compute.forward
    def forward(i):
        return i

    for i in range(int(sys.argv[4])):
        forward(i)
    dftrace.finalize()
"""


@pytest.mark.needs("fuse")
@pytest.mark.parametrize("writer", ["thread", "process"])
@pytest.mark.parametrize("compression", ["zstd", "gzip"])
def test_a_slow_finish_is_not_taken_for_stalled_storage(tmp_path, writer, compression):
    """Storage that answers every write after 0.2 s, and everything still buffered at
    finalize (about 12 frames, 2.4 s of writing) with shutdown_timeout=1: the writer
    makes progress all along, so finalize waits for it: every span on disk, the file
    closed, no warning of loss."""
    n = 200_000
    with slow_storage(tmp_path) as (backing, mnt, _):
        script = write_script(tmp_path, SLOW_FINISH)
        out = run([script, str(mnt / "t"), writer, compression, str(n)], timeout=300)
    assert out.returncode == 0, out.stderr
    assert "not finish" not in out.stderr and "not written" not in out.stderr, out.stderr
    (path,) = files(backing)
    assert_valid([path])
    assert len(spans(testing.read_events(path), "forward")) == n


@pytest.mark.parametrize("started", ["before", "during"])
def test_an_in_memory_trace_during_a_session_gets_what_the_drainer_writes(tmp_path, started):
    """A dftrace.trace_in_memory() running beside a process-writer session (started before
    initialize, or during the session) gets every span of its block, metadata too, and
    the drainer still writes every span to the file, once."""
    from dftrace._core.drain import process_writer as _shm

    @ai.compute.forward
    def forward(i):
        return i

    import warnings

    with contextlib.ExitStack() as stack:
        if started == "before":
            trace = stack.enter_context(dftrace.trace_in_memory())
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            s = dftrace.initialize(log_file=str(tmp_path / "t"), writer="process",
                                   compression="none", inherit=False, batch_size=1000)
        assert isinstance(s.writer, _shm.ProcessWriter), [str(w.message) for w in said]
        for i in range(100):
            forward(i)
        if started == "during":
            trace = stack.enter_context(dftrace.trace_in_memory())
        for i in range(20_000):  # many batches: handed on while the in-memory trace runs
            forward(i)
        worker = threading.Thread(target=forward, args=(-1,), name="memory-worker")
        worker.start()
        worker.join()
    for i in range(100):
        forward(i)
    dftrace.finalize()
    assert len(spans(trace.events, "forward")) == 20_001 + (100 if started == "before" else 0)
    assert "memory-worker" in {e["args"]["name"] for e in meta(trace.events, "thread_name")}
    events = testing.read_events(s.path)
    ids = [e["id"] for e in spans(events, "forward")]
    assert len(ids) == len(set(ids)) == 20_201
    names = {e["args"]["name"] for e in meta(events, "thread_name")}
    assert "memory-worker" in names
    assert_valid([s.path])
