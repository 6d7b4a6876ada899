"""The step model against the loop's own clock: where each batch's wait goes (the first
batch, an epoch's first, a batch fetched after an evaluation, under gradient
accumulation, where only the compute spans carry step numbers), how steps end at an
epoch's end or around untraced steps, and how epoch spans are numbered."""

from __future__ import annotations

import pytest
import tracegen

pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from dftrace.analysis import summarize  # noqa: E402
from dftrace.analysis.runtime import kernels  # noqa: E402


def test_the_first_batch_wait_is_in_the_first_step(tmp_path):
    """DFTracer's loop (``fetch.iter(enumerate(loader))``, then ``update(epoch=, step=)``):
    the run's first fetch comes before any step number, yet it is the first step's wait
    (a DataLoader's workers starting: the longest of all). Each step, by the loop's own
    clock, from one fetch to the next."""
    import time

    from dftrace import ai, testing

    def loader():
        for i in range(6):
            time.sleep(0.04 if i == 0 else 0.001)
            yield i

    truth_us = []
    with testing.trace_to(tmp_path / "trace") as result:
        for epoch in ai.pipeline.epoch.iter(range(2)):
            began = time.perf_counter_ns()
            for step, _ in ai.dataloader.fetch.iter(enumerate(loader())):
                ai.update(epoch=epoch, step=step)
                with ai.compute.forward:
                    time.sleep(0.002)
                now = time.perf_counter_ns()
                truth_us.append((now - began) / 1000)
                began = now
    summary = summarize(result.paths, index=False)
    assert [(s["epoch"], s["step"]) for s in summary.steps] == [(e, k) for e in range(2) for k in range(6)]
    mine = [s["max_us"] for s in summary.steps]
    # A step's edges are a few µs from the loop's clock readings (a busy machine moves
    # time between neighbours, never out of the epoch).
    for epoch in range(2):
        ours, theirs = sum(mine[epoch * 6:][:6]), sum(truth_us[epoch * 6:][:6])
        assert 0.98 * theirs - 500 <= ours <= theirs + 100, (summary.steps, truth_us)
    assert mine[0] > 40_000 and mine[0] >= 0.9 * truth_us[0], (mine, truth_us)


@pytest.mark.parametrize("evaluation_fetches", [False, True])
def test_the_fetch_after_an_evaluation_is_the_next_steps_wait(tmp_path, evaluation_fetches):
    """An evaluation every 3 steps (``pipeline.evaluate``, with or without fetches of its
    own, through a node of its own): the batch fetched after it (carrying the last
    step's number) is the next step's wait, every step about 15 ms (10 ms to load, 5 to
    train); the evaluation's own fetches are no step's. (Was 5 ms, its fetch in no step.)"""
    import time

    from dftrace import ai, testing

    fetched, evaluated = [], {}  # the loop's own clock: each training fetch's start, each evaluation's

    def loader(n, seconds, marks):
        for i in range(n):
            marks.append(time.perf_counter_ns())
            time.sleep(seconds)
            yield i

    evaluation = ai.dataloader.fetch.derive("evaluation")
    with testing.trace_to(tmp_path / "trace") as result:
        for step in ai.dataloader.fetch.iter(loader(8, 0.010, fetched)):
            ai.update(epoch=0, step=step)
            with ai.compute.forward:
                time.sleep(0.005)
            if step % 3 == 2:
                evaluated[step] = time.perf_counter_ns()
                with ai.pipeline.evaluate:
                    for _ in (evaluation.iter(loader(3, 0.004, [])) if evaluation_fetches else ()):
                        pass
                    time.sleep(0.002)
    summary = summarize(result.paths, index=False)
    mine = {s["step"]: s["max_us"] for s in summary.steps}
    assert sorted(mine) == list(range(8))
    # Steps 0 to 6 run from their fetch to the next one's, or to the evaluation after
    # them; the last ends with its own work.
    for k in range(7):
        truth = (evaluated.get(k, fetched[k + 1]) - fetched[k]) / 1e3
        assert abs(mine[k] - truth) <= 0.1 * truth + 1_000, (k, mine, truth)


@pytest.mark.parametrize("body", ["block", "yield"])
def test_a_loop_bodys_span_is_a_container_by_either_name(tmp_path, body):
    """A loop's item waits (``fetch.iter``) and bodies: ``fetch.block`` from ``.iter()``,
    ``fetch.yield`` from DFTracer's ``dft_fn.iter``. Either way the body is the loop's
    use of the item: the stall is waits / (waits + bodies), and the body is no data
    loading in the breakdown (a .yield body read as 100 % stall and all data loading)."""
    proc = tracegen.Process(1, "node0", 0)
    t = tracegen.T0_US
    for count in range(1, 6):
        proc.span("fetch.iter", "dataloader", t, 1_000, count=count)
        proc.span(f"fetch.{body}", "dataloader", t + 1_000, 10_000, count=count)
        proc.span("forward", "compute", t + 1_500, 9_000, level=2)
        t += 11_000
    tracegen.write_process(tmp_path, proc)
    summary = summarize(tmp_path, index=False)
    (loop,) = summary.dataloader
    assert (loop["loader"], loop["iter_us"], loop["block_us"]) == ("fetch", 5_000, 50_000)
    assert loop["stall"] == pytest.approx(5_000 / 55_000, abs=1e-3)
    groups = {g["group"]: g["busy_us"] for g in summary.breakdown["groups"]}
    assert (groups["data"], groups["compute"]) == (5_000, 45_000)


@pytest.mark.parametrize("numbering", ["global", "per_epoch", "accumulated"])
def test_steps_by_the_loops_own_clock_across_epochs(tmp_path, numbering):
    """``ai.update(epoch=e)`` before each epoch's loop and ``ai.update(step=...)`` in it,
    steps numbered on across epochs, anew in each, or stepped every second micro-batch
    (gradient accumulation): each step runs from its (first) batch's fetch to the next
    step's, the last of an epoch to its own work's end, and is in its own epoch. (The
    last step of epoch 0 was put in epoch 1, the first fetch of an epoch numbered anew
    was in no step, and each step took the next one's first fetch.)"""
    import time

    from dftrace import ai, testing

    per_step = 2 if numbering == "accumulated" else 1
    fetched, truth = [], []  # each fetch's start; (epoch, step, start, end) by the loop's clock

    def batches(n):
        for i in range(n):
            fetched.append(time.perf_counter_ns())
            time.sleep(0.002 + 0.001 * i)
            yield i

    step = 0
    with testing.trace_to(tmp_path / "trace") as result:
        for epoch in range(2):
            ai.update(epoch=epoch)
            for k, _ in enumerate(ai.dataloader.fetch.iter(batches(4 * per_step))):
                if k % per_step == 0:
                    if truth and truth[-1][0] == epoch:
                        truth[-1][3] = fetched[-1]
                    number = k // per_step if numbering == "per_epoch" else step
                    truth.append([epoch, number, fetched[-1], None])
                    ai.update(step=number)
                with ai.compute.forward:
                    time.sleep(0.004)
                if k % per_step == per_step - 1:
                    with ai.compute.step:
                        time.sleep(0.001)
                    truth[-1][3] = time.perf_counter_ns()
                    step += 1
    summary = summarize(result.paths, index=False)
    mine = {(s["epoch"], s["step"]): s["max_us"] for s in summary.steps}
    assert sorted(mine) == sorted((e, s) for e, s, _, _ in truth), mine
    for epoch, number, began, ended in truth:
        expected = (ended - began) / 1e3
        assert abs(mine[(epoch, number)] - expected) <= 0.1 * expected + 1_000, (epoch, number, mine, truth)


def test_steps_numbered_without_epochs_end_with_their_epoch_loop(tmp_path):
    """Steps numbered by the compute spans alone (``args={"step": n}``, as
    ``trace_compute()`` numbers them), in a loop over ``ai.pipeline.epoch.iter(...)``
    whose epochs end with a wait in no span (a DataLoader's workers shutting down):
    the last step of an epoch ends with its own work, not at the next epoch's start
    (it held the 30 ms wait)."""
    import time

    from dftrace import ai, testing

    with testing.trace_to(tmp_path / "trace") as result:
        for epoch in ai.pipeline.epoch.iter(range(2)):
            for k in ai.dataloader.fetch.iter(range(3)):
                with ai.compute.forward(args={"step": 3 * epoch + k}):
                    time.sleep(0.003)
            time.sleep(0.03)
    summary = summarize(result.paths, index=False)
    assert [(s["epoch"], s["step"]) for s in summary.steps] == [(k // 3, k) for k in range(6)]
    assert all(s["max_us"] < 20_000 for s in summary.steps), summary.steps


def test_spans_after_the_loop_that_carry_its_last_step_do_not_lengthen_it(tmp_path, monkeypatch):
    """``ai.update(epoch=, step=)`` in the loop body, then a checkpoint and a metric
    computed after the loop, still carrying the last step's number (nothing updates it):
    the epoch's last step ends where its loader's pass ends, as long as by the loop's
    own clock (it held the 50 ms after the loop: about 58 ms for 8)."""
    import time

    from dftrace import ai, testing

    truth_us = []
    with testing.trace_to(tmp_path / "trace") as result:
        for epoch in range(2):
            began = time.perf_counter_ns()
            for step, _ in ai.dataloader.fetch.iter(enumerate(range(4))):
                ai.update(epoch=epoch, step=step)
                with ai.compute.forward:
                    time.sleep(0.008)
                now = time.perf_counter_ns()
                truth_us.append((now - began) / 1000)
                began = now
            with ai.checkpoint.capture:
                time.sleep(0.03)
            with ai.compute.forward:
                time.sleep(0.02)
    summary = summarize(result.paths, index=False)
    assert [(s["epoch"], s["step"]) for s in summary.steps] == [(e, k) for e in range(2) for k in range(4)]
    mine = [s["max_us"] for s in summary.steps]
    for ours, theirs in zip(mine, truth_us):
        assert 0.9 * theirs - 500 <= ours <= theirs + 1_000, (mine, truth_us)
    # The same steps from numpy's model.
    monkeypatch.setattr(kernels, "C", None)
    assert summarize(result.paths, index=False).steps == summary.steps


@pytest.mark.parametrize("epochs", ["spans", "none"])
def test_step_numbers_that_start_again_without_an_epoch_are_each_passs_steps(tmp_path, monkeypatch, epochs):
    """``ai.update(step=i)`` with ``i`` from 0 in each pass over the data and no epoch
    given, in a loop over ``ai.pipeline.epoch.iter(...)`` or over nothing: every pass's
    steps are steps of their own, each as long as by the loop's clock (the three
    passes' step 0 used to be one row spanning the run: 2 steps for 18, one of them
    the whole run). Without epoch spans each pass is numbered as an epoch."""
    import time

    from dftrace import ai, testing

    passes, per_pass = 3, 6
    truth_us = []
    with testing.trace_to(tmp_path / "trace") as result:
        for epoch in (ai.pipeline.epoch.iter(range(passes)) if epochs == "spans" else range(passes)):
            began = time.perf_counter_ns()
            for i in ai.dataloader.fetch.iter(range(per_pass)):
                ai.update(step=i)
                with ai.compute.forward:
                    time.sleep(0.002 * (1 + (i % 3)))
                now = time.perf_counter_ns()
                truth_us.append((now - began) / 1000)
                began = now
    summary = summarize(result.paths, index=False)
    assert [(s["epoch"], s["step"]) for s in summary.steps] == [
        (e, k) for e in range(passes) for k in range(per_pass)], summary.steps
    mine = [s["max_us"] for s in summary.steps]
    for ours, theirs in zip(mine, truth_us):
        assert 0.9 * theirs - 300 <= ours <= theirs + 300, (mine, truth_us)
    # The same steps from the file read in small pieces, and from numpy's model.
    assert summarize(result.paths, index=False, partition_bytes=256).steps == summary.steps
    monkeypatch.setattr(kernels, "C", None)
    assert summarize(result.paths, index=False).steps == summary.steps


@pytest.mark.parametrize("epochs", ["spans", "none"])
def test_a_validation_that_numbers_its_own_steps_makes_no_training_step(tmp_path, epochs):
    """A validation after each pass that numbers its batches (``ai.update(step=j)``
    inside ``ai.pipeline.evaluate``): its spans are no training step's work, and its
    numbers start no run of their own (21 steps for 12 without epoch spans; with
    them, each step's batch wait went to the step before). With epoch spans every
    step is as long as by the loop's own clock."""
    import time

    from dftrace import ai, testing

    passes, per_pass = 3, 4
    truth_us = []
    with testing.trace_to(tmp_path / "trace") as result:
        for epoch in (ai.pipeline.epoch.iter(range(passes)) if epochs == "spans" else range(passes)):
            for i in range(per_pass):
                began = time.perf_counter_ns()
                with ai.dataloader.fetch:
                    time.sleep(0.002)
                ai.update(step=i)
                with ai.compute.forward:
                    time.sleep(0.003 + 0.001 * i)
                truth_us.append((time.perf_counter_ns() - began) / 1000)
            with ai.pipeline.evaluate:
                for j in range(3):
                    ai.update(step=j)
                    with ai.compute.forward:
                        time.sleep(0.003)
    summary = summarize(result.paths, index=False)
    assert [(s["epoch"], s["step"]) for s in summary.steps] == [
        (e, k) for e in range(passes) for k in range(per_pass)], summary.steps
    if epochs == "spans":
        for ours, theirs in zip((s["max_us"] for s in summary.steps), truth_us):
            assert 0.9 * theirs - 300 <= ours <= theirs + 300, (summary.steps, truth_us)


def test_steps_untraced_while_switched_off_are_in_no_step(tmp_path):
    """``ai.disable()`` after step 5 and ``ai.enable()`` at step 8's end: steps 6 to 8
    are untraced, and neither step 5 nor step 9 holds their time (step 5 ran up to
    step 9's start, 4x its time). Each traced step is about the others' time."""
    import time

    from dftrace import ai, testing

    began, ended = {}, {}  # the loop's own clock: each step's body
    with testing.trace_to(tmp_path / "trace") as result:
        for step in ai.dataloader.fetch.iter(range(12)):
            began[step] = time.perf_counter_ns()
            ai.update(epoch=0, step=step)
            with ai.compute.forward:
                time.sleep(0.004)
            if step == 5:
                ai.disable()
            if step == 8:
                ai.enable()
            ended[step] = time.perf_counter_ns()
    summary = summarize(result.paths, index=False)
    mine = {s["step"]: s["max_us"] for s in summary.steps}
    assert sorted(mine) == [0, 1, 2, 3, 4, 5, 9, 10, 11]
    # The untraced steps' time (three 4 ms sleeps at least, however busy the machine)
    # is in neither neighbour: each is its own body's time and a fetch, well under half of it.
    untraced_us = (began[9] - ended[5]) / 1000
    for step in (5, 9):
        assert mine[step] < (ended[step] - began[step]) / 1000 + untraced_us / 2, (mine, untraced_us)


def test_an_epoch_span_is_numbered_by_its_events_when_its_own_number_begins_with_them():
    """An epoch span whose own ``args.epoch`` (2) is not its events' (1), its first event
    beginning in the same microsecond: both epochs' first events begin together, and
    the one its 33 events carry numbers it, every time (a tie once went either way)."""
    import polars as pl

    from dftrace.analysis.reduce.combine import numbered_as_their_events

    columns = {"proc": pl.Int32, "epoch": pl.Int64, "start": pl.Int64, "end": pl.Int64, "n": pl.UInt32}
    spans = pl.DataFrame([(0, 0, 0, 2080, 1), (0, 2, 2085, 4165, 1)], schema=columns, orient="row")
    events = pl.DataFrame([(0, 2, 2085, 4165, 1), (0, 0, 0, 2080, 34), (0, 1, 2085, 4165, 33)],
                          schema=columns, orient="row")
    for _ in range(40):
        numbered = numbered_as_their_events(spans, events).sort("epoch")
        assert numbered.select("epoch", "start").rows() == [(0, 0), (1, 2085)]
