"""Names that moved between two runs: each name's time per step against the rest of
the same step (see :mod:`._diff`, "Names that moved").

:func:`step_times` reads each name's time in each step of one run; :func:`_step_shifts`
compares two runs' with the Hodges-Lehmann estimate of the change of that ratio and
its distribution-free interval (Mann-Whitney ranks), 95 % for all the names judged
together (each name's at 1 - 5 % / names: one of eight names moving by chance must not
name a regression one pair of same-code runs in three).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from ... import format as fmt
from .summary import Summary

__all__ = ["STEPS_KEPT", "StepTimes", "step_times"]

#: Names that take part in the judging of moves (and in the machine-speed estimate):
#: at least this many spans in each run, and this share of the runs' time.
SPEED_MIN_COUNT, SPEED_MIN_SHARE = 8, 0.01


@dataclass(frozen=True)
class _Shift:
    """How a name's time per step moved against the rest of the step in NEW, as the
    logarithm of a ratio (estimate and 95 % interval), and the step's relative change
    that move makes (``step``, with ``step_low``/``step_high``)."""

    estimate: float
    low: float
    high: float
    step: float
    step_low: float
    step_high: float


@dataclass
class StepTimes:
    """Each name's time in each step of one run (:func:`step_times`): ``times[k, i]`` is
    the µs that name ``names[i]`` took in step ``k`` (all its spans carrying that step
    number, per process)."""

    names: list[tuple[str, str]]
    times: np.ndarray


#: Steps kept per run for the comparison; a run with more is represented by this many
#: evenly spaced quantiles of each name's share of its steps.
STEPS_KEPT = 1000
#: The chance that any of the names judged is said to move when none did (the
#: intervals' family-wise error: each name's interval is at 1 - _FAMILY_ERROR / names).
_FAMILY_ERROR = 0.05


#: The columns step_times decodes; a step's keys; what joins a name's category and name
#: in the name of its column.
_COLUMNS = ["pid", "cat", "name", "ph", "dur", "epoch", "step"]
_STEP = ["host", "pid", "epoch", "step"]
_JOIN = "\x1f"


def _per_step(events: Any) -> Any:
    """One row per (process, epoch, step) of ``events``: its keys, then each name's time
    in it (a column ``cat<_JOIN>name`` per name, 0 where the step has none). Enclosing
    spans are left out (pipeline spans, loop bodies); item waits (``.iter``) are the
    step's own time too."""
    import polars as pl

    from ..read.schema import HOST_KEY, loop_body

    if "host" not in events.columns:
        events = events.rename({HOST_KEY: "host"})
    spans = events.filter((pl.col("ph") == fmt.PH_COMPLETE) & pl.col("dur").is_not_null()
                          & pl.col("step").is_not_null() & pl.col("name").is_not_null()
                          & (pl.col("cat").fill_null("") != fmt.CAT_PIPELINE)
                          & ~loop_body(pl.col("name")))
    named = spans.select(pl.col("host").fill_null(""), "pid", "epoch", "step", pl.col("dur").cast(pl.Float64),
                         pl.concat_str(pl.col("cat").fill_null(""), pl.lit(_JOIN), "name").alias("_name"))
    if not named.height:
        return None
    return named.pivot("_name", index=_STEP, values="dur", aggregate_function="sum").fill_null(0.0)


def _partition_step_times(partition: Any) -> Any:
    """:func:`_per_step` of one partition, read a piece at a time (None: nothing in it)."""
    import polars as pl

    from ..read.decode import iter_partition_pieces

    parts = [p for piece in iter_partition_pieces(partition, _COLUMNS) if (p := _per_step(piece.events)) is not None]
    return _summed(pl.concat(parts, how="diagonal_relaxed")) if parts else None


def _summed(steps: Any) -> Any:
    """``steps`` with the rows of one step (read in two pieces or partitions) summed."""
    import polars as pl

    steps = steps.fill_null(0.0)
    if not steps.select(pl.struct(_STEP).is_duplicated().any()).item():
        return steps
    return steps.group_by(_STEP, maintain_order=True).agg(pl.exclude(_STEP).sum())


def step_times(source: Any, *, partition_bytes: int | None = None, executor: Any = None) -> StepTimes:
    """Each name's time per step in one run (paths, directories, globs, or a loaded
    :class:`TraceTable`), from the spans that carry a step number (enclosing spans
    left out: pipeline spans and loop bodies). Each partition is reduced to one row a
    step where it is read (on ``executor``'s threads or workers), a piece at a time:
    memory is bounded by the steps times the names."""
    import polars as pl

    from ..read.sources import SQL_PARTITION_BYTES, plan_paths
    from ..read.trace import TraceTable
    from ..runtime.executor import default_executor

    if isinstance(source, TraceTable):
        table = _per_step(source.events)
    else:
        plan = plan_paths(source, partition_bytes or SQL_PARTITION_BYTES)
        parts = [p for p in default_executor(executor).map(_partition_step_times, plan, progress=False,
                                                            desc="step times") if p is not None]
        table = _summed(pl.concat(parts, how="diagonal_relaxed")) if parts else None
    if table is None or not table.height:
        return StepTimes([], np.zeros((0, 0)))
    columns = sorted((c for c in table.columns if c not in _STEP), key=lambda c: tuple(c.split(_JOIN, 1)))
    times = table.select(columns).to_numpy().astype(np.float64)
    return StepTimes([tuple(c.split(_JOIN, 1)) for c in columns], times)  # type: ignore[misc]


def _log_shift(base: np.ndarray, new: np.ndarray, z: float) -> tuple[float, float, float]:
    """Hodges-Lehmann estimate of new - base (the median of the differences of every
    pair, one value from each) with its interval from the Mann-Whitney ranks (``z``:
    the normal quantile of its confidence): distribution-free, no assumption on the
    values' shape."""
    base, new = _kept(base), _kept(new)
    pairs = np.sort(np.subtract.outer(new, base).ravel())
    m, k = len(base), len(new)
    cut = max(0, math.floor(m * k / 2 - z * math.sqrt(m * k * (m + k + 1) / 12)))
    return float(np.median(pairs)), float(pairs[cut]), float(pairs[m * k - 1 - cut])


def _kept(values: np.ndarray) -> np.ndarray:
    if len(values) <= STEPS_KEPT:
        return values
    return np.quantile(values, (np.arange(STEPS_KEPT) + 0.5) / STEPS_KEPT)


def _step_shifts(base: StepTimes, new: StepTimes, threshold: float,
                 step_us: float | None = None) -> dict[tuple[str, str], _Shift]:
    """The names whose time per step moved against the rest of the step (the other
    names' time in the same step: the machine's speed and its load at that moment,
    seen by the rest of the work) enough to change the step by more than the
    threshold (its time per step in BASE times its move, over ``step_us``, BASE's mean
    step; the names' time per step without it), with intervals that exclude no move (95 %
    for the names judged together).

    One name at a time: the one that moved most is taken out of the rest before the
    others are judged again (a name that grew makes every other look smaller against
    it). Names with spans in fewer than eight steps of a run, or under 1 % of the
    time, are not judged."""
    shared = [name for name in base.names if name in new.names]
    if len(shared) < 2:
        return {}
    columns = (np.array([base.names.index(n) for n in shared]), np.array([new.names.index(n) for n in shared]))
    times = (base.times[:, columns[0]], new.times[:, columns[1]])
    total = times[0].sum() or 1.0
    judged = [i for i in range(len(shared))
              if min((times[0][:, i] > 0).sum(), (times[1][:, i] > 0).sum()) >= SPEED_MIN_COUNT
              and times[0][:, i].sum() >= SPEED_MIN_SHARE * total]
    rest_of = [t.sum(axis=1) for t in times]
    z = NormalDist().inv_cdf(1 - _FAMILY_ERROR / 2 / max(1, len(judged)))
    shifts: dict[tuple[str, str], _Shift] = {}
    while True:
        best = None
        for i in judged:
            if shared[i] in shifts:
                continue
            logs = []
            for t, rest in zip(times, rest_of):
                x, others = t[:, i], rest - t[:, i]
                ok = (x > 0) & (others > 0)
                logs.append(np.log(x[ok] / others[ok]))
            if min(len(logs[0]), len(logs[1])) < SPEED_MIN_COUNT:
                continue
            estimate, low, high = _log_shift(*logs, z)
            if low <= 0 <= high:
                continue
            # The name's time per step in BASE turns its move into the step's.
            share = times[0][:, i].sum() / len(times[0]) / (step_us or rest_of[0].mean() or 1.0)

            def step(log: float, share: float = share) -> float:
                return share * math.expm1(log)

            shift = _Shift(estimate, low, high, step(estimate), step(low), step(high))
            if abs(shift.step) > threshold and (best is None or abs(shift.step) > abs(best[1].step)):
                best = (i, shift)
        if best is None:
            return shifts
        i, shift = best
        shifts[shared[i]] = shift
        rest_of = [rest - t[:, i] for t, rest in zip(times, rest_of)]


#: The share of the steps' time the names must hold for their moves alone to judge the
#: step figures (else time outside the names' spans may have changed unseen).
_COVERED = 0.5


def _covered(run: Summary, steps: StepTimes) -> float:
    """The share of a run's rank-step time that its names' spans with a step number hold
    (nested names counted once each, so this may pass 1)."""
    total = (run.step_stats.get("mean_us") or 0) * (run.step_stats.get("count") or 0)
    return float(steps.times.sum()) / total if total else 0.0


def ranks_apart(base: list[dict[str, Any]], new: list[dict[str, Any]], threshold: float
                ) -> tuple[float, float] | None:
    """Where the ranks' steps changed unevenly between two runs (one rank slower, say),
    which no machine's speed does: (least, greatest) over the ranks of how many times
    as long a step took (the Hodges-Lehmann estimate of each rank's shift in log step
    time), where the most changed rank's interval lies beyond the least changed one's
    by more than ``threshold`` (95 % for the ranks together). ``base``, ``new``: the
    runs' rank-steps (``rank``, ``dur_us``). None with fewer than two ranks of
    SPEED_MIN_COUNT steps in both runs, or where the ranks changed alike."""
    def logs(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
        durations: dict[str, list[int]] = {}
        for row in rows:
            if isinstance(row.get("dur_us"), int) and row["dur_us"] > 0 and row.get("rank") is not None:
                durations.setdefault(str(row["rank"]), []).append(row["dur_us"])
        return {rank: np.log(np.array(values, dtype=float)) for rank, values in durations.items()
                if len(values) >= SPEED_MIN_COUNT}

    base_logs, new_logs = logs(base), logs(new)
    ranks = sorted(base_logs.keys() & new_logs.keys())
    if len(ranks) < 2:
        return None
    z = NormalDist().inv_cdf(1 - _FAMILY_ERROR / 2 / len(ranks))
    shifts = sorted(_log_shift(base_logs[rank], new_logs[rank], z) for rank in ranks)
    (least, _, least_high), (most, most_low, _) = shifts[0], shifts[-1]
    if most_low - least_high <= math.log1p(threshold):
        return None
    return round(math.exp(least), 4), round(math.exp(most), 4)
