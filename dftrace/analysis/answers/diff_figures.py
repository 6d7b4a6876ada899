"""The figures two runs are compared on, each read from both runs' summaries: steps,
epochs, categories, the time breakdown, the data loader, stragglers, the GPU and
file I/O, with the time each figure's change is scaled by for its impact."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any


from ... import format as fmt
from .summary import Summary

# How a row's values read: microseconds, a count, a share of a whole, a plain ratio,
# bytes per second.
US, COUNT, BYTES, SHARE, RATIO, RATE = "us", "count", "bytes", "share", "ratio", "bytes/s"


@dataclass
class Figure:
    metric: str
    section: str
    unit: str
    base: float | None
    new: float | None
    #: The figure's time in each run, to divide by rank-steps for the impact
    #: (None: the change itself is per step; omitted: no impact).
    time: tuple[float | None, float | None] | None = (0, 0)
    note: str = ""
    #: (standard deviation, count) of the values a mean is taken over, in each run:
    #: the mean's own noise when there is one run per side.
    spread: tuple[tuple[float | None, int], tuple[float | None, int]] | None = None


def figures_of(base: Summary, new: Summary) -> Iterator[Figure]:
    b, n = base.step_stats, new.step_stats
    for q in ("p50", "p95", "mean"):
        yield Figure(f"step.{q}", "steps", US, b.get(f"{q}_us"), n.get(f"{q}_us"), time=None)
    units = (_units(base), _units(new))
    per_rank = units[0] != units[1]
    note = "per rank" if per_rank else ""
    yield Figure("step.count", "steps", COUNT, *_scaled((b.get("count"), n.get("count")), units, per_rank),
                  note=note)
    epoch_b, epoch_n = _epoch_time(base), _epoch_time(new)
    if epoch_b is not None or epoch_n is not None:
        yield Figure("epoch.time", "epochs", US, epoch_b, epoch_n,
                      note="mean over epochs of the slowest rank's epoch time")
    yield from _category_figures(base, new)
    yield from _breakdown_figures(base, new)
    yield from _dataloader_figures(base, new)
    yield from _straggler_figures(base, new)
    yield from _gpu_figures(base, new)
    yield from _io_figures(base, new)
    for key, label in (("events", "events"), ("dropped_events", "dropped")):
        values = _scaled((base.overview.get(key), new.overview.get(key)), units, per_rank)
        yield Figure(f"events.{label}", "events", COUNT, *values, note=note)


def _category_figures(base: Summary, new: Summary) -> Iterator[Figure]:
    """count, total, mean, p95 of each (category, name). Runs with different numbers of
    ranks compare counts and totals per rank."""
    units = (_units(base), _units(new))
    per_rank = units[0] != units[1]
    rows_b = {(r["cat"], r["name"]): r for r in base.categories}
    rows_n = {(r["cat"], r["name"]): r for r in new.categories}
    note = "per rank" if per_rank else ""
    for key in [*rows_b, *(k for k in rows_n if k not in rows_b)]:
        rb, rn = rows_b.get(key, {}), rows_n.get(key, {})
        # Containers (pipeline spans, loop bodies) hold the others' time: no impact of their own.
        container = key[0] == fmt.CAT_PIPELINE or key[1].endswith(fmt.LOOP_BODY_SUFFIXES)
        time = (0, 0) if container else (rb.get("total_us", 0), rn.get("total_us", 0))
        name = f"{key[0]}.{key[1]}"
        count = [rb.get("count", 0), rn.get("count", 0)]
        total = [rb.get("total_us"), rn.get("total_us")]
        count, total = _scaled(count, units, per_rank), _scaled(total, units, per_rank)
        yield Figure(f"{name}.count", "categories", COUNT, *count, time=time, note=note)
        yield Figure(f"{name}.total", "categories", US, *total, time=time, note=note)
        moments = ((rb.get("std_us"), rb.get("count", 0)), (rn.get("std_us"), rn.get("count", 0)))
        yield Figure(f"{name}.mean", "categories", US, rb.get("mean_us"), rn.get("mean_us"), time=time,
                      spread=moments)
        yield Figure(f"{name}.p95", "categories", US, rb.get("p95_us"), rn.get("p95_us"), time=time)


def _units(summary: Summary) -> int:
    """What figures are per rank of: ranks, else the processes that are not another's
    workers (the DataLoader workers of one process and multiprocessing's helpers do not
    make a run of one process a run of several)."""
    return (summary.overview.get("ranks") or sum(not p.get("worker") for p in summary.processes)
            or summary.overview.get("processes") or 1)


def _scaled(values: Sequence[float | None], units: tuple[int, int], per_rank: bool) -> list[float | None]:
    """BASE's and NEW's values, per rank when the runs have different numbers of ranks."""
    if not per_rank:
        return list(values)
    return [None if v is None else round(v / u, 3) for v, u in zip(values, units)]


def _breakdown_figures(base: Summary, new: Summary) -> Iterator[Figure]:
    groups_b = {g["group"]: g for g in base.breakdown.get("groups", [])}
    groups_n = {g["group"]: g for g in new.breakdown.get("groups", [])}
    for group in [*groups_b, *(g for g in groups_n if g not in groups_b)]:
        gb, gn = groups_b.get(group, {}), groups_n.get(group, {})
        if not gb.get("busy_us") and not gn.get("busy_us"):
            continue
        yield Figure(f"breakdown.{group}", "breakdown", SHARE, gb.get("share_of_wall"), gn.get("share_of_wall"),
                      time=(gb.get("busy_us", 0), gn.get("busy_us", 0)), note="share of process time")
    if base.breakdown.get("wall_us") or new.breakdown.get("wall_us"):
        yield Figure("breakdown.idle", "breakdown", SHARE, base.breakdown.get("idle_share"),
                      new.breakdown.get("idle_share"),
                      time=(base.breakdown.get("idle_us", 0), new.breakdown.get("idle_us", 0)),
                      note="share of process time")


def _dataloader_figures(base: Summary, new: Summary) -> Iterator[Figure]:
    loaders_b = {(d["cat"], d["loader"]): d for d in base.dataloader}
    loaders_n = {(d["cat"], d["loader"]): d for d in new.dataloader}
    for key in [*loaders_b, *(k for k in loaders_n if k not in loaders_b)]:
        db, dn = loaders_b.get(key, {}), loaders_n.get(key, {})
        yield Figure(f"stall.{key[0]}.{key[1]}", "dataloader", SHARE, db.get("stall"), dn.get("stall"),
                      time=(db.get("iter_us", 0), dn.get("iter_us", 0)),
                      note="share of the loop spent waiting for the next item")


def _straggler_figures(base: Summary, new: Summary) -> Iterator[Figure]:
    worst_b, worst_n = _worst(base), _worst(new)
    if worst_b or worst_n:
        note = f"{worst_b.get('unit', '-')} -> {worst_n.get('unit', '-')}"
        yield Figure("straggler.wait_per_step", "stragglers", US, worst_b.get("caused_wait_us_per_step"),
                      worst_n.get("caused_wait_us_per_step"), time=None,
                      note=f"wait the worst rank caused per step ({note})")
    ratio_b, ratio_n = base.imbalance.get("mean_ratio"), new.imbalance.get("mean_ratio")
    if ratio_b is not None or ratio_n is not None:
        slow_b, slow_n = _slowest_rank(base), _slowest_rank(new)
        yield Figure("straggler.imbalance", "stragglers", RATIO, ratio_b, ratio_n,
                      note=f"mean slowest/median rank step time (slowest most often: {slow_b} -> {slow_n})")


def _gpu_figures(base: Summary, new: Summary) -> Iterator[Figure]:
    """GPU idle, compute, non-compute and overlap shares, averaged over ranks and devices."""
    if not base.gpu and not new.gpu:
        return
    for key in ("idle", "compute", "non_compute", "comm_compute_overlap"):
        means = [_mean_share([g[f"{key}_pct"] for g in summary.gpu]) for summary in (base, new)]
        yield Figure(f"gpu.{key}", "gpu", SHARE, *means,
                      note="mean over ranks and devices" + (" of kernel time" if key != "comm_compute_overlap"
                                                            else " of communication time"))
    if base.gpu_steps or new.gpu_steps:
        busy = [_mean_share([s["gpu_busy_pct"] for s in summary.gpu_steps]) for summary in (base, new)]
        yield Figure("gpu.step_busy", "gpu", SHARE, *busy, note="mean over rank-steps of the GPU's busy share")
        waits = [sum(s["sync_wait_us"] for s in summary.gpu_steps) / len(summary.gpu_steps) if summary.gpu_steps
                 else None for summary in (base, new)]
        yield Figure("gpu.step_sync_wait", "gpu", US, *waits, time=None,
                      note="host time per rank-step in calls waiting for the GPU")


#: The I/O figures compared: key in ``Summary.io``, unit, note.
_IO_FIGURES = (
    ("read_bytes", BYTES, "bytes read"), ("write_bytes", BYTES, "bytes written"),
    ("read_ops", COUNT, "read calls"), ("write_ops", COUNT, "write calls"),
    ("metadata_ops", COUNT, "metadata calls (open, stat, close, seek ...)"),
    ("io_time_us", US, "time in traced file calls"),
    ("bandwidth_bytes_per_s", RATE, "bytes read and written per second of I/O time"),
    ("metadata_share", SHARE, "share of I/O time in metadata calls"),
    ("small_read_share", SHARE, "share of read time in reads under 64 KiB"),
    ("not_overlapped_share", SHARE, "share of I/O time with no compute span open"),
)


def _io_figures(base: Summary, new: Summary) -> Iterator[Figure]:
    """The traced file I/O of each run (see ``answers.io``), where either has any."""
    if not base.io and not new.io:
        return
    for key, unit, note in _IO_FIGURES:
        yield Figure(f"io.{key}", "io", unit, base.io.get(key), new.io.get(key), note=note)


def _mean_share(pcts: list[float | None]) -> float | None:
    known = [p for p in pcts if p is not None]
    return round(sum(known) / len(known) / 100, 4) if known else None


def _worst(summary: Summary) -> dict[str, Any]:
    return summary.stragglers[0] if summary.stragglers else {}


def _slowest_rank(summary: Summary) -> str:
    ranks = summary.imbalance.get("ranks") or []
    if not ranks:
        return "-"
    return max(ranks, key=lambda r: (r["slowest_count"], r["mean_us"]))["rank"]


def _epoch_time(summary: Summary) -> float | None:
    times = [e["max_us"] for e in summary.epochs if e.get("max_us") is not None]
    return round(sum(times) / len(times), 3) if times else None


def per_rank_step(summary: Summary) -> int:
    """What a figure's time is divided by to be per step: rank-steps, else processes."""
    return summary.step_stats.get("count") or summary.overview.get("processes") or 1
