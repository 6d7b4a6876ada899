"""The step model and the straggler analysis, on generated runs with known answers."""

from __future__ import annotations

import os

import orjson
import pytest
import tracegen

pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from tracegen import (  # noqa: E402
    COLL_BACKWARD_US,
    COLL_FETCH_US,
    COLL_FORWARD_US,
    COLL_OPTIMIZER_US,
    COLL_TRANSFER_US,
)

from dftrace.analysis import render_text, summarize  # noqa: E402
from dftrace.analysis.commands import main  # noqa: E402

STEPS, SLOW_US = 8, 3_000
#: One step of the lockstep run: everyone waits for the slow rank's forward.
PERIOD = COLL_FETCH_US + COLL_FORWARD_US + SLOW_US + COLL_BACKWARD_US + COLL_TRANSFER_US + COLL_OPTIMIZER_US


def _write(directory, procs, prefix="train"):
    for p in procs:
        tracegen.write_process(directory, p, prefix=prefix)
    return directory


@pytest.fixture(params=["start", "end"])
def lockstep(request, tmp_path):
    """Two ranks (on two hosts, clocks 7 ms apart), rank 1 slow; sticky args taken at
    span start or at span end."""
    return _write(tmp_path, tracegen.collective_run(2, steps=STEPS, slow_us=SLOW_US, sticky=request.param,
                                                    host_offset_us=7_000))


def test_steps_are_the_loops_steps(lockstep):
    """8 steps per rank; enclosing spans and the evaluation after the last step are
    not part of any step. Each step starts with the fetch of the batch it trains on
    (which carries the previous step's number); the first fetch carries none, and is
    the first step's all the same."""
    summary = summarize(lockstep)
    assert [(s["epoch"], s["step"], s["ranks"]) for s in summary.steps] == [(None, k, 2) for k in range(STEPS)]
    assert summary.step_stats["count"] == 2 * STEPS
    assert [s["max_us"] for s in summary.steps] == [PERIOD] * STEPS
    # No epoch arg anywhere: no "epoch None" row, and the longest steps' epoch is "-".
    assert summary.epochs == []
    text = render_text(summary).splitlines()
    longest = text[text.index("  longest steps:") + 3]
    assert longest.split()[0] == "-" and "None" not in longest, longest


def test_straggler_is_the_rank_that_arrives_last(lockstep):
    """Rank 1 arrives last at every all-reduce: it waited the least, the others waited
    SLOW_US more, whatever the clocks of the two hosts say."""
    summary = summarize(lockstep)
    first, second = summary.stragglers
    assert (first["rank"], first["host"], first["last_arrivals"], first["held_steps"]) == (1, "node1", STEPS, STEPS)
    assert first["caused_wait_us"] == STEPS * SLOW_US
    assert first["caused_wait_us_per_step"] == SLOW_US
    assert (second["rank"], second["last_arrivals"], second["caused_wait_us"]) == (0, 0, 0)
    # Compute within the steps: the slow forward, and a backward without the wait.
    assert first["compute_us_per_step"] == COLL_FORWARD_US + SLOW_US + COLL_BACKWARD_US + COLL_OPTIMIZER_US
    assert second["compute_us_per_step"] == COLL_FORWARD_US + COLL_BACKWARD_US + COLL_OPTIMIZER_US
    stats = summary.collectives
    assert (stats["matched"], stats["steps"], stats["max_skew_us"]) == (STEPS, STEPS, SLOW_US)
    assert stats["worst"][0]["last"] == "rank 1"


def test_summary_names_the_straggler_first(lockstep, capsys):
    """The terminal summary's first lines say who held the others back, and the JSON
    has the stragglers list."""
    text = render_text(summarize(lockstep))
    assert text.splitlines()[2].strip() == (
        f"rank 1 held the others back in {STEPS} of {STEPS} steps, {SLOW_US / 1000:.2f} ms per step")
    assert main(["summary", str(lockstep), "--json"]) == 0
    data = orjson.loads(capsys.readouterr().out)
    assert [(s["rank"], s["last_arrivals"]) for s in data["stragglers"]] == [(1, STEPS), (0, 0)]
    assert set(data["stragglers"][0]) >= {"rank", "host", "last_arrivals", "caused_wait_us", "compute_us_per_step"}


def test_the_straggler_s_steps_are_its_own(lockstep):
    """The line counts the straggler's own steps: a resumed job's second run of a rank
    ran only some of the job's steps (it said "8 of 20" for a run of 10)."""
    summary = summarize(lockstep)
    summary.stragglers[0]["steps"] = STEPS // 2  # as the run that resumed halfway
    summary.stragglers[0]["held_steps"] = STEPS // 2
    line = render_text(summary).splitlines()[2].strip()
    assert line.startswith(f"rank 1 held the others back in {STEPS // 2} of {STEPS // 2} steps")


def test_collective_wait_inside_backward_is_communication(lockstep):
    """The all-reduce nested in backward is communication (self time), not compute
    overlapped with communication."""
    summary = summarize(lockstep)
    groups = {g["group"]: g for g in summary.breakdown["groups"]}
    wait = STEPS * (SLOW_US + COLL_TRANSFER_US) + STEPS * COLL_TRANSFER_US  # rank 0 waits, rank 1 only transfers
    assert groups["comm"]["busy_us"] == groups["comm"]["exclusive_us"] == wait
    assert groups["compute"]["overlapped_us"] == 0
    assert summary.breakdown["pairs"] == []


def test_wait_per_rank_and_step(lockstep):
    """Each rank-step row of the timeline carries the rank's wait in collectives."""
    rows = summarize(lockstep).rank_steps
    waits = {(r["rank"], r["step"]): r["wait_us"] for r in rows}
    assert waits[("rank 0", 3)] == SLOW_US + COLL_TRANSFER_US
    assert waits[("rank 1", 3)] == COLL_TRANSFER_US


def test_single_rank_has_no_straggler_output(tmp_path):
    """One rank: no stragglers, no imbalance table, no straggler lines."""
    _write(tmp_path, tracegen.collective_run(1, steps=STEPS, slow_rank=None))
    summary = summarize(tmp_path)
    assert summary.stragglers == [] and summary.imbalance["ranks"] == []
    assert len(summary.steps) == STEPS
    text = render_text(summary)
    assert "held the others back" not in text and "Stragglers" not in text and "imbalance" not in text


def test_no_straggler_when_ranks_keep_pace(tmp_path):
    """Ranks that arrive together: the summary says no rank stands out, and why."""
    _write(tmp_path, tracegen.collective_run(2, steps=STEPS, slow_rank=None))
    summary = summarize(tmp_path)
    assert all(s["caused_wait_us"] == 0 and not s["significant"] for s in summary.stragglers)
    assert "no rank stands out: arrival skew within noise, median 0 us" in render_text(summary)


def test_files_of_two_runs_are_told_apart(tmp_path):
    """Two runs a day apart: found as two runs, wall time is one run's, not the gap."""
    day = 86_400_000_000
    _write(tmp_path, tracegen.collective_run(2, steps=STEPS, cmdline="a.py"))
    _write(tmp_path, tracegen.collective_run(2, steps=STEPS, t0=tracegen.T0_US + day, cmdline="b.py",
                                             pid=3000), "other")
    summary = summarize(tmp_path)
    assert [(r["ranks"], r["commands"]) for r in summary.runs] == [([0, 1], ["python a.py"]),
                                                                   ([0, 1], ["python b.py"])]
    assert summary.overview["runs"] == 2
    assert summary.overview["wall_us"] < day / 1000
    assert "2 separate runs" in render_text(summary).splitlines()[2]
    # Each run's ranks are units of their own: steps and collectives never mix runs.
    assert max(r["start_us"] for r in summary.rank_steps) < day / 1000
    assert summary.step_stats["max_us"] == PERIOD and summary.step_stats["count"] == 2 * 2 * STEPS
    assert [(s["unit"], s["rank"], s["last_arrivals"]) for s in summary.stragglers[:2]] == [
        ("rank 1 · run 1", 1, STEPS), ("rank 1 · run 2", 1, STEPS)]


def test_merge_keeps_the_steps_of_the_model(lockstep, tmp_path):
    """--steps 2:3 keeps each rank's time from step 2's first work to step 4's."""
    out = tmp_path / "two.json"
    assert main(["merge", str(lockstep), "-o", str(out), "--steps", "2:3", "--no-align"]) == 0
    events = [e for e in orjson.loads(out.read_bytes()) if e["ph"] == "X"]
    forwards = sorted({e["args"].get("step") for e in events if e["name"] == "forward"})
    assert forwards == [2, 3]


def test_merge_filter_matching_nothing_fails(lockstep, tmp_path, capsys):
    """A step filter that selects nothing exits non-zero and says what the trace has."""
    out = tmp_path / "none.json"
    assert main(["merge", str(lockstep), "-o", str(out), "--steps", "3:4", "--epoch", "0"]) != 0
    err = capsys.readouterr().err
    assert "no events match" in err and "steps 3..4 of epoch 0" in err and "no epoch numbers" in err
    assert not out.exists()


def test_report_names_the_straggler_first(lockstep, tmp_path):
    """The HTML report's first lines are the terminal summary's: rank 1 held the others back."""
    from dftrace.analysis import render_html

    page = render_html(summarize(lockstep))
    first = page.index("<p class='finding'>")
    assert page[first:].startswith(f"<p class='finding'>rank 1 held the others back in {STEPS} of {STEPS} steps")
    assert page.index("<h2>Stragglers</h2>") < page.index("<h2>Step timeline per rank</h2>")


def test_report_of_one_rank_says_nothing_of_stragglers(tmp_path):
    from dftrace.analysis import render_html

    _write(tmp_path, tracegen.collective_run(1, steps=STEPS, slow_rank=None))
    page = render_html(summarize(tmp_path))
    assert "held the others back" not in page and "<h2>Stragglers</h2>" not in page


def test_summary_json_of_an_older_version_loads(lockstep):
    """Summary.from_dict accepts JSON without the newer fields."""
    from dftrace.analysis import Summary

    data = summarize(lockstep).to_dict()
    for key in ("stragglers", "collectives", "runs"):
        del data[key]
    old = Summary.from_dict(data)
    assert (old.stragglers, old.collectives, old.runs) == ([], {}, [])


def test_a_long_run_s_straggler_is_judged_too(tmp_path):
    """1,200 steps, rank 1 slowed in every fourth: the chance of as many held steps is
    summed past a float's range of binomial coefficients (it raised past ~1,030 steps)."""
    steps = 1_200
    slow_steps = set(range(1, steps, 4))
    tracegen.bucketed_run(tmp_path, steps, slow_steps, SLOW_US, buckets=1)
    worst = summarize(tmp_path).stragglers[0]
    assert (worst["rank"], worst["significant"], worst["held_steps"]) == (1, True, len(slow_steps))
    assert worst["caused_wait_us"] == len(slow_steps) * SLOW_US


@pytest.mark.parametrize("buckets", [1, 2, 4])
def test_overlapping_buckets_count_once(tmp_path, buckets):
    """Several buckets in flight at once, all waiting for the late rank: the wait it
    caused is the time it was late, whatever the number of buckets, and only the
    slowed steps are held back."""
    slow_steps = {3, 7, 11, 15, 19}
    tracegen.bucketed_run(tmp_path, 24, slow_steps, SLOW_US, buckets=buckets)
    worst = summarize(tmp_path).stragglers[0]
    assert (worst["rank"], worst["significant"], worst["held_steps"]) == (1, True, len(slow_steps))
    assert worst["caused_wait_us"] == len(slow_steps) * SLOW_US
    waits = {(r["rank"], r["step"]): r["wait_us"] for r in summarize(tmp_path).rank_steps}
    assert all(waits[("rank 0", s)] <= SLOW_US + 200 for s in slow_steps)  # blocked once, not once per bucket


def test_noise_names_no_straggler(tmp_path):
    """Ranks that take turns being a little late (random jitter up to 300 µs): no
    rank stands out, and the summary says the skew is within noise."""
    import random

    rng = random.Random(7)
    jitter = {(r, s): rng.randrange(0, 300) for r in range(2) for s in range(48)}
    tracegen.bucketed_run(tmp_path, 48, set(), 0, buckets=2, jitter=jitter)
    summary = summarize(tmp_path)
    assert not any(s["significant"] for s in summary.stragglers)
    assert render_text(summary).splitlines()[2].strip().startswith("no rank stands out: arrival skew within noise")


def _noisy_jitter(steps, seed, noise_us=1_500, hiccups=(0.05, 8_000)):
    """µs added to each rank's forward: a busy machine's noise (normal, ``noise_us``),
    and in a share of the steps a hiccup of 4 ms up to the longest (``hiccups``: the
    share, the longest)."""
    import random

    rng = random.Random(seed)
    share, longest = hiccups

    def forward_us() -> int:
        hiccup = rng.uniform(4_000, longest) if rng.random() < share else 0
        return max(0, round(6_000 + rng.gauss(0, noise_us) + hiccup))

    return {(r, s): forward_us() for r in range(2) for s in range(steps)}


@pytest.mark.parametrize("seed", [3, 4])
def test_slowed_steps_do_not_hide_in_the_noise_they_make(tmp_path, seed):
    """A quarter of the steps slowed by 25 ms, the lead's noise about 2.5 ms with
    hiccups: measured over all steps, the spread takes the slowed steps in and
    widens by half, hiding a fifth to a third of them; measured over the ordinary
    steps, every slowed step is held back and the wait caused is the time planted."""
    steps, slow_us = 64, 25_000
    slow_steps = {s for s in range(steps) if s % 4 == 1}
    tracegen.bucketed_run(tmp_path, steps, slow_steps, slow_us, buckets=2, jitter=_noisy_jitter(steps, seed))
    worst, other = summarize(tmp_path).stragglers
    assert (worst["rank"], worst["significant"], worst["held_steps"]) == (1, True, len(slow_steps))
    assert abs(worst["caused_wait_us"] - len(slow_steps) * slow_us) <= 0.1 * len(slow_steps) * slow_us, worst
    assert (other["held_steps"], other["significant"]) == (0, False)


#: A busier machine: normal noise of 3 ms, and in a tenth of the steps a hiccup of 4-15 ms.
_BUSY = {"noise_us": 3_000, "hiccups": (0.1, 15_000)}


@pytest.mark.parametrize("seed", [9, 10])
def test_a_third_of_the_steps_slowed_do_not_hide_in_a_busy_machine_s_noise(tmp_path, seed):
    """20 steps, rank 1 slowed 40 ms in 7 of them, on a busy machine: the slowed steps
    are a third of the rank's leads, enough to move their median and widen their spread
    until 40 ms looked like noise (no rank named, or 1 held step of 7). The leads stray
    far further above their median than below it: the steps above are left out of the
    rank's ordinary steps, and every slowed step is held back."""
    import random

    steps, slow_us = 20, 40_000
    slow_steps = set(random.Random(seed * 7 + 1).sample(range(steps), 7))
    tracegen.bucketed_run(tmp_path, steps, slow_steps, slow_us, buckets=2, jitter=_noisy_jitter(steps, seed, **_BUSY))
    worst, other = summarize(tmp_path).stragglers
    assert (worst["rank"], worst["significant"], worst["held_steps"]) == (1, True, len(slow_steps)), worst
    assert abs(worst["caused_wait_us"] - len(slow_steps) * slow_us) <= 0.15 * len(slow_steps) * slow_us, worst
    assert (other["held_steps"], other["significant"]) == (0, False)


def test_a_rank_slower_in_every_step_is_held_back_in_every_step():
    """A real job: 4 ranks on 2 cores, rank 3 sleeping 30 ms in every one of 24 steps.
    On the busy cores a few of its steps lead by far more than the rest, and standing
    out of its own noise they read it as holding the others back in 5 steps, a third
    of the wait. It was last in every step: it held the others back in every step, by
    about what it slept (720 ms planted, 750 ms by its own clock)."""
    data = os.path.join(os.path.dirname(__file__), os.pardir, "data", "ddp-buckets", "four-ranks-slow-every-step")
    stragglers = summarize(data).stragglers
    worst = stragglers[0]
    assert (worst["rank"], worst["significant"], worst["pattern"]) == (3, True, "most steps"), worst
    assert worst["held_steps"] >= 22 and worst["last_steps"] == 24, worst
    assert 0.8 * 720_000 <= worst["caused_wait_us"] <= 1.25 * 720_000, worst
    assert not any(s["significant"] for s in stragglers[1:])


@pytest.mark.parametrize("seed", [100, 101, 102, 103])
def test_a_busy_machine_s_noise_names_no_straggler(tmp_path, seed):
    """The same busy machine's noise, no rank slowed: no rank stands out."""
    tracegen.bucketed_run(tmp_path, 20, set(), 0, buckets=2, jitter=_noisy_jitter(20, seed, **_BUSY))
    assert not any(s["significant"] for s in summarize(tmp_path).stragglers)


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_hiccups_name_no_straggler(tmp_path, seed):
    """The same noise and hiccups with no rank slowed: no rank stands out."""
    tracegen.bucketed_run(tmp_path, 64, set(), 0, buckets=2, jitter=_noisy_jitter(64, seed))
    assert not any(s["significant"] for s in summarize(tmp_path).stragglers)


def test_steps_held_back_by_seconds_are_not_judged_against_hiccups(tmp_path):
    """16 steps, rank 1 slowed 1 s in 4 of them, and a busy machine's hiccups (2-3 ms)
    on both ranks now and then: rank 1 held the others back in 6 steps, 4 of them by a
    second. Judged at its least held lead alone, the other rank's hiccups made the 6
    look like chance (p 0.01, seen on a real Hugging Face DDP job under load); judged
    at each of its leads, the 4 seconds name it, and the hiccups alone name no one."""
    steps, slow_steps = 16, {2, 6, 10, 14}
    hiccups = {(0, 4): 3_000, (0, 12): 2_500, (1, 8): 2_000, (1, 11): 2_200, (0, 7): 1_800}
    (tmp_path / "slow").mkdir()
    (tmp_path / "control").mkdir()
    tracegen.bucketed_run(tmp_path / "slow", steps, slow_steps, 1_000_000, buckets=2, jitter=hiccups)
    worst, other = summarize(tmp_path / "slow").stragglers
    assert (worst["rank"], worst["significant"], worst["held_steps"]) == (1, True, 6), worst
    assert abs(worst["caused_wait_us"] - 4_000_000 - 4_200) <= 0.01 * 4_000_000, worst
    assert not other["significant"]
    tracegen.bucketed_run(tmp_path / "control", steps, set(), 0, buckets=2, jitter=hiccups)
    assert not any(s["significant"] for s in summarize(tmp_path / "control").stragglers)


@pytest.mark.parametrize("partition_bytes", [None, 300])
def test_self_time_of_each_name(lockstep, partition_bytes):
    """Self time is the time a name's spans were the innermost: backward's is its own
    compute without the all-reduce nested in it, the same when the files are cut into
    many partitions (children written in one, their parent in another)."""
    options = {} if partition_bytes is None else {"partition_bytes": partition_bytes}
    summary = summarize(lockstep, **options)
    if partition_bytes:
        assert summary.overview["partitions"] > 2  # the two files, cut
    rows = {r["name"]: r for r in summary.categories}
    assert rows["backward"]["self_us"] == 2 * STEPS * COLL_BACKWARD_US
    assert rows["backward"]["total_us"] > rows["backward"]["self_us"]
    for leaf in ("all_reduce", "forward", "step", "fetch.iter"):
        assert rows[leaf]["self_us"] == rows[leaf]["total_us"], leaf


def test_a_slow_fetch_lands_in_the_same_step_on_every_rank():
    """A real DDP job (tests/data/ddp-buckets/slow) whose rank 1 sleeps 25 ms in its
    collate on every 4th step (1, 5, 9, ...): the step that waits for the batch is
    the same on both ranks, so both are long in exactly the slowed steps (no step
    plot zig-zagging between ranks) and neither is long in the step before."""
    from pathlib import Path

    summary = summarize(Path(__file__).resolve().parents[1] / "data" / "ddp-buckets" / "slow")
    steps: dict = {}
    for r in summary.rank_steps:
        steps.setdefault(r["step"], {})[r["rank"]] = r["dur_us"]
    slowed = {k for k in steps if k % 4 == 1}
    long = {k for k, ranks in steps.items() if min(ranks.values()) > 20_000}
    assert long == slowed
    assert all(max(steps[k - 1].values()) < 20_000 for k in slowed)


def test_three_ranks_one_held_back_in_a_quarter_of_sixteen_steps():
    """A real DDP job of 3 ranks and 16 steps (tests/data/ddp-buckets/three-ranks) whose
    rank 2 sleeps 25 ms in its collate on steps 1, 5, 9 and 13: with a significance
    level shared by three ranks, three held steps of sixteen must still name it. The
    wait it caused is how much later it launched its last gradient bucket than the
    others' mean in the steps it came late by more than half a sleep (step 1's sleep is
    absorbed by DDP's bucket rebuild), on the ranks' shared monotonic clock."""
    import json
    from pathlib import Path

    run = Path(__file__).resolve().parents[1] / "data" / "ddp-buckets" / "three-ranks"
    truth = json.loads((run / "truth.json").read_text())
    at = [truth[str(r)]["last_bucket_at"] for r in range(3)]
    late_ms = [(at[2][k] - (at[0][k] + at[1][k]) / 2) * 1e3 for k in range(16)]
    surely = [ms for ms in late_ms if ms > 12.5]
    assert len(surely) == 3 and truth["2"]["slow_steps"] == [1, 5, 9, 13]
    worst, *others = summarize(run).stragglers
    assert (worst["rank"], worst["significant"], worst["held_steps"]) == (2, True, len(surely))
    assert 0.8 * sum(surely) * 1e3 <= worst["caused_wait_us"] <= 1.25 * sum(surely) * 1e3, (worst, late_ms)
    assert not any(s["significant"] for s in others)


@pytest.mark.parametrize("after_work", [False, True])
def test_data_loading_inside_a_step_stays_in_that_step(tmp_path, after_work):
    """Data loading that runs inside the step's own work span (an item recorded inside
    ``with ai.compute.step:``) is that step's: each step lasts what its work span
    lasts. A fetch that begins once the step's work has ended carries that step's
    number but fetches the next step's batch, and starts the next step."""
    p = tracegen.Process(3100, host="node0", rank=0)
    t = tracegen.T0_US
    durations = [2_350, 2_110, 2_120, 2_400]
    for step, dur in enumerate(durations):
        p.span("step", "compute", t, dur, level=1, epoch=0, step=step)
        p.span("item", "data", t + 1, dur - 200, level=2, epoch=0, step=step)
        if after_work:
            p.span("fetch", "dataloader", t + dur, 300, level=1, epoch=0, step=step)
            t += 300
        t += dur
    _write(tmp_path, [p])
    got = [r["dur_us"] for r in summarize(tmp_path).rank_steps]
    if after_work:  # each step from its batch's fetch (the first has none); the last fetch is no step's
        assert got == [durations[0]] + [300 + d for d in durations[1:]]
    else:
        assert got == durations


def test_a_rank_of_two_training_processes_has_the_time_of_both(tmp_path):
    """A rank whose steps two processes place by their work (its second half under
    another pid counting its steps from 0 again, as after a restart): a file read
    whole keeps its process's time in its own steps, which is its rank's only when
    the process is the rank's one, so these files are read again with their
    intervals. Each rank's waits and compute time equal those of the same events
    loaded in memory (every interval kept)."""
    from dftrace.analysis import load_traces

    procs = tracegen.collective_run(3, steps=STEPS, slow_rank=1, slow_us=SLOW_US)
    rank = procs[2]
    cut = min(e["ts"] for e in rank.events if e["args"].get("step") == STEPS // 2)
    later = tracegen.Process(rank.pid + 100, host=rank.host, rank=rank.rank, anchor=rank.anchor)
    for event in rank.events:
        if event["ts"] >= cut:
            args = dict(event["args"])
            if args.get("step") is not None:
                args["step"] -= STEPS // 2
            later.events.append({**event, "pid": later.pid, "args": args,
                                 "tid": later.pid if event["tid"] == rank.pid else event["tid"]})
    rank.events = [e for e in rank.events if e["ts"] < cut]
    _write(tmp_path, [*procs, later])
    from_files = summarize(tmp_path, progress=False, index=False)
    in_memory = summarize(load_traces(tmp_path, progress=False))
    assert from_files.overview["processes"] == 4
    waits = [r["wait_us"] for r in from_files.rank_steps if r["rank"] == "rank 2"]
    assert len(waits) == STEPS // 2 and all(w > 0 for w in waits)
    for field in ("stragglers", "rank_steps", "steps", "collectives"):
        assert getattr(from_files, field) == getattr(in_memory, field), field
