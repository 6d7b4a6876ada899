"""Storage that fails: each failure is said, with a count, when it happens, and the
count in all at the end; no event is lost without a count (with each writer)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import subprocess
import sys
import time

import pytest

from dftrace import testing

from _signals import default_signals

from ._util import WRITERS, clean_env, fuse_dir, last_line, meta, spans, tmpfs_dir, write_script

# The child records `rounds` rounds of 100 spans, one round per flush, prints how
# many, and waits for a line on stdin before it ends (the test reads its stderr
# meanwhile); then it prints what its session says of the trace.
CHILD = """
    import json, sys, time
    import dftrace
    from dftrace import ai
    s = dftrace.initialize(log_file=sys.argv[1], writer=sys.argv[2], flush_interval=0.05,
                           compression="none", max_file_size=int(sys.argv[4]))
    n = 0
    for _ in range(int(sys.argv[3])):
        for _ in range(100):
            with ai.compute.forward(args={"pad": "x" * 60}):
                n += 1
        time.sleep(0.06)
    print(n, flush=True)
    sys.stdin.readline()
    dftrace.finalize()
    print(json.dumps({"paths": s.paths, "unsaved": s.sink.unsaved, "lost": s.events_lost,
                      "loss_record": s.sink.loss_record}), flush=True)
"""

#: The count in all, as finalize says it.
FINAL = re.compile(r"dftrace: (\d+) events could not be written to")
#: The count so far, as the warning at a failed write says it.
SO_FAR = re.compile(r"failed \(OSError: \[Errno \d+\] [^)]*\): (\d+) events lost so far")


class Child:
    """The traced child, its stderr read while it runs."""

    def __init__(self, tmp_path, log_file, writer: str, rounds: int, max_file_size: int = 0,
                 stderr_file=None):
        self.run_dir = tmp_path / "run"  # where records of losses go (XDG_RUNTIME_DIR)
        self.run_dir.mkdir(mode=0o700)
        script = write_script(tmp_path, CHILD)
        self.stderr_file = stderr_file  # a file (a batch job's output) instead of a pipe
        with contextlib.ExitStack() as files:
            stderr = (subprocess.PIPE if stderr_file is None
                      else files.enter_context(open(stderr_file, "wb")))
            self.proc = subprocess.Popen(
                [sys.executable, script, str(log_file), writer, str(rounds), str(max_file_size)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                env=clean_env(XDG_RUNTIME_DIR=str(self.run_dir)), preexec_fn=default_signals)
        self.err = b""

    def emitted(self) -> int:
        line = self.proc.stdout.readline()
        assert line.strip().isdigit(), self.proc.stderr.read().decode()
        return int(line)

    def stderr_until(self, pattern: re.Pattern, timeout: float = 60.0) -> re.Match:
        """Read the child's stderr until ``pattern`` appears (``timeout`` only bounds a
        test that fails: the child waits on stdin meanwhile)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.stderr_file is not None:
                self.err = self.stderr_file.read_bytes()
            found = pattern.search(self.err.decode(errors="replace"))
            if found:
                return found
            left = deadline - time.monotonic()
            assert left > 0, f"no {pattern.pattern!r} in {self.err.decode()!r}"
            if self.stderr_file is not None:
                time.sleep(0.05)
                continue
            fd = self.proc.stderr.fileno()
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 65536)
                assert chunk, f"stderr ended without {pattern.pattern!r}: {self.err.decode()!r}"
                self.err += chunk

    def end(self) -> tuple[dict, str]:
        """Let the child finalize; its session's account of the trace, and its whole stderr."""
        out, err = self.proc.communicate(b"\n", timeout=120)
        assert self.proc.returncode == 0, (self.err + err).decode()
        return json.loads(out.decode().splitlines()[-1]), (self.err + err).decode()


# -- storage that fails when a file is finished (NFS write-back) ----------------------

@pytest.fixture(params=["EIO", "EDQUOT"])
def write_back_mount(request, tmp_path):
    """A mount that takes every write and fails each close and fsync with the error."""
    with fuse_dir(tmp_path, "_writeback_fs.py", request.param) as (mnt, _):
        yield mnt


@pytest.mark.needs("fuse")
@pytest.mark.parametrize("writer", WRITERS)
def test_a_file_the_storage_does_not_keep_is_counted_and_said(tmp_path, write_back_mount, writer):
    """Storage that accepts every write and fails at fdatasync/close: the file's
    events are counted as lost (every span the child recorded), the session does
    not list the file as written, and the record of the loss is kept elsewhere."""
    child = Child(tmp_path, write_back_mount / "t", writer, rounds=10)
    emitted = child.emitted()
    account, err = child.end()
    assert "the storage did not keep" in err, err
    (final,) = FINAL.findall(err)
    assert int(final) == account["lost"] >= emitted  # every span, and the metadata lines
    assert account["paths"] == [] and len(account["unsaved"]) == 1, account
    assert account["loss_record"] and account["loss_record"] in err
    assert os.path.dirname(account["loss_record"]) == str(child.run_dir)
    assert os.stat(account["loss_record"]).st_mode & 0o777 == 0o600
    (record,) = meta(testing.read_events(account["loss_record"]), "dropped")
    assert record["args"]["count"] == account["lost"]
    assert record["args"]["reason"] == "storage"


@pytest.mark.needs("fuse")
@pytest.mark.parametrize("writer", WRITERS)
def test_a_part_file_the_storage_does_not_keep_is_said_while_the_program_runs(
        tmp_path, write_back_mount, writer):
    """With part files, the first part the storage fails to keep is said while the
    program still runs, with its count; nothing after it is lost without a count."""
    child = Child(tmp_path, write_back_mount / "t", writer, rounds=10, max_file_size=4096)
    emitted = child.emitted()
    so_far = child.stderr_until(re.compile(r"the (\d+) events written to it are lost"))
    assert child.proc.poll() is None  # said before the program ends
    assert int(so_far.group(1)) > 0
    account, err = child.end()
    (final,) = FINAL.findall(err)
    assert int(final) == account["lost"] >= emitted
    assert account["paths"] == [], account


# -- a full disk ----------------------------------------------------------------------

@pytest.fixture
def full_disk(tmp_path):
    """A 128 KiB tmpfs, half of it taken by the file ``filler``."""
    with tmpfs_dir(tmp_path, "128k") as mnt:
        (mnt / "filler").write_bytes(b"\0" * 64 * 1024)
        yield mnt


@pytest.mark.parametrize("writer", WRITERS)
def test_a_full_disk_is_said_while_the_program_runs(tmp_path, full_disk, writer):
    """The disk fills: a warning with the count so far comes while the program
    runs; space comes back before the end: the file ends with the record of the
    loss, and the count in all is exactly the spans recorded but not in the file."""
    child = Child(tmp_path, full_disk / "t", writer, rounds=40)
    emitted = child.emitted()
    so_far = child.stderr_until(SO_FAR)
    assert child.proc.poll() is None  # said before the program ends
    assert int(so_far.group(1)) > 0
    (full_disk / "filler").unlink()  # space comes back
    account, err = child.end()
    (path,) = account["paths"]
    written = len(spans(testing.read_events(path), "forward"))
    (final,) = FINAL.findall(err)
    assert 0 < written < emitted
    assert int(final) == account["lost"] == emitted - written
    assert last_line(path) == b"]"
    (record,) = meta(testing.read_events(path), "dropped")
    assert record["args"]["count"] == account["lost"]
    assert account["loss_record"] is None


@pytest.mark.parametrize("writer", WRITERS)
def test_a_program_killed_after_the_disk_filled_has_said_it(tmp_path, full_disk, writer):
    """Standard error is a file (a batch job's output): the warning with the count
    so far is in it while the program runs, so a job its scheduler kills after the
    disk filled has said it."""
    out = tmp_path / "job.err"
    child = Child(tmp_path, full_disk / "t", writer, rounds=40, stderr_file=out)
    child.emitted()
    so_far = child.stderr_until(SO_FAR)
    assert int(so_far.group(1)) > 0
    child.proc.kill()  # the scheduler's SIGKILL
    child.proc.communicate(timeout=60)
    assert SO_FAR.search(out.read_text())
