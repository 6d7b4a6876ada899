"""The documentation keeps up with the code."""

from __future__ import annotations

import pathlib
import re
import subprocess

from dftrace._core.config import OPTIONS

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
    """.ci/run reads the README's test command from the README and runs it as it is:
    its look-up finds exactly that line, the line runs, and nothing is pinned first."""
    readme = (ROOT / "README.md").read_text()
    (test_cmd,) = [ln for ln in readme.splitlines() if "pytest" in ln and ln.startswith("python3")]
    ci = (ROOT / ".ci" / "run").read_text()
    (lookup,) = re.findall(r"^readme_test=\$\((.*)\)$", ci, re.M)
    found = subprocess.run(["bash", "-c", lookup], cwd=ROOT, capture_output=True, text=True, check=True)
    assert found.stdout.strip() == test_cmd
    assert re.search(r'bash -c "set -e; \$readme_test"', ci)
    assert not re.search(r"pip install\b.*\btorch\b", ci)  # the index resolves torch, as for a newcomer


def _section_titles(page: pathlib.Path) -> list[str]:
    return [line.lstrip("#").strip() for line in page.read_text().splitlines() if line.startswith("## ")]


def test_every_validation_rule_is_explained_in_the_format_doc():
    """Each rule name the validators can print has a row in docs/format.md's rule tables."""
    names = ("format/reading.py", "format/rules.py", "format/nesting.py", "analysis/read/parquet.py")
    source = "".join((ROOT / "dftrace" / name).read_text() for name in names)
    rules = set(re.findall(r'(?:(?:Violation|Found)\(\s*[^,()]+,|broken\()\s*"([a-z0-9-]+)"', source)) | {"pid", "tid"}
    assert {"open", "json", "nesting", "parent", "level", "parquet-columns"} <= rules
    text = (ROOT / "docs" / "format.md").read_text()
    documented = set(re.findall(r"^\| `([a-z0-9-]+)`", text, re.M))
    documented |= {name for row in re.findall(r"^\| (`[^|]+`) \|", text, re.M) for name in re.findall(r"`([a-z0-9-]+)`", row)}
    assert rules - documented == set()


def test_the_rules_the_package_explains_are_the_format_docs_rules():
    """``dftrace validate --explain`` ships the same table docs/format.md shows: every
    rule the docs list, with the same words, and no other."""
    from dftrace.format.rules import RULES

    titles = _section_titles(ROOT / "docs" / "format.md")
    assert "5. Validation rules" in titles and "6. Parquet tables" in titles
    text = (ROOT / "docs" / "format.md").read_text()
    documented = {}
    for header, parquet_only in (("| rule | what it checks | section |", False), ("| rule | what it checks |\n", True)):
        rows = re.match(r"(?:\|.*\n?)*", text[text.index(header):]).group(0)
        for cells in re.findall(r"^\| (`[^|]+`) \| ([^|]+?) \|", rows, re.M):
            for name in re.findall(r"`([a-z0-9-]+)`", cells[0]):
                if cells[1] != "see section 6" and (name.startswith("parquet") or not parquet_only):
                    documented[name] = cells[1]
    assert documented == RULES


def test_relative_links_in_the_docs_point_at_files_and_sections_that_exist():
    """Every relative link of README.md and docs/ reaches a file, and its #anchor a heading."""
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]*)(#[^)\s]*)?\)", page.read_text()):
            path, anchor = target
            if re.match(r"[a-z]+:", path):
                continue
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.name}: {path}")
            elif anchor and linked.suffix == ".md":
                anchors = {re.sub(r"[^\w\- ]", "", t).strip().lower().replace(" ", "-")
                           for t in re.findall(r"^#+ (.+)$", linked.read_text(), re.M)}
                if anchor[1:] not in anchors:
                    broken.append(f"{page.name}: {path}{anchor}")
    assert broken == []


def test_nothing_points_outside_the_repository():
    """Code, docs, tests and help cite only the project's own files (no outside reference copies)."""
    outside = ["FORMAT" + ".md", "shared/" + "reference", "../" + "shared", "/" + "work/"]
    found = []
    for path in ROOT.rglob("*"):
        parts = path.relative_to(ROOT).parts
        if (not path.is_file() or path.suffix not in {".py", ".md", ".toml", ".ini", ".c", ""}
                or parts[0].startswith(".") and parts[0] != ".ci" or parts[:2] == ("tests", "data")
                or parts[0] in {"build", "dist"} or "egg-info" in parts[0]):
            continue
        text = path.read_text(errors="replace")
        found += [f"{path.relative_to(ROOT)}: {word}" for word in outside if word in text]
    assert found == []


def test_extras_state_ranges():
    """The extras users install beside their own frameworks state ranges (only the
    benchmark's peer is pinned: the version measured)."""
    text = (ROOT / "pyproject.toml").read_text()
    extras = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    user_extras = "\n".join(line for line in extras.splitlines() if not line.startswith("bench ="))
    assert "==" not in user_extras and '"torch>=' in user_extras


def test_ci_tests_every_python_the_package_claims():
    """.ci/run takes the Pythons to test from pyproject.toml's classifiers (its look-up
    finds exactly those, oldest first, the oldest the one requires-python names), runs
    the suite on the oldest and the tests marked each_python on every other one, and
    tox lists an env for each."""
    project = (ROOT / "pyproject.toml").read_text()
    versions = re.findall(r'"Programming Language :: Python :: (3\.\d+)"', project)
    ci = (ROOT / ".ci" / "run").read_text()
    (lookup,) = re.findall(r"^claimed=\$\((.*)\)$", ci, re.M)
    found = subprocess.run(["bash", "-c", lookup], cwd=ROOT, capture_output=True, text=True, check=True)
    assert found.stdout.split() == sorted(versions, key=lambda v: tuple(map(int, v.split("."))))
    assert f'requires-python = ">={found.stdout.split()[0]}"' in project
    # Each other Python's minimal install: .venv-minimal for the oldest, .venv-X.Y else.
    assert '[ "$version" = "$oldest" ] && venv=.venv-minimal' in ci and 'python=$(python_of "$version")' in ci
    assert "for version in $claimed; do" in ci and '-m pytest -m each_python tests/core tests/reliability' in ci
    envlist = re.search(r"^envlist = (.*)$", (ROOT / "tox.ini").read_text(), re.M).group(1)
    assert {f"py{v.replace('.', '')}" for v in versions} <= {e.strip() for e in envlist.split(",")}


def test_ci_and_tox_run_the_suite_on_a_minimal_install():
    """A second CI run and a tox env install only the test extra."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert '"$venv/bin/pip" install -q -e ".[test]"' in ci and ".venv-minimal/bin/python -m pytest" in ci
    tox = (ROOT / "tox.ini").read_text()
    minimal = tox.split("[testenv:minimal]", 1)[1].split("\n[", 1)[0]
    assert "extras = test" in minimal and "python -m pytest" in minimal
