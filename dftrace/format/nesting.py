"""The nesting and parent rules of ``dftrace validate`` in bounded memory.

A file's complete events arrive in the order they were written (a span when it
ends, children before their parents); the rules need them per thread in start
order. :class:`SpanChecker` keeps up to :data:`RUN_SPANS` spans in memory, sorts
them and writes them to a temporary file as a sorted run when full, then merges the
runs (one block of each in memory) into one stream in start order and checks it
with a stack of the open spans of the thread. A child's parent is found among the
spans that enclose it; only children whose parent is not there (on another thread,
not enclosing, or written elsewhere) are looked up by id, in one more read of the
runs. Memory is bounded by the run size, the nesting depth (identical spans share
one place on the stack) and the children with such parents, not by the spans.
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

#: Spans sorted in memory before they go to a run on disk.
RUN_SPANS = 1 << 16
#: Spans read back from a run at a time.
_BLOCK = 4096
#: Stands for a missing (or non-integer) id, parent or level.
NONE = -(2**63)
# Ids, parents and levels are integers in (NONE, _LIMIT); anything else counts as NONE.
_LIMIT = 2**63
# track, ts, -end, line, end, id, parent, level: the sort key first.
_RECORD = struct.Struct("<qddqdqqq")


class Found(NamedTuple):
    """A broken rule: line, rule, message (``format.Violation``'s fields)."""

    line: int
    rule: str
    message: str


class SpanChecker:
    """Collects the complete events of one file (:meth:`add`) and yields the nesting
    and parent rules they break (:meth:`check`)."""

    def __init__(self, run_spans: int | None = None) -> None:
        self.run_spans = run_spans or RUN_SPANS
        self.tracks: dict[tuple[Any, Any], int] = {}
        self.keys: list[tuple[Any, Any]] = []
        self.records: list[tuple[int, float, float, int, float, int, int, int]] = []
        self.runs: list[str] = []
        self.folder: str | None = None

    def add(self, pid: Any, tid: Any, ts: float, end: float, line: int, span_id: Any, parent: Any,
            level: Any) -> None:
        self.add_many([(pid, tid, ts, end, line, span_id, parent, level)])

    def add_many(self, spans: Iterable[tuple[Any, Any, float, float, int, Any, Any, Any]]) -> None:
        """:meth:`add` each of ``spans``, given as its arguments."""
        tracks, records = self.tracks, self.records
        for pid, tid, ts, end, line, span_id, parent, level in spans:
            track = tracks.get((pid, tid))
            if track is None:
                track = tracks[(pid, tid)] = len(self.keys)
                self.keys.append((pid, tid))
            end = float(end)
            records.append((track, float(ts), -end, line, end,
                            span_id if type(span_id) is int and NONE < span_id < _LIMIT else NONE,
                            parent if type(parent) is int and NONE < parent < _LIMIT else NONE,
                            level if type(level) is int and NONE < level < _LIMIT else NONE))
            if len(records) >= self.run_spans:
                self._spill()
                records = self.records

    def _spill(self) -> None:
        if self.folder is None:
            self.folder = tempfile.mkdtemp(prefix="dftrace-validate-")
        self.records.sort()
        path = os.path.join(self.folder, f"{len(self.runs)}.run")
        with open(path, "wb") as fh:
            pack = _RECORD.pack
            for start in range(0, len(self.records), _BLOCK):
                fh.write(b"".join(pack(*r) for r in self.records[start:start + _BLOCK]))
        self.runs.append(path)
        self.records = []

    def _sorted(self) -> Iterator[tuple[int, float, float, int, float, int, int, int]]:
        if not self.runs:
            self.records.sort()
            return iter(self.records)
        if self.records:
            self._spill()
        return _merge_runs(self.runs)

    def close(self) -> None:
        for path in self.runs:
            try:
                os.unlink(path)
            except OSError:
                pass
        if self.folder is not None:
            try:
                os.rmdir(self.folder)
            except OSError:
                pass
        self.runs, self.records, self.folder = [], [], None

    def check(self) -> Iterator[Found]:
        """The violations, per thread in start order (sort them by line to report)."""
        try:
            unresolved: dict[tuple[Any, int], list[tuple[int, int, float, float, int]]] = {}
            yield from self._check_stream(unresolved)
            if unresolved:
                yield from self._check_unresolved(unresolved)
        finally:
            self.close()

    def _check_stream(self, unresolved: dict[tuple[Any, int], list[tuple[int, int, float, float, int]]]
                      ) -> Iterator[Found]:
        # The stack of open spans of the current track: [ts, end, line, {id: level}],
        # identical spans (same start and end) sharing one entry (its latest line).
        stack: list[list[Any]] = []
        # id -> the stack's entries holding it, bottom first: finding a parent costs
        # one look-up however deep the stack (100,000 spans never stopped, say)
        holding: dict[int, list[list[Any]]] = {}
        current = -1
        for track, ts, _, line, end, span_id, parent, level in self._sorted():
            if track != current:
                current, stack, holding = track, [], {}
            # Touching spans (one ends where the next starts) are disjoint.
            while stack and stack[-1][1] <= ts and not stack[-1][1] == ts == end:
                for gone in stack.pop()[3]:
                    entries = holding[gone]
                    entries.pop()
                    if not entries:
                        del holding[gone]
            if stack and end > stack[-1][1]:
                pid, tid = self.keys[current]
                yield Found(line, "nesting", f"overlaps the span at line {stack[-1][2]} on pid {pid} tid {tid} "
                                             "without nesting in it")
                if parent != NONE:
                    found = self._parent(track, line, parent, level, holding, unresolved, ts, end)
                    if found is not None:
                        yield found
                continue
            if parent != NONE:
                found = self._parent(track, line, parent, level, holding, unresolved, ts, end)
                if found is not None:
                    yield found
            top = stack[-1] if stack else None
            if top is not None and top[0] == ts and top[1] == end:
                top[2] = line
            else:
                top = [ts, end, line, {}]
                stack.append(top)
            if span_id != NONE:
                if span_id not in top[3]:
                    holding.setdefault(span_id, []).append(top)
                top[3][span_id] = level

    def _parent(self, track: int, line: int, parent: int, level: int, holding: dict[int, list[list[Any]]],
                unresolved: dict[tuple[Any, int], list[tuple[int, int, float, float, int]]], ts: float, end: float
                ) -> Found | None:
        """The rule a span with ``parent`` (not NONE) breaks by it, if one can be told yet."""
        if parent <= 0:  # 0 (dftrace) or -1 (DFTracer 1.x): a root span
            if level != NONE and parent == 0 and level != 1:
                return Found(line, "level", f"a span without parent has level {level}, expected 1")
            return None
        entries = holding.get(parent)
        if entries:  # the innermost open span with that id
            entry = entries[-1]
            parent_level = entry[3][parent]
            if level != NONE and parent_level != NONE and level != parent_level + 1:
                return Found(line, "level", f"level {level} inside a level-{parent_level} parent "
                                            f"(line {entry[2]})")
            return None
        unresolved.setdefault((self.keys[track][0], parent), []).append((line, track, ts, end, level))
        return None

    def _check_unresolved(self, unresolved: dict[tuple[Any, int], list[tuple[int, int, float, float, int]]]
                          ) -> Iterator[Found]:
        """Children whose parent is not among the spans that enclose them: the parent
        by id (the last one written with it) is on another thread, does not enclose
        them, or is not in the file (then nothing is wrong)."""
        by_id: dict[tuple[Any, int], tuple[int, int, float, float, int]] = {}
        for track, ts, _, line, end, span_id, _, level in self._sorted():
            key = (self.keys[track][0], span_id)
            if span_id != NONE and key in unresolved and (key not in by_id or line > by_id[key][0]):
                by_id[key] = (line, track, ts, end, level)
        for key, children in unresolved.items():
            found = by_id.get(key)
            if found is None:
                continue  # the parent was dropped or lives in another part file
            p_line, p_track, p_ts, p_end, p_level = found
            for line, track, ts, end, level in children:
                tid, parent_tid = self.keys[track][1], self.keys[p_track][1]
                if parent_tid != tid:
                    yield Found(line, "parent", f"p_idx {key[1]} is a span on tid {parent_tid}, not on tid {tid}")
                elif not (p_ts <= ts and end <= p_end):
                    yield Found(line, "parent", f"p_idx {key[1]} (line {p_line}) does not enclose this span")
                elif level != NONE and p_level != NONE and level != p_level + 1:
                    yield Found(line, "level", f"level {level} inside a level-{p_level} parent (line {p_line})")


def _merge_runs(paths: list[str]) -> Iterator[tuple[int, float, float, int, float, int, int, int]]:
    """The records of the sorted runs at ``paths`` in one sorted stream. A block of
    each run is in memory; every record up to the smallest of their last records is
    in memory too, and goes out in one sort (of a few sorted pieces, in C) rather
    than one comparison of Python tuples at a time."""
    size = _RECORD.size
    unpack_from = _RECORD.unpack_from
    # Per run: its block of records, how many of them went out, its file.
    runs = []
    for path in paths:
        fh = open(path, "rb")
        runs.append([fh.read(size * _BLOCK), 0, fh])
    try:
        while runs:
            last = min(unpack_from(block, len(block) - size) for block, _, _ in runs)
            batch: list[tuple[int, float, float, int, float, int, int, int]] = []
            for run in runs:
                block, done, _ = run
                low, high = done, len(block) // size  # the first record after ``last``
                while low < high:
                    middle = (low + high) // 2
                    if unpack_from(block, middle * size) <= last:
                        low = middle + 1
                    else:
                        high = middle
                batch.extend(_RECORD.iter_unpack(memoryview(block)[done * size:low * size]))
                run[1] = low
                if low * size == len(block):
                    run[0], run[1] = run[2].read(size * _BLOCK), 0
            batch.sort()
            yield from batch
            for run in runs:
                if not run[0]:
                    run[2].close()
            runs = [run for run in runs if run[0]]
    finally:
        for run in runs:
            run[2].close()
