"""dftrace.transformers on a real Hugging Face Trainer DDP job: 2 CPU ranks (gloo on
loopback), the callback given to the trainer on rank 0 and added with add_callback on
rank 1 (both record DDP's gradient buckets), rank 1 slowed 1 s on 4 of 16 steps
(with an install running beside it, the ranks' leads in this job's ordinary steps
spread by a hundred milliseconds and more on two cores: 250 ms slowed steps were
inside that noise).
Checked against the trainer's own step count and the time the slow rank slept."""

from __future__ import annotations

import os
import socket

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("polars")

from dftrace.analysis import summarize  # noqa: E402
from dftrace.testing import read_events, trace_files  # noqa: E402

from ._torch_helpers import run_two_rank_job  # noqa: E402

JOB = os.path.join(os.path.dirname(__file__), "_hf_ddp_job.py")


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_ranks_steps_buckets_and_the_slow_rank(tmp_path):
    out = tmp_path / "traces"
    facts = run_two_rank_job(JOB, out, tmp_path / "truth", _free_port())
    assert {r: (f["steps"], f["wrapped"]) for r, f in facts.items()} == {
        0: (16, "DistributedDataParallel"), 1: (16, "DistributedDataParallel")}
    summary = summarize(out)
    assert sorted((p["rank"], p["pid"]) for p in summary.processes) == sorted((r, f["pid"]) for r, f in facts.items())
    assert len(summary.steps) == 16 and len(summary.rank_steps) == 32
    for f in trace_files(out):
        buckets = [e for e in read_events(f, strict=False)
                   if e.get("ph") == "X" and e["name"] == "all_reduce" and e["args"].get("ddp")]
        assert len(buckets) >= 16, f
    slept_us = facts[1]["slept_s"] * 1e6
    worst = summary.stragglers[0]
    assert worst["rank"] == 1 and worst["significant"], summary.stragglers
    assert 0.8 * slept_us <= worst["caused_wait_us"] <= 1.25 * slept_us, (worst, slept_us)
