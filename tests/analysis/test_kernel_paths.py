"""The analysis answers the same with its C kernels and without them, side by side.

An install without a compiler (or with ``DFTRACE_NO_SPEEDUPS=1``) reads lines with
polars' parser and runs numpy's interval sweeps and step model: ``kernels.C`` is None.
Each test here runs one command both ways in the same process, on every recorded run
the suite holds and on generated runs shaped like users' (several ranks with a slow
one, collectives, GPU profiler traces, lines cut short and files of DFTracer's), and
compares what is printed or written byte for byte: the summary as JSON and as text,
``convert``, ``merge`` of a step range, ``sql``, and ``watch``'s snapshot.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _requirements import native_scanner_missing, needs_marks

pytest.importorskip("polars", reason="needs the analysis extra: pip install 'dftrace[analysis]'")

import kinetogen  # noqa: E402
import tracegen  # noqa: E402

from dftrace.analysis.runtime import kernels  # noqa: E402
from dftrace.cli import main as cli_main  # noqa: E402

pytestmark = needs_marks("native", native_scanner_missing())

DATA = Path(__file__).resolve().parents[1] / "data"

#: The recorded runs (folders of tests/data).
RECORDED = ("ddp-run", "ddp-buckets", "diff-runs", "gpu-h200", "gpu-job", "dftracer")

#: What each command is asked, ``{run}`` for the run's folder and ``{out}`` for a file
#: it writes: the command's printed output and the file are compared.
COMMANDS = {
    "summary-json": (["summary", "{run}", "--json", "--no-index", "--no-progress"], None),
    "summary-text": (["summary", "{run}", "--rows", "50", "--no-index", "--no-progress"], None),
    "convert": (["convert", "{run}", "-o", "{out}"], "converted.json"),
    "merge-steps": (["merge", "{run}", "-o", "{out}", "--steps", "1:2"], "merged.json"),
    "sql": (["sql", "select cat, name, count(*) as n, sum(dur) as total, min(ts) as first "
             "from events group by cat, name order by cat, name", "{run}"], None),
    "watch-once": (["watch", "{run}", "--once", "--json"], None),
}


def _without_clock(printed: str) -> str:
    """``watch``'s snapshot less what the wall clock moves (how long each file has been idle)."""
    snapshot = json.loads(printed)
    for entry in snapshot.get("files", []):
        entry.pop("idle_s", None)
    return json.dumps(snapshot, sort_keys=True)


def _generated(root: Path) -> dict[str, Path]:
    """Runs written here: steps on four ranks with one slow, a lockstep collective run
    across two hosts, two GPU ranks' profiler traces, and a file whose lines are cut."""
    runs = {name: root / name for name in ("ranks", "collectives", "profiler", "cut")}
    for folder in runs.values():
        folder.mkdir(parents=True)
    tracegen.write_run(runs["ranks"], ranks=4, slow={(2, 0, 1): 4_000, (3, 1, 2): 9_000})
    for proc in tracegen.collective_run(ranks=3, steps=6, slow_rank=2, host_offset_us=700):
        tracegen.write_process(runs["collectives"], proc)
    kinetogen.write_job(runs["profiler"], ranks=2, seed=3)
    tracegen.write_process(runs["cut"], tracegen.training_process(77, rank=0), compression="none", cut="line",
                           extra_lines=[b'{"name":"odd","cat":"compute","pid":77,"tid":77,"ts":"x","dur":5,"ph":"X"}',
                                        b"not a line of JSON"])
    return runs


class _Counting:
    """The C kernels, counting which of them are called (the C side must be taken)."""

    def __init__(self, module):
        self.module, self.used = module, set()

    def __getattr__(self, name):
        self.used.add(name)
        return getattr(self.module, name)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kernel-paths")
    found = {name: shutil.copytree(DATA / name, root / "recorded" / name) for name in RECORDED}
    found.update(_generated(root / "generated"))
    return found


def _run(argv: list[str], capsys, out: Path | None) -> tuple[int, str, bytes | None]:
    capsys.readouterr()
    code = cli_main(argv)
    printed = capsys.readouterr().out
    if out is not None:
        printed = printed.replace(str(out), "OUT")
    if argv[0] == "watch" and code == 0:
        printed = _without_clock(printed)
    if argv[0] == "summary" and "--json" in argv and code == 0:
        printed = _without_kernels(printed)
    return code, printed, out.read_bytes() if out is not None and out.exists() else None


def _without_kernels(printed: str) -> str:
    """The summary as JSON less the name of the kernels that made it (checked here)."""
    summary = json.loads(printed)
    assert summary["overview"].pop("kernels") == kernels.name()
    return json.dumps(summary, sort_keys=True)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_c_kernels_and_numpy_paths_give_the_same_output(runs, command, tmp_path, capsys, monkeypatch):
    """Every run: the command's exit status, what it prints and what it writes are the
    same with the C kernels and with the polars and numpy paths."""
    template, written = COMMANDS[command]
    compared, c_kernels = 0, _Counting(kernels.C)
    for name, run in sorted(runs.items()):
        results = []
        for path in ("C", "numpy"):
            out = tmp_path / f"{name}-{path}-{written}" if written else None
            argv = [part.format(run=run, out=out) for part in template]
            with monkeypatch.context() as patch:
                patch.setattr(kernels, "C", c_kernels if path == "C" else None)
                results.append(_run(argv, capsys, out))
        assert results[0] == results[1], f"{command} of {name}: the C kernels and numpy differ"
        code, printed, data = results[0]
        compared += code == 0 and bool(printed or data)
    # Most runs give an answer (a step range some runs lack leaves merge nothing to say).
    assert compared >= len(runs) - 3, compared
    assert "scan_lines" in c_kernels.used, c_kernels.used  # the C side read with the scanner
