"""``trace_compute``: ``compute.forward`` from the root module's hooks,
``compute.backward`` per ``backward()`` call and ``compute.step`` from the optimizer's
step hooks."""

from __future__ import annotations

from typing import Any

from .._core.tree import ai
from .._hooks import guarded
from ._hooking import (BACKWARD, ThreadSpans, forward_failed, install_backward, remove_handles,
                       uninstall_backward)


class ComputeTracing:
    """What :func:`trace_compute` returns: a context manager whose ``remove()``
    takes every hook out again.

    ``step`` is the step number written into the spans' args: the number of
    optimizer steps taken since tracing began (``None`` without an optimizer
    until you set it, e.g. ``tracing.step = global_step``). A step set with
    ``ai.update(step=...)`` wins: the spans then carry that one.
    """

    def __init__(self, model: Any = None, optimizer: Any = None, *, forward: bool = True,
                 backward: bool = True, step: bool = True):
        self.step: int | None = 0 if optimizer is not None else None
        self._handles: list[Any] = []
        self._forward = ThreadSpans()
        self._steps = ThreadSpans()
        self._backward = False
        self._removed = False
        self._optimizers: list[Any] = []
        if model is not None and forward:
            self._handles.append(model.register_forward_pre_hook(self._forward_pre))
            self._handles.append(model.register_forward_hook(self._forward_post, always_call=True))
        if optimizer is not None and step:
            opts = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
            self._optimizers = opts
            for opt in opts:
                self._handles.append(opt.register_step_pre_hook(self._step_pre))
                self._handles.append(opt.register_step_post_hook(self._step_post))
        if backward:
            install_backward(self)
            self._backward = True
        from . import _auto

        _auto.standing_down(+1)  # this model's compute is recorded here, not by auto=True

    def _backward_args(self) -> dict[str, Any] | None:
        s = self._own_step(BACKWARD)
        return None if s is None else {"step": s}

    def _own_step(self, node: Any) -> int | None:
        """The step to write on ``node``'s span: ours, unless the user set one."""
        if self.step is None or "step" in node._args():
            return None
        return self.step

    @guarded
    def _forward_pre(self, module: Any, args: Any) -> None:
        node = ai.compute.forward
        if node.enabled:
            self._forward.push(node.start())

    @guarded
    def _forward_post(self, module: Any, args: Any, output: Any) -> None:
        span = self._forward.pop()
        if span is None:
            return
        training = bool(module.training)
        extra: dict[str, Any] = {"training": training}
        # A forward in eval mode (an evaluation between steps) is no step's work: the
        # optimizer's count then names the step to come.
        step = self._own_step(ai.compute.forward) if training else None
        if step is not None:
            extra["step"] = step
        err = forward_failed(output)
        if err:
            extra["error"] = err
        span.stop(extra)

    @guarded
    def _step_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        node = ai.compute.step
        leftover = self._steps.pop()
        if leftover is not None:  # the last step() raised: its post hook never ran
            leftover[0].stop({**leftover[1], "incomplete": True})
        if node.enabled:
            extra: dict[str, Any] = {"optimizer": type(optimizer).__name__}
            step = self._own_step(node)
            if step is not None:
                extra["step"] = step
            if len(self._optimizers) > 1:
                extra["optimizer_index"] = self._optimizers.index(optimizer)
            self._steps.push((node.start(), extra))

    @guarded
    def _step_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        entry = self._steps.pop()
        if entry is not None:
            entry[0].stop(entry[1])
        # Count steps of the first optimizer only, so a GAN's two optimizers do not
        # advance the step twice per iteration.
        if self.step is not None and (not self._optimizers or optimizer is self._optimizers[0]):
            self.step += 1

    def remove(self) -> None:
        """Take out every hook this tracing added; spans still open are closed,
        flagged incomplete (idempotent)."""
        if self._removed:
            return
        self._removed = True
        remove_handles(self._handles)
        if self._backward:
            uninstall_backward(self)
        self._forward.close_all()
        self._steps.close_all()
        from . import _auto

        _auto.standing_down(-1)

    def __enter__(self) -> ComputeTracing:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def trace_compute(model: Any = None, optimizer: Any = None, *, forward: bool = True,
                  backward: bool = True, step: bool = True) -> ComputeTracing:
    """Write ``compute.forward``, ``compute.backward`` and ``compute.step`` spans for a
    training loop, without editing the model or the loop.

    - forward: a forward pre-hook and an ``always_call`` forward hook on ``model`` (the
      root module only; see :func:`trace_modules` for submodules), with
      ``args.training``.
    - backward: every ``backward()`` call (``loss.backward()``,
      ``torch.autograd.backward``) while tracing is active, wherever it is made.
    - step: ``optimizer.step()`` via the optimizer's step hooks (``optimizer`` may be
      a list); a step that raised is closed, flagged incomplete, at the next step.

    Each span carries ``args.step``, the number of optimizer steps taken so far
    (forward and backward of step N happen before its ``compute.step``), but a
    forward in eval mode (``model.eval()``: an evaluation's), which is no step's. Use it as
    a context manager, or keep it and call ``remove()``.
    """
    return ComputeTracing(model, optimizer, forward=forward, backward=backward, step=step)
