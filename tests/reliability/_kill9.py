"""Kill -9 a process that traces continuously and count what survived.

As a script with arguments ``emit OUT_DIR FLUSH_INTERVAL RATE [WRITER]`` it is the
victim: it records ``forward`` spans at about RATE per second (0: as fast as it can)
and, after each span, stores how many spans have ended in ``OUT_DIR/count`` (a shared
memory map, so the number is exact at the moment of the kill). Without WRITER (or
with an empty one) it leaves ``writer`` to its default.

Run without arguments it is the measurement quoted in docs/reliability.md (the
writer thread, then the default writer)::

    python tests/reliability/_kill9.py [RUNS]
"""

from __future__ import annotations

import mmap
import os
import signal
import struct
import subprocess
import sys
import time


def emit(out: str, flush_interval: float, rate: float, writer: str = "") -> None:
    import ctypes
    import faulthandler

    import dftrace
    from dftrace import ai

    with open(os.path.join(out, "count"), "r+b") as fh:
        counter = mmap.mmap(fh.fileno(), 8)
    # One aligned 8-byte store per update: struct.pack_into would first zero the
    # field, and a SIGKILL between its two stores would leave 0 in the file.
    ended = ctypes.c_int64.from_buffer(counter)
    dftrace.initialize(log_file=os.path.join(out, "t"), compression="zstd",
                       flush_interval=flush_interval, writer=writer or None)
    # A test that sees no progress asks for every thread's stack (on stderr).
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    node = ai.compute.forward
    n = 0
    chunk = max(1, int(rate / 100)) if rate else 1000
    print("ready", flush=True)
    while True:
        t0 = time.perf_counter()
        for _ in range(chunk):
            with node:
                pass
            n += 1
            ended.value = n
        if rate:  # about 100 chunks a second
            left = 0.01 - (time.perf_counter() - t0)
            if left > 0:
                time.sleep(left)


def kill_after(out: str, seconds: float, flush_interval: float, rate: float,
               writer: str = "") -> dict:
    """Start a victim (``writer``: as it sets it, "" for the default), SIGKILL it after
    ``seconds``, and count what its file kept (once a drainer has ended the file, when
    the victim had one)."""
    from dftrace import testing
    from dftrace.format import iter_trace_lines

    if __package__:
        from ._util import last_line
    else:  # run as a script
        from _util import last_line

    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "count"), "wb") as fh:
        fh.write(b"\0" * 8)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACE_")}
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "emit", out,
                             str(flush_interval), str(rate), writer],
                            stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    time.sleep(seconds)
    killed_at_us = time.time_ns() // 1000
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with open(os.path.join(out, "count"), "rb") as fh:
        emitted = struct.unpack("q", fh.read(8))[0]
    drainer = writer != "thread" and _has_drainer()
    deadline = time.monotonic() + 30
    while drainer and time.monotonic() < deadline:  # it writes what the ring holds, then the end
        found = testing.trace_files(os.path.join(out, "t"))
        if found and last_line(found[0]) == b"]":
            break
        time.sleep(0.05)
    (path,) = testing.trace_files(os.path.join(out, "t"))
    ids, problems, last_end = [], [], 0
    for line in iter_trace_lines(path):  # every line is whole JSON, but a cut tail
        if line.error is not None:
            problems.append(line.error)
        elif line.event is not None and line.event.get("name") == "forward":
            ids.append(line.event["id"])
            last_end = max(last_end, line.event["ts"] + line.event["dur"])
    ids.sort()
    return {
        "emitted": emitted,
        "kept": len(ids),
        "lost": emitted - len(ids),
        "contiguous": ids == list(range(ids[0], ids[0] + len(ids))) if ids else True,
        "lost_window_s": (killed_at_us - last_end) / 1e6,
        "problems": problems,
        "returncode": proc.returncode,
        "drainer": drainer,
    }


def _has_drainer() -> bool:
    """A process writer can be had here (Linux, the C engine)."""
    from dftrace._core import engine

    return sys.platform.startswith("linux") and engine.speedups is not None


def main(runs: int) -> None:
    import tempfile

    print(f"{'writer':>8} {'flush s':>8} {'rate/s':>8} {'emitted':>9} {'lost':>8} {'lost %':>7} "
          f"{'window s':>9}")
    for writer in ("thread", ""):
        for flush_interval, rate in ((1.0, 10_000), (1.0, 0), (0.1, 0)):
            for r in range(runs):
                with tempfile.TemporaryDirectory() as d:
                    res = kill_after(d, 2.0 + 0.37 * r, flush_interval, rate, writer)
                assert res["contiguous"], res
                print(f"{writer or 'default':>8} {flush_interval:>8} {rate or 'max':>8} "
                      f"{res['emitted']:>9} {res['lost']:>8} "
                      f"{100 * res['lost'] / max(res['emitted'], 1):>6.1f}% "
                      f"{res['lost_window_s']:>9.3f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["emit"]:
        emit(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), *sys.argv[5:6])
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
