"""One reading of a trace line everywhere: a line that breaks a rule of
``dftrace.format.event_problems`` (types, ranges, nesting) is one counted broken
line in every command, on the C scanner's path and on the polars one, and the
line ``dftrace validate`` names; a key given twice counts with its last value in
both; ``watch`` reads on through damage; ``validate`` says a file is cut when it
ends without its closing ``]``."""

from __future__ import annotations

import gzip
import json
import os

import orjson
import pytest
import tracegen
import zstandard

pl = pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from dftrace import format as fmt  # noqa: E402
from dftrace.analysis import summarize  # noqa: E402
from dftrace.analysis.read import decode as _decode  # noqa: E402
from dftrace.analysis.commands import main  # noqa: E402
from dftrace.analysis.read.sources import Partition  # noqa: E402
from dftrace.analysis.render.following import Watcher  # noqa: E402
from dftrace.analysis.runtime import kernels  # noqa: E402


@pytest.fixture(params=["scanner", "polars"])
def reader(request, monkeypatch):
    """Each test runs on the C scanner's path (where built) and on the polars one."""
    if request.param == "scanner":
        if kernels.C is None:
            pytest.skip("the C trace scanner is not built or is switched off")
    else:
        monkeypatch.setattr(kernels, "C", None)
    return request.param


def _span(name: str = "odd", **fields: object) -> dict:
    return {"id": 9000, "name": name, "cat": "compute", "pid": 4000, "tid": 4000, "ts": tracegen.T0_US + 5,
            "dur": 5, "ph": "X", "args": {"level": 1}, **fields}


def _file(directory, *extra: bytes, compression: str = "none"):
    """One process's trace with ``extra`` raw lines before its ``]``; (path, clean events)."""
    directory.mkdir(exist_ok=True)
    proc = tracegen.training_process(4000, epochs=1, steps=2)
    path = tracegen.write_process(directory, proc, compression=compression, extra_lines=list(extra))
    return path, len(proc.events)


def _line_numbers(path, lines: list[bytes]) -> list[int]:
    text = fmt.read_trace_bytes(path).data.split(b"\n")
    return [text.index(line) + 1 for line in lines]


def _summary_broken(path) -> list[tuple[int, str]]:
    return [(b["line"], b["reason"]) for f in summarize(path, index=False).files for b in f["broken"]]


def _validate_lines(path) -> set[int]:
    return {v.line for v in fmt.validate_file(path)}


# Types and sizes no reader can hold: the lines that made every command fail.
_CRASH = [b'{"name":123,"cat":{},"ph":"X","ts":1,"dur":1,"pid":4000,"tid":4000}',
          b'{"name":"a","cat":"c","ph":"X","ts":1,"dur":1,"pid":1180591620717411303424,"tid":4000}']


def test_two_hostile_lines_are_two_broken_lines_in_every_command(tmp_path, capsys, reader):
    """A name that is a number, a cat that is an object, a pid beyond 64 bits: every
    command answers (exit 0, no traceback) and leaves exactly those two lines out."""
    path, clean = _file(tmp_path / "run", *_CRASH)
    argvs = [["summary", str(path)], ["report", str(path), "-o", str(tmp_path / "r.html")],
             ["convert", str(path), "-o", str(tmp_path / "c.parquet")],
             ["merge", str(path), "-o", str(tmp_path / "m.json")],
             ["sql", "SELECT count(*) AS n FROM events", str(path), "--json"], ["diff", str(path), str(path)]]
    out = {}
    for argv in argvs:
        code = main([*argv, "--no-progress", *(["--no-index"] if argv[0] == "summary" else [])])
        captured = capsys.readouterr()
        assert code == 0 and "Traceback" not in captured.out + captured.err, (argv, captured.err)
        out[argv[0]] = captured
    assert "broken lines 2 " in out["summary"].out
    assert "(2 broken lines left out" in out["convert"].out and "(2 broken lines left out" in out["merge"].out
    assert "2 broken lines" in out["sql"].err and "2 broken lines)" in out["diff"].out
    assert orjson.loads(out["sql"].out)[0]["n"] == clean
    assert main(["watch", str(path), "--once", "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["totals"]["broken_lines"] == 2
    numbers = _line_numbers(path, _CRASH)
    assert [n for n, _ in _summary_broken(path)] == numbers
    assert _validate_lines(path) == set(numbers)


@pytest.mark.parametrize("fields", [{"ts": -1.8e15}, {"dur": -5}, {"ts": 1e300}, {"dur": 1e308}, {"ts": 10**30},
                                    {"ts": 2**63}, {"dur": 2**63}, {"ts": 2**53 + 2}, {"pid": 2**32},
                                    {"tid": -1}, {"pid": 1.5}, {"ts": "12"}, {"dur": True}, {"args": [1]}],
                         ids=lambda fields: "-".join(f"{k}={v!r}" for k, v in fields.items()))
def test_a_number_out_of_range_is_one_broken_line_everywhere(tmp_path, capsys, reader, fields):
    """One span whose ts, dur, pid or tid is out of its range or of another type: no
    traceback, one broken line at the line validate names, every other event kept
    (kept + broken = the event lines written), and the span counts nowhere."""
    bad = orjson.dumps(_span(**{key: 0 for key in fields}))
    for key, value in fields.items():  # spelled by hand: orjson writes no integer past 64 bits
        bad = bad.replace(b'"%s":0' % key.encode(), b'"%s":%s' % (key.encode(), json.dumps(value).encode()))
    path, clean = _file(tmp_path / "run", bad)
    (number,) = _line_numbers(path, [bad])
    summary = summarize(path, index=False)
    assert summary.overview["broken_lines"] == 1
    assert summary.overview["events"] == clean
    assert [n for n, _ in _summary_broken(path)] == [number]
    assert _validate_lines(path) == {number}
    assert "odd" not in {c["name"] for c in summary.categories}
    assert main(["summary", str(path), "--no-progress", "--no-index"]) == 0
    out = capsys.readouterr()
    assert "broken lines 1 " in out.out and "Traceback" not in out.err


def test_a_key_given_twice_counts_with_its_last_value_everywhere(tmp_path, reader):
    """Names, times and args given twice: the summary keeps the last of each, as
    validate reads them; a valid first value does not save a bad last one."""
    twice = (b'{"name":"first","name":"later","cat":"compute","ph":"X","ts":%d,"ts":%d,"dur":7,"pid":4000,'
             b'"tid":4000,"args":{"level":3},"args":{"level":1}}' % (tracegen.T0_US, tracegen.T0_US + 1))
    bad_last = b'{"name":"odd","cat":"compute","ph":"X","ts":%d,"dur":5,"dur":-1,"pid":4000,"tid":4000}' % (
        tracegen.T0_US)
    path, clean = _file(tmp_path / "run", twice, bad_last)
    trace_events = _decode.read_partition(Partition(str(path), 0, 0, os.path.getsize(path))).events
    later = trace_events.filter(pl.col("name") == "later")
    assert later.select("ts", "dur", "level").rows() == [(tracegen.T0_US + 1, 7, 1)]
    assert trace_events.filter(pl.col("name").is_in(["first", "odd"])).height == 0
    numbers = _line_numbers(path, [twice, bad_last])
    assert [n for n, _ in _summary_broken(path)] == numbers[1:]
    assert _validate_lines(path) == {numbers[1]}
    assert summarize(path, index=False).overview["events"] == clean + 1


def _nested(name: str, depth: int) -> bytes:
    """A span whose line nests ``depth`` levels (its object 1, args 2)."""
    inner = b"[" * (depth - 2) + b"]" * (depth - 2)
    return orjson.dumps(_span(name)).replace(b'"args":{', b'"args":{"deep":' + inner + b",")


def test_args_nested_past_the_bound_are_broken_everywhere(tmp_path, reader):
    """A line nested ``MAX_DEPTH`` levels is read; one level more, or 5,000 (past the
    JSON parser's own limit), is a broken line to validate and to the summary alike."""
    lines = [_nested("ok", fmt.MAX_DEPTH), _nested("deeper", fmt.MAX_DEPTH + 1), _nested("deepest", 5000),
             orjson.dumps(_span("brackets", args={"level": 1, "text": "[{" * 100}))]
    path, clean = _file(tmp_path / "run", *lines)
    numbers = _line_numbers(path, lines)
    broken = _summary_broken(path)
    assert broken == [(n, f"nested deeper than {fmt.MAX_DEPTH} levels") for n in numbers[1:3]]
    assert _validate_lines(path) == set(numbers[1:3])
    names = {c["name"] for c in summarize(path, index=False).categories}
    assert {"ok", "brackets"} <= names and not {"deeper", "deepest"} & names
    assert main(["convert", str(path), "-o", str(tmp_path / "deep.parquet"), "--no-progress"]) == 0


def test_the_scanner_is_handed_the_rules_bounds():
    """The C scanner holds no bound of its own: the depth and the ranges come from
    the rules module."""
    assert fmt.MAX_DEPTH == 64 and fmt.MAX_TIME_US == 2**53 and fmt.MAX_ID == 2**32 - 1
    assert _decode._RULED["ts"][1] == (0, fmt.MAX_TIME_US) and _decode._RULED["pid"][1] == (0, fmt.MAX_ID)


# --- watch -------------------------------------------------------------------------


def _encode(data: bytes, compression: str) -> bytes:
    if compression == "zstd":
        return zstandard.ZstdCompressor().compress(data)
    if compression == "gzip":
        return gzip.compress(data)
    return data


@pytest.mark.parametrize("damage", ["garbage", "half frame"])
@pytest.mark.parametrize("compression", ["zstd", "gzip", "none"])
def test_watch_reads_on_through_damage(tmp_path, compression, damage):
    """4 KiB of garbage (or half a frame) appended to a followed file: counted as
    broken lines, and the lines appended after it are read."""
    proc = tracegen.training_process(4000, epochs=1, steps=2)
    path = tracegen.write_process(tmp_path, proc, compression=compression, finalize=False)
    watcher = Watcher([str(tmp_path)])
    watcher.poll()
    before = watcher.snapshot()["totals"]
    assert before["events"] == len(proc.events) and before["broken_lines"] == 0
    more = b"".join(orjson.dumps(_span(f"after{i}", ts=tracegen.T0_US + 10**7 + i * 10)) + b"\n" for i in range(20))
    if damage == "garbage" or compression == "none":
        junk = os.urandom(4096).replace(b"\x28\xb5\x2f\xfd", b"....").replace(b"\x1f\x8b", b"..") + b"\n"
    else:
        whole = _encode(more, compression)
        junk = whole[:len(whole) // 2]
    with open(path, "ab") as fh:
        fh.write(junk)
    watcher.poll()
    with open(path, "ab") as fh:
        fh.write(_encode(more, compression))
    watcher.poll()
    totals = watcher.snapshot()["totals"]
    assert totals["events"] == len(proc.events) + 20
    assert totals["broken_lines"] >= 1
    assert not watcher.finished  # the writer may write on


# --- validate: a file without its closing line ------------------------------------


def test_validate_says_a_file_without_its_closing_line_is_cut(tmp_path, capsys):
    """A file a killed process left without ``]``: OK, said to be cut (exit 0), as a
    torn frame is; with --strict a violation (exit 1). A closed file says nothing more."""
    proc = tracegen.training_process(4000, epochs=1, steps=2)
    cut = tracegen.write_process(tmp_path, proc, compression="none", finalize=False)
    closed = tracegen.write_process(tmp_path, proc, compression="zstd")
    assert main(["validate", str(cut), str(closed)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{cut}: OK (cut: the file ends without its closing ']' line: written by a process that was "
                   f"killed or is still running, {len(proc.events) + len(proc.metadata())} events readable)",
                   f"{closed}: OK"]
    assert main(["validate", "--strict", str(cut)]) == 1
    assert "file: [cut] the file ends without its closing ']' line" in capsys.readouterr().out


# --- cardinality --------------------------------------------------------------------


def test_names_past_the_cap_are_one_counted_row(tmp_path, monkeypatch, reader):
    """More distinct names than ``MAX_NAMES`` in one process and category: the names
    of the most time keep their rows, the rest are one ``(other names)`` row, and
    counts and time add up to every span."""
    from dftrace.analysis.reduce import aggregate as _aggregate

    monkeypatch.setattr(_aggregate, "MAX_NAMES", 50)
    lines = [orjson.dumps(_span(f"name{i:03d}", cat="files", ts=tracegen.T0_US + 10**7 + i * 1000, dur=10 + i))
             for i in range(300)]
    path, clean = _file(tmp_path / "run", *lines)
    categories = summarize(path, index=False).categories
    rows = [c for c in categories if c["cat"] == "files"]
    assert len(rows) == 50
    kept = {r["name"] for r in rows} - {_aggregate.OTHER_NAMES}
    assert kept == {f"name{i:03d}" for i in range(251, 300)}  # the 49 longest, beside the other row
    other = next(r for r in rows if r["name"] == _aggregate.OTHER_NAMES)
    assert other["count"] == 251 and other["total_us"] == sum(10 + i for i in range(251))
    assert all(c["name"] != _aggregate.OTHER_NAMES for c in categories if c["cat"] != "files")
