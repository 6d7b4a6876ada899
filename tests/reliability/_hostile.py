"""A traced program in a hostile situation (run as a script by test_hostile_ends.py
and _measure_ends.py).

``python _hostile.py SCENARIO OUT_DIR [N]``: records N ``forward`` spans (default
20,000) with a long flush interval, so that they are all still buffered when the
program ends unless the scenario says otherwise, then does what SCENARIO says.
It prints ``ready`` when a parent may send it signals. Without ``--untraced`` it
traces; with it (as the last argument) it does the same without dftrace, to show
how the program ends untraced.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import socket
import sys
import threading
import time

UNTRACED = sys.argv[-1] == "--untraced"
if UNTRACED:
    sys.argv.pop()
SCENARIO, OUT = sys.argv[1], sys.argv[2]
N = int(sys.argv[3]) if len(sys.argv) > 3 else 20_000


def ready() -> None:
    print("ready", flush=True)


def block_in_c() -> None:
    """Block the main thread inside one C call that signals do not interrupt (as a
    collective that never completes does): pthread_join on a C thread that waits in
    pause() forever with every signal blocked (so no signal ends its wait)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.pthread_create.argtypes = (ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p,
                                    ctypes.c_void_p, ctypes.c_void_p)
    libc.pthread_join.argtypes = (ctypes.c_ulong, ctypes.c_void_p)
    tid = ctypes.c_ulong()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    pause = ctypes.cast(libc.pause, ctypes.c_void_p)
    err = libc.pthread_create(ctypes.byref(tid), None, pause, None)
    signal.pthread_sigmask(signal.SIG_SETMASK, old)
    assert err == 0, err
    ready()
    err = libc.pthread_join(tid, None)
    print("pthread_join returned", err, flush=True)
    sys.exit(99)


def expected_base(prefix: str) -> str:
    from dftrace._core.session import _safe_host

    return f"{prefix}-{_safe_host(socket.gethostname())}-{os.getpid()}"


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    prefix = os.path.join(OUT, "t")
    options = {"log_file": prefix, "flush_interval": 60, "inherit": False,
               "shutdown_timeout": 1.0}
    if SCENARIO.startswith("fifo"):
        # Storage that stalls: the trace file's name is a FIFO (written into, never
        # created over); with a reader that never reads, writes block once the
        # pipe's 64 KiB are full; with no reader at all, opening it blocks.
        os.mkfifo(expected_base(prefix) + ".pfw.zst")
        if SCENARIO.startswith("fifo-reader"):
            reader = os.open(expected_base(prefix) + ".pfw.zst", os.O_RDONLY | os.O_NONBLOCK)
            try:  # the smallest pipe (one page): the writes stall at once, whatever the size
                import fcntl

                fcntl.fcntl(reader, getattr(fcntl, "F_SETPIPE_SZ", 1031), 4096)
            except OSError:
                pass
        options["flush_interval"] = 0.05
    if SCENARIO == "app-handler-then-sighup":
        def on_term(signum, frame):
            print("app handler", signum, flush=True)

        signal.signal(signal.SIGTERM, on_term)

    if UNTRACED:
        def forward(i):
            return i
        epoch = None
    else:
        import dftrace
        from dftrace import ai

        if SCENARIO == "atexit-before-init":
            def late_hook():
                with ai.compute.forward(args={"late": True}):
                    pass
            atexit.register(late_hook)
        if SCENARIO.startswith("init-thread"):
            t = threading.Thread(target=dftrace.initialize, kwargs=options)
            t.start()
            t.join()
        else:
            dftrace.initialize(**options)
        forward = ai.compute.forward(lambda i: i)
        epoch = ai.pipeline.epoch

    for i in range(N):
        forward(i)

    if SCENARIO in ("c-blocked", "init-thread-c-blocked"):
        block_in_c()
    elif SCENARIO in ("sleep", "init-thread", "two-ctrl-c", "app-handler-then-sighup"):
        if epoch is not None:
            epoch.start()
        ready()
        time.sleep(60)
    elif SCENARIO.startswith("fifo"):
        time.sleep(0.5)  # the writer is stuck by now
        ready()
        if SCENARIO.endswith("-exit"):
            sys.exit(3)
        time.sleep(60)
    elif SCENARIO == "atexit-before-init":
        pass
    else:
        raise SystemExit(f"unknown scenario {SCENARIO}")


if __name__ == "__main__":
    main()
