"""The optional packages analysis needs, and an actionable error when one is missing."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from ..._install_hint import pip_install

# top-level module -> the extra that installs it
_EXTRAS = {
    "numpy": "analysis",
    "polars": "analysis",
    "plotly": "analysis",
    "tqdm": "analysis",
    "rich": "analysis",
    "dask": "dask",
    "distributed": "dask",
    "mcp": "mcp",
}

#: What every analysis of trace files imports (loading, summaries, conversions).
ANALYSIS = ("polars", "numpy")


class MissingExtraError(ImportError):
    """An optional package is not installed; the message names the ``pip install``."""


def _message(module: str, needed_by: str) -> str:
    extra = _EXTRAS.get(module.split(".")[0], "analysis")
    return f"{needed_by} needs {module!r}, which is not installed: {pip_install(extra)}"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package, or a broken sys.modules entry
        return False


def check_installed(*modules: str, needed_by: str = "dftrace's analysis") -> None:
    """Raise :class:`MissingExtraError` for the first of ``modules`` that is not installed.

    Nothing is imported, so the check can run before any module that needs them and
    the message is the same whatever was imported first.
    """
    for module in modules:
        if not _installed(module.split(".")[0]):
            raise MissingExtraError(_message(module, needed_by))


def missing_extra_message(exc: ImportError, needed_by: str = "dftrace's analysis") -> str | None:
    """The ``pip install`` message for an ImportError of an optional package, else None."""
    name = getattr(exc, "name", None) or ""
    if name.split(".")[0] in _EXTRAS:
        return _message(name, needed_by)
    return None


def require(module: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` naming the ``pip install``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(_message(module, "dftrace's analysis")) from exc
