"""Helpers for testing code instrumented with dftrace (ours and yours).

    from dftrace import testing

    def test_forward_is_traced(tmp_path):
        with testing.trace_to(tmp_path) as result:
            model_step()
        assert result.names() == ["forward", "backward"]

    def test_step_sees_the_batch():
        with testing.trace_to_memory() as result:   # in memory: no files
            model_step(batch)
        testing.assert_span(result, "forward", cat="compute",
                            args={"params.x.shape": [32, 10]})
        testing.assert_nested(result, "step", "forward")

``reset()`` puts every piece of global state back to how ``import dftrace`` left it;
call it between tests (our own suite does, from an autouse fixture).
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterator
from typing import Any

from ._core import lifecycle as _lifecycle
from ._core.state import STATE
from ._inspect import browse, memory

__all__ = [
    "TraceResult",
    "assert_names",
    "assert_nested",
    "assert_span",
    "clean_state",
    "get_arg",
    "read_events",
    "reset",
    "spans",
    "trace_files",
    "trace_to",
    "trace_to_memory",
]


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
    from .format.reading import iter_trace_lines

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
    """What a :func:`trace_to` block wrote, or a :func:`trace_to_memory` block
    recorded (``directory`` None); filled in when the block ends."""

    def __init__(self, directory: str | None = None):
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

    @property
    def trace(self) -> browse.Trace:
        """The events as a browsable :class:`dftrace.Trace`."""
        return browse.Trace(self.events)


@contextlib.contextmanager
def trace_to(directory: str | os.PathLike[str], *, validate: bool = True,
             **options: Any) -> Iterator[TraceResult]:
    """Trace the block into ``directory`` (uncompressed unless ``compression`` is
    given) and read the result back when it ends. With ``validate`` (the default)
    the files are checked against the format rules and an ``AssertionError`` lists
    any violation."""
    d = os.fspath(directory)
    options.setdefault("compression", "none")
    options.setdefault("log_file", os.path.join(d, "trace"))
    options.setdefault("inherit", False)
    result = TraceResult(d)
    s = _lifecycle.initialize(**options)
    try:
        yield result
    finally:
        _lifecycle.finalize()
        if s is not None:
            result.paths = s.paths
            for p in s.paths:
                result.events.extend(read_events(p))
    if validate and s is not None:  # not when the block raised: that error comes first
        from .format.rules import validate_file

        problems = [f"{p}:{v.line}: {v.rule}: {v.message}" for p in s.paths for v in validate_file(p)]
        assert not problems, "trace breaks the format rules:\n" + "\n".join(problems[:20])


@contextlib.contextmanager
def trace_to_memory(max_items: int | None = None) -> Iterator[TraceResult]:
    """Record the block in memory (no files, no ``initialize``) with
    :func:`dftrace.trace_in_memory` and fill a :class:`TraceResult` when it ends, also
    when it raises. ``max_items`` is its sample mode."""
    result = TraceResult(None)
    trace = None
    try:
        with memory.trace_in_memory(max_items) as trace:
            yield result
    finally:
        if trace is not None:
            result.events = trace.events


def capture_events(max_items: int | None = None) -> contextlib.AbstractContextManager[TraceResult]:
    """Deprecated name of :func:`trace_to_memory`."""
    STATE.warn_deprecated("dftrace.testing.capture_events()", "dftrace.testing.trace_to_memory()")
    return trace_to_memory(max_items)


_MISSING: Any = object()


def _events_of(source: Any) -> list[dict[str, Any]]:
    if isinstance(source, (TraceResult, browse.Trace)):
        return source.events
    return list(source)


def _in_start_order(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def key(e: dict[str, Any]) -> tuple[Any, Any]:
        i = e.get("id")
        return e.get("ts", 0), i if isinstance(i, int) else 0

    return sorted(spans(events), key=key)


def get_arg(event: dict[str, Any], path: str, default: Any = _MISSING) -> Any:
    """The arg at a dotted path: ``get_arg(e, "params.batch.shape")``; a number
    indexes a list (``"result.0.shape"``). Without ``default`` a missing key raises
    ``KeyError`` naming the keys that are there."""
    value: Any = event.get("args", {})
    walked = "args"
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.lstrip("-").isdigit() and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            if default is not _MISSING:
                return default
            there = sorted(value) if isinstance(value, dict) else f"a {type(value).__name__}"
            raise KeyError(f"{walked} has no {part!r} (it holds: {there})")
        walked += "." + part
    return value


def _recorded(events: list[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for e in _in_start_order(events):
        k = f"{e.get('cat')}.{e.get('name')}"
        counts[k] = counts.get(k, 0) + 1
    return ", ".join(f"{k} ×{n}" for k, n in counts.items()) or "nothing"


def assert_span(source: Any, name: str, *, cat: str | None = None, count: int | None = None,
                args: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Assert spans named ``name`` (in ``cat``) were recorded: at least one, or
    exactly ``count``, whose args match ``args`` (keys are dotted paths, see
    :func:`get_arg`). Returns the matching spans, in start order. ``source`` is a
    :class:`TraceResult`, a :class:`dftrace.Trace` or a list of events."""
    events = _events_of(source)
    named = [e for e in _in_start_order(events)
             if e.get("name") == name and (cat is None or e.get("cat") == cat)]
    want = args or {}
    matching = [e for e in named
                if all(get_arg(e, k, _MISSING) == v for k, v in want.items())]
    ok = len(matching) >= 1 if count is None else len(matching) == count
    if not ok:
        what = f"span(s) named {name!r}" + (f" in category {cat!r}" if cat else "")
        if want:
            what += f" with args {want!r}"
        expected = "at least 1" if count is None else str(count)
        lines = [f"expected {expected} {what}; found {len(matching)}.",
                 f"Recorded: {_recorded(events)}."]
        for e in named[:3]:
            if e not in matching:
                got = {k: get_arg(e, k, "<missing>") for k in want}
                lines.append(f"  {name} id={e.get('id')} has {got!r}")
        raise AssertionError("\n".join(lines))
    return matching


def assert_names(source: Any, expected: list[str], *, cat: str | None = None) -> None:
    """Assert the span names (of ``cat``), in the order the spans started, are
    exactly ``expected``."""
    got = [e.get("name") for e in _in_start_order(_events_of(source))
           if cat is None or e.get("cat") == cat]
    if got != list(expected):
        first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b),
                     min(len(got), len(expected)))
        raise AssertionError(
            f"span names differ at position {first}:\n  expected {list(expected)!r}\n"
            f"  recorded {got!r}")


def assert_nested(source: Any, parent: str, child: str) -> list[dict[str, Any]]:
    """Assert every span named ``child`` runs inside a span named ``parent`` (its
    parent or a further ancestor, by ``p_idx``). Returns the ``child`` spans."""
    events = _in_start_order(_events_of(source))
    by_id = {(e.get("pid"), e.get("id")): e for e in events}
    children = [e for e in events if e.get("name") == child]
    if not children:
        raise AssertionError(f"no span named {child!r} was recorded. "
                             f"Recorded: {_recorded(events)}.")
    for e in children:
        chain: list[Any] = []
        p = by_id.get((e.get("pid"), e.get("args", {}).get("p_idx")))
        while p is not None and p.get("name") != parent and len(chain) <= len(events):
            chain.append(p.get("name"))
            p = by_id.get((p.get("pid"), p.get("args", {}).get("p_idx")))
        if p is not None and p.get("name") != parent:
            p = None  # a p_idx cycle (hand-made events): no such ancestor
        if p is None:
            path = " < ".join([child, *chain]) if chain else f"{child} (top level)"
            raise AssertionError(f"span {child!r} id={e.get('id')} is not inside a {parent!r} "
                                 f"span; its ancestors: {path}")
    return children


@contextlib.contextmanager
def clean_state() -> Iterator[None]:
    """Run the block from a clean slate and leave one: :func:`reset` before and after,
    and ``DFTRACE_*`` environment variables restored. Our test suites use it as an
    autouse fixture; so can yours::

        @pytest.fixture(autouse=True)
        def _dftrace_state():
            with dftrace.testing.clean_state():
                yield
    """
    saved = {k: v for k, v in os.environ.items() if k.startswith("DFTRACE_")}
    reset()
    try:
        yield
    finally:
        reset()
        for k in [k for k in os.environ if k.startswith("DFTRACE_")]:
            del os.environ[k]
        os.environ.update(saved)


def reset() -> None:
    """Finalize any session and restore all global state to its import-time values."""
    _lifecycle.finalize()
    STATE.reset()
