"""dftrace.tensorflow with real TensorFlow: a tiny graph trained in a
MonitoredTrainingSession (one graph builder shared by every test)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

import numpy as np  # noqa: E402

from dftrace import ai, testing  # noqa: E402
from dftrace.format import validate_file  # noqa: E402
from dftrace.tensorflow import TraceHook  # noqa: E402


def train(hooks, n=12, batch=4, fail_at_step=None, first_step=0):
    """Build a linear model on n points and train it until the input runs out
    (n / batch runs, then OutOfRangeError), or until the assert at fail_at_step."""
    with tf.Graph().as_default():
        if first_step:
            tf.compat.v1.get_variable(
                "global_step", shape=[], dtype=tf.int64, trainable=False,
                initializer=tf.compat.v1.constant_initializer(first_step),
                collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, tf.compat.v1.GraphKeys.GLOBAL_STEP])
        gs = tf.compat.v1.train.get_or_create_global_step()
        rng = np.random.default_rng(0)
        ds = tf.data.Dataset.from_tensor_slices(
            (rng.random((n, 3), dtype=np.float32), rng.random((n, 1), dtype=np.float32))).batch(batch)
        x, y = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
        w = tf.compat.v1.get_variable("w", [3, 1])
        loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2)
        deps = [] if fail_at_step is None else [tf.debugging.Assert(tf.less(gs, fail_at_step), [gs])]
        with tf.control_dependencies(deps):
            train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=gs)
        with tf.compat.v1.train.MonitoredTrainingSession(
                hooks=hooks, log_step_count_steps=None, save_summaries_steps=None,
                save_checkpoint_secs=None) as sess:
            while not sess.should_stop():
                sess.run(train_op)


def four_runs_inside(result, session_span: str) -> list[dict]:
    """Assert that ``train``'s four runs (12 points in batches of 4, then the run that
    finds the input exhausted) are compute spans of global steps 0 to 3, inside the
    one pipeline span ``session_span``; return them. Each run's global step is as read
    during the run: before or after its own increment (TensorFlow does not order the
    two; seen once in CI: 0, 2, 2, 3)."""
    [session] = result.spans(session_span, "pipeline")
    runs = result.spans("compute", "compute")
    steps = [e["args"]["step"] for e in runs]
    assert len(steps) == 4 and all(step in (i, i + 1) for i, step in enumerate(steps)), steps
    assert all(e["args"]["p_idx"] == session["id"] for e in runs)
    return runs


@pytest.mark.parametrize("session_class", ["MonitoredSession", "SingularMonitoredSession"])
def test_hook_traces_any_monitored_session(tmp_path, session_class):
    """TraceHook goes wherever session hooks go: each run of a plain MonitoredSession (or
    SingularMonitoredSession) is a compute span with its global step, inside pipeline.train."""
    with testing.trace_to(tmp_path) as result:
        with tf.Graph().as_default():
            step = tf.compat.v1.assign_add(tf.compat.v1.train.get_or_create_global_step(), 1)
            with getattr(tf.compat.v1.train, session_class)(hooks=[TraceHook()]) as sess:
                for _ in range(3):
                    sess.run(step)
    [session] = result.spans("train", "pipeline")
    runs = result.spans("compute", "compute")
    assert len(runs) == 3 and all(e["args"]["p_idx"] == session["id"] for e in runs)
    # the global step as read during each run: before or after the run's own increment
    assert all(e["args"]["step"] in (i, i + 1) for i, e in enumerate(runs))
    assert validate_file(result.paths[0]) == []


def test_session_writes_train_and_a_compute_span_per_run(tmp_path):
    """begin..end is pipeline.train; each run is a compute span with the global step, inside it."""
    with testing.trace_to(tmp_path) as result:
        train([TraceHook()])
    runs = four_runs_inside(result, "train")
    # the 4th run found the input exhausted: closed by end(), not left open
    assert runs[-1]["args"]["end_of_input"] is True
    assert not any(e["args"].get("incomplete") for e in result.spans())
    assert validate_file(result.paths[0]) == []


def test_global_step_comes_with_the_run(tmp_path, monkeypatch):
    """The hook reads the global step through SessionRunArgs: as many session.run calls
    as without it, and each span has the global step as read during its run (before or
    after the run's own increment: TensorFlow does not order the two)."""
    calls = []
    original = tf.compat.v1.Session.run

    def counting_run(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(tf.compat.v1.Session, "run", counting_run)
    train([], n=16)
    untraced = len(calls)
    calls.clear()
    with testing.trace_to(tmp_path) as result:
        train([TraceHook()], n=16, first_step=100)
    assert len(calls) == untraced
    steps = [e["args"]["step"] for e in result.spans("compute", "compute")]
    # 4 runs, then the one that found the input exhausted (no result: the run count)
    assert all(step in (100 + i, 101 + i) for i, step in enumerate(steps[:4])) and steps[4] == 4


def test_epoch_span_option(tmp_path):
    """TraceHook(span="epoch") makes the session a pipeline.epoch span."""
    with testing.trace_to(tmp_path) as result:
        train([TraceHook(span="epoch")], n=4)
    assert [e["name"] for e in result.spans(cat="pipeline")] == ["epoch"]
    with pytest.raises(ValueError, match="span"):
        TraceHook(span="step")


def test_failed_run_leaves_no_span_open(tmp_path):
    """A run raising an error (no after_run, no end) is closed, flagged incomplete, when the session closes."""
    with testing.trace_to(tmp_path) as result:
        with pytest.raises(tf.errors.InvalidArgumentError):
            train([TraceHook()], fail_at_step=2)
        with ai.pipeline.test:  # recorded after the session closed
            pass
    marker = result.spans("test")[0]
    runs = result.spans("compute")
    assert [e["args"]["step"] for e in runs] == [0, 1, 2]
    assert runs[-1]["args"]["incomplete"] is True
    [session] = result.spans("train")
    assert session["args"]["incomplete"] is True
    for e in runs + [session]:
        assert e["ts"] + e["dur"] <= marker["ts"]
    assert validate_file(result.paths[0]) == []


def test_seed_hook_example_works_as_written(tmp_path):
    """The user-written hook of DFTracer's AI logging docs (start/update/stop) works with `from dftrace import ai`."""
    from tensorflow.python.training import training_util

    class DFTracerProfilingHook(tf.compat.v1.train.SessionRunHook):
        def begin(self):
            self._global_step_tensor = training_util._get_or_create_global_step_read()
            if self._global_step_tensor is None:
                raise RuntimeError("Global step should be created to use ProfilerHook.")
            ai.pipeline.epoch.start()

        def end(self, session):
            ai.pipeline.epoch.stop()

        def before_run(self, run_context):
            global_step = run_context.session.run(self._global_step_tensor)
            ai.update(step=global_step)
            ai.compute.start()

        def after_run(self, run_context, run_values):
            ai.compute.stop()

    with testing.trace_to(tmp_path) as result:
        train([DFTracerProfilingHook()])
    runs = four_runs_inside(result, "epoch")
    # the run that hit OutOfRangeError got no after_run: epoch.stop() closed it
    assert runs[-1]["args"]["incomplete"] is True
    assert validate_file(result.paths[0]) == []
