"""``dftrace demo --write-samples``: the sample runs the documentation reads, written
from what the package ships into an empty directory, read back as the pages read them."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

from dftrace.cli import main
from dftrace.examples.sample_runs import DATA, write_samples
from dftrace.format import validate_file

pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from dftrace.analysis import load_traces, summarize  # noqa: E402


@pytest.fixture(scope="module")
def samples(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("samples") / "docs-run"  # not there yet: the command makes it
    assert main(["demo", "--write-samples", str(where)]) == 0
    return where


def test_it_writes_every_sample_it_lists(samples, capsys):
    """The toy run and each shipped sample, nothing else; the shipped files unchanged."""
    shipped = sorted(p.name for p in DATA.iterdir() if p.is_dir())
    assert sorted(p.name for p in samples.iterdir()) == sorted(["traces", *shipped])
    assert {"ddp-run", "ddp-buckets", "diff-runs", "gpu-job", "gpu-h200", "dftracer-2.0.3"} <= set(shipped)
    for name in shipped:
        compared = filecmp.dircmp(DATA / name, samples / name)
        assert not (compared.left_only or compared.right_only or compared.diff_files), name


def test_the_toy_run_has_four_ranks_of_the_pages_run(samples):
    """traces/: one valid file per rank 0..3, each with the toy pipeline's spans."""
    files = sorted((samples / "traces").iterdir())
    assert len(files) == 4
    assert all(validate_file(p) == [] for p in files)
    trace = load_traces(samples / "traces")
    assert sorted(trace.processes["rank"].to_list()) == [0, 1, 2, 3]
    spans = trace.events.filter(trace.events["ph"] == "X")
    assert spans.height == 5680  # what the pages' convert and merge print
    backward = spans.filter((spans["cat"] == "compute") & (spans["name"] == "backward"))
    assert backward.group_by("rank").len().sort("rank")["len"].to_list() == [10, 10, 10, 10]


def test_the_recorded_runs_answer_as_the_pages_show(samples):
    """ddp-run names rank 1 as the straggler; ddp-buckets/slow too, its control no one."""
    ddp = summarize(samples / "ddp-run")
    assert ddp.overview["ranks"] == 2
    assert ddp.stragglers[0]["rank"] == 1 and ddp.stragglers[0]["significant"]
    assert summarize(samples / "ddp-buckets" / "slow").stragglers[0]["rank"] == 1
    assert not any(s["significant"] for s in summarize(samples / "ddp-buckets" / "control").stragglers)


def test_it_never_writes_over_a_run(samples, capsys):
    """A second write into the same directory changes nothing and says why (exit 2)."""
    before = sorted(p.stat().st_mtime_ns for p in (samples / "traces").iterdir())
    assert main(["demo", "--write-samples", str(samples)]) == 2
    assert "traces already exists" in capsys.readouterr().err
    assert sorted(p.stat().st_mtime_ns for p in (samples / "traces").iterdir()) == before
    with pytest.raises(FileExistsError):
        write_samples(samples)
