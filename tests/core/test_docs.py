"""The documentation keeps up with the code."""

from __future__ import annotations

import pathlib

from dftrace._config import OPTIONS

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_option_is_in_the_configuration_doc():
    """docs/configuration.md names every keyword and variable."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    for opt in OPTIONS:
        assert f"`{opt.env}`" in text and f"`{opt.name}`" in text, opt.name


def test_readme_has_exactly_the_two_setup_commands():
    """The README's set-up section holds the demo command and the test command."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = [line for line in section.splitlines() if line.startswith("python3 -m venv")]
    assert len(commands) == 2
    assert commands[0].endswith("dftrace demo") and "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    """.ci/run runs the README's test command."""
    readme = (ROOT / "README.md").read_text()
    test_cmd = [ln for ln in readme.splitlines() if "pytest" in ln and ln.startswith("python3")][0]
    tail = test_cmd.split(". .venv/bin/activate && ", 1)[1]
    assert tail in (ROOT / ".ci" / "run").read_text()
