"""Emit spans for a long time and print the process's RSS after each phase.

``python _long_run.py OUT_DIR PHASES EVENTS_PER_PHASE [MAX_FILE_SIZE]`` prints one
line per phase: ``<phase> <events so far> <rss bytes> <records buffered before the flush>``. Used by
test_long_run.py and, with bigger numbers, for the figure in docs/reliability.md.
"""

from __future__ import annotations

import sys

import psutil

import dftrace
from dftrace import ai
from dftrace._core import buffer as _buffer


@ai.compute.forward
def forward(i: int) -> int:
    return i


def main(out: str, phases: int, per_phase: int, max_file_size: str) -> None:
    session = dftrace.initialize(log_file=f"{out}/long", compression="zstd", flush_interval=0.2,
                       max_file_size=max_file_size)
    proc = psutil.Process()
    n = 0
    for phase in range(phases):
        for _ in range(per_phase // 2):
            with ai.pipeline.epoch(args={"step": n}):
                forward(n)
            n += 2
        buffered = _buffer.buffered()
        session.writer.flush()  # measure what stays once the buffer is written
        print(phase, n, proc.memory_info().rss, buffered, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "0")
