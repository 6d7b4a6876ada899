"""Real distributed training: 2 processes in a gloo group on loopback, one of them slow
in its forward, traced with trace_ddp + trace_distributed; then the summary's answers."""

from __future__ import annotations

import json
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("polars")

import torch.multiprocessing as mp  # noqa: E402

from dftrace.analysis import render_text, summarize  # noqa: E402
from dftrace.cli import main as cli_main  # noqa: E402
from dftrace.testing import read_events, trace_files  # noqa: E402

from . import _ddp_worker  # noqa: E402

WORLD, EPOCHS, STEPS, SLOW_RANK, SLOW_S = 2, 2, 8, 1, 0.03


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    init_file = str(tmp_path_factory.mktemp("rendezvous") / "rendezvous")
    mp.spawn(_ddp_worker.run, args=(WORLD, init_file, str(out), EPOCHS, STEPS, SLOW_RANK, SLOW_S),
             nprocs=WORLD, join=True)
    calls = [Counter(json.loads((out / f"calls-{r}.json").read_text())) for r in range(WORLD)]
    return out, calls


def _spans(directory):
    return [e for f in trace_files(directory) for e in read_events(f, strict=False) if e.get("ph") == "X"]


def test_each_collective_is_one_span(ddp_run):
    """As many comm spans as torch.distributed calls (DDP buckets and explicit calls),
    each with group, seq, op, bytes and the group's size; async ones have a .done."""
    out, calls = ddp_run
    spans = _spans(out)
    made = sum(calls, Counter())
    comm = Counter(e["name"] for e in spans if e["cat"] == "comm")
    assert comm["all_reduce"] == made["all_reduce"] and comm["barrier"] == made["barrier"]
    assert comm["all_reduce.done"] == made["all_reduce"] - WORLD * EPOCHS * STEPS  # the DDP buckets
    calls_ = [e for e in spans if e["name"] in ("all_reduce", "barrier")]
    assert all(e["args"]["group"] == "0" and e["args"]["group_size"] == WORLD for e in calls_)
    reduces = [e for e in calls_ if e["name"] == "all_reduce"]
    assert all("bytes" in e["args"] for e in reduces)
    # op is known for explicit calls; a custom DDP hook (the counting one) may do anything
    assert all(e["args"]["op"] == "SUM" for e in reduces if not e["args"].get("ddp"))
    per_rank = {r: sorted(e["args"]["seq"] for e in calls_ if e["pid"] == pid)
                for r, pid in enumerate(sorted({e["pid"] for e in calls_}))}
    assert per_rank[0] == per_rank[1] == list(range(1, sum(calls[0].values()) + 1))


def test_summary_finds_the_slow_rank(ddp_run):
    """stragglers[0] is the rank that slept; steps are the loop's; every call is matched."""
    out, calls = ddp_run
    summary = summarize(out)
    assert summary.stragglers[0]["rank"] == SLOW_RANK
    assert summary.stragglers[0]["held_steps"] > EPOCHS * STEPS // 2
    assert summary.stragglers[0]["caused_wait_us"] > summary.stragglers[1]["caused_wait_us"]
    assert [(s["epoch"], s["step"], s["ranks"]) for s in summary.steps] == [
        (e, s, WORLD) for e in range(EPOCHS) for s in range(STEPS)]
    assert summary.collectives["matched"] == sum(calls[0].values())
    assert render_text(summary).splitlines()[2].strip().startswith(f"rank {SLOW_RANK} held the others back in ")


def test_waiting_counts_as_communication(ddp_run):
    """The fast rank's wait (DDP's end of backward, the blocking all-reduce) is
    communication, and the slow rank's compute per step is the larger."""
    out, _ = ddp_run
    summary = summarize(out)
    fast = next(p for p in summary.breakdown["processes"] if p["rank"] == 1 - SLOW_RANK)
    assert fast["exclusive_us"]["comm"] > EPOCHS * STEPS * SLOW_S * 1e6 / 2
    compute = {s["rank"]: s["compute_us_per_step"] for s in summary.stragglers}
    assert compute[SLOW_RANK] - compute[1 - SLOW_RANK] > SLOW_S * 1e6 / 2
    waits = {(r["rank"], r["epoch"], r["step"]): r["wait_us"] for r in summary.rank_steps}
    later = [(e, s) for e in range(EPOCHS) for s in range(1, STEPS)]
    assert sum(waits[(f"rank {1 - SLOW_RANK}", *k)] > waits[(f"rank {SLOW_RANK}", *k)] for k in later) > len(later) / 2


def test_ddp_demo(tmp_path, capsys):
    """dftrace demo --ddp: 2 ranks, rank 1 slow; the summary names rank 1, counts the
    loop's steps and each DDP bucket once."""
    assert cli_main(["demo", "--ddp", "--epochs", "1", "--out", str(tmp_path)]) == 0
    assert "dftrace summary" in capsys.readouterr().out
    summary = summarize(tmp_path)
    assert summary.stragglers[0]["rank"] == 1
    assert len(summary.steps) == 32
    spans = _spans(tmp_path)
    buckets = {e["args"]["bucket"] for e in spans if e["args"].get("ddp")}
    reduces = sum(1 for e in spans if e["name"] == "all_reduce")
    assert reduces == WORLD * 32 * (len(buckets) + 1)  # the buckets and the loss, per step and rank


@pytest.fixture
def one_rank_group():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


def test_nested_and_async_calls(one_rank_group, tmp_path):
    """all_gather_object (which calls all_gather) is one span; an async all-reduce is
    one span plus its .done with the same sequence number."""
    import dftrace.torch as dft
    from dftrace import testing

    dist = one_rank_group
    with testing.trace_to(tmp_path) as result, dft.trace_distributed():
        out = [None]
        dist.all_gather_object(out, {"a": 1})
        dist.all_reduce(torch.ones(4), async_op=True).wait()
    comm = [e for e in result.spans() if e["cat"] == "comm"]
    names = sorted(e["name"] for e in comm)
    assert names == ["all_gather", "all_reduce", "all_reduce.done"]
    seqs = {e["name"]: e["args"]["seq"] for e in comm}
    assert seqs == {"all_gather": 1, "all_reduce": 2, "all_reduce.done": 2}
    assert out == [{"a": 1}]
