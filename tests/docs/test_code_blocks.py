"""Every fenced code block in README.md, CONTRIBUTING.md and docs/ runs here, or is marked as not code.

The convention (CONTRIBUTING.md says the same):

- Every block names its language after the opening fence.
- ``python`` blocks run as a script in a fresh interpreter; ``bash`` and ``sh`` blocks
  run with ``bash -euo pipefail``. Both run in a new directory holding ``traces/`` (a
  four-rank run of the toy pipeline), DFTracer's sample directories
  (``dftracer-2.0.3/``, ...), ``ddp-run/`` (two DDP ranks, tests/data/ddp-run),
  ``ddp-buckets/`` and ``diff-runs/`` (tests/data), ``gpu-h200/`` (a real GPU job), and ``gpu-job/`` (PyTorch
  profiler traces of two GPU ranks, tests/data/gpu-job), and must exit with status 0.
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
  ``<!-- fragment -->`` before it: a piece of a larger program, not run;
  ``<!-- continues -->`` before it: runs as the continuation of the page's previous
  block of the same language (one script);
  ``<!-- setup: ... -->`` before it: the comment's code runs first;
  ``<!-- then: ... -->`` after it: the comment's code runs after it;
  ``<!-- output varies: ... -->`` before a console block: its output is not compared.
- A block that needs a package that is not installed (a framework, an extra) is
  skipped, with the package named.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from dftrace import testing
from dftrace.format import validate_file

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
SAMPLES = ROOT / "tests" / "data" / "dftracer"

RUN = {"python", "bash", "sh", "console"}
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
    body: str = ""  # the continued blocks, the setup and the block: what `continues` goes on from
    script: str = ""  # what runs: the body, then the `then:` code

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def fragment(self) -> bool:
        return "fragment" in self.markers


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
        previous: dict[str, Block] = {}
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
            block = Block(page, i + 1, match.group(1), "\n".join(lines[i + 1:end]) + "\n",
                          _comments_before(lines, i), _code(then) if then.startswith("then:") else "")
            if block.language in RUN and not block.fragment:
                before = previous[block.language].body if "continues" in block.markers else ""
                block.body = "\n".join(p for p in (before, _setup(block.markers), block.code) if p)
                block.script = "\n".join(p for p in (block.body, block.then) if p) + "\n"
                previous[block.language] = block
            blocks.append(block)
            i = end + 1
    return blocks


BLOCKS = read_blocks()


def test_every_block_says_what_it_is():
    """Each block names a language this test runs or knows not to run; fragments are code."""
    unknown = [f"{b.id} ```{b.language}" for b in BLOCKS if b.language not in RUN | NOT_RUN]
    assert unknown == [], "name the block's language (see this module's docstring)"
    misplaced = [b.id for b in BLOCKS if b.fragment and b.language not in RUN]
    assert misplaced == [], "only runnable blocks can be fragments"
    assert len([b for b in BLOCKS if b.language in RUN and not b.fragment]) >= 30


def test_markers_are_the_known_ones():
    """Every HTML comment next to a block is one of the markers this test understands."""
    bad = [(b.id, m) for b in BLOCKS for m in b.markers
           if m not in ("fragment", "continues") and not m.startswith(("setup:", "output varies:"))]
    assert bad == []


def _needs(block: Block) -> list[str]:
    wanted: set[str] = set()
    text = block.script
    if block.language == "python":
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


@pytest.fixture(scope="session")
def prepared(tmp_path_factory) -> Path:
    """A directory with traces/ (four ranks of the toy pipeline) and DFTracer's samples."""
    where = tmp_path_factory.mktemp("docs")
    for rank in range(4):
        env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACE_")}
        env["RANK"] = str(rank)
        done = subprocess.run(
            [sys.executable, "-m", "dftrace", "run", "--log-file", "traces/train", "-m",
             "dftrace.examples.toy_training", "--epochs", "2", "--samples", "160"],
            cwd=where, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    for sample in SAMPLES.iterdir():
        if sample.is_dir():
            shutil.copytree(sample, where / sample.name)
    for name in ("ddp-run", "ddp-buckets", "diff-runs", "gpu-job", "gpu-h200"):
        shutil.copytree(ROOT / "tests" / "data" / name, where / name)
    return where


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
    steps = _session(block.script)  # the blocks it continues first
    own = len(_session(block.code))
    assert own, f"{block.id}: a console block shows at least one `$ ` command"
    varies = any(m.startswith("output varies:") for m in block.markers)
    for k, (command, shown) in enumerate(steps):
        compared = not varies and k >= len(steps) - own
        # What a terminal shows: standard output and error as they come.
        done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=cwd, env=_environment(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
        allowed = (0, 1) if shlex.split(command)[:2] == ["dftrace", "validate"] else (0,)
        assert done.returncode in allowed and "Traceback" not in done.stdout, (
            f"{block.id}: `{command}` exited {done.returncode}\n{done.stdout[-3000:]}")
        if compared:
            assert _lines(done.stdout) == _lines("\n".join(shown)), (
                f"{block.id}: `{command}` printed other output than the page shows "
                "(mark the block `<!-- output varies: why -->` if it cannot be the same twice)")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.language in RUN and not b.fragment],
                         ids=lambda b: b.id)
def test_block_runs_as_written(block, prepared, tmp_path):
    """The block runs in a fresh process, in a directory with prepared traces, and succeeds."""
    missing = _needs(block)
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (not installed)")
    cwd = tmp_path / "work"
    shutil.copytree(prepared, cwd)
    before = set(testing.trace_files(cwd))
    if block.language == "console":
        _run_console(block, cwd)
        return
    if block.language == "python":
        script = cwd / "block.py"
        command = [sys.executable, str(script)]
    else:
        script = cwd / "block.sh"
        command = ["bash", "-euo", "pipefail", str(script)]
    script.write_text(block.script)
    done = subprocess.run(command, cwd=cwd, env=_environment(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{block.id}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    new_files = sorted(set(testing.trace_files(cwd)) - before)
    for path in new_files:
        assert validate_file(path) == [], path
    first_python = next((b for b in BLOCKS if b.page == block.page and b.language == "python"), None)
    expected = SPANS.get(block.page) if block is first_python else None
    if expected:
        seen: Counter[tuple[str, str]] = Counter()
        for path in new_files:
            seen.update((e["cat"], e["name"]) for e in testing.spans(testing.read_events(path)))
        assert {k: seen[k] for k in expected} == expected


def test_every_page_with_promised_spans_has_a_python_block():
    """The pages whose spans are checked still open with the example that writes them."""
    pages_with_python = {b.page for b in BLOCKS if b.language == "python" and not b.fragment}
    assert set(SPANS) <= pages_with_python
