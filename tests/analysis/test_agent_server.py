"""``dftrace mcp``: a real server process driven by the MCP SDK's own stdio client. Each
tool's answer is the matching part of what ``dftrace summary --json`` (``diff --json``,
``sql --json``, ``validate --json``) prints for the same path; paths outside the root,
however written, and queries that read files are refused."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")
pytest.importorskip("mcp", reason="needs the MCP SDK: pip install 'dftrace[mcp]'")

import anyio  # noqa: E402
import orjson  # noqa: E402
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

from dftrace.analysis import agent_server  # noqa: E402
from dftrace.analysis.answers.summary import Summary, headline  # noqa: E402
from dftrace.analysis.commands import main as analysis_main  # noqa: E402
from dftrace.analysis.render.text import findings, straggler_lines  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data"
#: Rows enough that no list of these runs is cut.
ALL = 1_000_000
#: The runs under the root: the demo (one process, file I/O traced), two DDP ranks, two
#: GPU ranks' profiler traces.
RUNS = ("demo", "ddp", "gpu")
SPANS_BY_NAME = ("SELECT cat, name, count(*) AS n, sum(dur) AS total_us FROM spans GROUP BY cat, name "
                 "ORDER BY total_us DESC, name")
FILE_READS = [
    "SELECT * FROM read_csv('{secret}')",
    "SELECT * FROM read_csv /* a comment */ ('{secret}')",
    "SELECT * FROM \"read_csv\"('{secret}')",
    "SELECT * FROM `READ_CSV`('{secret}')",
    "SELECT * FROM read_parquet('{secret}')",
    "SELECT * FROM read_ndjson('{secret}')",
    "WITH t AS (SELECT * FROM read_json('{secret}')) SELECT * FROM t",
]


@dataclass
class Answer:
    """A tool call's result as the client got it."""

    error: bool
    text: str
    data: Any  # the structured content


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The root with the runs, a file that breaks the format's rules, and ways out of it:
    a directory beside the root, a symlink to it and a symlinked trace file."""
    base = tmp_path_factory.mktemp("mcp")
    root, outside = base / "root", base / "outside"
    root.mkdir()
    outside.mkdir()
    made = subprocess.run([sys.executable, "-m", "dftrace", "demo", "--io", "--epochs", "2", "--out",
                           str(root / "demo")], capture_output=True, text=True, env=_environment())
    assert made.returncode == 0, made.stderr
    shutil.copytree(DATA / "ddp-run", root / "ddp", ignore=shutil.ignore_patterns("*.md"))
    shutil.copytree(DATA / "gpu-job", root / "gpu")
    for side in ("base", "new"):
        shutil.copytree(DATA / "diff-runs" / side / "run0", root / "diff" / side)
    (root / "bad").mkdir()
    (root / "bad" / "broken.pfw").write_text('[\n{"name": "x", "ph": "X", "ts": -1}\n')
    secret = outside / "secret.csv"
    secret.write_text("word,number\nhidden-in-the-file,7\n")
    shutil.copy(next((root / "ddp").iterdir()), outside)
    (root / "escape").symlink_to(outside, target_is_directory=True)
    (root / "sneaky").mkdir()
    (root / "sneaky" / "rank0.pfw.zst").symlink_to(next(outside.glob("*.pfw.zst")))
    return {"root": root, "outside": outside, "secret": secret,
            **{run: next(p.parent for p in (root / run).rglob("*") if p.is_file()) for run in RUNS}}


def _environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def _ask(root: Path, calls: Sequence[tuple[str, dict[str, Any]]]) -> tuple[list[Any], list[Answer]]:
    """Start ``dftrace mcp --root ROOT``, list its tools and make ``calls`` in one session."""

    async def session() -> tuple[list[Any], list[Answer]]:
        server = StdioServerParameters(command=sys.executable, args=["-m", "dftrace", "mcp", "--root", str(root)],
                                       env=_environment())
        async with stdio_client(server) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            tools = (await client.list_tools()).tools
            answers = []
            for name, arguments in calls:
                result = await client.call_tool(name, arguments)
                text = "".join(getattr(block, "text", "") for block in result.content)
                answers.append(Answer(result.is_error, text, result.structured_content))
            return tools, answers

    return anyio.run(session)


def _cli_json(*argv: str) -> Any:
    """What ``dftrace ARGV`` prints, read as JSON."""
    done = subprocess.run([sys.executable, "-m", "dftrace", *argv], capture_output=True, env=_environment())
    assert done.returncode in (0, 1), done.stderr.decode()
    return orjson.loads(done.stdout)


def _calls(places: dict[str, Path]) -> dict[str, tuple[str, dict[str, Any]]]:
    root, outside = places["root"], places["outside"]
    calls: dict[str, tuple[str, dict[str, Any]]] = {"list_runs": ("list_runs", {"limit": ALL})}
    for run in RUNS:
        for tool in ("summary", "steps", "stragglers", "dataloader", "gpu", "io", "breakdown"):
            # the demo by its path relative to the root, the others absolute
            path = str(places[run].relative_to(root)) if run == "demo" else str(places[run])
            calls[f"{tool} {run}"] = (tool, {"path": path, "limit": ALL})
    calls["steps capped"] = ("steps", {"path": str(places["ddp"]), "limit": 2})
    calls["diff"] = ("diff", {"base": "diff/base", "new": "diff/new", "limit": ALL})
    calls["sql"] = ("sql", {"path": "ddp", "query": SPANS_BY_NAME, "limit": 3})
    calls["validate"] = ("validate", {"path": "bad", "limit": ALL})
    calls["validate ddp"] = ("validate", {"path": "ddp"})
    refused = {"absolute": str(outside), "dotdot": "../outside", "dotdot inside": "ddp/../../outside",
               "symlink": "escape", "symlinked file": "sneaky", "glob": "escape/*.pfw.zst"}
    for why, path in refused.items():
        calls[f"refused {why}"] = ("summary", {"path": path})
    calls["refused diff"] = ("diff", {"base": "ddp", "new": str(outside)})
    calls["refused sql"] = ("sql", {"path": "escape", "query": "SELECT count(*) AS n FROM events"})
    for k, query in enumerate(FILE_READS):
        calls[f"file read {k}"] = ("sql", {"path": "ddp", "query": query.format(secret=places["secret"])})
    calls["missing"] = ("summary", {"path": "no-such-run"})
    calls["missing absolute"] = ("steps", {"path": str(root / "gone" / "run-9")})
    return calls


@pytest.fixture(scope="module")
def session(places: dict[str, Path]) -> tuple[list[Any], dict[str, Answer]]:
    """The tools the server lists and its answer to each call of :func:`_calls`."""
    calls = _calls(places)
    tools, answers = _ask(places["root"], list(calls.values()))
    return tools, dict(zip(calls, answers))


@pytest.fixture(scope="module")
def truth(places: dict[str, Path]) -> dict[str, Any]:
    """What the command line prints for the same paths (the ground truth)."""
    root = places["root"]
    found = {run: _cli_json("summary", "--json", str(places[run])) for run in RUNS}
    found["diff"] = _cli_json("diff", "--json", str(root / "diff" / "base"), str(root / "diff" / "new"))
    found["sql"] = _cli_json("sql", "--json", SPANS_BY_NAME, str(root / "ddp"))
    found["validate"] = _cli_json("validate", "--json", str(root / "bad"))
    return found


def test_lists_every_tool_with_its_parameters(session):
    """The tools are listed, each described, taking a path (two for diff), read-only."""
    tools = {tool.name: tool for tool in session[0]}
    assert set(tools) == set(agent_server.TOOLS)
    for name, tool in tools.items():
        assert tool.description and tool.annotations.read_only_hint, name
        wanted = {"list_runs": set(), "diff": {"base", "new"}, "sql": {"path", "query"}}.get(name, {"path"})
        assert set(tool.input_schema.get("required", [])) == wanted, name
        assert "limit" in tool.input_schema["properties"], name


@pytest.mark.parametrize("run", RUNS)
def test_answers_are_parts_of_the_summary(session, truth, places, run):
    """Each question's answer is the matching part of ``dftrace summary --json`` on the
    same path, the text content the same JSON as the structured one."""
    answers, expected = session[1], truth[run]
    got = {tool: answers[f"{tool} {run}"] for tool in ("summary", "steps", "stragglers", "dataloader", "gpu",
                                                        "io", "breakdown")}
    for tool, answer in got.items():
        assert not answer.error, answer.text
        assert orjson.loads(answer.text) == answer.data
        assert answer.data["path"] == str(places[run])
    summary = Summary.from_dict(expected)
    assert got["summary"].data["overview"] == expected["overview"]
    assert got["summary"].data["headline"] == "; ".join(headline(summary))
    assert f"{expected['overview']['events']:,} events" in got["summary"].data["headline"]
    assert got["summary"].data["findings"] == findings(summary)
    steps = got["steps"].data
    assert steps["step_stats"] == expected["step_stats"] and steps["epochs"] == expected["epochs"]
    assert steps["steps"] == len(expected["steps"])
    assert sorted(map(orjson.dumps, steps["slowest_steps"])) == sorted(map(orjson.dumps, expected["steps"]))
    assert [s["max_us"] for s in steps["slowest_steps"]] == sorted((s["max_us"] for s in expected["steps"]),
                                                                    reverse=True)
    stragglers = got["stragglers"].data
    assert stragglers["stragglers"] == expected["stragglers"]
    assert stragglers["collectives"] == expected["collectives"]
    assert stragglers["imbalance"] == expected["imbalance"]
    assert stragglers["finding"] == straggler_lines(summary)
    assert got["dataloader"].data["dataloader"] == expected["dataloader"]
    assert {k: got["gpu"].data[k] for k in ("gpu", "gpu_steps", "gpu_spans")} == \
        {k: expected[k] for k in ("gpu", "gpu_steps", "gpu_spans")}
    assert got["io"].data["io"] == expected["io"]
    assert got["breakdown"].data["breakdown"] == expected["breakdown"]
    assert got["breakdown"].data["categories"] == expected["categories"]


def test_the_runs_hold_what_each_tool_is_about(truth):
    """The answers compared above are not empty ones: the demo traced file I/O and a
    data loader, the DDP ranks have a straggler, the profiler traces GPU answers."""
    assert truth["demo"]["dataloader"] and truth["demo"]["steps"]
    assert truth["ddp"]["stragglers"][0]["significant"] and truth["ddp"]["overview"]["ranks"] == 2
    assert truth["gpu"]["gpu"]
    if truth["demo"]["io"]:  # where file I/O can be traced (Linux, the C module built)
        assert truth["demo"]["io"]["ops"] > 0


def test_long_lists_are_cut_and_say_how_many_were_left_off(session, truth):
    """``limit`` rows of each list; ``<list>_left_off`` counts the rest."""
    steps, expected = session[1]["steps capped"].data, truth["ddp"]
    slowest = sorted(expected["steps"], key=lambda s: s["max_us"], reverse=True)
    assert [s["max_us"] for s in steps["slowest_steps"]] == [s["max_us"] for s in slowest[:2]]
    assert steps["slowest_steps_left_off"] == len(expected["steps"]) - 2
    assert "epochs_left_off" not in steps  # two epochs: nothing cut
    sql = session[1]["sql"].data
    assert sql["rows"] == truth["sql"][:3] and sql["rows_left_off"] == len(truth["sql"]) - 3


def test_capping_keeps_numeric_series_whole():
    """Histogram bins are a value, not rows: only lists of rows are cut; and their
    labels beside them stay whole with them (the io answer's size buckets: before,
    2 labels for 10 counts)."""
    data = {"edges_us": list(range(30)), "rows": [{"a": i, "ranks": list("abc")} for i in range(5)]}
    assert agent_server.capped(data, 2) == {
        "edges_us": list(range(30)), "rows": [{"a": 0, "ranks": ["a", "b"], "ranks_left_off": 1},
                                              {"a": 1, "ranks": ["a", "b"], "ranks_left_off": 1}],
        "rows_left_off": 3}
    sizes = {"buckets": [f"b{i}" for i in range(10)], "read": [0, 0, 1600] + [0] * 7, "write": [0] * 10}
    assert agent_server.capped({"sizes": sizes}, 2) == {"sizes": sizes}


def test_diff_is_dftrace_diff(session, truth):
    """``diff`` compares two runs as ``dftrace diff --json`` does."""
    answer = session[1]["diff"]
    assert not answer.error, answer.text
    assert answer.data == truth["diff"]
    assert "step.p50" in {row["metric"] for row in answer.data["rows"]}


def test_validate_is_dftrace_validate(session, truth, places):
    """``validate`` reports each file's broken rules as ``dftrace validate --json``."""
    answer = session[1]["validate"].data
    assert answer["files"] == 1 and answer["failed"] == 1
    assert {row["path"]: row["violations"] for row in answer["report"]} == truth["validate"]
    clean = session[1]["validate ddp"].data
    assert clean["files"] == 2 and clean["failed"] == 0


def test_list_runs_finds_the_trace_directories(session, places):
    """Every directory under the root holding trace files, with its files and bytes;
    not the traces a symlink leads to outside the root."""
    runs = {run["path"]: run for run in session[1]["list_runs"].data["runs"]}
    root = places["root"]
    expected = {places["demo"], root / "ddp", root / "gpu", root / "diff" / "base", root / "diff" / "new",
                root / "bad"}
    assert set(runs) == {str(p) for p in expected}
    for directory in expected:
        files = [p for p in directory.iterdir() if p.is_file()]
        assert runs[str(directory)]["files"] == len(files)
        assert runs[str(directory)]["bytes"] == sum(p.stat().st_size for p in files)
    assert session[1]["list_runs"].data["roots"] == [str(root)]


@pytest.mark.parametrize("why", ["absolute", "dotdot", "dotdot inside", "symlink", "symlinked file", "glob",
                                 "diff", "sql"])
def test_paths_outside_the_root_are_refused(session, places, why):
    """A path that is, or leads to a file, outside the root (absolute, through ``..`` or a
    symlink) gets an error naming the root, and nothing of what is there."""
    answer = session[1][f"refused {why}"]
    assert answer.error
    assert "outside the roots" in answer.text and str(places["root"]) in answer.text
    assert "rank 1" not in answer.text


@pytest.mark.parametrize("k", range(len(FILE_READS)))
def test_sql_that_reads_files_is_refused(session, k):
    """A query calling a table function that reads files is refused however it is
    written, and the file's content never comes back."""
    answer = session[1][f"file read {k}"]
    assert answer.error and "reads files" in answer.text
    assert "hidden-in-the-file" not in answer.text


@pytest.mark.parametrize("call", ["missing", "missing absolute"])
def test_a_path_that_is_not_there_says_so(session, call):
    """A path with nothing there is an error result saying so, relative or absolute."""
    answer = session[1][call]
    assert answer.error and "does not exist" in answer.text


def test_a_summary_is_read_once_until_its_files_change(places, monkeypatch):
    """Several questions about one run summarise it once; a file that changes (its
    modification time) makes the next question read it again."""
    counted: list[str] = []
    real = agent_server.summarize

    def counting(path: str, **options: Any) -> Summary:
        counted.append(path)
        return real(path, **options)

    monkeypatch.setattr(agent_server, "summarize", counting)
    answers = agent_server.TraceAnswers([str(places["root"])])
    for tool in ("summary", "steps", "stragglers", "breakdown"):
        getattr(answers, tool)("ddp")
    assert counted == [str(places["ddp"])]
    trace = next(places["ddp"].glob("*.pfw.zst"))
    stat = trace.stat()
    os.utime(trace, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    answers.steps("ddp")
    assert counted == [str(places["ddp"])] * 2


def test_without_the_sdk_the_command_names_the_extra(monkeypatch, capsys):
    """``dftrace mcp`` where the SDK is not installed says what to install."""
    monkeypatch.setitem(sys.modules, "mcp", None)
    assert analysis_main(["mcp"]) == 2
    assert "install 'dftrace[mcp]'" in capsys.readouterr().err


def test_a_root_that_is_not_a_directory_is_an_error(tmp_path, capsys):
    """``--root`` must name a directory: the command says which one does not (exit status 2)."""
    assert analysis_main(["mcp", "--root", str(tmp_path / "nothing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
