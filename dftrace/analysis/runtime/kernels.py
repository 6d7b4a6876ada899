"""The analysis's C kernels (``_kernels``: the line scanner of ``scan.c`` and the
interval and step sweeps of ``sweeps.c``), or None where they were not built, do not
load, or speedups are switched off (``DFTRACE_NO_SPEEDUPS=1``); the callers then run
their numpy and polars paths."""

from __future__ import annotations

from types import ModuleType

from ..._c_parts import speedups_allowed


def analysis_kernels() -> ModuleType | None:
    """The C kernels module, or None (see the module docstring)."""
    if not speedups_allowed():
        return None
    try:
        from . import _kernels
    except ImportError:
        return None
    return _kernels
