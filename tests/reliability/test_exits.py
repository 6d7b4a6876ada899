"""Every way a traced program can end: what is on disk, and the exit status it had anyway."""

from __future__ import annotations

import os
import signal

import pytest
from _requirements import native_engine_missing, needs, needs_marks

from dftrace import testing
from dftrace._core import signals as _signals

from ._ends import N, OPEN
from ._util import HERE, assert_valid, drainer_writes, files, last_line, meta, run, spans, start, wait_for_end, \
    write_script

ENDS = os.path.join(HERE, "_ends.py")


def _events(out) -> list[dict]:
    (path,) = files(out)
    return testing.read_events(path)


@pytest.mark.parametrize("mode,code,stderr", [
    ("return", 0, ""),
    ("sys-exit", 7, ""),
    ("raise", 1, "RuntimeError: boom"),
])
def test_exit_without_finalize_writes_every_event(tmp_path, mode, code, stderr):
    """Normal end, sys.exit(n) and an uncaught exception: the file is complete, the status unchanged."""
    out = run([ENDS, mode, str(tmp_path)])
    assert out.returncode == code, out.stderr
    assert stderr in out.stderr
    assert "dftrace:" not in out.stderr  # no warning of ours
    assert_valid(files(tmp_path))
    assert [e["args"]["level"] for e in spans(_events(tmp_path), "forward")] == [1] * N
    # How it ended, where it did not end well: the exception nothing caught.
    ends = [e["args"]["how"] for e in _events(tmp_path) if e.get("name") == "process_end"]
    assert ends == (["raised RuntimeError: boom"] if mode == "raise" else [])


def test_run_says_the_program_raised(tmp_path):
    """``dftrace run`` of a script that raises: its status and traceback as untraced,
    and its trace says it raised (the summary's "ended abnormally")."""
    script = tmp_path / "crash.py"
    script.write_text("from dftrace import ai\nwith ai.compute.forward:\n    pass\n"
                      "raise ValueError('bad batch in step 5')\n")
    out = run(["-m", "dftrace", "run", "--log-file", str(tmp_path / "trace" / "run"), str(script)])
    assert out.returncode == 1 and "ValueError: bad batch in step 5" in out.stderr
    ends = [e["args"]["how"] for e in _events(tmp_path / "trace") if e.get("name") == "process_end"]
    assert ends == ["raised ValueError: bad batch in step 5"]
    # And one that exits with a status of its own says that.
    script.write_text("import sys\nfrom dftrace import ai\nwith ai.compute.forward:\n    pass\nsys.exit(3)\n")
    out = run(["-m", "dftrace", "run", "--log-file", str(tmp_path / "exit" / "run"), str(script)])
    assert out.returncode == 3
    ends = [e["args"]["how"] for e in _events(tmp_path / "exit") if e.get("name") == "process_end"]
    assert ends == ["exited with status 3"]


def _signal_run(tmp_path, mode: str, sig: int):
    proc = start([ENDS, mode, str(tmp_path)])
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


@pytest.mark.parametrize("mode,sig", [
    ("sigterm", signal.SIGTERM),
    ("sighup", signal.SIGHUP),
])
def test_fatal_signal_completes_the_file_and_still_kills(tmp_path, mode, sig):
    """SIGTERM/SIGHUP: every event, the open span marked incomplete, ']'; still killed by the signal."""
    code, err = _signal_run(tmp_path, mode, sig)
    assert code == -sig, err
    assert_valid(files(tmp_path))
    events = _events(tmp_path)
    assert [e["args"]["how"] for e in events if e.get("name") == "process_end"] == [f"killed by signal {sig}"]
    assert len(spans(events, "forward")) == N
    (epoch,) = spans(events, "epoch")
    assert epoch["args"]["incomplete"] is True


@pytest.mark.parametrize("mode", ["sigterm-in-loops", "raise-in-loops"])
def test_loops_open_at_the_end_are_written_incomplete(tmp_path, mode):
    """A SIGTERM or an exception inside two .iter() loops: the loop bodies it caught
    open (epoch 1, batch 2) are in the file, flagged incomplete, nested in the span
    that enclosed them and ending with it; the status is what it would be untraced."""
    if mode == "sigterm-in-loops":
        code, err = _signal_run(tmp_path, mode, signal.SIGTERM)
        assert code == -signal.SIGTERM, err
    else:
        out = run([ENDS, mode, str(tmp_path)])
        assert out.returncode == 1 and "RuntimeError: boom" in out.stderr, out.stderr
    assert_valid(files(tmp_path))  # nesting included
    events = _events(tmp_path)
    (train,) = spans(events, "train")
    if mode == "sigterm-in-loops":
        assert train["args"]["incomplete"] is True
    else:
        assert train["args"]["error"] == "RuntimeError"
    # The loop bodies the end caught: epoch 1 (the second) and its third batch.
    last_epoch, last_fetch = spans(events, "epoch.block")[-1], spans(events, "fetch.block")[-1]
    assert (last_epoch["args"]["count"], last_fetch["args"]["count"]) == (2, 3)
    assert len(spans(events, "epoch.block")) == 2 and len(spans(events, "fetch.block")) == 4 + 3
    end = train["ts"] + train["dur"]
    if mode == "sigterm-in-loops":  # the loops' generators were suspended: ended with train
        assert last_epoch["args"]["incomplete"] is True and last_fetch["args"]["incomplete"] is True
        assert last_epoch["ts"] + last_epoch["dur"] == end == last_fetch["ts"] + last_fetch["dur"]
    else:  # the exception left the loops, which ended their bodies then
        assert last_fetch["ts"] + last_fetch["dur"] <= last_epoch["ts"] + last_epoch["dur"] <= end


def test_calls_running_at_sigterm_are_written_incomplete(tmp_path):
    """SIGTERM inside train > a decorated call, with another decorated call running on
    a thread: with the default writer all three are in the file, incomplete (the ring's
    open-span table keeps every span the C engine opens), the signalled thread's two
    ending together; with the writer thread, both calls are counted late."""
    code, err = _signal_run(tmp_path, "sigterm-in-calls", signal.SIGTERM)
    assert code == -signal.SIGTERM, err
    assert_valid(files(tmp_path))  # nesting included
    events = _events(tmp_path)
    (train,) = spans(events, "train")
    assert train["args"]["incomplete"] is True
    running = [e for e in spans(events, "forward") + spans(events, "preprocess")
               if e["args"].get("incomplete")]
    late = [e["args"]["count"] for e in meta(events, "dropped") if e["args"]["reason"] == "late"]
    if drainer_writes():
        forward, preprocess = running
        assert (forward["name"], preprocess["name"]) == ("forward", "preprocess")
        assert forward["args"]["p_idx"] == train["id"] and preprocess["tid"] != train["tid"]
        assert forward["ts"] + forward["dur"] == train["ts"] + train["dur"]
        assert late == []
        assert len(spans(events, "forward")) == N + 1
    else:
        assert running == [] and late == [2]
        assert len(spans(events, "forward")) == N


def test_call_running_alone_at_sigterm_is_written_or_counted(tmp_path):
    """SIGTERM inside train > a decorated call, no other thread: the call is written
    incomplete, ending with train (default writer), or counted late. Before, both
    writers lost it without a word (the default one wrote its open spans only when
    another thread had one open too)."""
    code, err = _signal_run(tmp_path, "sigterm-in-a-call", signal.SIGTERM)
    assert code == -signal.SIGTERM, err
    assert_valid(files(tmp_path))
    events = _events(tmp_path)
    (train,) = spans(events, "train")
    assert train["args"]["incomplete"] is True
    running = [e for e in spans(events, "forward") if e["args"].get("incomplete")]
    late = [e["args"]["count"] for e in meta(events, "dropped") if e["args"]["reason"] == "late"]
    if drainer_writes():
        (forward,) = running
        assert forward["args"]["p_idx"] == train["id"]
        assert forward["ts"] + forward["dur"] == train["ts"] + train["dur"]
        assert late == []
    else:
        assert running == [] and late == [1]
    assert len(spans(events, "forward")) == N + len(running)


def test_sigint_raises_keyboard_interrupt_and_completes_the_file(tmp_path):
    """SIGINT: KeyboardInterrupt unwinds as usual, the open span ends, the file is complete."""
    code, err = _signal_run(tmp_path, "sigint", signal.SIGINT)
    assert code == -signal.SIGINT, err
    assert "KeyboardInterrupt" in err
    assert_valid(files(tmp_path))
    events = _events(tmp_path)
    assert len(spans(events, "forward")) == N
    (epoch,) = spans(events, "epoch")
    assert "incomplete" not in epoch["args"]


def test_application_sigterm_handler_runs_and_decides_the_exit(tmp_path):
    """An application's SIGTERM handler still runs; its sys.exit(3) is the exit status."""
    code, err = _signal_run(tmp_path, "app-handler-exit", signal.SIGTERM)
    assert code == 3, err
    assert (tmp_path / "handler-ran").read_text() == str(int(signal.SIGTERM))
    assert_valid(files(tmp_path))
    assert len(spans(_events(tmp_path), "forward")) == N


def test_application_sigterm_handler_may_carry_on(tmp_path):
    """A handler that only sets a flag keeps the run (and tracing) going."""
    code, err = _signal_run(tmp_path, "app-handler-continue", signal.SIGTERM)
    assert code == 0, err
    assert (tmp_path / "handler-ran").exists()
    assert_valid(files(tmp_path))
    events = _events(tmp_path)
    assert len(spans(events, "forward")) == N
    assert len(spans(events, "step")) == 1  # recorded after the signal


def test_os_exit_keeps_everything_flushed_before_it(tmp_path):
    """os._exit: the file decodes and has every event up to the last flush; a drainer
    then writes the rest and ends the file saying how the process ended, the writer
    thread leaves it without its ']'."""
    out = run([ENDS, "os-exit", str(tmp_path)])
    assert out.returncode == 5, out.stderr
    if drainer_writes():
        path = wait_for_end(tmp_path)
        assert_valid([path])
        events = testing.read_events(path)
        assert len(spans(events, "backward")) == 5
        (end,) = meta(events, "process_end")
        assert end["args"]["exit_status"] == 5
    else:
        assert_valid(files(tmp_path), complete=False)
        assert last_line(files(tmp_path)[0]) != b"]"
    assert len(spans(_events(tmp_path), "forward")) == N


def test_sigkill_keeps_everything_flushed_before_it(tmp_path):
    """SIGKILL: the file decodes and has every event flushed before the kill."""
    proc = start([ENDS, "sigkill", str(tmp_path)])
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert_valid(files(tmp_path), complete=False)
    assert len(spans(_events(tmp_path), "forward")) == N


def test_no_signal_handler_is_installed_at_import(tmp_path):
    """Importing dftrace (tracing not requested) leaves every signal handler alone."""
    out = run(["-c", "import signal; before = [signal.getsignal(s) for s in signal.Signals]\n"
                     "import dftrace\n"
                     "assert before == [signal.getsignal(s) for s in signal.Signals]\n"
                     "print('same')"])
    assert out.stdout.strip() == "same", out.stderr


def test_a_program_that_closes_every_fd_gets_no_signal_byte_in_its_files(tmp_path):
    """A daemon-like program closes every fd it did not open (``closerange``), opens
    files, gets signals: its files hold what it wrote, none of the bytes Python's
    handler writes to dftrace's signal wakeup fd, and none is closed under it."""
    code = (f"import os, signal, time, dftrace\n"
            f"dftrace.initialize(log_file={str(tmp_path / 't')!r})\n"
            "signal.signal(signal.SIGUSR1, lambda s, f: None)\n"
            "os.closerange(3, 4096)\n"
            f"files = [open(os.path.join({str(tmp_path)!r}, f'u{{i}}.bin'), 'wb', buffering=0) for i in range(8)]\n"
            "for f in files: f.write(b'USERDATA')\n"
            "for _ in range(3):\n"
            "    os.kill(os.getpid(), signal.SIGUSR1)\n"
            "    time.sleep(0.05)\n"
            "for f in files: f.write(b'END')\n"
            "print('done')\n")
    out = run(["-c", code])
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr
    assert [(tmp_path / f"u{i}.bin").read_bytes() for i in range(8)] == [b"USERDATAEND"] * 8


def test_handlers_are_installed_by_initialize_and_restored_by_finalize(tmp_path):
    """initialize() takes over SIGTERM (chaining to what was there); finalize() puts it back."""
    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    sigint_before = signal.getsignal(signal.SIGINT)
    try:
        with testing.trace_to(tmp_path):
            assert _signals.installed()[signal.SIGTERM] is mine
            assert signal.getsignal(signal.SIGINT) is sigint_before  # Python's own, kept
        assert signal.getsignal(signal.SIGTERM) is mine
        assert _signals.installed() == {}
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_ignored_signal_stays_ignored(tmp_path):
    """A signal the application ignores is not taken over."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with testing.trace_to(tmp_path):
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="the OS tells no caught signals")
def test_a_handler_installed_in_c_is_left_alone(tmp_path):
    """faulthandler.register(SIGUSR1) before initialize: SIGUSR1 still prints the stacks
    and the run goes on (Python reports such a handler as the default one)."""
    from ._util import write_script

    script = write_script(tmp_path, """
        import faulthandler
        import os
        import signal
        import sys

        import dftrace
        from dftrace import ai

        faulthandler.register(signal.SIGUSR1, all_threads=True)
        dftrace.initialize(log_file=sys.argv[1] + "/t")
        for i in range(3):
            with ai.compute.forward:
                if i == 1:
                    os.kill(os.getpid(), signal.SIGUSR1)
        dftrace.finalize()
        print("carried on")
    """)
    out = run([script, str(tmp_path)])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "carried on"
    assert "most recent call first" in out.stderr
    assert_valid(files(tmp_path))
    assert len(spans(_events(tmp_path), "forward")) == 3


def _assert_cut_only(res: dict) -> None:
    # A kill during a write may leave half a frame at the end: readers skip it.
    assert all("cut off" in p for p in res["problems"]), res["problems"]
    assert len(res["problems"]) <= 1
    assert res["contiguous"], "the spans kept are not the first ones recorded"


def killed_with_spans_open(out) -> str:
    """The file of a run killed (SIGKILL) inside train > epoch 1 > batch 2 > a
    decorated call, with a start() open on another thread, once the drainer ended it."""
    proc = start([ENDS, "sigkill-open", str(out)], DFTRACE_WRITER="process")
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    return wait_for_end(out)


@needs("native", native_engine_missing())
def test_spans_open_at_sigkill_are_written_incomplete(tmp_path):
    """kill -9 inside train > epoch 1 > batch 2 > a decorated call, with a start() open
    on another thread: the drainer writes the five spans open at the kill, flagged
    incomplete, nested as they were, ending together; the loop bodies keep their
    counts; every span that ended is there once."""
    path = killed_with_spans_open(tmp_path)
    assert_valid([path])  # ids unique, parents open around their children
    events = testing.read_events(path)
    open_at_kill = [e for e in testing.spans(events) if e["args"].get("incomplete")]
    assert sorted(e["name"] for e in open_at_kill) == [
        "epoch.block", "fetch.block", "forward", "item", "train"]
    by_name = {e["name"]: e for e in open_at_kill}
    train, epoch, fetch, forward, item = (by_name[n] for n in (
        "train", "epoch.block", "fetch.block", "forward", "item"))
    assert (epoch["args"]["count"], fetch["args"]["count"]) == (2, 3)
    assert forward["args"]["p_idx"] == fetch["id"]
    assert fetch["args"]["p_idx"] == epoch["id"] and epoch["args"]["p_idx"] == train["id"]
    assert item["tid"] != train["tid"]
    assert len({e["ts"] + e["dur"] for e in open_at_kill}) == 1  # they end together
    # each span once: N + 1 forwards, 4 + 3 batches fetched and their bodies, 2 epochs
    assert len(spans(events, "forward")) == N + 1
    assert len(spans(events, "fetch.iter")) == 4 + 3 == len(spans(events, "fetch.block"))
    assert len(spans(events, "epoch.iter")) == 2 == len(spans(events, "epoch.block"))
    (end,) = meta(events, "process_end")
    assert end["args"]["how"] == "killed by signal 9"
    assert "open_spans_not_kept" not in end["args"]


@needs("native", native_engine_missing())
def test_spans_open_at_sigkill_beyond_the_table_are_counted(tmp_path):
    """kill -9 with 5,000 start()s open, more than the open-span table holds: those it
    held are written incomplete, the rest counted in process_end, together all 5,000."""
    proc = start([ENDS, "sigkill-many-open", str(tmp_path)], DFTRACE_WRITER="process")
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    proc.kill()
    proc.communicate(timeout=60)
    path = wait_for_end(tmp_path)
    events = testing.read_events(path)
    written = spans(events, "item")
    assert all(e["args"]["incomplete"] for e in written)
    (end,) = meta(events, "process_end")
    assert 0 < len(written) < OPEN
    assert len(written) + end["args"]["open_spans_not_kept"] == OPEN


@pytest.mark.parametrize("rate", [10_000, 0])
def test_sigkill_loses_at_most_about_one_flush_interval(tmp_path, rate):
    """kill -9 while emitting (steady, or faster than the writer): with the writer
    thread, only the last interval is lost."""
    from ._kill9 import kill_after

    interval = 0.2
    res = kill_after(str(tmp_path), 0.6, interval, rate, writer="thread")
    assert res["returncode"] == -signal.SIGKILL
    _assert_cut_only(res)
    assert res["kept"] > 0
    # Lost spans all ended in the last flush interval before the kill, plus the time
    # the writer takes for one frame: short at a steady rate, longer when the
    # producer outruns it (margins for a loaded machine; figures in docs/reliability.md).
    assert res["lost_window_s"] < interval + (0.5 if rate else 1.5), res


@needs("native", native_engine_missing())
@pytest.mark.parametrize("rate", [10_000, 0])
def test_sigkill_with_the_default_writer_loses_nothing_that_ended(tmp_path, rate):
    """kill -9 while emitting, no writer setting (the drainer process, where it can be
    had): every span that ended before the kill is in the file, which the drainer
    completes; its end says the process was killed."""
    from ._kill9 import kill_after

    res = kill_after(str(tmp_path), 0.25, 0.2, rate)
    assert res["drainer"]
    assert res["returncode"] == -signal.SIGKILL
    assert not res["problems"]
    assert res["contiguous"]
    assert res["emitted"] > 0 and res["kept"] in (res["emitted"], res["emitted"] + 1), res
    (path,) = files(tmp_path)
    (end,) = meta(testing.read_events(path), "process_end")
    assert end["args"]["how"] == "killed by signal 9"


def test_sigterm_during_finalize_lets_it_finish_then_dies(tmp_path):
    """A SIGTERM arriving while finalize() writes waits for the ']' and then kills as usual."""
    from ._util import write_script

    script = write_script(tmp_path, """
        import os
        import signal
        import sys

        import dftrace
        from dftrace import ai
        from dftrace._core import buffer as _buffer

        # The writer thread: its last flush is where the signal arrives.
        dftrace.initialize(log_file=sys.argv[1] + "/t", compression="zstd", flush_interval=60,
                           writer="thread")
        for i in range(100):
            with ai.compute.forward:
                pass
        armed = [True]

        def during_flush(data):  # runs inside finalize's last flush
            if armed:
                armed.clear()
                os.kill(os.getpid(), signal.SIGTERM)

        _buffer.set_tap(during_flush)
        dftrace.finalize()
        print("survived the signal")
    """)
    out = run([script, str(tmp_path / "traces")])
    assert out.returncode == -signal.SIGTERM, out.stderr
    assert "survived" not in out.stdout
    assert_valid(files(tmp_path / "traces"))
    assert len(spans(testing.read_events(files(tmp_path / "traces")[0]), "forward")) == 100


SUSPENDED_GENERATOR = """
    import os, signal, sys
    import dftrace
    from dftrace import ai
    dftrace.initialize(log_file=sys.argv[1])

    @ai.data.preprocess
    def batches():
        for i in range(10**9):
            yield i

    @ai.pipeline.train
    def train():
        for b in batches():  # never ends: the generator is suspended at the end
            with ai.compute.forward(args={"b": b}):
                if b == 100:
                    if sys.argv[2] == "exit":
                        sys.exit(3)
                    print("ready", flush=True)
                    os.kill(os.getpid(), getattr(signal, sys.argv[2]))
                    signal.pause()

    held = batches()
    next(held)  # a second one, held by the program at its exit
    train()
"""


@pytest.mark.parametrize("end,writer", [
    ("exit", "process"), ("exit", "thread"), ("SIGTERM", "process"), ("SIGTERM", "thread"),
    pytest.param("SIGKILL", "process", marks=needs_marks("native", native_engine_missing())),
])
def test_a_decorated_generator_suspended_at_the_end_is_written_incomplete(tmp_path, end, writer):
    """Decorated generators never finished: one suspended in the loop a signal ends,
    one held by the program at its exit. Each span is written, flagged incomplete,
    where both were lost without a count (a loop that sys.exit() leaves closes its
    generator: that span ends then)."""
    script = write_script(tmp_path, SUSPENDED_GENERATOR)
    out = run([script, str(tmp_path / "t"), end], DFTRACE_WRITER=writer)
    assert out.returncode == {"exit": 3, "SIGTERM": -signal.SIGTERM, "SIGKILL": -signal.SIGKILL}[end], out.stderr
    events = testing.read_events(wait_for_end(tmp_path))
    assert len(spans(events, "forward")) == 101
    generators = spans(events, "preprocess")
    assert len(generators) == 2, generators
    assert len([e for e in generators if e["args"].get("incomplete")]) == (1 if end == "exit" else 2)
    # The decorated call the signal ends is written, or (the writer thread) counted as late.
    late = sum(e["args"]["count"] for e in meta(events, "dropped") if e["args"]["reason"] == "late")
    assert len(spans(events, "train")) + late == 1
