"""``import dftrace`` stays light."""

from __future__ import annotations

import subprocess
import sys


def test_import_loads_no_heavy_framework():
    """Importing dftrace (and dftrace.logger) loads neither torch, TensorFlow, pandas, polars nor Dask."""
    code = ("import sys, dftrace, dftrace.logger, dftrace.cli; "
            "heavy = {'torch', 'tensorflow', 'pandas', 'dask', 'polars', 'keras', 'numpy'}; "
            "print(sorted(heavy & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
