"""The ``dftrace`` command: demo and run."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from dftrace import testing
from dftrace.cli import build_parser, main

from ._util import assert_valid, check_nesting


def test_demo_writes_a_trace_with_every_category(tmp_path, capsys):
    """``dftrace demo`` traces the toy pipeline, says where the trace is and what is in it."""
    assert main(["demo", "--out", str(tmp_path), "--epochs", "2", "--samples", "64"]) == 0
    out = capsys.readouterr().out
    files = testing.trace_files(tmp_path)
    assert len(files) == 1 and os.path.basename(files[0]) in out and "spans in" in out
    events = testing.read_events(tmp_path)
    cats = {e["cat"] for e in testing.spans(events)}
    assert cats == {"compute", "data", "dataloader", "comm", "device", "checkpoint", "pipeline"}
    assert len(testing.spans(events, "epoch.block")) == 2
    assert len(testing.spans(events, "item")) == 64 * 2 * 2 + 1
    check_nesting(events)
    assert_valid(files)


def test_run_traces_a_script_and_keeps_its_exit_code(tmp_path):
    """``dftrace run script.py args`` traces the script, passes its args and returns its exit code."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import sys
        from dftrace import ai
        with ai.pipeline.train(args={"argv": sys.argv[1:]}):
            pass
        sys.exit(3)
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACE_")}
    out = subprocess.run([sys.executable, "-m", "dftrace", "run", "--log-file", str(tmp_path / "t"),
                          "--compression", "gzip", str(script), "a", "--b"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 3, out.stderr
    events = testing.read_events(tmp_path)
    (train,) = testing.spans(events, "train")
    assert train["args"]["argv"] == ["a", "--b"]
    # the process's command line is the script's (as `python job.py a --b` records it):
    # what the answers name a rankless process by, not `dftrace run ...`
    (pr,) = [e for e in events if e.get("name") == "PR"]
    assert pr["args"]["cmdline"] == [str(script), "a", "--b"]


def test_run_s_next_command_pastes_as_it_is(tmp_path):
    """The command ``dftrace run`` suggests names the trace's folder, quoted where it
    has a space: pasted into a shell, it reads that folder."""
    script = tmp_path / "job.py"
    script.write_text("from dftrace import ai\nwith ai.compute.forward:\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACE_")}
    out = subprocess.run([sys.executable, "-m", "dftrace", "run", "--log-file", "trace dir/t", str(script)],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    command = out.stderr.split("next: ", 1)[1].split("   (")[0]
    assert shlex.split(command) == ["dftrace", "summary", "trace dir"]


def test_run_of_a_launcher_names_its_children_s_files(tmp_path):
    """A launcher (torchrun) records nothing; its child does: the files are the
    child's (it said "trace written to (none) and 1 file of its child processes")."""
    script = tmp_path / "launch.py"
    script.write_text(textwrap.dedent("""
        import subprocess, sys
        subprocess.run([sys.executable, "-c", "from dftrace import ai\\nwith ai.compute.forward:\\n    pass"],
                       check=True)
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACE_")}
    out = subprocess.run([sys.executable, "-m", "dftrace", "run", "--log-file", str(tmp_path / "t" / "job"),
                          str(script)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "trace written to 1 file of its child processes" in out.stderr, out.stderr
    assert len(testing.trace_files(tmp_path / "t")) == 1


def test_run_counts_the_files_of_a_forkservers_workers(tmp_path):
    """A forkserver pool's workers descend from the run through the forkserver's
    server, which writes no file: their files are the run's children's too (they were
    left out of the count: "1 file" for 3)."""
    script = tmp_path / "pool.py"
    script.write_text(textwrap.dedent("""
        import multiprocessing as mp
        from dftrace import ai

        def work(i):
            with ai.compute.forward:
                return i

        if __name__ == "__main__":
            with ai.compute.forward:
                pass
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload([])
            procs = [ctx.Process(target=work, args=(i,)) for i in range(3)]
            for p in procs:
                p.start()
            for p in procs:
                p.join()
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACE_")}
    out = subprocess.run([sys.executable, "-m", "dftrace", "run", "--log-file", str(tmp_path / "t" / "job"),
                          str(script)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert len(testing.trace_files(tmp_path / "t")) == 4
    assert " and 3 files of its child processes" in out.stderr, out.stderr


def test_run_of_one_rank_counts_no_other_rank_s_file(tmp_path):
    """Two ranks side by side, each under its own ``dftrace run`` with the same prefix
    (``torchrun ... dftrace run``): each names its own file, not the other's as a child's."""
    script = tmp_path / "rank.py"
    script.write_text("import time\nfrom dftrace import ai\nwith ai.compute.forward:\n    time.sleep(1.0)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACE_")}
    ranks = [subprocess.Popen([sys.executable, "-m", "dftrace", "run", "--log-file", str(tmp_path / "t" / "job"),
                               str(script)], stderr=subprocess.PIPE, text=True, env={**env, "RANK": str(r)})
             for r in range(2)]
    said = [rank.communicate(timeout=120)[1] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], said
    assert len(testing.trace_files(tmp_path / "t")) == 2
    for r, err in enumerate(said):
        assert f"-rank{r}-" in err and "child processes" not in err, err


def test_run_rejects_bad_options_with_the_setting_named(tmp_path):
    """A bad tracing option stops ``dftrace run`` before the script starts."""
    (tmp_path / "x.py").write_text("open('started', 'w').close()\n")
    out = subprocess.run([sys.executable, "-m", "dftrace", "run", "--compression", "lz4", "x.py"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2 and "compression" in out.stderr
    assert not (tmp_path / "started").exists()


def test_demo_runs_twice_in_one_directory_without_mixing(tmp_path, capsys, monkeypatch):
    """Each demo writes into a new run directory and suggests exactly that directory."""
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert main(["demo", "--epochs", "1", "--samples", "8"]) == 0
    out = capsys.readouterr().out
    runs = sorted(os.listdir(tmp_path / "dftrace-demo"))
    assert runs == ["run-1", "run-2"]
    for run in runs:
        (file,) = testing.trace_files(tmp_path / "dftrace-demo" / run)
        assert len({e["pid"] for e in testing.read_events(file)}) == 1
        target = os.path.join("dftrace-demo", run)
        assert f"dftrace summary {target}, or in Perfetto: dftrace view {target}\n" in out


def test_demo_into_an_unusable_directory_says_so_in_one_line(tmp_path, capsys):
    """``--out`` naming a file is one line on stderr and exit code 2."""
    (tmp_path / "file").write_text("")
    assert main(["demo", "--out", str(tmp_path / "file"), "--epochs", "1", "--samples", "8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dftrace demo: cannot write into --out '{tmp_path / 'file'}': ") and err.count("\n") == 1


@pytest.mark.parametrize("option, value", [("--epochs", "0"), ("--epochs", "-1"), ("--samples", "0")])
def test_demo_refuses_counts_below_one(tmp_path, capsys, option, value):
    """``--epochs 0`` or ``--samples 0`` is a usage error naming the option (exit 2),
    not a traceback from the toy training."""
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--out", str(tmp_path / "out"), option, value])
    assert exit_.value.code == 2
    assert f"argument {option}: 1 or more is needed, got {value}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_demo_leaves_no_temporary_directory(tmp_path, monkeypatch, capsys):
    """The demo's checkpoint directory is removed when the demo ends."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    assert main(["demo", "--out", str(tmp_path / "out"), "--epochs", "1", "--samples", "8"]) == 0
    assert "checkpoint" in {e["cat"] for e in testing.read_events(tmp_path / "out")}
    assert list(scratch.iterdir()) == []


def _dftrace(*args: str, cwd=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dftrace", *args], capture_output=True, text=True, cwd=cwd)


@pytest.mark.parametrize("args, message", [
    (["run", "nonexist.py"], "dftrace run: no such file: 'nonexist.py'"),
    (["run", "-m", "nonexistent_module"], "dftrace run: no module named 'nonexistent_module'"),
    (["run", "-m", "nonexistent_module.sub"], "dftrace run: no module named 'nonexistent_module'"),
    (["run", "-m", "dftrace.nonexistent_module"], "dftrace run: no module named 'dftrace.nonexistent_module'"),
    (["run", "-m", "dftrace.examples"],
     "dftrace run: 'dftrace.examples' is a package without a __main__ module; name a module in it"),
])
def test_run_of_a_missing_target_says_so_in_one_line(tmp_path, args, message):
    """A script or module that does not exist is one line on stderr and exit code 2, no traceback."""
    out = _dftrace(*args, cwd=tmp_path)
    assert (out.returncode, out.stderr) == (2, message + "\n")
    assert testing.trace_files(tmp_path) == []


def test_run_finds_a_python_command_on_path(tmp_path):
    """``dftrace run torchrun ...``: a command named alone, no file of that name here, is
    the console script of that name on PATH (run and traced, its arguments its own);
    one that is not Python is one line saying so."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "mytool"
    tool.write_text(f"#!{sys.executable}\nimport sys\nfrom dftrace import ai\n"
                    "with ai.compute.forward:\n    print('args', sys.argv[1:])\n")
    tool.chmod(0o755)
    native = bin_dir / "native"
    native.write_bytes(b"\x7fELF\x02\x01")
    native.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run([sys.executable, "-m", "dftrace", "run", "--log-file", str(tmp_path / "t" / "run"),
                          "mytool", "--lr", "1"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert "args ['--lr', '1']" in out.stdout
    (file,) = testing.trace_files(tmp_path / "t")
    assert [e["name"] for e in testing.read_events(file) if e.get("ph") == "X"] == ["forward"]
    out = subprocess.run([sys.executable, "-m", "dftrace", "run", "native"], capture_output=True, text=True,
                         cwd=tmp_path, env=env)
    assert (out.returncode, out.stderr) == (
        2, f"dftrace run: {str(native)!r} is not a Python script (dftrace run runs Python scripts and modules)\n")


def test_run_keeps_the_traceback_of_a_module_that_fails_to_import(tmp_path):
    """An ImportError raised by the user's module is the user's: its traceback is shown."""
    (tmp_path / "job.py").write_text("import nonexistent_dependency\n")
    out = _dftrace("run", "--log-file", str(tmp_path / "t"), "-m", "job", cwd=tmp_path)
    assert out.returncode == 1
    assert "Traceback" in out.stderr and "No module named 'nonexistent_dependency'" in out.stderr


def test_run_finds_a_module_of_the_current_directory_from_the_console_script(tmp_path):
    """``dftrace run -m trainer.main`` from the installed ``dftrace`` command finds the
    package in the current directory, as ``python -m trainer.main`` does (the command's
    own directory was first on the path, not the current one: "no module named
    'trainer'"), and the module sees the arguments after it."""
    command = Path(sys.executable).with_name("dftrace")
    if not command.exists():
        pytest.skip("dftrace is not installed as a command beside this interpreter")
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "__init__.py").write_text("")
    (tmp_path / "trainer" / "main.py").write_text("import sys\nprint('ran', sys.argv[1:])\n")
    out = subprocess.run([str(command), "run", "--log-file", str(tmp_path / "t" / "run"), "-m", "trainer.main",
                          "--epochs", "3"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "ran ['--epochs', '3']"


# Runs the dftrace command in a fresh interpreter where the modules named in argv[1]
# (comma-separated, with their submodules) cannot be imported, as if not installed.
_WITHOUT = """
import sys

class NotInstalled:
    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled(sys.argv[1].split(",")))
from dftrace.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _first_missing(blocked: str) -> str:
    """The module the analysis check names first: polars, then numpy, blocked or not installed."""
    return next(m for m in ("polars", "numpy") if m in blocked.split(",") or importlib.util.find_spec(m) is None)


@pytest.fixture(scope="module")
def demo_trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    done = _dftrace("demo", "--out", str(out), "--epochs", "1", "--samples", "8")
    assert done.returncode == 0, done.stderr
    return out


@pytest.mark.parametrize("missing", ["numpy", "polars", "numpy,polars"])
@pytest.mark.parametrize("command", [
    ["summary"], ["summary", "--json"], ["report", "-o", "r.html"], ["convert", "-o", "x.json"],
    ["merge", "-o", "m.json.gz"],
])
def test_analysis_commands_name_the_extra_to_install(demo_trace, tmp_path, missing, command):
    """Without numpy or polars, each analysis command says which pip install it needs."""
    out = subprocess.run([sys.executable, "-c", _WITHOUT, missing, command[0], str(demo_trace), *command[1:]],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2
    prefix = f"dftrace: error: dftrace {command[0]} needs '"
    assert out.stderr.startswith(prefix), out.stderr
    named, _, rest = out.stderr[len(prefix):].partition("'")
    assert named == _first_missing(missing)
    assert rest == ", which is not installed: pip install 'dftrace[analysis]'\n"
    assert list(tmp_path.iterdir()) == []


def test_install_hint_names_the_interpreter_when_its_pip_is_not_first(demo_trace, tmp_path):
    """Run from an environment that is not activated (``.venv/bin/dftrace`` from another
    shell), the hint installs into that environment: ``<its python> -m pip install``."""
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", _WITHOUT, "numpy", "summary", str(demo_trace)],
                         capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 2
    assert out.stderr.endswith(f"which is not installed: {sys.executable} -m pip install 'dftrace[analysis]'\n")


def test_install_hint_resolves_without_the_package_index():
    """The hinted requirement names the installed dftrace: pip resolves ``dftrace[analysis]``
    from the installed metadata, with no package index (dftrace is not on one)."""
    for module in ("polars", "numpy", "plotly"):
        pytest.importorskip(module, reason="the analysis extra is installed here, so nothing needs fetching")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "-q",
                           "dftrace[analysis]"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_report_without_plotly_names_the_extra(demo_trace, tmp_path):
    """``report`` needs plotly too, and says so before reading anything."""
    for module in ("polars", "numpy"):
        pytest.importorskip(module, reason="the rest of the analysis extra is checked first")
    out = subprocess.run([sys.executable, "-c", _WITHOUT, "plotly", "report", str(demo_trace)],
                         capture_output=True, text=True, cwd=tmp_path)
    assert (out.returncode, out.stderr) == (
        2, "dftrace: error: dftrace report needs 'plotly', which is not installed: pip install 'dftrace[analysis]'\n")


def test_dask_options_without_dask_name_the_extra(demo_trace):
    """``--dask-workers`` without Dask names the dask extra."""
    pytest.importorskip("polars", reason="the analysis extra is checked first")
    out = subprocess.run([sys.executable, "-c", _WITHOUT, "dask,distributed", "summary", str(demo_trace),
                          "--dask-workers", "2"], capture_output=True, text=True)
    assert (out.returncode, out.stderr) == (
        2, "dftrace: error: --dask-workers needs 'dask', which is not installed: "
           "pip install 'dftrace[dask]'\n")


def test_validate_checks_trace_files_without_the_analysis_extra(demo_trace):
    """``validate`` of trace files needs nothing beyond the core install."""
    out = subprocess.run([sys.executable, "-c", _WITHOUT, "numpy,polars", "validate", str(demo_trace)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().endswith(": OK")


def test_validate_of_parquet_without_the_analysis_extra_names_it(tmp_path):
    """A Parquet file needs polars to be checked; validate says which pip install that is."""
    table = tmp_path / "events.parquet"
    table.write_bytes(b"PAR1")
    out = subprocess.run([sys.executable, "-c", _WITHOUT, "numpy,polars", "validate", str(table)],
                         capture_output=True, text=True)
    assert (out.returncode, out.stderr) == (
        2, "dftrace: error: dftrace validate of a Parquet file needs 'polars', which is not installed: "
           "pip install 'dftrace[analysis]'\n")


def _documented_options(parser: argparse.ArgumentParser) -> list[tuple[str, str | None]]:
    """Every option and argument but the hidden ones (deprecated names, help SUPPRESS)."""
    return [(a.option_strings[-1] if a.option_strings else (a.metavar or a.dest), a.help)
            for a in parser._actions if not isinstance(a, argparse._SubParsersAction)
            and a.help != argparse.SUPPRESS]


def _commands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_help_lists_every_command_with_its_summary():
    """``dftrace --help`` lists each command next to its one-line help."""
    out = _dftrace("--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    expected = {choice.dest: " ".join(choice.help.split()) for choice in sub._choices_actions}
    assert set(expected) == {"demo", "run", "summary", "report", "convert", "merge", "validate", "diff", "watch", "sql",
                             "mcp", "view"}
    for command, summary in expected.items():
        assert f" {command} {summary}" in text, command


@pytest.mark.parametrize("command", ["demo", "run", "summary", "report", "convert", "merge", "validate", "diff", "watch", "sql",
                                     "mcp", "view"])
def test_every_option_of_every_command_is_documented_in_its_help(command):
    """``dftrace <command> --help`` shows each option and argument, each with a help text."""
    out = _dftrace(command, "--help")
    assert out.returncode == 0 and out.stdout.startswith(f"usage: dftrace {command}")
    text = " ".join(out.stdout.split())
    for option, help_text in _documented_options(_commands()[command]):
        assert help_text, f"{command} {option} has no help text"
        assert option in out.stdout, f"{command} --help does not show {option}"
        if "%(" not in help_text:
            explained = " ".join(help_text.replace("%%", "%").split())
            assert explained in text, f"{command} --help does not explain {option}"


@pytest.mark.parametrize("missing", ["numpy", "polars"])
def test_analysis_api_names_the_extra_whatever_is_missing(missing):
    """``from dftrace.analysis import summarize`` without numpy or polars names the pip install."""
    code = _WITHOUT.replace("from dftrace.cli import main\nsys.exit(main(sys.argv[2:]))\n", "") + (
        "try:\n"
        "    from dftrace.analysis import summarize\n"
        "except ImportError as exc:\n"
        "    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code, missing], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.endswith("which is not installed: pip install 'dftrace[analysis]'\n")
    assert f"needs '{_first_missing(missing)}'" in out.stdout


@pytest.mark.parametrize("how", ["python -m dftrace", "the dftrace script"])
def test_an_inherited_dftrace_enable_starts_no_tracing_in_the_commands(demo_trace, tmp_path, how):
    """DFTRACE_ENABLE=1 exported for a job starts no session in `dftrace validate` of
    its traces (whichever way the command is started): the log directory it names is
    never made, while a program importing dftrace beside it is traced."""
    env = {**os.environ, "DFTRACE_ENABLE": "1", "DFTRACE_LOG_FILE": str(tmp_path / "auto" / "t")}
    if how == "python -m dftrace":
        command = [sys.executable, "-m", "dftrace"]
    else:
        script = os.path.join(os.path.dirname(sys.executable), "dftrace")
        if not os.path.exists(script):
            pytest.skip("no dftrace script beside this interpreter (not installed with pip)")
        command = [sys.executable, script]
    done = subprocess.run([*command, "validate", str(demo_trace)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "auto").exists(), os.listdir(tmp_path / "auto")
    traced = subprocess.run([sys.executable, "-c", "import dftrace\nfrom dftrace import ai\n"
                             "with ai.compute.forward: pass"], capture_output=True, text=True, env=env)
    assert traced.returncode == 0, traced.stderr
    assert len(testing.trace_files(tmp_path / "auto")) == 1


@pytest.mark.parametrize("orig_argv,own", [
    (["python", "-m", "dftrace", "summary", "traces"], True),
    (["python", "-X", "dev", "-m", "dftrace.cli", "validate", "t"], True),
    (["python", "/venv/bin/dftrace", "watch", "traces"], True),
    (["python", "/venv/bin/dftrace"], True),
    (["python", "-m", "dftrace", "run", "train.py"], False),
    (["python", "/venv/bin/dftrace", "run", "-m", "pkg"], False),
    (["python", "train.py", "-m", "dftrace", "summary"], False),
    (["python", "-c", "import dftrace", "dftrace"], False),
    (["python", "-m", "pytest", "dftrace"], False),
    (["python"], False),
])
def test_the_commands_own_process_is_told_from_a_program(monkeypatch, orig_argv, own):
    from dftrace._core.own_command import is_own_command

    monkeypatch.setattr(sys, "orig_argv", orig_argv, raising=False)
    assert is_own_command() is own


@pytest.mark.parametrize("command", ["run", "demo"])
def test_tracing_options_say_what_their_values_are(command):
    """Each tracing option shows what its value is (choices, a number, seconds, a size,
    a prefix), not the name of a variable, and its help names the variable it
    defaults to."""
    from dftrace._core.config import OPTIONS

    parser = _commands()[command]
    shown = {a.option_strings[-1]: a for a in parser._actions if a.option_strings}
    for opt in OPTIONS:
        if opt.name in ("enable", "inherit"):
            continue
        action = shown["--" + opt.name.replace("_", "-")]
        assert not action.metavar.startswith("DFTRACE_"), (opt.name, action.metavar)
        assert f"(variable {opt.env})" in action.help
    assert shown["--compression"].metavar == "{zstd,gzip,none}"
    assert shown["--flush-interval"].metavar == "SECONDS" and shown["--log-file"].metavar == "PREFIX"


def test_a_typo_gets_the_commands_usage_and_the_nearest_name():
    """A mistyped option is reported with its command's usage and the option it was
    closest to; a mistyped command with the nearest command and the list."""
    out = _dftrace("summary", "traces", "--jsno")
    assert out.returncode == 2
    assert out.stderr.startswith("usage: dftrace summary ")
    assert "unrecognized arguments: --jsno (did you mean --json?)" in out.stderr
    out = _dftrace("sumary", "traces")
    assert out.returncode == 2
    assert "unknown command 'sumary' (did you mean summary?); the commands: demo, run, summary" in out.stderr
    # another tracer's spelling gets ours, not the option that looks alike (-o: --io)
    out = _dftrace("run", "-o", "out/t", "train.py")
    assert out.returncode == 2
    assert "unrecognized arguments: -o (did you mean --log-file?)" in out.stderr


def test_validate_explains_its_rules_without_the_docs(tmp_path):
    """``validate --explain RULE`` says what the rule checks, from the package itself;
    alone it lists them all; a misspelt rule gets the nearest name. A failed validation
    names the command."""
    from dftrace.format.rules import RULES

    broken = tmp_path / "t.pfw"
    broken.write_text("[\nnot json\n")
    out = _dftrace("validate", str(broken))
    assert out.returncode == 1 and "[json]" in out.stdout
    assert out.stdout.endswith("each [rule] is explained by: dftrace validate --explain RULE\n")

    out = _dftrace("validate", "--explain", "nesting")
    assert (out.returncode, out.stdout) == (0, f"[nesting] {RULES['nesting']}\n")
    out = _dftrace("validate", "--explain")
    assert out.returncode == 0 and out.stdout.count("\n") == len(RULES)
    out = _dftrace("validate", "--explain", "nestng")
    assert out.returncode == 2 and "no rule named 'nestng' (did you mean nesting?)" in out.stderr
    out = _dftrace("validate")
    assert out.returncode == 2 and "validate needs the trace files" in out.stderr
