"""The C interval sweeps and step model (``_sweeps.c``) give the numpy ones' answers,
malformed spans included.

Each test runs one sweep both ways on many random inputs (a fixed seed): with the C
kernels, and with ``kernels.C`` set to None (what an
install without a compiler runs), and compares the answers exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _requirements import native_scanner_missing, needs_marks

pl = pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

import numpy as np  # noqa: E402
from polars.testing import assert_frame_equal  # noqa: E402

from dftrace.analysis import summarize  # noqa: E402
from dftrace.analysis.answers import steps as step_answers  # noqa: E402
from dftrace.analysis.reduce import busy as _busy, steps as _steps  # noqa: E402
from dftrace.analysis.reduce.aggregate import nesting_edges, self_time_intervals  # noqa: E402
from dftrace.analysis.runtime import kernels  # noqa: E402

pytestmark = needs_marks("native", native_scanner_missing())

DATA = Path(__file__).resolve().parents[1] / "data"

#: Shapes of a thread's spans: well nested, and each way a file can be malformed.
SHAPES = ("nested", "identical", "overlapping", "zero-length", "odd-levels", "reversed", "chaos")


def _nested(rng: np.random.Generator, budget: int) -> list[list[int]]:
    """Well-nested spans (start, end, level) of one thread, levels from 1."""
    rows: list[list[int]] = []

    def fill(start: int, end: int, level: int) -> None:
        t = start
        while t < end and len(rows) < budget:
            s = t + int(rng.integers(0, 3))
            if s >= end:
                return
            e = min(end, s + int(rng.integers(1, 40)))
            rows.append([s, e, level])
            if level < 6 and rng.random() < 0.5:
                fill(s, e, level + 1)
            t = e

    fill(0, 10 * budget, 1)
    return rows


def _threads(rng: np.random.Generator) -> pl.DataFrame:
    """tid, ts, end, level, group of a process's spans: a few threads, each of one shape,
    its levels sometimes missing (all or some), in the order a file could hold them."""
    rows: list[list] = []
    for tid in rng.choice([0, 5, -3, 1 << 40], size=int(rng.integers(1, 4)), replace=False).tolist():
        spans = _nested(rng, int(rng.integers(1, 40)))
        shape = SHAPES[int(rng.integers(len(SHAPES)))]
        far = 10 * len(spans) + 5
        for _ in range(int(rng.integers(1, 6))):
            s = int(rng.integers(0, far))
            if shape == "identical" and spans:
                spans.append(list(spans[int(rng.integers(len(spans)))]))
            elif shape == "overlapping":
                spans.append([s, s + int(rng.integers(1, 50)), int(rng.integers(1, 4))])
            elif shape == "zero-length":
                spans.append([s, s, int(rng.integers(1, 4))])
            elif shape == "reversed":
                spans.append([s, s - int(rng.integers(1, 30)), int(rng.integers(1, 4))])
            elif shape == "chaos":
                spans.append([s, s + int(rng.integers(-5, 60)), int(rng.integers(-3, 6))])
        if shape == "odd-levels":
            for span in spans:
                if rng.random() < 0.3:
                    span[2] = int(rng.integers(-3, 8))
        missing = rng.random()
        for span in spans:
            if missing < 0.25 or (missing < 0.35 and rng.random() < 0.3):
                span[2] = None
            rows.append([tid, *span])
    rows = [rows[i] for i in rng.permutation(len(rows))]
    return pl.DataFrame(
        {"tid": [r[0] for r in rows], "ts": [r[1] for r in rows], "end": [r[2] for r in rows],
         "level": [r[3] for r in rows],
         "group": [None if rng.random() < 0.2 else int(rng.integers(0, 5)) for _ in rows]},
        schema={"tid": pl.Int64, "ts": pl.Int64, "end": pl.Int64, "level": pl.Int64, "group": pl.Int8},
    )


def _both_ways(monkeypatch, sweep, *args):
    answer = sweep(*args)
    with monkeypatch.context() as patch:
        patch.setattr(kernels, "C", None)
        return answer, sweep(*args)


def test_innermost_painting_matches_numpy_on_random_and_malformed_spans(monkeypatch):
    rng = np.random.default_rng(2026)
    tied = untied = 0
    for i in range(800):
        threads = _threads(rng)
        if i % 4 == 0:  # times far apart: a thread and a start no longer fit one 64-bit key of the sort
            threads = threads.with_columns(pl.col("ts") * (1 << 26), pl.col("end") * (1 << 26))
        (c_intervals, c_self, *_), (np_intervals, np_self, *_) = _both_ways(monkeypatch, _busy.innermost_intervals,
                                                                         threads)
        np.testing.assert_array_equal(c_self, np_self)
        with monkeypatch.context() as patch:  # the same union of each group's time, the groups in the same order
            patch.setattr(kernels, "C", None)
            assert_frame_equal(_busy.union_intervals(c_intervals, []), _busy.union_intervals(np_intervals, []))
        if threads.select(pl.struct("tid", "ts", "end").is_duplicated().any()).item():
            tied += 1  # spans with the same times: the kernel takes polars' order
        else:
            untied += 1  # the kernel sorts
    assert tied > 50 and untied > 50


def test_nesting_edges_found_by_the_sweep_match_the_query(monkeypatch):
    """The orphans and openers the C painting finds as it passes are those the polars
    query finds, on the same random and malformed threads (ties of start included)."""
    rng = np.random.default_rng(7)
    found = wide = 0
    for i in range(600):
        threads = _threads(rng)
        if i % 50 == 0:  # levels spread far wider than the spans are many: left to the query
            threads = threads.with_columns(pl.when(pl.col("level") == 2).then(1 << 40).otherwise(pl.col("level"))
                                           .alias("level"))
        spans = threads.with_columns(pl.lit("compute").alias("cat"), pl.format("n{}", pl.col("ts")).alias("name"))
        painting = self_time_intervals(spans)
        if painting.orphan is None:
            wide += 1
            continue
        found += 1
        swept = pl.collect_all(nesting_edges(spans, painting))
        queried = pl.collect_all(nesting_edges(spans, painting._replace(orphan=None, opener=None)))
        for mine, theirs in zip(swept, queried):
            assert_frame_equal(mine.sort(pl.all()), theirs.sort(pl.all()))
    assert found > 400 and wide >= 5


def _intervals(rng: np.random.Generator, keys: list[str]) -> pl.DataFrame:
    n = int(rng.integers(1, 60))
    starts = rng.integers(0, 200, n)
    if rng.random() < 0.3:
        starts = np.sort(starts)  # sorted by start, as most unions are
    frame = pl.DataFrame({
        "pid": rng.integers(0, 3, n) if rng.random() < 0.7 else np.full(n, 7),
        "host_key": pl.Series([("a", "b", None)[i] for i in rng.integers(0, 3, n)], dtype=pl.String),
        "group": rng.integers(0, 5, n).astype(np.int8),
        "start": starts,
        "end": starts + rng.integers(-3 if rng.random() < 0.2 else 0, 30, n),
    })
    return frame.select(*keys, "group", "start", "end")


@pytest.mark.parametrize("keys", [[], ["pid"], ["pid", "host_key"]])
def test_union_matches_numpy(monkeypatch, keys):
    rng = np.random.default_rng(len(keys))
    for _ in range(250):
        frame = _intervals(rng, keys)
        native, numpy = _both_ways(monkeypatch, _busy.union_intervals, frame, keys)
        assert_frame_equal(native, numpy)


def test_mask_times_and_alone_intervals_match_numpy(monkeypatch):
    rng = np.random.default_rng(5)
    for i in range(400):
        frame = _intervals(rng, [])
        if i % 2:  # disjoint within each group, as after a union; else overlapping
            frame = _busy.union_intervals(frame, [])
        native, numpy = _both_ways(monkeypatch, _busy.mask_times, frame)
        np.testing.assert_array_equal(native, numpy)
        by_proc = frame.with_columns(pl.lit(1, pl.Int32).alias("proc"))
        for group in _busy.GROUPS:
            native, numpy = _both_ways(monkeypatch, _busy.overlap_and_alone, by_proc, group)
            assert_frame_equal(native[1], numpy[1])


def test_pieces_swept_together_match_their_union_swept(monkeypatch):
    """A process read in parts: its pieces' intervals (each piece's unioned per group,
    or not), swept together as they are, give the overlap times, the blocked runs and
    the compute runs that their union swept gives (the numpy sweep)."""
    rng = np.random.default_rng(11)
    swept = 0
    for i in range(300):
        pieces = [_intervals(rng, []).filter(pl.col("end") >= pl.col("start")) for _ in range(int(rng.integers(1, 5)))]
        if i % 3:  # as a file's parts hold them; else overlapping and out of order within a piece
            pieces = [_busy.union_intervals(piece, []) for piece in pieces]
        found = _busy.swept_pieces(pieces, "comm", "compute")
        everything = pl.concat(pieces, how="vertical").with_columns(pl.lit(1, pl.Int32).alias("proc"))
        monkeypatch.setattr(kernels, "C", None)
        union = _busy.union_intervals(everything, ["proc"])
        overlap, alone = _busy.overlap_and_alone(union, "comm")
        # Zero-length intervals hold no time: the sweep leaves them out.
        compute = union.filter((pl.col("group") == _busy.GROUPS.index("compute")) & (pl.col("end") > pl.col("start")))
        monkeypatch.undo()
        totals, alone_starts, alone_ends, compute_starts, compute_ends = found
        assert_frame_equal(_busy.mask_rows(1, totals), overlap)
        assert (alone_starts.tolist(), alone_ends.tolist()) == (alone.get_column("start").to_list(),
                                                               alone.get_column("end").to_list())
        assert (compute_starts.tolist(), compute_ends.tolist()) == (compute.get_column("start").to_list(),
                                                                   compute.get_column("end").to_list())
        swept += everything.height
    assert swept > 10_000
    # An interval that ends before it starts: left to the union (None).
    reversed_piece = pl.DataFrame({"group": [0], "start": [5], "end": [4]},
                                  schema={"group": pl.Int8, "start": pl.Int64, "end": pl.Int64})
    assert _busy.swept_pieces([reversed_piece], "comm", "compute") is None


def _step_rows(rng: np.random.Generator) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Step rows (proc, epoch, step, cat, name, start, end, n) of a few processes, about
    100 µs a step: spans around several steps, reversed and zero-length spans, missing
    epochs and steps, data loading before, inside and after its step's work, processes
    with no work (DataLoader workers); and pipeline spans (proc, name, start, end)."""
    size = int(rng.integers(0, 240))
    steps = rng.integers(0, max(2, size // 4), size)
    start = steps * 100 + rng.integers(-150, 150, size)
    length = rng.integers(-5, 60, size)
    enclosing = rng.random(size) < 0.04
    length[enclosing] = rng.integers(150, 1200, int(enclosing.sum()))
    cats = np.array(["compute", "comm", "device", "checkpoint", "data", "dataloader"])
    proc = rng.integers(0, 3, size).astype(np.int32)
    cat = cats[rng.integers(0, cats.size, size)]
    cat[proc == 2] = "dataloader"  # a process of data loading alone
    epoch = pl.Series("epoch", rng.integers(0, 3, size)).scatter(np.flatnonzero(rng.random(size) < 0.05), None)
    step = pl.Series("step", steps).scatter(np.flatnonzero(rng.random(size) < 0.05), None)
    rows = pl.DataFrame({"proc": proc, "epoch": epoch, "step": step, "cat": cat,
                         "name": [f"n{i}" for i in rng.integers(0, 4, size)], "start": start, "end": start + length,
                         "n": rng.integers(1, 5, size)})
    n_cuts = int(rng.integers(0, 10))
    kind = rng.random(n_cuts)
    between = kind < 0.4  # checkpoints between steps, loaders' passes' ends, the others pipeline spans
    cut_start = rng.integers(-100, size * 25 + 100, n_cuts)
    # Pipeline spans that cut steps, not evaluations (``fmt.EVALUATION_NAMES``), whose
    # rows are no step's: tests/analysis/test_step_model.py holds those; random rows
    # would straddle their edges, which real steps do not.
    containers = pl.DataFrame({"proc": rng.integers(0, 3, n_cuts).astype(np.int32),
                               "name": np.where(between, "capture", np.where(kind < 0.7, "fetch.end", "train")),
                               "start": cut_start, "end": cut_start + rng.integers(0, 400, n_cuts),
                               "after_work": between})
    return rows, containers


def test_step_model_matches_numpy(monkeypatch):
    rng = np.random.default_rng(11)
    shortened = placed = by_checkpoints = by_passes = 0
    for _ in range(400):
        rows, containers = _step_rows(rng)
        native, numpy = _both_ways(monkeypatch, _steps.model_steps, rows, containers)
        assert_frame_equal(native, numpy)
        placed += native.height
        # A step ended by a pipeline span, or before its work's last span by the next step.
        shortened += native.filter(pl.col("end") < pl.col("start").shift(-1).over("proc")).height
        checkpoints = containers.filter("after_work").get_column("start")
        by_checkpoints += native.filter(pl.col("end").is_in(checkpoints.implode())
                                        & (pl.col("end") < pl.col("start").shift(-1).over("proc"))).height
        by_passes += native.filter(pl.col("end").is_in(
            containers.filter(pl.col("name") == "fetch.end").get_column("start").implode())).height
    assert placed > 5000 and shortened > 100 and by_checkpoints > 20 and by_passes > 20, (
        placed, shortened, by_checkpoints, by_passes)


@pytest.mark.parametrize("numbers, steps", [
    # Numbered on across epochs: the step that epoch 0's end cut in two is epoch 1's.
    ([(0, 0), (0, 1), (0, 2), (1, 2), (1, 3)], [(0, 0), (0, 1), (1, 2), (1, 3)]),
    ([(0, 0), (0, 1), (0, 2), (1, 2), (1, 3), (1, 4), (2, 4)], [(0, 0), (0, 1), (1, 2), (1, 3), (2, 4)]),
    # Numbered from 0 in each epoch, one step or more an epoch: nothing is joined.
    ([(0, 0), (1, 0), (2, 0)], [(0, 0), (1, 0), (2, 0)]),
    ([(0, 0), (0, 1), (1, 0), (1, 1)], [(0, 0), (0, 1), (1, 0), (1, 1)]),
])
def test_a_step_that_an_epoch_end_cuts_in_two_is_one_step(numbers, steps):
    rows = pl.DataFrame([(0, epoch, step, "compute", "forward", 100 * i, 100 * i + 50, 1)
                         for i, (epoch, step) in enumerate(numbers)], orient="row",
                        schema={"proc": pl.Int32, "epoch": pl.Int64, "step": pl.Int64, "cat": pl.String,
                                "name": pl.String, "start": pl.Int64, "end": pl.Int64, "n": pl.Int64})
    containers = pl.DataFrame(schema={"proc": pl.Int32, "name": pl.String, "start": pl.Int64, "end": pl.Int64,
                                      "after_work": pl.Boolean})
    modelled = _steps.model_steps(rows, containers)
    assert list(modelled.select("epoch", "step").iter_rows()) == steps


def test_steps_from_each_steps_work_merged_are_the_same():
    """A file's work rows merged into one a step (``work_merged``) give the steps its
    rows a name give, wherever no merged row holds two other steps' starts; where one
    does, ``merged_work_encloses`` says so (and the file's rows are read unmerged)."""
    rng = np.random.default_rng(17)
    same = enclosing = 0
    for _ in range(900):
        rows, containers = _step_rows(rng)
        merged = _steps.work_merged(rows, ["proc"])
        expected = _steps.model_steps(rows, containers)
        if _steps.merged_work_encloses(merged, ["proc"]):
            enclosing += 1
            continue
        assert merged.height <= rows.height
        # The processes may come in another order; each one's steps are the same.
        assert_frame_equal(_steps.model_steps(merged, containers).sort("proc", maintain_order=True),
                           expected.sort("proc", maintain_order=True))
        same += 1
    # Both kinds are met (these rows' steps overlap far more than a training loop's).
    assert same > 80 and enclosing > 80, (same, enclosing)


def _rank_steps(rng: np.random.Generator) -> pl.DataFrame:
    """unit, unit_order, epoch, step, start, dur: each rank's steps, a random subset of
    a run's steps each (missing epochs and steps among them), durations drawn from a
    few values so that ranks tie, up to 60 ranks a step."""
    n_units = int(rng.integers(1, 61))
    orders = rng.choice(np.arange(-50, 50), size=n_units, replace=False)
    keys = [(e, s) for e in [None, 0, 3] for s in [None, *range(int(rng.integers(1, 12)))]]
    rows = []
    for unit, order in enumerate(orders.tolist()):
        for epoch, step in keys:
            if rng.random() < 0.7:
                rows.append((f"r{unit}", order, epoch, step, int(rng.integers(-500, 500)), int(rng.integers(0, 6))))
    return pl.DataFrame(rows, orient="row", schema={"unit": pl.String, "unit_order": pl.Int64, "epoch": pl.Int64,
                                                     "step": pl.Int64, "start": pl.Int64, "dur": pl.Int64})


@pytest.mark.parametrize("numbering", ["dense", "sparse"])
def test_steps_compared_across_ranks_match_the_query(monkeypatch, numbering):
    """The C kernel orders the rank-steps by a count of their steps' codes where the
    step numbers are near one another, else by a radix sort (step numbers far apart)."""
    rng = np.random.default_rng(5)
    steps = tied = wide = 0
    for _ in range(300):
        by_unit = _rank_steps(rng)
        if numbering == "sparse":
            by_unit = by_unit.with_columns(pl.col("step") * 1_000_003)
        native, query = _both_ways(monkeypatch, step_answers.steps_across_units, by_unit)
        assert_frame_equal(native, query)
        steps += native.height
        longest = by_unit.group_by("epoch", "step").agg((pl.col("dur") == pl.col("dur").max()).sum().alias("k"))
        tied += longest.filter(pl.col("k") > 1).height  # the slowest rank picked among ties
        wide += native.filter(pl.col("ranks") > 32).height
    assert steps > 3000 and tied > 1000 and wide > 100


@pytest.mark.parametrize("rows", ["by unit", "units apart"])
def test_each_units_statistics_from_its_slice_match_a_group_by(rows):
    """Each rank's step statistics (``step_answers._per_unit``) are found over its slice
    of the rank-steps where a rank's rows come together, else grouped: the same
    figures either way."""
    rng = np.random.default_rng(3)
    units = 0
    for _ in range(100):
        by_unit = _rank_steps(rng)
        if rows == "units apart":
            by_unit = by_unit.sample(fraction=1.0, shuffle=True, seed=int(rng.integers(1 << 30)))
        stats = step_answers._plain_stats()[:-1]
        found = step_answers._per_unit(by_unit, stats).sort("unit")
        assert_frame_equal(found, by_unit.group_by("unit", "unit_order").agg(stats).sort("unit"))
        units += found.height
    assert units > 1000


@pytest.mark.parametrize("source", ["run", "gpu-h200", "dftracer", "ddp-buckets"])
def test_summary_is_the_same_with_the_numpy_sweeps(monkeypatch, run_dir, source):
    # gpu-h200 holds spans of one thread with the same times; dftracer's files have no levels.
    path = run_dir if source == "run" else DATA / source
    native, numpy = _both_ways(monkeypatch, _summary_json, path)
    assert native == numpy


def _summary_json(path) -> str:
    """The summary as JSON, less the name of the kernels that made it."""
    summary = summarize(path, index=False, progress=False)
    assert summary.overview.pop("kernels") == kernels.name()
    return summary.to_json()
