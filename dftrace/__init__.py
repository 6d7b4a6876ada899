"""dftrace: an event tracer for AI/DL pipelines.

Annotate code with the ``ai`` tree (``@ai.compute.forward``, ``with ai.comm.all_reduce:``,
``for b in ai.dataloader.fetch.iter(loader):``), call :func:`initialize`, and get one
Chrome-trace file per process that Perfetto and DFAnalyzer open.

Importing this package loads the core only: no torch, TensorFlow, pandas or Dask.
"""

from typing import Any

from ._core.config import Config, ConfigError
from ._inspect import capturing as _capturing  # registers node(capture=...) uses
from ._core.tree import CATEGORIES, AITree, Node, Span, Use, ai
from ._core.lifecycle import finalize, initialize, session
from ._core.session import Session
from ._version import __version__

__all__ = [
    "AITree",
    "CATEGORIES",
    "Config",
    "ConfigError",
    "InMemoryTracing",
    "Node",
    "Session",
    "Span",
    "Trace",
    "Use",
    "__version__",
    "ai",
    "finalize",
    "initialize",
    "instrument",
    "last_in_memory_trace",
    "session",
    "trace_in_memory",
]

# Inspection tools load on first use, keeping ``import dftrace`` light.
_LAZY = {"Trace": "_inspect.browse", "InMemoryTracing": "_inspect.memory",
         "trace_in_memory": "_inspect.memory", "last_in_memory_trace": "_inspect.memory",
         "instrument": "_inspect.instrument"}
# Names of 0.1.0, still there (deprecated: they warn when called).
_DEPRECATED = {"capture": "_inspect.memory", "last_capture": "_inspect.memory"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name) or _DEPRECATED.get(name)
    if module is None:
        raise AttributeError(f"module 'dftrace' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    if name in _LAZY:  # the deprecated names stay out of the namespace and of dir()
        globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


from ._core.lifecycle import autostart as _autostart  # noqa: E402

_autostart()
del _autostart
