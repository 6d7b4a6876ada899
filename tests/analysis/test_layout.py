"""The package's layout rules, read from the code's imports: the analysis's stages
import only downwards, the format package imports neither the recorder nor the
analysis, and the recorder never imports the analysis (CONTRIBUTING.md, "The
analysis's map")."""

from __future__ import annotations

import pytest
from _imports import import_graph

#: The analysis's stages, lowest first; the same rank may not import each other either
#: (render and export are siblings).
STAGES = {"runtime": 0, "read": 1, "reduce": 2, "answers": 3, "render": 4, "export": 4}
TOP = 5  # commands.py and the package's __init__


def _stage(module: str) -> int | None:
    """The stage rank of an analysis module, None outside the analysis."""
    parts = module.split(".")
    if parts[:2] != ["dftrace", "analysis"]:
        return None
    return STAGES.get(parts[2], TOP) if len(parts) > 2 else TOP


def _stage_name(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[2] in STAGES else "top"


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """The imports of ``graph`` from an analysis module to a stage not below its own."""
    wrong = []
    for module, targets in graph.items():
        mine = _stage(module)
        if mine is None:
            continue
        for target in targets:
            theirs = _stage(target)
            if theirs is not None and _stage_name(target) != _stage_name(module) and theirs >= mine:
                wrong.append(f"{module} imports {target}")
    return sorted(wrong)


def test_the_analysis_stages_import_only_downwards():
    wrong = _upward(import_graph())
    assert not wrong, "imports that point up (or across) a stage:\n" + "\n".join(wrong)


@pytest.mark.parametrize("folder, forbidden", [
    ("format", ("dftrace.analysis", "dftrace._core", "dftrace._inspect", "dftrace.torch")),
    ("_core", ("dftrace.analysis",)),
])
def test_the_lower_floors_import_nothing_above(folder, forbidden):
    wrong = [f"{module} imports {target}" for module, targets in import_graph().items()
             if module.startswith(f"dftrace.{folder}") for target in targets if target.startswith(forbidden)]
    assert not wrong, "\n".join(sorted(wrong))


def test_the_check_sees_an_import_that_points_up():
    """The rule finds a read module importing an answer, and a renderer importing an export."""
    graph = {"dftrace.analysis.read.m": {"dftrace.analysis.answers.summary", "dftrace.analysis.read.schema"},
             "dftrace.analysis.render.text": {"dftrace.analysis.export.tables"}}
    assert _upward(graph) == ["dftrace.analysis.read.m imports dftrace.analysis.answers.summary",
                              "dftrace.analysis.render.text imports dftrace.analysis.export.tables"]
