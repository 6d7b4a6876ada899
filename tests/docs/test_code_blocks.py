"""Every fenced code block in README.md, CONTRIBUTING.md and docs/ runs here as a reader
would paste it, or is marked as not code.

The convention (CONTRIBUTING.md says the same):

- Every block names its language after the opening fence.
- A page's blocks run top to bottom in a new, empty directory of the page's own: what
  a block reads was written by an earlier block of the page (the analysis pages start
  with ``dftrace demo --write-samples``, which writes the sample runs they read).
- ``python`` blocks run as a script in a fresh interpreter; ``bash`` and ``sh`` blocks
  run with ``bash -euo pipefail``; both must exit with status 0.
- ``console`` blocks are shell sessions: each ``$ `` line is a command that runs the
  same way and must not fail (status 0, or 1 for ``dftrace validate``, which reports
  broken rules that way) nor print a traceback; the lines after it are its output,
  compared with what the command prints (trailing spaces aside). A block whose output
  cannot be the same twice (times measured on the machine that runs the test) says so
  with ``<!-- output varies: why -->`` before it: its commands run, its output is
  shown for reading only.
- ``text``, ``json`` and ``pycon`` blocks are output, data or interactive transcripts:
  not run.
- Markers, as HTML comments on the lines right around a block (blank lines allowed):
  ``<!-- fragment -->`` before it: a piece of a larger program, not run; its first
  line is a comment the reader sees, saying what it needs (a clone, your own model);
  ``<!-- continues -->`` before a python, bash or sh block: it goes on from the page's
  previous block of the same language, and the two (or more) run once, as one script,
  at the place of the last;
  ``<!-- setup: ... -->`` before it: the comment's code runs first (rare: only for
  what a reader obviously has, such as a model of their own);
  ``<!-- then: ... -->`` after it: the comment's code runs after it;
  ``<!-- output varies: ... -->`` before a console block: its output is not compared;
  ``<!-- output -->`` before a text block right after a python block: it is what that
  block prints, compared as a console block's output is.
- A block that needs a package that is not installed (a framework, an extra) is
  skipped, with the package named; the page's later blocks still run.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import textwrap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from dftrace import testing
from dftrace.examples.sample_runs import DATA as SAMPLE_DATA
from dftrace.format import validate_file

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]

RUN = {"python", "bash", "sh", "console"}
CONTINUED = {"python", "bash", "sh"}  # console blocks need no `continues`: each command runs on its own
NOT_RUN = {"text", "json", "pycon"}

#: What an import (or a command) needs installed, beyond the module itself.
NEEDS = {
    "dftrace.analysis": ("polars", "numpy"),
    "dftrace.torch": ("torch",),
    "dftrace.tensorflow": ("tensorflow",),
    "dftrace.keras": ("keras",),
    "dftrace.lightning": ("lightning",),
    "dftrace.transformers": ("transformers", "accelerate"),
    "dftrace.examples.torch_training": ("torch",),
    "DaskExecutor": ("distributed",),
    "--dask-workers": ("distributed",),
    "dftrace summary": ("polars", "numpy"),
    "dftrace convert": ("polars", "numpy"),
    "dftrace merge": ("polars", "numpy"),
    "dftrace diff": ("polars", "numpy"),
    "dftrace watch": ("polars", "numpy", "rich"),
    "dftrace sql": ("polars", "numpy"),
    "dftrace report": ("polars", "numpy", "plotly"),
    ".parquet": ("polars", "numpy"),
    "write_html": ("plotly",),
    "render_html": ("plotly",),
}

#: Spans (cat, name) -> count that a page's first python block writes, as its text says.
SPANS = {
    "README.md": {("compute", "forward"): 12, ("comm", "all_reduce"): 12,
                  ("dataloader", "fetch.block"): 12, ("pipeline", "epoch.block"): 3},
    "docs/integrations/pytorch.md": {("compute", "forward"): 16, ("compute", "backward"): 16,
                                     ("compute", "step"): 16, ("data", "item"): 512,
                                     ("checkpoint", "capture"): 2},
    "docs/integrations/tensorflow.md": {("pipeline", "train"): 1, ("compute", "compute"): 25},
    "docs/integrations/keras.md": {("pipeline", "epoch"): 3, ("compute", "compute"): 18,
                                   ("pipeline", "evaluate"): 4, ("pipeline", "test"): 1},
    "docs/integrations/lightning.md": {("pipeline", "epoch"): 2, ("compute", "compute"): 16,
                                       ("pipeline", "evaluate"): 3, ("checkpoint", "capture"): 2},
    "docs/integrations/transformers.md": {("pipeline", "epoch"): 2, ("compute", "compute"): 8,
                                          ("compute", "step"): 8, ("pipeline", "evaluate"): 2,
                                          ("checkpoint", "capture"): 2},
}

#: The sample runs `dftrace demo --write-samples` copies as they are (not written by dftrace).
SHIPPED = tuple("/" + p.relative_to(SAMPLE_DATA).as_posix() for p in SAMPLE_DATA.rglob("*") if p.is_file())

_FENCE = re.compile(r"^```(\S*)\s*$")
_COMMENT = re.compile(r"<!--(.*?)-->", re.S)


@dataclass
class Block:
    page: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    markers: list[str]  # the HTML comments right before the block
    then: str  # code of a `then:` comment right after the block
    shows: str | None = None  # a python block's printed output: the `output` text block after it

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def fragment(self) -> bool:
        return "fragment" in self.markers

    @property
    def runs(self) -> bool:
        return self.language in RUN and not self.fragment


@dataclass
class Unit:
    """What runs at one place of a page: a block, or a block and those it continues."""

    blocks: list[Block]

    @property
    def last(self) -> Block:
        return self.blocks[-1]

    @property
    def id(self) -> str:
        return "+".join([self.blocks[0].id, *(str(b.line) for b in self.blocks[1:])])

    @property
    def script(self) -> str:
        """Each block's setup, code and then-code, in page order."""
        parts = [p for b in self.blocks for p in (_setup(b.markers), b.code, b.then) if p]
        return "\n".join(parts) + "\n"


def _comments_before(lines: list[str], index: int) -> list[str]:
    """The HTML comments that end on the lines right before ``lines[index]``."""
    found: list[str] = []
    end = index - 1
    while end >= 0:
        if not lines[end].strip():
            end -= 1
            continue
        if not lines[end].rstrip().endswith("-->"):
            break
        start = end
        while start >= 0 and "<!--" not in lines[start]:
            start -= 1
        match = _COMMENT.search("\n".join(lines[start:end + 1]))
        if start < 0 or match is None:
            break
        if not match.group(1).strip().startswith("then:"):  # that one belongs to the block above
            found.insert(0, match.group(1).strip())
        end = start - 1
    return found


def _comment_after(lines: list[str], index: int) -> str:
    """The text of an HTML comment starting on the first non-blank line after ``index``."""
    start = index + 1
    while start < len(lines) and not lines[start].strip():
        start += 1
    if start == len(lines) or not lines[start].lstrip().startswith("<!--"):
        return ""
    match = _COMMENT.search("\n".join(lines[start:]))
    return match.group(1).strip() if match else ""


def _code(comment: str) -> str:
    """The code of a ``setup:`` or ``then:`` comment: on its first line, or on the lines below."""
    code = comment.split(":", 1)[1]
    return code.strip() if "\n" not in code.strip("\n") else textwrap.dedent(code.strip("\n"))


def _setup(markers: list[str]) -> str:
    return "\n".join(_code(m) for m in markers if m.startswith("setup:"))


def read_blocks() -> list[Block]:
    blocks: list[Block] = []
    for path in PAGES:
        page = path.relative_to(ROOT).as_posix()
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            match = _FENCE.match(lines[i])
            if not match:
                i += 1
                continue
            end = i + 1
            while end < len(lines) and lines[end].rstrip() != "```":
                end += 1
            then = _comment_after(lines, end)
            blocks.append(Block(page, i + 1, match.group(1), "\n".join(lines[i + 1:end]) + "\n",
                                _comments_before(lines, i), _code(then) if then.startswith("then:") else ""))
            i = end + 1
    for block, following in zip(blocks, blocks[1:]):
        if (block.language, following.language, following.page) == ("python", "text", block.page) \
                and "output" in following.markers:
            block.shows = following.code
    return blocks


def read_units(blocks: list[Block]) -> list[Unit]:
    """The runnable blocks as they run: a block another one continues runs with it."""
    units: list[Unit] = []
    open_unit: dict[tuple[str, str], Unit] = {}  # (page, language) -> its latest unit
    for block in (b for b in blocks if b.runs):
        key = (block.page, block.language)
        if "continues" in block.markers and block.language in CONTINUED and key in open_unit:
            unit = open_unit[key]
            units.remove(unit)
            unit.blocks.append(block)
        else:
            unit = Unit([block])
        units.append(unit)
        open_unit[key] = unit
    return units


BLOCKS = read_blocks()
UNITS = read_units(BLOCKS)


def test_every_block_says_what_it_is():
    """Each block names a language this test runs or knows not to run; fragments are code
    whose first line tells the reader what it needs."""
    unknown = [f"{b.id} ```{b.language}" for b in BLOCKS if b.language not in RUN | NOT_RUN]
    assert unknown == [], "name the block's language (see this module's docstring)"
    misplaced = [b.id for b in BLOCKS if b.fragment and b.language not in RUN]
    assert misplaced == [], "only runnable blocks can be fragments"
    unsaid = [b.id for b in BLOCKS if b.fragment and not b.code.startswith("# ")]
    assert unsaid == [], "a fragment's first line is a `# ` comment saying what it needs (see the docstring)"
    assert len([b for b in BLOCKS if b.runs]) >= 30


def test_markers_are_the_known_ones():
    """Every HTML comment next to a block is one of the markers this test understands,
    and a `continues` goes on from a block of its own language on the page."""
    bad = [(b.id, m) for b in BLOCKS for m in b.markers
           if m not in ("fragment", "continues", "output") and not m.startswith(("setup:", "output varies:"))]
    assert bad == []
    shown = {b.id for b in BLOCKS if b.shows is not None}
    orphan = [b.id for prev, b in zip(BLOCKS, BLOCKS[1:]) if "output" in b.markers and prev.id not in shown]
    assert orphan == [], "`output` marks a text block right after the python block that prints it"
    dangling = [u.last.id for u in UNITS if "continues" in u.blocks[0].markers]
    assert dangling == [], "`continues` only on a python, bash or sh block after one of its language"


def _needs(unit: Unit) -> list[str]:
    wanted: set[str] = set()
    text = unit.script
    if unit.last.language == "python":
        try:
            tree = ast.parse(text)
        except SyntaxError:
            tree = None
        for node in ast.walk(tree) if tree else ():
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                     else [])
            for name in names:
                if name.split(".")[0] != "dftrace":
                    wanted.add(name.split(".")[0])
    for key, modules in NEEDS.items():
        if key in text:
            wanted.update(modules)
    for module in re.findall(r"python -m (\S+)", text):
        wanted.update(NEEDS.get(module, ()))
    return sorted(m for m in wanted if importlib.util.find_spec(m) is None)


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACE_")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def _session(text: str) -> list[tuple[str, list[str]]]:
    """A console session's commands, each with the output lines shown under it."""
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
    return steps


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _run_console(block: Block, cwd: Path) -> None:
    steps = _session(block.code)
    assert steps, f"{block.id}: a console block shows at least one `$ ` command"
    varies = any(m.startswith("output varies:") for m in block.markers)
    for command, shown in steps:
        # What a terminal shows: standard output and error as they come.
        done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=cwd, env=_environment(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
        allowed = (0, 1) if shlex.split(command)[:2] == ["dftrace", "validate"] else (0,)
        assert done.returncode in allowed and "Traceback" not in done.stdout, (
            f"{block.id}: `{command}` exited {done.returncode}\n{done.stdout[-3000:]}")
        if not varies:
            assert _lines(done.stdout) == _lines("\n".join(shown)), (
                f"{block.id}: `{command}` printed other output than the page shows "
                "(mark the block `<!-- output varies: why -->` if it cannot be the same twice)")


def _run_script(unit: Unit, cwd: Path) -> None:
    if unit.last.language == "python":
        script = cwd / ".docs-block.py"
        command = [sys.executable, str(script)]
    else:
        script = cwd / ".docs-block.sh"
        command = ["bash", "-euo", "pipefail", str(script)]
    script.write_text(unit.script)
    try:
        done = subprocess.run(command, cwd=cwd, env=_environment(), capture_output=True, text=True, timeout=600)
    finally:
        script.unlink()
    assert done.returncode == 0, f"{unit.id}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    if unit.last.shows is not None:
        assert _lines(done.stdout) == _lines(unit.last.shows), (
            f"{unit.last.id}: printed other output than the page shows\n{done.stdout[-3000:]}")


def _run(unit: Unit, cwd: Path) -> None:
    """Run ``unit`` in its page's directory; the trace files it writes must be valid, and
    the page's first Python example must write the spans its text promises."""
    before = set(testing.trace_files(cwd))
    if unit.last.language == "console":
        _run_console(unit.last, cwd)
    else:
        _run_script(unit, cwd)
    new_files = sorted(set(testing.trace_files(cwd)) - before)
    for path in new_files:
        if not Path(path).as_posix().endswith(SHIPPED):  # DFTracer's samples break rules on purpose
            assert validate_file(path) == [], path
    first_python = next((b for b in BLOCKS if b.page == unit.last.page and b.language == "python" and b.runs), None)
    expected = SPANS.get(unit.last.page) if first_python in unit.blocks else None
    if expected:
        seen: Counter[tuple[str, str]] = Counter()
        for path in new_files:
            seen.update((e["cat"], e["name"]) for e in testing.spans(testing.read_events(path)))
        assert {k: seen[k] for k in expected} == expected


class PageRun:
    """A page's units run in order, once each, in the page's own directory (empty at
    first): a unit's test runs the units before it that have not run yet."""

    def __init__(self, where: Path, units: list[Unit]):
        self.where = where
        self.units = units
        self.outcomes: dict[str, tuple[str, str]] = {}  # unit id -> ("passed" | "skipped" | "failed", why)

    def run_through(self, unit: Unit) -> tuple[str, str]:
        for earlier in self.units[:self.units.index(unit) + 1]:
            if earlier.id in self.outcomes:
                continue
            missing = _needs(earlier)
            if missing:
                self.outcomes[earlier.id] = ("skipped", f"needs {', '.join(missing)} (not installed)")
                continue
            try:
                _run(earlier, self.where)
                self.outcomes[earlier.id] = ("passed", "")
            except AssertionError as exc:
                self.outcomes[earlier.id] = ("failed", str(exc))
            except subprocess.TimeoutExpired as exc:
                self.outcomes[earlier.id] = ("failed", f"{earlier.id}: timed out: {exc}")
        return self.outcomes[unit.id]

    def failed_before(self, unit: Unit) -> list[str]:
        return [u.id for u in self.units[:self.units.index(unit)] if self.outcomes.get(u.id, ("",))[0] == "failed"]


@pytest.fixture(scope="session")
def page_runs(tmp_path_factory) -> dict[str, PageRun]:
    pages = sorted({u.last.page for u in UNITS})
    return {page: PageRun(tmp_path_factory.mktemp(re.sub(r"\W", "-", page)),
                          [u for u in UNITS if u.last.page == page]) for page in pages}


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.id)
def test_block_runs_as_written(unit, page_runs):
    """The block runs in a fresh process, in its page's directory after the page's
    earlier blocks, and succeeds."""
    run = page_runs[unit.last.page]
    outcome, why = run.run_through(unit)
    if outcome == "skipped":
        pytest.skip(why)
    earlier = run.failed_before(unit)
    assert outcome == "passed", why + (f"\n(earlier blocks of the page failed: {', '.join(earlier)})"
                                       if earlier else "")


def test_every_page_with_promised_spans_has_a_python_block():
    """The pages whose spans are checked still open with the example that writes them."""
    pages_with_python = {b.page for b in BLOCKS if b.language == "python" and b.runs}
    assert set(SPANS) <= pages_with_python
