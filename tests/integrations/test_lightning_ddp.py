"""dftrace.lightning on a real Lightning DDP job: two CPU processes started by
Lightning's own launcher (which sets LOCAL_RANK, not RANK), gloo on loopback, one
rank slowed 80 ms on 4 of 16 steps (well above a busy machine's noise: at 30 ms the
other rank's delays could outweigh it), a checkpoint saved every 3 steps. Checked
against each rank's own clock and the time the slow rank slept."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("lightning.pytorch")
pytest.importorskip("polars")

from dftrace.analysis import render_text, summarize  # noqa: E402
from dftrace.testing import read_events, trace_files  # noqa: E402

from ._torch_helpers import run_two_rank_job  # noqa: E402

JOB = os.path.join(os.path.dirname(__file__), "_lightning_ddp_job.py")
SLOW_RANK, STEPS = 1, 16


def _run(tmp_path, slow_rank: int, accumulate: int = 1):
    out = tmp_path / "traces"
    return out, run_two_rank_job(JOB, out, tmp_path / "truth", str(slow_rank), str(accumulate))


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


def test_a_checkpoint_mid_epoch_is_no_step_s_time_on_any_rank(tmp_path):
    """Rank 0 writes each checkpoint and rank 1 waits for it inside
    ``trainer.save_checkpoint``: on both ranks that is the checkpoint's span, and the
    step before it ends where the save starts (by each rank's own clock: the time
    between its step starts, less its save)."""
    out, facts = _run(tmp_path, -1)
    summary = summarize(out)
    spans = {r: [] for r in facts}
    for f in trace_files(out):
        events = [e for e in read_events(f, strict=False) if e.get("ph") == "X"]
        rank = next(r for r, fact in facts.items() if any(e["pid"] == fact["pid"] for e in events))
        spans[rank] += [e for e in events if e["cat"] == "checkpoint" and e["name"] == "capture"]
    for rank, fact in facts.items():
        saves = fact["saves_ns"]
        assert len(saves) == STEPS // 3 >= 4  # every 3 steps, mid-epoch
        # A span for each save on each rank, as long as the save; only rank 0 wrote bytes.
        assert len(spans[rank]) == len(saves), spans[rank]
        assert all(("bytes" in e["args"]) == (rank == 0) for e in spans[rank])
        ours = sum(e["dur"] for e in spans[rank])
        theirs = sum(b - a for a, b in saves) / 1e3
        assert theirs <= ours <= 1.5 * theirs, (rank, ours, theirs)
        # Each epoch's steps but its last (which ends with its own work) run from the
        # first one's start to the last one's on the rank's own clock, less the saves
        # between them: the saves are no step's time.
        starts, epochs = fact["starts_ns"], fact["epochs"]
        steps = {(s["epoch"], s["step"]): s["dur_us"] for s in summary.rank_steps if s["rank"] == f"rank {rank}"}
        for epoch in sorted(set(epochs)):
            mine = [k for k, e in enumerate(epochs) if e == epoch]
            first, last = starts[mine[0]], starts[mine[-1]]
            saved = sum(b - a for a, b in saves if first < a < last) / 1e3
            assert saved > 0
            truth = (last - first) / 1e3 - saved
            got = sum(steps[(epoch, k)] for k in mine[:-1])
            assert abs(got - truth) <= 0.25 * saved, (rank, epoch, got, truth, saved)


def test_with_accumulation_the_wait_for_the_slow_rank_is_communication_not_data_loading(tmp_path):
    """With two micro-batches a step, the slow rank sleeps on one that does not
    synchronize the gradients: the other rank waits for it in Lightning's check for a
    SIGTERM before the next batch (a broadcast from rank 0), which is a ``comm.bcast``
    span of the step, not the wait for the batch."""
    out, facts = _run(tmp_path, SLOW_RANK, accumulate=2)
    assert {r: f["steps"] for r, f in facts.items()} == {0: STEPS, 1: STEPS}
    slept_us = facts[SLOW_RANK]["slept_s"] * 1e6
    assert len(facts[SLOW_RANK]["slow_steps"]) == 4
    fetch_us, broadcasts = {}, {}
    for f in trace_files(out):
        events = [e for e in read_events(f, strict=False) if e.get("ph") == "X"]
        rank = next(r for r, fact in facts.items() if any(e["pid"] == fact["pid"] for e in events))
        fetch_us[rank] = sum(e["dur"] for e in events if (e["cat"], e["name"]) == ("dataloader", "fetch"))
        broadcasts[rank] = [e for e in events if (e["cat"], e["name"]) == ("comm", "bcast")]
    # The other rank's wait is no wait for data: its batches come from memory.
    assert fetch_us[1 - SLOW_RANK] < 0.25 * slept_us, (fetch_us, slept_us)
    summary = summarize(out)
    worst = summary.stragglers[0]
    assert worst["rank"] == SLOW_RANK and worst["significant"], summary.stragglers
    assert 0.8 * slept_us <= worst["caused_wait_us"] <= 1.25 * slept_us, (worst, slept_us)
    # One broadcast before each of the 32 batches, on each rank, in the batch's step.
    assert {r: len(b) for r, b in broadcasts.items()} == {0: 2 * STEPS, 1: 2 * STEPS}
    assert all(sorted(e["args"]["step"] for e in b) == sorted(2 * list(range(STEPS))) for b in broadcasts.values())
