"""A job killed by SIGTERM in step 37 and started again from its step-32 checkpoint
into the same trace directory: each run's steps are its own, checked against the
steps' starts on each process's own clock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("polars")

from dftrace.analysis import render_text, summarize  # noqa: E402
from dftrace.analysis.commands import main  # noqa: E402

JOB = os.path.join(os.path.dirname(__file__), "_resumed_job.py")


def _truth(truth_dir):
    """Per process (in start order): its steps' (epoch, step) and each step's time
    from its start to the next step's start (the last: to the loop's end)."""
    runs = []
    for name in sorted(os.listdir(truth_dir)):
        if not name.startswith("steps-"):
            continue
        with open(os.path.join(truth_dir, name)) as f:
            rows = [json.loads(line) for line in f]
        steps = [r for r in rows if "step" in r]
        ends = [r["start_ns"] for r in steps[1:]] + [rows[-1].get("end_ns")]
        runs.append({"first_ns": steps[0]["start_ns"],
                     "steps": [(r["epoch"], r["step"]) for r in steps],
                     "times_us": [(e - r["start_ns"]) / 1e3 for r, e in zip(steps, ends) if e is not None]})
    return sorted(runs, key=lambda r: r["first_ns"])


def _run_twice(tmp_path, **env_more):
    """The job killed in step 37, then resumed: the trace and truth directories."""
    out, truth = tmp_path / "traces", tmp_path / "truth"
    out.mkdir()
    truth.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DFTRACE_", "RANK", "LOCAL_RANK"))}
    env.update(env_more)
    first = subprocess.run([sys.executable, JOB, str(out), str(truth)], env=env, timeout=120)
    assert first.returncode == -signal.SIGTERM
    second = subprocess.run([sys.executable, JOB, str(out), str(truth)], env=env, timeout=120)
    assert second.returncode == 0
    return out, truth


def test_a_resumed_rank_is_two_runs_with_true_step_times(tmp_path, capsys):
    out, truth = _run_twice(tmp_path, RANK="0")
    killed, resumed = _truth(truth)
    assert killed["steps"][-1] == (1, 37) and resumed["steps"][0] == (1, 32)

    summary = summarize(out)
    # Both runs are there, the second said to be the first resumed, and where.
    assert [r["resumed"] for r in summary.runs] == [False, True]
    assert summary.runs[1]["resumed_at"] == {"epoch": 1, "step": 32}
    text = render_text(summary)
    assert "rank 0 ran twice (resumed at step 32)" in text.splitlines()[3]
    # The first run's end, by SIGTERM, is said before.
    assert text.splitlines()[2].startswith("  ended abnormally: rank 0 · ") and "killed by signal 15" in text
    assert "files are from" not in text  # one job, not separate runs
    # Every step is one step of the job; the ones run twice are counted each time.
    assert len(summary.steps) == 48
    assert len(summary.rank_steps) == 48 + (37 - 32 + 1)
    # Epoch 1's steps run twice counted each time too, as its time counts them (24 read
    # beside the time of 30).
    assert [(e["epoch"], e["steps"]) for e in summary.epochs] == [(0, 24), (1, 24 + 37 - 32 + 1)]
    # One rank in each epoch; its time in epoch 1 is what both runs spent there.
    assert [(e["ranks"], e["slowest"]) for e in summary.epochs] == [(1, "rank 0"), (1, "rank 0")]
    assert summary.imbalance["ranks"] == [] and "Rank imbalance" not in text  # one rank, run twice
    in_epoch_1 = sum(t for run in (killed, resumed) for (epoch, _), t in zip(run["steps"], run["times_us"])
                     if epoch == 1)  # all but the killed step, cut short by the signal
    longest_true = max(killed["times_us"] + resumed["times_us"])
    assert 0.95 * in_epoch_1 <= summary.epochs[1]["max_us"] <= in_epoch_1 + 2 * longest_true, summary.epochs
    # No step spans the restart: the longest is within 1.25x of the longest true one.
    assert summary.step_stats["max_us"] <= 1.25 * longest_true, (summary.step_stats, longest_true)
    # The job's time is both runs', from the first start to the last end.
    assert summary.overview["wall_us"] >= sum(r["wall_us"] for r in summary.runs)
    # The live view and diff read the runs the same way.
    assert main(["watch", str(out), "--once", "--json"]) == 0
    live = json.loads(capsys.readouterr().out)
    assert [(r["rank"], r["steps"], (r["epoch"], r["step"])) for r in live["ranks"]] == [
        ("rank 0 · run 1", 38, (1, 37)), ("rank 0 · run 2", 16, (1, 47))]
    assert max(r["step_p95_us"] for r in live["ranks"]) <= 1.25 * longest_true
    assert main(["diff", str(out), str(out), "--json", "--no-progress", "--fail-on-regression", "5%"]) == 0
    same = json.loads(capsys.readouterr().out)
    rows = {r["metric"]: r for r in same["rows"]}
    assert rows["step.count"]["base"] == 48 + (37 - 32 + 1)  # each run of a step counted
    assert rows["step.p95"]["base"] <= 1.25 * longest_true


def test_a_script_with_no_rank_run_again_is_resumed_not_a_second_rank(tmp_path):
    """The same job with no rank (a script on one machine): its second process, by the
    same command after the first ended, is the job started again, never a second
    rank beside the first; no rank imbalance is made up between the runs."""
    out, truth = _run_twice(tmp_path)
    killed, resumed = _truth(truth)
    summary = summarize(out)
    assert [r["resumed"] for r in summary.runs] == [False, True]
    assert summary.runs[1]["resumed_at"] == {"epoch": 1, "step": resumed["steps"][0][1]} == {"epoch": 1, "step": 32}
    assert summary.imbalance["steps_compared"] == 0 and summary.stragglers == []
    text = render_text(summary)
    assert "the script ran again (resumed at step 32)" in text
    # Both runs are one script: one unit in each epoch, no ranks to set side by side.
    script = f"{summary.runs[0]['hosts'][0]} · _resumed_job.py"
    assert [(e["ranks"], e["slowest"]) for e in summary.epochs] == [(1, script), (1, script)]
    assert summary.imbalance["ranks"] == [] and "Rank imbalance" not in text
    assert {s["slowest"] for s in summary.steps} == {f"{script} · run 1", f"{script} · run 2"}
    assert len(summary.rank_steps) == len(killed["steps"]) + len(resumed["steps"])


def test_a_script_whose_file_was_cut_in_parts_is_one_run(tmp_path):
    """One process's part files (``max_file_size``) follow each other in time as a
    script run again would: they are one run of one process."""
    script = tmp_path / "parts.py"
    script.write_text("import dftrace\nfrom dftrace import ai\n"
                      f"dftrace.initialize(log_file={str(tmp_path / 'traces' / 'run')!r}, max_file_size='1M')\n"
                      "for i in range(400000):\n"
                      "    with ai.compute.forward(args={'step': i}):\n"
                      "        pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DFTRACE_", "RANK", "LOCAL_RANK"))}
    subprocess.run([sys.executable, str(script)], env=env, timeout=120, check=True)
    assert len(os.listdir(tmp_path / "traces")) >= 2
    summary = summarize(tmp_path / "traces")
    assert summary.runs == [] and summary.step_stats["count"] == 400000
