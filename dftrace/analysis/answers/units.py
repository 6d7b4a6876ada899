"""Quantities as text, the same in every answer's notes and every rendering: counts,
durations, byte counts, file labels."""

from __future__ import annotations

from typing import Any


def count_of(n: int, noun: str, plural: str | None = None) -> str:
    """``1 file`` / ``2 files``."""
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"


def format_us(us: float | None) -> str:
    """A duration in microseconds, in the unit that reads best (us, ms, s, min)."""
    if us is None:
        return "-"
    if abs(us) < 1_000:
        return f"{us:.0f} us" if float(us).is_integer() else f"{us:.1f} us"
    if abs(us) < 1_000_000:
        return f"{us / 1_000:.2f} ms"
    if abs(us) < 600_000_000:
        return f"{us / 1_000_000:.2f} s"
    return f"{us / 60_000_000:.1f} min"


def format_bytes(n: float | None) -> str:
    """A byte count in the unit that reads best (B, KiB, MiB, GiB, TiB)."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def file_label(row: dict[str, Any]) -> str:
    """A file row's path, else its hash, else that its calls named no file."""
    return row["path"] or (f"(hash {row['fhash']})" if row["fhash"] else "(no file)")
