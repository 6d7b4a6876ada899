"""Helpers for the reliability tests: run real Python processes and read their files."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from _signals import default_signals
from dftrace import testing
from dftrace.format.reading import iter_line_pieces
from dftrace.format import parse_trace_filename, validate_file

HERE = os.path.dirname(os.path.abspath(__file__))

#: The writers a process test runs under: writer="process" needs the C engine on Linux.
WRITERS = ["thread"] + (
    ["process"] if sys.platform.startswith("linux")
    and os.environ.get("DFTRACE_NO_SPEEDUPS", "").strip() in ("", "0") else [])


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without DFTRACE_* or rank variables, plus ``extra``.
    ``DFTRACE_WRITER`` stays: the suite runs under each writer (see drainer_writes)."""
    drop = ("DFTRACE_", "RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_", "PMI_", "SLURM_")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(drop) or k == "DFTRACE_WRITER"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def drainer_writes() -> bool:
    """The programs these tests start, leaving ``writer`` to DFTRACE_WRITER or its
    default, write through a drainer process: the C engine is built (their clean
    environment does not switch it off), on Linux, and DFTRACE_WRITER is not thread."""
    import importlib.util

    return (sys.platform.startswith("linux")
            and importlib.util.find_spec("dftrace._core._speedups") is not None
            and os.environ.get("DFTRACE_WRITER", "").strip() != "thread")


def write_script(tmp_path: Any, body: str, name: str = "prog.py") -> str:
    """Write a script (dedented) and return its path."""
    path = os.path.join(os.fspath(tmp_path), name)
    with open(path, "w") as fh:
        fh.write(textwrap.dedent(body))
    return path


def run(args: list[str], timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """Run ``python <args>`` to the end with a clean environment."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, env=clean_env(**env), preexec_fn=default_signals)


def start(args: list[str], **env: str) -> subprocess.Popen:
    """Start ``python <args>`` with a clean environment and piped stdout/stderr."""
    return subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=clean_env(**env),
                            preexec_fn=default_signals)


def files(directory: Any) -> list[str]:
    return testing.trace_files(directory)


def events_by_pid(directory: Any) -> dict[int, list[dict[str, Any]]]:
    """Events of every trace file under ``directory``, by the pid in the file name."""
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for path in files(directory):
        name = parse_trace_filename(path)
        assert name is not None, path
        out[name.pid].extend(testing.read_events(path))
    return dict(out)


def assert_valid(paths: list[str], complete: bool = True) -> None:
    """Every file obeys docs/format.md; with ``complete``, each also ends with ``]``."""
    for p in paths:
        problems = validate_file(p)
        assert problems == [], f"{p}: {[str(v) for v in problems[:5]]}"
        if complete:
            assert last_line(p) == b"]", f"{p} has no closing ']'"


def last_line(path: str) -> bytes:
    """The last line of the decoded file that is not blank, stripped; b"" for a
    stream cut off by a crash. Decoded only, not parsed: a file of millions of
    spans is checked in a fraction of a second."""
    tail = b""
    for piece in iter_line_pieces(path):
        if piece.cut_off:
            return b""
        tail = (tail + piece.data[-65536:])[-65536:]
    lines = tail.rstrip().rsplit(b"\n", 1)
    return lines[-1].strip()


def spans(events: list[dict[str, Any]], name: str | None = None) -> list[dict[str, Any]]:
    return testing.spans(events, name)


def meta(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("ph") == "M" and e.get("name") == name]


def fuse_unusable() -> str | None:
    """Why a FUSE filesystem cannot be mounted here (fusepy runs on libfuse2), or None."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if os.geteuid() != 0 and shutil.which("fusermount") is None:
        return "not root, and no fusermount is installed (Debian: apt-get install fuse3)"
    try:
        import fuse  # noqa: F401  (fusepy: it loads libfuse2 on import)
    except (ImportError, OSError, EnvironmentError) as exc:
        return f"fusepy cannot load libfuse2 (Debian: apt-get install libfuse2): {exc}"
    return None


def _unmount(mnt: str) -> None:
    """Detach ``mnt`` lazily with whichever tool is there (fuse3, fuse, or umount as root)."""
    for tool in (["fusermount3", "-u", "-z"], ["fusermount", "-u", "-z"], ["umount", "-l"]):
        if shutil.which(tool[0]) and subprocess.run([*tool, mnt], capture_output=True).returncode == 0:
            return


@contextlib.contextmanager
def fuse_mount(helper: str, mnt: Any, *args: str,
               stdout: Any = subprocess.DEVNULL) -> Iterator[subprocess.Popen]:
    """Mount ``mnt`` with the FUSE daemon ``helper`` (a file next to this one, run as
    ``helper [*args before] mnt [*args after]``: ``args`` may hold the string
    ``"{mnt}"``, replaced by the mount point; without it, ``mnt`` comes first).
    Yields the daemon; it is killed (every request waiting on it ends with ENOTCONN)
    and the mount is detached whatever happens. Raises RuntimeError when the mount
    does not come up."""
    mnt = os.fspath(mnt)
    argv = [a.replace("{mnt}", mnt) for a in args] if "{mnt}" in args else [mnt, *args]
    daemon = subprocess.Popen([sys.executable, os.path.join(HERE, helper), *argv],
                              stdout=stdout, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while not os.path.ismount(mnt):
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"FUSE mount failed: {daemon.stderr.read()[-300:]}")
            time.sleep(0.05)
        yield daemon
    finally:
        daemon.kill()
        daemon.wait()
        _unmount(mnt)


@contextlib.contextmanager
def fuse_dir(tmp_path: Any, helper: str, *args: str,
             **kw: Any) -> Iterator[tuple[Any, subprocess.Popen]]:
    """``tmp_path/mnt`` mounted with the FUSE daemon ``helper`` (see :func:`fuse_mount`):
    yields (mount point, daemon). The test skips where FUSE cannot mount here."""
    why = fuse_unusable()
    if why:
        pytest.skip(why)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        with fuse_mount(helper, mnt, *args, **kw) as daemon:
            yield mnt, daemon
    except RuntimeError as exc:
        pytest.skip(str(exc))


@contextlib.contextmanager
def tmpfs_dir(tmp_path: Any, size: str) -> Iterator[Any]:
    """``tmp_path/small``, a tmpfs of ``size`` (mount's notation: ``64k``) for a full
    disk, unmounted whatever happens. The test skips where it cannot be mounted."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                       capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def wait_for_end(out, timeout: float = 30.0) -> str:
    """The drainer completes the file of a process gone without finalize (killed, or
    exited without it): wait until the file in ``out`` ends with ']'."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = files(out)
        if found and last_line(found[0]) == b"]":
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no complete file in {out}: {files(out)}")
