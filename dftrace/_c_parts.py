"""Whether the C parts built with the package are used: the core's engine, the trace
readers' whole-member decoders and the analysis's kernels (line scanner and sweeps).

``DFTRACE_NO_SPEEDUPS=1`` switches all of them off, so that the pure-Python and numpy
paths run as they do on an install without a compiler (for comparisons, debugging
and the tests of those paths). It is read when each part is first loaded.
"""

from __future__ import annotations

import os


def speedups_allowed() -> bool:
    """False when ``DFTRACE_NO_SPEEDUPS`` is set to anything but 0."""
    return os.environ.get("DFTRACE_NO_SPEEDUPS", "").strip() in ("", "0")
