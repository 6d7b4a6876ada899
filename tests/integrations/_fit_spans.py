"""What the framework callbacks' tests check alike in the spans of a fit."""

from __future__ import annotations

from typing import Any


def fit_batches(result: Any, batches: list[tuple[int, int, int]]) -> list[dict[str, Any]]:
    """Assert that a fit of ``result`` wrote one pipeline.train holding a pipeline.epoch
    per epoch of ``batches``, and a compute span per batch whose (epoch, batch, step)
    args are ``batches``, in order; return those compute spans."""
    [train] = result.spans("train", "pipeline")
    epochs = result.spans("epoch", "pipeline")
    assert [e["args"]["epoch"] for e in epochs] == sorted({epoch for epoch, _, _ in batches})
    assert all(e["args"]["p_idx"] == train["id"] for e in epochs)
    spans = result.spans("compute", "compute")
    assert [(b["args"]["epoch"], b["args"]["batch"], b["args"]["step"]) for b in spans] == batches
    return spans
