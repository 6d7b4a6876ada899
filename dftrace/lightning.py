"""Lightning integration: a ``lightning.pytorch`` callback.

    import dftrace
    import lightning.pytorch as pl
    from dftrace.lightning import TraceCallback

    dftrace.initialize(log_file="traces/run")
    trainer = pl.Trainer(max_epochs=2, callbacks=[TraceCallback()])
    trainer.fit(model, train_loader, val_loader)

writes:

============================================  ======================================
hooks                                         span
============================================  ======================================
``on_fit_start`` → ``on_fit_end``             ``pipeline.train``
``on_train_epoch_start`` → ``_end``           ``pipeline.epoch`` (``args.epoch``; a fit
                                              resumed mid-epoch: from ``on_train_start``,
                                              ``args.resumed``)
previous batch end → ``on_train_batch_start``  ``dataloader.fetch`` (``epoch``, ``step``:
                                              the wait for the batch)
``on_train_batch_start`` → ``_end``           ``compute`` (``epoch``, ``batch``, ``step``)
batch start → ``on_before_zero_grad`` /       ``compute.forward`` (``training_step``;
``on_before_backward``                        no hook wraps only the forward pass)
``on_before_backward`` → ``on_after_backward``  ``compute.backward``
``on_before_optimizer_step`` → batch end      ``compute.step`` (the update and
                                              Lightning's bookkeeping after it)
``on_validation_start`` → ``_end``            ``pipeline.evaluate`` (``args.sanity_check``
                                              during the sanity check)
``on_test_start`` → ``_end``                  ``pipeline.test``
``on_predict_start`` → ``_end``               ``pipeline.test`` (``args.stage="predict"``)
validation/test/predict batch                 ``compute.forward`` (``args.batch``)
``trainer.save_checkpoint`` (every rank:      ``checkpoint.capture`` (``args.path``,
the state gathered, the write, the barrier)   ``args.bytes`` where this rank wrote)
checkpoint read (``CheckpointIO``)            ``checkpoint.restart``
============================================  ======================================

``args.step`` is ``trainer.global_step`` (optimizer steps so far), on every span of
a training batch: with gradient accumulation a step's micro-batches share it, and one
optimizer step is one step of the summary. Checkpoints are written between steps and
carry ``args.global_step`` instead. ``on_exception`` closes every open span, flagged
incomplete with ``args.error``.

With ``strategy="ddp"`` (or any strategy whose model is ``DistributedDataParallel``)
the callback writes the process's global rank to the trace (Lightning's launcher sets
``LOCAL_RANK`` and ``NODE_RANK``, not ``RANK``), and records each gradient bucket's
all-reduce as a ``comm.all_reduce`` span (:func:`dftrace.torch.trace_ddp`) and the
ranks' check for a SIGTERM before each batch (a broadcast from rank 0, where the
ranks ahead wait for the others) as a ``comm.bcast`` span, so ``dftrace summary``
finds stragglers and blocked time. A strategy given its own
``ddp_comm_hook`` keeps it, and its buckets are not recorded (one warning).
"""

from __future__ import annotations

import os
from typing import Any

from ._core.tree import ai
from ._hooks import OpenSpans, Wait, bytes_at, call_in_span, clock, guarded, warn_once
from ._install_hint import import_framework

__all__ = ["TraceCallback"]

pl = import_framework("lightning.pytorch", "lightning", "Lightning")


class _TracedCheckpoints:
    """A checkpoint's span on every rank: ``trainer.save_checkpoint`` (gathering the
    state, the write where this rank writes, the ranks' barrier) is wrapped, and the
    trainer's CheckpointIO (the write, on the ranks that write; the read). Instance
    attributes, removed again by :meth:`undo`."""

    def __init__(self, trainer: Any, callback: TraceCallback):
        self.trainer, self.io = trainer, trainer.strategy.checkpoint_io
        save_all, save, load = trainer.save_checkpoint, self.io.save_checkpoint, self.io.load_checkpoint
        cb = callback
        #: Set while the trainer's save runs; its write here, once done.
        self.saving = self.wrote = False

        def capture(fn: Any, a: tuple, kw: dict[str, Any], path: Any) -> Any:
            try:
                return call_in_span(ai.checkpoint.capture, fn, a, kw,
                                    args={"path": os.fspath(path), **cb._position("global_step")},
                                    after=lambda _out: bytes_at(path) if self.wrote else None)
            finally:
                if cb._fetch.waiting:  # the wait for the next batch starts now
                    cb._fetch.begin()

        def trainer_save_checkpoint(filepath: Any, *args: Any, **kwargs: Any) -> Any:
            if not ai.checkpoint.capture.enabled or self.saving:
                return save_all(filepath, *args, **kwargs)
            self.saving, self.wrote = True, False
            try:
                return capture(save_all, (filepath, *args), kwargs, filepath)
            finally:
                self.saving = False

        def save_checkpoint(checkpoint: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
            if self.saving:  # inside the trainer's save: its span
                out = save(checkpoint, path, *args, **kwargs)
                self.wrote = True
                return out
            if not ai.checkpoint.capture.enabled:
                return save(checkpoint, path, *args, **kwargs)
            self.wrote = True  # a save called on the strategy itself
            return capture(save, (checkpoint, path, *args), kwargs, path)

        def load_checkpoint(path: Any, *args: Any, **kwargs: Any) -> Any:
            node = ai.checkpoint.restart
            if not node.enabled:
                return load(path, *args, **kwargs)
            return call_in_span(node, load, (path, *args), kwargs,
                                args={"path": os.fspath(path), **(bytes_at(path) or {})})

        trainer.save_checkpoint = trainer_save_checkpoint
        self.io.save_checkpoint = save_checkpoint
        self.io.load_checkpoint = load_checkpoint

    def undo(self) -> None:
        for owner, name in ((self.trainer, "save_checkpoint"), (self.io, "save_checkpoint"),
                            (self.io, "load_checkpoint")):
            try:
                if name in vars(owner):
                    delattr(owner, name)
            except Exception:
                pass


class TraceCallback(pl.Callback):
    """Map a Lightning ``Trainer`` run onto the ``ai`` tree (see the module
    docstring). ``checkpoints=False`` leaves the trainer's CheckpointIO alone."""

    def __init__(self, checkpoints: bool = True) -> None:
        super().__init__()
        self.checkpoints = bool(checkpoints)
        self._spans = OpenSpans()
        self._io: _TracedCheckpoints | None = None
        self._trainer: Any = None
        #: The wait for the next training batch.
        self._fetch = Wait(ai.dataloader.fetch)
        self._ddp_traced: Any = None
        self._standing_down = False
        self._began: int | None = None  # when the evaluation, test or prediction under way began
        #: (object, attribute) set on the trainer's objects, removed at the fit's end
        self._patched: list[tuple[Any, str]] = []

    def _position(self, step_key: str = "step") -> dict[str, Any]:
        t = self._trainer
        if t is None:
            return {}
        try:
            return {"epoch": int(t.current_epoch), step_key: int(t.global_step)}
        except Exception:
            return {}

    def _stand_down(self, on: bool) -> None:
        """While a fit runs, automatic tracing (``auto=True``) records nothing: this
        callback records the same."""
        if on != self._standing_down:
            from .torch import _auto

            _auto.standing_down(+1 if on else -1)
            self._standing_down = on

    def _trace_ddp(self, trainer: Any) -> None:
        """Rank, gradient buckets and the ranks' check for a SIGTERM of a
        DistributedDataParallel run."""
        if int(getattr(trainer, "world_size", 1) or 1) <= 1:
            return
        from .torch import note_distributed_rank, trace_ddp

        note_distributed_rank(int(trainer.global_rank))
        self._trace_sigterm_broadcast(trainer)
        model = getattr(trainer.strategy, "model", None)
        if model is None or model is self._ddp_traced or not hasattr(model, "register_comm_hook"):
            return
        if getattr(trainer.strategy, "_ddp_comm_hook", None) is not None:
            warn_once("lightning-ddp-hook", "the DDP strategy has a ddp_comm_hook of its own: "
                      "its gradient buckets are not recorded")
            return
        try:
            trace_ddp(model)
            self._ddp_traced = model
        except Exception as exc:  # a hook registered already, a backward already run
            warn_once("lightning-ddp", f"DDP gradient buckets are not recorded: {exc!r}")

    def _trace_sigterm_broadcast(self, trainer: Any) -> None:
        """Before each training batch of a multi-process run, rank 0 broadcasts
        whether it received a SIGTERM (``_broadcast_sigterm_tensor``): the ranks that
        are ahead wait there for the others. That wait is a ``comm.bcast`` span of
        the coming step, not part of the wait for its batch."""
        loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
        broadcast = getattr(loop, "_broadcast_sigterm_tensor", None)
        if broadcast is None or "_broadcast_sigterm_tensor" in vars(loop):
            return  # another Lightning, or traced already
        def traced_broadcast() -> Any:
            if not ai.comm.bcast.enabled:
                return broadcast()
            waiting = self._fetch.waiting
            try:
                return call_in_span(ai.comm.bcast, broadcast, args={**self._position(), "sigterm": True})
            finally:
                if waiting:  # the wait for the batch starts after it
                    self._fetch.begin()

        loop._broadcast_sigterm_tensor = traced_broadcast
        self._patched.append((loop, "_broadcast_sigterm_tensor"))

    # -- setup / teardown: checkpoint I/O --------------------------------------------
    @guarded
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._trainer = trainer
        if self.checkpoints and self._io is None:
            self._io = _TracedCheckpoints(trainer, self)

    @guarded
    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._undo_patches()

    def _undo_patches(self) -> None:
        """Give back what was set on the trainer's objects: the checkpoint I/O, the
        SIGTERM broadcast."""
        if self._io is not None:
            self._io.undo()
            self._io = None
        for owner, name in self._patched:
            try:
                delattr(owner, name)
            except Exception:
                pass
        self._patched.clear()

    # -- fit -----------------------------------------------------------------------
    @guarded
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._trainer = trainer
        self._stand_down(True)
        self._trace_ddp(trainer)
        self._spans.open("fit", ai.pipeline.train)

    @guarded
    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._fetch.cancel()
        self._stand_down(False)
        self._spans.close("fit")

    @guarded
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # A fit resumed from a checkpoint saved mid-epoch goes on with that epoch, and
        # Lightning calls no on_train_epoch_start for it: its span starts here.
        if getattr(trainer.fit_loop, "restarted_mid_epoch", False) is True:
            self._open_epoch(trainer, resumed=True)

    def _open_epoch(self, trainer: Any, **more: Any) -> None:
        self._spans.open("epoch", ai.pipeline.epoch, epoch=int(trainer.current_epoch), **more)
        self._fetch.begin()

    @guarded
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._open_epoch(trainer)

    @guarded
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._fetch.cancel()
        self._close_batch()
        self._spans.close("epoch")

    @guarded
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        step = int(trainer.global_step)
        epoch = int(trainer.current_epoch)
        if not self._spans.is_open("epoch") and self._spans.is_open("fit"):  # resumed mid-epoch, by a
            self._spans.open("epoch", ai.pipeline.epoch, epoch=epoch, resumed=True)  # Lightning not saying so
        self._fetch.end(epoch=epoch, step=step)
        self._spans.open("batch", ai.compute, epoch=epoch, batch=int(batch_idx), step=step)
        self._spans.open("forward", ai.compute.forward, step=step)

    @guarded
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._close_batch()
        self._fetch.begin()

    def _close_batch(self) -> None:
        self._spans.close("forward")
        self._spans.close("backward")
        self._spans.close("step")
        self._spans.close("batch")

    @guarded
    def on_before_zero_grad(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._spans.close("forward")

    @guarded
    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self._spans.close("forward")
        self._spans.open("backward", ai.compute.backward, step=int(trainer.global_step))

    @guarded
    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self._spans.close("backward")

    @guarded
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._spans.close("forward")
        self._spans.close("backward")
        self._spans.open("step", ai.compute.step, step=int(trainer.global_step),
                         optimizer=type(optimizer).__name__)

    # -- validation / test / predict ------------------------------------------------------
    @guarded
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        args: dict[str, Any] = {"epoch": int(trainer.current_epoch)}
        if trainer.sanity_checking:
            args["sanity_check"] = True
        self._fetch.cancel()  # what follows the evaluation waits for its own batch
        self._spans.open("evaluate", ai.pipeline.evaluate, **args)
        self._began = clock()

    @guarded
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._spans.close("eval_batch")
        self._spans.close("evaluate")
        self._recorded()
        if self._spans.is_open("epoch"):
            self._fetch.begin()

    def _recorded(self) -> None:
        """An evaluation recorded here: automatic tracing (``dftrace run``), which
        records an evaluation loader's pass outside ``fit``, leaves this one's."""
        import sys

        evaluations = sys.modules.get("dftrace.torch._evaluations")
        if evaluations is not None and self._began is not None:
            evaluations.recorded_elsewhere(self._began, clock())
        self._began = None

    @guarded
    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self._spans.open("test", ai.pipeline.test, stage="test")
        self._began = clock()

    @guarded
    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self._spans.close("eval_batch")
        self._spans.close("test")
        self._recorded()

    @guarded
    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        self._spans.open("predict", ai.pipeline.test, stage="predict")
        self._began = clock()

    @guarded
    def on_predict_end(self, trainer: Any, pl_module: Any) -> None:
        self._spans.close("eval_batch")
        self._spans.close("predict")
        self._recorded()

    # Validation, test and predict batches alike: a ``compute.forward`` span with
    # ``args.batch`` (and ``args.dataloader`` past the first loader).
    @guarded
    def _eval_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        args: dict[str, Any] = {"batch": int(batch_idx)}
        if dataloader_idx:
            args["dataloader"] = int(dataloader_idx)
        self._spans.open("eval_batch", ai.compute.forward, **args)

    @guarded
    def _eval_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                        batch_idx: int, dataloader_idx: int = 0) -> None:
        self._spans.close("eval_batch")

    on_validation_batch_start = on_test_batch_start = on_predict_batch_start = _eval_batch_start
    on_validation_batch_end = on_test_batch_end = on_predict_batch_end = _eval_batch_end

    # -- errors --------------------------------------------------------------------------
    @guarded
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._fetch.cancel()
        self._stand_down(False)
        self._spans.close_all(error=type(exception).__name__)
        self._undo_patches()
