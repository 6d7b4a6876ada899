"""Test files that must not share an interpreter with the rest of the suite.

TensorFlow and a torch build with triton (the default Linux wheel) crash when loaded
into one process in that order: ``import tensorflow; import triton`` dies with SIGSEGV,
and Lightning imports triton through ``torch._dynamo``. So the TensorFlow and Keras
tests run in a pytest process of their own, while ``python -m pytest`` stays the one
command to run everything:

* in the main process, a grouped file is not imported. Its tests are collected by a
  child ``pytest --collect-only`` of the group, and each becomes an item here under
  its own node id, so selection (``-k``, node ids) and the counts work as usual;
* the first of the group's selected items to run starts one child pytest for all of
  them; each item then reports what the child reported for it (passed, failed with the
  child's traceback, skipped with its reason);
* the child is the same suite with ``DFTRACE_TEST_PROCESS_GROUP`` set: it writes each
  report to a file as JSON lines, and never starts groups itself.

``check_isolation()`` fails the test that loaded a grouped framework into the main
process anyway, naming it, before a later import can crash the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

#: Group name -> the test files (relative to tests/) that run in its process, and the
#: modules that must never be loaded into the main test process.
GROUPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "tensorflow": (("integrations/test_tensorflow.py", "integrations/test_keras.py"),
                   ("tensorflow", "keras")),
}

GROUP_ENV = "DFTRACE_TEST_PROCESS_GROUP"
RESULTS_ENV = "DFTRACE_TEST_PROCESS_GROUP_RESULTS"
TESTS = Path(__file__).resolve().parent

#: A group's child runs all of its tests at once, as the first of its items.
GROUP_TIMEOUT_S = 1800


def current_group() -> str | None:
    return os.environ.get(GROUP_ENV) or None


def group_of(path: Path) -> str | None:
    try:
        relative = path.resolve().relative_to(TESTS).as_posix()
    except ValueError:
        return None
    for name, (files, _) in GROUPS.items():
        if relative in files:
            return name
    return None


def check_isolation() -> None:
    """Fail when a test of the main process loaded a module kept to a group's process."""
    if current_group() is not None:
        return
    for name, (_, modules) in GROUPS.items():
        loaded = [m for m in modules if m in sys.modules]
        if loaded:
            for m in loaded:  # report it once, at the test that did it
                del sys.modules[m]
            pytest.fail(f"{', '.join(loaded)} was loaded into the main test process; tests that "
                        f"need it belong to the '{name}' process group (tests/_process_groups.py)")


def _reason(longrepr: Any) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        text = str(longrepr[2])
        return text[len("Skipped: "):] if text.startswith("Skipped: ") else text
    return str(longrepr)


class _Recorder:
    """In a group's child: each collection and test report, as one JSON line."""

    def __init__(self, path: str) -> None:
        self.out = open(path, "a", encoding="utf-8")

    def _write(self, **row: Any) -> None:
        self.out.write(json.dumps(row) + "\n")
        self.out.flush()

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.outcome != "passed":
            self._write(kind="collect", nodeid=report.nodeid, outcome=report.outcome,
                        text=_reason(report.longrepr) if report.skipped else report.longreprtext)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            self._write(kind="item", nodeid=item.nodeid)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and hasattr(report, "wasxfail"):
            text = f"xfail: {report.wasxfail}"
        elif report.skipped:
            text = _reason(report.longrepr)
        else:
            text = report.longreprtext
        self._write(kind="report", nodeid=report.nodeid, when=report.when,
                    outcome=report.outcome, text=text)


def _run_child(config: pytest.Config, group: str, args: list[str], timeout: float) -> tuple[list[dict], str]:
    """Run pytest for ``group`` in a new interpreter; its JSON rows and its output's tail."""
    fd, results = tempfile.mkstemp(prefix=f"dftrace-{group}-", suffix=".jsonl")
    os.close(fd)
    env = dict(os.environ, **{GROUP_ENV: group, RESULTS_ENV: results})
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "addopts=",
               "--rootdir", str(config.rootpath), *args]
    try:
        done = subprocess.run(command, cwd=config.rootpath, env=env, capture_output=True,
                              text=True, timeout=timeout)
        tail = f"exit status {done.returncode}\n{(done.stdout + done.stderr)[-4000:]}"
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or ""
        tail = f"timed out after {timeout:.0f} s\n{(out if isinstance(out, str) else out.decode())[-4000:]}"
    try:
        with open(results, encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
    finally:
        os.unlink(results)
    return rows, tail


class GroupFailure(Exception):
    """A grouped test failed in its child process; the message is the child's report."""


class GroupItem(pytest.Item):
    """One test of a grouped file, run in the group's child process."""

    def __init__(self, *, group: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.group = group
        self.add_marker(pytest.mark.timeout(GROUP_TIMEOUT_S))

    def runtest(self) -> None:
        plugin: ProcessGroups = self.config.pluginmanager.get_plugin("dftrace-process-groups")
        reports, tail = plugin.results(self)
        if not reports:
            raise GroupFailure(f"the '{self.group}' group's process reported nothing for this test "
                               f"({tail})")
        for report in reports:
            if report["outcome"] == "failed":
                raise GroupFailure(f"[{report['when']}, in the '{self.group}' group's process]\n"
                                   f"{report['text']}")
        for report in reports:
            if report["outcome"] == "skipped":
                pytest.skip(report["text"])

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, GroupFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, self.name


class GroupModule(pytest.File):
    """A grouped test file: its tests are listed by the group's child, not imported here."""

    def __init__(self, *, group: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.group = group

    def collect(self):
        plugin: ProcessGroups = self.config.pluginmanager.get_plugin("dftrace-process-groups")
        rows = plugin.collected(self.group)
        prefix = self.nodeid + "::"
        for row in rows:
            if row["kind"] == "collect" and row["nodeid"] == self.nodeid:
                if row["outcome"] == "skipped":
                    raise pytest.skip.Exception(row["text"], allow_module_level=True)
                raise self.CollectError(f"collecting in the '{self.group}' group's process failed:\n"
                                        f"{row['text']}")
        for row in rows:
            if row["kind"] == "item" and row["nodeid"].startswith(prefix):
                yield GroupItem.from_parent(self, name=row["nodeid"][len(prefix):], group=self.group)


class ProcessGroups:
    """The plugin: grouped files become GroupModules here, and a child records its reports."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self._collected: dict[str, list[dict]] = {}
        self._results: dict[str, tuple[dict[str, list[dict]], str]] = {}
        results = os.environ.get(RESULTS_ENV)
        if current_group() is not None and results:
            config.pluginmanager.register(_Recorder(results), "dftrace-process-group-recorder")

    @pytest.hookimpl(tryfirst=True)
    def pytest_pycollect_makemodule(self, module_path: Path, parent: pytest.Collector):
        group = group_of(module_path)
        if group is None or current_group() is not None:
            return None
        return GroupModule.from_parent(parent, path=module_path, group=group)

    def collected(self, group: str) -> list[dict]:
        """The child's collection of all of ``group``'s files (once per session)."""
        if group not in self._collected:
            files = [str(TESTS / f) for f in GROUPS[group][0]]
            rows, tail = _run_child(self.config, group, ["--collect-only", *files], GROUP_TIMEOUT_S)
            if not rows:
                rows = [{"kind": "collect", "nodeid": self._nodeid(f), "outcome": "failed",
                         "text": tail} for f in files]
            self._collected[group] = rows
        return self._collected[group]

    def _nodeid(self, path: str) -> str:
        return Path(path).resolve().relative_to(self.config.rootpath).as_posix()

    def results(self, item: GroupItem) -> tuple[list[dict], str]:
        """What the group's child reported for ``item``; the first call runs the child."""
        if item.group not in self._results:
            session = item.session
            selected = [i.nodeid for i in session.items
                        if isinstance(i, GroupItem) and i.group == item.group]
            rows, tail = _run_child(self.config, item.group, selected, GROUP_TIMEOUT_S)
            by_id: dict[str, list[dict]] = {}
            for row in rows:
                if row["kind"] == "report":
                    by_id.setdefault(row["nodeid"], []).append(row)
            self._results[item.group] = (by_id, tail)
        by_id, tail = self._results[item.group]
        return by_id.get(item.nodeid, []), tail
