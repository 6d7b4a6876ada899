"""dftrace.lightning with real Lightning: Trainer(max_epochs=2) on a tiny module, on CPU."""

from __future__ import annotations

import os
import statistics
import time

import pytest

pl = pytest.importorskip("lightning.pytorch")
pytest.importorskip("polars")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from dftrace import ai, testing  # noqa: E402
from dftrace.format import validate_file  # noqa: E402
from dftrace.analysis import summarize  # noqa: E402
from dftrace.lightning import TraceCallback  # noqa: E402

from ._dftrace_run import dftrace_run  # noqa: E402
from ._fit_spans import fit_batches  # noqa: E402


class Regressor(pl.LightningModule):
    def __init__(self, fail_at_batch: int | None = None):
        super().__init__()
        self.net = nn.Linear(3, 1)
        self.fail_at_batch = fail_at_batch

    def training_step(self, batch, batch_idx):
        if batch_idx == self.fail_at_batch:
            raise RuntimeError("training_step failed")
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self.net(x), y))

    def predict_step(self, batch, batch_idx):
        return self.net(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader():
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(16, 3, generator=g), torch.randn(16, 1, generator=g)),
                      batch_size=8)


def trainer(tmp_path, **kw):
    kw.setdefault("max_epochs", 2)
    return pl.Trainer(callbacks=[TraceCallback()], logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=str(tmp_path / "root"),
                      num_sanity_val_steps=1, **kw)


def by_id(result):
    return {e["id"]: e for e in result.spans()}


def test_fit_maps_onto_the_tree(tmp_path):
    """fit -> train, epochs, a compute span per batch holding forward/backward/step, validation, checkpoints."""
    with testing.trace_to(tmp_path / "trace") as result:
        trainer(tmp_path).fit(Regressor(), loader(), loader())
    spans = by_id(result)
    batches = fit_batches(result, [(0, 0, 0), (0, 1, 1), (1, 0, 2), (1, 1, 3)])
    for b in batches:
        assert spans[b["args"]["p_idx"]]["name"] == "epoch"
        inside = sorted((e for e in result.spans(cat="compute") if e["args"]["p_idx"] == b["id"]),
                        key=lambda e: e["ts"])
        assert [e["name"] for e in inside] == ["forward", "backward", "step"]
        assert all(e["args"]["step"] == b["args"]["step"] for e in inside)
    evals = result.spans("evaluate", "pipeline")
    assert [e["args"].get("sanity_check", False) for e in evals] == [True, False, False]
    assert spans[evals[0]["args"]["p_idx"]]["name"] == "train"
    assert [spans[e["args"]["p_idx"]]["name"] for e in evals[1:]] == ["epoch", "epoch"]
    val_batches = [e for e in result.spans("forward") if spans[e["args"]["p_idx"]]["name"] == "evaluate"]
    assert len(val_batches) == 1 + 2 + 2
    captures = result.spans("capture", "checkpoint")
    assert [os.path.basename(c["args"]["path"]) for c in captures] == [
        "epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt"]
    assert all(c["args"]["bytes"] > 0 for c in captures)
    last = captures[-1]["args"]  # ModelCheckpoint keeps only the newest file
    assert last["bytes"] == os.path.getsize(last["path"])
    assert (last["epoch"], last["global_step"]) == (1, 4)
    assert "step" not in last  # a checkpoint is written between steps: no step's work
    assert validate_file(result.paths[0]) == []


def test_exception_closes_open_spans(tmp_path):
    """A training_step that raises: on_exception closes every open span with args.error, before fit returns."""
    with testing.trace_to(tmp_path / "trace") as result:
        with pytest.raises(RuntimeError, match="training_step failed"):
            trainer(tmp_path, max_epochs=1).fit(Regressor(fail_at_batch=1), loader())
        with ai.pipeline.test:  # written after fit raised
            pass
    marker = result.spans("test")[0]
    closed = [e for e in result.spans() if e["args"].get("incomplete")]
    assert {e["name"] for e in closed} == {"train", "epoch", "compute", "forward"}
    assert all(e["args"]["error"] == "RuntimeError" for e in closed)
    assert all(e["ts"] + e["dur"] <= marker["ts"] for e in closed)
    assert validate_file(result.paths[0]) == []


def test_test_predict_and_restart(tmp_path):
    """test and predict are pipeline.test spans (args.stage); fit(ckpt_path=...) reads the checkpoint in checkpoint.restart."""
    module = Regressor()
    trainer(tmp_path, max_epochs=1).fit(module, loader())
    ckpt = os.path.join(tmp_path, "root", "checkpoints", "epoch=0-step=2.ckpt")
    assert os.path.isfile(ckpt)
    with testing.trace_to(tmp_path / "trace") as result:
        t = trainer(tmp_path, max_epochs=2)
        t.fit(Regressor(), loader(), ckpt_path=ckpt)
        t.test(module, loader(), verbose=False)
        t.predict(module, loader())
    [restart] = result.spans("restart", "checkpoint")
    assert restart["args"]["path"] == ckpt and restart["args"]["bytes"] == os.path.getsize(ckpt)
    tests = result.spans("test", "pipeline")
    assert [e["args"]["stage"] for e in tests] == ["test", "predict"]
    spans = by_id(result)
    for stage in tests:
        assert len([e for e in result.spans("forward") if spans[e["args"]["p_idx"]] is stage]) == 2
    assert validate_file(result.paths[0]) == []


class StepClock(pl.Callback):
    """Lightning's own clock: when each training batch began, and its optimizer step."""

    def __init__(self):
        self.starts = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.starts.append((trainer.current_epoch, trainer.global_step, time.perf_counter_ns()))


@pytest.mark.parametrize("accumulate", [1, 2])
def test_summary_counts_each_optimizer_step_once(tmp_path, accumulate):
    """With gradient accumulation, validation and checkpoints on, the summary's steps are
    Lightning's optimizer steps, its epochs Lightning's, its step times Lightning's own
    step-start-to-step-start times."""
    clock = StepClock()
    g = torch.Generator().manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(48, 3, generator=g), torch.randn(48, 1, generator=g)), batch_size=2)
    t = pl.Trainer(callbacks=[TraceCallback(), clock], logger=False, enable_progress_bar=False,
                   enable_model_summary=False, default_root_dir=str(tmp_path / "root"), max_epochs=2,
                   accumulate_grad_batches=accumulate, num_sanity_val_steps=1)
    with testing.trace_to(tmp_path / "trace") as result:
        t.fit(Regressor(), data, loader())
    per_epoch = 24 // accumulate
    assert t.global_step == 2 * per_epoch
    summary = summarize(result.paths)
    assert sorted((s["epoch"], s["step"]) for s in summary.steps) == [
        (k // per_epoch, k) for k in range(2 * per_epoch)]
    assert [(e["epoch"], e["steps"]) for e in summary.epochs] == [(0, per_epoch), (1, per_epoch)]
    # Lightning's own step starts: the first batch of each optimizer step.
    firsts = {}
    for epoch, step, ns in clock.starts:
        firsts.setdefault((epoch, step), ns)
    ordered = sorted(firsts.items())
    gaps = {step: (b - a) / 1000 for ((ea, step), a), ((eb, _), b) in zip(ordered, ordered[1:]) if ea == eb}
    ours = {s["step"]: s["median_us"] for s in summary.steps}
    # A step is read from its batch's fetch to the next step's fetch, Lightning's clock from
    # its batch-start hook, after the fetch. A step differs from Lightning's only where the
    # machine paused the process between the two (in this step's fetch or the next's), so
    # the typical step agrees: the median of the differences is near 0, whatever the load.
    differences = [ours[step] - gaps[step] for step in gaps]
    assert abs(statistics.median(differences)) < 0.05 * statistics.median(gaps.values())


def test_a_fit_resumed_mid_epoch_has_that_epoch_and_every_batch_s_wait(tmp_path):
    """Resumed from a checkpoint saved mid-epoch, Lightning goes on with that epoch
    without its on_train_epoch_start: the epoch is a span all the same (its steps in
    the summary's epochs), and every training batch has its fetch."""
    g = torch.Generator().manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(32, 3, generator=g), torch.randn(32, 1, generator=g)), batch_size=4)
    saves = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_train_steps=3, save_top_k=-1)
    first = pl.Trainer(callbacks=[saves], logger=False, enable_progress_bar=False, enable_model_summary=False,
                       max_steps=3, default_root_dir=str(tmp_path / "root"))
    first.fit(Regressor(), data)
    ckpt = str(tmp_path / "ckpt" / "epoch=0-step=3.ckpt")
    assert os.path.isfile(ckpt)
    clock = StepClock()
    resumed = pl.Trainer(callbacks=[TraceCallback(), clock], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, max_epochs=2, default_root_dir=str(tmp_path / "root"))
    with testing.trace_to(tmp_path / "trace") as result:
        resumed.fit(Regressor(), data, ckpt_path=ckpt)
    batches = {(epoch, step) for epoch, step, _ in clock.starts}
    assert sorted(batches) == [(0, 3), (0, 4), (0, 5), (0, 6), (0, 7)] + [(1, k) for k in range(8, 16)]
    epochs = result.spans("epoch", "pipeline")
    assert [(e["args"]["epoch"], e["args"].get("resumed")) for e in epochs] == [(0, True), (1, None)]
    assert len(result.spans("fetch", "dataloader")) == len(clock.starts) == 13
    summary = summarize(result.paths)
    assert [(e["epoch"], e["steps"]) for e in summary.epochs] == [(0, 5), (1, 8)]


_VALIDATE_AFTER_FIT = """
import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        return nn.functional.mse_loss(self.net(batch[0]), batch[1])

    validation_step = test_step = training_step

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


data = TensorDataset(torch.randn(64, 3), torch.randn(64, 1))
kw = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer = pl.Trainer(max_epochs=2, limit_val_batches=0, num_sanity_val_steps=0, **kw)
trainer.fit(Regressor(), DataLoader(data, batch_size=8))
evaluator = pl.Trainer(**kw)
evaluator.validate(trainer.lightning_module, DataLoader(data, batch_size=8))
evaluator.test(trainer.lightning_module, DataLoader(data, batch_size=16))
"""


@pytest.mark.parametrize("engine", ["c", "python"])
def test_validate_and_test_after_fit_under_dftrace_run_are_recorded_once(tmp_path, engine):
    """``trainer.validate()`` and ``trainer.test()`` after ``fit`` under ``dftrace run``:
    the callback's evaluate and test spans, each holding its own batches, and no
    second evaluation recorded by automatic tracing for the same loader's pass."""
    events = testing.read_events(dftrace_run(tmp_path, _VALIDATE_AFTER_FIT, engine))
    (evaluation,) = testing.spans(events, "evaluate")
    (test,) = testing.spans(events, "test")
    for span, batches in ((evaluation, 8), (test, 4)):
        inside = [e for e in testing.spans(events, "forward")
                  if span["ts"] <= e["ts"] and e["ts"] + e["dur"] <= span["ts"] + span["dur"]]
        assert len(inside) == batches, (span, inside)
