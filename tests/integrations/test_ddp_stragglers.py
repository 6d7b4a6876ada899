"""Straggler figures on real DDP jobs (gloo on loopback, several gradient buckets),
checked against when each rank launched its last gradient bucket, on the monotonic
clock the ranks of one host share, and the time the slow rank slept.

One rank sleeps 80 ms in its collate function on every 4th step: the others wait
for it in their gradient all-reduces, with two or more buckets in flight at once.
Control jobs have no slow rank, and run while three busy processes share the
machine."""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("polars")

import torch.multiprocessing as mp  # noqa: E402

from dftrace.analysis import render_text, summarize  # noqa: E402
from dftrace.analysis.answers.stragglers import NOISE_FLOOR_US, NOISE_MULTIPLE  # noqa: E402
from dftrace.testing import read_events, trace_files  # noqa: E402

from . import _ddp_straggler_worker  # noqa: E402

STEPS, SLOW_S, SLOW_EVERY = 64, 0.08, 4
#: The least lead a held-back step can have: NOISE_MULTIPLE noise scales of at least
#: NOISE_FLOOR_US each.
LEAST_LEAD_MS = NOISE_MULTIPLE * NOISE_FLOOR_US / 1e3


def _job(tmp_path, world: int, buckets: int, slow_rank: int | None):
    out, truth = tmp_path / "traces", tmp_path / "truth"
    out.mkdir()
    truth.mkdir()
    for attempt in range(2):  # gloo on a loaded loopback now and then aborts a rank at start-up
        init_file = str(tmp_path / f"rendezvous-{attempt}")
        try:
            mp.spawn(_ddp_straggler_worker.run,
                     args=(world, init_file, str(out), str(truth), STEPS, buckets, slow_rank, SLOW_S, SLOW_EVERY),
                     nprocs=world, join=True)
            break
        except mp.ProcessExitedException:
            if attempt:
                raise
            for d in (out, truth):
                shutil.rmtree(d)
                d.mkdir()
    facts = [json.loads((truth / f"truth-{r}.json").read_text()) for r in range(world)]
    spans = [e for f in trace_files(out) for e in read_events(f, strict=False) if e.get("ph") == "X"]
    made = {e["args"]["bucket"] for e in spans if e["args"].get("ddp")}
    return out, facts, len(made)


def _late_ms(facts: list[dict], rank: int) -> list[float]:
    """Per step, how much later (ms) ``rank`` launched its last gradient bucket than
    the other ranks on average, on the monotonic clock the ranks of one host share."""
    at = [f["last_bucket_at"] for f in facts]
    others = [r for r in range(len(at)) if r != rank]
    return [(at[rank][k] - sum(at[r][k] for r in others) / len(others)) * 1e3 for k in range(len(at[rank]))]


@pytest.mark.parametrize("world,buckets,slow_rank", [(2, 1, 1), (2, 2, 1), (2, 5, 0), (3, 2, 2), (3, 5, 1)])
def test_wait_caused_is_how_late_the_slow_rank_came(tmp_path, world, buckets, slow_rank):
    """'Wait caused' is within 0.8-1.25x of how much later the slow rank launched its
    last gradient bucket than the others in the steps it held back, on the ranks'
    shared monotonic clock (the time it slept, less what a busy machine's turns took
    from the others too), whatever the number of buckets; the slow rank is the one
    named; the held-back steps are at least nine in ten of those in which it launched
    its last gradient bucket more than half a sleep after the others, and no more than
    those in which it launched it later by the least lead that can count."""
    out, facts, made = _job(tmp_path, world, buckets, slow_rank)
    assert made == buckets or (buckets > 2 and made >= 2)  # DDP may merge the smallest buckets
    assert facts[slow_rank]["slept_s"] > 0
    slowed = len(facts[slow_rank]["slow_steps"])
    assert slowed == STEPS // SLOW_EVERY
    summary = summarize(out)
    worst = summary.stragglers[0]
    assert worst["rank"] == slow_rank and worst["significant"]
    # Held back for certain: the slept steps, but for any whose sleep a synchronising
    # call absorbed before the buckets (DDP's bucket rebuild in the second step).
    # At most: every step the rank came late in, slept or not (a busy machine's hiccups).
    late_ms = _late_ms(facts, slow_rank)
    surely = [ms for ms in late_ms if ms > SLOW_S * 1e3 / 2]
    at_most = [ms for ms in late_ms if ms > LEAST_LEAD_MS]
    assert len(surely) >= slowed - 1, late_ms
    # (At most one more: on a loaded machine a rank can launch its last bucket within
    # the least lead of the others and still reach the collective later than that,
    # descheduled in between; seen once in 64 steps while the suite shared 2 cores
    # with installs.)
    assert 0.9 * len(surely) <= worst["held_steps"] <= len(at_most) + 1, (worst, late_ms)
    assert 0.8 * sum(surely) * 1e3 <= worst["caused_wait_us"] <= 1.25 * sum(at_most) * 1e3, (worst, late_ms)
    assert not any(s["significant"] for s in summary.stragglers[1:])
    # Each rank's blocked time in a step never exceeds the step.
    assert all(r["wait_us"] <= r["dur_us"] for r in summary.rank_steps)
    assert render_text(summary).splitlines()[2].strip().startswith(f"rank {slow_rank} held the others back in ")


@pytest.mark.parametrize("world", [2, 3])
def test_no_straggler_in_a_control_run_under_load(tmp_path, busy_machine, world):
    """No slow rank, three busy processes beside the job: a rank is named only where
    the ranks' shared clock shows it launched its last gradient bucket after the
    others in most steps (the busy machine shared its cores unevenly), never for
    turns of noise; with none named, the summary says the arrival skew is within
    noise."""
    out, facts, made = _job(tmp_path, world, 2, None)
    assert made == 2 and all(f["slept_s"] == 0 for f in facts)
    summary = summarize(out)
    named = [s for s in summary.stragglers if s["significant"]]
    for straggler in named:
        late_ms = _late_ms(facts, straggler["rank"])
        assert sum(ms > 0 for ms in late_ms) >= 0.6 * len(late_ms), (straggler, late_ms)
    if not named:
        assert render_text(summary).splitlines()[2].strip().startswith("no rank stands out: arrival skew within noise")
