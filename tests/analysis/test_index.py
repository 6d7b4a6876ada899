"""The summary's index of files already read: a second summary of unchanged files
takes each file's partials from it and answers the same; a file that changed
(appended to, truncated, rewritten to the same size and time) is read again; an
index that cannot be written or read is no index, never an error."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import tracegen

pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from dftrace.analysis import summarize  # noqa: E402
from dftrace.analysis.reduce import index as _index  # noqa: E402
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

    monkeypatch.setattr(_index, "aggregate_partitions", counted)
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


def _long_process(directory, steps: int, compression: str = "zstd"):
    """One process of 2 x ``steps`` steps: rows of steps and intervals a-plenty."""
    directory.mkdir()
    return tracegen.write_process(directory, tracegen.training_process(1000, epochs=2, steps=steps),
                                  compression=compression)


def test_an_entry_holds_a_small_share_of_its_file(tmp_path, index_dir, reads):
    """Times and step numbers are kept as gaps, compressed: the entry of a long
    process is a tenth of its compressed trace at most, and answers the same."""
    path = _long_process(tmp_path / "traces", steps=5_000)
    first = summarize(path, progress=False)
    (entry,) = index_dir.glob("*.idx")
    assert entry.stat().st_size <= 0.1 * path.stat().st_size, (entry.stat().st_size, path.stat().st_size)
    reads.clear()
    again = summarize(path, progress=False)
    assert reads == [] and _answers(again) == _answers(first)
    assert again.step_stats["count"] == 2 * 5_000


def test_a_file_read_in_pieces_keeps_no_rows_in_the_index(tmp_path, index_dir, reads):
    """Read in several partitions, a file's steps are rows until combined: an entry
    that would hold them (over a fifth of the file) is not written, and the file is
    read again, with the same answers."""
    path = _long_process(tmp_path / "traces", steps=5_000)
    first = summarize(path, progress=False, partition_bytes=64 << 10)
    assert len(set(reads)) == 1 and len(reads) > 2, reads  # several partitions of the one file
    assert list(index_dir.glob("*.idx")) == []
    reads.clear()
    assert _answers(summarize(path, progress=False, partition_bytes=64 << 10)) == _answers(first)
    assert reads


def test_step_rows_are_stored_in_time_order_name_by_name(tmp_path):
    """The step rows of a file read in parts come from a grouping, in no order: an
    entry stores them name by name in time order, where their times' gaps are small,
    so the rows shuffled make the same entry, to the byte; they load back whole."""
    import io

    from dftrace.analysis.read.sources import plan_partitions

    path = _long_process(tmp_path / "traces", steps=2_000)
    (partial, *_) = aggregate_partitions(plan_partitions([str(path)], 256 << 10))
    assert partial.steps.height > 1_000
    identity = _index.file_identity(str(path))

    def entry(steps):
        partial.steps = steps
        out = io.BytesIO()
        _index._write_entry(out, str(path), identity, 256 << 10, [partial])
        return out.getvalue()

    steps = partial.steps
    stored = entry(steps.sample(fraction=1.0, shuffle=True, seed=1))
    assert stored == entry(steps.sample(fraction=1.0, shuffle=True, seed=2)) == entry(steps.reverse())
    loaded = _index._decoded(io.BytesIO(stored), str(path), 256 << 10)[0].steps
    assert loaded.sort(loaded.columns).equals(steps.sort(steps.columns))


def test_the_index_is_held_under_its_size_least_recently_used_out_first(tmp_path, index_dir, reads, monkeypatch):
    """``DFTRACE_INDEX_MAX_SIZE`` bounds the whole index: writing an entry removes
    those used least recently; ``0`` writes none."""
    traces = tmp_path / "traces"
    traces.mkdir()
    paths = tracegen.write_run(traces, ranks=3, compression="zstd")
    for path in paths:
        summarize(path, progress=False)
    entries = sorted(index_dir.glob("*.idx"), key=lambda e: e.stat().st_mtime_ns)
    assert len(entries) == 3
    sizes = [e.stat().st_size for e in entries]
    # Room for two: reading the first file again marks its entry used, so writing a
    # fourth removes the second file's, then the third's.
    os.utime(entries[0], ns=(1, 1))
    os.utime(entries[1], ns=(2, 2))
    os.utime(entries[2], ns=(3, 3))
    reads.clear()
    summarize(paths[0], progress=False)
    assert reads == []
    monkeypatch.setenv("DFTRACE_INDEX_MAX_SIZE", str(max(sizes) * 2 + max(sizes) // 2))
    fourth = tracegen.write_process(tmp_path / "traces", tracegen.training_process(2000), compression="zstd")
    summarize(fourth, progress=False)
    left = {e.name for e in index_dir.glob("*.idx")}
    assert entries[0].name in left and entries[1].name not in left and entries[2].name not in left
    assert len(left) == 2
    monkeypatch.setenv("DFTRACE_INDEX_MAX_SIZE", "0")
    for entry in index_dir.glob("*.idx"):
        entry.unlink()
    summarize(traces, progress=False)
    assert list(index_dir.glob("*.idx")) == []


@pytest.mark.parametrize("given", ["abc", "-5M", "nan"])
def test_a_size_that_cannot_be_read_is_said_and_the_default_holds(given, monkeypatch):
    """``DFTRACE_INDEX_MAX_SIZE`` that is no size: a warning names the setting and the
    value, and the default bound holds (it was taken without a word)."""
    monkeypatch.setenv("DFTRACE_INDEX_MAX_SIZE", given)
    monkeypatch.setattr(_index, "_told_bad_size", False)
    with pytest.warns(RuntimeWarning, match=f"DFTRACE_INDEX_MAX_SIZE='{re.escape(given)}' is not a size"):
        assert _index.max_size() == _index.DEFAULT_MAX_SIZE
    monkeypatch.setenv("DFTRACE_INDEX_MAX_SIZE", "512M")
    assert _index.max_size() == 512 << 20
