"""Rendering a :class:`Summary` as one self-contained HTML report (plotly, offline):
the figures of ``render.figures``, each under a heading with a note.

plotly.js is embedded once in the page, so the file opens without a network.
"""

from __future__ import annotations

import html
import os
from collections.abc import Callable
from typing import Any

from ..runtime.deps import require
from ..answers.summary import Summary
from ..answers.units import file_label, format_bytes, format_us
from . import figures
from .text import findings

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
         "steps it held the others back in.", figures.stragglers),
        ("Step timeline per rank", "Each bar is one step of one rank, from the first span of its "
         "work to the next step's (see the step model in docs/analysis.md); colour is the epoch. "
         "With many ranks or steps, a heat map of step times instead.", figures.step_timeline),
        ("Wait in collectives per rank and step", "Time each rank spent waiting in collectives in "
         "each step: the ranks that wait are not the straggler.", figures.collective_waits),
        ("Step time per rank", "Under synchronous collectives every rank's step lasts as long as "
         "the slowest; the wait above tells who that is.", figures.step_times),
        ("Time breakdown", "Per process: time in exactly one activity, in several at once "
         "(overlap), and in none (idle).", figures.time_breakdown),
        ("Where the time goes", "Self time of the names that take the most: the time their spans "
         "were the innermost on their thread, without what runs inside them; enclosing spans "
         "(pipeline spans, loop bodies) are left out, and the time asynchronous work was in flight "
         "(.done, overlapping other work) is shown apart, in grey.", figures.self_time_by_name),
        ("Duration distributions", "How long each call of the busiest names took (log scale).",
         figures.duration_distributions),
        ("Data-loader stall", "Share of loop time spent waiting for the next item (.iter) "
         "rather than using it (.block), per rank.", figures.data_loader_stall),
        ("GPU time per rank and device", "PyTorch profiler traces, HolisticTraceAnalysis' definitions: from "
         "the first kernel's start to the last one's end, time some computation kernel ran, time only other "
         "kernels ran (communication, memory), and idle time (split by cause on hover).", figures.gpu_time),
        ("File I/O over time", "Bytes read and written per second by the traced file calls (POSIX and STDIO), "
         "each call's bytes in the stretch of time it started in.", figures.io_over_time),
        ("GPU streams", "When each CUDA stream was busy (kernels, copies, sets; the shortest gaps are "
         "closed beyond 200 intervals a stream), on the step timeline's clock.", figures.gpu_streams),
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
