"""dftrace.keras with real Keras 3: fit, evaluate and predict on a tiny model."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
keras = pytest.importorskip("keras")

import numpy as np  # noqa: E402

from dftrace import testing  # noqa: E402
from dftrace.format import validate_file  # noqa: E402
from dftrace.keras import TraceCallback  # noqa: E402

from ._fit_spans import fit_batches  # noqa: E402


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return rng.random((40, 3), dtype=np.float32), rng.random((40, 1), dtype=np.float32)


def make_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def by_id(result):
    return {e["id"]: e for e in result.spans()}


def test_fit_writes_train_epochs_and_batches(tmp_path, data):
    """fit is pipeline.train holding a pipeline.epoch per epoch holding a compute span per batch."""
    x, y = data
    with testing.trace_to(tmp_path) as result:
        make_model().fit(x, y, epochs=2, batch_size=10, callbacks=[TraceCallback()], verbose=0)
    batches = fit_batches(result, [(0, 0, 0), (0, 1, 1), (0, 2, 2), (0, 3, 3),
                                   (1, 0, 4), (1, 1, 5), (1, 2, 6), (1, 3, 7)])
    spans = by_id(result)
    assert all(spans[b["args"]["p_idx"]]["args"]["epoch"] == b["args"]["epoch"] for b in batches)
    assert validate_file(result.paths[0]) == []


def test_validation_in_fit_is_evaluate_inside_its_epoch(tmp_path, data):
    """validation_data in fit gives a pipeline.evaluate (with forward batches) inside each epoch span."""
    x, y = data
    with testing.trace_to(tmp_path) as result:
        make_model().fit(x[:30], y[:30], epochs=2, batch_size=10, validation_data=(x[30:], y[30:]),
                         callbacks=[TraceCallback()], verbose=0)
    spans = by_id(result)
    evals = result.spans("evaluate", "pipeline")
    assert len(evals) == 2
    for ev, epoch in zip(evals, (0, 1)):
        assert spans[ev["args"]["p_idx"]]["name"] == "epoch"
        assert ev["args"]["epoch"] == epoch
    forwards = result.spans("forward", "compute")
    assert len(forwards) == 2
    assert {spans[f["args"]["p_idx"]]["name"] for f in forwards} == {"evaluate"}
    assert validate_file(result.paths[0]) == []


def test_evaluate_and_predict(tmp_path, data):
    """evaluate is pipeline.evaluate and predict pipeline.test, each with a compute.forward per batch."""
    x, y = data
    model = make_model()
    cb = TraceCallback()
    with testing.trace_to(tmp_path) as result:
        model.evaluate(x, y, batch_size=20, callbacks=[cb], verbose=0)
        model.predict(x, batch_size=10, callbacks=[cb], verbose=0)
    spans = by_id(result)
    [ev] = result.spans("evaluate", "pipeline")
    [test] = result.spans("test", "pipeline")
    fwd = result.spans("forward", "compute")
    assert [f["args"]["batch"] for f in fwd if f["args"]["p_idx"] == ev["id"]] == [0, 1]
    assert [f["args"]["batch"] for f in fwd if f["args"]["p_idx"] == test["id"]] == [0, 1, 2, 3]
    assert all(spans.get(f["args"]["p_idx"]) in (ev, test) for f in fwd)
    assert validate_file(result.paths[0]) == []


def test_a_second_fit_numbers_its_steps_and_epochs_on(tmp_path, data):
    """fit, then fit again from epoch 0 (fine-tuning after unfreezing): one step each
    batch and one epoch each epoch of both, timed by the epoch's own clock (the two
    fits' epochs 0 and 1 were one epoch each, their steps shared)."""
    import time

    from dftrace.analysis import summarize

    x, y = data

    class EpochClock(keras.callbacks.Callback):
        times: list[float] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.began = time.perf_counter_ns()

        def on_epoch_end(self, epoch, logs=None):
            EpochClock.times.append((time.perf_counter_ns() - self.began) / 1000)

    model = make_model()
    with testing.trace_to(tmp_path) as result:
        model.fit(x, y, epochs=2, batch_size=10, callbacks=[TraceCallback(), EpochClock()], verbose=0)
        model.fit(x, y, epochs=2, batch_size=20, callbacks=[TraceCallback(), EpochClock()], verbose=0)
    summary = summarize(result.paths, index=False)
    assert [(e["epoch"], e["steps"]) for e in summary.epochs] == [(0, 4), (1, 4), (2, 2), (3, 2)]
    assert len(summary.steps) == 12
    for mine, truth in zip([e["max_us"] for e in summary.epochs], EpochClock.times, strict=True):
        assert truth * 0.9 - 500 <= mine <= truth + 500, (summary.epochs, EpochClock.times)


def test_spans_a_failed_fit_left_open_keep_their_args_at_the_end(tmp_path, data):
    """A fit that raised in its second batch, and no fit after it: at the session's end
    its spans are closed, incomplete, with their args (the epoch's epoch, the batch's
    epoch, batch and step), as the next fit would close them."""
    x, y = data

    class Boom(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                raise RuntimeError("boom")

    with testing.trace_to(tmp_path) as result:
        with pytest.raises(RuntimeError, match="boom"):
            make_model().fit(x, y, epochs=1, batch_size=10, callbacks=[Boom(), TraceCallback()], verbose=0)
    (epoch,) = result.spans("epoch", "pipeline")
    assert epoch["args"]["incomplete"] is True and epoch["args"]["epoch"] == 0
    open_batch = [b for b in result.spans("compute", "compute") if b["args"].get("incomplete")]
    assert [(b["args"]["epoch"], b["args"]["batch"], b["args"]["step"]) for b in open_batch] == [(0, 1, 1)]
    assert validate_file(result.paths[0]) == []


def test_failed_fit_spans_close_when_fit_runs_again(tmp_path, data):
    """Spans a failing fit left open are closed, flagged incomplete, when the callback's next fit begins."""
    x, y = data

    class Boom(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                raise RuntimeError("boom")

    cb = TraceCallback()
    model = make_model()
    with testing.trace_to(tmp_path) as result:
        with pytest.raises(RuntimeError, match="boom"):
            model.fit(x, y, epochs=1, batch_size=10, callbacks=[cb, Boom()], verbose=0)
        model.fit(x, y, epochs=1, batch_size=10, callbacks=[cb], verbose=0)
    trains = result.spans("train", "pipeline")
    assert [t["args"].get("incomplete", False) for t in trains] == [True, False]
    first_end = trains[0]["ts"] + trains[0]["dur"]
    assert first_end <= trains[1]["ts"]
    assert validate_file(result.paths[0]) == []


AUTO_JOB = """
import numpy as np, keras
from dftrace.keras import TraceCallback

keras.utils.set_random_seed(0)
x = np.random.rand(40, 3).astype("float32"); y = np.random.rand(40, 1).astype("float32")
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(x, y, 10, 2, 0)                        # callbacks not given (positional args)
model.fit(x, y, epochs=1, batch_size=20, verbose=0, callbacks=[TraceCallback()])  # your own
model.evaluate(x, y, batch_size=20, verbose=0)
model.predict(x, batch_size=40, verbose=0)
print("done")
"""


@pytest.mark.parametrize("backend", ["tensorflow", "torch"])
def test_dftrace_run_gives_fit_evaluate_and_predict_the_callback_once(tmp_path, backend):
    """``dftrace run`` on a Keras script that never names dftrace's callback: each fit,
    evaluate and predict gets one (a fit given yours keeps it alone), so its epochs and
    batches are recorded. On the torch backend, PyTorch's own hooks record nothing
    meanwhile (they recorded the model's build as a step 0 before the fit, and each
    batch's forward again)."""
    pytest.importorskip(backend)
    script = tmp_path / "job.py"
    script.write_text(AUTO_JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACE_")}
    env["KERAS_BACKEND"] = backend
    done = subprocess.run([sys.executable, "-m", "dftrace", "run", "--log-file", str(tmp_path / "t" / "job"),
                           str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    events = [e for path in testing.trace_files(tmp_path / "t") for e in testing.read_events(path)]
    spans = [e for e in events if e.get("ph") == "X"]
    names = [e["name"] for e in spans]
    assert names.count("train") == 2 and names.count("epoch") == 2 + 1
    assert names.count("compute") == 2 * 4 + 1 * 2  # 40 samples in batches of 10, then 20
    assert names.count("evaluate") == 1 and names.count("test") == 1
    assert names.count("forward") == 2 + 1  # evaluate's batches of 20, predict's of 40


@pytest.mark.parametrize("first", [True, False])
def test_model_checkpoint_saves_are_checkpoint_spans_whatever_the_callbacks_order(tmp_path, data, first):
    """ModelCheckpoint's saves (model.save / save_weights while fit runs) are
    checkpoint.capture spans with the path written, its size, the epoch and the global
    step: listed before or after TraceCallback, where the order puts the save outside
    the epoch span or inside it."""
    x, y = data
    saves = keras.callbacks.ModelCheckpoint(str(tmp_path / "ckpt" / "e{epoch}.weights.h5"), save_weights_only=True)
    callbacks = [TraceCallback(), saves] if first else [saves, TraceCallback()]
    with testing.trace_to(tmp_path / "trace") as result:
        make_model().fit(x, y, epochs=3, batch_size=10, callbacks=callbacks, verbose=0)
    written = sorted(str(p) for p in (tmp_path / "ckpt").iterdir())
    spans = result.spans("capture", "checkpoint")
    assert sorted(e["args"]["path"] for e in spans) == written and len(written) == 3
    assert [(e["args"]["epoch"], e["args"]["global_step"]) for e in spans] == [(0, 4), (1, 8), (2, 12)]
    assert all(e["args"]["bytes"] == os.path.getsize(e["args"]["path"]) for e in spans)
    assert "step" not in spans[0]["args"]
    assert validate_file(result.paths[0]) == []
