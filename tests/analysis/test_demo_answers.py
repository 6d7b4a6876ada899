"""The summary of the bundled toy demo (one process, no framework): the loop's steps,
evaluation outside them, and nothing about stragglers."""

from __future__ import annotations

import pytest

pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from dftrace.analysis import render_text, summarize  # noqa: E402
from dftrace.cli import main as cli_main  # noqa: E402
from dftrace.testing import read_events  # noqa: E402


def test_toy_demo_steps_and_no_straggler(tmp_path, capsys):
    """2 epochs x 8 steps (256 samples, batches of 32): 16 steps; the evaluation after
    each epoch's last step is not part of it; one process, so no straggler lines."""
    assert cli_main(["demo", "--out", str(tmp_path), "--epochs", "2"]) == 0
    capsys.readouterr()
    summary = summarize(tmp_path)
    assert [(s["epoch"], s["step"]) for s in summary.steps] == [(e, s) for e in range(2) for s in range(8)]
    # The last step of epoch 0 ends where the evaluation begins: merging that step
    # keeps its own forward, none of the evaluation's.
    merged = tmp_path / "last-step.json"
    assert cli_main(["merge", str(tmp_path), "-o", str(merged), "--steps", "7", "--epoch", "0"]) == 0
    kept = [e for e in read_events(merged, strict=False) if e.get("ph") == "X"]
    assert [e["name"] for e in kept if e["cat"] == "compute" and e["name"] == "forward"] == ["forward"]
    assert not [e for e in kept if e["name"] == "evaluate"]
    assert [e["epoch"] for e in summary.epochs] == [0, 1]
    assert summary.stragglers == [] and summary.imbalance["ranks"] == []
    text = render_text(summary)
    assert "Stragglers" not in text and "held the others back" not in text and "epoch None" not in text
