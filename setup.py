"""The package's C parts. They are optional: without a compiler dftrace runs in pure
Python. ``DFTRACE_REQUIRE_SPEEDUPS=1`` at install time makes a failed C build fail the
install instead (CI sets it, so a broken engine cannot pass unnoticed)."""

import os
from glob import glob

from setuptools import Extension, setup

required = os.environ.get("DFTRACE_REQUIRE_SPEEDUPS", "").strip() not in ("", "0")

setup(ext_modules=[
    # The recording engine, one module in units (dftrace/_core/engine_c/engine.h maps them):
    # records, span styles, encoder, writer loop, shared-memory ring.
    Extension("dftrace._core._speedups", sorted(glob("dftrace/_core/engine_c/*.c")),
              depends=sorted(glob("dftrace/_core/engine_c/*.h")), optional=not required),
    # The reader of trace lines for analysis and its interval sweeps; without it loading
    # parses with polars alone and the sweeps run in numpy.
    Extension("dftrace.analysis._scan", ["dftrace/analysis/_scan.c", "dftrace/analysis/_sweeps.c"],
              optional=not required),
])
