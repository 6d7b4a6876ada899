"""DFTracer-compatible spelling: port a DFTracer program by changing one import.

    from dftrace.logger import ai, dftracer, dft_fn

    log = dftracer.initialize_log(logfile="run.pfw", data_dir=None, process_id=-1)
    fn = dft_fn("COMPUTE")

    @fn.log
    def step(batch): ...

    for x in fn.iter(loader): ...
    log.finalize()

Events keep DFTracer's names: ``fn.log`` names the event after the function's
``__qualname__``, ``fn.iter(x, name="loop")`` writes ``loop.iter`` and ``loop.yield``
spans. Unlike DFTracer, every use records its own start time, so threads and
recursion lose nothing.
"""

from __future__ import annotations

import inspect
import os
import time
from typing import Any, Callable, Iterable, TypeVar

from ._core import engine as _engine
from ._core.tree import Node, ai
from ._core.lifecycle import finalize, initialize, session

__all__ = ["ai", "dftracer", "dft_fn"]

F = TypeVar("F", bound=Callable[..., Any])


#: The events ``log_event`` writes: a node (with no sticky args) per name and category.
_LOGGED: dict[tuple[str, str], Node] = {}


def _logged_event(name: str, cat: str) -> Node:
    node = _LOGGED.get((name, cat))
    if node is None:
        node = _LOGGED[(name, cat)] = Node(name, cat)
    return node


class dftracer:  # noqa: N801 - DFTracer's spelling
    """The process-wide logger handle DFTracer programs expect."""

    _instance: dftracer | None = None

    @classmethod
    def get_instance(cls) -> dftracer:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    @staticmethod
    def initialize_log(logfile: str | None = None, data_dir: str | None = None,
                       process_id: int = -1) -> dftracer:
        """Start tracing; ``logfile`` (``.pfw`` suffix optional) is the file prefix.
        ``data_dir`` (colon-separated prefixes, or ``all``) traces the file I/O under
        it, as DFTracer does (``io=True``; ``DFTRACE_IO=0`` keeps it off).
        ``DFTRACER_ENABLE=0`` in the environment starts nothing, as in DFTracer."""
        if os.environ.get("DFTRACER_ENABLE", "").strip() == "0":
            return dftracer.get_instance()
        options: dict[str, Any] = {}
        if logfile:
            prefix = str(logfile)
            for suffix in (".pfw.gz", ".pfw.zst", ".pfw"):
                if prefix.endswith(suffix):
                    prefix = prefix[: -len(suffix)]
            options["log_file"] = prefix
        if data_dir:
            options["data_dir"] = str(data_dir)
            if not os.environ.get("DFTRACE_IO", "").strip():
                options["io"] = True
        initialize(**options)
        return dftracer.get_instance()

    def finalize(self) -> None:
        finalize()

    def get_time(self) -> int:
        """Microseconds since the epoch, on the trace's clock."""
        s = session()
        if s is None:
            return time.time_ns() // 1000
        return (time.perf_counter_ns() + s.offset_ns) // 1000

    def enter_event(self) -> None:  # nesting is tracked automatically
        pass

    def exit_event(self) -> None:
        pass


    def log_event(self, name: str, cat: str, start_time: int, duration: int,
                  int_args: dict | None = None, float_args: dict | None = None,
                  string_args: dict | None = None) -> None:
        """Record a finished event given in microseconds (DFTracer's ``log_event``)."""
        s = session()
        if s is None:
            return
        try:
            args: dict[str, Any] = {}
            for group in (int_args, float_args, string_args):
                for k, v in (group or {}).items():
                    # DFTracer passes (tag type, value) pairs; plain values work too.
                    args[k] = v[1] if isinstance(v, tuple) and len(v) == 2 else v
            t0 = int(start_time) * 1000 - s.offset_ns
            t1 = t0 + int(duration) * 1000
            _logged_event(str(name), str(cat)).record(t0, t1, args)
        except Exception:
            pass

    def log_metadata_event(self, key: str, value: Any) -> None:
        """A ``CM`` metadata event ``key`` = ``value``."""
        if session() is None:
            return
        try:
            stk = _engine.current_stack()
            _engine.record_special(_engine.META, {"name": "CM", "args": {"name": str(key), "value": value}},
                                stk.tid)
        except Exception:
            pass


def _some_loop_spans(node: Node, iterable: Iterable[Any], include_iter: bool, include_yield: bool) -> Any:
    """``dft_fn.iter`` writing only the ``.iter`` or only the ``.yield`` spans."""
    count = 0
    waits = _logged_event(node.name + ".iter", node.cat)
    uses = _logged_event(node.name + _LoopNode.BLOCK_SUFFIX, node.cat)
    it = iter(iterable)
    while True:
        t0 = _engine.clock()
        try:
            item = next(it)
        except StopIteration:
            return
        t1 = _engine.clock()
        count += 1
        if include_iter:
            waits.record(t0, t1, {"count": count})
        yield item
        if include_yield:
            uses.record(t1, _engine.clock(), {"count": count})


class _LoopNode(Node):
    """``dft_fn.iter`` names its per-item spans ``<name>.iter`` and ``<name>.yield``."""

    BLOCK_SUFFIX = ".yield"


class dft_fn(Node):  # noqa: N801 - DFTracer's spelling
    """A named event in a category of your choice: context manager, ``.log``
    decorator (event named after the function), ``.log_init``, ``.iter``, ``.update``."""

    def __init__(self, cat: str, name: str | None = None, epoch: int | None = None,
                 step: int | None = None, image_idx: int | None = None,
                 image_size: float | None = None, enable: bool = True):
        if not name:
            try:
                name = inspect.stack()[1].function
            except Exception:
                name = str(cat)
        super().__init__(str(name), str(cat), None, f"dft_fn({cat!r}, {name!r})")
        if not enable:
            self.disable()
        self.update(epoch=epoch, step=step, image_idx=image_idx, image_size=image_size)

    def update(self, epoch: int | None = None, step: int | None = None,  # type: ignore[override]
               image_idx: int | None = None, image_size: float | None = None,
               args: dict[str, Any] | None = None, **kwargs: Any) -> dft_fn:
        """Sticky args for this event and the functions it decorates. As in DFTracer,
        they also reach this event's own ``with`` block if one is open here."""
        new = {k: v for k, v in (("epoch", epoch), ("step", step), ("image_idx", image_idx),
                                 ("image_size", image_size)) if v is not None}
        new.update(args or {})
        new.update(kwargs)
        if new:
            Node.update(self, new)
            _engine.restick_open(self)
        return self

    def _child(self, name: str, cls: type[Node] = Node) -> Node:
        child = self._children.get(name)
        if child is None:
            child = self._add(name, cls(name, self.cat, self, f"{self.path}.{name}"))
        return child

    def log(self, f_py: Any = None, name: str | None = None) -> Any:
        """Decorate a function, bare (``@fn.log``) or named (``@fn.log(name="x")``); its
        calls are events named ``name``, else ``func.__qualname__``."""
        def decorate(func: F) -> F:
            return self._child(name or getattr(func, "__qualname__", str(func))).decorate(func)

        return decorate(f_py) if callable(f_py) else decorate

    log_static = log

    def log_init(self, f_py: Any = None, name: str | None = None) -> Any:
        """Decorate a constructor; events are named ``Class.__init__`` (or ``name``)."""
        return self.log(f_py, name)

    def iter(self, iterable: Iterable[Any], name: str = "loop", iter_name: str = "step",  # type: ignore[override]
             include_yield: bool = True, include_iter: bool = True) -> Any:
        """Per item, ``<name>.iter`` and ``<name>.yield`` spans with ``args.count``
        (either left out by ``include_iter=False`` / ``include_yield=False``)."""
        node = self._child(name, _LoopNode)
        if include_yield and include_iter:
            return node.iter(iterable)
        return _some_loop_spans(node, iterable, include_iter, include_yield)

    def log_metadata(self, key: str, value: Any) -> None:
        dftracer.get_instance().log_metadata_event(key, value)

    def flush(self) -> dft_fn:
        return self

    def reset(self) -> dft_fn:
        return self
