"""The files: layout, compression, flushing, bounded memory."""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
import textwrap
import time

import pytest
from _requirements import native_engine_missing, needs
import zstandard

import dftrace
from dftrace import ai, testing
from dftrace._core import buffer as _buffer
from dftrace._core import sink as sink_mod
from dftrace._core import writer as writer_mod

from ._util import assert_valid


def _raw_lines(path: str) -> list[bytes]:
    data = open(path, "rb").read()
    if path.endswith(".zst"):
        data = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True).read()
    elif path.endswith(".gz"):
        data = gzip.decompress(data)
    return data.splitlines()


@pytest.mark.parametrize("compression,suffix", [("zstd", ".pfw.zst"), ("gzip", ".pfw.gz"), ("none", ".pfw")])
def test_file_layout_for_each_compression(tmp_path, compression, suffix):
    """``[`` first, metadata before events, one JSON object per line, ``]`` last; name has host and pid."""
    with testing.trace_to(tmp_path, compression=compression) as t:
        with ai.compute.forward:
            pass
    (path,) = t.paths
    assert path.endswith(f"-{os.getpid()}{suffix}")
    lines = _raw_lines(path)
    assert lines[0] == b"[" and lines[-1] == b"]"
    assert b'"ph":"M"' in lines[1] and b'"process_name"' in lines[1]
    names = [e["name"] for e in t.events[:6]]
    assert names == ["process_name", "process_sort_index", "thread_name", "HH", "clock_anchor", "PR"]
    assert_valid(t.paths)


def test_each_flush_is_an_independent_zstd_frame(tmp_path):
    """Every flush appends a frame that decodes on its own, so a cut file loses only its tail."""
    s = dftrace.initialize(log_file=str(tmp_path / "t"), inherit=False)
    for _ in range(3):
        with ai.compute.forward:
            pass
        s.writer.flush()
    dftrace.finalize()
    data = open(s.path, "rb").read()
    frames, pos = 0, 0
    while pos < len(data):  # decode frame by frame, each with a fresh decompressor
        assert zstandard.frame_content_size(data[pos:]) > 0
        d = zstandard.ZstdDecompressor().decompressobj()
        d.decompress(data[pos:])
        pos = len(data) - len(d.unused_data)
        frames += 1
    assert frames == 5  # header, three flushes, trailer
    cut = data[: len(data) - 3]  # a crash mid-write of the last frame
    open(s.path, "wb").write(cut)
    assert len(testing.spans(testing.read_events(s.path, strict=False))) == 3


def _program_events(tmp_path, name: str, compression: str) -> list[dict]:
    s = dftrace.initialize(log_file=str(tmp_path / name), inherit=False, compression=compression)
    ai.update(epoch=1)
    for i in ai.dataloader.fetch.iter(range(3)):
        with ai.compute.forward(args={"i": i, "shape": [i, 2]}):
            pass
        span = ai.comm.all_reduce.start()
        span.stop(args={"bytes": 8 * i})
        s.writer.flush()
    dftrace.finalize()
    events = testing.read_events(s.path)
    return [{k: v for k, v in e.items() if k not in ("ts", "dur", "pid")}
            for e in events if e.get("ph") == "X"]


@needs("native", native_engine_missing())
@pytest.mark.parametrize("compression", ["zstd", "gzip", "none"])
def test_engine_written_frames_match_the_python_path(tmp_path, monkeypatch, compression):
    """Frames the C engine compresses and writes itself decode to the same events as
    frames compressed and written in Python."""
    native = _program_events(tmp_path, "native", compression)
    monkeypatch.setattr(sink_mod, "_NATIVE", set())
    python = _program_events(tmp_path, "python", compression)
    assert len(native) == 13  # per item: fetch.iter, fetch.block, forward, all_reduce; fetch.end
    assert [(e["name"], e["args"].get("i"), e["args"].get("bytes"), e["args"].get("epoch"))
            for e in native] == [(e["name"], e["args"].get("i"), e["args"].get("bytes"),
                                  e["args"].get("epoch")) for e in python]


@needs("native", native_engine_missing())
def test_engine_written_frames_are_independent_zstd_frames(tmp_path):
    """A flush the C engine writes is one zstd frame with its content size, like the
    Python path's."""
    s = dftrace.initialize(log_file=str(tmp_path / "t"), inherit=False)
    with ai.compute.forward:  # the first write (the header) opens the file in Python
        pass
    s.writer.flush()
    size = os.path.getsize(s.path)
    for _ in range(5):
        with ai.compute.forward:
            pass
    s.writer.flush()
    tail = open(s.path, "rb").read()[size:]
    lines = zstandard.ZstdDecompressor().decompress(tail).splitlines()  # needs the content size
    assert len(lines) == 5 and all(b'"name":"forward"' in line for line in lines)
    dftrace.finalize()


@needs("native", native_engine_missing())
def test_gzip_frames_are_compressed_and_written_by_the_engine(tmp_path):
    """With the system's libdeflate, gzip goes the way zstd goes: the engine
    compresses and writes each frame as one gzip member, without the GIL; the file
    is a multi-member gzip that any reader decodes."""
    if "gzip" not in sink_mod.native_compressions():
        pytest.skip("no libdeflate on this machine: gzip is compressed in Python")
    s = dftrace.initialize(log_file=str(tmp_path / "t"), inherit=False, compression="gzip",
                           writer="thread")  # frames_written counts this process's own
    with ai.compute.forward:  # the first write (the header) opens the file in Python
        pass
    s.writer.flush()
    before = _buffer.frames_written()
    for flush in range(3):
        for _ in range(1000):
            with ai.compute.forward:
                pass
        s.writer.flush()
    assert _buffer.frames_written() - before == 3  # one member per flush, from the engine
    dftrace.finalize()
    with gzip.open(s.path, "rb") as fh:
        lines = fh.read().splitlines()
    assert sum(b'"name":"forward"' in line for line in lines) == 3001
    assert len(testing.spans(testing.read_events(s.path))) == 3001


def test_one_flush_writes_a_big_backlog_as_frames_of_at_most_max_batch(tmp_path):
    """A backlog of 40,000 spans leaves in one flush, as frames of at most 16,384 lines."""
    s = dftrace.initialize(log_file=str(tmp_path / "t"), inherit=False, flush_interval=3600,
                           batch_size=10**6, writer="thread")  # the thread's max_batch
    size = 0

    @ai.compute.forward
    def f():
        pass

    for _ in range(40_000):
        f()
    assert s.writer.flush() >= 40_000
    data = open(s.path, "rb").read()[size:]
    frames = []
    while data:
        d = zstandard.ZstdDecompressor().decompressobj()
        frames.append(d.decompress(data).count(b'"name":"forward"'))
        data = d.unused_data
    assert sum(frames) == 40_000
    assert len(frames) >= 3 and max(frames) <= s.writer.max_batch
    dftrace.finalize()


def test_events_reach_disk_within_the_flush_interval(tmp_path):
    """Without finalize, events are on disk after one flush interval."""
    s = dftrace.initialize(log_file=str(tmp_path / "t"), flush_interval=0.05, compression="none",
                           inherit=False)
    with ai.compute.forward:
        pass
    deadline = time.time() + 5
    while time.time() < deadline and not (os.path.exists(s.path)
                                          and b'"forward"' in open(s.path, "rb").read()):
        time.sleep(0.02)
    assert b'"forward"' in open(s.path, "rb").read()


def _forward_calls_then_finalize(s, calls: int) -> list[dict]:
    """Call a function decorated with ``ai.compute.forward`` ``calls`` times, finalize,
    and return the events of session ``s``'s file."""

    @ai.compute.forward
    def f():
        pass

    for _ in range(calls):
        f()
    dftrace.finalize()
    return testing.read_events(s.path)


def test_drop_mode_counts_dropped_events_in_the_trace(tmp_path):
    """With ``on_full="drop"`` and a full buffer, drops are counted and the count is written."""
    s = dftrace.initialize(log_file=str(tmp_path / "t"), buffer_limit=1024, on_full="drop",
                           flush_interval=60, batch_size=10**9, compression="none", inherit=False,
                           writer="thread")  # its thread is stopped here
    s.writer._stop = True  # a writer that cannot keep up: it never flushes until finalize
    s.writer.wake()
    s.writer._thread.join()
    events = _forward_calls_then_finalize(s, 20_000)
    (dropped,) = [e for e in events if e.get("name") == "dropped"]
    written = len(testing.spans(events, "forward"))
    assert dropped["args"]["count"] > 0
    assert written + dropped["args"]["count"] == 20_000


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_block_mode_loses_nothing_with_a_small_buffer(tmp_path, writer):
    """With the default lossless mode, a tiny buffer makes producers wait; every event is
    written, with either writer."""
    s = dftrace.initialize(log_file=str(tmp_path / "t"), buffer_limit=1024, batch_size=512,
                           inherit=False, writer=writer)
    events = _forward_calls_then_finalize(s, 30_000)
    assert len(testing.spans(events, "forward")) == 30_000
    assert not [e for e in events if e.get("name") == "dropped"]
    assert_valid([s.path])


def test_exit_without_finalize_writes_a_complete_file(tmp_path):
    """A program that never calls finalize still leaves a complete file (atexit)."""
    code = textwrap.dedent(f"""
        import dftrace
        from dftrace import ai
        s = dftrace.initialize(log_file={str(tmp_path / 'run')!r}, compression="gzip")
        for _ in range(100):
            with ai.compute.forward:
                pass
        print(s.path)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    path = out.stdout.strip()
    assert gzip.decompress(open(path, "rb").read()).endswith(b"]\n")
    assert len(testing.spans(testing.read_events(path), "forward")) == 100


def test_timestamps_come_from_one_anchored_monotonic_clock(tmp_path):
    """``ts`` is wall-clock µs derived from the recorded anchor; nested spans nest in time."""
    before = time.time_ns() // 1000
    with testing.trace_to(tmp_path) as t:
        with ai.pipeline.train:
            with ai.compute.forward:
                time.sleep(0.001)
    after = time.time_ns() // 1000
    anchor = t.metadata("clock_anchor")[0]["args"]
    train, fwd = t.spans("train")[0], t.spans("forward")[0]
    assert before - 1000 <= train["ts"] <= after
    assert train["ts"] <= fwd["ts"] and fwd["ts"] + fwd["dur"] <= train["ts"] + train["dur"]
    assert anchor["wall_ns"] > 0 and anchor["mono_ns"] > 0


def test_file_is_created_at_the_first_write_and_never_over_an_existing_one(tmp_path):
    """No file before the first event; a taken name gets the next free ``.N``; the
    taken file is untouched."""
    from dftrace._core.sink import FileSink

    (tmp_path / "b.pfw").write_bytes(b"earlier")
    (tmp_path / "b.1.pfw").write_bytes(b"earlier too")
    sink = FileSink(str(tmp_path / "b"), "none", None, header=lambda: b"[\n")
    assert not sink.opened and sorted(os.listdir(tmp_path)) == ["b.1.pfw", "b.pfw"]
    sink.write(b'{"a":1}\n', 1)
    sink.close()
    assert sink.path == str(tmp_path / "b.2.pfw")
    assert open(sink.path, "rb").read() == b'[\n{"a":1}\n]\n'
    assert (tmp_path / "b.pfw").read_bytes() == b"earlier"
    empty = FileSink(str(tmp_path / "c"), "none", None, header=b"[\n")
    empty.close()
    assert not os.path.exists(tmp_path / "c.pfw")


def test_stop_returns_on_time_when_the_storage_stalls(tmp_path):
    """A write that does not return: stop() gives up after its timeout, says so, and
    the events it could not write are counted."""
    import threading

    from dftrace._core import buffer as _buffer

    s = dftrace.initialize(log_file=str(tmp_path / "t"), compression="none", flush_interval=60,
                           inherit=False, writer="thread")  # its sink is made to hang here
    stuck, release = threading.Event(), threading.Event()

    def hang(data):
        stuck.set()
        release.wait(30)

    with ai.compute.forward:
        pass
    s.sink._write_raw = hang  # the first write (the header) hangs
    s.writer.sync(0.01)
    assert stuck.wait(5)
    for _ in range(10):
        with ai.compute.forward:
            pass
    t0 = time.monotonic()
    assert s.writer.stop(0.3, lambda: b"]\n") is False
    assert time.monotonic() - t0 < 2
    assert s.sink.abandoned
    # all 11 are counted as not written: in the stuck write, or still buffered
    assert s.sink.events_lost + _buffer.buffered() >= 11
    release.set()
    s.writer._thread.join(5)
    with pytest.warns(RuntimeWarning, match="events could not be written"):
        dftrace.finalize()
    assert not os.path.exists(s.path) or os.path.getsize(s.path) == 0


def test_a_writer_thread_that_ends_before_stop_looks_finishes_the_file_once(tmp_path):
    """The writer's thread ends (last flush, trailer, close) before stop() looks at it,
    as on a busy machine: stop() does not finish the file a second time (a second
    close would, after a failed write, record the loss elsewhere as well)."""
    s = dftrace.initialize(log_file=str(tmp_path / "t"), compression="none", inherit=False,
                           writer="thread")
    with ai.compute.forward:
        pass
    closes = []
    close = s.sink.close
    s.sink.close = lambda *a: closes.append(a) or close(*a)
    thread = s.writer._thread

    class EndsBeforeLooked:
        """The writer's thread, seen by stop() only once it has ended."""

        def __getattr__(self, name):
            return getattr(thread, name)

        def is_alive(self):
            thread.join(30)
            return thread.is_alive()

    s.writer._thread = EndsBeforeLooked()
    dftrace.finalize()
    assert len(closes) == 1
    assert len(testing.spans(testing.read_events(s.path), "forward")) == 1


def test_where_no_shared_ring_can_be_had_the_default_is_the_writer_thread(tmp_path, monkeypatch):
    """No sealable memfd (a platform other than Linux): with no writer setting the
    writer thread writes, without a word; asking for writer="process" says once that
    it is not available. The file is whole either way."""
    import warnings

    monkeypatch.delattr(os, "memfd_create", raising=False)
    monkeypatch.delenv("DFTRACE_WRITER", raising=False)
    for asked, expected_warnings in ((None, 0), ("process", 1)):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            s = dftrace.initialize(log_file=str(tmp_path / str(asked) / "t"), inherit=False,
                                   writer=asked)
            with ai.compute.forward:
                pass
            dftrace.finalize()
        assert type(s.writer) is writer_mod.Writer
        said = [w for w in got if "writer='process' (env DFTRACE_WRITER) is not available"
                in str(w.message)]
        assert len(said) == expected_warnings
        assert len(testing.spans(testing.read_events(s.path), "forward")) == 1
