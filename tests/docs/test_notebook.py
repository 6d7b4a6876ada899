"""docs/notebook.ipynb runs top to bottom in an empty directory, on the Python that runs
the tests, and shows what its text says: the summary's tables, the frames, the figures.

The page is kept with the outputs of a real run, so that it reads with them where it
is not run. To run it again and keep the new outputs::

    python tests/docs/test_notebook.py
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "notebook.ipynb"
#: The kernel the page runs on here: this interpreter, whatever kernels the machine has.
KERNEL = "dftrace-docs"
#: The largest the kept page may be: its figures load plotly.js, they do not embed it.
MOST_BYTES = 200_000


@contextmanager
def _jupyter_dirs(root: Path) -> Iterator[None]:
    """A kernel spec of this interpreter, and Jupyter's and IPython's files, under ``root``."""
    spec = root / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python (dftrace tests)", "language": "python"}))
    names = {"JUPYTER_PATH": root / "jupyter", "JUPYTER_RUNTIME_DIR": root / "runtime", "IPYTHONDIR": root / "ipython"}
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({name: str(path) for name, path in names.items()})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def execute(notebook: Path, cwd: Path) -> Any:
    """The notebook at ``notebook``, run in ``cwd`` (its outputs in place)."""
    import nbclient
    import nbformat

    page = nbformat.read(notebook, as_version=4)
    with _jupyter_dirs(cwd / ".jupyter-test"):
        nbclient.NotebookClient(page, kernel_name=KERNEL, timeout=180, record_timing=False,
                                resources={"metadata": {"path": str(cwd)}}).execute()
    return page


def _source(page: Any, start: str) -> Any:
    """The code cell whose source starts with ``start``."""
    cells = [c for c in page.cells if c.cell_type == "code" and c.source.startswith(start)]
    assert len(cells) == 1, start
    return cells[0]


def _data(cell: Any, mime: str) -> str:
    """The ``mime`` data of the last of a cell's outputs that has it (its value, or the
    figure a plotly renderer displays in its place)."""
    shown = [o.data[mime] for o in cell.outputs if mime in o.get("data", {})]
    assert shown, mime
    return shown[-1]


def _plotted(html: str) -> list[dict[str, Any]]:
    """The traces a figure's HTML output plots."""
    start = re.search(r"Plotly\.newPlot\(\s*\"[^\"]+\",\s*", html)
    assert start
    return json.JSONDecoder().raw_decode(html, start.end())[0]


def test_the_notebook_runs_and_shows_the_answers(tmp_path):
    """Every cell runs without an error; the summary shows as tables, the steps frame has
    a row per step of the summary, the categories and breakdown frames their rows, and
    each figure is drawn from the run without plotly.js in the page."""
    for module in ("nbclient", "nbformat", "ipykernel"):
        pytest.importorskip(module, reason="needs the notebook-check extra: pip install 'dftrace[notebook-check]'")
    pytest.importorskip("plotly", reason="needs the analysis extra: pip install 'dftrace[analysis]'")
    from dftrace.analysis import summarize

    page = execute(NOTEBOOK, tmp_path)
    code = [c for c in page.cells if c.cell_type == "code"]
    assert all(c.outputs for c in code)
    assert not [o for c in code for o in c.outputs if o.output_type == "error" or o.get("name") == "stderr"]
    summary = summarize(tmp_path / "demo-traces")
    assert summary.step_stats["count"] > 0
    shown = _data(_source(page, "from dftrace.analysis import"), "text/html")
    assert "dftrace-summary" in shown and shown.count("<table>") == 2
    assert f"<td>{summary.step_stats['count']}</td>" in shown
    steps = _data(_source(page, "frames.steps(summary)"), "text/plain")
    assert re.search(rf"^shape: \({len(summary.steps)}, 9\)$", steps, re.M)
    names = _data(_source(page, "frames.categories(summary)"), "text/plain")
    assert re.search(rf"^shape: \({min(8, len(summary.categories))}, 11\)$", names, re.M)
    activities = _data(_source(page, "frames.breakdown(summary)"), "text/plain")
    assert re.search(r"^shape: \(6, 6\)$", activities, re.M) and "idle" in activities
    timeline = _data(_source(page, "import plotly.io"), "text/html")
    assert "cdn.plot.ly" in timeline and "Plotly.newPlot" in timeline
    assert sum(len(bar["x"]) for bar in _plotted(timeline)) == len(summary.rank_steps)
    assert "Plotly.newPlot" in _data(_source(page, "figures.time_breakdown(summary)"), "text/html")


def test_the_kept_notebook_has_its_outputs_and_no_plotly_js():
    """The page in docs/ is kept with every code cell's output, and small."""
    page = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    code = [c for c in page["cells"] if c["cell_type"] == "code"]
    assert code and all(c["outputs"] for c in code)
    assert not [o for c in code for o in c["outputs"] if o["output_type"] == "error"]
    assert NOTEBOOK.stat().st_size < MOST_BYTES


if __name__ == "__main__":  # run the page again and keep its outputs
    import nbformat

    with tempfile.TemporaryDirectory() as where:
        nbformat.write(execute(NOTEBOOK, Path(where)), NOTEBOOK)
    print(f"{NOTEBOOK}: run again, outputs kept ({NOTEBOOK.stat().st_size:,} bytes)")
