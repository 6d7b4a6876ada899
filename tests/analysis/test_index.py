"""The summary's index of files already read: a second summary of unchanged files
takes each file's partials from it and answers the same; a file that changed
(appended to, truncated, rewritten to the same size and time) is read again; an
index that cannot be written or read is no index, never an error."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import tracegen

pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from dftrace.analysis import summarize  # noqa: E402
from dftrace.analysis.answers import summary as _summary  # noqa: E402
from dftrace.analysis.reduce.aggregate import aggregate_partitions  # noqa: E402


@pytest.fixture
def index_dir(tmp_path, monkeypatch):
    directory = tmp_path / "index"
    monkeypatch.setenv("DFTRACE_INDEX_DIR", str(directory))
    return directory


@pytest.fixture
def reads(monkeypatch):
    """The paths of the partitions the summary read (not taken from the index)."""
    seen: list[str] = []

    def counted(partitions, **kwargs):
        def noted():
            for partition in partitions:
                seen.append(os.path.basename(partition.path))
                yield partition

        return aggregate_partitions(noted(), **kwargs)

    monkeypatch.setattr(_summary, "aggregate_partitions", counted)
    return seen


def _answers(summary):
    data = summary.to_dict()
    data["overview"].pop("skipped_files", None)
    return data


def test_second_summary_reads_nothing_and_answers_the_same(tmp_path, index_dir, reads):
    traces = tmp_path / "traces"
    traces.mkdir()
    paths = tracegen.write_run(traces, ranks=2, compression="gzip")
    first = summarize(traces, progress=False)
    assert sorted(reads) == sorted(p.name for p in paths)
    assert len(list(index_dir.glob("*.idx"))) == 2
    reads.clear()
    second = summarize(traces, progress=False)
    assert reads == []
    assert _answers(second) == _answers(first) == _answers(summarize(traces, progress=False, index=False))


@pytest.mark.parametrize("change", ["append", "truncate", "rewrite"])
def test_a_changed_file_is_read_again(tmp_path, index_dir, reads, change):
    traces = tmp_path / "traces"
    traces.mkdir()
    kept, changed = tracegen.write_run(traces, ranks=2, compression="none")
    summarize(traces, progress=False)
    before = os.stat(changed)
    data = changed.read_bytes()
    if change == "append":  # a writer still at work: one more step's spans
        lines = data.rstrip(b"]\n").split(b"\n")
        data = b"\n".join(lines + lines[-3:]) + b"\n"
    elif change == "truncate":
        data = data[: len(data) // 2].rsplit(b"\n", 1)[0] + b"\n"
    else:  # the same size and modification time: told apart by the bytes at its end
        data = data[:-40] + data[-40:].replace(b"1", b"2")
        assert len(data) == before.st_size
    changed.write_bytes(data)
    if change == "rewrite":
        os.utime(changed, ns=(before.st_atime_ns, before.st_mtime_ns))
    reads.clear()
    again = summarize(traces, progress=False)
    assert reads == [changed.name]
    assert _answers(again) == _answers(summarize(traces, progress=False, index=False))
    assert again.overview["events"] != 0
    reads.clear()
    summarize(traces, progress=False)
    assert reads == []  # the entry was replaced by the changed file's


def test_an_index_that_cannot_be_written_or_read_is_no_index(tmp_path, monkeypatch, reads):
    traces = tmp_path / "traces"
    traces.mkdir()
    tracegen.write_run(traces, ranks=2, compression="zstd")
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("DFTRACE_INDEX_DIR", str(blocker / "index"))
    expected = _answers(summarize(traces, progress=False))
    assert len(reads) == 2
    # Damaged entries are read again and replaced.
    good = tmp_path / "index"
    monkeypatch.setenv("DFTRACE_INDEX_DIR", str(good))
    summarize(traces, progress=False)
    for entry in good.glob("*.idx"):
        entry.write_bytes(entry.read_bytes()[:100])
    reads.clear()
    assert _answers(summarize(traces, progress=False)) == expected
    assert len(reads) == 2
    # A directory others can write to is not trusted.
    os.chmod(good, 0o777)
    reads.clear()
    assert _answers(summarize(traces, progress=False)) == expected
    assert len(reads) == 2


def test_cli_no_index_writes_nothing(tmp_path, index_dir):
    traces = tmp_path / "traces"
    traces.mkdir()
    tracegen.write_run(traces, ranks=1, compression="zstd")
    run = subprocess.run([sys.executable, "-m", "dftrace", "summary", "--json", "--no-index", str(traces)],
                         capture_output=True, text=True, check=True)
    assert '"events"' in run.stdout
    assert not index_dir.exists()
    subprocess.run([sys.executable, "-m", "dftrace", "summary", "--json", str(traces)], capture_output=True,
                   check=True)
    assert len(list(index_dir.glob("*.idx"))) == 1
