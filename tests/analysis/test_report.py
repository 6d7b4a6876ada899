"""The HTML report: self-contained, and rendered by a real browser (headless Chromium)."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
import tracegen
from _requirements import needs

pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from dftrace.analysis import load_traces, render_html, summarize  # noqa: E402
from dftrace.analysis.commands import main  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = needs(
    "chromium", None if CHROMIUM else "headless Chromium is not installed (Debian: apt-get install chromium)")


def _chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000",
        *args, page.as_uri(),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)


def _distinct_bytes(png: Path) -> int:
    """Distinct byte values in a PNG's filtered pixel data: a one-colour image has a handful."""
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    return len(set(zlib.decompress(idat)))


@pytest.fixture(scope="module")
def report(run_dir, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("report") / "report.html"
    assert main(["report", str(run_dir), "-o", str(path), "--title", "test run"]) == 0
    return path


def test_report_is_self_contained(report):
    """plotly.js is embedded and nothing is fetched from the network."""
    html = report.read_text(encoding="utf-8")
    assert "<title>test run</title>" in html
    assert "Plotly" in html and len(html) > 1_000_000
    assert not re.search(r"<script[^>]+src=", html)
    assert not re.search(r"<(link|img|iframe)[^>]+(href|src)=[\"']https?:", html)


def test_report_has_one_plot_per_section(report):
    """Stragglers, timeline, waits, step times, breakdown, top names, distributions and stall."""
    html = report.read_text(encoding="utf-8")
    headings = re.findall(r"<h2>([^<]+)</h2>", html)
    assert headings == ["Stragglers", "Step timeline per rank", "Wait in collectives per rank and step",
                        "Step time per rank", "Time breakdown", "Where the time goes", "Duration distributions",
                        "Data-loader stall"]
    assert html.count('class="plotly-graph-div"') == len(headings)


@needs_chromium
def test_report_renders_in_headless_chromium(report, tmp_path):
    """Chromium draws every plot, logs nothing to the console and the screenshot is not blank."""
    shot = tmp_path / "shot.png"
    run = _chromium(tmp_path, report, "--window-size=1280,2400", f"--screenshot={shot}")
    console = [line for line in run.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == []
    assert _distinct_bytes(shot) > 64
    dom = _chromium(tmp_path, report, "--dump-dom").stdout
    plots = report.read_text(encoding="utf-8").count('class="plotly-graph-div"')
    assert dom.count('class="plot-container plotly"') == plots
    assert dom.count('class="main-svg"') >= plots


@needs_chromium
def test_blank_page_is_detected_as_blank(tmp_path):
    """The blank-screenshot check itself: an empty page has almost no distinct bytes."""
    page = tmp_path / "blank.html"
    page.write_text("<html><body></body></html>")
    shot = tmp_path / "blank.png"
    _chromium(tmp_path, page, "--window-size=1280,800", f"--screenshot={shot}")
    assert _distinct_bytes(shot) < 16


def test_report_lists_damaged_files(tmp_path):
    """Files with broken lines or a cut get their own table."""
    tracegen.write_process(tmp_path, tracegen.training_process(1000, rank=0), cut="frame")
    html = render_html(summarize(tmp_path))
    assert "<h2>Damaged files</h2>" in html and "train-rank0-node0-1000.pfw.zst" in html


def _section(html: str, heading: str) -> str:
    start = html.index(f"<h2>{heading}</h2>")
    end = html.find("<h2>", start + 1)
    return html[start:end if end > 0 else len(html)]


def _first_json_list(section: str, key: str) -> list:
    start = section.index(f'"{key}":') + len(key) + 3
    return json.JSONDecoder().raw_decode(section, start)[0]


def test_report_step_timeline_has_a_row_per_rank_of_the_run(report, run_dir):
    """The step timeline has one row for each rank the traces hold, and no other."""
    timeline = _section(report.read_text(encoding="utf-8"), "Step timeline per rank")
    ranks = load_traces(run_dir).processes.get_column("rank").to_list()
    assert ranks == [0, 1, 2, 3]
    assert {int(r) for r in re.findall(r'"rank (\d+)', timeline)} == set(ranks)


def test_report_of_dftracer_traces(samples):
    """DFTracer's files (no ranks) make a report whose plots hold the trace's events and process."""
    summary = summarize(samples / "dftracer-2.0.3" / "toy.pfw.gz")
    html = render_html(summary)
    names = _first_json_list(_section(html, "Where the time goes"), "y")
    by_total = sorted(summary.to_dict()["categories"], key=lambda c: -c["total_us"])
    leaves = sorted((c for c in by_total if c["cat"] != "pipeline" and not c["name"].endswith(".block")),
                    key=lambda c: -c["self_us"])
    assert by_total[0]["cat"] == "pipeline"  # the enclosing epoch span: left out of the plot
    assert names[0] == f"{leaves[0]['cat']}/{leaves[0]['name']}" and not any(n.startswith("pipeline/") for n in names)
    assert set(names) <= {f"{c['cat']}/{c['name']}" for c in by_total} and "IO/read_shard" in names
    assert "vm · pid 25021" in _section(html, "Step timeline per rank")


def test_where_the_time_goes_leaves_out_containers_and_shows_in_flight_time_apart():
    """On a real DDP run: names by self time, no pipeline span or loop body among
    them, the DDP buckets' .done time in its own (grey) series, and subplot titles
    clear of the toolbar (a top margin above them)."""
    page = render_html(summarize(Path(__file__).resolve().parents[1] / "data" / "ddp-run"))
    where = _section(page, "Where the time goes").replace("\\u002f", "/")  # plotly escapes "/"
    names = _first_json_list(where, "y")
    assert not any(n.startswith("pipeline/") or n.endswith(".block") for n in names)
    summary = summarize(Path(__file__).resolve().parents[1] / "data" / "ddp-run")
    by_self = sorted((c for c in summary.categories if c["cat"] != "pipeline" and not c["name"].endswith(
        (".block", ".done"))), key=lambda c: -c["self_us"])
    assert names[0] == f"{by_self[0]['cat']}/{by_self[0]['name']}" and "comm/all_reduce.done" not in names
    backward = next(c for c in summary.categories if c["name"] == "backward")
    assert backward["self_us"] < backward["total_us"]  # without the bucket wait nested in it
    assert '"asynchronous work in flight"' in where and '"y":["comm/all_reduce.done"]' in where
    assert '"self time in the call"' in where
    distributions = _section(page, "Duration distributions")
    assert '"margin":{"l":60,"r":20,"t":80,"b":50}' in distributions.replace(" ", "")


def test_a_single_process_without_ranks_has_no_ranks_tile(tmp_path):
    """The header's tiles say what the trace holds: a process with no rank gives no
    "0 ranks" tile; a ranked run shows its ranks."""
    (tmp_path / "solo").mkdir()
    tracegen.write_process(tmp_path / "solo", tracegen.training_process(1000, rank=None))
    tiles = re.findall(r"<div class='card'><b>([^<]*)</b><span>([^<]*)</span></div>",
                       render_html(summarize(tmp_path / "solo")))
    assert ("1", "processes") in tiles and not any(name == "ranks" for _, name in tiles)
    (tmp_path / "ranked").mkdir()
    tracegen.write_process(tmp_path / "ranked", tracegen.training_process(1000, rank=0))
    tracegen.write_process(tmp_path / "ranked", tracegen.training_process(1001, rank=1))
    tiles = re.findall(r"<div class='card'><b>([^<]*)</b><span>([^<]*)</span></div>",
                       render_html(summarize(tmp_path / "ranked")))
    assert ("2", "ranks") in tiles
