"""The C line scanner reads what the polars path reads, line for line, broken lines included."""

from __future__ import annotations

import gzip

import pytest
import zstandard
from _requirements import native_scanner_missing, needs

pl = pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from polars.testing import assert_frame_equal  # noqa: E402

from dftrace.analysis import load_traces  # noqa: E402
from dftrace.analysis.read import decode as _decode  # noqa: E402
from dftrace.analysis.read.schema import SUMMARY_COLUMNS  # noqa: E402
from dftrace.analysis.runtime import kernels  # noqa: E402

needs_scanner = needs("native", native_scanner_missing())

_META = (
    '{"name":"process_name","cat":"dftrace","pid":7,"tid":7,"ph":"M","args":{"name":"rank 0 · h · pid 7"}}\n'
    '{"name":"PR","cat":"dftrace","pid":7,"tid":7,"ph":"M","args":{"hostname":"h","rank":0}}\n'
)

#: Lines that exercise the scanner's corners: escapes, unicode, integer phases,
#: float times, trailing commas, nested args it must skip, nulls, booleans,
#: a line without ph, whitespace, a broken line in the middle.
_ODD_LINES = [
    '{"id":1,"name":"a\\"b\\\\c","cat":"compute","pid":7,"tid":7,"ts":10,"dur":5,"ph":"X","args":{"level":1}}',
    '{"id":2,"name":"f\\u00fcr \u00e9t\u00e9","cat":"data","pid":7,"tid":8,"ts":11,"dur":2,"ph":1,'
    '"args":{"level":1,"p_idx":0,"epoch":1,"step":3}}',
    '{"id":3,"name":"float","cat":"compute","pid":7,"tid":7,"ts":12.75,"dur":1e1,"ph":"X",'
    '"args":{"level":2,"p_idx":1,"nested":{"a":[1,{"b":"}"}]},"list":[1,2],"count":4}},',
    '  {"name":"c","cat":"comm","pid":7,"tid":7,"ts":30,"dur":3,"ph":"X","args":{"group":"g0","seq":2,'
    '"incomplete":true,"p_idx":-1,"level":1}}  ',
    '{"name":"nulls","cat":null,"pid":7,"tid":7,"ts":31,"dur":null,"ph":"i","args":null}',
    '{"name":"noph","cat":"compute","pid":7,"tid":7,"ts":40,"dur":1}',
    '{"name":"broken","cat":"compute","pid":7,',
    '{"name":"counter","cat":"metric","pid":7,"tid":7,"ts":41,"ph":"C","args":{"value":3.5,"group":5}}',
    '',
    '{"name":"last","cat":"compute","pid":7,"tid":7,"ts":50,"dur":1,"ph":"X","args":{"level":1,"step":4,"epoch":1}}',
    # Escapes past the first 24 bytes of a string, and an escaped backslash just before its end.
    '{"name":"a name longer than the first look\\"q\\\\","cat":"compute","pid":7,"tid":7,"ts":51,"dur":1,'
    '"ph":"X","args":{"level":1,"group":"ends in a backslash \\\\"}}',
    '{"name":"x\\\\","cat":"compute","pid":7,"tid":7,"ts":52,"dur":1,"ph":"X","args":{"level":1}}',
]


def _write(path, text: bytes) -> None:
    if path.suffix == ".zst":
        path.write_bytes(zstandard.ZstdCompressor().compress(text))
    elif path.suffix == ".gz":
        path.write_bytes(gzip.compress(text))
    else:
        path.write_bytes(text)


def _both_ways(path, monkeypatch, columns=SUMMARY_COLUMNS):
    scanned = load_traces(path, columns=columns)
    with monkeypatch.context() as patch:
        patch.setattr(kernels, "C", None)
        parsed = load_traces(path, columns=columns)
    return scanned, parsed


@needs_scanner
@pytest.mark.parametrize("suffix", [".pfw", ".pfw.gz", ".pfw.zst"])
@pytest.mark.parametrize("ending", ["]\n", "", '{"name":"cut","cat":"compute","pid":7,"ts'])
def test_scanner_matches_the_polars_path_on_odd_lines(tmp_path, monkeypatch, suffix, ending):
    """Events, broken-line reports and metadata are the same with and without the scanner."""
    path = tmp_path / f"odd{suffix}"
    _write(path, ("[\n" + _META + "\n".join(_ODD_LINES) + "\n" + ending).encode())
    scanned, parsed = _both_ways(path, monkeypatch)
    assert_frame_equal(scanned.events, parsed.events)
    assert scanned.files == parsed.files
    assert_frame_equal(scanned.meta, parsed.meta)
    assert scanned.events.filter(pl.col("name") == 'a"b\\c').height == 1
    assert scanned.events.filter(pl.col("name") == "für été").get_column("ph").to_list() == ["X"]
    assert scanned.events.filter(pl.col("name") == "float").select("ts", "dur", "count").row(0) == (12, 10, 4)
    broken = [reason for _, reason in scanned.files[0].broken]
    assert "event without ph" in broken and len(broken) == 2 + (ending.startswith("{"))


@needs_scanner
def test_a_value_of_another_type_falls_back_to_the_polars_path(tmp_path, monkeypatch):
    """A step written as a string is valid JSON the scanner does not take: the result is
    still that of the line-by-line path (the string read as a number)."""
    path = tmp_path / "typed.pfw"
    line = '{"name":"s","cat":"compute","pid":7,"tid":7,"ts":12,"dur":3,"ph":"X","args":{"level":1,"step":"12"}}'
    _write(path, ("[\n" + _META + line + "\n" + _ODD_LINES[0] + "\n]\n").encode())
    scanned, parsed = _both_ways(path, monkeypatch)
    assert_frame_equal(scanned.events, parsed.events)
    assert scanned.events.filter(pl.col("name") == "s").get_column("step").to_list() == [12]


@needs_scanner
def test_scanner_reads_dftracer_files_like_the_polars_path(monkeypatch):
    """DFTracer 1.x and 2.x samples (integer phases, hashes, gzip) load alike both ways."""
    from pathlib import Path

    data = Path(__file__).parent.parent / "data" / "dftracer"
    for path in sorted(data.glob("*/*")):
        if path.suffix == ".md":
            continue
        scanned, parsed = _both_ways(path, monkeypatch)
        assert scanned.events.height > 0, path
        assert_frame_equal(scanned.events, parsed.events)
        assert scanned.files == parsed.files


_text = __import__("hypothesis").strategies.text(max_size=12)


def _event_strategy():
    from hypothesis import strategies as st

    scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), _text,
                       st.floats(allow_nan=False, allow_infinity=False, width=32))
    value = st.recursive(scalar, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                          st.dictionaries(_text, inner, max_size=3)), max_leaves=6)
    args = st.fixed_dictionaries(
        {}, optional={"level": st.integers(1, 9), "p_idx": st.integers(-1, 99), "epoch": st.integers(0, 5),
                      "step": st.integers(0, 50), "count": st.integers(1, 50), "incomplete": st.booleans(),
                      "group": _text, "seq": st.integers(0, 99), "other": value, _KEY: value})
    return st.fixed_dictionaries(
        {"name": _text, "cat": _text, "pid": st.integers(0, 2**31), "tid": st.integers(0, 2**31),
         "ts": st.integers(0, 2**52), "ph": st.sampled_from(["X", "i", "C", 1, 2])},
        optional={"dur": st.integers(0, 2**31), "id": st.integers(1, 2**31), "args": args, "extra": value},
    )


_KEY = "k\u00e9y"


@needs_scanner
def test_scanner_matches_the_polars_path_on_generated_events(tmp_path_factory, monkeypatch):
    """Random events (unicode, escapes, nested values, integer phases) load alike both ways."""
    import orjson
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(_event_strategy(), min_size=1, max_size=12))
    def check(events):
        path = tmp_path_factory.mktemp("gen") / "gen.pfw"
        path.write_bytes(b"[\n" + _META.encode() + b"\n".join(orjson.dumps(e) for e in events) + b"\n]\n")
        scanned, parsed = _both_ways(path, monkeypatch)
        assert_frame_equal(scanned.events, parsed.events)
        assert scanned.files == parsed.files

    check()


@needs_scanner
def test_keys_in_a_changing_order_land_in_their_columns(tmp_path, monkeypatch):
    """The scanner remembers which field the key at each place of the last line was;
    lines whose keys come in another order (a wanted key where an unwanted one was,
    keys that share a prefix) still put every value in its own column."""
    import random

    chooser = random.Random(7)
    lines, expected = [], []
    for i in range(400):
        # Integers alone are shuffled, several of one key length: a value put in the
        # wrong column is not of another type (which would send the file to the polars
        # path) but a wrong number.
        top = ['"pid":7', f'"tid":{i % 4}', f'"ts":{1000 + i}', f'"dur":{i % 9}', f'"t":{i}', f'"ids":{i * 3}']
        args = [f'"level":{i % 3 + 1}', f'"step":{i // 10}', f'"steps":{-i}', f'"ste":{i * 7}', f'"epoch":{i // 100}',
                f'"count":{i % 6}']
        chooser.shuffle(top)
        chooser.shuffle(args)
        cut = chooser.randrange(len(top) + 1)
        fields = [f'"name":"n{i % 5}"', f'"cat":"c{i % 3}"', '"ph":"X"', *top[:cut],
                  '"args":{' + ",".join(args) + "}", *top[cut:]]
        lines.append("{" + ",".join(fields) + "}")
        expected.append((f"n{i % 5}", f"c{i % 3}", 7, i % 4, 1000 + i, i % 9, i % 3 + 1, i // 10, i // 100, i % 6))
    path = tmp_path / "shuffled.pfw"
    _write(path, ("[\n" + _META + "\n".join(lines) + "\n]\n").encode())
    scanned, parsed = _both_ways(path, monkeypatch)
    assert_frame_equal(scanned.events, parsed.events)
    got = scanned.events.sort("ts").select("name", "cat", "pid", "tid", "ts", "dur", "level", "step", "epoch",
                                           "count").rows()
    assert got == expected


@needs_scanner
def test_a_string_spelled_like_the_line_befores_is_read_whole(tmp_path, monkeypatch):
    """The scanner takes a key or string value spelled as the one of the line before
    without scanning it: a value that only starts the same (longer, an escaped quote
    where the last one ended, an escaped backslash at its end), short and long, is
    read whole, and a line cut right after such a value is broken, not read."""
    import json

    names = ["step", "step", "steps", 'step\\"', "step\\\\", "step\\\\", 'step\\\\\\"x', "a name past sixteen bytes",
             "a name past sixteen bytes", "a name past sixteen bytes!", "", "", "x"]
    lines = [f'{{"name":"{name}","cat":"{name}","pid":7,"tid":7,"ts":{i},"dur":1,"ph":"X","args":{{"level":1}}}}'
             for i, name in enumerate(names)]
    lines.append('{"name":"x"')  # cut after the value of the line before
    path = tmp_path / "repeated.pfw"
    _write(path, ("[\n" + _META + "\n".join(lines) + "\n]\n").encode())
    with monkeypatch.context() as patch:  # every line read by the scanner itself
        patch.setattr(_decode, "_read_lines", lambda *args: pytest.fail("the scanner gave the file up"))
        load_traces(path, columns=SUMMARY_COLUMNS)
    scanned, parsed = _both_ways(path, monkeypatch)
    assert_frame_equal(scanned.events, parsed.events)
    expected = [json.loads(f'"{name}"') for name in names]
    assert scanned.events.sort("ts").get_column("name").to_list() == expected
    assert scanned.events.sort("ts").get_column("cat").to_list() == expected
    assert scanned.files[0].broken_count == 1
