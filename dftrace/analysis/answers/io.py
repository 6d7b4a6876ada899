"""The file-I/O answers: what the traced libc calls (cat ``POSIX`` and ``STDIO``) read,
wrote and cost, per file, rank, step, data loader and checkpoint.

I/O events are a layer of their own: they never enter the span tables (steps,
categories, nesting, breakdown). Each partition reduces them to three tables that
combine exactly (see ``reduce.aggregate``): ``io_calls``, one row per I/O event (its
thread, times, kind, bytes, calls), for the answers that place calls in time;
``io_totals``, per (file hash, kind, size bucket), what whole-trace figures are
summed from; ``io_cover``, the union of each thread's compute, data-loading and
checkpoint spans, which the calls are placed in. File names come from the ``FH``
records, the access pattern from the per-file ``io_file`` counters.

Rules. A call's ops are ``args.calls`` for an aggregated event, else 1; its bytes are
``args.ret`` where positive, for read and write calls only. A call's size is its bytes
per op; the size buckets are Darshan's (lower bounds inclusive: 100 bytes is in
100-1K), of the calls that moved bytes. A call is inside a
span when it starts within it (on the same process; for data loading and checkpoints,
also the same thread). I/O not overlapped with compute is the I/O time of calls that
start while no compute span of their process is open (for a DataLoader worker, of its
process or the training process it works for). All I/O of a DataLoader worker is
data-loading I/O.
"""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from ..reduce.busy import union_intervals
from ..reduce.io_tables import (CHECKPOINT, COMPUTE, KINDS, LOADER, MAX_BYTES, METADATA, OTHER, READ, SIZE_BUCKETS,
                                SYNC, WRITE, named_by_any_process)
from .context import Context
from .units import count_of

#: The per-file rows kept in the summary, most I/O time first.
MAX_FILES = 1000
#: Buckets of the I/O timeline.
TIMELINE_BUCKETS = 200
#: Shares beyond which a finding is said.
SMALL_FINDING, METADATA_FINDING, NOT_OVERLAPPED_FINDING = 0.5, 0.3, 0.5
#: The share of accesses that go back beyond which access is said to be random:
#: uniformly random access goes back about half the time (the rest jump forward).
RANDOM_FINDING = 0.25
#: The share of reads that are their file's first since its open beyond which small
#: reads are said to be small files.
SMALL_FILES_FINDING = 0.5


# --- the answers -----------------------------------------------------------------------------

#: The figures of a set of calls (any table with kind, ops, bytes and us): name -> (column
#: summed, kind of call or None for all); each per-file, per-rank and per-step row has them.
CALL_FIGURES = {
    "read_bytes": ("bytes", READ), "write_bytes": ("bytes", WRITE), "read_ops": ("ops", READ),
    "write_ops": ("ops", WRITE), "metadata_ops": ("ops", METADATA), "sync_ops": ("ops", SYNC),
    "other_ops": ("ops", OTHER), "ops": ("ops", None), "io_time_us": ("us", None),
    "read_time_us": ("us", READ), "write_time_us": ("us", WRITE), "metadata_time_us": ("us", METADATA),
    "sync_time_us": ("us", SYNC),
}


def _figure_exprs() -> list[pl.Expr]:
    return [(pl.col(column) if kind is None else pl.col(column).filter(pl.col("kind") == kind)).sum()
            .cast(pl.Int64).alias(name) for name, (column, kind) in CALL_FIGURES.items()]


def _figures(frame: pl.DataFrame) -> dict[str, Any]:
    """The figures of all of ``frame``'s calls."""
    return frame.select(_figure_exprs()).to_dicts()[0]


def answer(context: Context) -> dict[str, Any]:
    """Stage 1: the traced file I/O (read per process step)."""
    return {"io": io_answers(context.combined, context.process_steps)}


def io_answers(combined: Any, process_steps: pl.DataFrame) -> dict[str, Any]:
    """The I/O answers of combined aggregates ({} for a trace without I/O events);
    ``process_steps``: each process's steps (see ``model_steps``)."""
    totals: pl.DataFrame | None = combined.io_totals
    if totals is None or not totals.height:
        return {}
    calls: pl.DataFrame = combined.io_calls.with_columns((pl.col("end") - pl.col("ts")).alias("us"))
    resolution = combined.resolution
    out = _figures(totals)
    out.update(_rates(out), sizes=_sizes(totals, resolution.records), **_shares(totals, out))
    out["span_us"] = int(totals.get_column("last").max() - totals.get_column("first").min())
    workers = [i for i, p in enumerate(resolution.processes) if p.dataloader_worker]
    in_workers = calls.get_column("proc").is_in(workers)  # a DataLoader worker's call (not another child's)
    compute = _compute_cover(combined.io_cover, resolution)
    in_compute = _inside(calls, compute, ["proc"])
    not_overlapped = int(calls.filter(~in_compute).get_column("us").sum())
    out["not_overlapped_us"] = not_overlapped
    out["not_overlapped_share"] = _share(not_overlapped, out["io_time_us"])
    out["not_overlapped_in_workers_us"] = int(calls.filter(~in_compute & in_workers).get_column("us").sum())
    thread_cover = union_intervals(combined.io_cover, ["proc", "tid"])
    loader = _inside(calls, thread_cover.filter(pl.col("group") == LOADER), ["proc", "tid"])
    loader = loader | in_workers
    checkpoint = _inside(calls, thread_cover.filter(pl.col("group") == CHECKPOINT), ["proc", "tid"])
    out["loader"] = _figures(calls.filter(loader))
    out["checkpoint"] = _figures(calls.filter(checkpoint))
    out["access"] = _access(resolution.records)
    out["recorded"] = _recorded(resolution.records)
    out["recorded"]["cut_short"] = _cut_short(totals, resolution)
    out["files"], out["files_total"] = _files(totals, resolution.records)
    out["ranks"] = _ranks(totals, resolution)
    out["steps"] = _steps(calls, process_steps)
    out["timeline"] = _timeline(calls)
    out["findings"] = io_findings(out, has_compute=bool(compute.height))
    return out


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _rates(figures: dict[str, Any]) -> dict[str, Any]:
    """Bytes per second of I/O time: read, written, and both over all I/O time."""

    def rate(moved: int, us: int) -> float | None:
        return round(moved * 1e6 / us, 1) if us else None

    return {"read_bytes_per_s": rate(figures["read_bytes"], figures["read_time_us"]),
            "write_bytes_per_s": rate(figures["write_bytes"], figures["write_time_us"]),
            "bandwidth_bytes_per_s": rate(figures["read_bytes"] + figures["write_bytes"], figures["io_time_us"])}


def _sizes(totals: pl.DataFrame, records: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """Calls that moved bytes per size bucket, reads and writes apart: a process's from
    its per-file counters' histograms where it wrote them (exact), else from its events
    (an aggregated event's calls in the bucket of their mean size)."""
    out: dict[str, Any] = {"buckets": list(SIZE_BUCKETS)}
    counted = {proc for proc, record in records if record.get("name") == "io_file"}
    for kind in (READ, WRITE):
        counts = [0] * len(SIZE_BUCKETS)
        rows = (totals.filter((pl.col("kind") == kind) & (pl.col("bucket") >= 0) & ~pl.col("proc").is_in(counted))
                .group_by("bucket").agg(pl.col("ops").sum()))
        for bucket, ops in rows.iter_rows():
            counts[bucket] = int(ops)
        for proc, record in records:
            hist = record["args"].get(f"{KINDS[kind]}_hist") if record.get("name") == "io_file" else None
            if isinstance(hist, list) and len(hist) == len(SIZE_BUCKETS):
                counts = [n + (_integer(more) or 0) for n, more in zip(counts, hist)]
        out[KINDS[kind]] = counts
    return out


def _shares(totals: pl.DataFrame, figures: dict[str, Any]) -> dict[str, Any]:
    small = {kind: int(totals.filter((pl.col("kind") == kind) & pl.col("small")).get_column("us").sum())
             for kind in (READ, WRITE)}
    return {"small_read_time_us": small[READ], "small_read_share": _share(small[READ], figures["read_time_us"]),
            "small_write_share": _share(small[WRITE], figures["write_time_us"]),
            "metadata_share": _share(figures["metadata_time_us"], figures["io_time_us"])}


def _compute_cover(cover: pl.DataFrame, resolution: Any) -> pl.DataFrame:
    """proc, group, start, end: each process's compute time over all its threads, a
    DataLoader worker's with that of the process it works for."""
    compute = cover.filter(pl.col("group") == COMPUTE).select("proc", "group", "start", "end")
    lent = [compute.filter(pl.col("proc") == owner).with_columns(pl.lit(helper, pl.Int32).alias("proc"))
            for helper, owner in resolution.owners().items()]
    return union_intervals(pl.concat([compute, *lent], how="vertical"), ["proc"])


def _inside(calls: pl.DataFrame, cover: pl.DataFrame, by: list[str]) -> pl.Series:
    """Whether each call starts within one of the disjoint intervals of ``cover`` of
    its ``by`` (in the calls' order)."""
    if not calls.height or not cover.height:
        return pl.Series("inside", [False] * calls.height, dtype=pl.Boolean)
    placed = (calls.select(*by, "ts").with_row_index("_row").sort("ts")
              .join_asof(cover.select(*by, "start", "end").sort("start"), left_on="ts", right_on="start", by=by,
                         check_sortedness=False)
              .sort("_row"))
    return placed.select((pl.col("ts") < pl.col("end")).fill_null(False).alias("inside")).to_series()


def _integer(value: Any) -> int | None:
    """A count from a metadata record: a non-negative integer within ``MAX_BYTES``, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_BYTES else None


def _summed(records: list[tuple[int, dict[str, Any]]], name: str, keys: tuple[str, ...]) -> dict[str, int]:
    sums = dict.fromkeys(keys, 0)
    for _, record in records:
        if record.get("name") == name:
            for key in keys:
                sums[key] += _integer(record["args"].get(key)) or 0
    return sums


def _access(records: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """The access pattern from the per-file counters (``io_file`` records), as the
    tracer counts it: of the reads (writes) that moved bytes at a known offset after
    another such call since their file was opened (``after_first``: the tracer's
    ``placed_*``), those that start past the previous one's offset are sequential
    (``seq_*``), right at its end consecutive (``consec_*``); the others are random.
    Counters without ``placed_*`` (older traces) take every call that moved bytes
    but the first of its file. ``first_read_share``: of the reads that moved bytes,
    those that are no one's successor (a file's first since its open: a file read
    whole in one call has nothing else)."""
    sums = _summed(records, "io_file", ("read_ops", "write_ops", "seq_reads", "seq_writes", "consec_reads",
                                        "consec_writes"))
    after_first = sequential = reads = first_reads = 0
    for _, record in records:
        if record.get("name") == "io_file":
            args = record["args"]
            for kind in ("read", "write"):
                hist = args.get(f"{kind}_hist")
                moved = sum(_integer(n) or 0 for n in hist) if isinstance(hist, list) else 0
                placed = _integer(args.get(f"placed_{kind}s"))
                if placed is None:
                    placed = max(moved - 1, 0)
                after_first += placed
                sequential += min(_integer(args.get(f"seq_{kind}s")) or 0, placed)
                if kind == "read":
                    reads += moved
                    first_reads += max(moved - placed, 0)
    return {**sums, "after_first": after_first, "random_share": _share(after_first - sequential, after_first),
            "first_read_share": _share(first_reads, reads)}


def _recorded(records: list[tuple[int, dict[str, Any]]]) -> dict[str, int]:
    """What the interposer says it recorded (``io`` records): calls, events, calls
    folded into aggregated events, calls dropped."""
    return _summed(records, "io", ("calls", "events", "aggregated_calls", "dropped"))


def _cut_short(totals: pl.DataFrame, resolution: Any) -> int:
    """Processes with traced calls that ended without their last drain (killed): their
    last interval's calls (50 ms) and their counters never reached the trace. Such a
    process has no ``io`` record, and the trace says how it ended (DFTracer's, with no
    ``io`` record either, does not)."""
    counted = {proc for proc, record in resolution.records if record.get("name") == "io"}
    calling = set(totals.get_column("proc").unique().to_list())
    return sum(1 for proc in calling - counted if resolution.processes[proc].ended is not None)


def _files(totals: pl.DataFrame, records: list[tuple[int, dict[str, Any]]]) -> tuple[list[dict[str, Any]], int]:
    """Per file (by path; by hash where no ``FH`` record names it), most I/O time first."""
    named: dict[tuple[int, str], str] = {}
    for proc, record in records:
        args = record["args"]
        value = args.get("value")
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)  # DFTracer's hashes are numbers
        if record.get("name") == "FH" and isinstance(args.get("name"), str) and isinstance(value, str):
            named.setdefault((proc, value), args["name"])
        elif record.get("name") == "io_file" and isinstance(args.get("path"), str) \
                and isinstance(args.get("fhash"), str):  # the counters name their file too
            named.setdefault((proc, args["fhash"]), args["path"])
    paths = pl.DataFrame([(proc, fhash, path) for (proc, fhash), path in named.items()], orient="row",
                         schema={"proc": pl.Int32, "fhash": pl.String, "path": pl.String})
    rows = (named_by_any_process(totals.join(paths, on=["proc", "fhash"], how="left"), paths, "fhash")
            .with_columns(pl.when(pl.col("path").is_null()).then(pl.col("fhash")).alias("fhash"))
            .group_by("path", "fhash").agg(_figure_exprs())
            .sort(["io_time_us", "path", "fhash"], descending=[True, False, False], nulls_last=True))
    return rows.head(MAX_FILES).to_dicts(), rows.height


def rank_of_each(resolution: Any) -> list[int | None]:
    """Each process's rank; a DataLoader worker's is that of the process it works for."""
    owners = resolution.owners()
    return [p.rank if p.rank is not None or i not in owners else resolution.processes[owners[i]].rank
            for i, p in enumerate(resolution.processes)]


def _ranks(totals: pl.DataFrame, resolution: Any) -> list[dict[str, Any]]:
    ranks = pl.DataFrame({"proc": list(range(len(resolution.processes))), "rank": rank_of_each(resolution)},
                         schema={"proc": pl.Int32, "rank": pl.Int32})
    return (totals.join(ranks, on="proc", how="left").group_by("rank").agg(_figure_exprs())
            .sort("rank", nulls_last=True).to_dicts())


def _steps(calls: pl.DataFrame, process_steps: pl.DataFrame) -> list[dict[str, Any]]:
    """Per (epoch, step): the I/O of the calls that start within a process's step, all
    processes together."""
    steps = process_steps.filter(pl.col("step").is_not_null()).select("proc", "epoch", "step", "start", "end")
    if not calls.height or not steps.height:
        return []
    placed = (calls.sort("ts").join_asof(steps.sort("start"), left_on="ts", right_on="start", by="proc",
                                         check_sortedness=False)
              .filter(pl.col("ts") < pl.col("end_right")))
    return (placed.group_by("epoch", "step").agg(_figure_exprs())
            .sort(["epoch", "step"], nulls_last=True).to_dicts())


def _timeline(calls: pl.DataFrame) -> dict[str, Any]:
    """Bytes read and written in each of ``TIMELINE_BUCKETS`` equal stretches of time,
    each call's bytes in the stretch it starts in ({} without calls: a live view's
    partials let go of)."""
    if not calls.height:
        return {}
    start, end = calls.get_column("ts").min(), calls.get_column("end").max()
    bucket_us = max(1, math.ceil((end - start + 1) / TIMELINE_BUCKETS))
    counts = {}
    for kind in (READ, WRITE):
        rows = (calls.filter(pl.col("kind") == kind)
                .group_by(((pl.col("ts") - start) // bucket_us).alias("at")).agg(pl.col("bytes").sum()))
        series = [0] * (int((end - start) // bucket_us) + 1)
        for at, moved in rows.iter_rows():
            series[at] += int(moved)
        counts[f"{KINDS[kind]}_bytes"] = series
    return {"start_us": int(start), "bucket_us": int(bucket_us), **counts}


def io_findings(io: dict[str, Any], *, has_compute: bool) -> list[str]:
    """What the I/O figures say, in words (DFAnalyzer's kind of findings)."""
    lines = []

    def pct(share: float) -> str:
        return f"{share * 100:.0f} %"

    if (io["small_read_share"] or 0) > SMALL_FINDING:
        first = io["access"].get("first_read_share") or 0
        if first > SMALL_FILES_FINDING:  # one read a file: the files are small, not the reads
            lines.append(f"{pct(io['small_read_share'])} of read time is in reads under 64 KiB, and "
                         f"{pct(first)} of reads are the first of their file since its open (files read whole): "
                         "the files are small; pack them into larger ones (tar shards, WebDataset, HDF5, "
                         "Arrow) read in large blocks")
        else:
            lines.append(f"{pct(io['small_read_share'])} of read time is in reads under 64 KiB: batch them "
                         "or read larger blocks")
    if (io["metadata_share"] or 0) > METADATA_FINDING:
        lines.append(f"metadata is {pct(io['metadata_share'])} of I/O time (open, stat, close, seek ...): "
                     "open files once, keep listings")
    if has_compute and (io["not_overlapped_share"] or 0) > NOT_OVERLAPPED_FINDING:
        in_workers = _share(io.get("not_overlapped_in_workers_us") or 0, io["not_overlapped_us"]) or 0
        if in_workers > NOT_OVERLAPPED_FINDING:  # read where it should be: the reading is what waits
            lines.append(f"I/O not overlapped with compute is {pct(io['not_overlapped_share'])} of I/O time, "
                         f"{pct(in_workers)} of it in DataLoader workers: the training process computes "
                         "nothing while they read; if its steps wait for data, use more workers, a larger "
                         "prefetch_factor or faster storage")
        else:
            lines.append(f"I/O not overlapped with compute is {pct(io['not_overlapped_share'])} of I/O time: "
                         "prefetch, or read in DataLoader workers")
    if (io["access"]["random_share"] or 0) > RANDOM_FINDING:
        lines.append(f"{pct(io['access']['random_share'])} of reads and writes go back (start before the end of "
                     "the one before): the access is random (uniformly random access goes back about half the "
                     "time); read in order, or larger blocks")
    if io.get("other_ops"):
        lines.append(f"{count_of(io['other_ops'], 'mmap call')} mapped files into memory: what is read or "
                     "written through a mapping is page faults, which no call shows, and is not in these figures")
    cut_short = io["recorded"].get("cut_short")
    if cut_short:
        lines.append(f"{count_of(cut_short, 'process', 'processes')} ended (killed) before the last drain of "
                     "the I/O calls: up to 50 ms of calls each, and the per-file counters, are not in the trace, "
                     "so the figures count less than was done")
    if io["recorded"]["dropped"]:
        lines.append(f"{io['recorded']['dropped']} I/O calls were dropped by the tracer: the figures count less "
                     "than was done")
    return lines


def io_rates(io: dict[str, Any]) -> dict[str, Any] | None:
    """Bytes read and written per second of the time the I/O spans (for a live view);
    None without I/O."""
    if not io:
        return None
    seconds = io["span_us"] / 1e6
    return {"read_bytes": io["read_bytes"], "write_bytes": io["write_bytes"],
            "read_bytes_per_s": round(io["read_bytes"] / seconds, 1) if seconds else None,
            "write_bytes_per_s": round(io["write_bytes"] / seconds, 1) if seconds else None}
