"""``dftrace watch``: the live view of a running job, drawn from the watcher's
snapshot (``following``) with rich on a terminal, else as plain lines at each
refresh."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from ..answers.units import count_of, format_bytes, format_us
from .terminal import printable, printable_data
from .following import CLOSED, CUT_OFF, OPEN, STALLED, UNFINISHED, Watcher




# --- showing -------------------------------------------------------------------------------


def render_plain(snapshot: dict[str, Any]) -> str:
    """The snapshot as plain text lines."""
    from .text import _table

    lines = [_headline(snapshot)]
    if not snapshot["files"]:
        lines.append("  waiting for trace files")
    elif snapshot["ranks"]:
        # The last column only marks the straggler: left out when there is none.
        shown = len(_RANK_HEADERS) - (snapshot["straggler"] is None)
        rows = [_rank_cells(r, snapshot["straggler"])[:shown] for r in snapshot["ranks"]]
        lines += _table(_RANK_HEADERS[:shown], rows, (False, *[True] * 8, False)[:shown])
    else:
        lines.append("  no steps yet")
    straggler = _straggler_line(snapshot["straggler"])
    if straggler:
        lines.append(f"  {straggler}")
    if snapshot.get("io"):
        lines.append(f"  {_io_line(snapshot['io'])}")
    rows = [(f["path"], f["state"], f"{f['bytes']:,}", f["events"],
             "-" if f["idle_s"] is None else f"{f['idle_s']:.0f} s", f["problem"] or "") for f in snapshot["files"]]
    shown = 6 if any(f["problem"] for f in snapshot["files"]) else 5
    lines += _table(("file", "state", "bytes", "events", "last write", "problem")[:shown],
                    [row[:shown] for row in rows], (False, False, True, True, True, False)[:shown])
    return "\n".join(lines) + "\n"


def _headline(snapshot: dict[str, Any]) -> str:
    t = snapshot["totals"]
    return (
        f"dftrace watch: {count_of(t['files'], 'file')} ({t['files_open']} open, {t['files_stalled']} stalled, "
        f"{t['files_cut_off']} cut off, {t['files_unfinished']} unfinished, {t['files_closed']} closed) · "
        f"{count_of(t['ranks'], 'rank')} · "
        f"{t['events']} events · {t['broken_lines']} broken lines · {t['dropped_events']} dropped · "
        f"{format_us(t['wall_us'])}"
        + (f" · {t['steps_per_s']:.2f} steps/s (slowest rank)" if t["steps_per_s"] else "")
    )


_RANK_HEADERS = ("rank", "epoch", "step", "steps", "steps/s", "p50 step", "p95 step", "comm wait/step",
                 "stall", "")


def _rank_cells(r: dict[str, Any], straggler: dict[str, Any] | None) -> tuple[str, ...]:
    return (
        r["rank"], _or_dash(r["epoch"]), _or_dash(r["step"]), str(r["steps"]),
        "-" if r["steps_per_s"] is None else f"{r['steps_per_s']:.2f}",
        format_us(r["step_p50_us"]), format_us(r["step_p95_us"]), format_us(r["comm_wait_us_per_step"]),
        "-" if r["stall"] is None else f"{r['stall'] * 100:.1f}%",
        "straggler" if straggler and straggler["rank"] == r["rank"] else "",
    )


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _straggler_line(straggler: dict[str, Any] | None) -> str:
    if straggler is None:
        return ""
    if "held_steps" in straggler:
        return (f"straggler: {straggler['rank']} held the others back in {straggler['held_steps']} of the last "
                f"{straggler['steps']} steps, {format_us(straggler['caused_wait_us_per_step'])} per step")
    return (f"straggler: {straggler['rank']} was the slowest rank in {straggler['slowest_steps']} of the last "
            f"{straggler['steps']} steps")


def _io_line(io: dict[str, Any]) -> str:
    """Bytes/s read and written by the traced file calls, over the time they span."""

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{format_bytes(value)}/s"

    return (f"file I/O: {rate(io['read_bytes_per_s'])} read ({format_bytes(io['read_bytes'])}), "
            f"{rate(io['write_bytes_per_s'])} written ({format_bytes(io['write_bytes'])})")


def render_rich(snapshot: dict[str, Any]) -> Any:
    """The snapshot as a rich renderable (tables with the same figures as the plain text)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = [Text(_headline(snapshot), style="bold")]
    ranks = Table(box=None, header_style="bold", pad_edge=False)
    for i, header in enumerate(_RANK_HEADERS):
        ranks.add_column(header, justify="left" if i in (0, 9) else "right")
    for r in snapshot["ranks"]:
        ranks.add_row(*_rank_cells(r, snapshot["straggler"]),
                      style="red" if snapshot["straggler"] and snapshot["straggler"]["rank"] == r["rank"] else None)
    waiting = "no steps yet" if snapshot["files"] else "waiting for trace files"
    parts.append(ranks if snapshot["ranks"] else Text(waiting, style="dim"))
    straggler = _straggler_line(snapshot["straggler"])
    if straggler:
        parts.append(Text(straggler, style="red"))
    if snapshot.get("io"):
        parts.append(Text(_io_line(snapshot["io"])))
    files = Table(box=None, header_style="bold", pad_edge=False)
    for header in ("file", "state", "bytes", "events", "last write"):
        files.add_column(header, justify="left" if header in ("file", "state") else "right")
    colours = {OPEN: "green", STALLED: "yellow", CUT_OFF: "red", UNFINISHED: "red", CLOSED: "dim"}
    for f in snapshot["files"]:
        files.add_row(f["path"], Text(f["state"], style=colours[f["state"]]), f"{f['bytes']:,}", str(f["events"]),
                      "-" if f["idle_s"] is None else f"{f['idle_s']:.0f} s")
    parts += [files, Text("Ctrl-C to stop", style="dim")]
    return Group(*parts)


def watch(paths: Sequence[str], *, interval: float = 1.0, window: int = 50, stale_s: float = 10.0,
          once: bool = False, as_json: bool = False) -> int:
    """Run ``dftrace watch``: one snapshot (``once``), or a live view until every file
    is closed or Ctrl-C. Returns the exit code."""
    watcher = Watcher(paths, window=window, stale_s=stale_s)
    watcher.poll()
    if once:
        if not watcher.followers:
            raise FileNotFoundError(f"no trace files found at {' '.join(map(repr, paths))}")
        snapshot = watcher.snapshot()
        if as_json:
            import orjson

            sys.stdout.write(orjson.dumps(snapshot, option=orjson.OPT_INDENT_2).decode() + "\n")
        else:
            sys.stdout.write(printable(render_plain(snapshot)))
        return 0
    try:
        if not watcher.followers:
            sys.stderr.write(printable(_waiting_for(paths)))
            sys.stderr.flush()
        if sys.stdout.isatty():
            _live(watcher, interval)
        else:
            _lines(watcher, interval)
    except KeyboardInterrupt:
        pass
    return 0


def _waiting_for(paths: Sequence[str]) -> str:
    """What a watch with no trace file yet waits for: each path, and whether it exists."""
    said = []
    for path in paths:
        if os.path.isdir(path):
            said.append(f"{path!r} (a directory with no trace files yet)")
        elif os.path.exists(path):
            said.append(f"{path!r} (not a trace file)")
        else:
            said.append(f"{path!r} (does not exist yet)")
    return f"dftrace watch: waiting for trace files at {', '.join(said)}; Ctrl-C stops\n"


def _live(watcher: Watcher, interval: float) -> None:
    from rich.console import Console
    from rich.live import Live

    with Live(render_rich(printable_data(watcher.snapshot())), console=Console(), auto_refresh=False,
              transient=False) as live:
        ended = False
        while not ended:
            time.sleep(interval)
            ended = watcher.finished  # asked before the read: what ended is read to its end
            watcher.poll()
            live.update(render_rich(printable_data(watcher.snapshot())), refresh=True)


def _lines(watcher: Watcher, interval: float) -> None:
    """Without a terminal: a plain snapshot whenever something new was read."""
    sys.stdout.write(printable(render_plain(watcher.snapshot())))
    sys.stdout.flush()
    ended = False
    while not ended:
        time.sleep(interval)
        ended = watcher.finished  # asked before the read: what ended is read to its end
        if watcher.poll():
            sys.stdout.write("\n" + printable(render_plain(watcher.snapshot())))
            sys.stdout.flush()
