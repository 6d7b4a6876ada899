"""Tracing a PyTorch program with no code change: ``dftrace run script.py`` and
``DFTRACE_ENABLE=1 python script.py``, checked against what the script counted on
its own clock."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("polars")

from dftrace.analysis import summarize  # noqa: E402
from dftrace.testing import read_events, trace_files  # noqa: E402

from ._dftrace_run import dftrace_run  # noqa: E402

JOB = os.path.join(os.path.dirname(__file__), "_unannotated_job.py")
BATCHES = 8  # a pass of the job's loader (its BATCHES)


def _env(**more):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DFTRACE_", "RANK", "LOCAL_RANK"))}
    env.update(more)
    return env


def _run(tmp_path, mode, how="run"):
    out, truth = tmp_path / "traces", tmp_path / "truth.json"
    if how == "run":
        cmd = [sys.executable, "-m", "dftrace", "run", "--log-file", str(out / "job"), JOB, mode, str(truth)]
        env = _env()
    else:
        cmd = [sys.executable, JOB, mode, str(truth)]
        env = _env(DFTRACE_ENABLE="1", DFTRACE_LOG_FILE=str(out / "job"))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, json.loads(truth.read_text()), done


def _run_engine(tmp_path, mode, engine):
    """``DFTRACE_ENABLE=1 python JOB MODE`` with the C engine or the pure-Python one."""
    out, truth = tmp_path / "traces", tmp_path / "truth.json"
    env = _env(DFTRACE_ENABLE="1", DFTRACE_LOG_FILE=str(out / "job"))
    if engine == "python":
        env["DFTRACE_NO_SPEEDUPS"] = "1"
    done = subprocess.run([sys.executable, JOB, mode, str(truth)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, json.loads(truth.read_text())


def _spans(out, name=None):
    return [e for f in trace_files(out) for e in read_events(f, strict=False)
            if e.get("ph") == "X" and name in (None, e.get("name"))]


@pytest.mark.parametrize("how", ["run", "enable"])
def test_an_unannotated_script_gets_steps_epochs_and_its_data_wait(tmp_path, how):
    out, truth, done = _run(tmp_path, "plain", how)
    summary = summarize(out)
    assert len(summary.steps) == truth["steps"] == 16
    assert [(e["epoch"], e["steps"]) for e in summary.epochs] == [(0, 8), (1, 8)]
    _assert_epoch_times(summary, truth)
    spans = _spans(out)
    fetches = [e for e in spans if e["name"] == "fetch"]
    assert len(fetches) == truth["steps"]
    waited_us = sum(e["dur"] for e in fetches)
    # The loop's clock holds each wait and the calls around it: on a busy machine, what
    # holds the loop between its clock read and the recorder's is the loop's alone.
    assert 0.85 * truth["fetch_ns"] / 1e3 - 1000 * len(fetches) <= waited_us <= truth["fetch_ns"] / 1e3 + 1000
    forwards = [e for e in spans if e["name"] == "forward"]
    assert len(forwards) == truth["forwards"] + 1  # and the evaluation's
    assert sum("step" not in e["args"] for e in forwards) == 1
    assert len([e for e in spans if e["name"] == "backward"]) == truth["steps"]
    assert [e["args"]["step"] for e in spans if e["name"] == "step"] == list(range(16))
    # Each step runs from its batch's wait to the next step's: the loop's own step
    # starts, within each epoch (an epoch's last step ends with its own work).
    starts = truth["starts_ns"]
    gaps = [(b - a) / 1e3 for k, (a, b) in enumerate(zip(starts, starts[1:])) if k % 8 != 7]
    ours = [s["median_us"] for s in sorted(summary.steps, key=lambda s: s["step"]) if s["step"] % 8 != 7]
    assert sum(ours) == pytest.approx(sum(gaps), rel=0.02)
    assert abs(statistics.median(a - b for a, b in zip(ours, gaps))) < 0.05 * statistics.median(gaps)
    if how == "run":
        assert "dftrace run: trace written to" in done.stderr
        assert f"next: dftrace summary {out}" in done.stderr or "next: dftrace summary" in done.stderr


@pytest.mark.parametrize("engine", ["c", "python"])
def test_an_epoch_s_last_step_ends_where_the_loop_found_its_loader_done(tmp_path, engine):
    """What a loop does after its optimizer step (untraced: a logging call) is the
    step's, the epoch's last step's too: that one ends where the loop's next ``next()``
    found the pass over, not with its last span. By the loop's own clock."""
    out, truth = _run_engine(tmp_path, "tail", engine)
    summary = summarize(out)
    steps = sorted(summary.steps, key=lambda s: s["step"])
    assert len(steps) == truth["steps"] == 16
    starts, ends = truth["starts_ns"], truth["pass_ends_ns"]
    for epoch, end in enumerate(ends):
        last = steps[8 * epoch + 7]
        assert last["median_us"] == pytest.approx((end - starts[8 * epoch + 7]) / 1e3, rel=0.1, abs=1000), last
        assert last["median_us"] > 5000  # the 5 ms after its optimizer step are in it
    # The steps before, as before: to the next one's start.
    gaps = [(b - a) / 1e3 for k, (a, b) in enumerate(zip(starts, starts[1:])) if k % 8 != 7]
    assert sum(s["median_us"] for s in steps if s["step"] % 8 != 7) == pytest.approx(sum(gaps), rel=0.02)


def test_a_backward_a_signal_ends_is_its_step_s(tmp_path):
    """SIGTERM in a backward: the backward is written, incomplete, with its step's
    args, as its end would have written it; its step holds it."""
    import signal

    out, truth = tmp_path / "traces", tmp_path / "truth.json"
    env = _env(DFTRACE_ENABLE="1", DFTRACE_LOG_FILE=str(out / "job"))
    done = subprocess.run([sys.executable, JOB, "killed", str(truth)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == -signal.SIGTERM, done.stderr[-3000:]
    assert json.loads(truth.read_text())["steps"] == 5
    (backward,) = [e for e in _spans(out, "backward") if e["args"].get("incomplete")]
    assert (backward["args"].get("step"), backward["args"].get("epoch")) == (5, 0), backward
    (step,) = [s for s in summarize(out).steps if s["step"] == 5]
    assert step["max_us"] >= backward["dur"]


@pytest.mark.parametrize("engine", ["c", "python"])
def test_a_loader_made_anew_each_epoch_numbers_the_epochs_on(tmp_path, engine):
    """A DataLoader made anew for each epoch trains from the first optimizer step of
    its iteration, with the next epoch; an evaluation loader iterated between
    epochs, with no step, does not."""
    out, truth = _run_engine(tmp_path, "fresh", engine)
    summary = summarize(out)
    assert [(e["epoch"], e["steps"]) for e in summary.epochs] == [(0, 8), (1, 8)]
    _assert_epoch_times(summary, truth)
    # The evaluation loaders' start and end carry no epoch; the training ones' do.
    ends = sorted((e for e in _spans(out) if e["name"] in ("fetch.init", "fetch.end")), key=lambda e: e["ts"])
    assert [(e["name"], e["args"].get("epoch")) for e in ends] == [
        ("fetch.init", 0), ("fetch.end", 0), ("fetch.init", None), ("fetch.end", None),
        ("fetch.init", 1), ("fetch.end", 1), ("fetch.init", None), ("fetch.end", None)]
    assert truth["steps"] == 16
    steps = [e for e in _spans(out) if e["name"] == "step"]
    assert [(e["args"]["step"], e["args"].get("epoch")) for e in steps] == [
        (k, k // 8) for k in range(16)]


@pytest.mark.parametrize("engine", ["c", "python"])
def test_a_batch_looked_at_before_training_is_no_epoch_nor_step(tmp_path, engine):
    """``next(iter(loader))`` to look at a batch, then 0.3 s of setting up, then the
    loop: the epochs are numbered from 0 as the loop counts them (the look was epoch 0,
    the loop's epochs 1 and 2), each as long as by its clock, and the first step is
    not the look's (it held the 0.3 s). Each pass's end says how many batches it gave."""
    out, truth = _run_engine(tmp_path, "peek", engine)
    summary = summarize(out)
    assert [(e["epoch"], e["steps"]) for e in summary.epochs] == [(0, 8), (1, 8)]
    _assert_epoch_times(summary, truth)
    assert [(s["epoch"], s["step"]) for s in summary.steps] == [(k // 8, k) for k in range(16)]
    starts = truth["starts_ns"]
    assert summary.steps[0]["max_us"] == pytest.approx((starts[1] - starts[0]) / 1e3, rel=0.1, abs=2000)
    ends = sorted(_spans(out, "fetch.end"), key=lambda e: e["ts"])
    assert [(e["args"].get("epoch"), e["args"]["count"]) for e in ends] == [(0, 1), (0, BATCHES), (1, BATCHES)]


def test_under_dftrace_run_the_last_evaluation_loader_s_start_is_written(tmp_path):
    """Under ``dftrace run`` the trace ends before the interpreter's exit handlers run:
    the start of the last evaluation loader, held until it is known whether it
    trains, is written as the trace ends (it was lost: 3 starts for 4 ends)."""
    out, truth, _ = _run(tmp_path, "fresh")
    ends = sorted((e for e in _spans(out) if e["name"] in ("fetch.init", "fetch.end")), key=lambda e: e["ts"])
    assert [e["name"] for e in ends] == ["fetch.init", "fetch.end"] * 4


def _assert_epoch_times(summary, truth):
    """Each epoch's time is the loop's: from making its iterator (the workers' start)
    to the end of its iteration (their shut-down), which hold most of it here."""
    ours = [e["max_us"] for e in summary.epochs]
    for mine, true_ns in zip(ours, truth["epochs_ns"], strict=True):
        assert mine == pytest.approx(true_ns / 1e3, rel=0.02, abs=500), (ours, truth["epochs_ns"])


@pytest.mark.parametrize("engine", ["c", "python"])
def test_a_loss_module_is_no_forward(tmp_path, engine):
    """``nn.MSELoss()(model(x), y)``: the loss module is called outermost as the model
    is, and is no model's forward: the forwards are the model's calls alone (they
    were twice as many)."""
    out, truth = _run_engine(tmp_path, "criterion", engine)
    forwards = _spans(out, "forward")
    assert len(forwards) == truth["forwards"] + 1  # and the evaluation's
    assert {e["args"]["module"] for e in forwards} == {"Sequential"}


@pytest.mark.parametrize("engine", ["c", "python"])
def test_two_optimizers_stepping_each_batch_are_one_step(tmp_path, engine):
    """A GAN's loop: a discriminator's optimizer step, then a generator's, each batch:
    one step a batch, the generator's work in the step of its batch."""
    out, truth = _run_engine(tmp_path, "gan", engine)
    summary = summarize(out)
    assert truth["steps"] == 16
    assert len(summary.steps) == 16
    assert [(e["epoch"], e["steps"]) for e in summary.epochs] == [(0, 8), (1, 8)]
    spans = sorted(_spans(out), key=lambda e: e["ts"])
    steps = [e for e in spans if e["name"] == "step"]
    assert [e["args"]["step"] for e in steps] == [k // 2 for k in range(32)]
    # The batch's fetch, the three forwards (the discriminator's, then the generator's
    # and the discriminator's on its output) and both backwards carry the batch's step.
    for name, per_step in (("fetch", 1), ("forward", 3), ("backward", 2)):
        numbers = [e["args"]["step"] for e in spans if e["name"] == name and "step" in e["args"]]
        assert numbers == [k // per_step for k in range(16 * per_step)], (name, numbers)
    _assert_epoch_times(summary, truth)


@pytest.mark.parametrize("engine", ["c", "python"])
def test_two_optimizers_with_no_loader_are_one_step_an_iteration(tmp_path, engine):
    """A GAN's loop with no DataLoader: no batch says where an iteration ends, so the
    first optimizer's steps count (the generator's work is in the next step); then a
    third optimizer alone, a new phase, counts from its second step on."""
    out, truth = _run_engine(tmp_path, "gan_tensors", engine)
    summary = summarize(out)
    assert truth["steps"] == 18
    # 12 iterations: 13 steps (the generator's work in the next step: the last one's
    # in a 13th), then the new optimizer's 6, its first two in one with that 13th (it
    # counts from its second step on): 17 for 18 iterations.
    assert len(summary.steps) == 13 + 4
    steps = [e for e in _spans(out) if e["name"] == "step"]
    assert len(steps) == 12 * 2 + 6


@pytest.mark.parametrize("engine", ["c", "python"])
def test_an_epoch_left_early_ends_when_its_workers_are_shut_down(tmp_path, engine):
    """A loop left after 4 of 8 batches (a break): its epoch ends when its iterator,
    let go, has shut its workers down (that wait is its fetch.end), as the loop's
    clock says; the next epoch is the next one."""
    out, truth = _run_engine(tmp_path, "break", engine)
    summary = summarize(out)
    assert [(e["epoch"], e["steps"]) for e in summary.epochs] == [(0, 4), (1, 4)]
    assert len(_spans(out, "fetch.end")) == 2
    _assert_epoch_times(summary, truth)


@pytest.mark.parametrize("mode", ["valmid", "valbreak", "valtensors"])
@pytest.mark.parametrize("engine", ["c", "python"])
def test_an_evaluation_inside_the_epoch_is_no_step_s_time(tmp_path, engine, mode):
    """An evaluation after the fourth step of each epoch, through a loader run to its
    end or left after two batches, or over tensors at hand (forwards in ``eval()``
    mode, no loader): each pass is a pipeline.evaluate span (on a track of its own),
    and the step it follows is its own time (it took the evaluation's too: several
    times its neighbours'; a pass left early or over tensors had no span)."""
    out, truth = _run_engine(tmp_path, mode, engine)
    summary = summarize(out)
    assert len(summary.steps) == truth["steps"] == 16
    evaluations = _spans(out, "evaluate")
    # and the job's last forward, with no gradient after its last epoch: an evaluation too
    assert len(evaluations) == 3 and {e["args"]["level"] for e in evaluations} == {1}
    assert len({e["tid"] for e in evaluations} & {e["tid"] for e in _spans(out, "forward")}) == 0
    for (began, ended), span in zip(truth["evaluations_ns"], sorted(evaluations, key=lambda e: e["ts"])):
        # (the loop's clock holds the calls around the pass: a busy machine's pauses there are its alone)
        assert span["dur"] >= 0.8 * (ended - began) / 1e3, (span, began, ended)
    starts = truth["starts_ns"]
    ours = {(s["epoch"], s["step"]): s["median_us"] for s in summary.steps}
    for epoch, (began, ended) in enumerate(truth["evaluations_ns"]):
        k = 8 * epoch + 3  # the step the evaluation follows: to the next one's start, less the evaluation
        own_us = (starts[k + 1] - starts[k] - (ended - began)) / 1e3
        assert ours[(epoch, k)] <= own_us + 0.5 * (ended - began) / 1e3, (ours[(epoch, k)], own_us)


@pytest.mark.parametrize("engine", ["c", "python"])
def test_an_evaluation_after_each_epoch_is_its_own_span(tmp_path, engine):
    """Forwards in ``eval()`` mode over tensors at hand after each epoch's last step
    (its loader run to its end): each epoch's are a pipeline.evaluate span as long as
    the loop timed them (there was none: the time was no one's), and the epochs and
    steps keep their own time."""
    out, truth = _run_engine(tmp_path, "valend", engine)
    summary = summarize(out)
    assert len(summary.steps) == truth["steps"] == 16
    evaluations = sorted(_spans(out, "evaluate"), key=lambda e: e["ts"])
    assert len(evaluations) == 2  # each epoch's (the last one's with the job's last forward: no step between)
    (began, ended), first = truth["evaluations_ns"][0], evaluations[0]
    assert 0.9 * (ended - began) / 1e3 <= first["dur"] <= (ended - began) / 1e3, (first, began, ended)
    (began, ended), last = truth["evaluations_ns"][1], evaluations[1]
    assert last["dur"] >= 0.9 * (ended - began) / 1e3, (last, began, ended)
    _assert_epoch_times(summary, truth)


@pytest.mark.parametrize("mode", ["preval", "cycleval"])
@pytest.mark.parametrize("engine", ["c", "python"])
def test_an_evaluation_before_training_or_between_replayed_batches_is_its_own_span(tmp_path, engine, mode):
    """A pass of an evaluation loader before the first optimizer step (a baseline's),
    or after every fifth step where ``itertools.cycle`` replays the training loader's
    batches: each is a pipeline.evaluate span as long as the loop timed it, and no
    step's nor epoch's (the baseline's was no span, its batches the first step's; the
    replayed run's evaluations became epochs 1 to 3, the last of no step, and two
    steps held an evaluation each)."""
    out, truth = _run_engine(tmp_path, mode, engine)
    summary = summarize(out)
    passes = truth["evaluations_ns"]
    evaluations = sorted(_spans(out, "evaluate"), key=lambda e: e["ts"])[:len(passes)]
    assert len(passes) == (1 if mode == "preval" else 3) and len(evaluations) == len(passes)
    for (began, ended), span in zip(passes, evaluations):
        assert 0.9 * (ended - began) / 1e3 <= span["dur"] <= (ended - began) / 1e3 + 1000, (span, began, ended)
    starts = truth["starts_ns"]
    if mode == "preval":
        assert [(e["epoch"], e["steps"]) for e in summary.epochs] == [(0, 8), (1, 8)]
        _assert_epoch_times(summary, truth)
        gaps = [(b - a) / 1e3 for k, (a, b) in enumerate(zip(starts, starts[1:])) if k % 8 != 7]
        ours = [s["median_us"] for s in sorted(summary.steps, key=lambda s: s["step"]) if s["step"] % 8 != 7]
        assert sum(ours) == pytest.approx(sum(gaps), rel=0.02)
        return
    assert [(e["epoch"], e["steps"]) for e in summary.epochs] == [(0, 20)]
    ours = {s["step"]: s["median_us"] for s in summary.steps}
    for (began, ended), k in zip(passes, (4, 9, 14)):  # the step each follows: its own time, less the evaluation
        own_us = (starts[k + 1] - starts[k] - (ended - began)) / 1e3
        assert ours[k] <= own_us + 0.5 * (ended - began) / 1e3, (k, ours, own_us)


@pytest.mark.parametrize("engine", ["c", "python"])
def test_batches_replayed_with_no_fetch_number_their_own_steps(tmp_path, engine):
    """Once ``itertools.cycle`` replays the loader's batches, nothing is fetched: each
    iteration's forward, backward and optimizer step still carry its own number, so
    each step is its iteration, by the loop's clock."""
    out, truth = _run_engine(tmp_path, "cycle", engine)
    spans = sorted(_spans(out), key=lambda e: e["ts"])
    for name in ("forward", "backward", "step"):
        numbers = [e["args"]["step"] for e in spans if e["name"] == name]
        assert numbers == list(range(truth["steps"])), (name, numbers)
    summary = summarize(out)
    assert len(summary.rank_steps) == truth["steps"] == 20
    # each step from its batch's draw to the next one's, as the loop timed it (the
    # first also waits for the loader's start; the last ends with its optimizer step),
    # but the pass's end: its workers' shut-down, in the first replayed draw by the
    # loop's clock, is in the step before it (the two together are the loop's)
    starts = truth["starts_ns"]
    own = [(b - a) / 1e3 for a, b in zip(starts, starts[1:])]
    ours = [row["dur_us"] for row in sorted(summary.rank_steps, key=lambda r: r["start_us"])]
    edge = BATCHES - 1
    own[edge:edge + 2] = [own[edge] + own[edge + 1]] * 2
    ours[edge:edge + 2] = [ours[edge] + ours[edge + 1]] * 2
    late = [(k, ours[k], own[k]) for k in range(1, len(own)) if abs(ours[k] - own[k]) > 0.25 * own[k] + 500]
    assert not late, late


def test_a_compiled_model_gets_no_warning_of_dftraces_hooks(tmp_path):
    """torch.compile(model) warns of global module hooks when one is set: the ones
    that find the models during the first steps are dftrace's, and the program's
    output stays its own; a global hook of the program's own still gets the warning."""
    out, truth, _ = _run(tmp_path, "compiled")
    assert truth["warned"] == {"training": 0, "own_hook": 1}
    steps = [e for e in _spans(out, "step")]
    assert [e["args"]["step"] for e in steps] == list(range(truth["steps"])) == [0, 1, 2, 3]


def test_accumulated_micro_batches_are_one_step(tmp_path):
    out, truth, _ = _run(tmp_path, "accumulate")
    summary = summarize(out)
    assert len(summary.steps) == truth["steps"] == 8
    forwards = [e for e in _spans(out) if e["name"] == "forward" and "step" in e["args"]]
    assert sorted(e["args"]["step"] for e in forwards) == sorted(list(range(8)) * 2)


def test_a_step_that_an_epoch_end_cuts_in_two_is_one_step(tmp_path):
    # Three micro-batches a step, eight an epoch: the optimizer steps the last two of
    # epoch 0 with the first of epoch 1, and never steps the last two of epoch 1.
    out, truth, _ = _run(tmp_path, "accumulate_across")
    summary = summarize(out)
    assert truth["steps"] == 4
    numbers = [(row["epoch"], row["step"]) for row in summary.rank_steps]
    assert len({step for _, step in numbers}) == len(numbers), numbers  # no step in two epochs
    assert len(numbers) == truth["steps"] + 1  # and the unfinished step at the end
    assert [(row["epoch"], row["steps"]) for row in summary.epochs] == [(0, 2), (1, 3)]
    # The step after the one across the edge is its own three micro-batches, by the loop's
    # clock: epoch 1's loader start, inside the step across, is that step's (the step
    # after began there, holding the step across's last three micro-batches too).
    starts = truth["starts_ns"]  # epoch 0's k = 0, 3, 6; epoch 1's
    after = sorted(summary.rank_steps, key=lambda row: row["start_us"])[3]
    own_us, before_us = (starts[5] - starts[4]) / 1e3, (starts[4] - starts[3]) / 1e3
    assert after["dur_us"] <= own_us + before_us / 2, (after, own_us, before_us)


def test_what_you_annotate_is_not_recorded_twice(tmp_path):
    out, truth, _ = _run(tmp_path, "annotated")
    spans = _spans(out)
    count = {name: sum(e["name"] == name for e in spans) for name in ("forward", "backward", "fetch.iter", "fetch")}
    # Yours: one forward a step and the evaluation's; one backward a step; fetch.iter a batch.
    assert count == {"forward": truth["forwards"] + 1, "backward": truth["steps"],
                     "fetch.iter": truth["steps"], "fetch": 0}
    assert len(summarize(out).steps) == truth["steps"]


def test_run_says_when_nothing_was_recorded(tmp_path):
    _, _, done = _run(tmp_path, "idle")
    assert "dftrace run: nothing was recorded" in done.stderr


@pytest.mark.parametrize("engine", ["c", "python"])
def test_a_recorded_model_behaves_as_before(tmp_path, engine):
    """Once the models are found, what a program does with them works as untraced (a
    deep copy, pickling, torch.save, torch.compile with fullgraph=True, torch.jit.script,
    torch.fx, inspect.signature), and the spans stay right: a copy is not recorded, a model called inside another is one forward, a forward that
    raises says so, a step that raised leaves nothing nested in it."""
    out, truth = _run_engine(tmp_path, "edges", engine)
    assert truth["same"] == [True] * 6
    assert truth["signature"] == truth["signature_after"] == ["(x)", "(x, scale=2.0, *, shift=0.0)"]
    spans = _spans(out)
    forwards = [e for e in spans if e["name"] == "forward"]
    assert sum(e["args"]["module"] == "Net" for e in forwards) == truth["forwards"]
    assert sum(e["args"]["module"] == "Outer" for e in forwards) == truth["outer"]
    assert [e["args"]["module"] for e in forwards if "error" in e["args"]] == ["Net"]
    assert [e["args"]["error"] for e in forwards if "error" in e["args"]] == ["ValueError"]
    steps = [e for e in spans if e["name"] == "step"]
    assert [e["args"]["step"] for e in steps if not e["args"].get("incomplete")] == list(range(truth["steps"]))
    assert sum(bool(e["args"].get("incomplete")) for e in steps) == 1  # the step that raised
    assert len([e for e in spans if e["name"] == "backward"]) == truth["steps"]
    assert all(e["args"]["level"] == 1 for e in spans if e["name"] in ("forward", "backward", "step"))


def test_a_lightning_trainer_gets_its_callback_and_the_hooks_stand_down(tmp_path):
    """``dftrace run`` on a Lightning script that never names dftrace: its Trainer gets
    the callback (Lightning's trainer module is imported while its package is not whole
    yet), no global module hook slows its layers while it trains, and a loop of your
    own after it is recorded again, its steps numbered on."""
    pytest.importorskip("lightning.pytorch")
    out, truth, _ = _run(tmp_path, "lightning")
    assert truth["callbacks"] == ["dftrace.lightning"]
    assert truth["global_hooks_in_fit"] == [0] * truth["batches"]
    spans = _spans(out)
    count = {name: sum(e["name"] == name for e in spans) for name in ("train", "epoch", "compute")}
    assert count == {"train": 1, "epoch": 2, "compute": truth["batches"]}
    steps = [e["args"]["step"] for e in spans if e["name"] == "step"]
    fit, loop = truth["batches"], truth["loop_steps"]
    assert sorted(steps) == list(range(fit + loop))


_ANNOTATED_EVALUATION = """
import torch
from torch.utils.data import DataLoader, TensorDataset
from dftrace import ai

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
train = DataLoader(TensorDataset(torch.randn(32, 4)), batch_size=4)
val = DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4)
for epoch in range(2):
    model.train()
    for (x,) in train:
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
    model.eval()
    with ai.pipeline.evaluate, torch.no_grad():
        for (x,) in val:
            model(x)
"""


@pytest.mark.parametrize("engine", ["c", "python"])
def test_an_evaluation_you_annotate_is_not_recorded_again(tmp_path, engine):
    """``with ai.pipeline.evaluate:`` around an evaluation loader's pass under
    ``dftrace run``: your span, one per epoch, holding its 4 batches' forwards, and
    no second one recorded for the same pass."""
    traces = dftrace_run(tmp_path, _ANNOTATED_EVALUATION, engine)
    evaluations, forwards = _spans(traces, "evaluate"), _spans(traces, "forward")
    assert len(evaluations) == 2
    for span in evaluations:
        inside = [f for f in forwards if span["ts"] <= f["ts"] and f["ts"] + f["dur"] <= span["ts"] + span["dur"]]
        assert len(inside) == 4, (span, inside)
