"""The PyTorch profiler on a schedule of training steps, its files beside dftrace's.

``profile_steps(optimizer)`` records ``active`` steps with ``torch.profiler`` every
``every`` steps (kernels, memory copies and CUDA runtime calls with CUDA; CPU
operators everywhere) and writes each window as a Kineto trace named after the
process's dftrace file, so the analysis finds both for the same rank and process::

    traces/run-rank0-host-4242.pfw.zst                         dftrace's trace
    traces/run-rank0-host-4242.steps-10-11.pt.trace.json.gz    the profiler's, steps 10 and 11

Steps are the optimizer's ``step()`` calls (a post hook), or the calls of
:meth:`StepProfiler.step` in a loop without an optimizer. Between windows no
profiler exists: a step costs one hook call, a counter and a comparison.
"""

from __future__ import annotations

import os
import platform
import re
import time
from typing import Any

import torch

from .._hooks import guarded, warn_once

_TRACE_SUFFIX = re.compile(r"\.pfw(\.zst|\.gz)?$")


def _stem() -> str:
    """The current dftrace file's name without its suffix (rank, host and pid in it),
    or ``profile-<pid>`` in the working directory when no session writes a file."""
    from .._core.lifecycle import session

    s = session()
    path = getattr(s, "path", None) if s is not None else None
    if path:
        return _TRACE_SUFFIX.sub("", path)
    return os.path.join(os.getcwd(), f"profile-{os.getpid()}")


def _hostname() -> str:
    from .._core.lifecycle import session

    s = session()
    return getattr(s, "hostname", None) or platform.node()


def _clock_anchor() -> None:
    """Wall and monotonic clocks read now, into the dftrace trace: the profiler has
    just calibrated its clock against the wall clock, so the analysis learns how far
    the wall clock had moved against dftrace's clock since ``initialize`` and bounds
    the two traces' difference by that, not by the time since then."""
    from .. import format as fmt
    from .._core import engine
    from .._core.lifecycle import session

    if session() is not None:
        engine.record_special(engine.META, {"name": fmt.META_CLOCK_ANCHOR, "args": {
            "wall_ns": time.time_ns(), "mono_ns": time.perf_counter_ns(), "clock": "perf_counter_ns"}})


def _positive(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"profile_steps: {name} must be an integer >= {minimum}, got {value!r}")
    return value


class StepProfiler:
    """What :func:`profile_steps` returns: the running schedule. ``paths`` lists the
    profiler traces written so far; ``stop()`` (or leaving its ``with`` block) ends it
    and writes a window cut short.

    The torch profiler exists only around a window: it is created and started
    ``warmup`` steps before the window's first profiled step and stopped after its
    last, so a step between windows costs a counter and a comparison.
    """

    def __init__(self, optimizer: Any = None, *, every: int = 100, active: int = 2,
                 warmup: int = 1, skip_first: int = 0, activities: Any = None,
                 record_shapes: bool = False, with_stack: bool = False) -> None:
        every = _positive("every", every, 1)
        active = _positive("active", active, 1)
        warmup = _positive("warmup", warmup, 0)
        skip_first = _positive("skip_first", skip_first, 0)
        if active + warmup > every:
            raise ValueError(f"profile_steps: active + warmup ({active} + {warmup}) must not "
                             f"exceed every ({every})")
        if activities is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.paths: list[str] = []
        self.steps = 0  # steps ended since the schedule began
        self._every, self._active, self._warmup = every, active, warmup
        self._options = {"activities": activities, "record_shapes": record_shapes,
                         "with_stack": with_stack}
        #: The step index at which the next window's profiler starts (its warm-up).
        self._next_start = skip_first + every - active - warmup
        self._profiler: Any = None
        self._window_end = -1  # the last profiled step of the running window
        self._handles: list[Any] = []
        self._stopped = False
        opts = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer] if optimizer else []
        if opts:  # the first optimizer's steps count, as trace_compute counts them
            self._handles.append(opts[0].register_step_post_hook(self._after_optimizer_step))
        self._begin_window_if_due()

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.step()

    def step(self) -> None:
        """One training step has ended (called for you by the optimizer's hook)."""
        if self._stopped:
            return
        self.steps += 1
        if self._profiler is not None or self.steps == self._next_start:
            self._advance()

    @guarded
    def _advance(self) -> None:
        if self._profiler is None:
            self._begin_window_if_due()
            return
        self._profiler.step()  # the window's last step ending writes its trace
        if self.steps > self._window_end:
            self._end_window()
            self._begin_window_if_due()

    def _begin_window_if_due(self) -> None:
        if self.steps != self._next_start:
            return
        start = self._next_start
        self._next_start += self._every
        self._window_end = start + self._warmup + self._active - 1
        profiler = torch.profiler.profile(
            schedule=torch.profiler.schedule(skip_first=start, wait=0, warmup=self._warmup,
                                             active=self._active, repeat=1),
            on_trace_ready=self._write, **self._options)
        # ProfilerStep#N markers carry the step index: the profiler counts from ours
        # (both attributes are the profiler's public state, read by start()).
        profiler.step_num = start
        profiler.current_action = profiler.schedule(start)
        profiler.start()
        # The host as dftrace's own metadata names it: the analysis joins the two
        # files of one process by host and pid (the profiler does not write its host).
        profiler.add_metadata("host_name", _hostname())
        _clock_anchor()
        self._profiler = profiler

    def _end_window(self) -> None:
        profiler, self._profiler = self._profiler, None
        profiler.stop()

    @guarded
    def _write(self, profiler: Any) -> None:
        last = min(self.steps - 1, self._window_end)
        first = max(self._window_end - self._active + 1, 0)
        path = f"{_stem()}.steps-{first}-{last}.pt.trace.json.gz"
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        profiler.export_chrome_trace(path)
        self.paths.append(path)

    def stop(self) -> None:
        """End the schedule: hooks removed, a window in progress written."""
        if self._stopped:
            return
        self._stopped = True
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._profiler is None:
            return
        try:
            self._end_window()
        except Exception as exc:  # noqa: BLE001 - never into the training loop
            warn_once("profile_steps", f"dftrace.torch.profile_steps: stopping the profiler failed: {exc!r}")

    def __enter__(self) -> StepProfiler:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def profile_steps(optimizer: Any = None, *, every: int = 100, active: int = 2, warmup: int = 1,
                  skip_first: int = 0, activities: Any = None, record_shapes: bool = False,
                  with_stack: bool = False) -> StepProfiler:
    """Record ``active`` training steps with the PyTorch profiler every ``every`` steps
    (after ``warmup`` steps of profiler warm-up, and after ``skip_first`` steps), and
    write each window next to the process's dftrace file as
    ``<dftrace file stem>.steps-<first>-<last>.pt.trace.json.gz``.

    ``optimizer`` (or a list, whose first one counts) drives the schedule through its
    step hook; without one, call ``.step()`` at the end of each step. ``activities``
    defaults to the CPU, plus CUDA when a GPU is there. Use it as a context manager,
    or call ``stop()``. Bad arguments raise ``ValueError`` naming the argument.
    """
    return StepProfiler(optimizer, every=every, active=active, warmup=warmup,
                        skip_first=skip_first, activities=activities,
                        record_shapes=record_shapes, with_stack=with_stack)
