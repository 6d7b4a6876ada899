"""The answers about span durations: each name's statistics (from the mergeable
sketch, see ``reduce.sketch``), the data loaders' waits for items, and the duration
histograms of the names with the most time."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from ... import format as fmt
from ..read.schema import loop_body
from ..reduce.sketch import merged_bins, std_expr, value_expr
from .context import Context

#: (category, name) pairs that get a duration histogram.
DISTRIBUTIONS = 12
_HISTOGRAM_BINS = 24


def _quantile_exprs(qs: Sequence[float]) -> list[pl.Expr]:
    """Aggregations over sketch bins (``dur``: the value a bin stands for, ``n``, ``total``,
    ``lo``, ``hi``) sorted by ``bin`` within a group, with ``cum`` (running count) and
    ``total_n`` columns present."""
    exprs = [
        pl.col("n").sum().alias("count"),
        pl.col("total").sum().alias("total_us"),
        pl.col("lo").min().alias("min_us"),
        pl.col("hi").max().alias("max_us"),
    ]
    for q in qs:
        threshold = (pl.col("total_n") * q - 1e-9).ceil()
        exprs.append(pl.col("dur").filter(pl.col("cum") >= threshold).min().alias(f"p{round(q * 100)}_us"))
    return exprs


def _value_stats(frame: pl.DataFrame, by: list[str], qs: Sequence[float] = (0.5, 0.95)) -> pl.DataFrame:
    """count, total, mean, min, percentiles, max of the durations of sketch bins per group."""
    if not frame.height:
        schema = {**{c: frame.schema[c] for c in by}, "count": pl.Int64, "total_us": pl.Int64,
                  "min_us": pl.Int64, "max_us": pl.Int64, "mean_us": pl.Float64}
        schema.update({f"p{round(q * 100)}_us": pl.Int64 for q in qs})
        return pl.DataFrame(schema=schema)
    ordered = frame.sort([*by, "bin"]).with_columns(
        value_expr().alias("dur"), pl.col("n").cum_sum().over(by).alias("cum"),
        pl.col("n").sum().over(by).alias("total_n"),
    )
    stats = ordered.group_by(by).agg(_quantile_exprs(qs))
    return stats.with_columns((pl.col("total_us") / pl.col("count")).alias("mean_us"))


def _category_order(cat: str) -> tuple[int, str]:
    known = fmt.AI_CATEGORIES
    return (known.index(cat), "") if cat in known else (len(known), cat or "")


def category_rows(durations: pl.DataFrame, self_times: pl.DataFrame) -> list[dict[str, Any]]:
    merged = merged_bins(durations.drop("proc"), ["cat", "name"])
    stats = _value_stats(merged, ["cat", "name"]).join(
        self_times.rename({"us": "self_us"}), on=["cat", "name"], how="left"
    ).with_columns(pl.col("self_us").fill_null(0))
    # The spread of the durations (sample standard deviation), for diff's intervals.
    spread = merged.group_by("cat", "name").agg(std_expr().alias("std_us"))
    stats = stats.join(spread, on=["cat", "name"], how="left")
    # ties in total broken by name, so the order is the same however the files were read
    rows = stats.sort(["total_us", "name"], descending=[True, False]).to_dicts()
    rows.sort(key=lambda r: _category_order(r["cat"]))
    return [_round(r) for r in rows]


def _round(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}


#: An item wait's, loop body's or pass end's suffix, which its loop's name is without.
_LOOP_SUFFIX = "(" + "|".join(re.escape(s) for s in (fmt.ITER_SUFFIX, fmt.END_SUFFIX, *fmt.LOOP_BODY_SUFFIXES)) + ")$"


def dataloader_rows(durations: pl.DataFrame, procs: pl.DataFrame) -> list[dict[str, Any]]:
    """Per loop (``.iter()``): the time waiting for items (``.iter``, and the wait that
    found the pass over, ``.end``) against the time using them (``.block``)."""
    name = pl.col("name")
    loops = durations.filter(
        (pl.col("cat") != fmt.CAT_PIPELINE)
        & (name.str.ends_with(fmt.ITER_SUFFIX) | name.str.ends_with(fmt.END_SUFFIX) | loop_body(name))
    ).with_columns(
        (name.str.ends_with(fmt.ITER_SUFFIX) | name.str.ends_with(fmt.END_SUFFIX)).alias("is_iter"),
        name.str.ends_with(fmt.ITER_SUFFIX).alias("is_item"),
        name.str.replace(_LOOP_SUFFIX, "").alias("loader"),
    )
    if not loops.height:
        return []
    # the items' waits; the passes' ends are waits too, but no item's
    iters = _value_stats(merged_bins(loops.filter("is_item").drop("proc", "name", "is_iter", "is_item"),
                                     ["cat", "loader"]), ["cat", "loader"], qs=(0.95,))
    ends = (loops.filter(pl.col("is_iter") & ~pl.col("is_item")).group_by("cat", "loader")
            .agg(pl.col("total").sum().alias("end_us")))
    blocks = (
        loops.filter(~pl.col("is_iter"))
        .group_by("cat", "loader")
        .agg(pl.col("total").sum().alias("block_us"))
    )
    per_unit = (
        loops.join(procs.select("proc", "unit", "unit_order"), on="proc")
        .filter(pl.col("unit").is_not_null())
        .group_by("cat", "loader", "unit", "unit_order")
        .agg(
            pl.col("total").filter(pl.col("is_iter")).sum().alias("iter_us"),
            pl.col("total").filter(~pl.col("is_iter")).sum().alias("block_us"),
        )
        .with_columns(_stall("iter_us", "block_us"))
        .sort(["stall", "unit_order"], descending=[True, False], nulls_last=True)
        .drop("unit_order")
    )
    rows = (
        iters.join(blocks, on=["cat", "loader"], how="left").join(ends, on=["cat", "loader"], how="left")
        .rename({"count": "items", "total_us": "iter_us", "mean_us": "iter_mean_us", "p95_us": "iter_p95_us"})
        .with_columns((pl.col("iter_us") + pl.col("end_us").fill_null(0)).alias("iter_us")).drop("end_us")
        .with_columns(_stall("iter_us", "block_us"))
        .sort("iter_us", descending=True)
        .to_dicts()
    )
    for row in rows:
        worst = per_unit.filter((pl.col("cat") == row["cat"]) & (pl.col("loader") == row["loader"]))
        row["ranks"] = [_round(r) for r in worst.drop("cat", "loader").rename({"unit": "rank"}).to_dicts()]
        del row["min_us"], row["max_us"]
    return [_round(r) for r in rows]


def _stall(iter_col: str, block_col: str) -> pl.Expr:
    total = pl.col(iter_col) + pl.col(block_col)
    return pl.when(total > 0).then(pl.col(iter_col) / total).alias("stall")


def distribution_rows(durations: pl.DataFrame) -> list[dict[str, Any]]:
    if not durations.height:
        return []
    totals = (
        durations.group_by("cat", "name")
        .agg(pl.col("total").sum())
        .sort(["total", "cat", "name"], descending=[True, False, False])
        .head(DISTRIBUTIONS)
    )
    out = []
    for cat, name, _ in totals.iter_rows():
        sub = merged_bins(durations.filter((pl.col("cat") == cat) & (pl.col("name") == name)).drop(
            "proc", "cat", "name"), []).with_columns(value_expr().alias("dur"))
        edges, counts = _histogram(sub)
        out.append(
            {"cat": cat, "name": name, "edges_us": [round(float(e), 2) for e in edges],
             "counts": [int(c) for c in counts]}
        )
    return out


def _histogram(bins: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Edges (µs, log-spaced as near as the sketch allows) and counts of a name's
    durations from its sketch's bins: every edge is the least duration of a bin, so
    each bin's durations fall in one bar and the counts are exact at the bars' width
    (a bar never finer than the sketch: 2,000 and 2,004 µs share a bucket, and a bar)."""
    lo = np.maximum(bins.get_column("lo").to_numpy().astype(np.float64), 1.0)
    weights = bins.get_column("n").to_numpy()
    top = max(float(bins.get_column("hi").max()), 1.0) + 1
    starts = np.append(np.unique(lo), top)
    wanted = np.geomspace(starts[0], top, _HISTOGRAM_BINS + 1)
    edges = starts[np.unique(np.searchsorted(starts, wanted).clip(0, starts.size - 1))]
    edges = np.unique(np.concatenate(([starts[0]], edges, [top])))
    counts, _ = np.histogram(lo, bins=edges, weights=weights)
    return edges, counts


def answer(context: Context) -> dict[str, Any]:
    """Stage 3: time per category and name, the data-loader's waits, the duration histograms."""
    durations = context.combined.durations
    return {
        "categories": category_rows(durations, context.combined.self_times),
        "dataloader": dataloader_rows(durations, context.procs),
        "distributions": distribution_rows(durations),
    }
