"""The answers as DataFrames (``frames``) and plotly figures (``figures``): each frame's
rows are the summary JSON's rows of its question, typed, and each figure draws the
traces its rows call for, on the toy demo, a four-rank run, GPU profiler traces and
DFTracer's file I/O."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pl = pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")
pytest.importorskip("plotly", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from dftrace.analysis import Summary, figures, frames, summarize  # noqa: E402
from dftrace.testing import read_events  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data"
GROUPS = ("compute", "data", "comm", "checkpoint", "device")
#: The column types a frame has, and the JSON values each holds.
PYTHON_TYPES = {pl.Int64: int, pl.Float64: float, pl.String: str, pl.Boolean: bool}


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy demo, 2 epochs: one process, steps, a data loader, no ranks."""
    out = tmp_path_factory.mktemp("demo")
    subprocess.run([sys.executable, "-m", "dftrace", "demo", "--out", str(out), "--epochs", "2"],
                   check=True, capture_output=True, timeout=120)
    return out


@pytest.fixture(scope="module")
def sources(demo_dir: Path, run_dir: Path) -> dict[str, tuple[Path, Summary]]:
    """Each run, with its summary."""
    where = {"demo": demo_dir, "ranks": run_dir, "gpu": DATA / "gpu-job",
             "io": DATA / "dftracer" / "dftracer-1.0.5_repo-example"}
    return {name: (path, summarize(path)) for name, path in where.items()}


# --- what each frame's rows are, read from the summary JSON -------------------------------------


def _renamed(row: dict[str, Any], **names: str) -> dict[str, Any]:
    return {names.get(key, key): value for key, value in row.items()}


def _breakdown(data: dict[str, Any]) -> list[dict[str, Any]]:
    b = data["breakdown"]
    idle = {"group": "idle", "busy_us": b["idle_us"], "exclusive_us": b["idle_us"], "overlapped_us": 0,
            "share_of_wall": b["idle_share"], "overlap_share": None}
    return [*b["groups"], idle]


def _breakdown_per_process(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"label": p["label"], "rank": p["rank"], "wall_us": p["wall_us"], "idle_us": p["idle_us"],
             **{f"{g}_busy_us": p["busy_us"][g] for g in GROUPS},
             **{f"{g}_exclusive_us": p["exclusive_us"][g] for g in GROUPS}}
            for p in data["breakdown"]["processes"]]


def _gpu(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**{k: v for k, v in g.items() if k not in ("idle_by_cause", "kernel_type_us", "top_kernels", "streams")},
             **{f"idle_{k}": v for k, v in g["idle_by_cause"].items()}} for g in data["gpu"]]


#: frame -> the summary JSON's rows it is made of
FRAMES: dict[str, tuple[Callable[..., Any], Callable[[dict[str, Any]], list[dict[str, Any]]]]] = {
    "steps": (frames.steps, lambda d: d["steps"]),
    "rank_steps": (frames.rank_steps, lambda d: d["rank_steps"]),
    "stragglers": (frames.stragglers, lambda d: d["stragglers"]),
    "epochs": (frames.epochs, lambda d: d["epochs"]),
    "breakdown": (frames.breakdown, _breakdown),
    "breakdown per process": (lambda s: frames.breakdown(s, per_process=True), _breakdown_per_process),
    "categories": (frames.categories, lambda d: d["categories"]),
    "dataloader": (frames.dataloader, lambda d: [
        _renamed({k: v for k, v in r.items() if k != "ranks"}, stall="stall_share") for r in d["dataloader"]]),
    "dataloader per rank": (lambda s: frames.dataloader(s, per_rank=True), lambda d: [
        {"cat": r["cat"], "loader": r["loader"], **_renamed(u, stall="stall_share")}
        for r in d["dataloader"] for u in r["ranks"]]),
    "processes": (frames.processes, lambda d: d["processes"]),
    "gpu": (frames.gpu, _gpu),
    "gpu_kernels": (frames.gpu_kernels, lambda d: [
        {"rank": g["rank"], "device": g["device"], **k} for g in d["gpu"] for k in g["top_kernels"]]),
    "gpu_steps": (frames.gpu_steps, lambda d: d["gpu_steps"]),
    "gpu_spans": (frames.gpu_spans, lambda d: d["gpu_spans"]),
    "io_files": (frames.io_files, lambda d: d["io"].get("files", [])),
    "io_ranks": (frames.io_ranks, lambda d: d["io"].get("ranks", [])),
    "io_steps": (frames.io_steps, lambda d: d["io"].get("steps", [])),
}


@pytest.mark.parametrize("name", FRAMES)
def test_each_frame_holds_the_summary_rows_of_its_question(name, sources):
    """On every run, a frame's rows are the JSON rows it comes from, every scalar field
    a column, in the summary's order; the columns are typed as the values are and are
    the same on every run, rows or none."""
    build, rows_of = FRAMES[name]
    schemas = set()
    for run, (_, summary) in sources.items():
        frame = build(summary)
        expected = rows_of(json.loads(summary.to_json()))
        assert frame.height == len(expected), run
        for got, want in zip(frame.to_dicts(), expected):
            assert got == want, run
        for column, dtype in frame.schema.items():
            kinds = {type(row[column]) for row in expected if row[column] is not None}
            assert kinds <= {PYTHON_TYPES[dtype]}, (run, column)
        schemas.add(tuple(frame.schema.items()))
    assert len(schemas) == 1
    empty = build(Summary.from_dict({}))
    assert empty.height == 0 and tuple(empty.schema.items()) == schemas.pop()


def test_every_run_has_the_answers_its_frames_are_tested_on(sources):
    """The runs above leave no frame untested: each has rows on some run."""
    tried = {name: max(build(summary).height for _, summary in sources.values())
             for name, (build, _) in FRAMES.items()}
    assert not [name for name, rows in tried.items() if not rows and name not in ("gpu_spans", "io_steps")]


@pytest.mark.parametrize("run", ["demo", "ranks"])
def test_steps_are_the_steps_the_trace_events_carry(run, sources):
    """The steps frame has a row per (epoch, step) the events were recorded in, the
    rank_steps frame one per process and step."""
    path, summary = sources[run]
    events = [e for e in read_events(path, strict=False) if "step" in (e.get("args") or {})]
    assert frames.steps(summary).select("epoch", "step").rows() == sorted(
        {(e["args"].get("epoch"), e["args"]["step"]) for e in events})
    assert frames.rank_steps(summary).height == len({(e["pid"], e["args"].get("epoch"), e["args"]["step"])
                                                     for e in events})


def test_a_path_is_summarised_first(sources):
    """A frame of a directory is the frame of its summary."""
    path, summary = sources["ranks"]
    assert frames.steps(path).equals(frames.steps(summary))
    assert frames.stragglers(str(path)).equals(frames.stragglers(summary))


def test_nan_is_null():
    """A standard deviation of one span is null, not NaN."""
    row = {"cat": "c", "name": "n", "count": 1, "total_us": 5, "self_us": 5, "mean_us": 5.0, "std_us": float("nan"),
           "min_us": 5, "p50_us": 5, "p95_us": 5, "max_us": 5}
    assert frames.categories(Summary.from_dict({"categories": [row]})).get_column("std_us").to_list() == [None]


# --- figures ------------------------------------------------------------------------------------


def _traces(fig: Any) -> list[tuple[str, Any]]:
    return [(trace.type, trace) for trace in fig.data]


def test_step_figures_draw_each_rank_and_step(sources):
    """The step timeline has a bar trace per epoch and a bar per rank-step; the step
    times a line per rank through its steps; the waits a heat map of ranks by steps."""
    _, summary = sources["ranks"]
    rank_steps = frames.rank_steps(summary)
    timeline = figures.step_timeline(summary)
    assert [(t, trace.name) for t, trace in _traces(timeline)] == [
        ("bar", f"epoch {e}") for e in rank_steps.get_column("epoch").unique().sort()]
    assert sum(len(trace.x) for trace in timeline.data) == rank_steps.height
    lines = figures.step_times(summary)
    per_rank = dict(rank_steps.group_by("rank").len().rows())
    assert {trace.name: len(trace.y) for trace in lines.data} == per_rank
    assert {t for t, _ in _traces(lines)} == {"scatter"}
    waits = figures.collective_waits(summary)
    assert [t for t, _ in _traces(waits)] == ["heatmap"]
    assert len(waits.data[0].z) == len(per_rank) and len(waits.data[0].z[0]) == frames.steps(summary).height


def test_straggler_and_loader_figures_draw_each_rank(sources):
    """Stragglers: caused wait and compute per step, a bar per rank; the stall, a bar
    trace per loader with a bar per rank."""
    _, summary = sources["ranks"]
    ranks = frames.stragglers(summary)
    fig = figures.stragglers(summary)
    assert [t for t, _ in _traces(fig)] == ["bar", "bar"]
    assert list(fig.data[0].x) == ranks.get_column("unit").to_list()
    assert list(fig.data[0].y) == [us / 1000 for us in ranks.get_column("caused_wait_us_per_step")]
    assert list(fig.data[1].y) == [us / 1000 for us in ranks.get_column("compute_us_per_step")]
    stall = figures.data_loader_stall(summary)
    per_rank = frames.dataloader(summary, per_rank=True)
    assert [trace.name for trace in stall.data] == [f"{c}/{n}" for c, n in frames.dataloader(summary).select(
        "cat", "loader").rows()]
    assert sorted(stall.data[0].x) == sorted(per_rank.get_column("rank"))


def test_time_figures_draw_each_process_and_name(sources):
    """The breakdown: a bar trace per activity with exclusive time, then overlap and
    idle, a bar per process each; self time: the names by self time; a histogram per
    distribution."""
    _, summary = sources["ranks"]
    per_process = frames.breakdown(summary, per_process=True)
    fig = figures.time_breakdown(summary)
    active = [g for g in GROUPS if per_process.get_column(f"{g}_exclusive_us").sum()]
    assert len(fig.data) == len(active) + 2
    assert all(list(trace.y) == per_process.get_column("label").to_list() for trace in fig.data)
    assert list(fig.data[-1].x) == [us / 1000 for us in per_process.get_column("idle_us")]
    names = figures.self_time_by_name(summary)
    leaves = (frames.categories(summary).filter((pl.col("cat") != "pipeline") & ~pl.col("name").str.ends_with(".block"))
              .sort("self_us", descending=True, maintain_order=True))
    assert list(names.data[0].y) == [f"{c}/{n}" for c, n in leaves.select("cat", "name").head(20).rows()]
    assert len(figures.duration_distributions(summary).data) == len(summary.distributions)


def test_gpu_and_io_figures(sources):
    """GPU time: compute, non-compute and idle, a bar per device; streams: a trace per
    stream with a bar per busy interval; I/O: read and written lines over the timeline."""
    _, summary = sources["gpu"]
    gpu = frames.gpu(summary)
    fig = figures.gpu_time(summary)
    assert [trace.name for trace in fig.data] == ["compute", "non-compute", "idle"]
    assert list(fig.data[0].x) == [us / 1000 for us in gpu.get_column("compute_us")]
    lanes = [lane for g in summary.gpu for lane in g["streams"]]
    streams = figures.gpu_streams(summary)
    assert [len(trace.x) for trace in streams.data] == [len(lane["busy"]) for lane in lanes] and lanes
    _, summary = sources["io"]
    io = figures.io_over_time(summary)
    assert [(t, trace.name, len(trace.x)) for t, trace in _traces(io)] == [
        ("scatter", name, len(summary.io["timeline"]["read_bytes"])) for name in ("read", "written")]


@pytest.mark.parametrize("name", figures.__all__)
def test_a_figure_with_nothing_to_show_is_none(name, sources):
    """Nothing to draw gives None: an empty summary for every figure; the one-process
    demo for stragglers, waits, GPU and file I/O."""
    build = getattr(figures, name)
    assert build(Summary.from_dict({})) is None
    _, demo = sources["demo"]
    drawn = build(demo)
    if name in ("stragglers", "collective_waits", "gpu_time", "gpu_streams", "io_over_time"):
        assert drawn is None
    else:
        assert drawn is not None and drawn.data


def test_a_summary_shows_its_tables_in_a_notebook(sources):
    """The notebook form of a summary holds the steps, the names and the stragglers."""
    _, summary = sources["ranks"]
    page = summary._repr_html_()
    assert page.count("<table>") == 3
    assert f"<td>{summary.step_stats['count']}</td>" in page
    assert all(f"<td>{unit}</td>" in page for unit in frames.stragglers(summary).get_column("unit"))
    _, demo = sources["demo"]
    assert demo._repr_html_().count("<table>") == 2


def test_the_modules_load_on_first_use():
    """``import dftrace.analysis`` loads neither polars nor plotly; the frames load
    polars, and plotly waits for the first figure."""
    program = ("import sys, dftrace.analysis\n"
               "assert 'polars' not in sys.modules\n"
               "from dftrace.analysis import figures, frames\n"
               "assert 'polars' in sys.modules and 'plotly' not in sys.modules\n"
               "print(frames.__name__, figures.__name__)")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["dftrace.analysis.render.frames", "dftrace.analysis.render.figures"]
