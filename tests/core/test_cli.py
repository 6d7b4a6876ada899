"""The ``dftrace`` command: demo and run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from dftrace import testing
from dftrace.cli import main

from ._util import assert_valid, check_nesting


def test_demo_writes_a_trace_with_every_category(tmp_path, capsys):
    """``dftrace demo`` traces the toy pipeline, says where the trace is and what is in it."""
    assert main(["demo", "--out", str(tmp_path), "--epochs", "2", "--samples", "64"]) == 0
    out = capsys.readouterr().out
    files = testing.trace_files(tmp_path)
    assert len(files) == 1 and files[0] in out and "spans in" in out
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
    (train,) = testing.spans(testing.read_events(tmp_path), "train")
    assert train["args"]["argv"] == ["a", "--b"]


def test_run_rejects_bad_options_with_the_setting_named(tmp_path):
    """A bad tracing option stops ``dftrace run`` before the script starts."""
    out = subprocess.run([sys.executable, "-m", "dftrace", "run", "--compression", "lz4", "x.py"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "compression" in out.stderr


def test_help_lists_the_commands():
    """``dftrace --help`` names demo and run."""
    out = subprocess.run([sys.executable, "-m", "dftrace", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "demo" in out.stdout and "run" in out.stdout


def test_every_command_has_help():
    """``dftrace <command> --help`` works for every command."""
    for cmd in ("demo", "run", "summary", "report", "convert", "merge", "validate"):
        out = subprocess.run([sys.executable, "-m", "dftrace", cmd, "--help"],
                             capture_output=True, text=True)
        assert out.returncode == 0 and "usage: dftrace " + cmd in out.stdout, (cmd, out.stderr)
