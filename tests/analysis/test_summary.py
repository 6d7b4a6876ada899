"""The summary's answers, checked against the known contents of generated runs."""

from __future__ import annotations

import orjson
import pytest
import tracegen
from _requirements import native_engine_missing, needs

pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from tracegen import (  # noqa: E402
    ALL_REDUCE_US,
    BACKWARD_US,
    CHECKPOINT_US,
    FETCH_ITER_US,
    FORWARD_US,
    OPTIMIZER_US,
    PREPROCESS_US,
    TRANSFER_US,
)

from dftrace.analysis import Summary, load_traces, summarize  # noqa: E402
from dftrace.analysis.answers import summary as summary_module  # noqa: E402

RANKS, EPOCHS, STEPS = 4, 2, 4
# The step model: a step runs from the fetch of its batch (which carries no step) to
# the next step's; the last step of an epoch ends with its own last span (the
# optimizer step).
STEP_PERIOD = FETCH_ITER_US + tracegen.step_us()
LAST_STEP = FETCH_ITER_US + tracegen.step_us() - tracegen.GAP_US
SLOW = {(1, 0, 2): 500, (3, 1, 1): 900}


@pytest.fixture(scope="module")
def summary(run_dir) -> Summary:
    return summarize(run_dir)


def _row(rows, **match):
    found = [r for r in rows if all(r[k] == v for k, v in match.items())]
    assert len(found) == 1, found
    return found[0]


def test_category_table_counts_totals_and_percentiles(summary):
    """Per (cat, name): exact count, total, mean and nearest-rank percentiles."""
    n = RANKS * EPOCHS * STEPS
    forward = _row(summary.categories, cat="compute", name="forward")
    assert (forward["count"], forward["total_us"], forward["mean_us"]) == (n, n * FORWARD_US, FORWARD_US)
    backward = _row(summary.categories, cat="compute", name="backward")
    assert backward["total_us"] == n * BACKWARD_US + sum(SLOW.values())
    # 30 calls of 200 us, one of 700, one of 1100: p95 is the 31st smallest.
    assert (backward["p50_us"], backward["p95_us"], backward["max_us"]) == (200, 700, 1100)


def test_categories_are_listed_in_pipeline_order(summary):
    """The table groups names by category: pipeline, compute, data, dataloader, comm, ..."""
    cats = list(dict.fromkeys(r["cat"] for r in summary.categories))
    assert cats == ["pipeline", "compute", "data", "dataloader", "comm", "device", "checkpoint"]


def test_percentiles_use_the_nearest_rank(tmp_path):
    """Durations 1..100 have p50 50 and p95 95."""
    proc = tracegen.Process(1, rank=0)
    for i in range(1, 101):
        proc.span("op", "compute", tracegen.T0_US + 1000 * i, i)
    stats = _row(summarize(tracegen.write_process(tmp_path, proc)).categories, name="op")
    assert (stats["min_us"], stats["p50_us"], stats["p95_us"], stats["max_us"]) == (1, 50, 95, 100)


def test_duration_histograms_count_each_span_in_its_bar(tmp_path):
    """Durations clustered finer than the sketch keeps them (2,000-2,004 µs), spread
    over a wide range, and exact below a millisecond: every span is counted in the bar
    its duration falls in (the bars' edges as the answer gives them)."""
    import bisect
    import random

    rng = random.Random(5)
    narrow = [2000] * 77 + [2001] * 40 + [2002] * 2 + [2004]
    wide = [rng.randrange(1, 900) for _ in range(300)] + [rng.randrange(1100, 400_000) for _ in range(300)]
    proc = tracegen.Process(1, rank=0)
    t = tracegen.T0_US
    for name, durations in (("narrow", narrow), ("wide", wide)):
        for dur in durations:
            proc.span(name, "compute", t, dur)
            t += 500_000
    histograms = {d["name"]: d for d in summarize(tracegen.write_process(tmp_path, proc), index=False).distributions}
    for name, durations in (("narrow", narrow), ("wide", wide)):
        edges = histograms[name]["edges_us"]
        truth = [0] * (len(edges) - 1)
        for dur in durations:
            truth[bisect.bisect_right(edges, dur) - 1] += 1
        assert histograms[name]["counts"] == truth, name
    assert 12 <= len(histograms["wide"]["counts"]) <= 24  # log-spaced bars over the range


@pytest.mark.parametrize("style", ["iter", "with"])
def test_epochs_are_numbered_as_the_loop_numbers_them(tmp_path, style):
    """A loop resumed at epoch 5 (``ai.pipeline.epoch.iter(range(5, 8))``, or a ``with``
    epoch span per epoch) that calls ``ai.update(epoch=..., step=...)``: the epochs are
    5, 6 and 7 with their steps and their times, not the spans' own count (0 to 2, with
    no steps) or their sticky epoch (the one before)."""
    import time

    from dftrace import ai, testing

    truth_us = []
    with testing.trace_to(tmp_path / "trace") as result:
        def epoch_body(epoch):
            for step in ai.dataloader.fetch.iter(range(4)):
                ai.update(epoch=epoch, step=step)
                with ai.compute.forward:
                    time.sleep(0.002 * (epoch - 4))

        for epoch in (ai.pipeline.epoch.iter(range(5, 8)) if style == "iter" else range(5, 8)):
            began = time.perf_counter_ns()
            if style == "iter":
                epoch_body(epoch)
            else:
                with ai.pipeline.epoch:
                    epoch_body(epoch)
            truth_us.append((time.perf_counter_ns() - began) / 1000)
    summary = summarize(result.paths, index=False)
    assert [(e["epoch"], e["steps"]) for e in summary.epochs] == [(5, 4), (6, 4), (7, 4)]
    for mine, truth in zip([e["max_us"] for e in summary.epochs], truth_us, strict=True):
        assert 0.9 * truth - 200 <= mine <= truth + 200, (summary.epochs, truth_us)


def test_epochs_numbered_only_by_update_take_in_their_loaders_start_and_end(tmp_path):
    """No epoch spans, ``ai.update(epoch=..., step=...)`` in the loop body, and a loader
    that starts its workers at each pass's first batch and shuts them down at its end:
    that first fetch ran before the update, so it carries the epoch before. Each epoch
    was the previous one's start-up plus its own body, and the last epoch lost both its
    start-up and its end (a third of its time). Each is its own loop's time now."""
    import time

    from dftrace import ai, testing

    class Loader:
        """Per pass: 30 ms to start its workers, 4 batches of 2 ms, 20 ms to end."""

        def __iter__(self):
            time.sleep(0.03)
            for batch in range(4):
                time.sleep(0.002)
                yield batch
            time.sleep(0.02)

    truth_us = []
    with testing.trace_to(tmp_path / "trace") as result:
        step = 0
        for epoch in range(3):
            began = time.perf_counter_ns()
            for _ in ai.dataloader.fetch.iter(Loader()):
                ai.update(epoch=epoch, step=step)
                with ai.compute.forward:
                    time.sleep(0.002)
                step += 1
            truth_us.append((time.perf_counter_ns() - began) / 1000)
    summary = summarize(result.paths, index=False)
    assert [(e["epoch"], e["steps"]) for e in summary.epochs] == [(0, 4), (1, 4), (2, 4)]
    for mine, truth in zip([e["max_us"] for e in summary.epochs], truth_us, strict=True):
        assert 0.85 * truth - 1000 <= mine <= truth + 200, (summary.epochs, truth_us)


def test_a_later_phase_s_epochs_numbered_on_are_epochs_of_their_own(tmp_path):
    """Pre-training then fine-tuning in one process: epoch spans numbered by their args
    (an integration's), then a loop of your own numbering its epochs on (2 and 3). The
    loop's spans were taken for the first phase's epochs of the same count (0 and 1):
    two epochs, each with both phases' spans. They are four, each with its own steps."""
    from dftrace import ai, testing

    def steps(epoch, first):
        for step in ai.dataloader.fetch.iter(range(first, first + 3)):
            ai.update(epoch=epoch, step=step)
            with ai.compute.forward:
                pass

    with testing.trace_to(tmp_path / "trace") as result:
        for epoch in range(2):
            with ai.pipeline.epoch(args={"epoch": epoch}):
                steps(epoch, 3 * epoch)
        for epoch in ai.pipeline.epoch.iter(range(2, 4)):
            steps(epoch, 6 + 3 * (epoch - 2))
        for epoch in ai.pipeline.epoch.iter(range(4, 6)):  # and another loop after it
            steps(epoch, 12 + 3 * (epoch - 4))
    summary = summarize(result.paths, index=False)
    assert [(e["epoch"], e["spans"], e["steps"]) for e in summary.epochs] == [(k, 1, 3) for k in range(6)]


def test_epoch_table_names_the_slowest_rank(summary):
    """Each epoch: ranks, steps, slowest rank's time and the median rank's."""
    epoch_us = STEPS * (FETCH_ITER_US + tracegen.step_us()) + CHECKPOINT_US
    first = _row(summary.epochs, epoch=0)
    assert (first["ranks"], first["steps"], first["slowest"]) == (RANKS, STEPS, "rank 1")
    assert (first["median_us"], first["max_us"]) == (epoch_us, epoch_us + 500)


def test_step_table_finds_stragglers(summary):
    """A slow step shows its slowest rank, the median and their ratio."""
    step = _row(summary.steps, epoch=0, step=2)
    assert (step["slowest"], step["median_us"], step["max_us"]) == ("rank 1", STEP_PERIOD, STEP_PERIOD + 500)
    assert step["imbalance"] == pytest.approx((STEP_PERIOD + 500) / STEP_PERIOD, abs=1e-3)
    even = _row(summary.steps, epoch=0, step=0)
    assert even["imbalance"] == 1.0 and even["min_us"] == even["max_us"] == STEP_PERIOD
    last = _row(summary.steps, epoch=0, step=STEPS - 1)
    assert last["min_us"] == last["max_us"] == LAST_STEP


def test_imbalance_ranks_worst_steps_and_slowest_ranks(summary):
    """The worst step comes first; each rank counts the steps it was slowest in."""
    imbalance = summary.imbalance
    assert imbalance["steps_compared"] == EPOCHS * STEPS
    assert [(w["epoch"], w["step"], w["slowest"]) for w in imbalance["worst"]] == [(1, 1, "rank 3"), (0, 2, "rank 1")]
    ratios = [1.0] * 6 + [(STEP_PERIOD + 500) / STEP_PERIOD, (STEP_PERIOD + 900) / STEP_PERIOD]
    assert imbalance["mean_ratio"] == pytest.approx(sum(ratios) / len(ratios), abs=1e-3)
    slowest = {r["rank"]: r["slowest_count"] for r in imbalance["ranks"]}
    assert slowest == {"rank 0": 0, "rank 1": 1, "rank 2": 0, "rank 3": 1}


def test_step_stats_cover_every_rank_step(summary):
    """Step time statistics run over all (rank, step) pairs."""
    stats = summary.step_stats
    assert stats["count"] == RANKS * EPOCHS * STEPS
    assert (stats["min_us"], stats["p50_us"], stats["max_us"]) == (LAST_STEP, STEP_PERIOD, STEP_PERIOD + 900)


def test_breakdown_measures_busy_exclusive_and_overlap(summary):
    """Busy time is the union of a group's spans; preprocessing overlaps the forward pass."""
    steps = EPOCHS * STEPS
    groups = {g["group"]: g for g in summary.breakdown["groups"]}
    compute = RANKS * steps * (FORWARD_US + BACKWARD_US + OPTIMIZER_US) + sum(SLOW.values())
    data = RANKS * steps * (FETCH_ITER_US + PREPROCESS_US)
    # The loader thread's preprocess starts with forward and runs 150 us: forward
    # (100), the gap after it (5, idle) and the first 45 us of backward.
    overlap = RANKS * steps * (PREPROCESS_US - tracegen.GAP_US)
    assert (groups["compute"]["busy_us"], groups["data"]["busy_us"]) == (compute, data)
    assert groups["compute"]["overlapped_us"] == groups["data"]["overlapped_us"] == overlap
    assert groups["comm"]["busy_us"] == groups["comm"]["exclusive_us"] == RANKS * steps * ALL_REDUCE_US
    assert groups["checkpoint"]["busy_us"] == RANKS * EPOCHS * CHECKPOINT_US
    assert groups["device"]["busy_us"] == RANKS * steps * TRANSFER_US
    assert summary.breakdown["pairs"] == [{"a": "compute", "b": "data", "overlap_us": overlap}]


def test_the_vocabulary_in_capitals_is_its_group(tmp_path):
    """A DFTracer program's categories in capitals (``dft_fn("COMPUTE")``) are the
    vocabulary's groups: they read as idle time before."""
    proc = tracegen.Process(1, "node0", 0)
    t0 = tracegen.T0_US
    proc.span("step", "COMPUTE", t0, 300)
    proc.span("save", "CHECKPOINT", t0 + 400, 200)
    proc.span("mine", "IO", t0 + 700, 100)  # a category of its own: not a group
    tracegen.write_process(tmp_path, proc)
    groups = {g["group"]: g["busy_us"] for g in summarize(tmp_path, index=False).breakdown["groups"]}
    assert groups["compute"] == 300 and groups["checkpoint"] == 200
    assert sum(groups.values()) == 500


def test_breakdown_adds_up_to_process_time(summary):
    """Per process, exclusive + overlapped + idle time equals the process's wall time."""
    for proc in summary.breakdown["processes"]:
        union = sum(proc["exclusive_us"].values())
        overlap = sum(proc["busy_us"].values()) - union
        # Two groups overlap here, so each overlapping microsecond is counted twice in busy.
        assert union + overlap // 2 + proc["idle_us"] == proc["wall_us"]
    rank0 = summary.breakdown["processes"][0]
    assert rank0["idle_us"] == EPOCHS * STEPS * 4 * tracegen.GAP_US + tracegen.GAP_US


def test_dataloader_stall_compares_iter_and_block(summary):
    """Stall is the share of loop time spent in fetch.iter rather than fetch.block."""
    loader = _row(summary.dataloader, cat="dataloader", loader="fetch")
    n = RANKS * EPOCHS * STEPS
    iter_us = n * FETCH_ITER_US
    block_us = n * tracegen.step_us() + sum(SLOW.values())
    assert (loader["items"], loader["iter_us"], loader["block_us"]) == (n, iter_us, block_us)
    assert loader["stall"] == pytest.approx(iter_us / (iter_us + block_us), abs=1e-3)
    assert loader["ranks"][0]["rank"] in {"rank 0", "rank 2"}  # the ranks that never straggled


def test_overview_counts_processes_ranks_and_hosts(summary):
    """The overview counts files, processes, ranks, hosts and events."""
    o = summary.overview
    per_process = len(tracegen.training_process(1000).events)
    assert (o["files"], o["processes"], o["ranks"], o["hosts"]) == (4, 4, 4, 2)
    assert o["events"] == o["spans"] == RANKS * per_process
    assert o["broken_lines"] == o["cut_off_files"] == o["unfinished_files"] == 0


def test_damage_is_counted_in_the_overview(tmp_path):
    """Cut-off files, unfinished files, incomplete spans and dropped events are counted."""
    proc = tracegen.training_process(1000, rank=0)
    proc.span("hung", "compute", tracegen.T0_US, 10, incomplete=True)
    dropped = orjson.dumps({"name": "dropped", "cat": "dftrace", "ph": "M", "pid": 1000, "tid": 1000,
                            "args": {"count": 7}})
    tracegen.write_process(tmp_path, proc, extra_lines=[dropped], finalize=False)
    tracegen.write_process(tmp_path, tracegen.training_process(1001, rank=1), cut="frame")
    o = summarize(tmp_path).overview
    assert (o["broken_lines"], o["cut_off_files"], o["unfinished_files"]) == (1, 1, 2)
    assert (o["incomplete_spans"], o["dropped_events"]) == (1, 7)


def test_split_partitions_combine_exactly(run_dir):
    """Summaries of files cut into many partitions equal those of whole files."""
    whole = summarize(run_dir).to_dict()
    split = summarize(run_dir, partition_bytes=600).to_dict()
    assert split["overview"].pop("partitions") > whole["overview"].pop("partitions")
    for f in split["files"] + whole["files"]:
        f.pop("partitions")
    assert split == whole


def test_summary_of_a_loaded_trace_matches_the_files(run_dir):
    """summarize(trace) and summarize(paths) give the same answers."""
    from_files = summarize(run_dir).to_dict()
    from_trace = summarize(load_traces(run_dir)).to_dict()
    for key in ("overview", "files"):
        from_files.pop(key), from_trace.pop(key)
    assert from_trace == from_files


def test_json_round_trip(summary):
    """A summary survives to_json / from_dict unchanged."""
    assert Summary.from_dict(orjson.loads(summary.to_json())) == summary


def test_rank_steps_are_sampled_beyond_the_limit(run_dir, monkeypatch):
    """Past RANK_STEPS_LIMIT the per-rank step rows keep every rank of evenly spaced
    steps and of the slowest step, and say so; the step charts' axes say it too."""
    monkeypatch.setattr(summary_module, "RANK_STEPS_LIMIT", 8)
    s = summarize(run_dir)
    assert s.rank_steps_sampled
    steps = {(r["epoch"], r["step"]) for r in s.rank_steps}
    assert len(s.rank_steps) == RANKS * len(steps) <= 8 + RANKS
    thinned = s.rank_steps_thinned
    assert thinned["steps"] == EPOCHS * STEPS and thinned["slowest"] == 1
    assert len(steps) <= -(-EPOCHS * STEPS // thinned["every"]) + 1
    slowest = max(s.steps, key=lambda r: r["max_us"])
    assert (slowest["epoch"], slowest["step"]) in steps
    from dftrace.analysis import figures

    axis = figures.step_times(s).layout.xaxis.title.text
    assert f"(every {thinned['every']}" in axis and f"of {EPOCHS * STEPS} steps, and the slowest 1)" in axis
    # each kept row as the whole table has it, its wait included
    monkeypatch.undo()
    every = summarize(run_dir).rank_steps
    assert len(every) == RANKS * EPOCHS * STEPS
    assert s.rank_steps == [r for r in every if (r["epoch"], r["step"]) in steps]
    assert any(r["wait_us"] for r in s.rank_steps)


def test_steps_are_thinned_beyond_the_limit(run_dir, monkeypatch):
    """Past STEPS_LIMIT the per-step table keeps every Nth step and the slowest, each
    as the whole table has it, and says so; the step count and the statistics are
    those of every step."""
    from dftrace.analysis import render_text
    from dftrace.analysis.answers import steps as steps_module

    every = summarize(run_dir, index=False)
    monkeypatch.setattr(steps_module, "STEPS_LIMIT", 6)
    s = summarize(run_dir, index=False)
    thinned = s.steps_thinned
    assert thinned["steps"] == EPOCHS * STEPS == s.step_count() and thinned["slowest"] == 1
    assert every.steps_thinned == {} and every.step_count() == EPOCHS * STEPS
    kept = [r for i, r in enumerate(every.steps) if i % thinned["every"] == 0]
    slowest = max(every.steps, key=lambda r: r["max_us"])
    assert s.steps == [r for r in every.steps if r in kept or r is slowest]
    assert s.step_stats == every.step_stats and s.rank_steps == every.rank_steps
    assert f"Steps: {EPOCHS * STEPS} steps, " in render_text(s)
    assert Summary.from_dict(orjson.loads(s.to_json())).step_count() == EPOCHS * STEPS


def test_processes_are_the_units_when_no_rank_is_known(samples):
    """Without ranks (DFTracer), each process is its own unit; processes of separate
    runs (these two were ten minutes apart) are not compared as ranks."""
    s = summarize([samples / "dftracer-2.0.3" / "toy.pfw.gz", str(samples / "dftracer-2.2.0_meta" / "*.pfw.gz")])
    assert s.overview["ranks"] == 0
    assert {r["rank"] for r in s.rank_steps} == {"vm · pid 25021", "vm · pid 22426"}
    assert len(s.runs) == 2 and s.imbalance["steps_compared"] == 0 and s.imbalance["ranks"] == []
    assert _row(s.categories, cat="comm", name="send")["count"] == 3


def test_progress_names_every_phase_when_asked(run_dir, capsys, monkeypatch):
    """progress=True (on a terminal, the default) draws a line on stderr for each
    phase that lasts: reading the files (parts done of all), combining the parts,
    building the answers; each is gone when its phase ends."""
    from dftrace.analysis.runtime import progress as _progress

    monkeypatch.setattr(_progress, "DELAY_S", 0)
    files = len(list(run_dir.iterdir()))
    summarize(run_dir, progress=True, index=False)
    err = capsys.readouterr().err
    assert f"reading {files} files: " in err and f"/{files} parts" in err
    assert "combining the parts [" in err and "building the answers [" in err
    assert err.index("reading") < err.index("combining") < err.index("building")


def test_a_phase_that_counts_nothing_still_ticks(capsys, monkeypatch):
    """A phase without anything to count is redrawn while it lasts, its elapsed time
    moving: a long step model is never a blank screen."""
    import time

    from dftrace.analysis.runtime import progress as _progress

    monkeypatch.setattr(_progress, "DELAY_S", 0)
    monkeypatch.setattr(_progress, "_TICK_S", 0.05)
    drawn = []
    with _progress.phase("modelling", True):
        deadline = time.monotonic() + 30
        while len(drawn) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
            drawn = [line for line in capsys.readouterr().err.split("\r") if "modelling [" in line] + drawn
    assert len(drawn) >= 3


def test_no_progress_output_off_a_terminal(run_dir, capsys):
    """Without a terminal, loading prints nothing to stderr."""
    summarize(run_dir)
    assert capsys.readouterr().err == ""


def test_dataloader_workers_are_named_after_their_rank(tmp_path):
    """Traced children of a rank's process (DataLoader workers, which carry no rank)
    are "worker k of rank r", k in start order; a worker that recorded its id keeps it."""
    main = tracegen.Process(3000, rank=1)
    main.span("forward", "compute", tracegen.T0_US, 100, step=0)
    workers = [tracegen.Process(pid, rank=None, ppid=3000) for pid in (3007, 3005)]
    for w in workers:
        w.span("item", "data", tracegen.T0_US, 10)
    named = tracegen.Process(3009, rank=None, ppid=3000)
    named.span("item", "data", tracegen.T0_US, 10)
    named.events.insert(0, {"name": "CM", "cat": "dftrace", "pid": 3009, "tid": 3009, "ph": "M",
                            "args": {"name": "dataloader.worker", "value": "7"}})
    for p in (main, *workers, named):
        tracegen.write_process(tmp_path, p)
    labels = [p["label"] for p in summarize(tmp_path).processes]
    assert labels == ["rank 1 · node0 · pid 3000", "worker 0 of rank 1 · node0 · pid 3005",
                      "worker 1 of rank 1 · node0 · pid 3007", "worker 7 of rank 1 · node0 · pid 3009"]


def test_epoch_table_counts_the_steps_of_iter_numbered_epochs(tmp_path):
    """Epochs numbered by ai.pipeline.epoch.iter() and steps that carry no epoch: each
    epoch's row counts the steps that start inside its span."""
    proc = tracegen.Process(3100, rank=0)
    t = tracegen.T0_US
    for epoch in range(2):
        begin = t
        for step in range(3):
            proc.span("forward", "compute", t, 100, level=2, step=epoch * 3 + step)
            t += 200
        proc.span("epoch.block", "pipeline", begin, t - begin, level=1, count=epoch + 1)
        t += 50
    tracegen.write_process(tmp_path, proc)
    summary = summarize(tmp_path)
    assert [(e["epoch"], e["steps"]) for e in summary.epochs] == [(0, 3), (1, 3)]
    assert summary.step_stats["count"] == 6


@pytest.mark.parametrize("procs_in_turn", [False, True], ids=["processes-interleaved", "processes-in-turn"])
def test_time_in_steps_counts_each_process_interval_once_in_any_order(procs_in_turn):
    """The time of each unit's processes' intervals inside each of its steps, against a
    count made here, microsecond by microsecond: intervals given out of order, a unit
    of two processes (their times add up), a process without a unit left out, a
    unit's steps apart in the table, a unit without intervals (0); the processes' rows
    taken in turn or interleaved. One figure per row of the steps, in their order."""
    import polars as pl

    from dftrace.analysis.reduce.busy import time_in_steps

    procs = pl.DataFrame({"proc": [0, 1, 2, 3], "unit": ["rank 0", "rank 0", "rank 1", None]},
                         schema={"proc": pl.Int32, "unit": pl.String})
    steps = pl.DataFrame({"unit": ["rank 0", "rank 1", "rank 0", "rank 1", "rank 2"], "epoch": [0, 0, 0, 0, 0],
                          "step": [1, 1, 2, 2, 1], "start": [0, 10, 50, 30, 0], "end": [50, 30, 120, 90, 100]})
    rows = [(2, 25, 40), (0, 60, 70), (3, 0, 1000), (0, 5, 20), (1, 45, 100), (2, 0, 12), (0, 40, 55),
            (2, 70, 95)]
    if procs_in_turn:
        rows.sort(key=lambda row: row[0])
    intervals = pl.DataFrame(rows, schema={"proc": pl.Int32, "start": pl.Int64, "end": pl.Int64}, orient="row")
    unit_of = dict(zip(procs["proc"], procs["unit"]))
    expected = [
        sum(1 for proc, s, e in rows if unit_of[proc] == unit for t in range(s, e) if start <= t < end)
        for unit, _, _, start, end in steps.iter_rows()
    ]
    assert expected[-1] == 0 and min(expected[:-1]) > 0
    assert time_in_steps(intervals, procs, steps).tolist() == expected


def test_steps_numbered_by_iter_epochs_show_their_epoch_everywhere(tmp_path):
    """A loop whose epochs are only ``ai.pipeline.epoch.iter`` spans and whose steps
    carry ``step`` alone: the longest-steps table shows each step's epoch, as the
    epochs table counts them."""
    import time

    from dftrace import ai, testing

    with testing.trace_to(tmp_path / "t"):
        k = 0
        for _epoch in ai.pipeline.epoch.iter(range(2)):
            for _ in ai.dataloader.fetch.iter(range(5)):
                ai.update(step=k)
                with ai.compute.forward:
                    time.sleep(0.0005)
                k += 1
    summary = summarize(tmp_path / "t")
    assert sorted((s["epoch"], s["step"]) for s in summary.steps) == [(k // 5, k) for k in range(10)]
    assert [(e["epoch"], e["steps"]) for e in summary.epochs] == [(0, 5), (1, 5)]
    assert {(r["epoch"], r["step"]) for r in summary.rank_steps} == {(k // 5, k) for k in range(10)}


def test_a_summary_prints_as_a_line_and_shows_as_tables_in_a_notebook():
    """repr is one short line with what was read, the steps and the straggler; the
    notebook form holds that line and the steps, time and straggler tables."""
    from pathlib import Path

    summary = summarize(Path(__file__).resolve().parents[1] / "data" / "ddp-run")
    line = repr(summary)
    assert "\n" not in line and len(line) < 300
    assert line.startswith("<Summary: 2 processes (2 ranks, 1 host), 5,910 events over ")
    # 64 steps of 2 ranks each (the line said "128 steps": the rank-steps)
    assert "; 64 steps (128 rank-steps), median " in line and "rank 1 holds the others back" in line
    page = summary._repr_html_()
    assert page.count("<table>") == 3 and "<td>64</td><td>128</td>" in page and "<td>rank 1</td>" in page
    assert repr(type(summary).from_dict(summary.to_dict())) == line


@needs("native", native_engine_missing())
def test_the_summary_counts_the_spans_open_at_sigkill(tmp_path):
    """The summary of a run killed (SIGKILL) with five spans open says so."""
    import json
    import subprocess
    import sys

    from reliability._util import clean_env
    from reliability.test_exits import killed_with_spans_open

    path = killed_with_spans_open(tmp_path)
    out = subprocess.run([sys.executable, "-m", "dftrace", "summary", "--json", "--no-index", path],
                         capture_output=True, text=True, timeout=120, env=clean_env())
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["overview"]["incomplete_spans"] == 5
