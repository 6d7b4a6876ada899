"""The step answers: the units' steps (one row per unit and step), their statistics
over all units and per rank, the epochs, the imbalance between ranks, and the
nearest-rank percentile every answer uses."""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any, TypeVar

import polars as pl
import polars.selectors as cs

from ..reduce.combine import Combined
from ..reduce.busy import time_in_steps
from ..reduce.data_waits import PASS_END
from ..reduce.steps import each_process_steps, step_spread, unit_steps
from .context import Context, UnitTables
from .runs import (RUN_SUFFIX, each_rank_across_runs, find_runs, last_run_of_each_step, processes_frame,
                   run_origins, units_of_each_job, units_per_run)


T = TypeVar("T")


#: How many (unit, step) rows the summary keeps for the per-rank step timeline;
#: beyond this, evenly spaced steps are kept (all ranks of each kept step).
RANK_STEPS_LIMIT = 20_000
#: How many steps the summary's per-step table keeps; beyond this, every Nth step and
#: the slowest ones (a million steps as rows of Python objects took 0.5 GB).
STEPS_LIMIT = 20_000


@dataclass
class UnitSteps:
    """The processes with the unit (rank) each belongs to, the runs, and the steps."""

    #: proc, label, rank, host, pid, dropped, unit, unit_order, run
    procs: pl.DataFrame
    runs: list[dict[str, Any]]
    #: Each process's steps (see ``model_steps``).
    process_steps: pl.DataFrame

    def by_unit(self) -> pl.DataFrame:
        """Each unit's steps (see ``unit_steps``): what the answers and ``dftrace sql``'s
        steps view are built on."""
        return unit_steps(self.process_steps, self.procs)


def steps_of(combined: Combined) -> UnitSteps:
    """Units, runs and steps of combined aggregates."""
    epochs = epoch_source(combined)
    procs = processes_frame(combined)
    runs = find_runs(combined, procs)
    procs = units_per_run(procs, runs, combined)
    process_steps = each_process_steps(combined.steps, combined.containers, combined.modelled, epochs)
    return UnitSteps(procs, runs, process_steps)


def _slowest() -> pl.Expr:
    # The unit with the longest time; ties go to the lowest rank.
    return pl.col("unit").sort_by(["dur", "unit_order"], descending=[True, False]).first()


def unit_extents(frame: pl.DataFrame, procs: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Extents per (unit, *by): a rank's processes together, start to end."""
    units = procs.filter(pl.col("unit").is_not_null()).select("proc", "unit", "unit_order")
    joined = frame.join(units, on="proc", how="inner")
    return (
        joined.group_by(["unit", "unit_order", *by])
        .agg(pl.col("start").min(), pl.col("end").max(), pl.col("n").sum())
        .with_columns((pl.col("end") - pl.col("start")).alias("dur"))
    )


def nearest_rank(ordered: Sequence[T], q: float) -> T | None:
    """The q-quantile of sorted values by the nearest-rank method, as the summary's
    percentiles are: the smallest value with at least q of them at or below it; None
    for no values. :func:`_nearest_rank` is the same within a group of a frame."""
    if not ordered:
        return None
    return ordered[max(1, math.ceil(len(ordered) * q - 1e-9)) - 1]


def _nearest_rank(q: float) -> pl.Expr:
    """The q-quantile of ``dur`` within a group, by the nearest-rank method."""
    # The small epsilon keeps q * n from rounding up past an exact integer.
    rank = (pl.len() * q - 1e-9).ceil().cast(pl.Int64).clip(lower_bound=1) - 1
    return pl.col("dur").sort().gather(rank).first()


def _median_expr() -> pl.Expr:
    # Nearest-rank median (the lower middle value), like the percentiles.
    return _nearest_rank(0.5)


def steps_across_units(by_unit: pl.DataFrame) -> pl.DataFrame:
    """Per (epoch, step): ranks, start, min/median/max time, slowest rank, max/median."""
    compared = step_spread(by_unit)
    # The kernel's rows come in (epoch, step) order, missing numbers first: put in
    # order again (a copy of every column) only where a number is missing.
    in_order = compared is not None and not any(compared.get_column(name).null_count() for name in ("epoch", "step"))
    if compared is None:
        compared = by_unit.group_by(["epoch", "step"]).agg(
            pl.len().alias("ranks"),
            pl.col("start").min().alias("start_us"),
            pl.col("dur").min().alias("min_us"),
            _median_expr().alias("median_us"),
            pl.col("dur").max().alias("max_us"),
            _slowest().alias("slowest"),
        )
    compared = compared.with_columns(
        pl.when(pl.col("median_us") > 0).then(pl.col("max_us") / pl.col("median_us")).alias("imbalance"))
    return compared if in_order else compared.sort(["epoch", "step"], nulls_last=True)


def _plain_stats() -> list[pl.Expr]:
    """count, total, min, max, mean, p50, p95 of ``dur`` (one value per row)."""
    return [
        pl.len().alias("count"),
        pl.col("dur").sum().alias("total_us"),
        pl.col("dur").min().alias("min_us"),
        pl.col("dur").max().alias("max_us"),
        pl.col("dur").mean().alias("mean_us"),
        _nearest_rank(0.5).alias("p50_us"),
        _nearest_rank(0.95).alias("p95_us"),
    ]


def step_statistics(by_unit: pl.DataFrame) -> dict[str, Any]:
    if not by_unit.height:
        return {}
    return rounded_rows(by_unit.select(_plain_stats()))[0]


#: Of the steps of a run too long to keep every rank-step, the slowest share is always kept.
SLOWEST_KEPT = 0.01


def thinned_steps(slowest_of: pl.DataFrame, keys: pl.DataFrame, rows_per_step: int, limit: int
                  ) -> tuple[pl.DataFrame, dict[str, int]]:
    """The (epoch, step) kept of ``keys`` (each step once, in order) where ``limit``
    rows of ``rows_per_step`` each cannot hold them all: every Nth step and the
    slowest ones (``SLOWEST_KEPT`` of them, by ``slowest_of``'s ``dur``: epoch, step,
    dur), and how they were thinned (``every``: N, ``steps``: all steps, ``slowest``:
    the slowest steps kept)."""
    slowest = min(math.ceil(keys.height * SLOWEST_KEPT), max(1, limit // rows_per_step // 2))
    every = math.ceil(keys.height / max(1, limit // rows_per_step - slowest))
    worst = (slowest_of.sort(["dur", "epoch", "step"], descending=[True, False, False], nulls_last=True)
             .head(slowest).select("epoch", "step"))
    kept = pl.concat([keys.gather_every(every), worst]).unique(maintain_order=True)
    return kept, {"every": every, "steps": keys.height, "slowest": slowest}


def rank_step_rows(by_unit: pl.DataFrame, keys: pl.DataFrame, runs: list[dict[str, Any]],
                   procs: pl.DataFrame, limit: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The rows of every rank-step, or, past ``limit`` rows, those of the steps
    :func:`thinned_steps` keeps (by their slowest rank), and how they were thinned
    (empty when every row is kept). ``keys``: the (epoch, step) of ``by_unit``, each
    once, in order; the wait of a rank-step is its ``blocked_us``."""
    if not by_unit.height:
        return [], {}
    thinned: dict[str, int] = {}
    frame = by_unit
    if by_unit.height > limit:
        # A step's slowest rank: its one row where every step has one (one rank).
        slowest_of = (by_unit.select("epoch", "step", "dur") if by_unit.height == keys.height
                      else by_unit.group_by(["epoch", "step"]).agg(pl.col("dur").max()))
        kept, thinned = thinned_steps(slowest_of, keys, max(1, by_unit.height // keys.height), limit)
        del slowest_of
        # The rank-steps of the kept step numbers first (a mask, where a join of every
        # rank-step held 60 MB more for 1.25M of them), then those of their epochs.
        frame = by_unit.filter(pl.col("step").is_in(kept.get_column("step").implode(), nulls_equal=True)).join(
            kept, on=["epoch", "step"], how="semi", nulls_equal=True)
    origin = run_origins(runs, procs, frame)
    rows = frame.sort(["epoch", "step", "unit_order"], nulls_last=True).select(
        pl.col("unit").alias("rank"), "epoch", "step",
        (pl.col("start") - origin).alias("start_us"), pl.col("dur").alias("dur_us"),
        pl.col("blocked_us").alias("wait_us"),
    )
    return rows.to_dicts(), thinned


def thinned_step_rows(steps: pl.DataFrame) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The rows of ``steps`` (see :func:`steps_across_units`), or, past ``STEPS_LIMIT``,
    those of the steps :func:`thinned_steps` keeps (by their slowest rank), and how
    they were thinned (empty when every step is kept)."""
    if steps.height <= STEPS_LIMIT:
        return rounded_rows(steps), {}
    kept, thinned = thinned_steps(steps.select("epoch", "step", pl.col("max_us").alias("dur")),
                                  steps.select("epoch", "step"), 1, STEPS_LIMIT)
    return rounded_rows(steps.join(kept, on=["epoch", "step"], how="semi", nulls_equal=True,
                                   maintain_order="left")), thinned


def epoch_source(combined: Combined) -> pl.DataFrame:
    """The pipeline's epoch spans when the trace has them, else the extents of the
    events that carry ``args.epoch``."""
    return combined.epoch_spans if combined.epoch_spans.height else combined.epochs


def epoch_extents(combined: Combined, process_steps: pl.DataFrame) -> pl.DataFrame:
    """proc, epoch, start, end, n: what the epochs table measures. The pipeline's epoch
    spans when the trace has them; else, per process, the extent of the events that
    carry each ``args.epoch``, begun where its first step begins (that step's batch
    was fetched before ``ai.update(epoch=...)``, so the fetch carries the epoch
    before: a loader's workers started again for the new pass were the old epoch's
    time) and ended where the next epoch begins. Where a loader's pass ended between
    its first event and its first step, it begins with that step: what came before
    was a batch looked at before training (``next(iter(loader))``), not the epoch."""
    epochs = epoch_source(combined)
    if combined.epoch_spans.height or not epochs.height or not process_steps.height:
        return epochs
    proc = pl.col("proc").cast(epochs.schema["proc"])
    firsts = (process_steps.lazy().filter(pl.col("epoch").is_not_null())
              .group_by(proc, pl.col("epoch").cast(epochs.schema["epoch"]))
              .agg(pl.col("start").min().alias("_first")).collect())
    joined = epochs.join(firsts, on=["proc", "epoch"], how="left")
    passes = combined.containers.filter(pl.col("name") == PASS_END).select(proc, pl.col("start").alias("_pass"))
    begun = pl.min_horizontal("start", "_first")
    if passes.height:
        joined = (joined.with_columns(pl.col("_first").fill_null(pl.col("start")).alias("_at")).sort("_at")
                  .join_asof(passes.sort("_pass"), left_on="_at", right_on="_pass", by="proc", strategy="backward",
                             check_sortedness=False))
        begun = pl.when(pl.col("_first").is_not_null() & (pl.col("_pass") > pl.col("start"))).then(
            pl.col("_first")).otherwise(begun)
    return (joined.with_columns(begun.alias("start"))
            .sort("proc", "start")
            .with_columns(pl.max_horizontal("start", pl.min_horizontal("end", pl.col("start").shift(-1).over("proc")))
                          .alias("end"))
            .select(epochs.columns))


def epoch_rows(by_unit: pl.DataFrame, steps: pl.DataFrame, procs: pl.DataFrame,
               runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_unit = by_unit.filter(pl.col("epoch").is_not_null())
    if not by_unit.height:
        return []
    step_counts = _step_counts(steps, procs, runs)
    per_epoch = (
        by_unit.group_by("epoch")
        .agg(
            pl.len().alias("ranks"),
            pl.col("start").min().alias("start_us"),
            pl.col("n").sum().alias("spans"),
            _median_expr().alias("median_us"),
            pl.col("dur").max().alias("max_us"),
            _slowest().alias("slowest"),
        )
        .join(step_counts, on="epoch", how="left")
        .with_columns(pl.col("steps").fill_null(0))
        .sort("epoch")
    )
    return per_epoch.to_dicts()


def _step_counts(steps: pl.DataFrame, procs: pl.DataFrame, runs: list[dict[str, Any]]) -> pl.DataFrame:
    """epoch, steps: the steps each epoch ran, a step run again in a resumed job's next
    run counted each time, as its time is (the most of any job's)."""
    # Lazy: only the columns needed are taken from the steps (a filter of the frame
    # copied every column of every process's steps).
    counted = steps.lazy().filter(pl.col("epoch").is_not_null()).with_columns(pl.col("epoch").cast(pl.Int64))
    if not any(run.get("resumed") for run in runs):
        return counted.group_by("epoch").agg(pl.col("step").n_unique().alias("steps")).collect()
    job_of = {i: run["job"] for i, run in enumerate(runs)}
    runs_of = procs.lazy().select("proc", "run", pl.col("run").replace_strict(job_of, default=0, return_dtype=pl.Int64)
                                  .alias("job"))
    return (counted.join(runs_of, on="proc", how="left").group_by("epoch", "job")
            .agg(pl.struct("run", "step").n_unique().alias("steps"))
            .group_by("epoch").agg(pl.col("steps").max()).collect())


def rank_imbalance(by_unit: pl.DataFrame, steps: pl.DataFrame,
                   jobs: Sequence[Sequence[str]] = ()) -> dict[str, Any]:
    """The ranks compared step by step: within one job, where ``jobs`` (the units of
    each, see ``runs.units_of_each_job``) has several; nothing to compare where no job
    has two units (a script run again is not a second rank of the first run)."""
    none = {"steps_compared": 0, "mean_ratio": None, "max_ratio": None, "worst": [], "ranks": []}
    if by_unit.get_column("unit").str.replace(RUN_SUFFIX, "").n_unique() < 2:  # a single rank (its runs too)
        return none
    if len(jobs) > 1:
        each = [steps_across_units(by_unit.filter(pl.col("unit").is_in(list(units))))
                for units in jobs if len(units) > 1]
        steps = pl.concat(each, how="vertical_relaxed") if each else steps.clear()
    compared = steps.filter((pl.col("ranks") > 1) & pl.col("imbalance").is_not_null())
    if len(jobs) > 1 and not compared.height:
        return none
    # Only steps where someone was slower than the median make a straggler.
    uneven = compared.filter(pl.col("imbalance") > 1)
    worst = uneven.sort(["imbalance", "epoch", "step"], descending=[True, False, False], nulls_last=True).head(10)
    slowest = uneven.group_by("slowest").agg(pl.len().alias("slowest_count")).rename({"slowest": "unit"})
    per_unit = (
        _per_unit(by_unit, _plain_stats()[:-1])
        .join(slowest, on="unit", how="left")
        .with_columns(pl.col("slowest_count").fill_null(0).cast(pl.Int64))
        .sort("unit_order", nulls_last=True)
        .drop("unit_order")
        .rename({"unit": "rank", "count": "steps"})
    )
    ratios = compared.get_column("imbalance")
    return {
        "steps_compared": compared.height,
        "mean_ratio": round(ratios.mean(), 3) if compared.height else None,
        "max_ratio": round(ratios.max(), 3) if compared.height else None,
        "worst": rounded_rows(worst),
        "ranks": rounded_rows(per_unit),
    }


def _per_unit(by_unit: pl.DataFrame, stats: list[pl.Expr]) -> pl.DataFrame:
    """unit, unit_order and ``stats`` of each unit's rank-steps. Each unit's rows come
    together (``unit_steps`` sorts them by unit), and its statistics are found over
    its slice alone: a group_by of every rank-step at once sorted and gathered them
    all (60 MB more for 1.25M). Units whose rows are apart (no order among them) are
    grouped."""
    runs = by_unit.get_column("unit").rle().struct.unnest()
    if not runs.height or runs.height != runs.get_column("value").n_unique():
        return by_unit.group_by("unit", "unit_order").agg(stats)
    frames, offset = [], 0
    for length in runs.get_column("len").to_list():
        rows = by_unit.slice(offset, length)
        frames.append(rows.head(1).select("unit", "unit_order").hstack(rows.select(stats)))
        offset += length
    return pl.concat(frames, how="vertical")


def rounded_rows(frame: pl.DataFrame) -> list[dict[str, Any]]:
    """Rows as dicts, floats rounded to 3 decimals for readable JSON."""
    return frame.with_columns(cs.float().round(3)).to_dicts()


# --- the step answers, as the summary's stages run them (see ``context``) -----------------


def epochs(context: Context) -> dict[str, Any]:
    """Stage 1: per epoch, ranks, steps, slowest rank and its time, median rank time."""
    combined = context.combined
    by_unit = each_rank_across_runs(unit_extents(epoch_extents(combined, context.process_steps), context.procs,
                                                 ["epoch"]),
                                    context.procs, context.runs, ["epoch"])
    return {"epochs": epoch_rows(by_unit, context.process_steps, context.procs, context.runs)}


def from_process_steps(context: Context) -> None:
    """The first stage's entry: its table, each process's steps, is the context's from
    the start."""


def to_unit_steps(context: Context) -> None:
    """Between the first two stages: each unit's steps found, each process's let go
    (their pages handed back before the units' tables are built)."""
    context.by_unit = unit_steps(context.process_steps, context.procs)
    context.process_steps = None


def from_unit_steps(context: Context) -> None:
    """The second stage's entry: what is found from each unit's steps."""
    by_unit, context.by_unit = context.by_unit, None
    context.units = _unit_tables(context, by_unit)


def _unit_tables(context: Context, by_unit: pl.DataFrame) -> UnitTables:
    combined, procs = context.combined, context.procs
    rank_host = {unit: (rank, host) for unit, rank, host in
                 procs.filter(pl.col("unit").is_not_null()).select("unit", "rank", "host").unique("unit").iter_rows()}
    # Each rank-step's compute and blocked time: found as its file was read where the
    # rank's steps are one process's (``with_step_times``), plus that of the intervals kept.
    compute_us = pl.col("compute_us").fill_null(0) + pl.Series(time_in_steps(combined.compute, procs, by_unit))
    compute = dict(by_unit.select("unit", compute_us).group_by("unit").agg(pl.col("compute_us").sum()).iter_rows())
    # The blocked time stays a column of the steps, row by row: the time each rank-step
    # waited, without a join of every rank-step to put it back beside its step.
    blocked_us = (pl.col("blocked_us").fill_null(0)
                  + pl.Series(time_in_steps(combined.blocked, procs, by_unit))).alias("blocked_us")
    by_unit = by_unit.select("unit", "unit_order", "epoch", "step", "start", "dur", blocked_us)
    # Ranks are compared step by step on each rank's last run of the step: a step a
    # resumed job ran again is one step of the job, not another rank.
    compared = last_run_of_each_step(by_unit, procs, context.runs)
    return UnitTables(by_unit, compared, steps_across_units(compared), compute, rank_host)


def step_answers(context: Context) -> dict[str, Any]:
    """Stage 2: the steps across ranks, their statistics, the imbalance, and every
    rank-step (thinned past ``rank_steps_limit``)."""
    units = context.units
    rank_steps, thinned = rank_step_rows(units.by_unit, units.steps.select("epoch", "step"), context.runs,
                                         context.procs, context.rank_steps_limit)
    steps, steps_thinned = thinned_step_rows(units.steps)
    return {
        "steps": steps,
        "steps_thinned": steps_thinned,
        "step_stats": step_statistics(units.by_unit),
        "imbalance": rank_imbalance(units.compared, units.steps, units_of_each_job(context.procs, context.runs)),
        "rank_steps": rank_steps,
        "rank_steps_sampled": bool(thinned),
        "rank_steps_thinned": thinned,
    }
