"""A training loop of fixed CPU work per step, traced: the runs of test_diff_noise.

``python _timed_job.py OUT STEPS EXTRA`` writes one trace under OUT. Each step fetches
and collates a batch, moves it, then runs forward, loss, backward, zero_grad and the
optimizer step, each a fixed amount of arithmetic (so a busy machine stretches them as
it would a real job's); EXTRA adds that many work units to every forward (a step is
240 units: 24 is 10 % of it).
"""

from __future__ import annotations

import sys

import dftrace
from dftrace import ai

#: Additions per work unit (about 0.1 ms).
UNIT = 4_000


def work(units: int) -> int:
    total = 0
    for i in range(units * UNIT):
        total += i
    return total


#: (category, name, work units) of one step, in order; 240 units in all.
STEP = (("dataloader", "fetch", 10), ("data", "collate", 10), ("device", "transfer", 10),
        ("compute", "forward", 80), ("compute", "loss", 10), ("compute", "backward", 90),
        ("compute", "zero_grad", 5), ("compute", "step", 25))


def main(out: str, steps: int, extra: int) -> None:
    from dftrace._core.tree import ai as tree

    dftrace.initialize(log_file=f"{out}/job")
    spans = {name: getattr(getattr(tree, cat), "derive")(name) for cat, name, _ in STEP}
    with ai.pipeline.train:
        for step in range(steps):
            for cat, name, units in STEP:
                if name == "transfer":
                    ai.update(step=step)  # after the fetch and collation, as a loop body would
                with spans[name]:
                    work(units + (extra if name == "forward" else 0))
    dftrace.finalize()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
