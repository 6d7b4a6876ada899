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


def test_a_source_tree_without_its_engine_says_so_when_another_dftrace_has_it(tmp_path):
    """A Python started inside a clone (after ``pip install .``) imports the tree, which
    has no compiled engine: it warns, naming the tree and the dftrace that has the
    engine. Not when the pure engine is asked for, nor where the tree's own engine is
    there."""
    import os
    import shutil

    import pytest

    import dftrace
    from dftrace._core import engine

    if engine.speedups is None:
        pytest.skip("needs an install with the C engine built beside the tree under test")
    package = os.path.dirname(dftrace.__file__)
    tree = tmp_path / "clone"
    shutil.copytree(package, tree / "dftrace",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    (tree / "pyproject.toml").write_text("[project]\nname = 'dftrace'\n")
    env = {k: v for k, v in os.environ.items() if k not in ("DFTRACE_NO_SPEEDUPS", "PYTHONPATH")}
    code = "import dftrace, sys; print(dftrace.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.strip() == str(tree / "dftrace" / "__init__.py")
    assert f"imported from the source tree {str(tree)!r}, which has no compiled engine" in out.stderr
    assert "pip install -e ." in out.stderr
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True,
                         env={**env, "DFTRACE_NO_SPEEDUPS": "1"})
    assert out.returncode == 0 and "source tree" not in out.stderr
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stderr == ""
