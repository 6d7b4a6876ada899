"""Small helpers shared by the core tests."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from dftrace.format import validate_file


def assert_valid(paths: list[str]) -> None:
    """Every file obeys docs/format.md (the validator finds nothing)."""
    for p in paths:
        problems = validate_file(p)
        assert problems == [], f"{p}: {problems[:5]}"


def by_id(events: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {e["id"]: e for e in events if e.get("ph") == "X"}


def check_nesting(events: list[dict[str, Any]]) -> None:
    """Each span lies inside its parent (same pid/tid) and is one level deeper."""
    spans = by_id(events)
    for e in spans.values():
        p = e["args"]["p_idx"]
        if p == 0:
            assert e["args"]["level"] == 1, e
            continue
        parent = spans[p]
        assert (parent["pid"], parent["tid"]) == (e["pid"], e["tid"])
        assert parent["ts"] <= e["ts"] and e["ts"] + e["dur"] <= parent["ts"] + parent["dur"], (parent, e)
        assert e["args"]["level"] == parent["args"]["level"] + 1


def per_tid(events: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            out[e["tid"]].append(e)
    return out
