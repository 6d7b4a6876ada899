"""Keras 3 integration: a callback for ``fit``, ``evaluate`` and ``predict``.

    import dftrace
    from dftrace.keras import TraceCallback

    dftrace.initialize(log_file="traces/run")
    model.fit(x, y, epochs=3, validation_split=0.2, callbacks=[TraceCallback()])

writes, with any Keras backend:

- ``fit``: ``pipeline.train``; per epoch ``pipeline.epoch`` (``args.epoch``); per
  training batch a ``compute`` span with ``args.epoch``, ``args.batch`` (index in the
  epoch) and ``args.step`` (batches trained in this session so far). Validation
  inside ``fit`` is a ``pipeline.evaluate`` inside its epoch. A later ``fit`` in the
  session numbers on: its steps after the earlier ones', and its epochs too where it
  starts below them (a second ``fit`` of 2 epochs from epoch 0 after one of 2 is
  epochs 2 and 3), so that no two fits share a step or an epoch.
- ``evaluate``: ``pipeline.evaluate``, a ``compute.forward`` span per batch.
- ``predict``: ``pipeline.test``, a ``compute.forward`` span per batch.
- while a ``fit`` runs, each ``model.save`` / ``model.save_weights`` (what
  ``ModelCheckpoint`` calls) is a ``checkpoint.capture`` span with ``args.path``,
  ``args.epoch``, ``args.global_step`` and ``args.bytes``: a checkpoint wherever the
  callbacks' order puts it, and no step's work.

With ``compile(steps_per_execution=N)`` Keras calls batch hooks every N batches, so
one ``compute`` span covers N batches.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

from ._core import lifecycle as _lifecycle
from ._core.tree import Node, ai
from ._hooks import OpenSpans, bytes_at, call_in_span, guarded as _guarded
from ._install_hint import import_framework

__all__ = ["TraceCallback"]

keras = import_framework("keras", "keras", "Keras 3")


class _Trained:
    """What this session (its trace) trained so far, over every callback and ``fit``:
    batches, and the epoch after the last one begun."""

    steps = 0
    next_epoch = 0
    session: Any = None

    @classmethod
    def in_this_session(cls) -> None:
        """Count from 0 again in a new session."""
        now = _lifecycle.session()
        if now is not cls.session:
            cls.session, cls.steps, cls.next_epoch = now, 0, 0


class _Saves:
    """``Model.save`` and ``Model.save_weights``, wrapped once: a ``checkpoint.capture``
    span while a traced ``fit`` runs (``fits``: its callbacks) and no save is under way
    on this thread (one save may call the other)."""

    fits: list[Any] = []
    local = threading.local()

    @classmethod
    def wrap(cls) -> None:
        for name in ("save", "save_weights"):
            original = getattr(keras.Model, name, None)
            if callable(original) and not hasattr(original, "__dftrace_wraps__"):
                setattr(keras.Model, name, cls._traced(original))

    @classmethod
    def _traced(cls, original: Any) -> Any:
        @functools.wraps(original)
        def save(model: Any, filepath: Any, *args: Any, **kwargs: Any) -> Any:
            node = ai.checkpoint.capture
            if not cls.fits or getattr(cls.local, "saving", False) or not node.enabled:
                return original(model, filepath, *args, **kwargs)
            path = os.fspath(filepath) if isinstance(filepath, (str, os.PathLike)) else None
            where = {"path": path} if path is not None else {}
            cls.local.saving = True
            try:
                return call_in_span(node, original, (model, filepath, *args), kwargs,
                                    args={**where, **cls.fits[-1]._epoch_args(), "global_step": _Trained.steps},
                                    after=lambda _out: bytes_at(path) if path is not None else None)
            finally:
                cls.local.saving = False

        save.__dftrace_wraps__ = original  # type: ignore[attr-defined]
        return save


class TraceCallback(keras.callbacks.Callback):
    """Trace ``model.fit`` / ``evaluate`` / ``predict`` into the ``ai`` tree (see the
    module docstring for the names and args). Spans left open by an exception are
    closed, flagged incomplete, when the next ``fit``/``evaluate``/``predict`` of this
    callback begins, or at ``dftrace.finalize()``."""

    def __init__(self) -> None:
        super().__init__()
        self._open = OpenSpans()
        self._epoch: int | None = None
        self._shift: int | None = None  # added to this fit's epochs (see the module docstring)

    # -- bookkeeping -------------------------------------------------------------
    def _start(self, key: str, node: Node, **args: Any) -> None:
        self._open.open(key, node, **args)

    def _stop(self, key: str) -> None:
        self._open.close(key)

    def _stop_all(self) -> None:
        self._open.close_all()

    def _epoch_args(self) -> dict[str, Any]:
        return {} if self._epoch is None else {"epoch": self._epoch}

    # -- fit ---------------------------------------------------------------------
    @_guarded
    def on_train_begin(self, logs: Any = None) -> None:
        self._stop_all()
        self._epoch = self._shift = None
        _Trained.in_this_session()
        self._start("train", ai.pipeline.train)
        _Saves.wrap()
        if self in _Saves.fits:  # (its last fit raised)
            _Saves.fits.remove(self)
        _Saves.fits.append(self)

    @_guarded
    def on_train_end(self, logs: Any = None) -> None:
        self._stop("batch")
        self._stop("epoch")
        self._stop("train")
        self._epoch = None
        if self in _Saves.fits:
            _Saves.fits.remove(self)

    @_guarded
    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        if self._shift is None:  # this fit's first epoch: on from the earlier fits'
            self._shift = max(0, _Trained.next_epoch - int(epoch))
        self._epoch = int(epoch) + self._shift
        _Trained.next_epoch = self._epoch + 1
        self._start("epoch", ai.pipeline.epoch, epoch=self._epoch)

    @_guarded
    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self._stop("batch")
        self._stop("epoch")

    @_guarded
    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._start("batch", ai.compute, **self._epoch_args(), batch=int(batch), step=_Trained.steps)
        _Trained.steps += 1

    @_guarded
    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._stop("batch")

    # -- evaluate (also validation inside fit) and predict ------------------------------
    def _pass_begin(self, key: str, node: Node, **args: Any) -> None:
        if not self._open.is_open("train"):  # a standalone evaluate()/predict(): leftovers are stale
            self._stop_all()
        self._start(key, node, **args)

    def _pass_end(self, key: str) -> None:
        self._stop("eval_batch")
        self._stop(key)

    @_guarded
    def on_test_begin(self, logs: Any = None) -> None:
        self._pass_begin("evaluate", ai.pipeline.evaluate, **self._epoch_args())

    @_guarded
    def on_test_end(self, logs: Any = None) -> None:
        self._pass_end("evaluate")

    @_guarded
    def on_predict_begin(self, logs: Any = None) -> None:
        self._pass_begin("predict", ai.pipeline.test)

    @_guarded
    def on_predict_end(self, logs: Any = None) -> None:
        self._pass_end("predict")

    # Evaluate and predict batches alike: a ``compute.forward`` span with ``args.batch``.
    @_guarded
    def _eval_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._start("eval_batch", ai.compute.forward, batch=int(batch))

    @_guarded
    def _eval_batch_end(self, batch: int, logs: Any = None) -> None:
        self._stop("eval_batch")

    on_test_batch_begin = on_predict_batch_begin = _eval_batch_begin
    on_test_batch_end = on_predict_batch_end = _eval_batch_end
