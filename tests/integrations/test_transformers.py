"""dftrace.transformers with the real Hugging Face Trainer on a tiny BERT built from
a config (no downloads), on CPU."""

from __future__ import annotations

import os
import statistics
import time

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it with PyTorch

import torch  # noqa: E402

from dftrace import testing  # noqa: E402
from dftrace.analysis import summarize  # noqa: E402
from dftrace.format import validate_file  # noqa: E402
from dftrace.transformers import TraceCallback  # noqa: E402

from ._dftrace_run import dftrace_run  # noqa: E402


def tiny_model():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=16, num_labels=2)
    return transformers.BertForSequenceClassification(cfg)


def dataset(n):
    g = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(0, 50, (8,), generator=g),
             "attention_mask": torch.ones(8, dtype=torch.long), "labels": i % 2} for i in range(n)]


def run(tmp_path, callback, *, samples=16, more_callbacks=(), **kw):
    kw.setdefault("num_train_epochs", 2)
    kw.setdefault("per_device_train_batch_size", 4)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_eval_batch_size=8, report_to=[],
        use_cpu=True, disable_tqdm=True, logging_strategy="no", **kw)
    trainer = transformers.Trainer(model=tiny_model(), args=args, train_dataset=dataset(samples),
                                   eval_dataset=dataset(8), callbacks=[callback, *more_callbacks])
    trainer.train()
    return trainer


class StepClock(transformers.TrainerCallback):
    """The trainer's own clock: when each optimizer step began, by epoch."""

    def __init__(self):
        self.starts = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.starts.append((int(state.epoch + 1e-6), time.perf_counter_ns()))


def start_to_start_us(starts):
    """Each step's time from its start to the next's, for the steps followed by another
    in their epoch: {step: µs}."""
    return {k: (b - a) / 1000 for k, ((ea, a), (eb, b)) in enumerate(zip(starts, starts[1:])) if ea == eb}


#: Samples an epoch: with 4 micro-batches a step, 18 optimizer steps an epoch, so that a
#: few steps paused by a busy machine do not move the median difference.
SAMPLES = 72


@pytest.mark.parametrize("accumulation", [1, 4])
def test_summary_counts_each_optimizer_step_once(tmp_path, accumulation):
    """With gradient accumulation, evaluation and checkpoints on, the summary's steps are the
    trainer's optimizer steps, its epochs the trainer's, and its step p50 the trainer's own."""
    clock = StepClock()
    with testing.trace_to(tmp_path / "trace") as result:
        trainer = run(tmp_path, TraceCallback(), samples=SAMPLES, per_device_train_batch_size=1,
                      gradient_accumulation_steps=accumulation, eval_strategy="epoch",
                      save_strategy="epoch", more_callbacks=[clock])
    optimizer_steps = trainer.state.global_step
    assert optimizer_steps == 2 * SAMPLES // accumulation == len(clock.starts)
    summary = summarize(result.paths)
    steps = summary.steps
    assert len(steps) == optimizer_steps
    assert sorted((s["epoch"], s["step"]) for s in steps) == [
        (e, k) for e, k in ((0 if k < optimizer_steps // 2 else 1, k) for k in range(optimizer_steps))]
    assert [(e["epoch"], e["steps"]) for e in summary.epochs] == [(0, optimizer_steps // 2),
                                                                   (1, optimizer_steps // 2)]
    # A step may differ from the trainer's where the machine paused the process between the
    # trainer's step hook and the step's first span (in this step or the next): the typical
    # step agrees, the median of the differences near 0 whatever the load.
    ours = {s["step"]: s["median_us"] for s in steps}
    truth = start_to_start_us(clock.starts)
    differences = [ours[k] - truth[k] for k in truth]
    assert abs(statistics.median(differences)) < 0.05 * statistics.median(truth.values())
    # The batches' wait is part of each step: one fetch a step, inside no step span.
    fetches = result.spans("fetch", "dataloader")
    assert [f["args"]["step"] for f in fetches] == list(range(optimizer_steps))


class StepSpans(transformers.TrainerCallback):
    """The trainer's own clock: each optimizer step's time, from its begin hook to its end hook."""

    def __init__(self):
        self.us = {}

    def on_step_begin(self, args, state, control, **kwargs):
        self.began = time.perf_counter_ns()

    def on_step_end(self, args, state, control, **kwargs):
        self.us[state.global_step - 1] = (time.perf_counter_ns() - self.began) / 1000


def test_a_checkpoint_between_steps_is_no_steps_time(tmp_path):
    """Checkpoints saved every 2 steps, each made 60 ms slower: the step before each is
    its own time (the trainer's, from its begin hook to its end), not the save's."""
    slow_us = 60_000
    clock = StepSpans()
    with testing.trace_to(tmp_path / "trace") as result:
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True, disable_tqdm=True,
            logging_strategy="no", max_steps=12, per_device_train_batch_size=4, save_strategy="steps", save_steps=2)
        trainer = transformers.Trainer(model=tiny_model(), args=args, train_dataset=dataset(64),
                                       callbacks=[TraceCallback(), clock])
        save = trainer._save_checkpoint

        def slow_save(*a, **kw):
            time.sleep(slow_us / 1e6)
            return save(*a, **kw)

        trainer._save_checkpoint = slow_save
        trainer.train()
    saves = result.spans("capture", "checkpoint")
    assert len(saves) == 6 and all(s["dur"] >= slow_us for s in saves)
    ours = {s["step"]: s["median_us"] for s in summarize(result.paths).steps}
    assert sorted(ours) == list(range(12))
    # Each save follows steps 1, 3, ..., 11; the last is the run's end. The others' steps
    # are within a fraction of the save of the trainer's own time (a batch's wait added).
    saved_before = [k for k in range(1, 11, 2)]
    over = [ours[k] - clock.us[k] for k in saved_before]
    assert statistics.median(over) < slow_us / 3, (over, clock.us, ours)


def by_id(result):
    return {e["id"]: e for e in result.spans()}


def test_train_maps_onto_the_tree(tmp_path):
    """train/epochs/steps with forward+backward per micro-batch and the optimizer step, then evaluate and save per epoch."""
    with testing.trace_to(tmp_path / "trace") as result:
        run(tmp_path, TraceCallback(), gradient_accumulation_steps=2, eval_strategy="epoch",
            save_strategy="epoch")
    spans = by_id(result)
    [train] = result.spans("train", "pipeline")
    epochs = result.spans("epoch", "pipeline")
    assert [e["args"]["epoch"] for e in epochs] == [0, 1]
    steps = result.spans("compute", "compute")
    assert [(s["args"]["epoch"], s["args"]["step"]) for s in steps] == [(0, 0), (0, 1), (1, 2), (1, 3)]
    for s in steps:
        assert spans[s["args"]["p_idx"]]["name"] == "epoch"
        inside = sorted((e for e in result.spans(cat="compute") if e["args"]["p_idx"] == s["id"]),
                        key=lambda e: e["ts"])
        # 2 micro-batches (gradient accumulation), then one optimizer step
        assert [e["name"] for e in inside] == ["forward", "backward", "forward", "backward", "step"]
        assert all(e["args"]["step"] == s["args"]["step"] for e in inside)
    evals = result.spans("evaluate", "pipeline")
    assert [spans[e["args"]["p_idx"]] for e in evals] == [train, train]
    assert [e["args"]["step"] for e in evals] == [2, 4]
    eval_forwards = [e for e in result.spans("forward") if spans[e["args"]["p_idx"]]["name"] == "evaluate"]
    assert len(eval_forwards) == 2 and not any(e["args"]["training"] for e in eval_forwards)
    assert not any("step" in e["args"] for e in eval_forwards)  # evaluation is no step
    saves = result.spans("capture", "checkpoint")
    assert [os.path.basename(s["args"]["path"]) for s in saves] == ["checkpoint-2", "checkpoint-4"]
    assert all(s["args"]["bytes"] > 0 for s in saves)
    for ev, save in zip(evals, saves):
        assert ev["ts"] + ev["dur"] <= save["ts"]
    assert validate_file(result.paths[0]) == []


def test_step_strategy_evaluates_inside_the_epoch(tmp_path):
    """With eval/save every 2 steps, evaluate and capture spans sit inside the epoch that triggered them."""
    with testing.trace_to(tmp_path / "trace") as result:
        run(tmp_path, TraceCallback(), num_train_epochs=1, eval_strategy="steps", eval_steps=2,
            save_strategy="steps", save_steps=2)
    spans = by_id(result)
    evals = result.spans("evaluate", "pipeline")
    saves = result.spans("capture", "checkpoint")
    assert [e["args"]["step"] for e in evals] == [2, 4]
    assert [s["args"]["global_step"] for s in saves] == [2, 4]
    assert not any("step" in s["args"] for s in saves)  # a save is no step's work
    assert {spans[e["args"]["p_idx"]]["name"] for e in evals + saves} == {"epoch"}
    assert validate_file(result.paths[0]) == []


def test_compute_false_writes_no_model_hooks(tmp_path):
    """TraceCallback(compute=False) writes the step spans but no forward/backward spans."""
    with testing.trace_to(tmp_path / "trace") as result:
        run(tmp_path, TraceCallback(compute=False), num_train_epochs=1, save_strategy="no")
    assert len(result.spans("compute", "compute")) == 4
    assert len(result.spans("step", "compute")) == 4
    assert not result.spans("forward") and not result.spans("backward")


def test_failed_train_is_closed_by_the_next_train(tmp_path):
    """After train() raises, the next train() closes the leftovers (incomplete) and hooks the model only once."""

    class FailOnce(transformers.TrainerCallback):
        failed = False

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 1 and not self.failed:
                FailOnce.failed = True
                raise RuntimeError("step failed")

    cb = TraceCallback()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), num_train_epochs=1, per_device_train_batch_size=4,
        report_to=[], use_cpu=True, disable_tqdm=True, logging_strategy="no", save_strategy="no")
    trainer = transformers.Trainer(model=tiny_model(), args=args, train_dataset=dataset(8),
                                   callbacks=[cb, FailOnce()])
    with testing.trace_to(tmp_path / "trace") as result:
        with pytest.raises(RuntimeError, match="step failed"):
            trainer.train()
        trainer.train()
    trains = result.spans("train", "pipeline")
    assert [t["args"].get("incomplete", False) for t in trains] == [True, False]
    assert trains[0]["ts"] + trains[0]["dur"] <= trains[1]["ts"]
    second = [e for e in result.spans("forward") if e["ts"] >= trains[1]["ts"]]
    assert len(second) == 2  # two steps of one micro-batch: one forward each, not doubled
    assert validate_file(result.paths[0]) == []


_EVALUATE_AFTER_TRAINING = """
import json, time
import torch, transformers


def tiny_model():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=16, num_labels=2)
    return transformers.BertForSequenceClassification(cfg)


def dataset(n):
    g = torch.Generator().manual_seed(0)
    return [{{"input_ids": torch.randint(0, 50, (8,), generator=g),
             "attention_mask": torch.ones(8, dtype=torch.long), "labels": i % 2}} for i in range(n)]


args = transformers.TrainingArguments(
    output_dir={out!r}, num_train_epochs=2, per_device_train_batch_size=4, per_device_eval_batch_size=8,
    report_to=[], use_cpu=True, disable_tqdm=True, logging_strategy="no", save_strategy="no")
trainer = transformers.Trainer(model=tiny_model(), args=args, train_dataset=dataset(16), eval_dataset=dataset(24))
forwards = []
hook = trainer.model.register_forward_pre_hook(lambda *a: forwards.append(time.perf_counter_ns()))
began = time.perf_counter_ns()
trainer.evaluate()  # a baseline
baseline = [time.perf_counter_ns() - began, len(forwards)]
hook.remove()
trainer.train()
forwards.clear()
trainer.model.register_forward_pre_hook(lambda *a: forwards.append(time.perf_counter_ns()))
began = time.perf_counter_ns()
trainer.evaluate()
ended = time.perf_counter_ns()
json.dump({{"evaluate_ns": ended - began, "forwards": len(forwards), "baseline": baseline}}, open({truth!r}, "w"))
"""


@pytest.mark.parametrize("engine", ["c", "python"])
def test_evaluate_after_train_under_dftrace_run_is_an_evaluation(tmp_path, engine):
    """``trainer.evaluate()`` before and after ``trainer.train()`` under ``dftrace run``:
    each one's loader's pass (it fetches a batch ahead, so the last batch's forward
    follows the pass's end) is one pipeline.evaluate span holding every forward of it,
    within the job's own clock of the call; the batches of the one after training
    carry no training step or epoch, and the last training step does not hold its time."""
    import json

    truth = tmp_path / "truth.json"
    traces = dftrace_run(tmp_path, _EVALUATE_AFTER_TRAINING.format(out=str(tmp_path / "out"), truth=str(truth)),
                         engine)
    clock = json.loads(truth.read_text())
    events = testing.read_events(traces)
    spans = testing.spans(events)
    first, evaluation = sorted(testing.spans(events, "evaluate"), key=lambda e: e["ts"])
    (train,) = testing.spans(events, "train")
    before = [e for e in spans if e["name"] == "forward" and e["ts"] + e["dur"] <= train["ts"]]
    assert len(before) == clock["baseline"][1] == 3
    assert all(first["ts"] <= f["ts"] and f["ts"] + f["dur"] <= first["ts"] + first["dur"] for f in before), first
    assert first["dur"] <= clock["baseline"][0] / 1e3
    start, end = evaluation["ts"], evaluation["ts"] + evaluation["dur"]
    after = [e for e in spans if e["name"] == "forward" and e["ts"] >= train["ts"] + train["dur"]]
    assert len(after) == clock["forwards"] == 3
    assert all(start <= f["ts"] and f["ts"] + f["dur"] <= end for f in after), (evaluation, after)
    assert evaluation["dur"] <= clock["evaluate_ns"] / 1e3
    fetches = [e for e in spans if e["name"] == "fetch" and e["ts"] >= start]
    assert len(fetches) == 3 and not any("step" in e["args"] or "epoch" in e["args"] for e in fetches)
    summary = summarize(traces)
    assert len(summary.steps) == 8
    last = max(summary.steps, key=lambda s: s["step"])
    steps = sorted((e for e in spans if e["name"] == "compute" and e["cat"] == "compute"), key=lambda e: e["ts"])
    # its time: from the step before's end until the evaluation begins at the latest, not into it
    assert last["max_us"] <= start - steps[-2]["ts"] - steps[-2]["dur"], last
