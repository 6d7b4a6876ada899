"""Helpers for testing code instrumented with dftrace (ours and yours).

    from dftrace import testing

    def test_forward_is_traced(tmp_path):
        with testing.trace_to(tmp_path) as result:
            model_step()
        assert result.names() == ["forward", "backward"]

``reset()`` puts every piece of global state back to how ``import dftrace`` left it;
call it between tests (our own suite does, from an autouse fixture).
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterator
from typing import Any

from . import _nodes
from . import _recorder as _rec
from . import _runtime

__all__ = ["TraceResult", "read_events", "trace_files", "reset", "trace_to", "spans"]


def trace_files(where: str | os.PathLike[str]) -> list[str]:
    """Trace files at a path: a file, a directory (searched recursively) or a glob."""
    p = os.fspath(where)
    if os.path.isfile(p):
        return [p]
    if os.path.isdir(p):
        pattern = os.path.join(p, "**", "*.pfw*")
        return sorted(f for f in glob.glob(pattern, recursive=True) if os.path.isfile(f))
    return sorted(f for f in glob.glob(p + "*") if ".pfw" in f and os.path.isfile(f))


def read_events(where: str | os.PathLike[str], *, strict: bool = True) -> list[dict[str, Any]]:
    """Every event of the trace files at ``where``, in file order. With ``strict``
    a line that is not valid JSON raises ``ValueError`` naming file and line."""
    from .format import iter_trace_lines

    out: list[dict[str, Any]] = []
    for path in trace_files(where):
        for line in iter_trace_lines(path):
            if line.event is not None:
                out.append(line.event)
            elif line.error is not None and strict:
                raise ValueError(f"{path}:{line.number}: {line.error}")
    return out


def spans(events: list[dict[str, Any]], name: str | None = None,
          cat: str | None = None) -> list[dict[str, Any]]:
    """The complete (``ph`` X) events, optionally only those with a name / category."""
    return [e for e in events if e.get("ph") == "X"
            and (name is None or e.get("name") == name)
            and (cat is None or e.get("cat") == cat)]


class TraceResult:
    """What a :func:`trace_to` block wrote; filled in when the block ends."""

    def __init__(self, directory: str):
        self.directory = directory
        self.events: list[dict[str, Any]] = []
        self.paths: list[str] = []

    def spans(self, name: str | None = None, cat: str | None = None) -> list[dict[str, Any]]:
        return spans(self.events, name, cat)

    def names(self, cat: str | None = None) -> list[str]:
        """Span names in the order they were written (end order)."""
        return [e["name"] for e in self.spans(cat=cat)]

    def metadata(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("ph") == "M" and e.get("name") == name]


@contextlib.contextmanager
def trace_to(directory: str | os.PathLike[str], **options: Any) -> Iterator[TraceResult]:
    """Trace the block into ``directory`` (uncompressed unless ``compression`` is
    given) and read the result back when it ends."""
    d = os.fspath(directory)
    options.setdefault("compression", "none")
    options.setdefault("log_file", os.path.join(d, "trace"))
    options.setdefault("inherit", False)
    result = TraceResult(d)
    s = _runtime.initialize(**options)
    try:
        yield result
    finally:
        _runtime.finalize()
        if s is not None:
            result.paths = s.paths
            for p in s.paths:
                result.events.extend(read_events(p))


def reset() -> None:
    """Finalize any session and restore all global state to its import-time values."""
    _runtime.finalize()
    s = _runtime.session()
    if s is not None:  # a session inherited through fork
        _runtime._session = None
    _rec.STATE.captures = 0
    _rec.STATE.dropped = 0
    _rec.STATE.open_spans.clear()
    _rec.STATE._warned.clear()
    _rec.STATE.consumer = None
    _rec.LOCAL.stk = None
    _rec.LOCAL.thread_stk = None
    _rec.TASK_STACK.set(None)
    del _rec.BUFFER[:]
    _nodes.set_off_for_good(False)
    _nodes.set_max_arg_length(1024)
    for root in list(_nodes._roots):
        for n in root._walk():
            n._enabled = True
            n._own_args.clear()
        for n in root._walk():
            n._rebuild()
    _runtime._set_gate()
