"""Damaged, mixed and hostile inputs: every command answers, with no traceback, no
hang and bounded memory; what is not a trace is skipped, what is damaged is counted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import unicodedata
from pathlib import Path

import orjson
import pytest
import tracegen
from _peak_memory import PEAK_MB
from _requirements import native_engine_missing, needs
from reliability._util import wait_for_end
import zstandard

pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from dftrace.analysis import load_traces, summarize  # noqa: E402
from dftrace import testing  # noqa: E402
from dftrace.analysis.commands import main  # noqa: E402
from dftrace.format import MAX_LINE_BYTES, validate_file  # noqa: E402

STEPS = 8


def _run(directory: Path, extra: dict[int, list[bytes]] | None = None) -> Path:
    """A two-rank run; ``extra[r]`` are raw lines appended to rank r's file."""
    directory.mkdir(exist_ok=True)
    for r, proc in enumerate(tracegen.collective_run(2, steps=STEPS)):
        tracegen.write_process(directory, proc, extra_lines=(extra or {}).get(r))
    return directory


def _line(name: bytes | None, **fields: object) -> bytes:
    event = {"id": 9000, "cat": "compute", "pid": 2000, "tid": 2000, "ts": tracegen.T0_US + 5, "dur": 5, "ph": "X",
             "args": {"level": 1}, **fields}
    text = orjson.dumps(event)
    return text if name is None else text.replace(b'"id":9000', b'"id":9000,"name":"' + name + b'"')


def _commands(path: Path, tmp: Path) -> list[list[str]]:
    return [["summary", str(path)], ["summary", str(path), "--json"], ["report", str(path), "-o", str(tmp / "r.html")],
            ["sql", "SELECT name, count(*) AS n FROM events GROUP BY name ORDER BY name", str(path)],
            ["convert", str(path), "-o", str(tmp / "c.parquet")], ["merge", str(path), "-o", str(tmp / "m.json")],
            ["diff", str(path), str(path)], ["watch", str(path), "--once"]]


def _every_command_answers(path: Path, tmp: Path, capsys) -> dict[str, tuple[int, str, str]]:
    out = {}
    for argv in _commands(path, tmp):
        code = main([*argv, "--no-progress"] if argv[0] not in ("watch",) else argv)
        captured = capsys.readouterr()
        assert code == 0, (argv, captured.err)
        assert "Traceback" not in captured.err + captured.out
        out[" ".join(argv[:1] + [a for a in argv[1:] if a.startswith("--")])] = (code, captured.out, captured.err)
    return out


@pytest.mark.parametrize("name,line,reason", [
    ("bad byte in a name", _line(b"bad\xff\xfename"), "not UTF-8 text"),
    ("event without a name", _line(None), "event without name"),
])
def test_a_bad_event_is_a_broken_line_in_every_command(tmp_path, capsys, name, line, reason):
    """One non-UTF-8 byte in a name, or an event without one: every command answers
    and says it left one broken line out; the summary gives its reason."""
    run = _run(tmp_path / "run", {0: [line]})
    outputs = _every_command_answers(run, tmp_path, capsys)
    assert "1 broken line" in outputs["sql"][2] and "(1 broken line left out" in outputs["convert"][1]
    assert "(1 broken line left out" in outputs["merge"][1] and "1 broken line)" in outputs["diff"][1]
    summary = summarize(run)
    assert summary.overview["broken_lines"] == 1
    assert [b["reason"].split(":")[0] for f in summary.files for b in f["broken"]] == [reason]
    assert summary.overview["events"] == 2 * len(tracegen.collective_run(2, steps=STEPS)[0].events)


def test_identical_spans_at_one_depth(tmp_path, capsys):
    """65 identical complete events on one thread at one level (a file validate
    accepts): every command answers; their time is counted once."""
    proc = tracegen.Process(4000, rank=0)
    for _ in range(65):
        proc.span("copy", "device", tracegen.T0_US, 50, level=1)
    run = tmp_path / "run"
    run.mkdir()
    tracegen.write_process(run, proc)
    assert validate_file(next(run.iterdir())) == []
    _every_command_answers(run, tmp_path, capsys)
    groups = {g["group"]: g for g in summarize(run).breakdown["groups"]}
    assert groups["device"]["busy_us"] == 50


def test_control_characters_are_escaped_on_the_terminal(tmp_path, capsys):
    """A name with a clipboard write (OSC 52), a screen clear and a right-to-left
    override is printed escaped by summary, diff and sql; --json keeps the exact
    name, JSON-escaped; no command prints it raw."""
    evil = "\x1b]52;c;aGVsbG8=\x07evil\x1b[2J\u202e"
    run = _run(tmp_path / "run", {0: [_line(orjson.dumps(evil)[1:-1])]})
    outputs = _every_command_answers(run, tmp_path, capsys)
    for command in ("summary", "diff", "sql"):
        text = outputs[command][1]
        assert "evil" in text and "\x1b" not in text and "\x07" not in text and "\u202e" not in text, command
        assert "\\x1b]52;c;aGVsbG8=\\x07evil\\x1b[2J\\u202e" in text, command
    assert evil in {c["name"] for c in orjson.loads(outputs["summary --json"][1])["categories"]}
    assert not any("\x1b" in out for command, (_, out, _) in outputs.items() if command != "summary --json")


def test_names_with_line_breaks_tabs_and_wide_characters_keep_the_tables_aligned(tmp_path, capsys):
    """A name with a line break, one with a tab and one of wide characters: each is
    one row of the summary's table, every row as wide as its header's rule."""
    names = ["line1\nline2", "tab\there", "日本語🚀"]
    run = _run(tmp_path / "run", {0: [_line(orjson.dumps(n)[1:-1]) for n in names]})
    assert main(["summary", str(run), "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = lines[lines.index("Time per category and name") + 1:]
    table = table[:table.index("")]
    rule = table[1]
    for shown in ("line1\\nline2", "tab\\x09here", "日本語🚀"):
        [row] = [line for line in table if shown in line]
        # Its last column ends where the rule does (wide characters two columns each).
        width = sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in row)
        assert width == len(rule), (row, rule)


def test_a_name_is_text_in_the_report_s_charts(tmp_path):
    """Plotly reads markup in its labels (``<b>``, ``<a href>``) and fields in its
    hover templates: a span's and a host's name are shown as their own characters."""
    from dftrace.analysis import render_html

    run = _run(tmp_path / "run", {0: [_line(b"<a href='https://example.com'>click</a><b>x</b>%{y}")]})
    page = render_html(summarize(run))  # (its JSON writes "/" as \u002f)
    assert "<b>x<" not in page and "<a href='https:" not in page
    assert "&lt;b&gt;x&lt;" in page and "%&#123;y}" in page


def test_numbers_beyond_64_bits_in_an_older_file_are_read(tmp_path, capsys):
    """An integer of 320 digits (as older writers wrote it): validate accepts the
    line, and the analysis keeps the event with the number as text."""
    digits = b"9" * 320
    run = _run(tmp_path / "run", {0: [_line(b"big").replace(b'"level":1', b'"level":1,"huge":' + digits)]})
    assert all(v.rule != "json" for f in run.iterdir() for v in validate_file(f))
    assert main(["sql", "SELECT args FROM events WHERE name = 'big'", str(run), "--json", "--no-progress"]) == 0
    assert orjson.loads(orjson.loads(capsys.readouterr().out)[0]["args"])["huge"] == digits.decode()
    assert summarize(run).overview["broken_lines"] == 0


def test_sql_reads_only_the_traces_given(tmp_path, capsys):
    """A table function that reads files is refused (exit 2, one line) unless
    --allow-file-functions is given."""
    run = _run(tmp_path / "run")
    secret = tmp_path / "secret.csv"
    secret.write_text("password\nhunter2\n")
    query = f"SELECT * FROM read_csv('{secret}')"
    assert main(["sql", query, str(run), "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert "hunter2" not in captured.out + captured.err and len(captured.err.strip().splitlines()) == 1
    assert "read_csv(), which reads files" in captured.err
    # polars also calls a quoted name, and a name with a comment before its bracket.
    for spelled in (f"SELECT * FROM \"read_csv\"('{secret}')", f"SELECT * FROM `read_csv`('{secret}')",
                    f"SELECT * FROM read_csv /* ( */ ('{secret}')", f"SELECT * FROM READ_CSV -- x\n('{secret}')"):
        assert main(["sql", spelled, str(run), "--no-progress"]) == 2, spelled
        captured = capsys.readouterr()
        assert "hunter2" not in captured.out + captured.err and "reads files" in captured.err
    assert main(["sql", "SELECT name FROM events WHERE name = 'read_csv(x)' -- read_csv", str(run),
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["sql", query, str(run), "--no-progress", "--allow-file-functions"]) == 0
    assert "hunter2" in capsys.readouterr().out


def test_a_trace_reached_twice_counts_once(tmp_path, capsys):
    """A link to the run's folder beside it, and the run converted into its own folder
    (``dftrace convert run -o run/copy.pfw.gz``): each event is counted once, and the
    summary says which file it left out. Counted before: 2x the spans."""
    run = _run(tmp_path / "run")
    once = summarize(run).to_dict()
    (tmp_path / "link").symlink_to(run, target_is_directory=True)
    assert main(["convert", str(run), "-o", str(run / "copy.pfw.gz")]) == 0
    capsys.readouterr()
    for paths in ([run], [run, tmp_path / "link"], [tmp_path / "link", run / "copy.pfw.gz"]):
        summary = summarize(paths)
        assert summary.overview["events"] == once["overview"]["events"], paths
        assert summary.categories == once["categories"], paths
        assert [os.path.basename(c["path"]) for c in summary.overview["duplicate_files"]] == ["copy.pfw.gz"], paths
    assert main(["summary", str(run), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "Left out 1 file holding the same events as another: copy.pfw.gz (as " in out
    # sql, convert and merge count as the summary does, and say so (before: 2x the events)
    spans = sum(c["count"] for c in once["categories"])
    assert main(["sql", "select count(*) as n from spans", str(run), "--no-progress", "--json"]) == 0
    captured = capsys.readouterr()
    assert orjson.loads(captured.out) == [{"n": spans}]
    assert "Left out 1 file holding the same events as another: copy.pfw.gz (as " in captured.err
    for command in ("convert", "merge"):
        assert main([command, str(run), "-o", str(tmp_path / f"{command}.json"), "--no-progress"]) == 0
        assert "Left out 1 file holding the same events as another: copy.pfw.gz" in capsys.readouterr().out
        written = summarize(tmp_path / f"{command}.json")
        assert written.overview["events"] == once["overview"]["events"], command
        assert written.categories == once["categories"], command
    # One process's file and its copy beside it: the copy is left out, whatever the
    # names' order; a link to the file is read as the file.
    single = tmp_path / "single"
    single.mkdir()
    rank0 = next(p for p in run.glob("*rank0*"))
    (single / rank0.name).write_bytes(rank0.read_bytes())
    (single / "a-copy.pfw.zst").write_bytes(rank0.read_bytes())
    (single / "a-link.pfw.zst").symlink_to(single / rank0.name)
    summary = summarize(single)
    assert [os.path.basename(c["path"]) for c in summary.overview["duplicate_files"]] == ["a-copy.pfw.zst"]
    assert [os.path.basename(f["path"]) for f in summary.files] == [rank0.name]
    # The same pid and times on another host are another process, not a copy.
    lines = testing.read_events(rank0)
    hhash = next(e["args"]["value"] for e in lines if e.get("name") == "HH")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    text = "\n".join(orjson.dumps(e).decode() for e in lines).replace(hhash, "99" * 8)
    (elsewhere / "train-rank0-node9.pfw").write_text("[\n" + text.replace('"name":"node0"', '"name":"node9"') + "\n")
    summary = summarize([run / "copy.pfw.gz", elsewhere])
    assert summary.overview["duplicate_files"] == [] and len(summary.processes) == 3


def test_files_that_are_not_traces_are_skipped(tmp_path, capsys):
    """config.json and metrics.json beside the traces are listed as skipped, never as
    damaged; the run reads as clean, and watch of the finished run ends."""
    run = _run(tmp_path / "run")
    (run / "config.json").write_text('{"lr": 0.1, "model": "gpt"}')
    (run / "metrics.json").write_text('[{"step": 1, "loss": 2.0}]')
    summary = summarize(run)
    assert summary.overview["files"] == 2 and summary.overview["broken_lines"] == 0
    assert [os.path.basename(p) for p in summary.overview["skipped_files"]] == ["config.json", "metrics.json"]
    assert main(["summary", str(run), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "Skipped 2 files that hold no trace events: config.json, metrics.json" in out
    assert "Damaged files" not in out
    watch = subprocess.run([sys.executable, "-m", "dftrace", "watch", str(run), "--interval", "0.1"],
                           capture_output=True, text=True, timeout=60)
    assert watch.returncode == 0 and "2 closed" in watch.stdout


@pytest.mark.parametrize("content", [b"", os.urandom(4096), b"\x1f\x8bnot gzip at all"])
def test_empty_or_garbage_input_is_an_error(tmp_path, capsys, content):
    """A 0-byte or garbage-only input: exit 2 with one line, in every command that
    reads traces; validate --strict rejects a 0-byte file."""
    bad = tmp_path / "in"
    bad.mkdir()
    (bad / "a.pfw").write_bytes(content)
    for argv in _commands(bad, tmp_path)[:-1]:
        assert main([*argv, "--no-progress"]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("dftrace: error: no trace events in 1 file (a.pfw: ") and err.count("\n") == 1, err
    if not content:
        assert [v.rule for v in validate_file(bad / "a.pfw", strict=True)] == ["empty"]


def test_no_paths_at_all_says_so(tmp_path):
    """An empty list of paths (a glob that matched nothing) is named as such, not as
    "no trace events in 0 files"."""
    for fn in (load_traces, summarize):
        with pytest.raises(ValueError, match="^no trace files given"):
            fn([])


def _peak_rss_mb(*argv: str) -> tuple[int, float, str]:
    """Exit code, peak memory (MB) and output of ``dftrace argv`` in a fresh interpreter."""
    code = PEAK_MB + textwrap.dedent(f"""
        import contextlib, io, resource, sys
        from dftrace.cli import main
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = main({list(argv)!r})
        print(rc, peak_mb())
        print(out.getvalue())
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert "Traceback" not in result.stderr, result.stderr
    first, _, rest = result.stdout.partition("\n")
    rc, peak = first.split()
    return int(rc), float(peak), rest


@pytest.fixture(scope="module")
def bombs(tmp_path_factory):
    """Two small zstd files: one expands to a 1 GiB line, one to 4 million valid events."""
    out = tmp_path_factory.mktemp("bombs")
    proc = tracegen.Process(5000, rank=0)
    head = b"[\n" + b"\n".join(orjson.dumps(e) for e in proc.metadata()) + b"\n"
    cctx = zstandard.ZstdCompressor(level=3)
    line_bomb, event_bomb = out / "line", out / "events"
    line_bomb.mkdir()
    event_bomb.mkdir()
    with open(line_bomb / "big-rank0-node0-5000.pfw.zst", "wb") as fh, cctx.stream_writer(fh) as w:
        w.write(head + b'{"name":"')
        block = b"x" * (1 << 20)
        for _ in range(1024):
            w.write(block)
        w.write(b'","ph":"X","ts":1,"dur":1,"pid":5000,"tid":5000}\n')
    event = orjson.dumps({"id": 1, "name": "forward", "cat": "compute", "pid": 5000, "tid": 5000,
                          "ts": tracegen.T0_US, "dur": 5, "ph": "X", "args": {"hhash": proc.hhash, "level": 1}})
    with open(event_bomb / "many-rank0-node0-5000.pfw.zst", "wb") as fh, cctx.stream_writer(fh) as w:
        w.write(head)
        for _ in range(400):
            w.write((event + b"\n") * 10_000)
    assert max(f.stat().st_size for d in (line_bomb, event_bomb) for f in d.iterdir()) < 100_000
    return line_bomb, event_bomb


@pytest.mark.parametrize("command", [
    ["summary"], ["validate"], ["watch", "--once"], ["report", "-o", "{out}.html"],
    ["convert", "-o", "{out}.pfw", "--no-progress"], ["merge", "-o", "{out}.pfw", "--no-progress"],
    ["sql", "SELECT count(*) AS n FROM events"], ["diff", "{bomb}"]])
def test_a_line_bomb_is_one_broken_line_in_bounded_memory(bombs, command, tmp_path):
    """A 33 kB file that expands to a 1 GiB line: one broken line (longer than the
    cap) in every command, read in well under 1 GB of memory."""
    command = [c.format(out=tmp_path / "out", bomb=bombs[0]) for c in command]
    rc, peak, out = _peak_rss_mb(*command, str(bombs[0]))
    assert peak < 1000, peak
    if command == ["summary"]:
        assert rc == 0 and "broken lines 1 " in out
        assert f"a line longer than {MAX_LINE_BYTES >> 20} MiB" in out
    elif command == ["validate"]:
        assert rc == 1 and f"[json] a line longer than {MAX_LINE_BYTES >> 20} MiB" in out
    else:
        assert rc == 0


def test_an_event_bomb_is_summarised_in_bounded_memory(bombs):
    """A 55 kB file that expands to 4 million valid events: counted exactly, in under
    1 GB of memory (the decoded lines are read a piece at a time)."""
    rc, peak, out = _peak_rss_mb("summary", str(bombs[1]))
    assert rc == 0 and "4000000 events" in out
    assert peak < 1000, peak


def test_watch_ends_when_the_writer_is_gone(tmp_path):
    """A process killed before it could finalize leaves a file without ']' (with the
    writer thread: a drainer ends it): watch shows it cut off and ends, instead of
    waiting forever."""
    script = textwrap.dedent(f"""
        import os, signal, time
        import dftrace
        from dftrace import ai
        dftrace.initialize(log_file={str(tmp_path / 'job')!r}, writer="thread")
        for step in range(5):
            ai.update(step=step)
            with ai.compute.forward:
                pass
        time.sleep(1.5)  # a flush
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert killed.returncode == -signal.SIGKILL
    watch = subprocess.run([sys.executable, "-m", "dftrace", "watch", str(tmp_path), "--interval", "0.1"],
                           capture_output=True, text=True, timeout=60)
    assert watch.returncode == 0 and "1 unfinished" in watch.stdout  # whole frames, no ']'; not cut off


@needs("native", native_engine_missing())  # the writer process is the C engine's
def test_summary_says_how_a_killed_process_ended(tmp_path, capsys):
    """writer="process", then kill -9: the file records it and the summary says so."""
    script = textwrap.dedent(f"""
        import os, signal
        import dftrace
        from dftrace import ai
        dftrace.initialize(log_file={str(tmp_path / 'job')!r}, writer="process")
        with ai.compute.forward:
            pass
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert subprocess.run([sys.executable, "-c", script], timeout=60).returncode == -signal.SIGKILL
    # The writer process outlives the job: it records how the job ended and completes
    # the file once it has seen the job gone.
    wait_for_end(tmp_path)
    summary = summarize(tmp_path)
    assert [p["ended"] for p in summary.processes] == ["killed by signal 9"]
    assert summary.overview["ended_abnormally"] == 1
    assert main(["summary", str(tmp_path), "--no-progress"]) == 0
    assert "  ended abnormally: " in capsys.readouterr().out


def test_watch_ends_on_files_that_name_no_writer(tmp_path):
    """Garbage (or another tool's unfinished file) names no writer: once it has not
    grown for --stale seconds, watch counts it as done and ends."""
    (tmp_path / "a.pfw").write_bytes(os.urandom(4096))
    (tmp_path / "b.pfw.gz").write_bytes(b"\x1f\x8bnot gzip at all")
    for f in tmp_path.iterdir():
        os.utime(f, (f.stat().st_atime - 60, f.stat().st_mtime - 60))
    watch = subprocess.run([sys.executable, "-m", "dftrace", "watch", str(tmp_path), "--interval", "0.1",
                            "--stale", "5"], capture_output=True, text=True, timeout=60)
    assert watch.returncode == 0 and "2 files" in watch.stdout and "Traceback" not in watch.stderr
