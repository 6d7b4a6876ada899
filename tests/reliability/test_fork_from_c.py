"""A ``fork()`` made from C (an extension, a library's worker pool) while another
thread records: no Python at-fork hook runs in the child, and locks that a thread of
the parent held at that moment (the record buffer's, the writer's) stay held there
for good. The child never waits on them: it runs its Python code to its end and
exits. See docs/reliability.md, "Processes".

The fork is libc's, called through ``ctypes.PyDLL`` (the GIL held across it, as an
extension calling ``fork()`` holds it; ``ctypes.CDLL`` releases the GIL, and a child
forked so hangs on the GIL in any threaded program, traced or not). Even so, CPython's
own hand-over of the GIL would hang a child, traced or not: a thread that waited
``sys.getswitchinterval()`` (5 ms) for the GIL asks its holder to drop it, and a child
forked while that request is pending waits at its first bytecode for that thread,
which is not there. A loaded machine makes such a wait before a fork likely, so these
programs set a switch interval longer than the test, and every thread hands the GIL
over of its own accord (a sleep, a blocking call): no request is ever pending.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from ._util import WRITERS, clean_env, write_script

#: Forks from C FORKS times while a thread records spans; each child records a span
#: and ends (alternately through sys.exit, the normal end, and os._exit). Prints how
#: many children did not end within 10 s (killed then).
PROGRAM = """
    import ctypes, os, sys, threading, time
    import dftrace

    FORKS = int(sys.argv[2])
    sys.setswitchinterval(3600)  # no forced hand-over of the GIL (see above)
    dftrace.initialize(log_file=sys.argv[1], flush_interval=0.01, batch_size=64)
    stop = False

    def record():
        while not stop:
            with dftrace.ai.compute.forward:
                pass
            time.sleep(0.0001)  # hands the GIL over

    thread = threading.Thread(target=record, daemon=True)
    thread.start()
    fork = ctypes.PyDLL(None).fork
    hung = 0
    for i in range(FORKS):
        time.sleep(0.01)
        pid = fork()
        if pid == 0:
            with dftrace.ai.compute.backward:
                pass
            if i % 2:
                os._exit(0)
            sys.exit(0)
        deadline = time.monotonic() + 10
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                hung += 1
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                break
            time.sleep(0.005)
    stop = True
    thread.join()
    print(hung)
"""

#: (writer, environment): each writer, and the pure-Python engine.
ENGINES = [(w, {}) for w in WRITERS] + [("thread", {"DFTRACE_NO_SPEEDUPS": "1"})]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.parametrize("writer,extra", ENGINES,
                         ids=[f"{w}{'-pure' if e else ''}" for w, e in ENGINES])
def test_a_child_forked_from_c_while_a_thread_records_runs_to_its_end(tmp_path, writer, extra):
    """20 children forked from C while another thread records spans: every one ends."""
    prog = write_script(tmp_path, PROGRAM)
    proc = subprocess.Popen([sys.executable, prog, str(tmp_path / "t"), "20"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env(DFTRACE_WRITER=writer, **extra),
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=400)
    finally:
        try:  # stragglers (a child that hung and outlived its parent)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, err
    assert out.split() == ["0"], (out, err)


#: The writer's wake-up lock held by another thread at the fork (as the writer's own
#: thread holds it for a moment each time it wakes); the child then records more than
#: a batch, which wakes the writer. Prints "ended" or "hung".
LOCK_HELD = """
    import ctypes, os, sys, threading, time
    import dftrace

    sys.setswitchinterval(3600)  # no forced hand-over of the GIL (see above)
    session = dftrace.initialize(log_file=sys.argv[1], writer="thread", batch_size=64)
    held, release = threading.Event(), threading.Event()

    def hold():
        with session.writer._wake._cond:
            held.set()
            release.wait()

    threading.Thread(target=hold, daemon=True).start()
    held.wait()
    pid = ctypes.PyDLL(None).fork()
    if pid == 0:
        for _ in range(1000):
            with dftrace.ai.compute.backward:
                pass
        os._exit(0)
    release.set()
    deadline = time.monotonic() + 20
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            print("hung")
            break
        time.sleep(0.01)
    else:
        print("ended")
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.parametrize("extra", [{}, {"DFTRACE_NO_SPEEDUPS": "1"}], ids=["c", "pure"])
def test_a_child_forked_from_c_never_waits_on_a_lock_held_at_the_fork(tmp_path, extra):
    """The thread writer's wake-up lock held by another thread when C forks: the child
    records a thousand spans and ends all the same."""
    prog = write_script(tmp_path, LOCK_HELD)
    proc = subprocess.Popen([sys.executable, prog, str(tmp_path / "t")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=clean_env(**extra),
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, err
    assert out.split() == ["ended"], (out, err)
