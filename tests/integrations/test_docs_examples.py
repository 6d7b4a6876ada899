"""The copy-paste example at the top of each docs/integrations page runs as written
and writes a valid trace with the spans the page promises."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys
from collections import Counter

import pytest

from dftrace import testing
from dftrace.format import validate_file

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "integrations"

# page -> (frameworks it needs, spans (cat, name) -> count the page's text states)
PAGES = {
    "pytorch": (("torch",), {("compute", "forward"): 16, ("compute", "backward"): 16,
                             ("compute", "step"): 16, ("data", "item"): 512,
                             ("checkpoint", "capture"): 2}),
    "tensorflow": (("tensorflow",), {("pipeline", "train"): 1, ("compute", "compute"): 25}),
    "keras": (("keras",), {("pipeline", "epoch"): 3, ("compute", "compute"): 18,
                           ("pipeline", "evaluate"): 4, ("pipeline", "test"): 1}),
    "lightning": (("lightning",), {("pipeline", "epoch"): 2, ("compute", "compute"): 16,
                                   ("pipeline", "evaluate"): 3, ("checkpoint", "capture"): 2}),
    "transformers": (("transformers", "accelerate"), {("pipeline", "epoch"): 2,
                                                      ("compute", "compute"): 8,
                                                      ("compute", "step"): 8,
                                                      ("pipeline", "evaluate"): 2,
                                                      ("checkpoint", "capture"): 2}),
}


@pytest.mark.parametrize("page", sorted(PAGES))
def test_docs_example_runs(tmp_path, page):
    """The page's first python block runs in a fresh process and traces what the page says."""
    needs, expected = PAGES[page]
    for mod in needs:
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not installed")
    text = (DOCS / f"{page}.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    script = tmp_path / f"{page}_example.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFTRACE_")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = testing.trace_files(tmp_path / "traces")
    assert files
    seen: Counter[tuple[str, str]] = Counter()
    for f in files:
        assert validate_file(f) == [], f
        seen.update((e["cat"], e["name"]) for e in testing.spans(testing.read_events(f)))
    assert {k: seen[k] for k in expected} == expected
