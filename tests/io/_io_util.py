"""Helpers for the file-I/O tests: run a traced program, read its I/O events back."""

from __future__ import annotations

import importlib.util
import json
import os
from collections import Counter, defaultdict
from typing import Any

import pytest

from dftrace import testing
from dftrace.format import parse_trace_filename
from reliability._util import run, write_script

from _requirements import needs_marks

#: Why file I/O cannot be traced here (None: it can).
MISSING = (None if importlib.util.find_spec("dftrace._core._io") is not None
           and os.environ.get("DFTRACE_NO_SPEEDUPS", "").strip() in ("", "0")
           else "file I/O tracing needs the C engine and dftrace._core._io (Linux, built at install)")

#: The marks of a test that traces file I/O.
NEEDS_IO = needs_marks("native", MISSING)

#: How most test programs start: the trace's log file from the command line
#: (``out``), the traced directory (``data``) made under the current one, and a
#: function that writes a file there.
START = """
    import json, os, sys
    import dftrace
    out = sys.argv[1]
    data = os.path.abspath("data")
    os.makedirs(data, exist_ok=True)

    def data_file(name, content):
        path = os.path.join(data, name)
        with open(path, "wb") as f:
            f.write(content)
        return path
"""

READS = {"read", "pread", "readv", "preadv", "fread", "fgets", "sendfile_read", "copy_file_range_read"}
WRITES = {"write", "pwrite", "writev", "pwritev", "fwrite", "fputs", "sendfile_write", "copy_file_range_write"}


def run_traced(tmp_path: Any, body: str, *args: str, timeout: float = 240, **env: str) -> dict:
    """Run ``body`` (a script whose last stdout line is JSON: the truth it counted)
    and return that JSON; the trace goes under ``tmp_path / "trace"``."""
    prog = write_script(tmp_path, body)
    done = run([prog, str(tmp_path / "trace" / "t"), *args], timeout=timeout, **env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr
    truth = json.loads(lines[-1])
    truth["_stderr"] = done.stderr
    return truth


class IOTrace:
    """The I/O events of every file under a directory, with their files' paths."""

    def __init__(self, directory: Any):
        self.events: list[dict[str, Any]] = []
        self.paths: dict[tuple[int, str], str] = {}
        self.meta: dict[int, list[dict[str, Any]]] = defaultdict(list)
        self.pids: set[int] = set()
        for path in testing.trace_files(directory):
            name = parse_trace_filename(path)
            assert name is not None, path
            self.pids.add(name.pid)
            for e in testing.read_events(path):
                if e.get("cat") in ("POSIX", "STDIO") and e.get("ph") == "X":
                    self.events.append(e)
                elif e.get("ph") == "M" and e.get("name") == "FH":
                    key = (e["pid"], e["args"]["value"])
                    assert self.paths.get(key, e["args"]["name"]) == e["args"]["name"]
                    self.paths[key] = e["args"]["name"]
                elif e.get("ph") == "M" and e.get("name") in ("io", "io_file"):
                    self.meta[e["pid"]].append(e)

    def path_of(self, e: dict[str, Any]) -> str:
        return self.paths[(e["pid"], e["args"]["fhash"])]

    def of(self, path: str) -> list[dict[str, Any]]:
        return [e for e in self.events if self.path_of(e) == path]

    def calls(self, path: str) -> Counter:
        """Calls on ``path`` by name (an aggregate counts the calls it covers)."""
        out: Counter = Counter()
        for e in self.of(path):
            out[e["name"]] += e["args"].get("calls", 1)
        return out

    def bytes(self, path: str, names: set[str]) -> int:
        return sum(e["args"]["ret"] for e in self.of(path)
                   if e["name"] in names and e["args"]["ret"] > 0)

    def totals(self, pid: int) -> dict[str, Any]:
        (io,) = [m["args"] for m in self.meta[pid] if m["name"] == "io"]
        return io


def needs_io(test: Any) -> Any:
    for mark in NEEDS_IO:
        test = mark(test)
    return test


def skip_unless(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"needs {module}")
