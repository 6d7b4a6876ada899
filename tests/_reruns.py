"""Which tests CI runs again, in another set-up, and why: one table, read at collection.

The README's test command runs every test once, with the default writer (the drainer
process), the C engine and the main Python. A test whose result can change with one of
those choices carries its mark, and CI runs the marked tests again with the other
choice (``pytest -m MARK``, see ``.ci/run``):

* ``other_writer``: with ``DFTRACE_WRITER=thread``, the writer thread (what the default
  falls back to where no drainer can be had): the tests of how a trace is written and
  ended, by exits, signals, kills, forks, full or failing storage and long runs;
* ``pure_engine``: with ``DFTRACE_NO_SPEEDUPS=1``, the pure-Python engine and the
  analysis's own parser and numpy paths (an install without a compiler): the tests of
  recording, and of the analysis what one process cannot switch (Dask workers, a
  child's memory) and hostile input. The analysis's answers themselves are compared
  both ways inside the ordinary run (``analysis/test_kernel_paths.py``: every command
  on every recorded and generated run, byte for byte; ``test_scan``, ``test_sweeps``,
  ``test_hostile_lines``), not by running their folder again;
* ``each_python``: on every other Python the package claims (a minimal install): the
  core, the reliability tests of what changes between interpreters (shutdown,
  signals, fork and spawn, threads, recursion and memory limits, sampling frames, the
  drainer's C module), and the file-I/O interposer's (which libc calls each
  interpreter makes).

A file is named relative to ``tests/``; a folder stands for every file in it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

RERUNS: dict[str, tuple[str, ...]] = {
    "other_writer": (
        "core/test_writer.py",
        "reliability/test_concurrency.py",
        "reliability/test_exits.py",
        "reliability/test_hostile_ends.py",
        "reliability/test_limits.py",
        "reliability/test_long_run.py",
        "reliability/test_processes.py",
        "reliability/test_storage_errors.py",
        "io/test_counters.py",
        "io/test_interception.py",
        "io/test_children_and_ends.py",
    ),
    "pure_engine": (
        "core/test_args.py",
        "core/test_cli.py",
        "core/test_compat.py",
        "core/test_encoder_lines.py",
        "core/test_engine.py",
        "core/test_engine_contract.py",
        "core/test_kept_spans.py",
        "core/test_record.py",
        "core/test_semantics.py",
        "core/test_speedups.py",
        "core/test_tree.py",
        "core/test_writer.py",
        "reliability/test_concurrency.py",
        "reliability/test_exits.py",
        "reliability/test_hostile_context.py",
        "reliability/test_hostile_ends.py",
        "reliability/test_limits.py",
        "reliability/test_processes.py",
        "reliability/test_sampler.py",
        "analysis/test_bounded_memory.py",
        "analysis/test_dask.py",
        "analysis/test_format.py",
        "analysis/test_hostile_inputs.py",
        "analysis/test_load.py",
    ),
    "each_python": (
        "core",
        "reliability/test_concurrency.py",
        "reliability/test_exits.py",
        "reliability/test_fork_from_c.py",
        "reliability/test_hostile_context.py",
        "reliability/test_hostile_ends.py",
        "reliability/test_limits.py",
        "reliability/test_process_writer.py",
        "reliability/test_processes.py",
        "reliability/test_sampler.py",
        "io/test_counters.py",
        "io/test_interception.py",
        "io/test_loaded_libraries.py",
        "io/test_children_and_ends.py",
        "io/test_fd_numbers.py",
    ),
}

TESTS = Path(__file__).resolve().parent


def register(config: pytest.Config) -> None:
    """Declares the marks; a file or folder named in the table that is not there is a
    usage error (a renamed test file would otherwise stop being run again)."""
    gone = sorted({where for names in RERUNS.values() for where in names if not (TESTS / where).exists()})
    if gone:
        raise pytest.UsageError(f"tests/_reruns.py names what is not there: {', '.join(gone)}")
    for mark, why in (("other_writer", "CI runs it again with DFTRACE_WRITER=thread"),
                      ("pure_engine", "CI runs it again with DFTRACE_NO_SPEEDUPS=1"),
                      ("each_python", "CI runs it again on every Python the package claims")):
        config.addinivalue_line("markers", f"{mark}: {why} (tests/_reruns.py)")


def mark(items: list[pytest.Item]) -> None:
    """Adds each item's rerun marks from :data:`RERUNS`."""
    for item in items:
        try:
            parts = item.path.resolve().relative_to(TESTS).parts
        except ValueError:
            continue
        names = {"/".join(parts[:k]) for k in range(1, len(parts) + 1)}
        for name, where in RERUNS.items():
            if names.intersection(where):
                item.add_marker(name)
