"""The analysis's C kernels (``_kernels``: the line scanner of ``scan.c`` and the
interval and step sweeps of ``sweeps.c``): one choice for the whole analysis, made here.

:data:`C` is the kernels module, or None where they were not built, do not load, or
speedups are switched off (``DFTRACE_NO_SPEEDUPS=1``); the readers and sweeps then run
their polars and numpy paths. Every caller reads ``kernels.C`` as it runs, so this is
the one place the choice is held (a test that compares both paths sets it to None)."""

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


#: The kernels the analysis runs: the C module, or None for the polars and numpy paths.
C: ModuleType | None = analysis_kernels()


def name() -> str:
    """``"C"`` or ``"numpy"``: which kernels the analysis runs (``summary --json`` says)."""
    return "C" if C is not None else "numpy"
