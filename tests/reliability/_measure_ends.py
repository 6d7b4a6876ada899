"""Measure how hostile ends go, traced and untraced: the table in docs/reliability.md.

``python tests/reliability/_measure_ends.py [REPEAT]`` runs each scenario of
``_hostile.py`` REPEAT times (default 3) with and without tracing and prints one
Markdown row per scenario: the events in the file, whether it has its ``]``, the
exit status (traced / untraced) and the time from the signal (or from ``ready``
when the program ends by itself) to the end of the process (median, and the
slowest run).
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.dirname(HERE))  # the suite's helpers

from dftrace import testing  # noqa: E402
from dftrace.format import iter_trace_lines  # noqa: E402

from _signals import default_signals  # noqa: E402

HOSTILE = os.path.join(HERE, "_hostile.py")

# (label, scenario, events, signals to send as (delay before it, signal))
SCENARIOS = [
    ("SIGTERM, main thread blocked in C", "c-blocked", 20_000, [(0, signal.SIGTERM)]),
    ("SIGUSR1, main thread blocked in C", "c-blocked", 20_000, [(0, signal.SIGUSR1)]),
    ("SIGTERM, initialize() ran on a thread, main blocked in C", "init-thread-c-blocked",
     20_000, [(0, signal.SIGTERM)]),
    ("SIGUSR1, initialize() ran on a thread", "init-thread", 200_000, [(0, signal.SIGUSR1)]),
    ("two Ctrl-C 50 ms apart", "two-ctrl-c", 500_000,
     [(0, signal.SIGINT), (0.05, signal.SIGINT)]),
    ("app's SIGTERM handler, then SIGHUP 50 ms later", "app-handler-then-sighup", 300_000,
     [(0, signal.SIGTERM), (0.05, signal.SIGHUP)]),
    ("trace file a FIFO whose reader never reads, `sys.exit(3)`", "fifo-reader-exit", 20_000, []),
    ("trace file a FIFO never read, SIGTERM", "fifo-reader", 20_000, [(0, signal.SIGTERM)]),
]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DFTRACE_", "RANK"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(HERE)),
                                                    env.get("PYTHONPATH", "")) if p)
    return env


def run_once(scenario: str, n: int, signals: list, untraced: bool) -> tuple[int, float, int, bool]:
    """(status, seconds to exit, forward spans in the file, has ']')."""
    with tempfile.TemporaryDirectory() as out:
        args = [sys.executable, HOSTILE, scenario, out, str(n)]
        args += ["--untraced"] if untraced else []
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(),
                                preexec_fn=default_signals)
        assert proc.stdout.readline().strip() == b"ready"
        t0 = time.monotonic()
        for delay, sig in signals:
            time.sleep(delay)
            proc.send_signal(sig)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        took = time.monotonic() - t0
        kept, closed = 0, False
        for path in testing.trace_files(out):
            if not os.path.isfile(path) or os.stat(path).st_size == 0:
                continue
            kept += len(testing.spans(testing.read_events(path, strict=False), "forward"))
            closed = any(line.text == b"]" for line in iter_trace_lines(path))
        return proc.returncode, took, kept, closed


def main(repeat: int) -> None:
    print("| scenario | events in the file | `]` | exit status traced (untraced) "
          "| time to exit traced, median (max) | untraced |")
    print("|---|---:|:-:|---|---:|---:|")
    for label, scenario, n, signals in SCENARIOS:
        base = scenario.replace("init-thread-", "").replace("init-thread", "sleep")
        plain = [run_once(base, n, signals, untraced=True) for _ in range(repeat)]
        traced = [run_once(scenario, n, signals, untraced=False) for _ in range(repeat)]
        times = [t[1] for t in traced]
        kept = sorted({t[2] for t in traced})
        print(f"| {label} | {' / '.join(f'{k:,}' for k in kept)} of {n:,} "
              f"| {'yes' if all(t[3] for t in traced) else 'no'} "
              f"| {_status(traced)} ({_status(plain)}) "
              f"| {statistics.median(times):.2f} s ({max(times):.2f} s) "
              f"| {statistics.median(t[1] for t in plain):.2f} s |", flush=True)


def _status(runs: list) -> str:
    codes = sorted({r[0] for r in runs})
    return " / ".join(f"-{signal.Signals(-c).name}" if c < 0 else str(c) for c in codes)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
