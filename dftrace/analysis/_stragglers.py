"""Straggler analysis: which rank the others waited for, found without comparing clocks.

Each traced collective carries its process group and a sequence number within it
(``args.group``, ``args.seq``), so the same call is matched across ranks. In a
collective every rank waits until the last one arrives, so the last rank to arrive
waits the least: each rank's wait is its own span's duration (for an asynchronous
call, the span from the call to its completion), measured on its own clock. Per
matched call:

- the last rank to arrive is the one with the shortest wait;
- the arrival skew (last arrival minus first) is the longest wait minus the
  shortest, which needs no clock alignment between hosts;
- the wait it caused is the others' mean wait beyond its own.

Per rank: how often it arrived last, the wait it caused (in all, and per step from
the collectives inside steps), in how many steps it caused the most wait (it held
the others back), and its compute time per step.
"""

from __future__ import annotations

from typing import Any

import polars as pl

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


def analyse(calls: pl.DataFrame, steps: pl.DataFrame, compute: dict[str, int],
            units: dict[str, tuple[Any, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any], pl.DataFrame]:
    """(stragglers worst first, collective statistics, wait per unit and step).

    ``calls`` comes from :func:`match_collectives`; ``steps`` is the step model per
    unit; ``compute`` the compute time of each unit; ``units`` each unit's (rank,
    host). Calls are matched within a run (the ``run`` column).
    """
    empty_waits = pl.DataFrame(schema={"unit": pl.String, "epoch": pl.Int64, "step": pl.Int64,
                                       "wait_us": pl.Int64})
    stepped = _in_steps(calls, steps)
    waits = (
        stepped.filter(pl.col("step").is_not_null() | pl.col("epoch").is_not_null())
        .group_by(["unit", "epoch", "step"])
        .agg(pl.col("wait").sum().alias("wait_us"))
        if stepped.height else empty_waits
    )
    call = ["run", "group", "seq"]
    matched = stepped.with_columns(pl.len().over(call).alias("ranks")).filter(pl.col("ranks") > 1)
    if not matched.height:
        return [], {}, waits
    per_call = matched.group_by(call).agg(
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
    )
    # Each call counts in the step the last rank was in when it arrived.
    located = per_call.join(
        matched.select(*call, pl.col("unit").alias("last"), "epoch", "step"),
        on=[*call, "last"], how="left",
    )
    per_step = (
        located.filter(pl.col("step").is_not_null() | pl.col("epoch").is_not_null())
        .group_by(["epoch", "step", "last"])
        .agg(pl.col("caused_us").sum())
        .sort(["caused_us", "last"], descending=[True, False])
        .group_by(["epoch", "step"], maintain_order=True)
        .first()
    )
    n_steps = steps.select("epoch", "step").unique().height if steps.height else 0
    held = per_step.group_by("last").agg(pl.len().alias("held_steps"))
    in_step = pl.col("step").is_not_null() | pl.col("epoch").is_not_null()
    per_unit = (
        located.group_by("last")
        .agg(pl.len().alias("last_arrivals"), pl.col("caused_us").sum().alias("caused_wait_us"),
             pl.col("caused_us").filter(in_step).sum().alias("caused_in_steps"))
        .join(held, on="last", how="left")
        .rename({"last": "unit"})
    )
    order = (
        matched.select("unit", "unit_order").unique().join(per_unit, on="unit", how="left")
        .with_columns(pl.col("last_arrivals", "caused_wait_us", "caused_in_steps", "held_steps").fill_null(0))
        .sort(["caused_wait_us", "unit_order"], descending=[True, False])
    )
    unit_steps = steps.group_by("unit").len() if steps.height else pl.DataFrame(
        schema={"unit": pl.String, "len": pl.UInt32})
    step_count = dict(unit_steps.iter_rows())
    stragglers = []
    for row in order.iter_rows(named=True):
        count = step_count.get(row["unit"], 0)
        rank, host = units.get(row["unit"], (None, None))
        stragglers.append({
            "rank": rank,
            "unit": row["unit"],
            "host": host,
            "last_arrivals": int(row["last_arrivals"]),
            "caused_wait_us": int(row["caused_wait_us"]),
            "held_steps": int(row["held_steps"]),
            "steps": count,
            "caused_wait_us_per_step": round(row["caused_in_steps"] / count) if count else None,
            "compute_us_per_step": round(compute.get(row["unit"], 0) / count) if count else None,
        })
    worst = per_call.sort(["skew_us", "seq"], descending=[True, False]).head(WORST_COLLECTIVES)
    stats = {
        "matched": per_call.height,
        "steps": n_steps,
        "mean_skew_us": round(per_call.get_column("skew_us").mean(), 1),
        "max_skew_us": int(per_call.get_column("skew_us").max()),
        "worst": worst.select("group", "seq", "name", "ranks", "skew_us", "last", "caused_us").to_dicts(),
    }
    return stragglers, stats, waits


def _in_steps(calls: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """``calls`` with the (epoch, step) of the unit's step each call arrived in."""
    if not steps.height or not calls.height:
        return calls.with_columns(pl.lit(None, pl.Int64).alias("epoch"), pl.lit(None, pl.Int64).alias("step"))
    spans = steps.select("unit", "epoch", "step", pl.col("start").alias("step_start"),
                         pl.col("end").alias("step_end")).sort("step_start")
    # Both sides are sorted by time, hence within each unit too.
    joined = calls.sort("arrival").join_asof(spans, left_on="arrival", right_on="step_start", by="unit",
                                             check_sortedness=False)
    outside = pl.col("arrival") >= pl.col("step_end")
    return joined.with_columns(
        pl.when(outside).then(None).otherwise(pl.col("epoch")).alias("epoch"),
        pl.when(outside).then(None).otherwise(pl.col("step")).alias("step"),
    ).drop("step_start", "step_end")
