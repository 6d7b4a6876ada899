"""Comparing two runs: the answers of each (two :class:`Summary` objects) side by side.

Both runs go through the ordinary pipeline (load -> partials -> :class:`Summary`);
this module only lines their answers up. Every compared figure becomes one row with
its absolute and relative change, whether it moved beyond the noise threshold, and
its *impact*: how much of the change in step time it can account for (its time per
rank-step in NEW minus in BASE), which is what the flagged rows are sorted by.
Figures are per step, per rank-step or shares of process time wherever the summary
has them, so runs with different numbers of ranks compare.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from .. import format as fmt
from ._summary import Summary

#: Changes smaller than this (relative) are noise unless the threshold is set.
DEFAULT_THRESHOLD = 0.05
#: The figure ``--fail-on-regression`` guards unless ``--metric`` names another.
DEFAULT_METRIC = "step.p50"
#: Shares of process time must also move by this much (absolute) to be flagged.
_MIN_SHARE_CHANGE = 0.01

# How a row's values read: microseconds, a count, a share of a whole, a plain ratio.
US, COUNT, SHARE, RATIO = "us", "count", "share", "ratio"


@dataclass
class DiffRow:
    """One compared figure."""

    #: Stable key, for ``--metric`` and machines: ``step.p50``, ``compute.forward.mean``, ...
    metric: str
    #: Table the row belongs to: steps, epochs, categories, breakdown, dataloader,
    #: stragglers, events.
    section: str
    #: How the value reads (``us``, ``count``, ``share``, ``ratio``).
    unit: str
    base: float | None
    new: float | None
    change: float | None
    #: ``change / base``; None when BASE has no (or a zero) value.
    relative: float | None
    #: Moved beyond the threshold (a count that changed at all, a figure only one run has).
    flagged: bool
    #: µs per rank-step this figure's time moved by (0 for figures that are not time).
    impact_us: float
    #: A note for a reader: the straggling rank in each run, ...
    note: str = ""


@dataclass
class RunDiff:
    """Two runs compared: what each is, and every compared figure."""

    base: dict[str, Any]
    new: dict[str, Any]
    threshold: float
    rows: list[DiffRow] = field(default_factory=list)

    @property
    def flagged(self) -> list[DiffRow]:
        """Rows that moved beyond the threshold, biggest impact on step time first."""
        order = {section: i for i, section in enumerate(SECTIONS)}
        rows = [r for r in self.rows if r.flagged]
        return sorted(rows, key=lambda r: (-abs(r.impact_us), -abs(r.relative or 0), order[r.section]))

    def row(self, metric: str) -> DiffRow | None:
        """The row of ``metric``, or None when neither run has it."""
        return next((r for r in self.rows if r.metric == metric), None)

    def regression(self, metric: str, limit: float) -> str | None:
        """Why NEW counts as a regression of ``metric`` by more than ``limit``
        (relative, 0.1 = 10 %), or None when it does not.

        Raises ValueError when ``metric`` is not a figure both runs have.
        """
        row = self.row(metric)
        if row is None or row.base is None or row.new is None:
            known = ", ".join(r.metric for r in self.rows if r.base is not None and r.new is not None)
            raise ValueError(f"--metric {metric!r} is not a figure both runs have; they have: {known}")
        if row.relative is None or row.relative <= limit:
            return None
        return (f"{metric} got worse by {row.relative * 100:.1f}% "
                f"({_value(row.unit, row.base)} -> {_value(row.unit, row.new)}), more than {limit * 100:g}%")

    def to_dict(self) -> dict[str, Any]:
        """The comparison as a JSON-ready dict (``flagged``: metric keys in impact order)."""
        return {
            "base": self.base, "new": self.new, "threshold": self.threshold,
            "flagged": [r.metric for r in self.flagged],
            "rows": [asdict(r) for r in self.rows],
        }

    def to_json(self) -> str:
        """The comparison as JSON text."""
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2).decode()


SECTIONS = ("steps", "epochs", "categories", "breakdown", "dataloader", "stragglers", "gpu", "events")


def compare_summaries(base: Summary, new: Summary, *, threshold: float = DEFAULT_THRESHOLD) -> RunDiff:
    """Compare the answers of two runs (BASE first): one :class:`DiffRow` per figure."""
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    per_step = (_per_rank_step(base), _per_rank_step(new))
    diff = RunDiff(_describe(base), _describe(new), threshold)
    for figure in _figures(base, new):
        diff.rows.append(_row(figure, per_step, threshold))
    return diff


def compare_runs(base: Any, new: Any, *, threshold: float = DEFAULT_THRESHOLD, **options: Any) -> RunDiff:
    """Summarise two runs' trace files (paths, directories, globs, or loaded
    :class:`TraceTable` objects) and compare them; ``options`` go to :func:`summarize`."""
    from ._summary import summarize

    return compare_summaries(summarize(base, **options), summarize(new, **options), threshold=threshold)


@dataclass
class _Figure:
    metric: str
    section: str
    unit: str
    base: float | None
    new: float | None
    #: The figure's time in each run, to divide by rank-steps for the impact
    #: (None: the change itself is per step; omitted: no impact).
    time: tuple[float | None, float | None] | None = (0, 0)
    note: str = ""


def _figures(base: Summary, new: Summary) -> Iterator[_Figure]:
    b, n = base.step_stats, new.step_stats
    for q in ("p50", "p95", "mean"):
        yield _Figure(f"step.{q}", "steps", US, b.get(f"{q}_us"), n.get(f"{q}_us"), time=None)
    units = (_units(base), _units(new))
    per_rank = units[0] != units[1]
    note = "per rank" if per_rank else ""
    yield _Figure("step.count", "steps", COUNT, *_scaled((b.get("count"), n.get("count")), units, per_rank),
                  note=note)
    epoch_b, epoch_n = _epoch_time(base), _epoch_time(new)
    if epoch_b is not None or epoch_n is not None:
        yield _Figure("epoch.time", "epochs", US, epoch_b, epoch_n,
                      note="mean over epochs of the slowest rank's epoch time")
    yield from _category_figures(base, new)
    yield from _breakdown_figures(base, new)
    yield from _dataloader_figures(base, new)
    yield from _straggler_figures(base, new)
    yield from _gpu_figures(base, new)
    for key, label in (("events", "events"), ("dropped_events", "dropped")):
        values = _scaled((base.overview.get(key), new.overview.get(key)), units, per_rank)
        yield _Figure(f"events.{label}", "events", COUNT, *values, note=note)


def _category_figures(base: Summary, new: Summary) -> Iterator[_Figure]:
    """count, total, mean, p95 of each (category, name). Runs with different numbers of
    ranks compare counts and totals per rank."""
    units = (_units(base), _units(new))
    per_rank = units[0] != units[1]
    rows_b = {(r["cat"], r["name"]): r for r in base.categories}
    rows_n = {(r["cat"], r["name"]): r for r in new.categories}
    note = "per rank" if per_rank else ""
    for key in [*rows_b, *(k for k in rows_n if k not in rows_b)]:
        rb, rn = rows_b.get(key, {}), rows_n.get(key, {})
        # Containers (pipeline spans, loop bodies) hold the others' time: no impact of their own.
        container = key[0] == fmt.CAT_PIPELINE or key[1].endswith(fmt.BLOCK_SUFFIX)
        time = (0, 0) if container else (rb.get("total_us", 0), rn.get("total_us", 0))
        name = f"{key[0]}.{key[1]}"
        count = [rb.get("count", 0), rn.get("count", 0)]
        total = [rb.get("total_us"), rn.get("total_us")]
        count, total = _scaled(count, units, per_rank), _scaled(total, units, per_rank)
        yield _Figure(f"{name}.count", "categories", COUNT, *count, time=time, note=note)
        yield _Figure(f"{name}.total", "categories", US, *total, time=time, note=note)
        for stat in ("mean", "p95"):
            yield _Figure(f"{name}.{stat}", "categories", US, rb.get(f"{stat}_us"), rn.get(f"{stat}_us"), time=time)


def _units(summary: Summary) -> int:
    """What figures are per rank of: ranks, else processes."""
    return summary.overview.get("ranks") or summary.overview.get("processes") or 1


def _scaled(values: Sequence[float | None], units: tuple[int, int], per_rank: bool) -> list[float | None]:
    """BASE's and NEW's values, per rank when the runs have different numbers of ranks."""
    if not per_rank:
        return list(values)
    return [None if v is None else round(v / u, 3) for v, u in zip(values, units)]


def _breakdown_figures(base: Summary, new: Summary) -> Iterator[_Figure]:
    groups_b = {g["group"]: g for g in base.breakdown.get("groups", [])}
    groups_n = {g["group"]: g for g in new.breakdown.get("groups", [])}
    for group in [*groups_b, *(g for g in groups_n if g not in groups_b)]:
        gb, gn = groups_b.get(group, {}), groups_n.get(group, {})
        if not gb.get("busy_us") and not gn.get("busy_us"):
            continue
        yield _Figure(f"breakdown.{group}", "breakdown", SHARE, gb.get("share_of_wall"), gn.get("share_of_wall"),
                      time=(gb.get("busy_us", 0), gn.get("busy_us", 0)), note="share of process time")
    if base.breakdown.get("wall_us") or new.breakdown.get("wall_us"):
        yield _Figure("breakdown.idle", "breakdown", SHARE, base.breakdown.get("idle_share"),
                      new.breakdown.get("idle_share"),
                      time=(base.breakdown.get("idle_us", 0), new.breakdown.get("idle_us", 0)),
                      note="share of process time")


def _dataloader_figures(base: Summary, new: Summary) -> Iterator[_Figure]:
    loaders_b = {(d["cat"], d["loader"]): d for d in base.dataloader}
    loaders_n = {(d["cat"], d["loader"]): d for d in new.dataloader}
    for key in [*loaders_b, *(k for k in loaders_n if k not in loaders_b)]:
        db, dn = loaders_b.get(key, {}), loaders_n.get(key, {})
        yield _Figure(f"stall.{key[0]}.{key[1]}", "dataloader", SHARE, db.get("stall"), dn.get("stall"),
                      time=(db.get("iter_us", 0), dn.get("iter_us", 0)),
                      note="share of the loop spent waiting for the next item")


def _straggler_figures(base: Summary, new: Summary) -> Iterator[_Figure]:
    worst_b, worst_n = _worst(base), _worst(new)
    if worst_b or worst_n:
        note = f"{worst_b.get('unit', '-')} -> {worst_n.get('unit', '-')}"
        yield _Figure("straggler.wait_per_step", "stragglers", US, worst_b.get("caused_wait_us_per_step"),
                      worst_n.get("caused_wait_us_per_step"), time=None,
                      note=f"wait the worst rank caused per step ({note})")
    ratio_b, ratio_n = base.imbalance.get("mean_ratio"), new.imbalance.get("mean_ratio")
    if ratio_b is not None or ratio_n is not None:
        slow_b, slow_n = _slowest_rank(base), _slowest_rank(new)
        yield _Figure("straggler.imbalance", "stragglers", RATIO, ratio_b, ratio_n,
                      note=f"mean slowest/median rank step time (slowest most often: {slow_b} -> {slow_n})")


def _gpu_figures(base: Summary, new: Summary) -> Iterator[_Figure]:
    """GPU idle, compute, non-compute and overlap shares, averaged over ranks and devices."""
    if not base.gpu and not new.gpu:
        return
    for key in ("idle", "compute", "non_compute", "comm_compute_overlap"):
        means = [_mean_share([g[f"{key}_pct"] for g in summary.gpu]) for summary in (base, new)]
        yield _Figure(f"gpu.{key}", "gpu", SHARE, *means,
                      note="mean over ranks and devices" + (" of kernel time" if key != "comm_compute_overlap"
                                                            else " of communication time"))
    if base.gpu_steps or new.gpu_steps:
        busy = [_mean_share([s["gpu_busy_pct"] for s in summary.gpu_steps]) for summary in (base, new)]
        yield _Figure("gpu.step_busy", "gpu", SHARE, *busy, note="mean over rank-steps of the GPU's busy share")
        waits = [sum(s["sync_wait_us"] for s in summary.gpu_steps) / len(summary.gpu_steps) if summary.gpu_steps
                 else None for summary in (base, new)]
        yield _Figure("gpu.step_sync_wait", "gpu", US, *waits, time=None,
                      note="host time per rank-step in calls waiting for the GPU")


def _mean_share(pcts: list[float | None]) -> float | None:
    known = [p for p in pcts if p is not None]
    return round(sum(known) / len(known) / 100, 4) if known else None


def _worst(summary: Summary) -> dict[str, Any]:
    return summary.stragglers[0] if summary.stragglers else {}


def _slowest_rank(summary: Summary) -> str:
    ranks = summary.imbalance.get("ranks") or []
    if not ranks:
        return "-"
    return max(ranks, key=lambda r: (r["slowest_count"], r["mean_us"]))["rank"]


def _epoch_time(summary: Summary) -> float | None:
    times = [e["max_us"] for e in summary.epochs if e.get("max_us") is not None]
    return round(sum(times) / len(times), 3) if times else None


def _per_rank_step(summary: Summary) -> int:
    """What a figure's time is divided by to be per step: rank-steps, else processes."""
    return summary.step_stats.get("count") or summary.overview.get("processes") or 1


def _describe(summary: Summary) -> dict[str, Any]:
    o = summary.overview
    return {"files": o["files"], "processes": o["processes"], "ranks": o["ranks"],
            "rank_steps": summary.step_stats.get("count", 0), "events": o["events"], "wall_us": o["wall_us"]}


def _row(figure: _Figure, per_step: tuple[int, int], threshold: float) -> DiffRow:
    b, n = figure.base, figure.new
    change = (n - b) if b is not None and n is not None else None
    relative = change / b if change is not None and b else None
    if b is None or n is None:
        flagged = b is not None or n is not None  # a figure only one run has
    elif figure.unit == COUNT:
        flagged = change != 0
    elif not b:
        flagged = bool(n)
    else:
        flagged = abs(relative) > threshold  # type: ignore[arg-type]
        if figure.unit == SHARE:
            flagged = flagged and abs(change) >= _MIN_SHARE_CHANGE  # type: ignore[arg-type]
    if figure.time is None:
        impact = change or 0.0
    else:
        tb, tn = figure.time
        impact = (tn or 0) / per_step[1] - (tb or 0) / per_step[0]
    return DiffRow(figure.metric, figure.section, figure.unit, b, n,
                   _rounded(change), _rounded(relative, 4), flagged, round(float(impact), 3), figure.note)


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return round(value, digits) if isinstance(value, float) else value


# --- rendering ---------------------------------------------------------------------------


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


def _value(unit: str, value: float | None) -> str:
    from ._render_text import format_us

    if value is None:
        return "-"
    if unit == US:
        return format_us(value)
    if unit == SHARE:
        return f"{value * 100:.1f}%"
    if unit == RATIO:
        return f"{value:.2f}"
    return f"{value:,.0f}"


def _change(row: DiffRow) -> tuple[str, str]:
    from ._render_text import format_us

    if row.change is None:
        return ("only in base" if row.new is None else "only in new"), ""
    if row.unit == US:
        absolute = ("+" if row.change > 0 else "") + format_us(row.change)
    elif row.unit == SHARE:
        absolute = f"{row.change * 100:+.1f} pt"
    elif row.unit == RATIO:
        absolute = f"{row.change:+.2f}"
    else:
        absolute = f"{row.change:+,.0f}"
    relative = f"{row.relative * 100:+.1f}%" if row.relative is not None else ""
    return absolute, relative


def render_diff(diff: RunDiff, base_name: str = "base", new_name: str = "new", *, top: int = 20) -> str:
    """The comparison as terminal tables: what changed beyond noise (the ``top`` rows
    with the largest effect on step time), then every section side by side (per name:
    the ``top`` names with the most time)."""
    from ._render_text import _table, count_of

    def describe(run: dict[str, Any]) -> str:
        ranks = count_of(run["ranks"], "rank") if run["ranks"] else count_of(run["processes"], "process", "processes")
        return f"{ranks}, {count_of(run['rank_steps'], 'rank-step')}, {count_of(run['events'], 'event')}"

    lines = [f"dftrace diff: base {base_name} ({describe(diff.base)})",
             f"              new  {new_name} ({describe(diff.new)})", ""]
    flagged = diff.flagged
    threshold = f"{diff.threshold * 100:g}%"
    if flagged:
        lines.append(f"Changed beyond {threshold} (largest effect on step time first; impact: "
                     "change in the figure's time per rank-step)")
        rows = [(r.metric, _value(r.unit, r.base), _value(r.unit, r.new), *_change(r), _impact(r))
                for r in flagged[:top]]
        lines += _table(("metric", "base", "new", "change", "%", "impact"), rows,
                        (False, True, True, True, True, True))
        if len(flagged) > top:
            lines.append(f"  ... {len(flagged) - top} more (--top, or --json)")
    else:
        lines.append(f"Nothing changed beyond {threshold}.")
    shown_names = _busiest_names(diff, top)
    for section in SECTIONS:
        rows = [r for r in diff.rows if r.section == section]
        if section == "categories":
            hidden = len({_name_of(r) for r in rows} - shown_names)
            rows = [r for r in rows if _name_of(r) in shown_names]
        if not rows:
            continue
        lines += ["", _SECTION_TITLES[section]]
        table = [(r.metric, _value(r.unit, r.base), _value(r.unit, r.new), *_change(r), "*" if r.flagged else "",
                  r.note) for r in rows]
        lines += _table(("metric", "base", "new", "change", "%", "flag", "note"), table,
                        (False, True, True, True, True, False, False))
        if section == "categories" and hidden:
            lines.append(f"  ... {hidden} more names (--top, or --json)")
    return "\n".join(lines) + "\n"


def _name_of(row: DiffRow) -> str:
    return row.metric.rsplit(".", 1)[0]


def _busiest_names(diff: RunDiff, top: int) -> set[str]:
    """The ``top`` names with the most time in either run."""
    totals: dict[str, float] = {}
    for row in diff.rows:
        if row.section == "categories" and row.metric.endswith(".total"):
            totals[_name_of(row)] = max(row.base or 0, row.new or 0)
    return set(sorted(totals, key=lambda name: -totals[name])[:top])


def _impact(row: DiffRow) -> str:
    from ._render_text import format_us

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
    "events": "Events",
}
