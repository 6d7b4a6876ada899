"""Where the time went: each activity group's busy time, alone and overlapped with the
others (compute, data loading, communication, checkpoint, device transfer), from the
busy-interval masks of every process."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from ..reduce.combine import Combined
from ..reduce.busy import GROUPS
from .context import Context


def time_breakdown(combined: Combined, procs: pl.DataFrame) -> dict[str, Any]:
    n = len(GROUPS)
    size = 1 << n
    per_proc: dict[int, np.ndarray] = {}
    for proc, mask, us in combined.overlap.iter_rows():
        per_proc.setdefault(proc, np.zeros(size, dtype=np.int64))[mask] += us
    labels = dict(procs.select("proc", "label").iter_rows())
    ranks = dict(procs.select("proc", "rank").iter_rows())
    totals = np.zeros(size, dtype=np.int64)
    wall_total = 0
    rows = []
    for proc, start, end in combined.extents.sort("proc").select("proc", "start", "end").iter_rows():
        per_mask = per_proc.get(proc, np.zeros(size, dtype=np.int64))
        wall = end - start
        totals += per_mask
        wall_total += wall
        busy, exclusive = _busy_exclusive(per_mask, n)
        rows.append(
            {
                "label": labels[proc], "rank": ranks[proc], "wall_us": wall,
                "busy_us": busy, "exclusive_us": exclusive,
                "idle_us": int(wall - per_mask[1:].sum()),
            }
        )
    busy, exclusive = _busy_exclusive(totals, n)
    groups = [
        {
            "group": g,
            "busy_us": busy[g],
            "exclusive_us": exclusive[g],
            "overlapped_us": busy[g] - exclusive[g],
            "share_of_wall": round(busy[g] / wall_total, 4) if wall_total else None,
            "overlap_share": round((busy[g] - exclusive[g]) / busy[g], 4) if busy[g] else None,
        }
        for g in GROUPS
    ]
    pairs = [
        {"a": GROUPS[i], "b": GROUPS[j],
         "overlap_us": int(sum(totals[m] for m in range(size) if m >> i & 1 and m >> j & 1))}
        for i in range(n)
        for j in range(i + 1, n)
    ]
    idle = int(wall_total - totals[1:].sum())
    return {
        "wall_us": int(wall_total),
        "groups": groups,
        "idle_us": idle,
        "idle_share": round(idle / wall_total, 4) if wall_total else None,
        "pairs": [p for p in pairs if p["overlap_us"]],
        "processes": rows,
    }


def _busy_exclusive(per_mask: np.ndarray, n: int) -> tuple[dict[str, int], dict[str, int]]:
    masks = np.arange(1 << n)
    busy = {g: int(per_mask[(masks >> i) & 1 == 1].sum()) for i, g in enumerate(GROUPS)}
    exclusive = {g: int(per_mask[1 << i]) for i, g in enumerate(GROUPS)}
    return busy, exclusive


def answer(context: Context) -> dict[str, Any]:
    """Stage 3: busy, exclusive and overlapped time per activity group."""
    return {"breakdown": time_breakdown(context.combined, context.procs)}
