"""``dftrace diff`` as text: a :class:`~dftrace.analysis.answers.diff.RunDiff` rendered for the terminal."""

from __future__ import annotations

from typing import Any

from ..answers.diff import SECTIONS, STEP_BLOCKS, DiffRow, RunDiff, interval_text, signed_text, value_text
from ..answers.units import count_of, format_us

__all__ = ["parse_percent", "render_diff"]


def parse_percent(text: str) -> float:
    """``5%`` or ``5`` (both 5 %) as the fraction 0.05."""
    raw = text.strip()
    try:
        value = float(raw[:-1] if raw.endswith("%") else raw)
    except ValueError:
        raise ValueError(f"expected a percentage such as 5%, got {text!r}") from None
    if value < 0:
        raise ValueError(f"expected a percentage >= 0, got {text!r}")
    return value / 100


def _change(row: DiffRow) -> tuple[str, str, str]:
    """(change, relative change, interval) as printed."""
    if row.change is None:
        if row.base is None and row.new is None:
            return "", "", ""  # in neither run (no communication, say)
        return ("only in base" if row.new is None else "only in new"), "", ""
    relative = f"{row.relative * 100:+.1f}%" if row.relative is not None else ""
    return signed_text(row.unit, row.change), relative, interval_text(row) if row.low is not None else ""


def render_diff(diff: RunDiff, base_name: str = "base", new_name: str = "new", *, top: int = 20) -> str:
    """The comparison as terminal tables: what changed beyond noise (the ``top`` rows
    with the largest effect on step time), then every section side by side (per name:
    the ``top`` names with the most time)."""
    from .text import _table

    def describe(run: dict[str, Any]) -> str:
        ranks = count_of(run["ranks"], "rank") if run["ranks"] else count_of(run["processes"], "process", "processes")
        broken = f", {count_of(run['broken_lines'], 'broken line')}" if run.get("broken_lines") else ""
        return f"{ranks}, {count_of(run['rank_steps'], 'rank-step')}, {count_of(run['events'], 'event')}{broken}"

    runs_b, runs_n = diff.runs
    lines = [f"dftrace diff: base {base_name} ({_runs_of(runs_b)}{describe(diff.base)})",
             f"              new  {new_name} ({_runs_of(runs_n)}{describe(diff.new)})"]
    if runs_b + runs_n > 2:
        lines.append(f"  noise: the spread of each figure over the runs; intervals are 95 % "
                     f"(Welch's t), means over {runs_b} and {runs_n} runs")
    else:
        lines.append(f"  noise: step figures from the spread over blocks of consecutive steps "
                     f"(up to {STEP_BLOCKS} per run), a name's mean from the spread of its durations; "
                     "other figures have no interval with one run per side: several runs per side give "
                     "a sharper answer")
        if diff.speed is not None and diff.ranks_apart is not None:
            least, most = diff.ranks_apart
            lines.append(f"  machine speed: at most {diff.speed:.3f}x, as the least changed rank's steps "
                         f"(the ranks' steps changed unevenly, {least:.3f}x to {most:.3f}x as long, which no "
                         "machine's speed does); time figures are judged by their change beyond that")
        elif diff.speed is not None:
            lines.append(f"  machine speed: the names took {diff.speed:.3f}x as long in new (median over "
                         "names, weighed by time); time figures are judged by their change beyond that")
        if diff.moved:
            moved = ", ".join(f"{name} ({step * 100:+.1f}% of the step)" for name, step in diff.moved.items())
            judged = any(r.noise == "names" for r in diff.rows if r.section == "steps")
            lines.append(f"  moved against the rest of their steps, outside the noise: {moved}"
                         + ("; step figures are judged by that part" if judged else ""))
    lines.append("")
    flagged = _by_subject(diff.flagged)
    threshold = f"{diff.threshold * 100:g}%"
    if flagged:
        where = ("outside the noise" if runs_b + runs_n > 2
                 else "outside the noise where it is estimated (the rows with an interval)")
        lines.append(f"Changed beyond {threshold}, {where}; largest effect on step time first")
        lines.append("  per step: how much the row's name (or figure) moved the time of a rank-step; "
                     "also: its other figures that changed")
        rows = [(lead.metric, value_text(lead.unit, lead.base), value_text(lead.unit, lead.new), *_change(lead),
                 _per_step(lead), _also(lead, others)) for lead, others in flagged[:top]]
        lines += _table(("metric", "base", "new", "change", "%", "95% interval", "per step", "also"), rows,
                        (False, True, True, True, True, True, True, False))
        if len(flagged) > top:
            lines.append(f"  ... {len(flagged) - top} more (--rows, or --json)")
    else:
        lines.append(f"Nothing changed beyond {threshold} outside the noise.")
    shown_names = _busiest_names(diff, top)
    for section in SECTIONS:
        rows = [r for r in diff.rows if r.section == section]
        if section == "categories":
            hidden = len({_name_of(r) for r in rows} - shown_names)
            rows = [r for r in rows if _name_of(r) in shown_names]
        if not rows:
            continue
        lines += ["", _SECTION_TITLES[section]]
        table = [(r.metric, value_text(r.unit, r.base), value_text(r.unit, r.new), *_change(r), "*" if r.flagged else "",
                  r.note) for r in rows]
        lines += _table(("metric", "base", "new", "change", "%", "95% interval", "flag", "note"), table,
                        (False, True, True, True, True, True, False, False))
        if section == "categories" and hidden:
            lines.append(f"  ... {hidden} more names (--rows, or --json)")
    return "\n".join(lines) + "\n"


def _runs_of(count: int) -> str:
    return f"{count} runs, mean of " if count > 1 else ""


def _name_of(row: DiffRow) -> str:
    return row.metric.rsplit(".", 1)[0]


def _busiest_names(diff: RunDiff, top: int) -> set[str]:
    """The ``top`` names with the most time in either run."""
    totals: dict[str, float] = {}
    for row in diff.rows:
        if row.section == "categories" and row.metric.endswith(".total"):
            totals[_name_of(row)] = max(row.base or 0, row.new or 0)
    return set(sorted(totals, key=lambda name: -totals[name])[:top])


def _by_subject(flagged: list[DiffRow]) -> list[tuple[DiffRow, list[DiffRow]]]:
    """The flagged rows, one line per name (a name's count, total, mean and p95 are one
    line; other figures each their own), in the order of their first row: (the row
    shown, the name's other flagged rows). The row shown is the one whose change has the
    sign of its effect on the step (a count that rose while the name's time per step
    fell does not lead), preferring the mean, then the total."""
    subjects: dict[str, list[DiffRow]] = {}
    for row in flagged:
        subjects.setdefault(_name_of(row) if row.section == "categories" else row.metric, []).append(row)
    lines = []
    for rows in subjects.values():
        lead = min(rows, key=lambda r: (not _agrees(r), _LEAD_ORDER.get(r.metric.rsplit(".", 1)[-1], 0)))
        lines.append((lead, [r for r in rows if r is not lead]))
    return lines


#: Which of a name's figures its line shows first, when several changed alike.
_LEAD_ORDER = {"mean": 0, "total": 1, "p95": 2, "count": 3}


def _agrees(row: DiffRow) -> bool:
    """The row's change and its effect on the step have the same sign (or one is none)."""
    return not row.impact_us or not row.change or (row.change > 0) == (row.impact_us > 0)


def _also(lead: DiffRow, others: list[DiffRow]) -> str:
    return ", ".join(f"{r.metric.rsplit('.', 1)[-1]} {_change(r)[1] or _change(r)[0]}" for r in others)


def _per_step(row: DiffRow) -> str:
    if not row.impact_us:
        return ""
    return ("+" if row.impact_us > 0 else "") + format_us(row.impact_us) + "/step"


_SECTION_TITLES = {
    "steps": "Step time (all ranks and steps)",
    "epochs": "Epochs",
    "categories": "Per category and name",
    "breakdown": "Time breakdown",
    "dataloader": "Data-loader stall",
    "stragglers": "Stragglers",
    "gpu": "GPU (PyTorch profiler traces)",
    "io": "File I/O (traced POSIX and STDIO calls)",
    "events": "Events",
}
