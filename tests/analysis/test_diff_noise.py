"""dftrace diff against the runs' own noise: same-code (A/A) pairs pass the documented
CI line, a planted +10 % forward fails it; several runs per side give intervals from
the runs' spread. The runs are real traced loops of fixed CPU work (_timed_job.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from dftrace.analysis._cli import main  # noqa: E402

JOB = Path(__file__).with_name("_timed_job.py")
STEPS = 48
#: Work units added to every forward: 10 % of a step.
PLANTED = 24


def _job(out: Path, extra: int = 0) -> Path:
    subprocess.run([sys.executable, str(JOB), str(out), str(STEPS), str(extra)], check=True, timeout=300)
    return out


def _diff(capsys, *args: str) -> tuple[int, dict]:
    code = main(["diff", *args, "--fail-on-regression", "5%", "--json", "--no-progress"])
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def quiet(tmp_path_factory):
    """Three runs of the same code, and three with the planted forward."""
    root = tmp_path_factory.mktemp("quiet")
    same = [_job(root / "same" / f"run{i}") for i in range(3)]
    planted = [_job(root / "planted" / f"run{i}", PLANTED) for i in range(3)]
    return same, planted


def test_one_run_per_side(quiet, capsys):
    """A/A passes and a planted +10 % forward fails, each step figure with an interval
    from blocks of steps; the text says more runs give a sharper answer."""
    same, planted = quiet
    code, data = _diff(capsys, str(same[0]), str(same[1]))
    step = next(r for r in data["rows"] if r["metric"] == "step.p50")
    assert code == 0 and step["noise"] == "steps" and step["low"] < step["change"] < step["high"]
    assert not data["regression"]["failed"]
    code, data = _diff(capsys, str(same[0]), str(planted[0]))
    assert code == 1 and "outside the noise" in data["regression"]["reason"]
    forward = next(r for r in data["rows"] if r["metric"] == "compute.forward.mean")
    assert forward["flagged"] and 0.2 < forward["relative"] < 0.45  # 24 of 80 units
    assert main(["diff", str(same[0]), str(same[1]), "--no-progress"]) == 0
    assert "several runs per side give a sharper answer" in capsys.readouterr().out


def test_several_runs_per_side(quiet, capsys, tmp_path):
    """Repeated --base/--new, or directories of runs: means over the runs, intervals
    from their spread; A/A passes, the planted forward fails."""
    same, planted = quiet
    code, data = _diff(capsys, str(same[0]), str(planted[0]), "--base", str(same[1]), "--base", str(same[2]),
                       "--new", str(planted[1]), "--new", str(planted[2]))
    assert code == 1 and data["runs"] == [3, 3]
    step = next(r for r in data["rows"] if r["metric"] == "step.p50")
    assert step["noise"] == "runs" and step["low"] - step["machine"] > 0
    code, data = _diff(capsys, str(same[0].parent), str(planted[0].parent))
    assert code == 1 and data["runs"] == [3, 3]
    code, data = _diff(capsys, str(same[0]), str(same[1]), "--base", str(same[2]))
    assert code == 0 and data["runs"] == [2, 1]
    assert main(["diff", str(same[0].parent), str(planted[0].parent), "--no-progress"]) == 0
    assert "means over 3 and 3 runs" in capsys.readouterr().out


def test_same_code_passes_on_a_busy_machine(tmp_path, busy_machine, capsys):
    """Three busy processes share the machine: same-code pairs pass the CI line, the
    step time's change judged against the machine's speed and the steps' spread."""
    for i in range(3):
        base, new = _job(tmp_path / f"a{i}"), _job(tmp_path / f"b{i}")
        code, data = _diff(capsys, str(base), str(new))
        assert code == 0, data["regression"]
