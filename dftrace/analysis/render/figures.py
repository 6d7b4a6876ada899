"""The charts of a :class:`Summary`, one function a question, each a plotly ``Figure``.

The HTML report (``render.html``) is these figures with a heading and a note each; in
a notebook, a figure is the cell's value (or ``fig.show()``)::

    from dftrace.analysis import figures, summarize
    figures.step_timeline(summarize("traces/"))

Each function takes a summary and returns a figure, or None when the summary holds
nothing it could show (a run without steps has no step timeline, one without a
PyTorch profiler trace no GPU time). Times are drawn in milliseconds. The tables
behind them are in ``render.frames``. plotly is imported at the first figure.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from ... import format as fmt
from ..answers.summary import Summary
from ..answers.units import format_us
from ..runtime.deps import require
from .text import GROUP_LABELS

if TYPE_CHECKING:
    from plotly.graph_objects import Figure

__all__ = [
    "collective_waits", "data_loader_stall", "duration_distributions", "gpu_streams", "gpu_time", "io_over_time",
    "self_time_by_name", "step_timeline", "step_times", "stragglers", "time_breakdown",
]

#: Above this many ranks or rank-steps, the step timeline is a heat map.
TIMELINE_RANKS = 32
TIMELINE_BARS = 5_000

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


# --- steps -------------------------------------------------------------------------------


def stragglers(summary: Summary) -> Figure | None:
    """Per rank (the first 50, worst first): the wait it caused the others in
    collectives per step, beside its compute per step; two bar charts side by side.
    None without stragglers (one rank, or no collectives matched across ranks)."""
    ranks = summary.stragglers[:50]
    if not ranks:
        return None
    go = _go()
    subplots = require("plotly.subplots")
    fig = subplots.make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5],
                                 subplot_titles=["wait caused per step (ms)", "compute per step (ms)"])
    labels = [shown(r["unit"]) for r in ranks]
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


def step_timeline(summary: Summary) -> Figure | None:
    """Each step of each rank as a bar on the run's clock, one bar trace per epoch; with
    more than ``TIMELINE_RANKS`` ranks or ``TIMELINE_BARS`` rank-steps, a heat map of
    step times (ranks by steps) instead. None without steps."""
    rows = summary.rank_steps
    if not rows:
        return None
    ranks = list(dict.fromkeys(r["rank"] for r in rows))
    if len(ranks) > TIMELINE_RANKS or len(rows) > TIMELINE_BARS:
        return _heatmap(rows, "dur_us", "step (ms)", "Viridis", thinned_note(summary))
    go = _go()
    fig = go.Figure()
    for epoch in sorted({r["epoch"] for r in rows}, key=lambda e: (e is None, e)):
        sub = [r for r in rows if r["epoch"] == epoch]
        fig.add_trace(
            go.Bar(
                name=f"epoch {epoch}" if epoch is not None else "steps", orientation="h",
                y=[shown(r["rank"]) for r in sub],
                x=[r["dur_us"] / 1000 for r in sub], base=[r["start_us"] / 1000 for r in sub],
                customdata=[[r["step"], format_us(r["dur_us"]), format_us(r.get("wait_us"))] for r in sub],
                hovertemplate="%{y} step %{customdata[0]}: %{customdata[1]}, waiting "
                              "%{customdata[2]}<extra></extra>",
                marker_line_width=0.5, marker_line_color="white",
            )
        )
    note = thinned_note(summary)
    return _layout(fig, height=max(260, 28 * len(ranks) + 120), barmode="overlay",
                   xaxis_title=f"time since the run's start (ms){note}",
                   yaxis={"categoryorder": "array", "categoryarray": ranks[::-1]})


def collective_waits(summary: Summary) -> Figure | None:
    """A heat map of the time each rank waited in collectives in each step (ranks by
    steps): the ranks that wait are not the straggler. None without stragglers or
    without any wait."""
    rows = summary.rank_steps
    if not summary.stragglers or not any(r.get("wait_us") for r in rows):
        return None
    return _heatmap(rows, "wait_us", "wait (ms)", "Reds", thinned_note(summary))


def step_times(summary: Summary) -> Figure | None:
    """Step time over the steps in order, one line per rank. None without steps."""
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
                name=shown(rank), mode="lines+markers" if len(sub) < 200 else "lines",
                x=[order[(r["epoch"], r["step"])] for r in sub], y=[r["dur_us"] / 1000 for r in sub],
                customdata=[[r["epoch"], r["step"]] for r in sub],
                hovertemplate=f"{shown(rank)} epoch %{{customdata[0]}} step %{{customdata[1]}}: %{{y:.3f}} ms"
                              "<extra></extra>",
            )
        )
    return _layout(fig, xaxis_title=f"step (in order over all epochs){thinned_note(summary)}",
                   yaxis_title="step time (ms)")


# --- where the time goes ----------------------------------------------------------------


def time_breakdown(summary: Summary) -> Figure | None:
    """Per process, stacked bars: the time in exactly one activity (a trace per
    activity that has any), in several at once, and in none. None without processes."""
    processes = summary.breakdown.get("processes")
    if not processes:
        return None
    go = _go()
    labels = [shown(p["label"]) for p in processes]
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


def self_time_by_name(summary: Summary) -> Figure | None:
    """The 20 names with the most self time (the time their spans were the innermost:
    a loop body or ``backward`` without what runs inside it), enclosing spans left out
    (pipeline spans and loop bodies), and in a second bar trace the 5 with the most time
    asynchronous work was in flight (``.done``, which overlaps other work). None when
    no name is left."""
    leaves = [r for r in summary.categories
              if r["cat"] != fmt.CAT_PIPELINE and not r["name"].endswith(fmt.LOOP_BODY_SUFFIXES)]
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
                y=[shown(f"{r['cat']}/{r['name']}") for r in part], x=[r.get(key, r["total_us"]) / 1000 for r in part],
                name=name, orientation="h", marker_color=color,
                customdata=[[r["count"], format_us(r["total_us"])] for r in part],
                hovertemplate="%{y}: %{x:.3f} ms in %{customdata[0]} calls (%{customdata[1]} with what runs "
                              "inside)<extra></extra>",
            ))
    return _layout(fig, height=max(260, 24 * (len(calls) + len(flight)) + 100), xaxis_title="time (ms)",
                   yaxis={"autorange": "reversed"}, legend={"orientation": "h", "y": -0.2})


def duration_distributions(summary: Summary) -> Figure | None:
    """How long each call of the busiest names took: a histogram (log-spaced bins, log
    axis) per name, three to a row. None without distributions."""
    dists = summary.distributions
    if not dists:
        return None
    go = _go()
    subplots = require("plotly.subplots")
    cols = 3
    rows = (len(dists) + cols - 1) // cols
    fig = subplots.make_subplots(rows=rows, cols=cols, subplot_titles=[shown(f"{d['cat']}/{d['name']}") for d in dists])
    for i, d in enumerate(dists):
        fig.add_trace(
            go.Scatter(x=d["edges_us"], y=d["counts"] + d["counts"][-1:], line_shape="hv", fill="tozeroy",
                       showlegend=False, hovertemplate="from %{x:.1f} us: %{y} calls<extra></extra>"),
            row=i // cols + 1, col=i % cols + 1,
        )
    fig.update_xaxes(type="log", title_text="duration (us)")
    return _layout(fig, height=260 * rows)


def data_loader_stall(summary: Summary) -> Figure | None:
    """Per data loader (a bar trace each), per rank: the share of loop time spent
    waiting for the next item (``.iter``) rather than using it (``.block``), in %.
    None without a loader on a rank or process."""
    loaders = [d for d in summary.dataloader if d["ranks"]]
    if not loaders:
        return None
    go = _go()
    fig = go.Figure()
    for d in loaders:
        ranks = sorted(d["ranks"], key=lambda r: _unit_order(r["rank"]))
        fig.add_trace(go.Bar(name=shown(f"{d['cat']}/{d['loader']}"), x=[shown(r["rank"]) for r in ranks],
                             y=[(r["stall"] or 0) * 100 for r in ranks]))
    return _layout(fig, yaxis_title="stall (% of loop time)", barmode="group")


# --- GPU and file I/O --------------------------------------------------------------------


def gpu_time(summary: Summary) -> Figure | None:
    """Per rank and device of PyTorch profiler traces, stacked bars: computation,
    other kernels only (communication, memory) and idle time. None without GPU kernels."""
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


def gpu_streams(summary: Summary) -> Figure | None:
    """When each CUDA stream was busy, a bar trace per (rank, device, stream) on the
    run's clock. None without GPU kernels."""
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


def io_over_time(summary: Summary) -> Figure | None:
    """Bytes read and written per second by the traced file calls, two lines over the
    run's time (each call's bytes in the stretch of time it started in). None without
    traced file I/O."""
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


# --- shared pieces -----------------------------------------------------------------------


def _go() -> Any:
    return require("plotly.graph_objects")


def _layout(fig: Any, height: int = 420, **kwargs: Any) -> Any:
    # Subplot titles sit above the plot area: leave room for them and for plotly's
    # toolbar, which would cover them.
    titled = any(a.text for a in fig.layout.annotations)
    fig.update_layout(height=height, margin={"l": 60, "r": 20, "t": 80 if titled else 40, "b": 50},
                      template="plotly_white", **kwargs)
    return fig


def shown(text: Any) -> str:
    """A name from the trace (a span's, a host's, a process's) as a chart shows it: its
    own characters, never markup (plotly reads ``<b>``, ``<a href>`` and the like in
    any label) nor a hover template's ``%{...}`` field."""
    return html.escape(str(text), quote=False).replace("%{", "%&#123;")


def _unit_order(unit: str) -> tuple[int, int, str]:
    """Sort "rank 2" before "rank 10"; process labels after ranks."""
    number = unit.removeprefix("rank ")
    return (0, int(number), "") if number.isdigit() else (1, 0, unit)


def _step_order(rows: list[dict[str, Any]]) -> dict[tuple[Any, Any], int]:
    keys = sorted({(r["epoch"], r["step"]) for r in rows}, key=lambda k: (k[0] is None, k[0] or 0, k[1]))
    return {key: i for i, key in enumerate(keys)}


def _heatmap(rows: list[dict[str, Any]], value: str, title: str, colorscale: str, note: str = "") -> Any:
    """Ranks by steps (in order), coloured by ``value`` in ms."""
    go = _go()
    order = _step_order(rows)
    ranks = sorted(dict.fromkeys(r["rank"] for r in rows), key=_unit_order)
    index = {rank: i for i, rank in enumerate(ranks)}
    z: list[list[float | None]] = [[None] * len(order) for _ in ranks]
    for r in rows:
        z[index[r["rank"]]][order[(r["epoch"], r["step"])]] = r[value] / 1000
    labels = [f"epoch {e} step {s}" if e is not None else f"step {s}" for e, s in order]
    fig = go.Figure(go.Heatmap(z=z, y=[shown(rank) for rank in ranks], x=list(range(len(order))), colorscale=colorscale,
                               customdata=[labels] * len(ranks), colorbar={"title": title},
                               hovertemplate="%{y} %{customdata}: %{z:.3f} ms<extra></extra>"))
    return _layout(fig, height=max(260, min(900, 14 * len(ranks) + 140)), xaxis_title=f"step (in order){note}",
                   yaxis={"autorange": "reversed"})


def thinned_note(summary: Summary) -> str:
    """What the step charts leave out of a long run, as their axis says it (`` (every
    20th of 400,000 steps, and the slowest 4,000)``); empty when they show every step."""
    thinned = summary.rank_steps_thinned
    if not thinned:
        return " (sampled steps)" if summary.rank_steps_sampled else ""
    nth = thinned["every"]
    suffix = "th" if 10 <= nth % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(nth % 10, "th")
    return (f" (every {nth:,}{suffix} of {thinned['steps']:,} steps, "
            f"and the slowest {thinned['slowest']:,})")
