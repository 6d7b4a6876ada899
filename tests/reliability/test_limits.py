"""Limits of the system at ``initialize()``: a batch system's ``ulimit -v``
(RLIMIT_AS), few file descriptors (RLIMIT_NOFILE), a cgroup's pids limit. A refused
thread, memory map, process or descriptor never reaches the program: tracing goes on
with what it could get, or the program runs untraced after one warning naming the
limit, and ends as it would untraced. See docs/reliability.md, "At a glance".
"""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from ._util import WRITERS, assert_valid, clean_env, files, spans, write_script
from dftrace import testing

#: Traced, or untraced with "off": records one span, says which, and ends with status 3.
PROGRAM = """
    import sys
    import dftrace

    if sys.argv[1] != "off":
        session = dftrace.initialize(log_file=sys.argv[2])
        print("traced" if session is not None else "untraced")

    @dftrace.ai.compute
    def step():
        return 1

    step()
    print("done")
    sys.exit(3)
"""

#: What a refused resource is named in the warning, by the limit the test sets.
NAMES = {"RLIMIT_AS": "RLIMIT_AS", "RLIMIT_NOFILE": "RLIMIT_NOFILE", "pids": "pids limit"}


def _run(tmp_path, writer: str, traced: bool,
         preexec: Callable[[], None]) -> subprocess.CompletedProcess:
    prog = write_script(tmp_path, PROGRAM)
    mode = "on" if traced else "off"
    return subprocess.run([sys.executable, prog, mode, str(tmp_path / "out" / "t")],
                          capture_output=True, text=True, timeout=120, preexec_fn=preexec,
                          env=clean_env(DFTRACE_WRITER=writer))


def _check(tmp_path, writer: str, limit: str, preexec: Callable[[], None]) -> None:
    untraced = _run(tmp_path, writer, False, preexec)
    if untraced.returncode != 3:
        pytest.skip(f"the untraced program does not run under this {limit} here: "
                    f"{untraced.stderr[-300:]}")
    traced = _run(tmp_path, writer, True, preexec)
    assert "Traceback" not in traced.stderr, traced.stderr
    assert traced.returncode == untraced.returncode, traced.stderr
    assert traced.stdout.splitlines()[-1] == "done", traced.stdout
    warnings = [line for line in traced.stderr.splitlines() if "dftrace:" in line]
    if traced.stdout.startswith("untraced"):
        assert len(warnings) == 1 and NAMES[limit] in warnings[0], traced.stderr
        assert files(tmp_path / "out") == []
        return
    # Traced: with what could be had, the span is in a complete file, and any
    # resource done without was named in one warning.
    assert len(warnings) <= 1, traced.stderr
    assert all(NAMES[limit] in w for w in warnings), traced.stderr
    found = files(tmp_path / "out")
    assert len(found) == 1, found
    assert_valid(found)
    assert len(spans(testing.read_events(found[0]), "compute")) == 1


def _set(kind: int, value: int) -> Callable[[], None]:
    def preexec() -> None:
        resource.setrlimit(kind, (value, value))
    return preexec


@pytest.mark.parametrize("writer", WRITERS)
def test_a_small_address_space_never_raises_from_initialize(tmp_path, writer):
    """Under ``ulimit -v`` 160 MiB (the ring of writer='process' mapped, no stack left
    for a thread) initialize() returns and the program ends as it would untraced."""
    _check(tmp_path, writer, "RLIMIT_AS", _set(resource.RLIMIT_AS, 160 << 20))


@pytest.mark.parametrize("writer", WRITERS)
def test_few_file_descriptors_never_raise_from_initialize(tmp_path, writer):
    """Under ``ulimit -n 16`` initialize() returns and the program ends as untraced."""
    _check(tmp_path, writer, "RLIMIT_NOFILE", _set(resource.RLIMIT_NOFILE, 16))


@pytest.mark.parametrize("writer", WRITERS)
def test_no_descriptor_left_never_kills_the_program(tmp_path, writer):
    """Under ``ulimit -n 5`` (no descriptor for the trace file, the drainer or the
    C library's unwinder, which glibc loads when a thread ends) the program runs to
    its end with the untraced status; tracing stops with a warning."""
    preexec = _set(resource.RLIMIT_NOFILE, 5)
    untraced = _run(tmp_path, writer, False, preexec)
    if untraced.returncode != 3:
        pytest.skip(f"the untraced program does not run with 5 descriptors here: "
                    f"{untraced.stderr[-300:]}")
    traced = _run(tmp_path, writer, True, preexec)
    assert traced.returncode == untraced.returncode, traced.stderr
    assert "Traceback" not in traced.stderr, traced.stderr
    assert traced.stdout.splitlines()[-1] == "done", traced.stdout
    assert "Too many open files" in traced.stderr


_PIDS = "/sys/fs/cgroup/pids"


@contextlib.contextmanager
def _pids_cgroup(limit: int) -> Iterator[str]:
    """A cgroup (v1 pids controller) allowing ``limit`` tasks; removed afterwards,
    whatever still runs in it (a drainer finishing its files) moved out first."""
    if os.geteuid() != 0 or not os.access(_PIDS, os.W_OK):
        pytest.skip(f"needs root and a writable cgroup v1 pids controller at {_PIDS}")
    path = os.path.join(_PIDS, f"dftrace-test-{uuid.uuid4().hex[:12]}")
    try:
        os.mkdir(path)
        with open(os.path.join(path, "pids.max"), "w") as fh:
            fh.write(str(limit))
    except OSError as exc:
        pytest.skip(f"cannot make a pids cgroup under {_PIDS}: {exc}")
    try:
        yield path
    finally:
        deadline = time.monotonic() + 10
        while True:
            with open(os.path.join(path, "cgroup.procs")) as fh:
                left = fh.read().split()
            for pid in left:
                with contextlib.suppress(OSError), \
                        open(os.path.join(_PIDS, "cgroup.procs"), "w") as fh:
                    fh.write(pid)
            try:
                os.rmdir(path)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


@pytest.mark.parametrize("limit", [1, 2, 3])
@pytest.mark.parametrize("writer", WRITERS)
def test_a_pids_limit_never_raises_from_initialize(tmp_path, writer, limit):
    """In a cgroup whose pids.max leaves no thread (or no drainer) for dftrace,
    initialize() returns and the program ends as it would untraced."""
    with _pids_cgroup(limit) as path:
        def preexec() -> None:
            with open(os.path.join(path, "cgroup.procs"), "w") as fh:
                fh.write("0")
        _check(tmp_path, writer, "pids", preexec)
