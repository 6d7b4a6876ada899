"""The shared format module: tolerant line reading, validation, names."""

from __future__ import annotations

import gzip
import subprocess
import sys

import orjson
import pytest
import tracegen

from dftrace import format as fmt


def _write(tmp_path, lines, name="t-node0-7.pfw"):
    path = tmp_path / name
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _meta(pid=7):
    return orjson.dumps({"name": "process_name", "ph": "M", "pid": pid, "tid": pid, "args": {"name": "x"}})


def _span(ts, dur, *, pid=7, tid=7, id=1, p_idx=0, level=1, **extra):
    event = {"id": id, "name": "s", "cat": "compute", "pid": pid, "tid": tid, "ts": ts, "dur": dur, "ph": "X",
             "args": {"level": level, "p_idx": p_idx}}
    event.update(extra)
    return orjson.dumps(event)


def _rules(path):
    return [(v.line, v.rule) for v in fmt.validate_file(path)]


@pytest.mark.parametrize("compression", ["zstd", "gzip", "none"])
def test_lines_of_a_finalized_file_are_all_events_or_brackets(tmp_path, compression):
    """Every line of a clean file is an event, except the opening and closing bracket."""
    proc = tracegen.training_process(1000, epochs=1, steps=2)
    path = tracegen.write_process(tmp_path, proc, compression=compression)
    lines = list(fmt.iter_trace_lines(path))
    assert [line.text for line in lines if line.is_structural] == [b"[", b"]"]
    assert [line.number for line in lines] == list(range(1, len(lines) + 1))
    assert len([line for line in lines if line.event]) == len(proc.events) + len(proc.metadata())
    assert not [line for line in lines if line.error]


def test_zstd_file_cut_inside_a_frame_ends_with_one_broken_line(tmp_path):
    """A crash inside a zstd frame keeps every earlier frame and reports the cut once."""
    proc = tracegen.training_process(1000, epochs=1, steps=4)
    path = tracegen.write_process(tmp_path, proc, compression="zstd", cut="frame", lines_per_frame=10)
    lines = list(fmt.iter_trace_lines(path))
    broken = [line for line in lines if line.error]
    assert len(broken) == 1 and broken[0] is lines[-1]
    assert "cut off" in broken[0].error
    assert len([line for line in lines if line.event]) >= 30


def test_gzip_file_cut_inside_a_member_ends_with_one_broken_line(tmp_path):
    """A crash inside a gzip member keeps every earlier member and reports the cut once."""
    proc = tracegen.training_process(1000, epochs=1, steps=4)
    path = tracegen.write_process(tmp_path, proc, compression="gzip", cut="frame", lines_per_frame=10)
    lines = list(fmt.iter_trace_lines(path))
    assert [line.number for line in lines if line.error] == [lines[-1].number]
    assert "cut off" in lines[-1].error


def test_plain_file_cut_mid_line_reports_that_line(tmp_path):
    """An uncompressed file cut in the middle of a line has exactly that line broken."""
    proc = tracegen.training_process(1000, epochs=1, steps=2)
    path = tracegen.write_process(tmp_path, proc, compression="none", cut="line")
    lines = list(fmt.iter_trace_lines(path))
    assert [line.number for line in lines if line.error] == [len(lines)]
    assert "not valid JSON" in lines[-1].error


def test_garbage_after_the_last_member_is_one_broken_line(tmp_path):
    """Zero padding after the last gzip member (a pre-allocated file) is reported, not raised."""
    path = tmp_path / "t-node0-7.pfw.gz"
    path.write_bytes(gzip.compress(b"[\n" + _meta() + b"\n") + b"\0" * 64)
    lines = list(fmt.iter_trace_lines(path))
    assert [line.event["name"] for line in lines if line.event] == ["process_name"]
    assert "undecodable" in lines[-1].error


def test_trailing_commas_of_chrome_json_are_accepted(tmp_path):
    """Lines of Chrome's array layout (`{...},`) parse as events."""
    path = _write(tmp_path, [b"[", _meta() + b",", _span(10, 5), b"]"], "x.json")
    assert [line.event["ph"] for line in fmt.iter_trace_lines(path) if line.event] == ["M", "X"]


def test_clean_file_has_no_violations(tmp_path):
    """A file written to the contract validates clean."""
    path = tracegen.write_process(tmp_path, tracegen.training_process(1000), compression="zstd")
    assert fmt.validate_file(path) == []


def test_unfinished_file_with_whole_lines_is_valid(tmp_path):
    """No closing bracket (process killed between flushes) is not a violation."""
    path = tracegen.write_process(tmp_path, tracegen.training_process(1000), finalize=False)
    assert fmt.validate_file(path) == []


def test_cut_line_is_a_json_violation(tmp_path):
    """A half-written last line is reported with its line number."""
    path = tracegen.write_process(tmp_path, tracegen.training_process(1000), compression="none", cut="line")
    n_lines = len(path.read_bytes().split(b"\n"))
    assert _rules(path) == [(n_lines, "json")]


@pytest.mark.parametrize(
    ("line", "rule"),
    [
        (_span(10, -1), "dur"),
        (_span(-5, 1), "ts"),
        (_span(10, 1, pid=2**32), "pid"),
        (_span(10, 1, tid=-1), "tid"),
        (_span(10, 1, ph=1), "ph"),
        (_span(10, 1, ph="Q"), "ph"),
        (_span(10, 1, name=3), "name"),
        (_span(10, 1, args=[1]), "args"),
        (b'{"name":"s","ph":"i","pid":7,"tid":7,"ts":1,"args":{"t":"\\ud83d\\ude00"}}', "surrogate"),
        (b'{"name":"s\xff","ph":"i","pid":7,"tid":7,"ts":1}', "utf8"),
        (_span(10, 1) + b",", "comma"),
        (b"][", "brackets"),
        (b'{"name":', "json"),
    ],
)
def test_each_rule_reports_the_offending_line(tmp_path, line, rule):
    """A line breaking one rule is reported at its line number under that rule."""
    path = _write(tmp_path, [b"[", _meta(), _span(1, 1, id=9), line])
    assert (4, rule) in _rules(path)


_HOSTILE_LINES = [
    _span(10, -1), _span(-5, 1), _span(10, 1, pid=2**32), _span(10, 1, tid=-1), _span(10, 1, ph=1),
    _span(10, 1, ph="Q"), _span(10, 1, name=3), _span(10, 1, args=[1]), _span(10, 1) + b",",
    b'{"name":"s","ph":"i","pid":7,"tid":7,"ts":1,"args":{"t":"\\ud83d\\ude00"}}',
    b'{"name":"s","ph":"i","pid":7,"tid":7,"ts":1,"args":{"p":"C:\\\\ud800"}}',  # no surrogate
    b'{"name":"s\xff","ph":"i","pid":7,"tid":7,"ts":1}', b"][", b"[]", b"", b"  ", b"5", b'"text"', b'{"name":',
    b'{"name":"s","ph":"i","pid":7,"tid":7,"ts":1,"args":{"a":' + b"[" * 70 + b"]" * 70 + b"}}",  # too deep
    b'{"name":"s","ph":"i","pid":7,"tid":7,"ts":1,"args":{"a":"' + b"{" * 70 + b'"}}',  # braces in a string
    b'{"name":"s","ph":"X","pid":7,"tid":7,"ts":1,"dur":1,"id":' + str(2**70).encode() + b"}",
    b'{"name":"s","ph":"i","tid":7,"ts":1}', b'{"name":"s","ph":"i","pid":7,"ts":1}',
    b'{"name":"s","ph":"X","pid":7,"tid":7,"dur":1}', b'{"name":"s","ph":"X","pid":7,"tid":7,"ts":1}',
    b'{"ph":"X","pid":7,"tid":7,"ts":1,"dur":1}', b'{"name":"s","pid":7,"tid":7}', _meta(),
    b'  ' + _span(10, 1) + b' \r', _span(10, 1) + b"\x0c", _span(10, 1, pid=True), _span(10.5, 1e300),
]


def test_hostile_lines_among_many_are_reported_as_each_alone(tmp_path):
    """Each kind of broken line, put among thousands of good event lines (alone, next
    to another, at the ends of the blocks validate reads at once), is reported at its
    line with exactly the violations it gets as the only event after the metadata."""
    alone = {}
    for line in _HOSTILE_LINES:
        found = fmt.validate_file(_write(tmp_path, [b"[", _meta(), line]))
        alone[line] = [(v.rule, v.message) for v in found if v.line == 3]
        assert all(v.line == 3 for v in found)
    good = [_span(10 * i, 5, id=i + 1, pid=8, tid=8) for i in range(4000)]  # disjoint, on their own thread
    at = sorted({*range(3, 4000, 50), 1000, 1001, 1002, 510, 511, 512, 513, 1024, 1025, 3999})
    lines, expected = [b"[", _meta()], []
    for index, line in enumerate(good):
        if index in at:
            hostile = _HOSTILE_LINES[len(expected) % len(_HOSTILE_LINES)]
            lines.append(hostile)
            expected.append((len(lines), hostile))
        lines.append(line)
    lines.append(b"]")
    path = _write(tmp_path, lines)
    assert len(expected) > 2 * len(_HOSTILE_LINES)
    assert [(v.line, v.rule, v.message) for v in fmt.validate_file(path)] == [
        (number, rule, message) for number, line in expected for rule, message in alone[line]]


def test_escaped_backslash_before_u_is_not_a_surrogate(tmp_path):
    """`\\\\ud800` is a backslash followed by text, not an escaped surrogate."""
    line = b'{"name":"s","ph":"i","pid":7,"tid":7,"ts":1,"args":{"p":"C:\\\\ud800"}}'
    assert _rules(_write(tmp_path, [b"[", _meta(), line])) == []


def test_missing_open_bracket_and_metadata_first(tmp_path):
    """A file must open with '[' and a metadata event."""
    path = _write(tmp_path, [_span(1, 1)])
    assert _rules(path) == [(1, "open"), (1, "metadata-first")]


def test_content_after_close_is_a_violation(tmp_path):
    """Nothing may follow the closing bracket."""
    path = _write(tmp_path, [b"[", _meta(), b"]", _span(1, 1)])
    assert _rules(path) == [(4, "after-close")]


def test_partial_overlap_on_one_thread_is_a_nesting_violation(tmp_path):
    """Two spans on one thread that overlap without nesting are reported."""
    path = _write(tmp_path, [b"[", _meta(), _span(10, 10, id=1), _span(15, 10, id=2)])
    assert _rules(path) == [(4, "nesting")]


def test_overlap_on_different_threads_is_fine(tmp_path):
    """Nesting is checked per thread."""
    path = _write(tmp_path, [b"[", _meta(), _span(10, 10, id=1), _span(15, 10, id=2, tid=8)])
    assert _rules(path) == []


def test_touching_and_zero_length_spans_nest(tmp_path):
    """Back-to-back spans and zero-length spans at a parent's end are not overlaps."""
    lines = [b"[", _meta(), _span(15, 0, id=3, p_idx=1, level=2), _span(10, 5, id=1), _span(15, 5, id=2)]
    assert _rules(_write(tmp_path, lines)) == []


def test_parent_must_enclose_the_child(tmp_path):
    """p_idx must name a span on the same thread that contains the child."""
    lines = [b"[", _meta(), _span(10, 5, id=2, p_idx=1, level=2), _span(20, 5, id=1)]
    assert _rules(_write(tmp_path, lines)) == [(3, "parent")]


def test_level_must_be_one_below_the_parent(tmp_path):
    """level is the parent's level plus one."""
    lines = [b"[", _meta(), _span(11, 2, id=2, p_idx=1, level=3), _span(10, 5, id=1)]
    assert _rules(_write(tmp_path, lines)) == [(3, "level")]


def test_parent_on_another_thread_is_a_violation(tmp_path):
    """p_idx refers to the same track only."""
    lines = [b"[", _meta(), _span(11, 2, id=2, p_idx=1, level=2, tid=8), _span(10, 5, id=1)]
    assert _rules(_write(tmp_path, lines)) == [(3, "parent")]


def test_dftracer_samples_follow_or_break_the_rules_as_known(samples):
    """DFTracer 2.0.3 finalized output is valid; 2.2.0's integer ph and missing '[' are not."""
    assert fmt.validate_file(samples / "dftracer-2.0.3" / "toy.pfw.gz") == []
    rules = {v.rule for v in fmt.validate_file(samples / "dftracer-2.2.0_default" / "toy-03954d0cc0f5eaf2-app.pfw.gz")}
    assert rules == {"open", "ph"}


def test_parse_trace_filename_reads_rank_host_pid_and_part():
    """File names give prefix, rank, host (dashes allowed), pid and part number."""
    assert fmt.parse_trace_filename("/x/run-rank3-node-17-4242.part2.pfw.zst") == fmt.TraceFileName(
        "run", 3, "node-17", 4242, 2
    )
    assert fmt.parse_trace_filename("run-host1-42.pfw") == fmt.TraceFileName("run", None, "host1", 42, 0)
    assert fmt.parse_trace_filename("toy-1629759c158d1f1f-app.pfw.gz") is None


def test_normalize_phase_maps_dftracer_codes():
    """DFTracer 2.2's integer phases become Chrome letters."""
    assert [fmt.normalize_phase(p) for p in (1, 2, 3, 4, "X", 9, True)] == ["X", "C", "A", "M", "X", None, None]


def test_format_module_imports_no_analysis_stack():
    """dftrace.format (and dftrace) load without polars, dask or pandas."""
    code = (
        "import sys, dftrace, dftrace.format, dftrace.analysis, dftrace.analysis.commands;"
        "print(sorted(m for m in ('polars', 'dask', 'pandas', 'distributed', 'plotly') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_nesting_checked_through_sorted_runs_on_disk(tmp_path, monkeypatch):
    """With a few spans per sorted run on disk, the nesting and parent rules find what
    they find in memory (children written before their parents, as dftrace writes
    them; parents found on the stack or, on another thread, by id), and the runs are
    removed afterwards."""
    from dftrace.format import nesting as _nesting

    lines = [b"[", _meta()]
    for step in range(20):  # valid: each parent written after its two children
        base, parent = 100 * step + 1000, 3 * step + 100
        lines += [_span(base + 1, 2, id=parent + 1, p_idx=parent, level=2),
                  _span(base + 4, 2, id=parent + 2, p_idx=parent, level=2), _span(base, 10, id=parent)]
    lines += [_span(10, 10, id=1, pid=8, tid=8), _span(15, 10, id=2, pid=8, tid=8),  # overlap
              _span(10, 5, id=2, p_idx=1, level=2, pid=9, tid=9), _span(20, 5, id=1, pid=9, tid=9),  # not enclosing
              _span(11, 2, id=2, p_idx=1, level=3, pid=10, tid=10), _span(10, 5, id=1, pid=10, tid=10),  # level
              _span(11, 2, id=2, p_idx=1, level=2, pid=11, tid=12), _span(10, 5, id=1, pid=11, tid=11)]  # thread
    path = _write(tmp_path, lines)
    first = 2 + 60
    expected = [(first + 2, "nesting"), (first + 3, "parent"), (first + 5, "level"), (first + 7, "parent")]
    assert _rules(path) == expected
    monkeypatch.setattr(_nesting, "RUN_SPANS", 4)
    runs = tmp_path / "tmp"
    runs.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(runs))
    assert _rules(path) == expected
    assert list(runs.iterdir()) == []


def _frames_of_every_kind() -> tuple[bytes, int, int]:
    """zstd frames as files hold them: with their decoded size (one-shot, as dftrace
    writes them), without it (a streaming writer), empty, one decoding to more than
    a piece of output, a skippable frame between two; and the bytes of the one-shot
    frames of a piece or less before the last, and of the last."""
    import zstandard

    one_shot = zstandard.ZstdCompressor(level=1)
    lines = [b"".join(_span(10 * i + k, 5, id=k) + b"\n" for k in range(40)) for i in range(6)]
    streamed = zstandard.ZstdCompressor(level=1, write_content_size=False).compressobj()
    skippable = (0x184D2A50).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc"
    big = b"".join(_span(i, 5, id=i) + b"\n" for i in range(200_000))  # ~20 MB: more than a piece
    small = [one_shot.compress(b"[\n" + _meta() + b"\n"), one_shot.compress(lines[0]), one_shot.compress(b""),
             one_shot.compress(lines[2]), one_shot.compress(lines[3]), one_shot.compress(lines[4])]
    last = one_shot.compress(lines[5])
    frames = [*small[:2], streamed.compress(lines[1]) + streamed.flush(), *small[2:4], skippable, small[4],
              one_shot.compress(big), small[5], last]
    return b"".join(frames), sum(map(len, small)), len(last)


@pytest.mark.parametrize("damage", ["none", "cut", "garbage"])
def test_zstd_frames_decode_the_same_whole_in_c_and_streamed(tmp_path, monkeypatch, damage):
    """The C engine decodes whole zstd frames at once without the GIL; what it cannot
    take whole (no decoded size, skippable, bigger than a piece, cut, damaged) the
    streaming decoder takes. Both ways give the same lines and the same report."""
    from dftrace.format import reading as _trace_reading

    data, whole_bytes, last = _frames_of_every_kind()
    data = {"none": data, "cut": data[:-40], "garbage": data[:-20] + b"\x00" * 20}[damage]
    path = tmp_path / "t-node0-7.pfw.zst"
    path.write_bytes(data)
    if _trace_reading._fast_whole("unzstd_frames") is None:
        pytest.skip("no C engine or libzstd here: the streaming decoder alone")
    calls = []
    whole = _trace_reading._whole_decoders["unzstd_frames"]

    def counted(*args):
        out, used = whole(*args)
        calls.append(used)
        return out, used

    monkeypatch.setitem(_trace_reading._whole_decoders, "unzstd_frames", counted)
    in_c = [(line.number, line.text, line.error) for line in fmt.iter_trace_lines(path)]
    # The one-shot frames of a piece or less went through C, the last one where it is whole.
    assert sum(calls) == whole_bytes + (last if damage == "none" else 0)
    monkeypatch.setitem(_trace_reading._whole_decoders, "unzstd_frames", None)
    streamed = [(line.number, line.text, line.error) for line in fmt.iter_trace_lines(path)]
    assert in_c == streamed
    assert len([text for _, text, error in in_c if error is None and text.startswith(b"{")]) == 1 + 5 * 40 + 200_000 + (
        40 if damage == "none" else 0)
