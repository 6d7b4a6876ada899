"""`dftrace sql`: queries over the events table and its views give the numbers the
written events hold, in every output format, and bad queries are one clear line."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import tracegen
from conftest import SLOW

pl = pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

from polars.testing import assert_frame_equal  # noqa: E402

from dftrace.analysis import load_traces, run_sql, summarize  # noqa: E402
from dftrace.analysis.commands import main  # noqa: E402
from dftrace.analysis.read.schema import EVENT_COLUMNS  # noqa: E402
from dftrace.analysis.read.sources import expand_paths, plan_paths  # noqa: E402
from dftrace.analysis.answers.sql import VIEWS, TraceTables  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
RANKS, EPOCHS, STEPS = 4, 2, 4


def test_counts_and_sums_match_the_written_events(run_dir):
    """Per rank: one forward per step, and backward time holds the slow steps' extra µs."""
    result = run_sql(
        "SELECT rank, count(*) AS n, sum(dur) AS total FROM spans WHERE name = 'backward' GROUP BY rank ORDER BY rank",
        run_dir,
    )
    extra = {rank: sum(us for (r, _, _), us in SLOW.items() if r == rank) for rank in range(RANKS)}
    assert result.rows() == [
        (rank, EPOCHS * STEPS, EPOCHS * STEPS * tracegen.BACKWARD_US + extra[rank]) for rank in range(RANKS)
    ]
    total = run_sql("SELECT count(*) AS n FROM events", run_dir).item()
    assert total == RANKS * len(tracegen.training_process(1000).events)
    # An unnamed count(*) is named so, as SQL engines name it (polars says "len").
    unnamed = run_sql("SELECT name, count(*) FROM spans WHERE name = 'backward' GROUP BY name", run_dir)
    assert unnamed.columns == ["name", "count(*)"] and unnamed.rows() == [("backward", RANKS * EPOCHS * STEPS)]


def test_steps_view_has_one_row_per_step_per_rank_with_the_slow_ones(run_dir):
    """The step model's steps: each rank's slowest step is the one made slow, longer by its extra µs."""
    steps = run_sql("SELECT * FROM steps", run_dir)
    assert steps.height == RANKS * EPOCHS * STEPS
    assert steps.columns == ["rank", "unit", "epoch", "step", "ts", "end", "dur", "n_spans"]
    assert (steps.get_column("end") - steps.get_column("ts")).to_list() == steps.get_column("dur").to_list()
    for (rank, epoch, step), extra in SLOW.items():
        mine = steps.filter(pl.col("rank") == rank).sort("dur", descending=True)
        assert mine.select("epoch", "step").row(0) == (epoch, step)
        assert mine.item(0, "dur") - mine.get_column("dur").median() == extra


def test_collectives_view_holds_each_all_reduce_with_its_group_and_number(run_dir):
    """One row per all-reduce per rank; seq numbers each group's calls once per rank."""
    result = run_sql(
        'SELECT "group", count(*) AS n, count(DISTINCT seq) AS calls, sum(dur) AS us FROM collectives GROUP BY "group"',
        run_dir,
    )
    assert result.rows() == [("0", RANKS * EPOCHS * STEPS, EPOCHS * STEPS, RANKS * EPOCHS * STEPS * tracegen.ALL_REDUCE_US)]


def test_other_args_are_typed_columns_and_bytes_reach_the_collectives_view(tmp_path):
    """Args the tables do not name become columns of their JSON type; `bytes` fills collectives."""
    proc = tracegen.Process(3000, rank=0)
    for i in range(10):
        proc.span("all_reduce", "comm", tracegen.T0_US + i * 100, 50, group="0", seq=i + 1, bytes=1000 * (i + 1))
        proc.span("optimizer", "compute", tracegen.T0_US + i * 100 + 60, 10, lr=0.5 / (i + 1), note=f"n{i}",
                  nested={"a": [i]})
    tracegen.write_process(tmp_path, proc)
    tables = TraceTables(tmp_path)
    assert {c: str(t) for c, (_, t) in tables.arg_columns.items()} == {
        "bytes": "Int64", "lr": "Float64", "note": "String", "nested": "String"}
    result = run_sql("SELECT sum(bytes) AS b, sum(dur) AS us FROM collectives", tmp_path)
    assert result.row(0) == (55_000, 500)
    args = run_sql("SELECT lr, note, nested FROM spans WHERE name = 'optimizer' ORDER BY ts LIMIT 2", tmp_path)
    assert args.rows() == [(0.5, "n0", '{"a":[0]}'), (0.25, "n1", '{"a":[1]}')]


def test_only_the_columns_a_query_names_are_decoded(run_dir):
    """polars tells the scan which columns the query uses: the load decodes those alone."""
    tables = TraceTables(run_dir)
    tables.context().execute("SELECT name, sum(dur) FROM events GROUP BY name", eager=False).collect()
    assert tables.loads == [("pid", "name", "dur")]


def test_views_and_columns_are_listed_in_help(capsys):
    """--help names every column of the events table and every view."""
    with pytest.raises(SystemExit):
        main(["sql", "--help"])
    text = capsys.readouterr().out
    for name in [*EVENT_COLUMNS, *VIEWS, "events"]:
        assert re.search(rf"\b{re.escape(name)}\b", text), name


QUERY = "SELECT rank, count(*) AS n, sum(dur) AS us FROM spans WHERE cat = 'compute' GROUP BY rank ORDER BY rank"


def test_the_traces_before_the_query_are_named_as_such(run_dir, capsys):
    """The traces given first and the query after: the command says which comes first,
    instead of that no trace file is found at the query."""
    assert main(["sql", str(run_dir), QUERY]) == 2
    err = capsys.readouterr().err
    assert "the query comes first" in err and "no trace files" not in err


def test_every_output_format_holds_the_same_rows(run_dir, tmp_path, capsys):
    """Table, --csv, --json and -o .parquet/.csv/.json all hold the query's result."""
    expected = run_sql(QUERY, run_dir)
    assert main(["sql", QUERY, str(run_dir)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split("|")[1:-1] == [" rank ", " n ", " us "] or table[0].replace(" ", "") == "|rank|n|us|"
    assert len(table) == 2 + expected.height
    assert main(["sql", QUERY, str(run_dir), "--csv"]) == 0
    assert capsys.readouterr().out == expected.write_csv()
    assert main(["sql", QUERY, str(run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == expected.to_dicts()
    for suffix, read in ((".parquet", pl.read_parquet), (".csv", pl.read_csv), (".json", None)):
        out = tmp_path / f"result{suffix}"
        assert main(["sql", QUERY, str(run_dir), "-o", str(out)]) == 0
        assert f"wrote {out}: {expected.height} rows" in capsys.readouterr().out
        if read is None:
            assert json.loads(out.read_text()) == expected.to_dicts()
        else:
            assert_frame_equal(read(out), expected, check_dtypes=read is pl.read_parquet)


def test_long_results_are_cut_in_the_table_and_say_so(run_dir, capsys):
    """--rows bounds the terminal table and says how many rows were left out."""
    assert main(["sql", "SELECT * FROM steps", str(run_dir), "--rows", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + 5 + 1
    assert lines[-1].startswith(f"({RANKS * EPOCHS * STEPS - 5} more rows: --rows")


@pytest.mark.parametrize("command, old", [
    (["sql", "SELECT * FROM steps"], "--max-rows"),
    (["summary"], "--top"),
])
def test_old_names_of_rows_still_work_and_say_they_are_deprecated(run_dir, capsys, command, old):
    """The row limit's old names are hidden aliases of --rows: same output, a note on stderr."""
    assert main([*command, str(run_dir), "--rows", "3"]) == 0
    with_rows = capsys.readouterr().out
    assert main([*command, str(run_dir), old, "3"]) == 0
    got = capsys.readouterr()
    assert got.out == with_rows
    assert f"{old} is deprecated; use --rows" in got.err


@pytest.mark.parametrize("query, says", [
    ("SELEC name FROM events", "sql parser error"),
    ("SELECT no_such_column FROM events", 'unable to find column "no_such_column"'),
    ("SELECT * FROM no_such_table", "no_such_table"),
    ("SELECT * FROM spanz", "'spanz' was not found; the tables are events, spans, steps,"),
])
def test_a_bad_query_is_one_line_and_exit_status_2(run_dir, capsys, query, says):
    """A query polars cannot run prints one error line (no traceback, no plan) and exits 2."""
    assert main(["sql", query, str(run_dir)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dftrace: error: in the query: ") and says in lines[0]


@pytest.mark.parametrize("query", ["DROP TABLE spans", "  -- a comment\n create table t as select 1"])
def test_a_statement_that_changes_tables_is_refused(run_dir, capsys, query):
    """``DROP TABLE`` printed an empty table and exited 0, as if it answered."""
    assert main(["sql", query, str(run_dir)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "changes tables rather than asks for rows" in captured.err


def test_an_unknown_output_suffix_fails_before_loading(run_dir, tmp_path, capsys):
    """-o with a suffix that names no format is an error naming the known ones."""
    assert main(["sql", "SELECT 1", str(run_dir), "-o", str(tmp_path / "out.txt")]) == 2
    assert ".parquet, .csv, .json" in capsys.readouterr().err


def test_dftracer_traces_answer_like_the_loaded_table():
    """On DFTracer 1.x/2.x samples (integer phases, gzip), counts match load_traces (the
    file calls, cat POSIX and STDIO, are the io table's, not spans) of the files but
    the one that holds another's events (a trace beside its first 40 lines, which are
    all of it), which sql leaves out as the summary does."""
    samples = DATA / "dftracer"
    copies = []
    assert run_sql("SELECT count(*) FROM events", samples, copies=copies).item() > 0
    assert [os.path.basename(c["path"]) for c in copies] == ["toy-d0cbbad3ce748659-fork.pfw.gz"]
    assert [c["path"] for c in copies] == [c["path"] for c in summarize(samples).overview["duplicate_files"]]
    trace = load_traces([path for path in expand_paths([samples]) if path != copies[0]["path"]])
    by_cat = run_sql("SELECT cat, count(*) AS n, sum(dur) AS us FROM spans GROUP BY cat ORDER BY cat", samples)
    expected = (
        trace.events.filter((pl.col("ph") == "X") & ~pl.col("cat").is_in(["POSIX", "STDIO"])).group_by("cat")
        .agg(pl.len().cast(pl.Int64).alias("n"), pl.col("dur").sum().alias("us")).sort("cat")
    )
    assert_frame_equal(by_cat, expected, check_dtypes=False)
    assert run_sql("SELECT count(*) FROM events", samples).item() == trace.events.height
    calls = trace.events.filter((pl.col("ph") == "X") & pl.col("cat").is_in(["POSIX", "STDIO"])).height
    assert calls and run_sql("SELECT count(*) FROM io", samples).item() == calls


def test_queries_run_on_dask_as_embedded(run_dir, dask_executor):
    """The loading runs through the same per-partition reader on Dask workers."""
    for query in ("SELECT rank, epoch, step, dur FROM steps ORDER BY rank, epoch, step", QUERY):
        assert_frame_equal(run_sql(query, run_dir, executor=dask_executor, partition_bytes=2048),
                           run_sql(query, run_dir))


def test_a_rank_recorded_after_the_first_events_is_every_rows(tmp_path):
    """The events reach the query a partition at a time; a rank the metadata gives only
    after a process's first partitions (set once the job's ranks are known) is still
    every row's, as when the whole trace is loaded: the query is run again with it."""
    proc = tracegen.Process(4000, rank=None)
    for i in range(2000):
        proc.span("forward", "compute", tracegen.T0_US + i * 100, 50)
    late = {"name": "PR", "cat": "dftrace", "pid": 4000, "tid": 4000, "ph": "M",
            "args": {"hostname": proc.host, "rank": 3}}
    tracegen.write_process(tmp_path, proc, compression="none", extra_lines=[json.dumps(late).encode()])
    loaded = load_traces(tmp_path).events
    assert loaded.get_column("rank").unique().to_list() == [3]
    query = "SELECT rank, count(*) AS n FROM events GROUP BY rank ORDER BY rank"
    tables = TraceTables(tmp_path, partition_bytes=4096)
    assert len(tables._plan) > 2
    first = tables.context().execute(query, eager=False).collect(engine="streaming")
    assert None in first.get_column("rank").to_list() and tables.stale  # the first read could not know
    assert run_sql(query, tmp_path, partition_bytes=4096).rows() == [(3, loaded.height)]
    assert run_sql("SELECT count(*) FROM events WHERE rank = 3", tmp_path, partition_bytes=4096).item() \
        == loaded.height


def test_a_limit_over_a_filter_ends_every_read(tmp_path):
    """A LIMIT polars cannot hand to the scan (one over a filtered view) stops the query
    before the files end: its reads end with it, no thread is left reading, and the
    process exits as it should (the streaming engine unwound a Python scan it stopped,
    and the interpreter aborted at exit)."""
    import subprocess
    import sys

    proc = tracegen.training_process(1000, rank=0, epochs=4, steps=500)
    tracegen.write_process(tmp_path, proc)
    program = ("import sys, threading\n"
               "from dftrace.analysis import run_sql\n"
               "r = run_sql(sys.argv[2], sys.argv[1], partition_bytes=16384, progress=False)\n"
               "print(r.height, [t.name for t in threading.enumerate() if t.name.startswith('ThreadPool')])\n")
    for query in ("SELECT rank, name FROM spans WHERE dur > 0 LIMIT 3", "SELECT name FROM events LIMIT 4"):
        done = subprocess.run([sys.executable, "-c", program, str(tmp_path), query], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split("\n")[0] in ("3 []", "4 []"), done.stdout


def test_a_limit_over_a_filter_stops_reading_once_it_has_its_rows(tmp_path, monkeypatch):
    """A LIMIT right over a filtered view (``spans``) is given to the scan: it stops once
    it gave offset + length rows that pass the filter, and the rows are those of the
    whole trace's in file order."""
    import dftrace.analysis.answers.sql as sql

    proc = tracegen.training_process(1000, rank=0, epochs=4, steps=500)
    tracegen.write_process(tmp_path, proc)
    spans = load_traces(tmp_path).events.filter((pl.col("ph") == "X") & ~pl.col("cat").is_in(["POSIX", "STDIO"]))
    read = []
    real = sql.read_partition
    monkeypatch.setattr(sql, "read_partition", lambda p, **kw: read.append(p) or real(p, **kw))
    plan = plan_paths(tmp_path, 16384)
    for query, expected in [
        ("SELECT name, dur FROM spans WHERE dur > 100 LIMIT 3", spans.filter(pl.col("dur") > 100).head(3)),
        ("SELECT name, dur FROM spans LIMIT 2 OFFSET 5", spans.slice(5, 2)),
        ("SELECT name, dur * 2 AS dur FROM spans WHERE name = 'forward' LIMIT 3",
         spans.filter(pl.col("name") == "forward").head(3).with_columns(pl.col("dur") * 2)),
    ]:
        read.clear()
        result = run_sql(query, tmp_path, partition_bytes=16384)
        assert result.rows() == expected.select("name", "dur").rows(), query
        assert len(read) <= 6 < len(plan), query  # the first partitions, and a few read ahead


def test_partitions_are_read_a_few_ahead_of_the_query():
    """``imap`` hands results over in order with at most threads + 1 items started ahead
    of the one the consumer takes: what a streamed query holds is bounded by those."""
    from dftrace.analysis.runtime.executor import EmbeddedExecutor

    started: list[int] = []
    consumed: list[int] = []

    def work(i: int) -> int:
        started.append(i)
        return i * i

    for i, result in enumerate(EmbeddedExecutor(2).imap(work, list(range(40)), progress=False)):
        assert result == i * i
        assert len(started) <= i + 1 + 3, (i, started)  # this one and three ahead at most
        consumed.append(i)
    assert consumed == list(range(40)) and sorted(started) == list(range(40))


def _documented_queries() -> list[tuple[str, str]]:
    text = (ROOT / "docs" / "analysis.md").read_text()
    section = text.split("### Ten questions, one query each", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```console\n\$ (dftrace sql .*?)\n(.*?)```", section, re.S)
    return [(command, output) for command, output in blocks]


def test_docs_show_ten_questions_with_their_real_output(monkeypatch, capsys):
    """Each query of docs/analysis.md's ten questions prints, on ddp-run, what the page shows."""
    import shlex

    documented = _documented_queries()
    assert len(documented) == 10
    monkeypatch.chdir(DATA)
    for command, output in documented:
        argv = shlex.split(command)[1:]
        assert main(argv) == 0, command
        assert capsys.readouterr().out == output, command
    assert os.path.isdir(DATA / "ddp-run")


def test_a_converted_parquet_file_answers_like_the_trace_files(run_dir, tmp_path):
    """Parquet from `dftrace convert` gives the same rows, other args included."""
    from dftrace.analysis import write_trace

    proc = tracegen.Process(3000, rank=0)
    for i in range(5):
        proc.span("all_reduce", "comm", tracegen.T0_US + i * 100, 50, group="0", seq=i + 1, bytes=10 * (i + 1))
    tracegen.write_process(tmp_path, proc)
    parquet = tmp_path / "converted.parquet"
    write_trace(load_traces(tmp_path), parquet)
    query = "SELECT seq, bytes, dur FROM collectives ORDER BY seq"
    assert_frame_equal(run_sql(query, parquet), run_sql(query, tmp_path / "train-rank0-node0-3000.pfw.zst"))
    assert run_sql(query, parquet).get_column("bytes").to_list() == [10, 20, 30, 40, 50]
