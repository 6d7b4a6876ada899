"""Rendering a :class:`Summary` as terminal tables."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..answers.summary import Summary
from ..answers.units import count_of, file_label, format_bytes, format_us
from .terminal import columns, one_line

#: How the breakdown names its activity groups.
GROUP_LABELS = {
    "compute": "compute",
    "data": "data loading",
    "comm": "communication",
    "checkpoint": "checkpoint",
    "device": "device transfer",
}


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.1f}%"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[bool]) -> list[str]:
    # Each cell on one line and escaped before it is measured: a name's tab or line
    # break neither breaks the row nor its width.
    cells = [[str(c) for c in headers]] + [[one_line(str(c)) for c in row] for row in rows]
    widths = [max(columns(r[i]) for r in cells) for i in range(len(headers))]
    out = []
    for n, row in enumerate(cells):
        parts = [" " * (w - columns(c)) + c if r else c + " " * (w - columns(c)) for c, w, r in zip(row, widths, right)]
        out.append("  " + "  ".join(parts).rstrip())
        if n == 0:
            out.append("  " + "  ".join("-" * w for w in widths))
    return out


def render_text(summary: Summary, *, top: int = 20) -> str:
    """The summary as text: overview, categories, epochs, steps, breakdown, loaders, file
    I/O, ranks.

    ``top`` limits the longest tables (names, steps, ranks) to their first rows.
    """
    sections = [
        _overview(summary) + [f"  {line}" for line in findings(summary)],
        _runs(summary),
        _broken(summary),
        _categories(summary, top),
        _epochs(summary),
        _steps(summary, top),
        _breakdown(summary),
        _dataloader(summary),
        io_text(summary.io, top),
        _stragglers(summary, top),
        _imbalance(summary, top),
        _gpu(summary, top),
    ]
    return "\n\n".join("\n".join(s) for s in sections if s) + "\n"


def _overview(summary: Summary) -> list[str]:
    o = summary.overview
    ranks = count_of(o["ranks"], "rank") if o["ranks"] else "no ranks"
    processes = count_of(o["processes"], "process", "processes")
    lines = [
        f"dftrace summary: {count_of(o['files'], 'file')}, {processes} ({ranks} on "
        f"{count_of(o['hosts'], 'host')}), {count_of(o['events'], 'event')} over {format_us(o['wall_us'])}",
        f"  broken lines {o['broken_lines']} · cut-off files {o['cut_off_files']} · unfinished "
        f"files {o['unfinished_files']} · incomplete spans {o['incomplete_spans']} · dropped "
        f"events {o['dropped_events']}",
    ]
    cpu_only = o.get("profiler_files_without_gpu")
    if cpu_only:
        lines.append(f"  {count_of(cpu_only, 'PyTorch profiler trace')} with no GPU activity (profiled "
                     "without CUDA: no GPU device, or activities without CUDA): no GPU answers")
    others = {k: v for k, v in o["events_by_phase"].items() if k != "X"}
    if others:
        lines.append("  besides spans: " + ", ".join(f"{v} '{k}' events" for k, v in others.items()))
    return lines


def findings(summary: Summary) -> list[str]:
    """The first things to know, in words: processes that ended abnormally, separate
    runs, the straggler."""
    lines = []
    ended = [p for p in summary.processes if p.get("ended")]
    if ended:
        lines.append("ended abnormally: " + "; ".join(f"{p['label']} {p['ended']}" for p in ended[:4])
                     + (f"; {len(ended) - 4} more" if len(ended) > 4 else ""))
    lines.extend(resumed_lines(summary.runs))
    separate = sum(not r.get("resumed") for r in summary.runs)
    if separate > 1:
        lines.append(f"these files are from {separate} separate runs, not one: "
                     "each run's steps are timed from its own start (see Runs)")
    for step in summary.overview.get("clock_steps", []):
        lines.append(f"the wall clock of {step['host']} was stepped by {step['step_us'] / 1e6:+.1f} s "
                     f"before pid {step['pid']} started: its times are that far off its parent's, "
                     "and it is read as of its parent's run")
    lines.extend(straggler_lines(summary))
    return lines


def straggler_lines(summary: Summary) -> list[str]:
    """"rank 1 held the others back in 16 of 64 steps, 6.20 ms per step", "no rank
    stands out: ...", or nothing for a single rank."""
    if not summary.stragglers:
        return []
    worst = summary.stragglers[0]
    stats = summary.collectives
    if not worst.get("significant"):
        median = stats.get("median_skew_us")
        return [f"no rank stands out: arrival skew within noise, median {format_us(median)}"
                + (f" ({stats['held_steps']} of {stats['steps']} steps above noise, spread among the ranks)"
                   if stats.get("held_steps") else "")]
    per_step = worst["caused_wait_us_per_step"]
    # The unit's own steps: a resumed job's run holds only those it ran.
    steps = worst.get("steps") or stats["steps"]
    line = (f"{worst['unit']} held the others back in {worst['held_steps']} of {steps} steps, "
            f"{format_us(per_step)} per step")
    others = [r["compute_us_per_step"] for r in summary.stragglers[1:] if r["compute_us_per_step"] is not None]
    if worst.get("pattern") == "most steps":
        detail = (f"last in {worst['last_steps']} of {steps} steps, median lead "
                  f"{format_us(worst['median_lead_us'])}")
    else:
        noise, beyond = worst.get("noise_us"), worst.get("beyond_us")
        if noise is None or beyond is None or beyond >= 5 * noise:
            detail = f"each beyond 5x its step-to-step noise of {format_us(noise)}"
        else:
            detail = f"each beyond {format_us(beyond)}: the run's usual lead of the last rank plus 5x its spread"
    detail += f"; last to arrive in {worst['last_arrivals']} of {stats.get('matched', 0)} collectives"
    if others and worst["compute_us_per_step"] is not None:
        median = sorted(others)[(len(others) - 1) // 2]
        detail += (f"; its compute {format_us(worst['compute_us_per_step'])} per step vs "
                   f"{format_us(median)} on the other ranks")
    return [line, f"  {detail}"]


def resumed_lines(runs: list[dict[str, Any]]) -> list[str]:
    """"rank 0 ran twice (resumed at step 32)" for each rank a job started again."""
    times: dict[int, int] = {}
    for r in runs:
        for rank in r["ranks"]:
            times[rank] = times.get(rank, 0) + 1
    lines = []
    for r in runs:
        if not r.get("resumed"):
            continue
        at = r.get("resumed_at") or {}
        where = f"step {at['step']}" if at.get("step") is not None else "its start"
        again = [rank for rank in r["ranks"] if times.get(rank, 0) > 1]
        if not r["ranks"]:  # a script with no rank, run again by the same command
            lines.append(f"the script ran again (resumed at {where}): each step is timed in the run that ran it, "
                         "a step run again counted each time")
            continue
        if not again:
            continue
        count = times[again[0]]
        said = "twice" if count == 2 else f"{count} times"
        who = f"rank {again[0]}" if len(again) == 1 else f"ranks {_span_list(again)}"
        lines.append(f"{who} ran {said} (resumed at {where}): each step is timed in the run that ran it, "
                     "a step run again counted each time")
    return lines


def _span_list(ranks: list[int]) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2 \
        else ", ".join(map(str, ranks))


def _runs(summary: Summary) -> list[str]:
    if not summary.runs:
        return []
    rows = [
        (i + 1, len(r["procs"]), ", ".join(map(str, r["ranks"])) or "-", ", ".join(r["hosts"]) or "-",
         format_us(r["wall_us"]), _resumed_at(r), (r["commands"][0][:60] if r["commands"] else "-"))
        for i, r in enumerate(summary.runs)
    ]
    return ["Runs (a job started again, or processes far apart in time: analyse separate runs' files "
            "on their own)"] + _table(
        ("run", "processes", "ranks", "hosts", "wall time", "resumed at", "command"), rows,
        (True, True, False, False, True, False, False),
    )


def _resumed_at(run: dict[str, Any]) -> str:
    if not run.get("resumed"):
        return "-"
    at = run.get("resumed_at") or {}
    if at.get("step") is None:
        return "start"
    return f"epoch {at['epoch']} step {at['step']}" if at.get("epoch") is not None else f"step {at['step']}"


def _broken(summary: Summary) -> list[str]:
    damaged = [f for f in summary.files if f["broken_count"] or f["cut_off"]]
    skipped = summary.overview.get("skipped_files") or []
    lines = []
    if skipped:
        names = ", ".join(os.path.basename(p) for p in skipped[:5]) + (" ..." if len(skipped) > 5 else "")
        lines = [f"Skipped {count_of(len(skipped), 'file')} that {'holds' if len(skipped) == 1 else 'hold'} "
                 f"no trace events: {names}"]
    copies = summary.overview.get("duplicate_files") or []
    if copies:
        lines.append(copies_left_out(copies))
    if not damaged:
        return lines
    lines.append("Damaged files")
    for f in damaged:
        lines.append(f"  {os.path.basename(f['path'])}: {count_of(f['broken_count'], 'broken line')}")
        shown = f["broken"][:3]
        lines.extend(f"    line {b['line']}: {b['reason']}" for b in shown)
        if f["cut_off"] and all(b["reason"] != f["cut_off"] for b in shown):  # said once
            lines.append(f"    {f['cut_off']}")
    return lines


def _categories(summary: Summary, top: int) -> list[str]:
    if not summary.categories:
        return ["No spans found."]
    rows = [
        (r["cat"], r["name"], r["count"], format_us(r["total_us"]), format_us(r["mean_us"]),
         format_us(r["p50_us"]), format_us(r["p95_us"]), format_us(r["max_us"]))
        for r in summary.categories[: max(top, 1)]
    ]
    more = len(summary.categories) - len(rows)
    lines = ["Time per category and name"]
    lines += _table(("cat", "name", "count", "total", "mean", "p50", "p95", "max"), rows,
                    (False, False, True, True, True, True, True, True))
    if more > 0:
        lines.append(f"  ... {more} more (--rows, or --json for all)")
    return lines


def _epochs(summary: Summary) -> list[str]:
    if not summary.epochs:
        return []
    rows = [
        (e["epoch"], e["ranks"], e["steps"], format_us(e["max_us"]), e["slowest"], format_us(e["median_us"]))
        for e in summary.epochs
    ]
    return ["Epochs"] + _table(
        ("epoch", "ranks", "steps", "time (slowest rank)", "slowest", "median rank"), rows,
        (True, True, True, True, False, True),
    )


def _steps(summary: Summary, top: int) -> list[str]:
    stats = summary.step_stats
    if not stats:
        return []
    lines = [
        f"Steps: {summary.step_count()} steps, {stats['count']} rank-steps",
        f"  step time: mean {format_us(stats['mean_us'])} · p50 {format_us(stats['p50_us'])} · "
        f"p95 {format_us(stats['p95_us'])} · max {format_us(stats['max_us'])}",
    ]
    slowest = sorted(summary.steps, key=lambda s: s["max_us"], reverse=True)[: min(top, 5)]
    rows = [
        ("-" if s["epoch"] is None else s["epoch"], s["step"], s["ranks"], format_us(s["median_us"]),
         format_us(s["max_us"]), s["slowest"])
        for s in slowest
    ]
    lines.append("  longest steps:")
    lines += _table(("epoch", "step", "ranks", "median", "max", "slowest"), rows,
                    (True, True, True, True, True, False))
    return lines


def _breakdown(summary: Summary) -> list[str]:
    b = summary.breakdown
    if not b["wall_us"]:
        return []
    n = len(b["processes"])
    rows = [
        (GROUP_LABELS.get(g["group"], g["group"]), format_us(g["busy_us"]), _pct(g["share_of_wall"]),
         format_us(g["exclusive_us"]), format_us(g["overlapped_us"]), _pct(g["overlap_share"]))
        for g in b["groups"]
        if g["busy_us"]
    ]
    rows.append(("idle / other", format_us(b["idle_us"]), _pct(b["idle_share"]), "", "", ""))
    lines = [f"Time breakdown (each thread's time to its innermost span, threads swept together; "
             f"{count_of(n, 'process', 'processes')}, {format_us(b['wall_us'])} of process time)"]
    lines += _table(("activity", "busy", "% of time", "exclusive", "overlapped", "overlap %"), rows,
                    (False, True, True, True, True, True))
    pairs = [
        f"{GROUP_LABELS.get(p['a'], p['a'])} + {GROUP_LABELS.get(p['b'], p['b'])} {format_us(p['overlap_us'])}"
        for p in sorted(b["pairs"], key=lambda p: p["overlap_us"], reverse=True)
    ]
    if pairs:
        lines.append("  overlapping: " + " · ".join(pairs))
    return lines


def _dataloader(summary: Summary) -> list[str]:
    if not summary.dataloader:
        return []
    rows = []
    for d in summary.dataloader:
        worst = d["ranks"][0] if d["ranks"] else None
        rows.append(
            (f"{d['cat']}/{d['loader']}", d["items"], format_us(d["iter_us"]), format_us(d["iter_p95_us"]),
             format_us(d["block_us"]), _pct(d["stall"]),
             f"{worst['rank']} ({_pct(worst['stall'])})" if worst else "-")
        )
    return ["Data-loader stall (waiting for the next item in .iter vs using it in .block)"] + _table(
        ("loader", "items", "waiting", "p95 wait", "using", "stall", "worst rank"), rows,
        (False, True, True, True, True, True, False),
    )


def _stragglers(summary: Summary, top: int) -> list[str]:
    if not summary.stragglers:
        return []
    stats = summary.collectives
    lines = [f"Stragglers (blocked time per step compared across ranks: a step is held back by its last rank "
             f"when its lead is beyond 5x its noise (or 5 spreads past the run's usual lead of the last "
             f"rank), or, for a rank last in most steps, beyond 2% of the "
             f"step; {stats.get('matched', 0)} collectives matched)"]
    rows = [
        (r["unit"], r["host"] or "-", r["last_arrivals"], format_us(r["caused_wait_us"]),
         format_us(r["caused_wait_us_per_step"]), r["held_steps"], format_us(r.get("noise_us")),
         "yes" if r.get("significant") else "no", format_us(r["compute_us_per_step"]))
        for r in summary.stragglers[:top]
    ]
    lines += _table(("rank", "host", "last to arrive", "wait caused", "per step", "held back steps",
                     "noise", "stands out", "compute per step"), rows,
                    (False, False, True, True, True, True, True, False, True))
    if len(summary.stragglers) > len(rows):
        lines.append(f"  ... {len(summary.stragglers) - len(rows)} more ranks (--rows, or --json)")
    return lines


def _imbalance(summary: Summary, top: int) -> list[str]:
    imb = summary.imbalance
    if not imb["ranks"] or summary.stragglers:  # collectives tell more than step times
        return []
    lines = ["Rank imbalance (slowest vs median rank per step; no collectives matched across ranks)"]
    if imb["steps_compared"]:
        worst = imb["worst"][0] if imb["worst"] else None
        where = (f" (epoch {worst['epoch']} step {worst['step']}, {worst['slowest']})" if worst else "")
        lines.append(
            f"  {imb['steps_compared']} steps compared · mean max/median {imb['mean_ratio']:.2f} · "
            f"worst {imb['max_ratio']:.2f}{where}"
        )
    ranks = sorted(imb["ranks"], key=lambda r: r["mean_us"], reverse=True)[:top]
    rows = [
        (r["rank"], r["steps"], format_us(r["mean_us"]), format_us(r["p50_us"]), format_us(r["max_us"]),
         r["slowest_count"])
        for r in ranks
    ]
    lines += _table(("rank", "steps", "mean step", "p50", "max", "slowest in"), rows,
                    (False, True, True, True, True, True))
    if len(imb["ranks"]) > len(ranks):
        lines.append(f"  ... {len(imb['ranks']) - len(ranks)} more ranks (--rows, or --json)")
    return lines


def _gpu(summary: Summary, top: int) -> list[str]:
    """Per rank and device of PyTorch profiler traces: GPU time split, overlap, idle causes, top kernels."""
    if not summary.gpu:
        return []
    lines = ["GPU (PyTorch profiler traces; HTA's definitions: % of the time from the first kernel's "
             "start to the last one's end)"]
    rows = []
    for g in summary.gpu[:top]:
        causes = g["idle_by_cause"]
        rows.append((
            "-" if g["rank"] is None else g["rank"], g["device"], g["kernels"], format_us(g["kernel_us"]),
            f"{g['idle_pct']:.2f}%", f"{g['compute_pct']:.2f}%", f"{g['non_compute_pct']:.2f}%",
            "-" if g["comm_compute_overlap_pct"] is None else f"{g['comm_compute_overlap_pct']:.2f}%",
            " / ".join("-" if causes[f"{c}_pct"] is None else f"{causes[f'{c}_pct']:.0f}%"
                       for c in ("host_wait", "kernel_wait", "other")),
        ))
    lines += _table(("rank", "device", "kernels", "kernel time", "idle", "compute", "non-compute",
                     "comm overlap", "idle: host/kernel/other wait"), rows, (True,) * 8 + (False,))
    if len(summary.gpu) > top:
        lines.append(f"  ... {len(summary.gpu) - top} more devices (--rows, or --json)")
    first = summary.gpu[0]
    if first["top_kernels"]:
        lines.append(f"  top kernels (rank {first['rank']}, device {first['device']}):")
        lines += _table(("kernel", "type", "count", "total", "mean"),
                        [(_short(k["name"]), k["type"], k["count"], format_us(k["total_us"]), format_us(k["mean_us"]))
                         for k in first["top_kernels"][:5]], (False, False, True, True, True))
    if summary.gpu_steps:
        lines.append("  per step the profiler recorded (recorded: its share of the step; GPU busy and compute: "
                     "of the recorded part; kernels launched in the step, GPU time of those kernels; sync wait: "
                     "host time in calls waiting for the GPU):")
        rows = [("-" if s["rank"] is None else s["rank"], "-" if s["epoch"] is None else s["epoch"], s["step"],
                 format_us(s["dur_us"]), _share(s["profiled_pct"]), _share(s["gpu_busy_pct"]),
                 _share(s["gpu_compute_pct"]), s["kernels_launched"], format_us(s["kernel_us_launched"]),
                 format_us(s["sync_wait_us"]))
                for s in summary.gpu_steps[:top]]
        lines += _table(("rank", "epoch", "step", "step time", "recorded", "GPU busy", "GPU compute", "kernels",
                         "GPU time", "sync wait"), rows, (True,) * 10)
        if len(summary.gpu_steps) > top:
            lines.append(f"  ... {len(summary.gpu_steps) - top} more steps (--rows, or --json)")
    if summary.gpu_spans:
        lines.append("  GPU time by span (kernels whose launch call started inside the span, on its thread):")
        lines += _table(("cat", "name", "spans", "kernels", "GPU time"),
                        [(s["cat"], _short(s["name"]), s["spans"], s["kernels"], format_us(s["kernel_us"]))
                         for s in summary.gpu_spans[:top]], (False, False, True, True, True))
    return lines


def _share(pct: float | None) -> str:
    return "-" if pct is None else f"{pct:.1f}%"


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def io_text(io: dict[str, Any], top: int) -> list[str]:
    """The summary's I/O section as lines ([] without I/O)."""
    if not io:
        return []
    def rate(value: float | None) -> str:
        return "-" if value is None else f"{format_bytes(value)}/s"

    lines = [
        "I/O (traced file calls: POSIX and STDIO)",
        f"  read {format_bytes(io['read_bytes'])} in {io['read_ops']} calls ({rate(io['read_bytes_per_s'])}), "
        f"wrote {format_bytes(io['write_bytes'])} in {io['write_ops']} calls ({rate(io['write_bytes_per_s'])}); "
        f"{io['metadata_ops']} metadata, {io['sync_ops']} sync"
        + (f", {io['other_ops']} mmap" if io.get("other_ops") else "") + " calls",
        f"  I/O time {format_us(io['io_time_us'])} ({rate(io['bandwidth_bytes_per_s'])} over all of it) · "
        f"metadata {_pct(io['metadata_share'])} · reads under 64 KiB {_pct(io['small_read_share'])} of read time "
        f"· not overlapped with compute {_pct(io['not_overlapped_share'])} · random access "
        f"{_pct(io['access']['random_share'])}",
    ]
    for part, label in (("loader", "data loading"), ("checkpoint", "checkpoints")):
        f = io[part]
        if f["ops"]:
            lines.append(f"  in {label}: read {format_bytes(f['read_bytes'])}, wrote {format_bytes(f['write_bytes'])}, "
                         f"{f['ops']} calls, {format_us(f['io_time_us'])}")
    lines += [f"  {line}" for line in io["findings"]]
    sizes = io["sizes"]
    lines.append("  calls that moved bytes, by size (end-of-file reads and failed calls left out):")
    lines += _table(("", *sizes["buckets"]), [("reads", *sizes["read"]), ("writes", *sizes["write"])],
                    (False, *[True] * len(sizes["buckets"])))

    def figures(f: dict[str, Any]) -> tuple[str, ...]:
        return (format_bytes(f["read_bytes"]), format_bytes(f["write_bytes"]), str(f["ops"]),
                str(f["metadata_ops"]), format_us(f["io_time_us"]))

    headers = ("read", "written", "calls", "metadata", "I/O time")
    lines.append(f"  files by I/O time ({io['files_total']} files):")
    lines += _table(("file", *headers), [(_short_path(file_label(f)), *figures(f)) for f in io["files"][:top]],
                    (False, *[True] * 5))
    if len(io["ranks"]) > 1:
        lines.append("  per rank:")
        lines += _table(("rank", *headers), [("-" if r["rank"] is None else r["rank"], *figures(r))
                                             for r in io["ranks"][:top]], (False, *[True] * 5))
    if io["steps"]:
        busiest = sorted(io["steps"], key=lambda s: -s["io_time_us"])[:top]
        lines.append(f"  steps with the most I/O time ({len(io['steps'])} steps with I/O):")
        lines += _table(("epoch", "step", *headers), [(s["epoch"], s["step"], *figures(s)) for s in busiest],
                        (True, True, *[True] * 5))
    return lines


def _short_path(path: str, width: int = 60) -> str:
    path = one_line(path)
    return path if len(path) <= width else "..." + path[-(width - 3):]


def copies_left_out(copies: list[dict[str, str]]) -> str:
    """The sentence on the files left out as copies of others (``duplicate_files``)."""
    names = ", ".join(f"{os.path.basename(c['path'])} (as {os.path.basename(c['same_as'])})" for c in copies[:5])
    return (f"Left out {count_of(len(copies), 'file')} holding the same events as another: {names}"
            + (" ..." if len(copies) > 5 else ""))
