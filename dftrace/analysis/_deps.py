"""Importing the optional packages analysis needs, with an actionable error."""

from __future__ import annotations

import importlib
from types import ModuleType

# module -> the extra that installs it
_EXTRAS = {
    "polars": "analysis",
    "plotly": "analysis",
    "tqdm": "analysis",
    "dask": "dask",
    "distributed": "dask",
}


def require(module: str) -> ModuleType:
    """Import ``module`` or raise ImportError naming the ``pip install`` that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra = _EXTRAS.get(module.split(".")[0], "analysis")
        raise ImportError(
            f"dftrace's analysis needs {module!r}, which is not installed: "
            f"pip install 'dftrace[{extra}]'"
        ) from exc
