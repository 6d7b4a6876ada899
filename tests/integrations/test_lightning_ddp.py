"""dftrace.lightning on a real Lightning DDP job: two CPU processes started by
Lightning's own launcher (which sets LOCAL_RANK, not RANK), gloo on loopback, one
rank slowed 30 ms on 4 of 16 steps. Checked against each rank's own clock and the
time the slow rank slept."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("lightning.pytorch")
pytest.importorskip("polars")

from dftrace.analysis import render_text, summarize  # noqa: E402
from dftrace.testing import read_events, trace_files  # noqa: E402

JOB = os.path.join(os.path.dirname(__file__), "_lightning_ddp_job.py")
SLOW_RANK, STEPS = 1, 16


def _run(tmp_path, slow_rank: int):
    out, truth = tmp_path / "traces", tmp_path / "truth"
    for attempt in range(2):  # gloo on a loaded loopback now and then aborts a rank at start-up
        for d in (out, truth):
            d.mkdir(exist_ok=True)
            for f in d.iterdir():
                if f.is_file():
                    f.unlink()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DFTRACE_", "RANK", "LOCAL_RANK",
                                                                           "WORLD_SIZE", "MASTER_"))}
        done = subprocess.run([sys.executable, JOB, str(out), str(truth), str(slow_rank)], env=env,
                              capture_output=True, text=True, timeout=300)
        if done.returncode == 0 or attempt:
            break
    assert done.returncode == 0, done.stderr[-3000:]
    facts = {f["rank"]: f for f in (json.loads((truth / f"truth-{r}.json").read_text()) for r in (0, 1))}
    return out, facts


def test_ranks_steps_buckets_and_the_slow_rank(tmp_path):
    out, facts = _run(tmp_path, SLOW_RANK)
    assert {r: f["steps"] for r, f in facts.items()} == {0: STEPS, 1: STEPS}
    summary = summarize(out)
    # Each process is the rank Lightning gave it, neither a DataLoader worker of the other.
    assert sorted((p["rank"], p["pid"]) for p in summary.processes) == sorted(
        (r, f["pid"]) for r, f in facts.items())
    assert all(p["label"].startswith(f"rank {p['rank']} ") for p in summary.processes)
    assert summary.overview["ranks"] == 2
    # One step per optimizer step on each rank, the epochs Lightning ran.
    assert len(summary.steps) == STEPS and len(summary.rank_steps) == 2 * STEPS
    assert [(e["epoch"], e["steps"]) for e in summary.epochs] == [(0, STEPS // 2), (1, STEPS // 2)]
    # DDP's gradient buckets are spans on both ranks.
    for f in trace_files(out):
        buckets = [e for e in read_events(f, strict=False)
                   if e.get("ph") == "X" and e["name"] == "all_reduce" and e["args"].get("ddp")]
        assert len(buckets) >= STEPS, f
    # The slow rank is named, and the wait it caused is the time it slept.
    slept_us = facts[SLOW_RANK]["slept_s"] * 1e6
    assert len(facts[SLOW_RANK]["slow_steps"]) == 4
    worst = summary.stragglers[0]
    assert worst["rank"] == SLOW_RANK and worst["significant"], summary.stragglers
    assert 0.8 * slept_us <= worst["caused_wait_us"] <= 1.25 * slept_us, (worst, slept_us)
    assert render_text(summary).splitlines()[2].strip().startswith(f"rank {SLOW_RANK} held the others back in ")
