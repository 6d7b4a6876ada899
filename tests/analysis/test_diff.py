"""dftrace diff: two runs side by side, changes beyond noise flagged, CI's exit code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tracegen

pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from dftrace.analysis.commands import main  # noqa: E402
from dftrace.analysis.answers.diff import compare_runs  # noqa: E402

#: µs added to every backward pass of the NEW run.
SLOWER_BACKWARD_US = 300


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """BASE: two ranks; NEW: the same with every backward pass 300 µs slower."""
    base = tmp_path_factory.mktemp("base")
    new = tmp_path_factory.mktemp("new")
    tracegen.write_run(base, ranks=2)
    slow = {(r, e, s): SLOWER_BACKWARD_US for r in range(2) for e in range(2) for s in range(4)}
    tracegen.write_run(new, ranks=2, slow=slow)
    return base, new


def _diff_json(capsys, *args: str) -> tuple[int, dict]:
    code = main(["diff", *args, "--json", "--no-progress"])
    return code, json.loads(capsys.readouterr().out)


def test_planted_regression_is_flagged_and_first(runs, capsys):
    """A slower backward pass flags backward's time and the step time, ranked by their
    effect on step time; unchanged names are not flagged."""
    code, data = _diff_json(capsys, str(runs[0]), str(runs[1]))
    assert code == 0
    rows = {r["metric"]: r for r in data["rows"]}
    backward = rows["compute.backward.mean"]
    assert (backward["base"], backward["new"]) == (tracegen.BACKWARD_US, tracegen.BACKWARD_US + SLOWER_BACKWARD_US)
    assert backward["change"] == SLOWER_BACKWARD_US and backward["relative"] == 1.5
    assert backward["flagged"] and backward["impact_us"] == SLOWER_BACKWARD_US
    step = rows["step.p50"]
    assert step["new"] - step["base"] == SLOWER_BACKWARD_US and step["flagged"]
    for unchanged in ("compute.forward.mean", "compute.forward.count", "comm.all_reduce.p95", "events.dropped"):
        assert not rows[unchanged]["flagged"], unchanged
    # Sorted by impact on step time: the rows that explain the +300 µs per step come first,
    # figures that moved but cost no step time (shares of time) after them.
    impacts = [rows[m]["impact_us"] for m in data["flagged"]]
    assert impacts == sorted(impacts, key=abs, reverse=True)
    top = data["flagged"][:6]
    assert {"compute.backward.total", "compute.backward.mean", "step.p50"} <= set(top)
    assert "compute.forward.mean" not in data["flagged"]


def test_text_lists_flagged_rows_before_the_sections(runs, capsys):
    """The terminal output starts with the flagged rows, then every section's table."""
    assert main(["diff", str(runs[0]), str(runs[1]), "--no-progress"]) == 0
    out = capsys.readouterr().out
    flagged = out[out.index("Changed beyond 5%"):out.index("Step time (all ranks and steps)")]
    first = flagged.splitlines()[4]
    assert first.split()[0].startswith(("compute.backward", "step.")) and "+300 us/step" in first
    # A name is one line: the slower backward's mean leads, its other figures are "also".
    names = [line.split()[0] for line in flagged.splitlines()[4:] if line.startswith("  ") and "." in line.split()[0]]
    backward = [name for name in names if name.startswith("compute.backward.")]
    assert backward == ["compute.backward.mean"], names
    line = next(line for line in flagged.splitlines() if line.split()[:1] == ["compute.backward.mean"])
    assert "total +150.0%" in line
    for title in ("Step time", "Epochs", "Per category and name", "Time breakdown", "Data-loader stall",
                  "Stragglers", "Events"):
        assert f"\n{title}" in out
    forward = next(line for line in out.splitlines() if line.split()[:1] == ["compute.forward.mean"])
    assert forward.split()[1:5] == ["100", "us", "100", "us"] and "*" not in forward


def test_threshold_decides_what_is_noise(runs, capsys):
    """--threshold 100%: backward (+150 %) is still flagged, the step time (+67 %) is not."""
    _, data = _diff_json(capsys, str(runs[0]), str(runs[1]), "--threshold", "100%")
    assert data["threshold"] == 1.0
    assert "compute.backward.mean" in data["flagged"] and "step.p50" not in data["flagged"]


def test_fail_on_regression_exit_code(runs, capsys):
    """--fail-on-regression exits 1 when step p50 got worse by more than PCT, else 0; the
    JSON says why."""
    code, data = _diff_json(capsys, str(runs[0]), str(runs[1]), "--fail-on-regression", "10%")
    assert code == 1
    assert data["regression"]["failed"] and data["regression"]["metric"] == "step.p50"
    assert "step.p50 got worse by" in data["regression"]["reason"]
    code, data = _diff_json(capsys, str(runs[0]), str(runs[1]), "--fail-on-regression", "90")
    assert code == 0 and not data["regression"]["failed"]
    # Faster is never a regression.
    code, _ = _diff_json(capsys, str(runs[1]), str(runs[0]), "--fail-on-regression", "1%")
    assert code == 0


def test_metric_chooses_the_guarded_figure(runs, capsys):
    """--metric guards another figure: forward did not change, backward did; an unknown
    key is an error (exit 2) that lists the known ones."""
    base, new = str(runs[0]), str(runs[1])
    assert main(["diff", base, new, "--fail-on-regression", "5%", "--metric", "compute.forward.mean"]) == 0
    assert main(["diff", base, new, "--fail-on-regression", "5%", "--metric", "compute.backward.p95"]) == 1
    capsys.readouterr()
    assert main(["diff", base, new, "--fail-on-regression", "5%", "--metric", "no.such"]) == 2
    err = capsys.readouterr().err
    assert "'no.such' is not a figure both runs have" in err and "compute.backward.p95" in err


def test_the_cli_exit_code_in_a_pipeline(runs):
    """The installed command exits 1 on a regression, as a CI step sees it."""
    result = subprocess.run(
        [sys.executable, "-m", "dftrace", "diff", str(runs[0]), str(runs[1]), "--fail-on-regression", "10%"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert result.returncode == 1
    # backward moved against the rest of its steps: the step is judged by its part
    assert "regression: step.p50 got worse by" in result.stderr and "(moved: compute.backward" in result.stderr
    assert "(445 us -> 745 us, +67.4% as measured;" in result.stderr


def test_different_numbers_of_ranks_compare_per_rank(tmp_path, capsys):
    """Two ranks against four doing the same work per rank: counts are per rank and
    nothing is flagged."""
    for name, ranks in (("two", 2), ("four", 4)):
        (tmp_path / name).mkdir()
        tracegen.write_run(tmp_path / name, ranks=ranks)
    code, data = _diff_json(capsys, str(tmp_path / "two"), str(tmp_path / "four"))
    assert code == 0
    assert (data["base"]["ranks"], data["new"]["ranks"]) == (2, 4)
    rows = {r["metric"]: r for r in data["rows"]}
    assert rows["compute.forward.count"]["base"] == rows["compute.forward.count"]["new"] == 8
    assert rows["compute.forward.count"]["note"] == "per rank"
    assert data["flagged"] == []


def test_dftracer_traces_compare(samples, tmp_path, runs, capsys):
    """DFTracer's files compare with a copy of themselves (nothing changed) and with a
    dftrace run (names only one run has are flagged as such)."""
    original = samples / "dftracer-2.2.0_meta"
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    code, data = _diff_json(capsys, str(original), str(copy))
    assert code == 0 and data["flagged"] == []
    assert data["base"]["events"] == data["new"]["events"] > 0
    assert all(r["change"] in (0, None) for r in data["rows"])
    code, data = _diff_json(capsys, str(original), str(runs[0]))
    rows = {r["metric"]: r for r in data["rows"]}
    assert code == 0
    assert rows["checkpoint.save.mean"]["base"] is None and rows["checkpoint.save.mean"]["flagged"]
    assert rows["comm.send.mean"]["new"] is None and rows["comm.send.mean"]["flagged"]
    assert rows["comm.send.count"]["new"] == 0 and "comm.send.count" in data["flagged"]


LOADER = textwrap.dedent("""
    import sys, time
    import dftrace
    from dftrace import ai

    dftrace.initialize(log_file=sys.argv[1])
    wait = float(sys.argv[2])

    def batches():
        for i in range(20):
            time.sleep(wait)               # the loader's time: the step waits for it
            yield i

    for step in ai.dataloader.fetch.iter(batches()):
        ai.update(epoch=0, step=step)
        with ai.compute.forward:
            time.sleep(0.004)
    dftrace.finalize()
""")


def test_extra_data_loader_stall_in_a_real_run(tmp_path, capsys):
    """A real traced loop whose loader got slower: the stall and fetch.iter are flagged,
    forward (same work) is not, and step time fails the guard."""
    script = tmp_path / "loop.py"
    script.write_text(LOADER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for name, wait in (("base", "0"), ("new", "0.02")):
        subprocess.run([sys.executable, str(script), str(tmp_path / name / "run"), wait], check=True, env=env)
    code, data = _diff_json(capsys, str(tmp_path / "base"), str(tmp_path / "new"), "--fail-on-regression", "50%")
    rows = {r["metric"]: r for r in data["rows"]}
    assert code == 1
    stall = rows["stall.dataloader.fetch"]
    assert stall["flagged"] and stall["new"] > 0.5 > stall["base"]
    assert rows["dataloader.fetch.iter.mean"]["flagged"] and rows["dataloader.fetch.iter.mean"]["new"] >= 20_000
    assert not rows["compute.forward.count"]["flagged"]
    assert data["flagged"].index("dataloader.fetch.iter.total") < data["flagged"].index("breakdown.compute")


WORKERS = textwrap.dedent("""
    import multiprocessing, sys
    import dftrace
    from dftrace import ai

    def load(i):
        with ai.data.item(args={"i": i}):
            pass

    if __name__ == "__main__":
        dftrace.initialize(log_file=sys.argv[1])
        workers = [multiprocessing.get_context("fork").Process(target=load, args=(i,))
                   for i in range(int(sys.argv[2]))]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        for step in ai.dataloader.fetch.iter(range(20)):
            ai.update(epoch=0, step=step)
            with ai.compute.forward:
                pass
        dftrace.finalize()
""")


def test_more_workers_do_not_make_a_run_of_more_ranks(tmp_path, capsys):
    """The same one-process job with 2 and then 4 worker processes of its own (as
    DataLoader workers): the job's counts compare as they are, not divided among its
    processes, and none of them is flagged."""
    script = tmp_path / "workers.py"
    script.write_text(WORKERS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for name, workers in (("base", "2"), ("new", "4")):
        subprocess.run([sys.executable, str(script), str(tmp_path / name / "run"), workers], check=True, env=env)
    code, data = _diff_json(capsys, str(tmp_path / "base"), str(tmp_path / "new"))
    assert (data["base"]["processes"], data["new"]["processes"]) == (3, 5)
    rows = {r["metric"]: r for r in data["rows"]}
    assert rows["compute.forward.count"]["base"] == rows["compute.forward.count"]["new"] == 20
    assert rows["compute.forward.count"]["note"] == ""
    assert "compute.forward.count" not in data["flagged"]


def test_one_rank_slower_fails_the_guard(tmp_path, capsys):
    """Rank 1 of 3 takes 2 ms more in every step's backward pass, the other ranks
    nothing more: no machine slows one rank alone, so the step's mean fails the guard
    (the names' median speed, the slower backward's, explained it away)."""
    for name, slow in (("base", {}), ("new", {(1, e, s): 2_000 for e in range(2) for s in range(4)})):
        (tmp_path / name).mkdir()
        tracegen.write_run(tmp_path / name, ranks=3, slow=slow)
    code, data = _diff_json(capsys, str(tmp_path / "base"), str(tmp_path / "new"), "--fail-on-regression", "5%",
                            "--metric", "step.mean")
    assert code == 1
    least, most = data["ranks_apart"]
    assert least == 1.0 and most > 1.5
    assert data["speed"] <= least


def test_compare_runs_from_python(runs):
    """The Python API gives the same rows as the command."""
    diff = compare_runs(runs[0], runs[1], threshold=0.05)
    assert diff.row("compute.backward.mean").change == SLOWER_BACKWARD_US
    assert diff.regression("step.p50", 0.10) is not None
    assert diff.regression("compute.forward.mean", 0.0) is None


def _recorded_run(directory: Path, ms: dict[str, float], steps: int = 64) -> None:
    """One process whose steps are fetch, forward, backward and optimizer spans of
    the given lengths (ms, with a little spread), recorded at made-up times."""
    from dftrace import ai, testing

    nodes = {"fetch": ai.dataloader.fetch, "forward": ai.compute.forward,
             "backward": ai.compute.backward, "step": ai.compute.step}
    with testing.trace_to(directory):
        t = 1_000_000_000
        for k in range(steps):
            for name, node in nodes.items():
                dur = int(ms[name] * 1e6 * (1 + 0.03 * ((k * 7 + len(name)) % 5 - 2) / 2))
                node.record(t, t + dur, {"step": k})
                t += dur + 20_000


def test_a_faster_run_is_never_called_worse(tmp_path):
    """NEW's step is 39% shorter (every name but forward took half as long): no step
    figure is flagged as worse and no regression is found, though forward's share of
    the step grew against the rest of it."""
    base, new = tmp_path / "base", tmp_path / "new"
    _recorded_run(base, {"fetch": 0.5, "forward": 1.0, "backward": 2.0, "step": 1.0})
    _recorded_run(new, {"fetch": 0.25, "forward": 1.0, "backward": 1.0, "step": 0.5})
    diff = compare_runs(str(base), str(new))
    p50 = diff.row("step.p50")
    assert p50.change < 0 and p50.relative < -0.3
    for metric in ("step.p50", "step.p95", "step.mean"):
        assert diff.regression(metric, 0.05) is None, diff.regression(metric, 0.05)
    assert not any(r.flagged and r.section == "steps" and r.change > 0 for r in diff.rows)


@pytest.mark.parametrize("slowed", [("forward", "backward"), ("backward",)])
def test_a_slower_step_fails_the_guard_where_the_machine_s_speed_is_unknown(tmp_path, slowed):
    """Two names hold the step (too few to tell the machine's speed from): every one of
    them 1.5x as long, or all but forward. The step is 30-50% longer and fails the
    guard; it was explained away as the machine's (every name moved alike; or forward,
    which did not change, "moved" against the rest), though no speed was measured."""
    base, new = tmp_path / "base", tmp_path / "new"
    ms = {"fetch": 0.001, "forward": 5.0, "backward": 3.0, "step": 0.001}
    _recorded_run(base, ms)
    _recorded_run(new, {name: v * (1.5 if name in slowed else 1.0) for name, v in ms.items()})
    diff = compare_runs(str(base), str(new))
    assert diff.speed is None
    p50 = diff.row("step.p50")
    truth = 0.5 * sum(ms[name] for name in slowed) / sum(ms.values())  # the steps' own lengths, less gaps
    assert p50.flagged and abs(p50.relative - truth) < 0.02, (p50, truth)
    assert diff.regression("step.p50", 0.05) is not None


def test_a_step_every_name_of_which_slowed_alike_passes_the_guard_saying_why(tmp_path, capsys):
    """Every name 1.5x as long, enough names to time the machine: with one run per side
    that is a machine 1.5x slower as much as slower code, and the guard passes; it says
    so on stderr (and in --json) instead of passing in silence."""
    base, new = tmp_path / "base", tmp_path / "new"
    ms = {"fetch": 0.5, "forward": 1.0, "backward": 2.0, "step": 1.0}
    _recorded_run(base, ms)
    _recorded_run(new, {name: v * 1.5 for name, v in ms.items()})
    assert main(["diff", str(base), str(new), "--fail-on-regression", "5%", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "dftrace diff: no regression, but: step.p50 grew by 4" in err
    assert "every name took 1.5" in err and "compare several runs per side" in err
    code, data = _diff_json(capsys, str(base), str(new), "--fail-on-regression", "5%")
    assert code == 0 and data["regression"]["failed"] is False
    assert data["regression"]["explained"].startswith("step.p50 grew by 4")


def test_a_few_microseconds_are_no_change(tmp_path):
    """A name recorded twice, 2 µs each in BASE and 1 µs in NEW (the clock's
    resolution): its total halved on paper, and is not flagged; 100 µs more per call
    of another name is."""
    from dftrace import ai, testing

    for side, tick_us, extra_us in (("base", 2, 0), ("new", 1, 100)):
        _recorded_run(tmp_path / side, {"fetch": 0.5, "forward": 1.0 + extra_us / 1000, "backward": 2.0,
                                        "step": 1.0})
        with testing.trace_to(tmp_path / side):
            for k in range(2):
                t = 2_000_000_000 + k * 1_000_000
                ai.pipeline.test.record(t, t + tick_us * 1000, {})
    diff = compare_runs(str(tmp_path / "base"), str(tmp_path / "new"))
    tick = diff.row("pipeline.test.total")
    assert (tick.base, tick.new, tick.flagged) == (4, 2, False)
    forward = diff.row("compute.forward.mean")
    assert forward.flagged and 90 <= forward.change <= 110, forward


def test_step_times_are_the_same_whatever_the_pieces(runs, tmp_path, capsys):
    """Each name's time per step, read a partition at a time (steps that straddle two
    partitions summed), is the loaded table's; ``--no-index`` is taken as summary
    takes it."""
    import numpy as np

    from dftrace.analysis import load_traces
    from dftrace.analysis.answers.step_shifts import step_times

    proc = tracegen.training_process(1000, rank=0, epochs=2, steps=300)
    tracegen.write_process(tmp_path, proc)
    whole = step_times(load_traces(tmp_path))
    assert whole.names == [("comm", "all_reduce"), ("compute", "backward"), ("compute", "forward"),
                           ("compute", "step"), ("device", "transfer")]
    assert whole.times.shape == (600, 5)
    assert whole.times[:, 1].sum() == sum(e["dur"] for e in proc.events if e["name"] == "backward")
    for partition_bytes in (2048, 16384, 16 << 20):  # 59, 8 and 1 partitions
        pieces = step_times([tmp_path], partition_bytes=partition_bytes)
        assert pieces.names == whole.names
        order = lambda t: t.times[np.lexsort(t.times.T[::-1])]  # noqa: E731 (rows in any order)
        assert np.array_equal(order(pieces), order(whole)), partition_bytes
    code, _ = _diff_json(capsys, str(runs[0]), str(runs[1]), "--no-index")
    assert code == 0


@pytest.mark.parametrize("every", [1, 3])
def test_a_straggler_s_idle_time_is_no_machine_s(tmp_path, capsys, every):
    """Rank 1 idles 20 ms outside any span in every step, or every third: no name's own
    time moves (the machine's speed stays 1: the other rank's backward and all-reduce
    grow by their wait for it, which no machine makes), and the step time grows by what
    was planted: the guard fails on step.mean (the waits made the machine 'slower', or
    the names' moves, which saw none, judged the step, and it passed)."""
    steps, idle_us = 48, 20_000
    idle_steps = set(range(0, steps, every))
    base, new = tmp_path / "base", tmp_path / "new"
    base.mkdir(), new.mkdir()
    tracegen.bucketed_run(base, steps, set(), 0, buckets=1)
    tracegen.bucketed_run(new, steps, set(), 0, buckets=1, idle={(1, step): idle_us for step in idle_steps})
    code, data = _diff_json(capsys, str(base), str(new), "--fail-on-regression", "10%", "--metric", "step.mean")
    mean = next(r for r in data["rows"] if r["metric"] == "step.mean")
    assert mean["change"] == pytest.approx(len(idle_steps) * idle_us / steps, rel=0.05)
    assert data["speed"] == pytest.approx(1.0, abs=0.02) and mean["flagged"] and code == 1


def test_a_name_that_moved_against_its_steps_is_named_so_in_the_guard_s_message(tmp_path):
    """forward 2x as long, the rest as it was: ``--metric compute.forward.mean`` fails
    the guard saying it moved against the rest of its steps, with the change as
    measured beside the part judged (before: "from names that took longer ... ()")."""
    base, new = tmp_path / "base", tmp_path / "new"
    ms = {"fetch": 0.5, "forward": 2.0, "backward": 2.0, "step": 1.0}
    _recorded_run(base, ms)
    _recorded_run(new, {**ms, "forward": 4.0})
    diff = compare_runs(str(base), str(new))
    row = diff.row("compute.forward.mean")
    why = diff.regression("compute.forward.mean", 0.10)
    assert row.noise == "names" and why is not None and "()" not in why, (row, why)
    assert "against the rest of its steps" in why and "as measured; the part judged" in why, why
    assert f"{row.relative * 100:+.1f}% as measured" in why, why
