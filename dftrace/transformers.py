"""Hugging Face integration: a ``transformers.TrainerCallback``.

    import dftrace
    from dftrace.transformers import TraceCallback

    dftrace.initialize(log_file="traces/run")
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[TraceCallback()])
    trainer.train()

writes, during ``trainer.train()``:

- ``pipeline.train`` from ``on_train_begin`` to ``on_train_end``;
- ``pipeline.epoch`` per epoch (``args.epoch``);
- a ``dataloader.fetch`` span per optimizer step for the wait before it: the
  trainer fetches (and collates) all of a step's micro-batches before
  ``on_step_begin``, from the end of the previous step's bookkeeping (its
  evaluation and checkpoint included) or the epoch's start;
- a ``compute`` span per optimizer step (``on_step_begin`` → ``on_step_end``, so
  all gradient-accumulation micro-batches) with ``args.step`` (``global_step``)
  and ``args.epoch``, containing ``compute.forward`` (hooks on the model) and
  ``compute.backward`` (``backward()`` calls) per micro-batch, and ``compute.step``
  (``on_pre_optimizer_step`` → ``on_optimizer_step``: exactly ``optimizer.step()``),
  all with the same ``args.step``: one optimizer step is one step of the summary;
- ``pipeline.evaluate`` for each evaluation the trainer runs, with the model's
  ``compute.forward`` spans inside (no ``args.step``: evaluation is no step);
- ``checkpoint.capture`` for each checkpoint save (``args.path``, ``args.bytes``,
  ``args.global_step``: a save runs between steps, so it carries no ``args.step``).

In a distributed run the process's rank is taken from the trainer
(``args.process_index``) at ``on_train_begin`` and written to the trace, and the
``DistributedDataParallel`` model the trainer wraps its model in records a
``comm.all_reduce`` span per gradient bucket (:func:`dftrace.torch.trace_ddp`,
registered at its first forward) unless you register a communication hook of your
own, which is then traced; the callback may be given to the ``Trainer`` or added with
``add_callback`` before ``train()``.

Callbacks only hear about evaluation and saving afterwards (``on_evaluate``,
``on_save``), so those spans open when the trainer's control flags announce them
(at the end of the step or epoch that triggers them) and close at the event. A save
decided after the evaluation (``save_strategy="best"``) is written as a zero-length
span with ``args.timing="end only"``. ``trainer.evaluate()``/``predict()`` called by
you are not inside ``train()``: wrap them in ``with ai.pipeline.evaluate:`` /
``with ai.pipeline.test:``.
"""

from __future__ import annotations

from ._install_hint import import_framework

transformers = import_framework("transformers", "transformers", "Hugging Face transformers")

import math
import os
from typing import Any

try:
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
except ImportError:  # pragma: no cover - older layouts
    PREFIX_CHECKPOINT_DIR = "checkpoint"

from ._core.tree import ai
from ._hooks import OpenSpans, Wait, guarded
from .torch import ComputeTracing, note_distributed_rank

__all__ = ["TraceCallback"]


def _dir_size(path: str) -> int | None:
    try:
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)
    except Exception:
        return None


class TraceCallback(transformers.TrainerCallback):
    """Map ``Trainer.train()`` onto the ``ai`` tree (see the module docstring).

    Args:
        compute: also write ``compute.forward``/``compute.backward`` spans through
            hooks on the model and ``backward()`` calls (only while training).
    """

    def __init__(self, compute: bool = True) -> None:
        self.compute = bool(compute)
        self._spans = OpenSpans()
        self._tracing: ComputeTracing | None = None
        self._epoch = 0
        #: The wait for the next step's batches (the trainer fetches them all before on_step_begin).
        self._fetch = Wait(ai.dataloader.fetch)
        # The trainer wraps its model in DistributedDataParallel when train() starts,
        # after this callback was given to it or added: the wrappers made from now on
        # record their gradient buckets once on_train_begin names the model.
        try:
            from .torch._dist import watch_ddp

            watch_ddp()
        except Exception:  # no torch.distributed here: no wrapper to watch
            pass

    # -- helpers -------------------------------------------------------------------------
    def _after_step_or_epoch(self, args: Any, state: Any, control: Any) -> None:
        # What runs next (_maybe_log_save_evaluate) is announced by control's flags.
        if control.should_evaluate:
            if self._tracing is not None:  # the evaluation's forwards are no step's
                self._tracing.step = None
            self._spans.open("evaluate", ai.pipeline.evaluate, epoch=self._epoch,
                             step=int(state.global_step))
        elif control.should_save:
            self._open_save(args, state)
        else:
            self._fetch.begin()

    def _open_save(self, args: Any, state: Any) -> None:
        self._spans.open("save", ai.checkpoint.capture, epoch=self._epoch,
                         global_step=int(state.global_step))

    def _stop_tracing(self) -> None:
        if self._tracing is not None:
            self._tracing.remove()
            self._tracing = None

    # -- init / train / epoch ---------------------------------------------------------------
    @guarded
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        self._spans.close_all()
        self._stop_tracing()
        self._spans.open("train", ai.pipeline.train)
        if self.compute:
            self._tracing = ComputeTracing(model, None, step=False)
            self._tracing.step = int(state.global_step)
        if getattr(args, "world_size", 1) > 1:
            note_distributed_rank(getattr(args, "process_index", None))
            if model is not None:  # its DistributedDataParallel wrapper records its buckets
                from .torch._dist import trace_ddp_of

                trace_ddp_of(model)

    @guarded
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._stop_tracing()
        self._fetch.cancel()
        for key in ("optimizer", "step", "evaluate", "save", "epoch"):
            self._spans.close(key)
        self._spans.close("train")

    @guarded
    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # state.epoch is fractional progress (1.0 after the first epoch).
        self._epoch = int(math.floor((state.epoch or 0) + 1e-6))
        self._spans.open("epoch", ai.pipeline.epoch, epoch=self._epoch)
        self._fetch.begin()

    @guarded
    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._fetch.cancel()  # the epoch ended: no batch was waited for
        self._spans.close("optimizer")
        self._spans.close("step")
        self._spans.close("epoch")
        self._after_step_or_epoch(args, state, control)

    # -- steps ---------------------------------------------------------------------------------
    @guarded
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step)
        if self._tracing is not None:
            self._tracing.step = step
        self._fetch.end(epoch=self._epoch, step=step)
        self._spans.open("step", ai.compute, epoch=self._epoch, step=step)

    @guarded
    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._spans.open("optimizer", ai.compute.step, step=int(state.global_step))

    @guarded
    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._spans.close("optimizer")

    @guarded
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._spans.close("optimizer")
        self._spans.close("step")
        if self._tracing is not None:  # forwards of an evaluation now belong to this step
            self._tracing.step = int(state.global_step)
        self._after_step_or_epoch(args, state, control)

    # -- evaluation and checkpoints ----------------------------------------------------------------
    @guarded
    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None,
                    **kwargs: Any) -> None:
        if self._spans.close("evaluate") and control.should_save:
            self._open_save(args, state)
        elif not self._spans.is_open("save"):
            self._fetch.begin()

    @guarded
    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        path = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        extra: dict[str, Any] = {}
        if os.path.isdir(path):
            extra["path"] = path
            size = _dir_size(path)
            if size is not None:
                extra["bytes"] = size
        if not self._spans.is_open("save"):
            self._open_save(args, state)
            extra["timing"] = "end only"
        self._spans.close("save", **extra)
        self._fetch.begin()
