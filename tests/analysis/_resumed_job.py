"""A hand-annotated training loop that checkpoints every 8 steps and dies by SIGTERM
in step 37 on its first run: ``python _resumed_job.py TRACE_DIR TRUTH_DIR``, run
twice with RANK=0, resumes the second time from its checkpoint (step 32) into the
same trace directory, as torchrun's restarts and a requeued job do.

Each process appends ``{"epoch", "step", "start_ns"}`` per step, on its own
monotonic clock, to ``TRUTH_DIR/steps-<pid>.jsonl``."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import dftrace
from dftrace import ai

STEPS_PER_EPOCH, EPOCHS, KILL_AT, CHECKPOINT_EVERY = 24, 2, 37, 8


def main(out: str, truth: str) -> None:
    dftrace.initialize(log_file=os.path.join(out, "run"))
    checkpoint = os.path.join(truth, "checkpoint.json")
    first = 0
    if os.path.exists(checkpoint):
        with open(checkpoint) as f:
            first = json.load(f)["next"]
    log = open(os.path.join(truth, f"steps-{os.getpid()}.jsonl"), "a")
    for g in range(first, STEPS_PER_EPOCH * EPOCHS):
        epoch = g // STEPS_PER_EPOCH
        log.write(json.dumps({"epoch": epoch, "step": g, "start_ns": time.perf_counter_ns()}) + "\n")
        log.flush()
        with ai.dataloader.fetch(args={"epoch": epoch, "step": g}):
            time.sleep(0.002)
        ai.update(epoch=epoch, step=g)
        with ai.compute.forward:
            time.sleep(0.006)
        with ai.compute.backward:
            time.sleep(0.002)
        if g and g % CHECKPOINT_EVERY == 0:
            with ai.checkpoint.capture:
                with open(checkpoint, "w") as f:
                    json.dump({"next": g}, f)
        if g == KILL_AT and first == 0:
            os.kill(os.getpid(), signal.SIGTERM)
    log.write(json.dumps({"end_ns": time.perf_counter_ns()}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
