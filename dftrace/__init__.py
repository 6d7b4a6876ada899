"""dftrace: an event tracer for AI/DL pipelines.

Annotate code with the ``ai`` tree (``@ai.compute.forward``, ``with ai.comm.all_reduce:``,
``for b in ai.dataloader.fetch.iter(loader):``), call :func:`initialize`, and get one
Chrome-trace file per process that Perfetto and DFAnalyzer open.

Importing this package loads the core only: no torch, TensorFlow, pandas or Dask.
"""

from ._capture import Trace, capture, last_capture
from ._config import Config, ConfigError
from ._instrument import instrument
from ._nodes import CATEGORIES, AITree, Node, Span, Use, ai
from ._runtime import Session, finalize, initialize, session
from ._version import __version__

__all__ = [
    "AITree",
    "CATEGORIES",
    "Config",
    "ConfigError",
    "Node",
    "Session",
    "Span",
    "Trace",
    "Use",
    "__version__",
    "ai",
    "capture",
    "finalize",
    "initialize",
    "instrument",
    "last_capture",
    "session",
]

from ._runtime import autostart as _autostart

_autostart()
del _autostart
