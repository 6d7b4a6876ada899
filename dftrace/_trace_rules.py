"""Checking trace files against the rules of docs/format.md (section 5):
:func:`validate_file`. Public as :mod:`dftrace.format`."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any, NamedTuple

from ._nesting import SpanChecker
from ._trace_names import (ARG_LEVEL, ARG_PARENT, CHROME_SUFFIXES, PH_COMPLETE, PH_COUNTER,
                           PH_INSTANT, PH_METADATA, UINT32_MAX, normalize_phase)
from ._trace_reading import iter_trace_lines

#: Violations ``validate_file`` keeps per file (those of the lowest lines; all are counted).
MAX_VIOLATIONS = 100_000


# --- validation ----------------------------------------------------------------------


class Violation(NamedTuple):
    """A broken rule of docs/format.md (section 5) at a line of a trace file (0: the file as a whole)."""

    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line else "file"
        return f"{where}: [{self.rule}] {self.message}"


# An escaped surrogate (\ud800-\udfff) not preceded by an escaped backslash.
_SURROGATE = re.compile(rb"(?<!\\)(?:\\\\)*\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _is_uint32(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= UINT32_MAX


def _is_time(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


class TornTail(NamedTuple):
    """A compressed trace whose last frame/member was cut off (a process killed
    mid-write): the file ends at ``offset``, inside the frame/member that starts at
    ``frame``; the whole lines before the cut decode."""

    #: File offset where the file was cut (its end).
    offset: int
    #: Events on the whole lines before the cut.
    events: int
    #: File offset where the cut frame/member starts.
    frame: int | None = None

    def __str__(self) -> str:
        where = f" in the frame that starts at byte {self.frame}" if self.frame is not None else ""
        return f"cut off at byte {self.offset}{where}, {self.events} events readable"


_CUT = re.compile(r"compressed stream cut off at byte (\d+), in the frame/member that starts at byte (\d+)")


def validate_file(path: str | os.PathLike[str], *, strict: bool = False,
                  torn: list[TornTail] | None = None) -> list[Violation]:
    """Check a trace file against docs/format.md and return the violations in line order.

    Rules: the file opens with a ``[`` line and nothing follows a closing ``]``; one
    JSON object per line with no separating commas (``.json`` files, Chrome's array
    layout, may have them); valid UTF-8 without escaped surrogates; a metadata event
    first; ``ph`` a Chrome phase letter; ``pid``/``tid`` unsigned 32-bit integers;
    ``ts >= 0`` and ``dur >= 0`` on complete events; spans on each thread nested or
    disjoint, never partly overlapping; ``p_idx``/``level`` consistent with the
    enclosing span. A file cut off by a crash (no ``]``) is valid as long as every
    line it has is whole. A compressed file whose last frame/member was cut
    mid-write is normal after a kill: unless ``strict``, the cut (and the partial
    line it leaves) is no violation, and is reported in ``torn`` if a list is given;
    with ``strict``, an empty file (no ``[``, no event) is a violation too.
    An empty list means the file follows the contract.
    """
    allow_commas = os.fspath(path).endswith(CHROME_SUFFIXES)
    violations = _Violations()
    spans = SpanChecker()
    state = "start"  # -> "open" after "[" (or the first event), -> "closed" after "]"
    first_event = True
    events = 0
    for line in iter_trace_lines(path):
        n, text = line.number, line.text
        cut = _CUT.search(line.error) if line.error is not None else None
        if cut is not None and not strict:
            if torn is not None:
                torn.append(TornTail(int(cut[1]), events, int(cut[2])))
            continue
        events += line.event is not None
        if state == "closed":
            if text:
                violations.add(Violation(n, "after-close", "content after the closing ']'"))
            continue
        if line.is_structural:
            if text == b"[" and state == "start":
                state = "open"
            elif text == b"]" and state == "open":
                state = "closed"
            elif text:
                violations.add(Violation(n, "brackets", f"stray {text.decode(errors='replace')!r}"))
            continue
        if state == "start":
            violations.add(Violation(n, "open", "the file must start with a '[' line"))
            state = "open"
        text_violations = _check_text(n, text, allow_commas)
        violations.extend(text_violations)
        if line.error is not None:
            if not any(v.rule in ("utf8", "surrogate") for v in text_violations):
                violations.add(Violation(n, "json", line.error))
            first_event = False
            continue
        event = line.event
        assert event is not None
        if first_event and normalize_phase(event.get("ph")) != PH_METADATA:
            violations.add(Violation(n, "metadata-first", "the first event must be metadata (ph 'M')"))
        first_event = False
        violations.extend(_check_event(n, event))
        _collect_span(n, event, spans)
    if strict and state == "start":
        violations.add(Violation(0, "empty", "the file holds nothing: no '[' line and no event"))
    violations.extend(Violation(*found) for found in spans.check())
    return violations.result()


def _check_text(n: int, text: bytes, allow_commas: bool) -> list[Violation]:
    found = []
    try:
        text.decode("utf-8")
    except UnicodeDecodeError as exc:
        found.append(Violation(n, "utf8", f"invalid UTF-8 at byte {exc.start}"))
    if _SURROGATE.search(text):
        found.append(
            Violation(n, "surrogate", "escaped surrogate (\\uD800-\\uDFFF); write raw UTF-8")
        )
    if text.endswith(b",") and not allow_commas:
        found.append(Violation(n, "comma", "events are not separated by commas in .pfw files"))
    return found


_PHASES = frozenset("BEXiIbenstfCMPONDRcvV()=")


def _check_event(n: int, event: dict[str, Any]) -> list[Violation]:
    found = []
    ph = event.get("ph")
    if not isinstance(ph, str):
        hint = " (DFTracer 2.2's integer code)" if normalize_phase(ph) else ""
        found.append(Violation(n, "ph", f"ph must be a phase letter, got {ph!r}{hint}"))
    elif ph not in _PHASES:
        found.append(Violation(n, "ph", f"unknown phase {ph!r}"))
    if not isinstance(event.get("name"), str):
        found.append(Violation(n, "name", "name must be a string"))
    for key in ("pid", "tid"):
        if key in event:
            if not _is_uint32(event[key]):
                found.append(Violation(n, key, f"{key} must be an integer in [0, 2**32), got {event[key]!r}"))
        elif key == "pid" or ph != PH_METADATA:
            found.append(Violation(n, key, f"{key} is missing"))
    if ph in (PH_COMPLETE, PH_COUNTER, PH_INSTANT) and not _is_time(event.get("ts")):
        found.append(Violation(n, "ts", f"ts must be a number >= 0, got {event.get('ts')!r}"))
    if ph == PH_COMPLETE and not _is_time(event.get("dur")):
        found.append(Violation(n, "dur", f"dur must be a number >= 0, got {event.get('dur')!r}"))
    if "args" in event and not isinstance(event["args"], dict):
        found.append(Violation(n, "args", "args must be a JSON object"))
    return found


def _collect_span(n: int, event: dict[str, Any], spans: SpanChecker) -> None:
    if event.get("ph") != PH_COMPLETE:
        return
    ts, dur = event.get("ts"), event.get("dur")
    pid, tid = event.get("pid"), event.get("tid")
    if not (_is_time(ts) and _is_time(dur) and _is_uint32(pid) and _is_uint32(tid)):
        return
    args = event.get("args")
    args = args if isinstance(args, dict) else {}
    spans.add(pid, tid, ts, ts + dur, n, event.get("id"), args.get(ARG_PARENT), args.get(ARG_LEVEL))


class _Violations:
    """The violations of one file, at most :data:`MAX_VIOLATIONS` kept (those of the
    lowest lines), all counted: a file broken on every line needs no more memory."""

    def __init__(self) -> None:
        self.kept: list[Violation] = []
        self.count = 0

    def add(self, found: Violation) -> None:
        self.count += 1
        self.kept.append(found)
        if len(self.kept) >= 2 * MAX_VIOLATIONS:
            self.kept.sort(key=lambda v: v.line)
            del self.kept[MAX_VIOLATIONS:]

    def extend(self, found: Iterable[Violation]) -> None:
        for v in found:
            self.add(v)

    def result(self) -> list[Violation]:
        self.kept.sort(key=lambda v: v.line)
        del self.kept[MAX_VIOLATIONS:]
        if self.count > len(self.kept):
            self.kept.append(Violation(0, "more", f"{self.count - len(self.kept)} more violations not listed "
                                                  f"(the first {MAX_VIOLATIONS} by line are)"))
        return self.kept
