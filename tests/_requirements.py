"""``DFTRACE_TEST_REQUIRE``: capabilities whose absence fails the suite instead of skipping it.

A test that needs something the machine may lack (the C engine, FUSE, a browser) is
marked ``@pytest.mark.needs("fuse")`` and skips, with the true cause, where it is
missing. A developer's laptop may lack it; CI must not, so CI lists what it installed::

    DFTRACE_TEST_REQUIRE=native,fuse,chromium python -m pytest

and every skip of a marked test whose capability is listed becomes a failure that
quotes the skip's reason. ``DFTRACE_REQUIRE_SPEEDUPS=1`` (which also makes a failed C
build fail the install) requires ``native`` unless ``DFTRACE_NO_SPEEDUPS`` asks for the
pure-Python engine.
"""

from __future__ import annotations

import os

import pytest

#: The capabilities a test can be marked with, and what each one is.
CAPABILITIES = {
    "native": "the C engine and the C trace scanner (with the summary's interval sweeps), built at install",
    "fuse": "FUSE mounts (fusepy with libfuse2, /dev/fuse, root) for the hung-storage tests",
    "chromium": "headless Chromium, to render `dftrace report` pages",
    "tmux": "tmux, to drive `dftrace watch` in a terminal",
    "second-user": "root, to create a second user (useradd) who attacks the process writer",
    "dfanalyzer": "DFAnalyzer (pip install dftracer-analyzer), to read dftrace's file I/O with its posix preset",
    "analysis": "the analysis extra (pip install 'dftrace[analysis]'), for a test that summarises a traced run "
                "among tests that need only the recording side",
    "nvtx": "NVIDIA's nvtx package (pip install 'dftrace[nvtx]') and a C compiler, to test "
            "NVTX ranges through an NVTX tool built by the test",
}


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip() not in ("", "0")


def required() -> set[str]:
    """The capabilities this run must have; an unknown name is a usage error."""
    names = {n.strip() for n in os.environ.get("DFTRACE_TEST_REQUIRE", "").split(",") if n.strip()}
    unknown = names - CAPABILITIES.keys()
    if unknown:
        raise pytest.UsageError(
            f"DFTRACE_TEST_REQUIRE names unknown capabilities {sorted(unknown)}; "
            f"known: {', '.join(sorted(CAPABILITIES))}")
    if _flag("DFTRACE_REQUIRE_SPEEDUPS") and not _flag("DFTRACE_NO_SPEEDUPS"):
        names.add("native")
    return names


class Requirements:
    """Turns the skip of a test marked ``needs(c)`` into a failure when ``c`` is required."""

    def __init__(self) -> None:
        self.required = required()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        outcome = yield
        report = outcome.get_result()
        if not report.skipped or hasattr(report, "wasxfail"):
            return
        missing = sorted({m.args[0] for m in item.iter_markers("needs")} & self.required)
        if not missing:
            return
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        if reason in {m.kwargs.get("reason") for m in item.iter_markers("needs") if m.args[0] not in self.required}:
            return  # it skipped for a capability this run may lack
        report.outcome = "failed"
        report.longrepr = (f"this run requires {', '.join(missing)} "
                           f"({'; '.join(CAPABILITIES[m] for m in missing)}; see DFTRACE_TEST_REQUIRE "
                           f"and DFTRACE_REQUIRE_SPEEDUPS), but the test skipped: {reason}")


def needs_marks(capability: str, missing: str | None) -> list[pytest.MarkDecorator]:
    """The marks of a test that needs ``capability`` (for a module's ``pytestmark``): it
    skips with the reason ``missing`` (the true cause) when that is not None, and fails
    instead where the capability is required."""
    if capability not in CAPABILITIES:
        raise ValueError(f"unknown capability {capability!r}")
    return [pytest.mark.needs(capability, reason=missing), pytest.mark.skipif(missing is not None, reason=missing or "")]


def needs(capability: str, missing: str | None):
    """:func:`needs_marks` as a decorator of one test."""
    def mark(test):
        for m in needs_marks(capability, missing):
            test = m(test)
        return test
    return mark


def native_engine_missing() -> str | None:
    """Why the C engine is not the one in use here (the true cause), or None when it is."""
    from dftrace._core import engine

    if engine.speedups is not None:
        return None
    if _flag("DFTRACE_NO_SPEEDUPS"):
        return "DFTRACE_NO_SPEEDUPS=1 asks for the pure-Python engine"
    try:
        from dftrace._core import _speedups  # noqa: F401
    except ImportError as exc:
        return f"the C engine was not built or does not load ({exc})"
    return "the C engine loads, but its clock disagrees with Python's, so it is not used"


def native_scanner_missing() -> str | None:
    """Why the C trace scanner of the analysis (and its interval sweeps, in the same
    module) is not in use here, or None when it is."""
    from dftrace._c_parts import speedups_allowed

    if not speedups_allowed():
        return "the C trace scanner is switched off (DFTRACE_NO_SPEEDUPS)"
    try:
        from dftrace.analysis.runtime import _kernels as _scan  # noqa: F401
    except ImportError as exc:
        return f"the C trace scanner was not built or does not load ({exc})"
    return None
