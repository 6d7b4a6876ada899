"""A long run: memory stays flat, and files rotate into numbered parts under a size limit."""

from __future__ import annotations

import os

import dftrace
from dftrace import ai, testing
from dftrace.format import parse_trace_filename

from ._util import HERE, assert_valid, run, spans, wait_for_end


def test_memory_stays_flat_over_a_long_run(tmp_path):
    """600,000 events: the buffer stays bounded and RSS does not grow with the event count."""
    out = run([os.path.join(HERE, "_long_run.py"), str(tmp_path), "6", "100000"], timeout=240)
    assert out.returncode == 0, out.stderr
    rows = [tuple(int(x) for x in line.split()) for line in out.stdout.splitlines()]
    assert [r[1] for r in rows] == [100_000 * (i + 1) for i in range(6)]
    assert all(r[3] < 300_000 for r in rows), rows  # the writer keeps the buffer short
    rss = [r[2] for r in rows]
    # Holding the events would cost > 100 bytes each: 40 MB more per 400,000.
    assert rss[-1] - rss[1] < 24 * 2**20, rss
    # Under load the program's bounded shutdown can return before the drainer has
    # written the last of it ("it writes the rest when it can"): read the file once
    # it is complete.
    path = wait_for_end(tmp_path, timeout=120)
    assert testing.trace_files(tmp_path) == [path]
    assert len(spans(testing.read_events(path))) == 600_000


def test_size_limit_rotates_into_complete_numbered_parts(tmp_path):
    """Past max_file_size the trace goes on in .part1, .part2, ...: each part complete on its own."""
    limit = 32 * 1024
    s = dftrace.initialize(log_file=str(tmp_path / "r"), compression="zstd",
                           max_file_size=limit, inherit=False)
    for i in range(6000):
        with ai.compute.step(args={"step": i, "pad": os.urandom(8).hex()}):
            pass
        if i % 500 == 499:
            s.writer.flush()
    dftrace.finalize()
    paths = s.paths
    assert len(paths) >= 3
    base = paths[0][: -len(".pfw.zst")]
    assert paths == [base + ".pfw.zst"] + [f"{base}.part{k}.pfw.zst" for k in range(1, len(paths))]
    assert [parse_trace_filename(p).part for p in paths] == list(range(len(paths)))
    assert_valid(paths)  # each opens with '[' and metadata and ends with ']'
    steps = []
    for p in paths:
        events = testing.read_events(p)
        assert [e["name"] for e in events[:2]] == ["process_name", "process_sort_index"]
        steps += [e["args"]["step"] for e in spans(events, "step")]
        # A part is closed at the first flush that finds it past the limit.
        assert os.path.getsize(p) < limit + 64 * 1024
    assert steps == list(range(6000))


def test_producer_faster_than_the_writer_waits_instead_of_piling_up(tmp_path):
    """A producer faster than the writer waits at buffer_limit: the buffer never holds
    more, and every span is written."""
    from dftrace._core import buffer as _buffer

    # zstd level 9 makes the writer far slower than this loop on any machine: the
    # producer reaches buffer_limit and must wait there (block mode), whatever the
    # machine's speed, so what is buffered never passes the limit and nothing drops.
    limit = 65_536
    s = dftrace.initialize(log_file=str(tmp_path / "t"), compression_level=9, buffer_limit=limit,
                           flush_interval=0.05, inherit=False)
    most = 0
    for i in range(400_000):
        with ai.compute.forward:
            pass
        if not i & 0x3FF:
            most = max(most, _buffer.buffered())
    dftrace.finalize()
    assert 0 < most <= limit, most
    events = testing.read_events(s.path)
    assert not [e for e in events if e.get("name") == "dropped"]
    assert len(spans(events)) == 400_000
