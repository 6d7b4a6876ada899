"""The GPU activity of PyTorch profiler documents, by process: each partition's
activity rows given the index of the process they belong to (``proc``) and, for the
answers, that process's host and rank."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from .kineto import activity_schema
from .metadata import Resolution
from .schema import HOST_KEY


def activity_by_process(sources: Sequence[Any], resolution: Resolution) -> pl.DataFrame:
    """The activity tables of all partitions, each row given its process index ``proc``
    and the ``file`` it came from (one profiling window)."""
    frames = []
    for source in sources:
        activity = getattr(source, "activity", None)
        if activity is None or not activity.height:
            continue
        keys = activity.select("pid", HOST_KEY).unique()
        mapping = pl.DataFrame(
            {"pid": keys.get_column("pid"), HOST_KEY: keys.get_column(HOST_KEY),
             "proc": [resolution.process_of(source.partition.path, pid, key) for pid, key in keys.iter_rows()]},
            schema={"pid": pl.Int64, HOST_KEY: pl.String, "proc": pl.Int32},
        )
        if "file" not in activity.columns:
            activity = activity.with_columns(pl.lit(source.partition.path, pl.String).alias("file"))
        frames.append(activity.join(mapping, on=["pid", HOST_KEY], how="left").drop(HOST_KEY))
    if not frames:
        return pl.DataFrame(schema={**activity_schema(), "file": pl.String, "proc": pl.Int32})
    return pl.concat(frames, how="vertical")


def with_processes(activity: pl.DataFrame, resolution: Resolution) -> pl.DataFrame:
    """Activity by process index (``proc``) with each process's ``host`` and ``rank``."""
    procs = pl.DataFrame(
        {"proc": range(len(resolution.processes)), "host": [p.host for p in resolution.processes],
         "rank": [p.rank for p in resolution.processes]},
        schema={"proc": pl.Int32, "host": pl.String, "rank": pl.Int32},
    )
    return activity.join(procs, on="proc", how="left")
