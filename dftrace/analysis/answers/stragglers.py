"""Straggler analysis: which rank the others waited for, found without comparing clocks.

Blocked time, not summed spans: a rank's wait in a step is the time it spent
blocked in communication with nothing else running (a blocking collective, DDP's
wait for its gradient buckets, the completion of asynchronous work), the union of
those intervals, so several buckets in flight at once count once. Each rank's
blocked time is measured on its own clock, and in a collective every rank waits
until the last one arrives, so the last rank is the one blocked least: per step,
a rank's lead is the others' mean blocked time minus its own, which is bounded by
what the others were blocked and needs no clock alignment between hosts.

Significance: a step counts as held back only when its last rank's lead stands
out of that rank's step-to-step noise, and a rank is named a straggler only when
it held the others back more often than chance allows (see :func:`analyse`).

Each traced collective also carries its process group and a sequence number
(``args.group``, ``args.seq``), so the same call is matched across ranks for the
per-call figures: how often each rank arrived last and the calls with the largest
arrival skew.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import numpy as np
import polars as pl

from .context import Context

#: How many of the collectives with the largest skew the summary lists.
WORST_COLLECTIVES = 10


def match_collectives(collectives: pl.DataFrame, procs: pl.DataFrame) -> pl.DataFrame:
    """One row per (unit, group, seq): run, name, arrival (call start), wait.

    A call's wait is the span from the call to its completion when it has one
    (asynchronous work), else the call's own span.
    """
    units = procs.filter(pl.col("unit").is_not_null()).select("proc", "unit", "unit_order", "run")
    rows = collectives.join(units, on="proc", how="inner")
    calls = rows.filter(~pl.col("done")).group_by(["run", "unit", "unit_order", "group", "seq"]).agg(
        pl.col("name").first(), pl.col("ts").min().alias("arrival"), pl.col("dur").max().alias("call_us"),
    )
    done = rows.filter(pl.col("done")).group_by(["unit", "group", "seq"]).agg(pl.col("dur").max().alias("done_us"))
    return (
        calls.join(done, on=["unit", "group", "seq"], how="left")
        .with_columns(pl.coalesce("done_us", "call_us").alias("wait"))
        .drop("call_us", "done_us")
    )


#: The noise scale is never taken below this (µs): timer resolution and tracing
#: overhead make arrivals this close indistinguishable.
NOISE_FLOOR_US = 100
#: A step is held back by a rank now and then when its lead exceeds this many of
#: its noise scales.
NOISE_MULTIPLE = 5
#: A rank's ordinary steps are those within NOISE_MULTIPLE robust scales (1.4826
#: times the median absolute deviation) of its median lead, found in at most this
#: many rounds, each taking the scale of the steps the one before kept.
NOISE_ROUNDS = 5
#: A rank's leads stray to one side of their median (the steps it held back, or was
#: held in) when they stray this many times further on that side than on the other;
#: its steps beyond ONE_SIDED_MULTIPLE spreads of the other side are then not ordinary.
LOPSIDED, ONE_SIDED_MULTIPLE = 2, 4
#: The noise scale is this quantile of the ordinary steps' distances from their
#: median lead, divided by NOISE_QUANTILE_Z (that of normal noise: the scale reads
#: as a standard deviation).
NOISE_QUANTILE, NOISE_QUANTILE_Z = 0.9, 1.645
#: The least share of steps in which a rank's lead is taken to go beyond its noise
#: by chance (a busy machine's hiccups).
CHANCE_RATE = 0.015
#: A rank late in most steps holds the others back by a typical lead of at least
#: this share of the median step time (and NOISE_FLOOR_US).
CONSISTENT_SHARE = 0.02
#: A rank last in at least this share of the steps is read as slower in most steps
#: (when that finds more of the wait it caused) even where some of its steps stand
#: out of its noise: a rank slower in every step has a wide noise of its own.
MOST_STEPS_SHARE = 0.75
#: A rank is named a straggler only when it held the others back in at least this
#: many steps, and more often than chance (the binomial tests below) allows.
MIN_HELD_STEPS = 3
#: Significance level of those tests, shared among the ranks (Bonferroni).
SIGNIFICANCE = 0.01


def analyse(calls: pl.DataFrame, steps: pl.DataFrame, blocked: pl.DataFrame, compute: dict[str, int],
            units: dict[str, tuple[Any, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(stragglers worst first, collective statistics).

    ``calls`` comes from :func:`match_collectives`; ``steps`` is the step model per
    unit; ``blocked`` each unit's blocked time per step (unit, epoch, step, us);
    ``compute`` the compute time of each unit; ``units`` each unit's (rank, host).

    Per step, a rank's lead is the mean blocked time of the other ranks minus its
    own: how long the others waited for it, bounded by what they were blocked. The
    rank with the largest lead arrived last. A rank stands out in one of two ways:

    - now and then (a slow batch, a hiccup): its noise scale is the step-to-step
      spread of its lead over its ordinary steps (NOISE_ROUNDS): the
      NOISE_QUANTILE of their distances from their median lead over
      NOISE_QUANTILE_Z, at least NOISE_FLOOR_US; a step is held back when it was
      last with a lead beyond NOISE_MULTIPLE noise scales; it stands out when it
      held the others back in MIN_HELD_STEPS steps or more, more often than
      chance allows (one-sided binomial test over the steps, the chance being the
      other ranks' share of such steps, at least CHANCE_RATE);
    - in most steps (a slower rank), when it does not stand out the first way, or
      when it was last in MOST_STEPS_SHARE of the steps and this way finds more of
      the wait it caused: it was last in more steps than chance gives it (a binomial
      test against 1/ranks) and its median lead over all steps is at least
      CONSISTENT_SHARE of the median step time; the held-back steps are then those it
      was last in with a lead beyond that.

    SIGNIFICANCE is shared among the ranks. The wait a rank caused is the sum of its
    leads in the steps it held back.
    """
    ranks = pl.concat([steps.select("unit", "unit_order"), calls.select("unit", "unit_order")],
                      how="vertical").unique("unit").sort("unit_order", nulls_last=True)
    per_call = _per_call(calls)
    if not per_call.height:  # no collective matched across ranks: they do not wait for each other
        return [], {}
    leads = _leads(steps, blocked, calls)
    n_ranks = max(ranks.height, 2)
    level = SIGNIFICANCE / n_ranks
    step_floor = max(float(NOISE_FLOOR_US), CONSISTENT_SHARE * float(steps.get_column("dur").median() or 0))
    n_steps = leads.select("run", "epoch", "step").unique().height
    outliers = leads.filter(pl.col("last") & (pl.col("lead_us") > pl.col("beyond_us")))
    by_unit = {unit: frame for (unit,), frame in leads.partition_by("unit", as_dict=True).items()} \
        if leads.height else {}
    last_counts = dict(per_call.group_by("last").len().iter_rows())
    step_count = dict(steps.group_by("unit").len().iter_rows()) if steps.height else {}
    stragglers = []
    for unit in ranks.get_column("unit").to_list():
        own = by_unit.get(unit)
        last = own.filter(pl.col("last")) if own is not None else leads.clear()
        median_lead = float(own.get_column("lead_us").median()) if own is not None else 0.0
        # Steps that stand out of the rank's own noise tell more than a lead in most
        # steps: the consistent pattern is looked at only when they do not.
        held = outliers.filter(pl.col("unit") == unit)
        # How often a rank's lead goes beyond its noise by chance: how often the other
        # ranks were last by as much (a busy machine's hiccups of a few ms make
        # hiccups common, not leads of tens of ms), never taken below CHANCE_RATE
        # (noise has heavy tails).
        others = outliers.filter(pl.col("unit") != unit).get_column("lead_us").to_list()
        p_value = _held_p_value(held.get_column("lead_us").to_list(), others, n_steps,
                                max(n_steps * (n_ranks - 1), 1))
        consistent = False
        now_and_then = held.height >= MIN_HELD_STEPS and p_value <= level
        if not now_and_then or last.height >= MOST_STEPS_SHARE * n_steps:
            consistent_p = _binomial_tail(last.height, n_steps, 1 / n_ranks)
            consistent = consistent_p <= level and median_lead >= step_floor
            if consistent:
                in_most = last.filter(pl.col("lead_us") > step_floor)
                # A rank last in nearly every step is slower in every step: the few of
                # its steps beyond its own (wide) noise are not all it held back.
                if not now_and_then or in_most.get_column("lead_us").sum() > held.get_column("lead_us").sum():
                    held, p_value = in_most, consistent_p
                else:
                    consistent = False
        caused = float(held.get_column("lead_us").sum()) if held.height else 0.0
        count = step_count.get(unit, 0)
        rank, host = units.get(unit, (None, None))
        noise = own.get_column("noise_us").first() if own is not None else None
        beyond = own.get_column("beyond_us").first() if own is not None else None
        stragglers.append({
            "rank": rank,
            "unit": unit,
            "host": host,
            "last_arrivals": int(last_counts.get(unit, 0)),
            "caused_wait_us": round(caused),
            "held_steps": held.height,
            "steps": count,
            "caused_wait_us_per_step": round(caused / count) if count else None,
            "compute_us_per_step": round(compute.get(unit, 0) / count) if count else None,
            "last_steps": last.height,
            "median_lead_us": round(median_lead),
            "noise_us": round(noise) if noise is not None else None,
            "beyond_us": round(beyond) if beyond is not None else None,
            "p_value": round(p_value, 6),
            "significant": held.height >= MIN_HELD_STEPS and p_value <= level,
            "pattern": "most steps" if consistent else "some steps",
        })
    stragglers.sort(key=lambda r: (not r["significant"], -r["caused_wait_us"]))  # stable: rank order next
    skews = leads.filter(pl.col("last")).get_column("lead_us")
    worst = per_call.sort(["skew_us", "seq"], descending=[True, False]).head(WORST_COLLECTIVES)
    stats: dict[str, Any] = {
        "matched": per_call.height,
        "steps": n_steps,
        "held_steps": sum(r["held_steps"] for r in stragglers),
        "median_skew_us": round(skews.median()) if skews.len() else None,
        "noise_us": round(leads.get_column("noise_us").median()) if leads.height else None,
        "mean_skew_us": round(per_call.get_column("skew_us").mean(), 1),
        "max_skew_us": int(per_call.get_column("skew_us").max()),
        "worst": worst.select("group", "seq", "name", "ranks", "skew_us", "last", "caused_us").to_dicts(),
    }
    return stragglers, stats


def _leads(steps: pl.DataFrame, blocked: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    """run, epoch, step, unit, lead_us, noise_us, last: each rank's lead in each step
    that two or more ranks ran, its noise scale, and whether it was the last rank
    (see :func:`analyse`)."""
    schema = {"run": pl.Int32, "epoch": pl.Int64, "step": pl.Int64, "unit": pl.String, "lead_us": pl.Float64,
              "noise_us": pl.Float64, "beyond_us": pl.Float64, "last": pl.Boolean}
    if not steps.height:
        return pl.DataFrame(schema=schema)
    run_of = calls.select("unit", "run").unique("unit") if calls.height else pl.DataFrame(
        schema={"unit": pl.String, "run": pl.Int32})
    step = ["run", "epoch", "step"]
    frame = (
        steps.select("unit", "unit_order", "epoch", "step")
        .join(run_of, on="unit", how="left").with_columns(pl.col("run").fill_null(0).cast(pl.Int32))
        .join(blocked, on=["unit", "epoch", "step"], how="left", nulls_equal=True)
        .with_columns(pl.col("us").fill_null(0).cast(pl.Float64))
        .with_columns(pl.len().over(step).alias("ranks"))
        .filter(pl.col("ranks") > 1)
    )
    if not frame.height:
        return pl.DataFrame(schema=schema)
    others = (pl.col("us").sum().over(step) - pl.col("us")) / (pl.col("ranks") - 1)
    frame = frame.with_columns((others - pl.col("us")).alias("lead_us"))
    # Each rank's noise scale, from its ordinary steps (see :func:`_noise_scale`).
    keys = ["run", "unit"]
    scales = pl.DataFrame([(*key, _noise_scale(group.get_column("lead_us").to_numpy()))
                           for key, group in frame.group_by(keys, maintain_order=True)],
                          schema={"run": pl.Int32, "unit": pl.String, "noise_us": pl.Float64}, orient="row")
    frame = frame.join(scales, on=keys, how="left").with_columns(
        (pl.col("unit") == pl.col("unit").sort_by(["lead_us", "unit_order"], descending=[True, False])
         .first().over(step)).alias("last"),
    )
    # What the last rank leads by in an ordinary step, over all the steps of the run:
    # the median of each step's largest lead and its robust spread (1.4826 times the
    # median absolute deviation), which the steps one rank held back cannot widen
    # while they are fewer than half. A few slowed steps among few (a quarter of 16)
    # widen that rank's own noise scale, read from the tail of its leads, until it
    # hides them; on a loaded machine most of all.
    largest = (frame.filter(pl.col("last")).select("run", pl.col("lead_us").alias("largest"))
               .group_by("run").agg(pl.col("largest").median().alias("typical"),
                                    (pl.col("largest") - pl.col("largest").median()).abs().median()
                                    .alias("mad")))
    frame = frame.join(largest, on="run", how="left").with_columns(
        pl.min_horizontal(
            NOISE_MULTIPLE * pl.col("noise_us"),
            pl.col("typical")
            + NOISE_MULTIPLE * pl.max_horizontal(1.4826 * pl.col("mad"), pl.lit(float(NOISE_FLOOR_US))),
        ).alias("beyond_us"))
    return frame.select(*step, "unit", "lead_us", "noise_us", "beyond_us", "last")


def _noise_scale(leads: np.ndarray) -> float:
    """A rank's noise scale: how far its lead strays from step to step in its ordinary
    steps (see :func:`analyse`). The ordinary steps are found in rounds (at most
    NOISE_ROUNDS, until they agree): those within NOISE_MULTIPLE robust spreads
    (1.4826 times the median distance) of their median lead. Where the leads stray
    LOPSIDED times further on one side of the median than on the other, that side
    holds steps the rank held back (or was held in): its steps beyond
    ONE_SIDED_MULTIPLE spreads of the other side are left out, so that a third of a
    run slowed, which moves the median and widens the spread, cannot hide itself.
    The scale is then the NOISE_QUANTILE of the ordinary steps' distances from their
    median over NOISE_QUANTILE_Z (their tail: scheduling hiccups make it heavier than
    normal), never below NOISE_FLOOR_US."""
    floor = float(NOISE_FLOOR_US)
    kept = np.sort(leads)
    for _ in range(NOISE_ROUNDS):
        centre = float(np.median(kept))
        below = 1.4826 * float(np.median(centre - kept[kept <= centre]))
        above = 1.4826 * float(np.median(kept[kept >= centre] - centre))
        if above > LOPSIDED * max(below, floor):
            fewer = kept[kept <= centre + ONE_SIDED_MULTIPLE * max(below, floor)]
        elif below > LOPSIDED * max(above, floor):
            fewer = kept[kept >= centre - ONE_SIDED_MULTIPLE * max(above, floor)]
        else:
            spread = max(1.4826 * float(np.median(np.abs(kept - centre))), floor)
            fewer = kept[np.abs(kept - centre) <= NOISE_MULTIPLE * spread]
        if fewer.size == kept.size:
            break
        kept = fewer
    deviation = np.abs(kept - np.median(kept))
    return max(float(np.quantile(deviation, NOISE_QUANTILE)) / NOISE_QUANTILE_Z, floor)


def _per_call(calls: pl.DataFrame) -> pl.DataFrame:
    """run, group, seq, name, ranks, last, skew_us, caused_us per collective call
    matched across ranks: the last rank to arrive waited the least."""
    call = ["run", "group", "seq"]
    matched = calls.with_columns(pl.len().over(call).alias("ranks")).filter(pl.col("ranks") > 1)
    return matched.group_by(call).agg(
        pl.col("name").first(),
        pl.col("ranks").first(),
        pl.col("unit").sort_by(["wait", "unit_order"]).first().alias("last"),
        pl.col("wait").min().alias("last_wait"),
        pl.col("wait").max().alias("max_wait"),
        pl.col("wait").sum().alias("sum_wait"),
    ).with_columns(
        (pl.col("max_wait") - pl.col("last_wait")).alias("skew_us"),
        ((pl.col("sum_wait") - pl.col("last_wait")) / (pl.col("ranks") - 1) - pl.col("last_wait"))
        .round(0).cast(pl.Int64).alias("caused_us"),
    ).drop("last_wait", "max_wait", "sum_wait")


def _held_p_value(leads: list[float], others: list[float], n_steps: int, slots: int) -> float:
    """How likely a rank's held-back steps (``leads``) are by chance. Each of its k-th
    largest leads, from the MIN_HELD_STEPS-th to the least, is taken as a threshold;
    the chance at it is the share of the other ranks' ``slots`` (steps times other
    ranks) in which one was last by as much (``others``: their leads in the steps
    they held back), never below CHANCE_RATE. For each chance met, the binomial tail
    of the most steps led by that much: the least tail, times the chances met
    (Bonferroni; one, the floor, leaves the test at the least lead as it was). At
    the least lead alone, a few steps held back by seconds would be judged against a
    busy machine's many hiccups of a millisecond or two."""
    leads = sorted(leads, reverse=True)
    others = sorted(others)
    most: dict[float, int] = {}  # chance -> the most steps led by as much at that chance
    for k in range(min(MIN_HELD_STEPS, len(leads)), len(leads) + 1):
        as_much = len(others) - bisect.bisect_left(others, leads[k - 1]) if k else len(others)
        chance = max(CHANCE_RATE, as_much / slots)
        most[chance] = max(k, most.get(chance, 0))
    best = min(_binomial_tail(k, n_steps, chance) for chance, k in most.items())
    return min(1.0, best * len(most))


def _binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed in logarithms: a run's thousands of
    steps make binomial coefficients past a float's range."""
    if k <= 0 or p >= 1:
        return 1.0
    if k > n or p <= 0:
        return 0.0
    log_factorial = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=np.float64)))))
    i = np.arange(k, n + 1)
    log_terms = (log_factorial[n] - log_factorial[i] - log_factorial[n - i]
                 + i * math.log(p) + (n - i) * math.log1p(-p))
    top = float(log_terms.max())
    return min(1.0, math.exp(top) * float(np.exp(log_terms - top).sum()))


def answer(context: Context) -> dict[str, Any]:
    """Stage 2: the ranks the others waited for, and the collectives matched across ranks."""
    units = context.units
    calls = match_collectives(context.combined.collectives, context.procs)
    waits = units.compared.select("unit", "epoch", "step", pl.col("blocked_us").alias("us"))
    stragglers, collectives = analyse(calls, units.compared, waits, units.compute_us, units.rank_host)
    return {"stragglers": stragglers, "collectives": collectives}
