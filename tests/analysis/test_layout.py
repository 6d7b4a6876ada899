"""The package's layout rules, read from the code's imports: the analysis's stages
import only downwards, the format package imports neither the recorder nor the
analysis, and the recorder never imports the analysis (CONTRIBUTING.md, "The
analysis's map")."""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator

import pytest

import dftrace

PACKAGE = os.path.dirname(os.path.abspath(dftrace.__file__))
#: The analysis's stages, lowest first; the same rank may not import each other either
#: (render and export are siblings).
STAGES = {"runtime": 0, "read": 1, "reduce": 2, "answers": 3, "render": 4, "export": 4}
TOP = 5  # commands.py and the package's __init__


def _modules(folder: str) -> Iterator[tuple[str, str]]:
    """(dotted module name, path) of every module under ``folder`` of the package."""
    for where, dirs, names in os.walk(os.path.join(PACKAGE, folder)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(where, name)
                rel = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].replace(os.sep, ".")
                yield rel.removesuffix(".__init__"), path


def _imports(module: str, path: str) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of everything ``module`` imports, at any depth of the code:
    ``from a import b`` gives both ``a`` and ``a.b`` (``b`` may be a module)."""
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def _stage(module: str) -> int | None:
    """The stage rank of an analysis module, None outside the analysis."""
    parts = module.split(".")
    if parts[:2] != ["dftrace", "analysis"]:
        return None
    return STAGES.get(parts[2], TOP) if len(parts) > 2 else TOP


def _stage_name(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[2] in STAGES else "top"


def test_the_analysis_stages_import_only_downwards():
    wrong = []
    for module, path in _modules("analysis"):
        mine = _stage(module)
        for line, target in _imports(module, path):
            theirs = _stage(target)
            if theirs is None or _stage_name(target) == _stage_name(module):
                continue
            if theirs >= mine:
                wrong.append(f"{module}:{line} imports {target}")
    assert not wrong, "imports that point up (or across) a stage:\n" + "\n".join(sorted(set(wrong)))


@pytest.mark.parametrize("folder, forbidden", [
    ("format", ("dftrace.analysis", "dftrace._core", "dftrace._inspect", "dftrace.torch")),
    ("_core", ("dftrace.analysis",)),
])
def test_the_lower_floors_import_nothing_above(folder, forbidden):
    wrong = [f"{module}:{line} imports {target}"
             for module, path in _modules(folder) for line, target in _imports(module, path)
             if target.startswith(forbidden)]
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_the_check_sees_an_import_that_points_up(tmp_path):
    """The rule's reader finds a relative import from a lower stage to a higher one."""
    source = tmp_path / "m.py"
    source.write_text("from ..answers.summary import Summary\n")
    found = dict(_imports("dftrace.analysis.read.m", str(source)))
    assert _stage(found[1]) > _stage("dftrace.analysis.read.m")
