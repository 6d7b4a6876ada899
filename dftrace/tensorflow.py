"""TensorFlow integration: a ``SessionRunHook`` for ``MonitoredTrainingSession``.

    import dftrace
    from dftrace.tensorflow import TraceHook

    dftrace.initialize(log_file="traces/run")
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[TraceHook()]) as sess:
        while not sess.should_stop():
            sess.run(train_op)

writes ``pipeline.train`` from ``begin`` to ``end`` (``TraceHook(span="epoch")`` for
``pipeline.epoch``) and one ``compute`` span per ``session.run`` with ``args.step``,
the global step (a run counter when the graph has none). The step is fetched with
the run itself (``SessionRunArgs``), so it costs no extra ``session.run``; like
TensorFlow's own step hooks, it may be read before or after the run's increment.

``tf.compat.v1.train.SessionRunHook`` gives no hook after a failed run: a run that
ends the input (``OutOfRangeError``) is closed by ``end`` with ``args.end_of_input``;
one that raises anything else is closed, flagged incomplete, when the session
closes. Either way no span is left open.
"""

from __future__ import annotations

import threading
from typing import Any

from ._core.tree import Node, ai
from ._hooks import OpenSpans, guarded as _guarded
from ._install_hint import import_framework

__all__ = ["TraceHook"]

tf = import_framework("tensorflow", "tensorflow", "TensorFlow")


_PHASES = {"train": ai.pipeline.train, "epoch": ai.pipeline.epoch}


def _global_step_read() -> Any:
    """The global step tensor TensorFlow's own step hooks fetch, or None when the
    graph has no global step."""
    try:
        from tensorflow.python.training import training_util

        read = training_util._get_or_create_global_step_read()
        if read is not None:
            return read
    except Exception:
        pass
    return tf.compat.v1.train.get_global_step()


class TraceHook(tf.compat.v1.train.SessionRunHook):
    """Trace a ``MonitoredSession``: a ``pipeline.train`` (or ``pipeline.epoch``) span
    for the session and a ``compute`` span per run with ``args.step``.

    Args:
        span: ``"train"`` (default) or ``"epoch"``: the node the whole session is.
        read_global_step: fetch the global step with each run (in the same
            ``session.run``); with False, or when the graph has no global step, or
            for a run that raised, ``args.step`` counts this hook's runs instead.
    """

    def __init__(self, span: str = "train", read_global_step: bool = True):
        if span not in _PHASES:
            raise ValueError(f"TraceHook(span=...) must be 'train' or 'epoch'; got {span!r}")
        self._phase: Node = _PHASES[span]
        self._read_global_step = bool(read_global_step)
        self._global_step: Any = None
        self._runs = 0
        # "session" (begin to end) and "run" (before_run to after_run)
        self._spans = OpenSpans()

    # -- spans -----------------------------------------------------------------
    def _close_run(self, **more: Any) -> None:
        self._spans.close("run", **more)

    def _close_all(self, **more: Any) -> None:
        self._close_run(**more)
        self._spans.close("session", **more)

    # -- SessionRunHook --------------------------------------------------------
    @_guarded
    def begin(self) -> None:
        # A session of this hook that failed earlier may have left spans open.
        self._close_all(incomplete=True)
        self._runs = 0
        self._global_step = _global_step_read() if self._read_global_step else None
        self._spans.open("session", self._phase)

    @_guarded
    def after_create_session(self, session: Any, coord: Any) -> None:
        self._watch_close(coord)

    @_guarded
    def before_run(self, run_context: Any) -> None:
        # A run still open is closed first, flagged incomplete: the last run raised
        # and no after_run came.
        self._spans.open("run", ai.compute, step=self._runs)
        if not self._spans.is_open("run") or self._global_step is None:
            return None
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    @_guarded
    def after_run(self, run_context: Any, run_values: Any) -> None:
        self._runs += 1
        more: dict[str, Any] = {}
        if self._spans.is_open("run") and self._global_step is not None:
            try:
                more["step"] = int(run_values.results)
            except Exception:
                pass
        self._close_run(**more)

    @_guarded
    def end(self, session: Any) -> None:
        # end() without after_run: the run stopped the input (OutOfRangeError or
        # StopIteration); the run did finish, by raising.
        self._close_run(end_of_input=True)
        self._close_all()

    # -- failed runs -------------------------------------------------------------
    def _watch_close(self, coord: Any) -> None:
        """A run that raises anything but OutOfRangeError gets neither after_run nor
        end; the session's close still asks its coordinator to stop. Close our spans
        there (only on the thread that ran the session: other threads may request a
        stop while a run is going on)."""
        if coord is None or getattr(coord.request_stop, "__dftrace_hook__", None) is self:
            return
        original = coord.request_stop
        owner = threading.get_ident()
        hook = self

        def request_stop(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == owner:
                try:
                    hook._close_all(incomplete=True)
                except Exception:
                    pass
            return original(*args, **kwargs)

        request_stop.__dftrace_hook__ = self  # type: ignore[attr-defined]
        coord.request_stop = request_stop
