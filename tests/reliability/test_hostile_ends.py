"""Ends that used to get in the way: a main thread blocked in C, stalled storage,
signals in quick succession, initialize() off the main thread. Each test runs a real
process (``_hostile.py``) and checks its exit status, how long it took to end, and
the file it left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from dftrace import testing

from _signals import default_signals

from ._util import HERE, assert_valid, clean_env, drainer_writes, files, last_line, spans

HOSTILE = os.path.join(HERE, "_hostile.py")
N = 20_000


def _start(scenario: str, out, n: int = N, untraced: bool = False) -> subprocess.Popen:
    args = [sys.executable, HOSTILE, scenario, str(out), str(n)]
    args += ["--untraced"] if untraced else []
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env(), start_new_session=True,
                            preexec_fn=default_signals)
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise AssertionError(f"{scenario}: {line!r} {proc.stderr.read()}")
    return proc


def _end(proc: subprocess.Popen, limit: float = 20.0) -> tuple[int, float, str, str]:
    """Wait for the process; (status, seconds it took, stdout, stderr). Killed past ``limit``."""
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"still running after {limit} s: {err}") from None
    return proc.returncode, time.monotonic() - t0, out, err


def _forward_count(out) -> int:
    (path,) = files(out)
    return len(spans(testing.read_events(path), "forward"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2])
@pytest.mark.parametrize("scenario", ["c-blocked", "init-thread-c-blocked"])
def test_signal_while_the_main_thread_is_blocked_in_c(tmp_path, scenario, sig):
    """The main thread is inside one C call that signals do not interrupt: a
    default-action signal still writes every event and the ']', and the process
    dies of that signal within seconds (untraced: at once). Also when initialize()
    ran on another thread."""
    untraced = _start("c-blocked", tmp_path / "plain", untraced=True)
    untraced.send_signal(sig)
    assert _end(untraced)[0] == -sig
    proc = _start(scenario, tmp_path)
    proc.send_signal(sig)
    code, took, _, err = _end(proc)
    assert code == -sig, err
    assert took < 10, took
    assert_valid(files(tmp_path))
    assert _forward_count(tmp_path) == N


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_signal_after_initialize_from_a_thread(tmp_path, sig):
    """initialize() on a thread: the main thread installs the handlers when it next
    runs Python code; SIGTERM and SIGUSR1 (default: terminate) keep every event."""
    proc = _start("init-thread", tmp_path)
    proc.send_signal(sig)
    code, took, _, err = _end(proc)
    assert code == -sig, err
    assert_valid(files(tmp_path))
    assert _forward_count(tmp_path) == N
    (epoch,) = spans(testing.read_events(files(tmp_path)[0]), "epoch")
    assert epoch["args"]["incomplete"] is True


@pytest.mark.parametrize("gap", [0.03, 0.1])
def test_two_ctrl_c_keep_every_event(tmp_path, gap):
    """Ctrl-C twice, 30 or 100 ms apart, while 300,000 events are buffered: the second one
    lands while the trace is being completed at exit. Every event and the ']' are
    written, and the program still ends as a KeyboardInterrupt does (SIGINT)."""
    n = 300_000
    proc = _start("two-ctrl-c", tmp_path, n)
    proc.send_signal(signal.SIGINT)
    time.sleep(gap)
    proc.send_signal(signal.SIGINT)
    code, _, _, err = _end(proc, 60)
    assert code == -signal.SIGINT, err
    assert "KeyboardInterrupt" in err
    assert_valid(files(tmp_path))
    assert _forward_count(tmp_path) == n


def test_app_handler_then_sighup_runs_both_in_order(tmp_path):
    """The application handles SIGTERM itself; SIGHUP (default action) follows 50 ms
    later, while dftrace is still writing 300,000 buffered events before calling
    the application's handler. No deadlock: the application's handler runs once,
    then the SIGHUP ends the process, with every event and the ']' on disk."""
    n = 300_000
    proc = _start("app-handler-then-sighup", tmp_path, n)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    proc.send_signal(signal.SIGHUP)
    code, took, out, err = _end(proc, 60)
    assert code == -signal.SIGHUP, err
    assert out.split("\n").count(f"app handler {int(signal.SIGTERM)}") == 1, out
    assert_valid(files(tmp_path))
    assert _forward_count(tmp_path) == n


def test_stalled_storage_does_not_hold_the_exit(tmp_path):
    """The trace file is a FIFO whose reader never reads (storage that hangs): the
    program still ends within shutdown_timeout (1 s here) with its own exit status,
    and one warning says so: a drainer writes the rest when it can; the writer
    thread abandons the file and counts the events not written."""
    proc = _start("fifo-reader-exit", tmp_path)
    got, took, _, err = _end(proc)
    assert got == 3, err
    assert took < 8, took
    assert err.count("dftrace:") == 1, err
    assert "shutdown_timeout=1 s" in err
    if drainer_writes():
        assert "it writes the rest when it can" in err
    else:
        assert "events were not written" in err
        lost = int(err.split("abandoned and ")[1].split()[0])
        assert 0 < lost < N + 10  # a reader that never reads took 64 KiB


def test_a_fifo_without_a_reader_is_passed_over(tmp_path):
    """The trace file's name is a FIFO nobody has open (opening it for writing
    would block): the trace goes to the next free name, complete."""
    proc = _start("fifo-noreader-exit", tmp_path)
    got, _, _, err = _end(proc)
    assert got == 3, err
    assert "dftrace:" not in err, err
    (path,) = files(tmp_path)
    assert path.endswith(".1.pfw.zst")
    assert_valid([path])
    assert _forward_count(tmp_path) == N


def test_stalled_storage_does_not_hold_sigterm(tmp_path):
    """SIGTERM to a process whose trace storage hangs: it dies of SIGTERM in time."""
    proc = _start("fifo-reader", tmp_path)
    proc.send_signal(signal.SIGTERM)
    code, took, _, err = _end(proc)
    assert code == -signal.SIGTERM, err
    assert took < 8, took


def test_spans_of_atexit_hooks_registered_before_initialize_are_written(tmp_path):
    """An atexit hook registered after ``import dftrace`` but before initialize()
    runs before the trace is completed: its span is in the file."""
    out = subprocess.run([sys.executable, HOSTILE, "atexit-before-init", str(tmp_path), "10"],
                         capture_output=True, text=True, env=clean_env(), timeout=60,
                         preexec_fn=default_signals)
    assert out.returncode == 0, out.stderr
    assert_valid(files(tmp_path))
    (path,) = files(tmp_path)
    late = [e for e in spans(testing.read_events(path), "forward") if e["args"].get("late")]
    assert len(late) == 1
    assert last_line(path) == b"]"


def test_an_application_wakeup_fd_keeps_receiving_signals(tmp_path):
    """The application set a signal wakeup fd before initialize(): every signal
    still reaches it (dftrace passes the bytes on), its handler still runs, and
    finalize() puts its wakeup fd back."""
    import dftrace

    r, w = os.pipe()
    os.set_blocking(w, False)
    os.set_blocking(r, False)
    got: list[int] = []
    old_handler = signal.signal(signal.SIGUSR2, lambda signum, frame: got.append(signum))
    old_fd = signal.set_wakeup_fd(w)
    try:
        dftrace.initialize(log_file=str(tmp_path / "t"), inherit=False)
        os.kill(os.getpid(), signal.SIGUSR2)
        data = b""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not data:
            time.sleep(0.01)
            try:
                data = os.read(r, 64)
            except BlockingIOError:
                pass
        assert got == [signal.SIGUSR2]
        # initialize() checks the trace directory in a short-lived child: where the
        # application handles SIGCHLD, that child's end reaches its wakeup fd too.
        assert data.replace(bytes([signal.SIGCHLD]), b"") == bytes([signal.SIGUSR2])
        dftrace.finalize()
        assert signal.set_wakeup_fd(-1) == w
    finally:
        signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGUSR2, old_handler)
        os.close(r)
        os.close(w)


#: Decorated calls in a tight loop until Ctrl-C (for 5 s at most, then exit status 7).
DECORATED_LOOP = """
import sys, time
import dftrace
from dftrace import ai
dftrace.initialize(log_file=sys.argv[1])

@ai.compute.forward
def forward():
    pass

print("ready", flush=True)
end = time.monotonic() + 5
while time.monotonic() < end:
    forward()
sys.exit(7)
"""


def test_ctrl_c_in_a_loop_of_decorated_calls_always_interrupts_it(tmp_path):
    """Ctrl-C in a tight loop of decorated calls ends the program by KeyboardInterrupt,
    every time. With the default writer, the handler's KeyboardInterrupt raised while
    a span woke the writer (Python called from C) was swallowed, and the loop ran on to
    its end (4 of 16 runs)."""
    statuses = []
    for k in range(8):
        proc = subprocess.Popen([sys.executable, "-c", DECORATED_LOOP, str(tmp_path / str(k) / "t")],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
                                preexec_fn=default_signals)
        line = proc.stdout.readline()
        assert line.strip() == "ready", proc.stderr.read()
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        statuses.append(proc.returncode)
    assert statuses == [-signal.SIGINT] * 8
