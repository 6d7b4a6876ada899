"""Duration distributions that stay small and merge exactly: a relative-error sketch.

Each (process, category, name) keeps one row per *bin* of its durations instead of
one per event or per distinct duration. Durations shorter than ``EXACT_BELOW_US``
are their own bin (exact); longer ones fall into logarithmic buckets
``(gamma**(i-1), gamma**i]`` as in DDSketch, so a name has at most a few thousand
bins however many spans it has. Each bin carries its count, the exact sum of its
durations, their minimum and maximum and the sum of squared deviations from the
bin's mean: counts, totals, means, minima, maxima and standard deviations stay
exact; only a percentile that falls into a bucket holding several distinct
durations is an estimate, within ``RELATIVE_ERROR`` of the true nearest-rank value.

Bins merge by adding counts and sums, so partials combine in any grouping.
"""

from __future__ import annotations

import math

import polars as pl

from ..read.schema import FrameT

#: Durations (µs) below this are kept exactly, one bin per value.
EXACT_BELOW_US = 1024
#: Half-width of a bucket relative to its values.
_ALPHA = 0.005
_GAMMA = (1 + _ALPHA) / (1 - _ALPHA)
_LOG_GAMMA = math.log(_GAMMA)
#: The most a reported percentile differs from the exact nearest-rank one, relative
#: to it: the bucket's half-width plus the rounding to whole microseconds.
RELATIVE_ERROR = 0.01

#: Columns of a bin, after the keys.
BIN_SCHEMA = {"bin": pl.Int64, "n": pl.Int64, "total": pl.Int64, "lo": pl.Int64, "hi": pl.Int64,
              "m2": pl.Float64}


def bins_of(frame: FrameT, by: list[str]) -> FrameT:
    """*by, bin, n, total, lo, hi, m2 of the ``dur`` column of ``frame``."""
    dur = pl.col("dur")
    bucket = (dur.cast(pl.Float64).log() / _LOG_GAMMA).ceil().cast(pl.Int64)
    return (
        frame.with_columns(pl.when(dur < EXACT_BELOW_US).then(dur).otherwise(EXACT_BELOW_US + bucket).alias("bin"))
        .group_by([*by, "bin"])
        .agg(
            pl.len().cast(pl.Int64).alias("n"),
            dur.sum().cast(pl.Int64).alias("total"),
            dur.min().alias("lo"),
            dur.max().alias("hi"),
            (dur.cast(pl.Float64).var(ddof=0).fill_null(0.0) * pl.len()).alias("m2"),
        )
    )


def merged_bins(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Bins of the same (*by, bin) merged: counts and sums add, extremes widen, and
    the squared deviations combine (Chan et al.'s parallel variance)."""
    mean = pl.col("total") / pl.col("n")
    grand = pl.col("total").sum() / pl.col("n").sum()
    return frame.group_by([*by, "bin"]).agg(
        pl.col("n").sum(), pl.col("total").sum(), pl.col("lo").min(), pl.col("hi").max(),
        (pl.col("m2").sum() + (pl.col("n") * (mean - grand) ** 2).sum()).alias("m2"),
    )


def value_expr() -> pl.Expr:
    """The duration a bin stands for in percentiles and histograms: its value when
    exact (or when all its durations are equal), else the bucket's midpoint in
    relative terms, kept within the durations it holds."""
    bucket = pl.col("bin") - EXACT_BELOW_US
    middle = (2 * pl.lit(_GAMMA).pow(bucket) / (_GAMMA + 1)).round()
    return (
        pl.when(pl.col("bin") < EXACT_BELOW_US).then(pl.col("bin"))
        .otherwise(pl.max_horizontal(pl.col("lo"), pl.min_horizontal(pl.col("hi"), middle.cast(pl.Int64))))
        .cast(pl.Int64)
    )


def std_expr() -> pl.Expr:
    """Sample standard deviation of the durations of a group of bins (NaN for one)."""
    mean = pl.col("total") / pl.col("n")
    grand = pl.col("total").sum() / pl.col("n").sum()
    m2 = pl.col("m2").sum() + (pl.col("n") * (mean - grand) ** 2).sum()
    return (m2 / (pl.col("n").sum() - 1)).sqrt()
