"""A training loop of fixed CPU work per step, traced: the runs of test_diff_noise.

``python _timed_job.py OUT STEPS EXTRA`` writes one trace under OUT. Each step fetches
a batch, then runs forward, backward and the optimizer step, each a fixed amount of
arithmetic (so a busy machine stretches them as it would a real job's); EXTRA adds
that many work units to every forward (a step is 240 units: 24 is 10 % of it).
"""

from __future__ import annotations

import sys

import dftrace
from dftrace import ai

#: Additions per work unit; a forward is 100 units, a backward 100, fetch and optimizer 20 each.
UNIT = 4_000


def work(units: int) -> int:
    total = 0
    for i in range(units * UNIT):
        total += i
    return total


def main(out: str, steps: int, extra: int) -> None:
    dftrace.initialize(log_file=f"{out}/job")
    with ai.pipeline.train:
        for step in range(steps):
            with ai.dataloader.fetch:
                work(20)
            ai.update(step=step)
            with ai.compute.forward:
                work(100 + extra)
            with ai.compute.backward:
                work(100)
            with ai.compute.step:
                work(20)
    dftrace.finalize()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
