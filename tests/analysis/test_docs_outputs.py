"""The outputs docs/analysis.md shows for blocked time, significance and diff's noise
are what the commands print on the traces in tests/data (as the page's console
blocks run them)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
#: (section heading, end): the parts of the page whose console blocks are checked.
SECTIONS = (("### Blocked time", "\n## Separate runs"), ("### Noise: what a change must beat", "\n### Guarding"))


def checked_blocks(text: str, section: tuple[str, str]) -> list[tuple[str, list[tuple[str, str]]]]:
    """(block text, [(command, shown output)]) of each console block in ``section``."""
    start = text.index(section[0])
    part = text[start:text.index(section[1], start)]
    out = []
    for block in re.findall(r"```console\n.*?```", part, re.S):
        commands: list[tuple[str, str]] = []
        for line in block.split("\n")[1:-1]:
            if line.startswith("$ "):
                commands.append((line[2:], ""))
            elif commands:
                commands[-1] = (commands[-1][0], commands[-1][1] + line + "\n")
        out.append((block, commands))
    return out


def run_command(command: str) -> str:
    """What ``command`` prints, run as the page's console blocks are, in tests/data."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACE_")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=DATA, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, (command, done.stderr)
    return done.stdout


@pytest.mark.parametrize("section", SECTIONS, ids=[s[0].strip("# ") for s in SECTIONS])
def test_the_page_shows_real_output(section):
    blocks = checked_blocks((ROOT / "docs" / "analysis.md").read_text(), section)
    assert blocks
    for _, commands in blocks:
        for command, shown in commands:
            assert command.startswith("dftrace ")
            assert run_command(command) == shown, command
