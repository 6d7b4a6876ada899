"""Rendering a :class:`Summary` as one self-contained HTML report (plotly, offline).

plotly.js is embedded once in the page, so the file opens without a network.
"""

from __future__ import annotations

import html
import os
from collections.abc import Callable
from typing import Any

from ... import format as fmt
from ..runtime.deps import require
from ..answers.summary import Summary
from ..answers.units import file_label, format_bytes, format_us
from .text import GROUP_LABELS, findings

# One colour per activity group, reused across figures so they read together.
_GROUP_COLORS = {
    "compute": "#4C78A8",
    "data": "#F58518",
    "comm": "#54A24B",
    "checkpoint": "#B279A2",
    "device": "#72B7B2",
    "overlap": "#9D755D",
    "idle": "#D3D3D3",
}
_CONFIG = {"displaylogo": False, "responsive": True}

_STYLE = """
body { font-family: system-ui, -apple-system, Segoe UI, Roboto, sans-serif; margin: 2rem auto;
       max-width: 1200px; color: #222; padding: 0 1rem; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; }
h2 { font-size: 1.2rem; margin-top: 2.2rem; border-bottom: 1px solid #ddd; padding-bottom: .3rem; }
.sub { color: #666; margin-top: 0; }
.cards { display: flex; flex-wrap: wrap; gap: .8rem; margin: 1rem 0; }
.card { background: #f6f7f9; border-radius: 6px; padding: .6rem .9rem; min-width: 8rem; }
.card b { display: block; font-size: 1.2rem; }
.card span { color: #666; font-size: .85rem; }
.note { color: #666; font-size: .9rem; }
.finding { font-size: 1.05rem; margin: .3rem 0; }
table { border-collapse: collapse; font-size: .9rem; }
td, th { padding: .2rem .6rem; text-align: right; border-bottom: 1px solid #eee; }
td:first-child, th:first-child, td:nth-child(2), th:nth-child(2) { text-align: left; }
"""


def render_html(summary: Summary, *, title: str = "dftrace report") -> str:
    """The summary as a self-contained HTML page with interactive plots."""
    plotly_js = require("plotly.offline").get_plotlyjs()
    sections: list[tuple[str, str, Callable[[Summary], Any]]] = [
        ("Stragglers", "Per rank: the wait it caused the others in collectives (matched across "
         "ranks by group and sequence number; the last to arrive waits the least), and how many "
         "steps it held the others back in.", _stragglers),
        ("Step timeline per rank", "Each bar is one step of one rank, from the first span of its "
         "work to the next step's (see the step model in docs/analysis.md); colour is the epoch. "
         "With many ranks or steps, a heat map of step times instead.", _step_timeline),
        ("Wait in collectives per rank and step", "Time each rank spent waiting in collectives in "
         "each step: the ranks that wait are not the straggler.", _step_waits),
        ("Step time per rank", "Under synchronous collectives every rank's step lasts as long as "
         "the slowest; the wait above tells who that is.", _step_lines),
        ("Time breakdown", "Per process: time in exactly one activity, in several at once "
         "(overlap), and in none (idle).", _breakdown),
        ("Where the time goes", "Self time of the names that take the most: the time their spans "
         "were the innermost on their thread, without what runs inside them; enclosing spans "
         "(pipeline spans, loop bodies) are left out, and the time asynchronous work was in flight "
         "(.done, overlapping other work) is shown apart, in grey.", _top_names),
        ("Duration distributions", "How long each call of the busiest names took (log scale).",
         _distributions),
        ("Data-loader stall", "Share of loop time spent waiting for the next item (.iter) "
         "rather than using it (.block), per rank.", _stall),
        ("GPU time per rank and device", "PyTorch profiler traces, HolisticTraceAnalysis' definitions: from "
         "the first kernel's start to the last one's end, time some computation kernel ran, time only other "
         "kernels ran (communication, memory), and idle time (split by cause on hover).", _gpu_time),
        ("File I/O over time", "Bytes read and written per second by the traced file calls (POSIX and STDIO), "
         "each call's bytes in the stretch of time it started in.", _io_timeline),
        ("GPU streams", "When each CUDA stream was busy (kernels, copies, sets; the shortest gaps are "
         "closed beyond 200 intervals a stream), on the step timeline's clock.", _gpu_lanes),
    ]
    parts = []
    for heading, note, build in sections:
        figure = build(summary)
        if figure is None:
            continue
        div = require("plotly.io").to_html(figure, include_plotlyjs=False, full_html=False, config=_CONFIG)
        parts.append(f"<h2>{html.escape(heading)}</h2>\n<p class='note'>{html.escape(note)}</p>\n{div}")
    body = "\n".join([_header(summary, title), _files_table(summary), *parts, _io_table(summary)])
    return (
        "<!DOCTYPE html>\n<html lang='en'>\n<head>\n<meta charset='utf-8'>\n"
        f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n"
        f"<script type='text/javascript'>{plotly_js}</script>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def write_html(summary: Summary, path: str | os.PathLike[str], *, title: str = "dftrace report") -> None:
    """Write :func:`render_html` output to ``path``."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render_html(summary, title=title))


def _header(summary: Summary, title: str) -> str:
    o = summary.overview
    cards = [
        ("wall time", format_us(o["wall_us"])),
        ("processes", o["processes"]),
        *([("ranks", o["ranks"])] if o["ranks"] else []),  # a job without ranks has no such tile
        ("hosts", o["hosts"]),
        ("events", f"{o['events']:,}"),
        ("files", o["files"]),
        ("broken lines", o["broken_lines"]),
        ("dropped events", o["dropped_events"]),
    ]
    stats = summary.step_stats
    if stats:
        cards.insert(1, ("median step", format_us(stats["p50_us"])))
    cards_html = "".join(f"<div class='card'><b>{html.escape(str(v))}</b><span>{k}</span></div>" for k, v in cards)
    lines = "".join(f"<p class='finding'>{html.escape(line.strip())}</p>" for line in findings(summary))
    return f"<h1>{html.escape(title)}</h1>\n{lines}\n<div class='cards'>{cards_html}</div>"


def _files_table(summary: Summary) -> str:
    damaged = [f for f in summary.files if f["broken_count"] or f["cut_off"]]
    if not damaged:
        return ""
    rows = "".join(
        f"<tr><td>{html.escape(os.path.basename(f['path']))}</td><td>{f['broken_count']}</td>"
        f"<td>{html.escape(f['cut_off'] or '')}</td></tr>"
        for f in damaged
    )
    return (
        "<h2>Damaged files</h2><table><tr><th>file</th><th>broken lines</th><th>cut off</th></tr>"
        f"{rows}</table>"
    )


def _io_table(summary: Summary) -> str:
    """The I/O figures and findings, and the files with the most I/O time."""
    io = summary.io
    if not io:
        return ""
    figures = [("read", format_bytes(io["read_bytes"]), f"{io['read_ops']:,} calls"),
               ("written", format_bytes(io["write_bytes"]), f"{io['write_ops']:,} calls"),
               ("metadata", f"{io['metadata_ops']:,} calls", _share_text(io["metadata_share"]) + " of I/O time"),
               ("I/O time", format_us(io["io_time_us"]), format_bytes(io["bandwidth_bytes_per_s"]) + "/s"),
               ("reads under 64 KiB", _share_text(io["small_read_share"]), "of read time"),
               ("not overlapped with compute", _share_text(io["not_overlapped_share"]), "of I/O time")]
    rows = "".join(f"<tr><td>{html.escape(a)}</td><td>{html.escape(b)}</td><td>{html.escape(c)}</td></tr>"
                   for a, b, c in figures)
    said = "".join(f"<p class='finding'>{html.escape(line)}</p>" for line in io["findings"])
    files = "".join(
        f"<tr><td>{html.escape(file_label(f))}</td>"
        f"<td>{html.escape(format_bytes(f['read_bytes']))}</td><td>{html.escape(format_bytes(f['write_bytes']))}</td>"
        f"<td>{f['ops']:,}</td><td>{html.escape(format_us(f['io_time_us']))}</td></tr>" for f in io["files"][:20])
    return (f"<h2>File I/O</h2>{said}<table>{rows}</table>\n<h2>Files by I/O time</h2><table><tr><th>file</th>"
            f"<th>read</th><th>written</th><th>calls</th><th>I/O time</th></tr>{files}</table>")


def _share_text(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.1f}%"


def _io_timeline(summary: Summary) -> Any:
    line = summary.io.get("timeline") if summary.io else None
    if not line:
        return None
    go = _go()
    seconds = line["bucket_us"] / 1e6
    origin = summary.overview["start_us"] or line["start_us"]
    at = [(line["start_us"] - origin + i * line["bucket_us"]) / 1000 for i in range(len(line["read_bytes"]))]
    fig = go.Figure()
    for key, name in (("read_bytes", "read"), ("write_bytes", "written")):
        fig.add_trace(go.Scatter(name=name, x=at, y=[b / seconds / 2**20 for b in line[key]], mode="lines",
                                 line_shape="hv"))
    return _layout(fig, xaxis_title="time since the run's start (ms)", yaxis_title="MiB/s")


def _unit_order(unit: str) -> tuple[int, int, str]:
    """Sort "rank 2" before "rank 10"; process labels after ranks."""
    number = unit.removeprefix("rank ")
    return (0, int(number), "") if number.isdigit() else (1, 0, unit)


def _go() -> Any:
    return require("plotly.graph_objects")


def _layout(fig: Any, height: int = 420, **kwargs: Any) -> Any:
    # Subplot titles sit above the plot area: leave room for them and for plotly's
    # toolbar, which would cover them.
    titled = any(a.text for a in fig.layout.annotations)
    fig.update_layout(height=height, margin={"l": 60, "r": 20, "t": 80 if titled else 40, "b": 50},
                      template="plotly_white", **kwargs)
    return fig


#: Above this many ranks or rank-steps, the step timeline is a heat map.
TIMELINE_RANKS = 32
TIMELINE_BARS = 5_000


def _step_order(rows: list[dict[str, Any]]) -> dict[tuple[Any, Any], int]:
    keys = sorted({(r["epoch"], r["step"]) for r in rows}, key=lambda k: (k[0] is None, k[0] or 0, k[1]))
    return {key: i for i, key in enumerate(keys)}


def _heatmap(rows: list[dict[str, Any]], value: str, title: str, colorscale: str) -> Any:
    """Ranks by steps (in order), coloured by ``value`` in ms."""
    go = _go()
    order = _step_order(rows)
    ranks = sorted(dict.fromkeys(r["rank"] for r in rows), key=_unit_order)
    index = {rank: i for i, rank in enumerate(ranks)}
    z: list[list[float | None]] = [[None] * len(order) for _ in ranks]
    for r in rows:
        z[index[r["rank"]]][order[(r["epoch"], r["step"])]] = r[value] / 1000
    labels = [f"epoch {e} step {s}" if e is not None else f"step {s}" for e, s in order]
    fig = go.Figure(go.Heatmap(z=z, y=ranks, x=list(range(len(order))), colorscale=colorscale,
                               customdata=[labels] * len(ranks), colorbar={"title": title},
                               hovertemplate="%{y} %{customdata}: %{z:.3f} ms<extra></extra>"))
    return _layout(fig, height=max(260, min(900, 14 * len(ranks) + 140)), xaxis_title="step (in order)",
                   yaxis={"autorange": "reversed"})


def _step_timeline(summary: Summary) -> Any:
    rows = summary.rank_steps
    if not rows:
        return None
    ranks = list(dict.fromkeys(r["rank"] for r in rows))
    if len(ranks) > TIMELINE_RANKS or len(rows) > TIMELINE_BARS:
        return _heatmap(rows, "dur_us", "step (ms)", "Viridis")
    go = _go()
    fig = go.Figure()
    for epoch in sorted({r["epoch"] for r in rows}, key=lambda e: (e is None, e)):
        sub = [r for r in rows if r["epoch"] == epoch]
        fig.add_trace(
            go.Bar(
                name=f"epoch {epoch}" if epoch is not None else "steps", orientation="h",
                y=[r["rank"] for r in sub],
                x=[r["dur_us"] / 1000 for r in sub], base=[r["start_us"] / 1000 for r in sub],
                customdata=[[r["step"], format_us(r["dur_us"]), format_us(r.get("wait_us"))] for r in sub],
                hovertemplate="%{y} step %{customdata[0]}: %{customdata[1]}, waiting "
                              "%{customdata[2]}<extra></extra>",
                marker_line_width=0.5, marker_line_color="white",
            )
        )
    note = " (sampled steps)" if summary.rank_steps_sampled else ""
    return _layout(fig, height=max(260, 28 * len(ranks) + 120), barmode="overlay",
                   xaxis_title=f"time since the run's start (ms){note}",
                   yaxis={"categoryorder": "array", "categoryarray": ranks[::-1]})


def _step_waits(summary: Summary) -> Any:
    rows = summary.rank_steps
    if not summary.stragglers or not any(r.get("wait_us") for r in rows):
        return None
    return _heatmap(rows, "wait_us", "wait (ms)", "Reds")


def _step_lines(summary: Summary) -> Any:
    rows = summary.rank_steps
    if not rows:
        return None
    go = _go()
    order = _step_order(rows)
    fig = go.Figure()
    for rank in dict.fromkeys(r["rank"] for r in rows):
        sub = sorted((r for r in rows if r["rank"] == rank), key=lambda r: order[(r["epoch"], r["step"])])
        fig.add_trace(
            go.Scatter(
                name=rank, mode="lines+markers" if len(sub) < 200 else "lines",
                x=[order[(r["epoch"], r["step"])] for r in sub], y=[r["dur_us"] / 1000 for r in sub],
                customdata=[[r["epoch"], r["step"]] for r in sub],
                hovertemplate=f"{rank} epoch %{{customdata[0]}} step %{{customdata[1]}}: %{{y:.3f}} ms<extra></extra>",
            )
        )
    return _layout(fig, xaxis_title="step (in order over all epochs)", yaxis_title="step time (ms)")


def _breakdown(summary: Summary) -> Any:
    processes = summary.breakdown["processes"]
    if not processes:
        return None
    go = _go()
    labels = [p["label"] for p in processes]
    fig = go.Figure()
    for group, label in GROUP_LABELS.items():
        values = [p["exclusive_us"][group] / 1000 for p in processes]
        if any(values):
            fig.add_trace(go.Bar(name=f"{label} only", y=labels, x=values, orientation="h",
                                 marker_color=_GROUP_COLORS[group]))
    overlap = [(p["wall_us"] - p["idle_us"] - sum(p["exclusive_us"].values())) / 1000 for p in processes]
    fig.add_trace(go.Bar(name="overlapping activities", y=labels, x=overlap, orientation="h",
                         marker_color=_GROUP_COLORS["overlap"]))
    fig.add_trace(go.Bar(name="idle / other", y=labels, x=[p["idle_us"] / 1000 for p in processes],
                         orientation="h", marker_color=_GROUP_COLORS["idle"]))
    return _layout(fig, height=max(260, 28 * len(labels) + 120), barmode="stack",
                   xaxis_title="process time (ms)", yaxis={"autorange": "reversed"})


def _top_names(summary: Summary) -> Any:
    """The names with the most self time (the time their spans were the innermost:
    a loop body or ``backward`` without what runs inside it), enclosing spans left out
    (pipeline spans and loop bodies), and the time asynchronous work was in flight
    (``.done``, which overlaps other work) apart."""
    leaves = [r for r in summary.categories
              if r["cat"] != fmt.CAT_PIPELINE and not r["name"].endswith(fmt.BLOCK_SUFFIX)]
    own = [r for r in leaves if not r["name"].endswith(fmt.DONE_SUFFIX)]
    calls = sorted(own, key=lambda r: r.get("self_us", r["total_us"]), reverse=True)[:20]
    flight = sorted((r for r in leaves if r["name"].endswith(fmt.DONE_SUFFIX)),
                    key=lambda r: r["total_us"], reverse=True)[:5]
    if not calls and not flight:
        return None
    go = _go()
    fig = go.Figure()
    series = ((calls, "self time in the call", "self_us", None),
              (flight, "asynchronous work in flight", "total_us", "#bbb"))
    for part, name, key, color in series:
        if part:
            fig.add_trace(go.Bar(
                y=[f"{r['cat']}/{r['name']}" for r in part], x=[r.get(key, r["total_us"]) / 1000 for r in part],
                name=name, orientation="h", marker_color=color,
                customdata=[[r["count"], format_us(r["total_us"])] for r in part],
                hovertemplate="%{y}: %{x:.3f} ms in %{customdata[0]} calls (%{customdata[1]} with what runs "
                              "inside)<extra></extra>",
            ))
    return _layout(fig, height=max(260, 24 * (len(calls) + len(flight)) + 100), xaxis_title="time (ms)",
                   yaxis={"autorange": "reversed"}, legend={"orientation": "h", "y": -0.2})


def _distributions(summary: Summary) -> Any:
    dists = summary.distributions
    if not dists:
        return None
    go = _go()
    subplots = require("plotly.subplots")
    cols = 3
    rows = (len(dists) + cols - 1) // cols
    fig = subplots.make_subplots(rows=rows, cols=cols, subplot_titles=[f"{d['cat']}/{d['name']}" for d in dists])
    for i, d in enumerate(dists):
        fig.add_trace(
            go.Scatter(x=d["edges_us"], y=d["counts"] + d["counts"][-1:], line_shape="hv", fill="tozeroy",
                       showlegend=False, hovertemplate="from %{x:.1f} us: %{y} calls<extra></extra>"),
            row=i // cols + 1, col=i % cols + 1,
        )
    fig.update_xaxes(type="log", title_text="duration (us)")
    return _layout(fig, height=260 * rows)


def _stragglers(summary: Summary) -> Any:
    ranks = summary.stragglers[:50]
    if not ranks:
        return None
    go = _go()
    subplots = require("plotly.subplots")
    fig = subplots.make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5],
                                 subplot_titles=["wait caused per step (ms)", "compute per step (ms)"])
    labels = [r["unit"] for r in ranks]
    fig.add_trace(go.Bar(x=labels, y=[(r["caused_wait_us_per_step"] or 0) / 1000 for r in ranks],
                         customdata=[[r["held_steps"], r["last_arrivals"]] for r in ranks], showlegend=False,
                         hovertemplate="%{x}: %{y:.3f} ms per step, held the others back in "
                                       "%{customdata[0]} steps, last in %{customdata[1]} "
                                       "collectives<extra></extra>"),
                  row=1, col=1)
    fig.add_trace(go.Bar(x=labels, y=[(r["compute_us_per_step"] or 0) / 1000 for r in ranks], showlegend=False,
                         marker_color=_GROUP_COLORS["compute"]),
                  row=1, col=2)
    return _layout(fig)


def _stall(summary: Summary) -> Any:
    loaders = [d for d in summary.dataloader if d["ranks"]]
    if not loaders:
        return None
    go = _go()
    fig = go.Figure()
    for d in loaders:
        ranks = sorted(d["ranks"], key=lambda r: _unit_order(r["rank"]))
        fig.add_trace(go.Bar(name=f"{d['cat']}/{d['loader']}", x=[r["rank"] for r in ranks],
                             y=[(r["stall"] or 0) * 100 for r in ranks]))
    return _layout(fig, yaxis_title="stall (% of loop time)", barmode="group")


def _gpu_time(summary: Summary) -> Any:
    rows = summary.gpu
    if not rows:
        return None
    go = _go()
    labels = [f"rank {g['rank']} · GPU {g['device']}" for g in rows]
    fig = go.Figure()
    for key, name, color in (("compute_us", "compute", "#4c78a8"), ("non_compute_us", "non-compute", "#f58518"),
                             ("idle_us", "idle", "#bab0ac")):
        fig.add_trace(go.Bar(
            name=name, y=labels, x=[g[key] / 1000 for g in rows], orientation="h", marker_color=color,
            customdata=[[g[key.replace("_us", "_pct")], g["comm_compute_overlap_pct"],
                         g["idle_by_cause"]["host_wait_pct"], g["idle_by_cause"]["kernel_wait_pct"]] for g in rows],
            hovertemplate=f"%{{y}} {name}: %{{x:.3f}} ms (%{{customdata[0]}}%), comm/compute overlap "
                          "%{customdata[1]}%, idle waiting on the host %{customdata[2]}%, between kernels "
                          "%{customdata[3]}%<extra></extra>",
        ))
    return _layout(fig, height=max(260, 28 * len(labels) + 120), barmode="stack",
                   xaxis_title="kernel time (ms)", yaxis={"autorange": "reversed"})


def _gpu_lanes(summary: Summary) -> Any:
    lanes = [(f"rank {g['rank']} · GPU {g['device']} · stream {lane['stream']}", lane)
             for g in summary.gpu for lane in g.get("streams", [])]
    if not lanes:
        return None
    go = _go()
    origin = summary.overview["start_us"]
    fig = go.Figure()
    for label, lane in lanes:
        fig.add_trace(go.Bar(
            name=label, orientation="h", y=[label] * len(lane["busy"]), showlegend=False,
            x=[(end - start) / 1000 for start, end in lane["busy"]],
            base=[(start - origin) / 1000 for start, _ in lane["busy"]],
            hovertemplate=f"{label}: busy %{{x:.3f}} ms from %{{base:.3f}} ms "
                          f"({lane['kernels']} kernels, {format_us(lane['busy_us'])} in all)<extra></extra>",
        ))
    return _layout(fig, height=max(260, 26 * len(lanes) + 120), barmode="overlay",
                   xaxis_title="time since the run's start (ms)",
                   yaxis={"categoryorder": "array", "categoryarray": [label for label, _ in lanes][::-1]})
