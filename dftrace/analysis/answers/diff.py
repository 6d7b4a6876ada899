"""Comparing two runs: the answers of each (two :class:`Summary` objects) side by side.

Both runs go through the ordinary pipeline (load -> partials -> :class:`Summary`);
this module only lines their answers up. Every compared figure becomes one row with
its absolute and relative change, a 95 % interval for the change where the noise can
be estimated, whether it moved beyond the threshold and outside the noise, and its
*impact*: how much of the change in step time it can account for (its time per
rank-step in NEW minus in BASE), which is what the flagged rows are sorted by.
Figures are per step, per rank-step or shares of process time wherever the summary
has them, so runs with different numbers of ranks compare.

Noise. With several runs per side, each figure's run-to-run spread gives the
interval (Welch's t interval of the difference of the means). With one run per
side, two things stand in for the runs' spread: the machine's speed (how much
longer every name took in NEW, the median over names of their mean-duration
ratios; a busier machine slows every name alike, a change in the code some) is
taken out of time figures, and step figures get an interval from blocks of
consecutive steps (all ranks together), the figure computed per block; a name's
mean gets one from the spread of its durations. A row is
flagged, and a regression fails, only when its change beyond the machine's speed
is beyond the threshold and its interval excludes the machine's part.

Names that moved. With one run per side and each run's time per name and step at
hand (:func:`step_times`; :func:`compare_runs` and ``dftrace diff`` read them), each
name's time in a step is compared with the rest of the same step (the other names'
time, slowed alike by the machine's load at that moment): the change of that ratio
between the runs is the Hodges-Lehmann estimate with its distribution-free interval
(Mann-Whitney ranks), 95 % for all the names judged together. A name moved when the
interval excludes no change and the move changes the step by more than the threshold;
the moved names' part of the step then judges the step figures (``noise`` "names"),
where the names hold at least half of both runs' steps (:func:`_step_shifts`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from ... import format as fmt
from .step_shifts import (_COVERED, SPEED_MIN_COUNT, SPEED_MIN_SHARE, StepTimes, _covered, ranks_apart,
                           _Shift, _step_shifts, step_times)
from .steps import nearest_rank
from .summary import Summary
from .units import format_bytes, format_us
from .diff_figures import BYTES, COUNT, RATE, RATIO, SHARE, US, Figure, figures_of, per_rank_step


#: Changes smaller than this (relative) are noise unless the threshold is set.
DEFAULT_THRESHOLD = 0.05
#: The figure ``--fail-on-regression`` guards unless ``--metric`` names another.
DEFAULT_METRIC = "step.p50"
#: Shares of process time must also move by this much (absolute) to be flagged.
_MIN_SHARE_CHANGE = 0.01
#: Times must also move by this many µs to be flagged: a few µs are the clock's
#: resolution (a name's total of 2 µs that became 1 µs did not halve).
_MIN_US_CHANGE = 10


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
    #: Moved beyond the threshold and outside the noise (a count that changed at all, a
    #: figure only one run has).
    flagged: bool
    #: µs per rank-step this figure's time moved by (0 for figures that are not time).
    impact_us: float
    #: A note for a reader: the straggling rank in each run, ...
    note: str = ""
    #: 95 % interval of ``change`` (None when the noise cannot be estimated).
    low: float | None = None
    high: float | None = None
    #: Where the interval's noise comes from: "runs" (several per side), "steps"
    #: (blocks of steps of each run), "spans" (the spread of a name's durations, for
    #: its mean), "names" (the names' moves against the rest of their steps, for a
    #: moved name's mean and the step figures), or "" (none).
    noise: str = ""
    #: The part of ``change`` the machine's speed explains (one run per side; see
    #: :func:`machine_speed`): in the change's direction and at most all of it, 0 when
    #: not estimated; flags and regressions judge the rest.
    machine: float = 0.0


@dataclass
class RunDiff:
    """Two runs compared (or two sets of runs): what each is, and every compared figure."""

    base: dict[str, Any]
    new: dict[str, Any]
    threshold: float
    rows: list[DiffRow] = field(default_factory=list)
    #: How many runs each side had.
    runs: tuple[int, int] = (1, 1)
    #: How much slower NEW's machine ran than BASE's, from the names whose time changed
    #: alike (None: several runs per side, or too few names to tell).
    speed: float | None = None
    #: One run per side, where the ranks' steps changed unevenly (which no machine's
    #: speed does): how many times as long the least and the most changed rank's steps
    #: took; ``speed`` is then at most the least's (see ``step_shifts.ranks_apart``).
    ranks_apart: tuple[float, float] | None = None
    #: One run per side: the names whose time per step moved against the rest of their
    #: steps beyond the noise, with the relative change of the step each move makes.
    moved: dict[str, float] = field(default_factory=dict)

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
        excess = _excess(row)
        if excess is None or excess <= limit or (row.low is not None and row.low - row.machine <= 0):
            return None
        change = f"{value_text(row.unit, row.base)} -> {value_text(row.unit, row.new)}"
        within = "" if row.low is None else f", interval {interval_text(row)}"
        if row.noise == "names":
            low, high = row.low - row.machine, row.high - row.machine  # type: ignore[operator]
            judged = (f"from names that took longer against the rest of their steps ({row.note})" if row.note
                      else "against the rest of its steps")  # a name's own mean
            return (f"{metric} got worse by {excess * 100:.1f}% {judged}, more than {limit * 100:g}% ({change}, "
                    f"{row.relative * 100:+.1f}% as measured; the part judged {signed_text(row.unit, low)} .. "  # type: ignore[operator]
                    f"{signed_text(row.unit, high)}, outside the noise)")
        if row.machine:
            speed = 1 + row.machine / row.base  # type: ignore[operator]
            return (f"{metric} got worse by {excess * 100:.1f}% beyond the machine's speed, more than "
                    f"{limit * 100:g}% ({change}, {row.relative * 100:+.1f}% while the names took "  # type: ignore[operator]
                    f"{speed:.3f}x as long{within}{', outside the noise' if within else ''})")
        return (f"{metric} got worse by {row.relative * 100:.1f}% "  # type: ignore[operator]
                f"({change}{within}{', outside the noise' if within else ''}), more than {limit * 100:g}%")

    def explained(self, metric: str, limit: float) -> str | None:
        """Why NEW does not count as a regression of ``metric`` by more than ``limit``
        though it grew by more in all: the machine's speed (or, judged by the names'
        moves, the machine and the noise) explains the rest; None otherwise. With one
        run per side a change that slows every name alike looks the same: the note
        says so."""
        row = self.row(metric)
        if row is None or row.change is None or not row.base or row.relative is None or row.relative <= limit \
                or not row.machine or self.regression(metric, limit) is not None:
            return None
        part = "the machine's speed and the noise" if row.noise == "names" else "the machine's speed"
        return (f"{metric} grew by {row.relative * 100:.1f}% ({value_text(row.unit, row.base)} -> "
                f"{value_text(row.unit, row.new)}), all but {(_excess(row) or 0) * 100:.1f}% of it explained by "
                f"{part} (every name took {self.speed or 1:.3f}x as long): with one run per side a change in the "
                "code that slows every name alike looks the same; compare several runs per side to tell")

    def to_dict(self) -> dict[str, Any]:
        """The comparison as a JSON-ready dict (``flagged``: metric keys in impact order)."""
        return {
            "base": self.base, "new": self.new, "threshold": self.threshold, "runs": list(self.runs),
            "speed": self.speed, "ranks_apart": self.ranks_apart, "moved": self.moved,
            "flagged": [r.metric for r in self.flagged],
            "rows": [asdict(r) for r in self.rows],
        }

    def to_json(self) -> str:
        """The comparison as JSON text."""
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2).decode()


SECTIONS = ("steps", "epochs", "categories", "breakdown", "dataloader", "stragglers", "gpu", "io", "events")


def compare_summaries(base: Summary | Sequence[Summary], new: Summary | Sequence[Summary], *,
                      threshold: float = DEFAULT_THRESHOLD,
                      steps: tuple[StepTimes, StepTimes] | None = None) -> RunDiff:
    """Compare the answers of two runs (BASE first), or of several runs per side: one
    :class:`DiffRow` per figure, with the mean over each side's runs. ``steps``: the
    two runs' time per name and step (:func:`step_times`), for judging a single pair
    by its names' moves against the rest of their steps."""
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    bases = [base] if isinstance(base, Summary) else list(base)
    news = [new] if isinstance(new, Summary) else list(new)
    if not bases or not news:
        raise ValueError("each side needs at least one run")
    first_b, first_n = bases[0], news[0]
    per_step = (per_rank_step(first_b), per_rank_step(first_n))
    diff = RunDiff(_describe(first_b), _describe(first_n), threshold, runs=(len(bases), len(news)))
    # Each run's figures, lined up against the other side's first run: their values,
    # and their time per rank-step of that run (what the impact is the mean of).
    figures_b = [{f.metric: f for f in figures_of(b, first_n)} for b in bases]
    figures_n = [{f.metric: f for f in figures_of(first_b, n)} for n in news]
    values_b = [{m: f.base for m, f in each.items()} for each in figures_b]
    values_n = [{m: f.new for m, f in each.items()} for each in figures_n]
    per_step_b, per_step_n = [per_rank_step(b) for b in bases], [per_rank_step(n) for n in news]
    single = len(bases) == len(news) == 1
    blocks = (_step_blocks(first_b), _step_blocks(first_n)) if single else None
    # With one run per side, the machine's speed stands in for the run-to-run noise.
    diff.speed = machine_speed(first_b, first_n) if single else None
    # A machine's speed slows every rank; where the ranks' steps changed unevenly, it
    # explains at most what the least changed rank's did.
    uneven = diff.ranks_apart = ranks_apart(first_b.rank_steps, first_n.rank_steps, threshold) if single else None
    if uneven is not None and diff.speed is not None:
        diff.speed = (min(diff.speed, max(uneven[0], 1.0)) if diff.speed > 1
                      else max(diff.speed, min(uneven[1], 1.0)))
    shifts = (_step_shifts(*steps, threshold, first_b.step_stats.get("mean_us"))
              if single and steps is not None else {})
    diff.moved = {f"{cat}.{name}": round(v.step, 4) for (cat, name), v in shifts.items()}
    # Where the judged names hold most of the steps' time, they alone judge the step
    # figures: the load of a shared machine moves a step's own figures far more than
    # the blocks of one run can tell, and moves the names alike. Not where ranks moved
    # apart: a name that moved on one rank of several does not move over all steps; nor
    # where the time no name judges moved (a straggler's idle time, the others' waits).
    # Nor where the machine's speed is not known (too few names to tell): the names'
    # moves say which names moved against the rest of their steps, not that the rest
    # is the machine's (every name 1.5x as long is then a step 1.5x as long).
    unjudged = single and (diff.speed is None or _unjudged_time_moved(first_b, first_n, threshold, diff.speed))
    names_judge = (single and steps is not None and uneven is None and not unjudged
                   and min(_covered(first_b, steps[0]), _covered(first_n, steps[1])) >= _COVERED)
    for figure in figures_of(first_b, first_n):
        samples = ([v.get(figure.metric) for v in values_b], [v.get(figure.metric) for v in values_n])
        interval, machine, noise = None, 0.0, ""
        row_per_step = per_step
        if not single:
            figure.base, figure.new = _mean(samples[0]), _mean(samples[1])
            interval = _change_interval(*samples)
            noise = "runs" if interval is not None else ""
            if figure.time is not None:  # each side's mean of its runs' time per rank-step
                figure.time = (_time_per_step(figures_b, per_step_b, figure.metric, 0),
                               _time_per_step(figures_n, per_step_n, figure.metric, 1))
                row_per_step = (1, 1)
        elif figure.base is not None and figure.new is not None:
            change = figure.new - figure.base
            if diff.speed is not None and figure.unit == US and figure.section in _TIMED_SECTIONS:
                machine = _explained(change, figure.base * (diff.speed - 1))
            if blocks is not None and figure.metric in blocks[0] and figure.metric in blocks[1]:
                interval = _change_interval(blocks[0][figure.metric], blocks[1][figure.metric])
                if interval is not None:
                    # The blocks give the spread; the interval sits around the runs' change.
                    half = (interval[1] - interval[0]) / 2
                    interval, noise = (change - half, change + half), "steps"
            elif figure.spread is not None:
                half = _half_width(*figure.spread)
                if half is not None:
                    interval, noise = (change - half, change + half), "spans"
            # Names that moved judge a step figure by their part of it, unless the time
            # they do not hold moved too (then the rest is no machine's).
            judged = None if unjudged and figure.metric in _STEP_FIGURES else _by_steps(figure, shifts)
            if judged is None and names_judge and figure.metric in _STEP_FIGURES:
                machine = change  # no name moved: the machine and the noise explain all of it
            if judged is not None:
                (interval, machine), noise = judged, "names"
                if figure.metric in _STEP_FIGURES:
                    figure.note = "moved: " + ", ".join(f"{name} {step * 100:+.1f}% of the step"
                                                        for name, step in diff.moved.items())
        diff.rows.append(_row(figure, row_per_step, threshold, interval, noise, machine))
    return diff


def _time_per_step(runs: list[dict[str, Figure]], per_step: list[int], metric: str, side: int) -> float | None:
    """The mean over a side's runs of a figure's time per rank-step (``side``: which of
    the figure's two times is that run's)."""
    times = [(each[metric].time or (None, None))[side] for each in runs if metric in each]
    return _mean([t / steps if t is not None else None for t, steps in zip(times, per_step)])


#: Step figures the names' moves judge.
_STEP_FIGURES = ("step.p50", "step.p95", "step.mean")


def _by_steps(figure: Figure, shifts: dict[tuple[str, str], _Shift]) -> tuple[tuple[float, float], float] | None:
    """(interval of the change, the part the machine and the noise explain) of a figure
    judged by the names' moves against the rest of their steps: a step figure by the
    moved names' part of it, a moved name's mean by its own move; None for other
    figures, or when no name moved (the blocks of steps judge a step figure then: time
    outside the names' spans may have changed)."""
    if figure.base is None or figure.new is None or not figure.base or not shifts:
        return None
    change = figure.new - figure.base
    if figure.metric in _STEP_FIGURES:
        steps = [sum(getattr(v, key) for v in shifts.values()) for key in ("step", "step_low", "step_high")]
        rest = change - steps[0] * figure.base
        return (rest + steps[1] * figure.base, rest + steps[2] * figure.base), rest
    if figure.section != "categories" or not figure.metric.endswith(".mean"):
        return None
    cat, _, name = figure.metric[: -len(".mean")].partition(".")
    shift = shifts.get((cat, name))
    if shift is None:
        return None
    rest = change - figure.base * math.expm1(shift.estimate)
    return (rest + figure.base * math.expm1(shift.low), rest + figure.base * math.expm1(shift.high)), rest


#: Sections whose time figures scale with the machine's speed.
_TIMED_SECTIONS = ("steps", "epochs", "categories")


def machine_speed(base: Summary, new: Summary) -> float | None:
    """How much slower NEW ran than BASE for reasons that touch every part of the step
    alike (a busier or slower machine): the median over names of the ratio of their
    mean durations, each name weighing its share of BASE's time (a busy machine
    stretches long spans more than short ones, which often finish within one time
    slice); leaf names with enough spans and time in both runs, pipeline spans and
    loop bodies left out. A change in the code touches some names and moves the step
    beyond this, unless those names hold half the time or more; one that slows every
    name alike cannot be told from a slower machine with one run per side. None with
    fewer than three such names."""
    rows_b = {(r["cat"], r["name"]): r for r in base.categories}
    total = sum(_own_us(r) for r in base.categories if _timed(r["cat"], r["name"])) or 1
    ratios = []
    for r in new.categories:
        key = (r["cat"], r["name"])
        b = rows_b.get(key)
        if (b is None or not _timed(*key) or min(b["count"], r["count"]) < SPEED_MIN_COUNT
                or _own_us(b) < SPEED_MIN_SHARE * total or not _own_us(r)):
            continue
        ratios.append(((_own_us(r) / r["count"]) / (_own_us(b) / b["count"]), _own_us(b)))
    if len(ratios) < 3:
        return None
    ratios.sort()
    half = sum(w for _, w in ratios) / 2
    reach = 0.0
    for ratio, weight in ratios:
        reach += weight
        if reach >= half:
            return round(ratio, 4)
    return round(ratios[-1][0], 4)


def _unjudged_time_moved(base: Summary, new: Summary, threshold: float, speed: float) -> bool:
    """Whether a rank-step's time that the names' moves do not judge changed beyond
    the machine's ``speed`` by more than ``threshold`` of BASE's step: its process's
    idle time (no span open: code that is not annotated, a rank sleeping) and its
    wait in collectives (a straggler makes the others wait while their names' own
    time stays)."""
    def per_step(run: Summary) -> float | None:
        count, rows = run.step_stats.get("count") or 0, run.rank_steps
        if not count:
            return None
        waits = [r["wait_us"] for r in rows if isinstance(r.get("wait_us"), (int, float))]
        wait = sum(waits) / len(waits) if waits else 0.0
        return (run.breakdown.get("idle_us") or 0) / count + wait

    b, n, step = per_step(base), per_step(new), base.step_stats.get("mean_us")
    return b is not None and n is not None and bool(step) and abs(n - b * speed) > threshold * step


def _leaf(cat: str, name: str) -> bool:
    return cat != fmt.CAT_PIPELINE and not name.endswith((*fmt.LOOP_BODY_SUFFIXES, fmt.ITER_SUFFIX))


def _timed(cat: str, name: str) -> bool:
    """A name that times the machine: a leaf, and no collective (its time is also the
    wait for the other ranks, which a slower machine does not make: a straggler does)."""
    return _leaf(cat, name) and cat != fmt.CAT_COMM


def _own_us(row: dict[str, Any]) -> float:
    """A name's own time: its self time (a backward without the collectives' waits
    inside it), else its total."""
    own = row.get("self_us")
    return float(own if own is not None else row.get("total_us") or 0)


def _explained(change: float, machine: float) -> float:
    """The part of ``change`` a machine that ran ``machine`` µs slower (or faster)
    explains: the machine's speed only ever explains a change away, in the change's
    own direction and no further than the change; it never makes one."""
    if change * machine <= 0:
        return 0.0
    return machine if abs(machine) < abs(change) else change


def _excess(row: DiffRow) -> float | None:
    """The relative change beyond what the machine's speed explains."""
    if row.change is None or not row.base:
        return None
    return (row.change - row.machine) / row.base


def compare_runs(base: Any, new: Any, *, threshold: float = DEFAULT_THRESHOLD, **options: Any) -> RunDiff:
    """Summarise two runs' trace files (paths, directories, globs, or loaded
    :class:`TraceTable` objects) and compare them; ``options`` go to :func:`summarize`.
    A list of such sources on a side is several runs of it."""
    from .summary import summarize

    def runs(side: Any) -> list[Summary]:
        return [summarize(r, **options) for r in side] if isinstance(side, list) else [summarize(side, **options)]

    bases, news = runs(base), runs(new)
    steps = None
    if len(bases) == len(news) == 1:
        one = (base[0] if isinstance(base, list) else base, new[0] if isinstance(new, list) else new)
        steps = (step_times(one[0]), step_times(one[1]))
    return compare_summaries(bases, news, threshold=threshold, steps=steps)


#: Blocks of consecutive steps a single run is cut into to estimate step-level noise
#: (at most; a block has at least four steps).
STEP_BLOCKS = 16
#: Two-sided 97.5 % quantiles of Student's t by degrees of freedom (then 1.96).
_T975 = {1: 12.71, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.0}


def _step_blocks(summary: Summary) -> dict[str, list[float]]:
    """step.p50 / step.p95 / step.mean of each block of consecutive steps (all ranks
    of a step in one block), from the per-rank step rows; {} for fewer than four steps."""
    rows = [r for r in summary.rank_steps if r.get("dur_us") is not None]
    keys = sorted({(r["epoch"] if r["epoch"] is not None else -1, r["step"]) for r in rows})
    if len(keys) < 4:
        return {}
    count = max(2, min(STEP_BLOCKS, len(keys) // 4))
    block_of = {key: i * count // len(keys) for i, key in enumerate(keys)}
    durations: list[list[float]] = [[] for _ in range(count)]
    for r in rows:
        durations[block_of[(r["epoch"] if r["epoch"] is not None else -1, r["step"])]].append(r["dur_us"])
    out: dict[str, list[float]] = {"step.p50": [], "step.p95": [], "step.mean": []}
    for values in durations:
        values.sort()
        out["step.p50"].append(nearest_rank(values, 0.5))
        out["step.p95"].append(nearest_rank(values, 0.95))
        out["step.mean"].append(sum(values) / len(values))
    return out


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(sum(present) / len(present), 6) if present else None


def interval_text(row: DiffRow) -> str:
    """A row's 95 % interval of the change, in its unit."""
    return f"{signed_text(row.unit, row.low)} .. {signed_text(row.unit, row.high)}"


def _t975(dof: float) -> float:
    return next((q for d, q in sorted(_T975.items()) if d >= math.floor(max(dof, 1))), 1.96)


def _half_width(base: tuple[float | None, int], new: tuple[float | None, int]) -> float | None:
    """Half the 95 % interval of the difference of two means, from each one's
    (standard deviation, count) (Welch); None without a spread on both sides."""
    (sb, nb), (sn, nn) = base, new
    if sb is None or sn is None or nb < 2 or nn < 2:
        return None
    a, c = sb * sb / nb, sn * sn / nn
    parts = a * a / (nb - 1) + c * c / (nn - 1)
    return _t975((a + c) ** 2 / parts if parts else nb + nn - 2) * math.sqrt(a + c)


def _change_interval(base: Sequence[float | None], new: Sequence[float | None]) -> tuple[float, float] | None:
    """95 % interval of mean(new) - mean(base) (Welch). A side with one value takes
    the other side's spread; None when neither side has two values."""
    b = [float(v) for v in base if v is not None]
    n = [float(v) for v in new if v is not None]
    if not b or not n or (len(b) < 2 and len(n) < 2):
        return None

    def var(x: list[float]) -> float | None:
        if len(x) < 2:
            return None
        m = sum(x) / len(x)
        return sum((v - m) ** 2 for v in x) / (len(x) - 1)

    vb, vn = var(b), var(n)
    # each variance's degrees of freedom; a borrowed one is as uncertain as its source
    # (counting it as known made 2 runs against 1 look like 9 degrees of freedom)
    db, dn = len(b) - 1, len(n) - 1
    if vb is None:
        vb, db = vn, dn
    if vn is None:
        vn, dn = vb, db
    a, c = vb / len(b), vn / len(n)  # type: ignore[operator]
    se = math.sqrt(a + c)
    if se == 0:
        dof = len(b) + len(n) - 2
    else:
        parts = a * a / db + c * c / dn
        dof = (a + c) ** 2 / parts if parts else len(b) + len(n) - 2
    t = _t975(dof)
    change = sum(n) / len(n) - sum(b) / len(b)
    return change - t * se, change + t * se


def _describe(summary: Summary) -> dict[str, Any]:
    o = summary.overview
    return {"files": o["files"], "processes": o["processes"], "ranks": o["ranks"],
            "rank_steps": summary.step_stats.get("count", 0), "events": o["events"], "wall_us": o["wall_us"],
            "broken_lines": o.get("broken_lines", 0)}


def _row(figure: Figure, per_step: tuple[int, int], threshold: float,
         interval: tuple[float, float] | None, noise: str, machine: float) -> DiffRow:
    b, n = figure.base, figure.new
    change = (n - b) if b is not None and n is not None else None
    if change is not None and change * (change - machine) < 0:
        # What the machine's speed (or the names' moves) explains never turns a change
        # into one of the other sign: a figure that fell did not get worse.
        machine = change
    relative = change / b if change is not None and b else None
    excess = (change - machine) / b if change is not None and b else None
    if b is None or n is None:
        flagged = b is not None or n is not None  # a figure only one run has
    elif figure.unit in (COUNT, BYTES):  # exact counts
        flagged = change != 0 and (interval is None or not interval[0] <= 0 <= interval[1])
    elif not b:
        flagged = bool(n)
    else:
        flagged = abs(excess) > threshold  # type: ignore[arg-type]
        if figure.unit == SHARE:
            flagged = flagged and abs(change) >= _MIN_SHARE_CHANGE  # type: ignore[arg-type]
        elif figure.unit == US:
            flagged = flagged and abs(change) >= _MIN_US_CHANGE  # type: ignore[arg-type]
        if interval is not None:
            flagged = flagged and not interval[0] <= machine <= interval[1]
    if figure.time is None:
        impact = change or 0.0
    else:
        tb, tn = figure.time
        impact = (tn or 0) / per_step[1] - (tb or 0) / per_step[0]
    low, high = interval if interval is not None else (None, None)
    return DiffRow(figure.metric, figure.section, figure.unit, b, n,
                   _rounded(change), _rounded(relative, 4), flagged, round(float(impact), 3), figure.note,
                   _rounded(low), _rounded(high), noise if interval is not None else "", round(machine, 3))


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return round(value, digits) if isinstance(value, float) else value


# --- values as text (the rows' notes and the rendering) ---------------------------------

def value_text(unit: str, value: float | None) -> str:
    """A figure's value, in its unit."""
    if value is None:
        return "-"
    if unit == US:
        return format_us(value)
    if unit == SHARE:
        return f"{value * 100:.1f}%"
    if unit == RATIO:
        return f"{value:.2f}"
    if unit in (BYTES, RATE):
        return format_bytes(value) + ("/s" if unit == RATE else "")
    return f"{value:,.0f}"


def signed_text(unit: str, value: float | None) -> str:
    """A change (or an interval's end) with its sign, in the row's unit."""
    if value is None:
        return "-"
    if unit == US:
        return ("+" if value > 0 else "") + format_us(value)
    if unit == SHARE:
        return f"{value * 100:+.1f} pt"
    if unit == RATIO:
        return f"{value:+.2f}"
    if unit in (BYTES, RATE):
        return ("+" if value > 0 else "") + format_bytes(value) + ("/s" if unit == RATE else "")
    return f"{value:+,.0f}"
