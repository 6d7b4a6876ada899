"""The runs of a trace: which processes belong to which run (a job restarted into the
same directory, a rank resumed from a checkpoint), each process's unit (its rank in
its run), and where a resumed run picked up its steps."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import polars as pl

from ..reduce.combine import Combined
from .context import Context


def processes_frame(combined: Combined) -> pl.DataFrame:
    """proc -> label, rank, host, pid, and the unit steps are compared by.

    Ranks are the units when any process has one (processes without a rank, such
    as helpers, are then left out of step comparisons); otherwise each process is,
    but a DataLoader worker: the steps its spans carry are those its parent had
    numbered when it forked, never steps of its own.
    """
    processes = combined.resolution.processes
    any_rank = any(p.rank is not None for p in processes)
    rows = []
    for i, p in enumerate(processes):
        if any_rank:
            unit = f"rank {p.rank}" if p.rank is not None else None
            order = p.rank if p.rank is not None else None
        elif p.dataloader_worker:
            unit = order = None
        else:
            unit, order = p.label, i
        rows.append(
            {"proc": i, "label": p.label, "rank": p.rank, "host": p.host, "pid": p.pid,
             "dropped": p.dropped, "unit": unit, "unit_order": order}
        )
    return pl.DataFrame(
        rows,
        schema={"proc": pl.Int32, "label": pl.String, "rank": pl.Int32, "host": pl.String,
                "pid": pl.Int64, "dropped": pl.Int64, "unit": pl.String, "unit_order": pl.Int64},
    )


def run_origins(runs: list[dict[str, Any]], procs: pl.DataFrame, frame: pl.DataFrame) -> pl.Expr:
    """The start of each unit's run (of the whole trace when it is one run)."""
    if not runs:
        return pl.lit(frame.get_column("start").min() if frame.height else 0)
    start_of = {}
    for run in runs:
        for proc in run["procs"]:
            start_of[proc] = run["start_us"]
    units = procs.filter(pl.col("unit").is_not_null()).select("unit", "proc")
    mapping = {unit: start_of.get(proc, 0) for unit, proc in units.iter_rows()}
    return pl.col("unit").replace_strict(mapping, default=0, return_dtype=pl.Int64)


#: What ``units_per_run`` adds to the unit of each run of a job started again.
RUN_SUFFIX = r" · run \d+$"


def units_per_run(procs: pl.DataFrame, runs: list[dict[str, Any]], combined: Combined) -> pl.DataFrame:
    """procs with a ``run`` column; a unit found in several runs (rank 0 of each, a
    script with no rank run again: ``scripts_run_again``) is split into one per run
    ("rank 0 · run 2"), so steps and collectives never mix runs."""
    if not runs:
        return procs.with_columns(pl.lit(0, pl.Int32).alias("run"))
    run_of = {proc: i for i, run in enumerate(runs) for proc in run["procs"]}
    procs = procs.with_columns(pl.col("proc").replace_strict(run_of, default=0, return_dtype=pl.Int32).alias("run"))
    scripts = scripts_run_again(combined, runs)
    if scripts:
        procs = procs.with_columns(
            pl.col("proc").replace_strict(scripts, default=None, return_dtype=pl.String).fill_null(pl.col("unit"))
            .alias("unit")).with_columns(pl.col("unit_order").min().over("unit"))
    shared = pl.col("run").n_unique().over("unit") > 1
    return procs.with_columns(
        pl.when(shared).then(pl.col("unit") + pl.lit(" · run ") + (pl.col("run") + 1).cast(pl.String))
        .otherwise(pl.col("unit")).alias("unit"),
        pl.when(shared).then(pl.col("unit_order") + pl.col("run").cast(pl.Int64) * 1_000_000)
        .otherwise(pl.col("unit_order")).alias("unit_order"),
    )


def scripts_run_again(combined: Combined, runs: list[dict[str, Any]]) -> dict[int, str]:
    """process -> unit of each script with no rank (``_rankless_roots``) in a job whose
    runs are the same script run again: one unit in all its runs, named for the script
    on its host ("host17 · train.py"), as a rank run again is one rank."""
    again = {run["job"] for run in runs if run["resumed"]}
    if not again:
        return {}
    info = combined.resolution.processes
    roots = set(_rankless_roots(info).values())
    out = {}
    for run in runs:
        if run["job"] in again:
            for proc in roots.intersection(run["procs"]):
                argv = info[proc].info.get("cmdline")  # the script's sys.argv
                first = str(argv[0]) if isinstance(argv, list) and argv else ""
                out[proc] = f"{info[proc].host} · {os.path.basename(first) or 'script'}"
    return out


def find_runs(combined: Combined, procs: pl.DataFrame) -> list[dict[str, Any]]:
    """Separate runs among the files, or [] when they are one run.

    Files belong to one run when their times overlap (with a minute of slack); a
    gap between groups of files means separate runs, which usually also shows as
    other hosts and command lines. A process with no rank and no traced parent
    (a script run on its own) that starts after every file before it ended starts a
    run of its own, gap or none: a script run again is not a second rank of the
    first. By the same command line within the gap, it is the job started again
    (resumed from its checkpoint, as a rank run again is); else a separate run.
    """
    info = combined.resolution.processes
    # Times of a process started after the wall clock was stepped, put back on its
    # parent's clock: one job, whatever the wall clock did.
    shift = {path: step["shift_us"] for step in clock_steps(info) for path in info[step["proc"]].files}
    files = combined.file_extents
    if shift:
        shifted = pl.col("path").replace_strict(shift, default=0, return_dtype=pl.Int64)
        files = files.with_columns(pl.col("start") + shifted, pl.col("end") + shifted)
    files = files.sort("start")
    if files.height < 2:
        return []
    rank_of = _launched_ranks(info)
    alone = _rankless_roots(info)
    groups: list[list[tuple[str, int, int, str]]] = []
    resumed: list[bool] = []
    reach = None
    #: rank -> (pid, end) of the process that ran it in the current run
    ranks_here: dict[int, tuple[int, int]] = {}
    #: process -> command of the scripts run on their own in the current run
    alone_here: dict[int, str] = {}
    for path, start, end, command in files.iter_rows():
        owner = rank_of.get(path)
        proc = alone.get(path)
        if reach is None or start > reach + RUN_GAP_US or (proc is not None and proc not in alone_here
                                                           and start > reach):
            # A script run on its own again, by the same command: its job started again.
            again = (reach is not None and proc is not None and start <= reach + RUN_GAP_US and bool(command)
                     and command in alone_here.values())
            groups.append([])
            resumed.append(again)
            ranks_here, alone_here = {}, {}
            reach = end
        elif owner is not None and owner[0] in ranks_here and ranks_here[owner[0]][0] != owner[1] \
                and ranks_here[owner[0]][1] <= start:
            # A rank run again by another process after the first ended: the job was
            # started again (torchrun's restarts, a requeued job resuming).
            groups.append([])
            resumed.append(True)
            ranks_here, alone_here = {}, {}
        groups[-1].append((path, start, end, command))
        if proc is not None:
            alone_here[proc] = command
        if owner is not None:
            before = ranks_here.get(owner[0])
            ranks_here[owner[0]] = (owner[1], max(end, before[1]) if before and before[0] == owner[1] else end)
        reach = max(reach, end)
    if len(groups) < 2:
        return []
    runs = []
    job = -1
    for members, again in zip(groups, resumed):
        paths = {m[0] for m in members}
        run_procs = [i for i, p in enumerate(info) if paths & set(p.files)]
        job += 0 if again and job >= 0 else 1
        runs.append({
            "resumed": again,
            "job": job,
            "files": sorted(paths),
            "procs": run_procs,
            "ranks": sorted({info[p].rank for p in run_procs if info[p].rank is not None}),
            "hosts": sorted({info[p].host for p in run_procs if info[p].host}),
            "commands": sorted({m[3] for m in members} - {""}),
            "start_us": min(m[1] for m in members),
            "end_us": max(m[2] for m in members),
            "wall_us": max(m[2] for m in members) - min(m[1] for m in members),
        })
    return runs


def units_of_each_job(procs: pl.DataFrame, runs: list[dict[str, Any]]) -> list[list[str]]:
    """The units of each job (the runs of a resumed job are one), in the order of the
    jobs; [] when the trace is one run."""
    if not runs:
        return []
    job_of_run = {i: run["job"] for i, run in enumerate(runs)}
    jobs: dict[int, list[str]] = {}
    for unit, run in procs.filter(pl.col("unit").is_not_null()).select("unit", "run").unique(
            "unit", maintain_order=True).iter_rows():
        jobs.setdefault(job_of_run.get(run, 0), []).append(unit)
    return [jobs[job] for job in sorted(jobs)]


def last_run_of_each_step(by_unit: pl.DataFrame, procs: pl.DataFrame,
                           runs: list[dict[str, Any]]) -> pl.DataFrame:
    """``by_unit`` with each (rank, host, epoch, step) that the runs of one resumed job
    ran more than once kept from the last run only (separate runs keep theirs)."""
    if not any(r.get("resumed") for r in runs):
        return by_unit
    return (by_unit.join(_units_of_jobs(procs, runs), on="unit", how="left").sort("run", maintain_order=True)
            .unique(["job", "across_runs", "host", "epoch", "step"], keep="last", maintain_order=True)
            .sort(["unit_order", "start"], nulls_last=True).select(by_unit.columns))


def _units_of_jobs(procs: pl.DataFrame, runs: list[dict[str, Any]]) -> pl.DataFrame:
    """unit, host, run, job and ``across_runs``: the unit's name in all the runs of its
    job ("rank 0" for "rank 0 · run 2", see ``units_per_run``)."""
    job_of = {i: run["job"] for i, run in enumerate(runs)}
    return (procs.filter(pl.col("unit").is_not_null()).select("unit", "host", "run").unique("unit")
            .with_columns(pl.col("run").replace_strict(job_of, default=0, return_dtype=pl.Int64).alias("job"),
                          pl.col("unit").str.replace(RUN_SUFFIX, "").alias("across_runs")))


def each_rank_across_runs(extents: pl.DataFrame, procs: pl.DataFrame, runs: list[dict[str, Any]],
                          by: list[str]) -> pl.DataFrame:
    """``extents`` (see ``steps.unit_extents``) with the runs of one rank in one resumed
    job made one row per ``by``: its time there the sum of its runs' (each ran part of
    it, a step run again counted each time), its unit the rank's own name. Separate
    runs keep theirs."""
    if not any(r.get("resumed") for r in runs):
        return extents
    joined = extents.join(_units_of_jobs(procs, runs), on="unit", how="left")
    # A resumed rank's units are "rank 0 · run 2" (``units_per_run``): one job's are one rank.
    runs_of_one = pl.col("unit").n_unique().over("job", "across_runs", "host") > 1
    joined = joined.with_columns(
        pl.when(runs_of_one).then(pl.col("across_runs")).otherwise(pl.col("unit")).alias("unit"),
        pl.when(runs_of_one).then(pl.col("unit_order") % 1_000_000).otherwise(pl.col("unit_order")))
    return (joined.group_by(["job", "host", "unit", "unit_order", *by])
            .agg(pl.col("start").min(), pl.col("end").max(), pl.col("n").sum(), pl.col("dur").sum())
            .select(extents.columns))


def say_where_resumed(runs: list[dict[str, Any]], procs: pl.DataFrame, by_unit: pl.DataFrame) -> None:
    """Each resumed run gets ``resumed_at``: the (epoch, step) its first step ran."""
    if not any(run.get("resumed") for run in runs):
        return  # nothing to say: no rank-step is sorted for it
    units = procs.filter(pl.col("unit").is_not_null()).select("unit", "run").unique("unit")
    first = (by_unit.join(units, on="unit", how="inner").filter(pl.col("step").is_not_null())
             .sort("start").group_by("run", maintain_order=True).first())
    at = {run: {"epoch": epoch, "step": step} for run, epoch, step in first.select("run", "epoch", "step").iter_rows()}
    for i, run in enumerate(runs):
        if run.get("resumed"):
            run["resumed_at"] = at.get(i)


#: A process whose clock anchor is further than this from its parent's (on their host,
#: whose monotonic clock they share) was started after the wall clock was stepped.
CLOCK_STEP_US = 1_000_000


def clock_steps(info: Sequence[Any]) -> list[dict[str, Any]]:
    """Processes started after the wall clock of their host was stepped, found by their
    clock anchor (wall and monotonic time at the start) against the one of the first
    traced process they descend from: a parent and its child share the host's
    monotonic clock, so their anchors differ only by a step of the wall clock. Each:
    ``proc`` (index), ``host``, ``pid``, ``step_us`` (how far the wall clock moved)
    and ``shift_us`` (what puts the process's times on its ancestor's clock)."""
    by_key = {(p.host, p.pid): p for p in info}

    def offset(p: Any) -> int | None:
        return p.wall_ns - p.mono_ns if p.wall_ns is not None and p.mono_ns is not None else None

    steps = []
    for i, p in enumerate(info):
        own = offset(p)
        root, seen = p, {id(p)}
        while True:  # the first traced ancestor on the host
            parent = by_key.get((root.host, root.info.get("ppid")))
            if parent is None or id(parent) in seen or offset(parent) is None:
                break
            root = parent
            seen.add(id(root))
        if own is None or root is p:
            continue
        step_us = (own - offset(root)) // 1000
        if abs(step_us) >= CLOCK_STEP_US:
            steps.append({"proc": i, "host": p.host, "pid": p.pid, "step_us": step_us,
                          "shift_us": -step_us})
    return steps


def _rankless_roots(info: Sequence[Any]) -> dict[str, int]:
    """file -> process (its index) of processes with no rank whose parent is known and
    not among the traced processes of their host (neither a worker nor a child of a
    traced process). A trace that does not name the parent (DFTracer's) has none: a
    forked child may start after its parent's last event."""
    traced = {(p.host, p.pid) for p in info}
    return {path: i for i, p in enumerate(info) if p.rank is None and p.role is None
            and p.info.get("ppid") is not None and (p.host, p.info.get("ppid")) not in traced
            for path in p.files}


def _launched_ranks(info: Sequence[Any]) -> dict[str, tuple[int, int]]:
    """file -> (rank, pid) of the process it holds, for processes with a rank of their
    own (not a DataLoader worker, which shares its parent's)."""
    out: dict[str, tuple[int, int]] = {}
    for p in info:
        if p.rank is None or p.role is not None:
            continue
        for path in p.files:
            out.setdefault(path, (p.rank, p.pid))
    return out


#: Files whose times are further apart than this are of separate runs.
RUN_GAP_US = 60_000_000


def answer(context: Context) -> dict[str, Any]:
    """Stage 2: the separate runs found among the files, each resumed one saying where it resumed."""
    say_where_resumed(context.runs, context.procs, context.units.by_unit)
    return {"runs": context.runs}
