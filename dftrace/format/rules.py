"""Checking trace files against the format's rules (``RULES``; docs/format.md, section 5):
:func:`validate_file`. Public as :mod:`dftrace.format`."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any, NamedTuple

import orjson

from .nesting import SpanChecker
from .names import (ARG_LEVEL, ARG_PARENT, CHROME_SUFFIXES, PH_COMPLETE, PH_COUNTER,
                           PH_INSTANT, PH_METADATA, UINT32_MAX, normalize_phase)
from .reading import (LONG_LINE, MAX_DEPTH, TraceLine, iter_line_pieces, parse_line,
                             trace_tail_lines)

#: Violations ``validate_file`` keeps per file (those of the lowest lines; all are counted).
MAX_VIOLATIONS = 100_000


# --- validation ----------------------------------------------------------------------


#: Every rule ``validate`` can print, by the name it prints, and what it checks (docs/format.md
#: shows the same table): ``dftrace validate --explain RULE`` prints it.
RULES: dict[str, str] = {
    "open": "the file starts with a `[` line",
    "empty": "with `--strict`: the file holds something (a 0-byte file does not)",
    "brackets": "no stray `[` or `]` lines",
    "after-close": "nothing follows the closing `]`",
    "json": "each line is one JSON object, nested at most 64 levels (the line's object is level 1, its `args` 2)",
    "comma": "no separating commas (`.json` files, Chrome's array layout, may have them)",
    "utf8": "the line is valid UTF-8",
    "surrogate": "no escaped surrogates (`\\ud800`–`\\udfff`)",
    "metadata-first": "the first event is a metadata event",
    "ph": "`ph` is a Chrome phase letter",
    "name": "`name` is a string",
    "cat": "`cat`, where present, is a string",
    "pid": "present, integers in `[0, 2**32)`",
    "tid": "present, integers in `[0, 2**32)`",
    "ts": "numbers in `[0, 2**53]` microseconds (`ts` on complete, counter and instant events, `dur` on complete "
          "ones)",
    "dur": "numbers in `[0, 2**53]` microseconds (`ts` on complete, counter and instant events, `dur` on complete "
           "ones)",
    "args": "`args` is a JSON object",
    "nesting": "spans on one thread are nested or disjoint, never partly overlapping",
    "parent": "`p_idx` names an enclosing span on the same thread",
    "level": "`level` is one more than the parent's (1 without a parent)",
    "parquet": "the file is a readable Parquet file",
    "parquet-metadata": "the `dftrace` document is there, of a known version, with `processes` and `meta` lists",
    "parquet-columns": "every column of `EVENT_COLUMNS` is there with its type",
    "cut": "with `--strict`: the file ends with its closing `]` line",
    "more": "not a rule: a file breaks rules more than 100,000 times; the first 100,000 by line are listed and "
            "the rest counted",
}


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


# --- what makes a line readable: the one rule set of validate and of every analysis command


#: The largest ``ts`` and ``dur`` (microseconds) an event may hold: 2**53 µs (about
#: 285 years), the last count of microseconds a JSON number read as a double holds
#: exactly. ``ts`` and ``dur`` are numbers in ``[0, MAX_TIME_US]``.
MAX_TIME_US = 2**53
#: ``pid`` and ``tid`` are integers in ``[0, MAX_ID]`` (unsigned 32-bit).
MAX_ID = UINT32_MAX


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_ID


def _is_time(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= MAX_TIME_US


def event_problems(event: dict[str, Any]) -> list[tuple[str, str]]:
    """The rules of a readable event that ``event`` (a parsed line) breaks, as
    ``(rule, message)``; empty when every command can read it. Shared by
    :func:`validate_file` and the analysis, which counts such a line as broken
    (with the first message as its reason): ``ph`` present and a phase (a letter or
    DFTracer's integer code); ``name`` a string (metadata may go without); ``cat``
    a string or absent; ``pid``/``tid`` integers in ``[0, MAX_ID]`` or absent;
    ``ts``/``dur`` numbers in ``[0, MAX_TIME_US]`` or absent; ``args`` an object or
    absent. A key given twice counts with its last value, as JSON parsers read it."""
    ph, name, cat, pid, tid, ts, dur, args = map(event.get, _RULED_KEYS)
    # Nearly every line: exact types in range, decided without building anything.
    if (type(ph) is str and type(name) is str and (cat is None or type(cat) is str)
            and (pid is None or (type(pid) is int and 0 <= pid <= MAX_ID))
            and (tid is None or (type(tid) is int and 0 <= tid <= MAX_ID))
            and (ts is None or (type(ts) in _NUMBER and 0 <= ts <= MAX_TIME_US))
            and (dur is None or (type(dur) in _NUMBER and 0 <= dur <= MAX_TIME_US))
            and (args is None or type(args) is dict)):
        return []
    found = []
    if ph is None:
        found.append(("ph", "event without ph"))
    elif normalize_phase(ph) is None:
        found.append(("ph", f"no usable ph: {ph!r}"))
    if name is None:
        if normalize_phase(ph) != PH_METADATA:
            found.append(("name", "event without name"))
    elif not isinstance(name, str):
        found.append(("name", f"name must be a string, got {name!r}"))
    if cat is not None and not isinstance(cat, str):
        found.append(("cat", f"cat must be a string, got {cat!r}"))
    for key in ("pid", "tid"):
        value = event.get(key)
        if value is not None and not _is_id(value):
            found.append((key, f"{key} must be an integer in [0, 2**32), got {value!r}"))
    for key in ("ts", "dur"):
        value = event.get(key)
        if value is not None and not _is_time(value):
            found.append((key, f"{key} must be a number in [0, 2**53], got {value!r}"))
    if args is not None and not isinstance(args, dict):
        found.append(("args", "args must be a JSON object"))
    return found


_RULED_KEYS = ("ph", "name", "cat", "pid", "tid", "ts", "dur", "args")
_NUMBER = (int, float)


class TornTail(NamedTuple):
    """A trace cut off by a process killed mid-write (or one still writing): a
    compressed file whose last frame/member ends at ``offset``, inside the
    frame/member that starts at ``frame``, or (``frame`` None) a file of whole lines
    without its closing ``]`` line. The whole lines before the cut are readable."""

    #: File offset where the file was cut (its end).
    offset: int
    #: Events on the whole lines before the cut.
    events: int
    #: File offset where the cut frame/member starts; None for a file without its ``]``.
    frame: int | None = None

    def __str__(self) -> str:
        if self.frame is None:
            return f"cut: {_UNCLOSED}, {self.events} events readable"
        return f"cut off at byte {self.offset} in the frame that starts at byte {self.frame}, " \
               f"{self.events} events readable"


_UNCLOSED = ("the file ends without its closing ']' line: written by a process that was killed "
             "or is still running")


_CUT = re.compile(r"compressed stream cut off at byte (\d+), in the frame/member that starts at byte (\d+)")


def validate_file(path: str | os.PathLike[str], *, strict: bool = False,
                  torn: list[TornTail] | None = None) -> list[Violation]:
    """Check a trace file against docs/format.md and return the violations in line order.

    Rules: the file opens with a ``[`` line and nothing follows a closing ``]``; one
    JSON object per line with no separating commas (``.json`` files, Chrome's array
    layout, may have them); valid UTF-8 without escaped surrogates; a metadata event
    first; ``ph`` a Chrome phase letter; ``pid``/``tid`` unsigned 32-bit integers;
    ``ts`` and ``dur`` in ``[0, MAX_TIME_US]`` on complete events; spans on each thread nested or
    disjoint, never partly overlapping; ``p_idx``/``level`` consistent with the
    enclosing span; every line readable by the rules of :func:`event_problems`.
    A file cut off by a kill is normal: a file of whole lines without its closing
    ``]``, or a compressed file whose last frame/member was cut mid-write. Unless
    ``strict``, the cut (and the partial line it leaves) is no violation, and is
    reported in ``torn`` if a list is given; with ``strict`` it is a violation
    (rule ``cut`` for a missing ``]``), and so is an empty file (no ``[``, no event).
    An empty list means the file follows the contract.
    """
    check = _FileCheck(os.fspath(path).endswith(CHROME_SUFFIXES), strict, torn)
    number = 0
    cut = None
    pending = b""
    for piece in iter_line_pieces(path, piece_bytes=_PIECE_BYTES):
        cut = piece.cut_off
        lines = piece.data.split(b"\n")
        pending = lines.pop()  # the stream's last line has no break: it comes last
        if piece.long_lines:
            long_lines = {number + index for index in piece.long_lines}
            for n, raw in enumerate(lines, number + 1):
                check.line(TraceLine(n, b"", None, LONG_LINE) if n in long_lines else parse_line(raw.strip(), n))
        else:
            check.lines(number, lines, piece.data)
        number += len(lines)
    for line in trace_tail_lines(pending, number, cut):
        check.line(line)
    return check.result(os.path.getsize(path))


#: Decoded bytes validated as one block of lines.
_PIECE_BYTES = 8 << 20
#: Lines checked as one block, and the fewest that one that cannot be is split into.
_BLOCK_LINES = 512
_FEW_LINES = 16
# Whatever is not an object's or array's opening or a line break.
_NOT_OPENING = bytes(set(range(256)) - set(b"{[\n"))


def _plain(data: bytes) -> bool:
    """Whether no line of ``data`` holds an escaped surrogate or may nest deeper than
    :data:`MAX_DEPTH` (has more openings), the text rules a parser does not check."""
    if b"\\u" in data and _SURROGATE.search(data):
        return False
    return max(map(len, data.translate(None, _NOT_OPENING).split(b"\n"))) <= MAX_DEPTH


class _FileCheck:
    """The rules of one file, fed its lines in order: :meth:`line` one at a time,
    :meth:`events` a block of event lines at once (the bulk of a file, checked
    without a Python object per line beyond the parsed event)."""

    def __init__(self, allow_commas: bool, strict: bool, torn: list[TornTail] | None) -> None:
        self.allow_commas = allow_commas
        self.strict = strict
        self.torn = torn
        self.violations = _Violations()
        self.spans = SpanChecker()
        self.state = "start"  # -> "open" after "[" (or the first event), -> "closed" after "]"
        self.first_event = True
        self.events_seen = 0
        self.cut_frame = False  # a compressed file cut mid-frame: reported as such, not as unclosed too

    def line(self, line: TraceLine) -> None:
        n, text = line.number, line.text
        cut = _CUT.search(line.error) if line.error is not None else None
        self.cut_frame |= cut is not None
        if cut is not None and not self.strict:
            if self.torn is not None:
                self.torn.append(TornTail(int(cut[1]), self.events_seen, int(cut[2])))
            return
        self.events_seen += line.event is not None
        violations = self.violations
        if self.state == "closed":
            if text:
                violations.add(Violation(n, "after-close", "content after the closing ']'"))
            return
        if line.is_structural:
            if text == b"[" and self.state == "start":
                self.state = "open"
            elif text == b"]" and self.state == "open":
                self.state = "closed"
            elif text:
                violations.add(Violation(n, "brackets", f"stray {text.decode(errors='replace')!r}"))
            return
        if self.state == "start":
            violations.add(Violation(n, "open", "the file must start with a '[' line"))
            self.state = "open"
        text_violations = _check_text(n, text, self.allow_commas)
        violations.extend(text_violations)
        if line.error is not None:
            if not any(v.rule in ("utf8", "surrogate") for v in text_violations):
                violations.add(Violation(n, "json", line.error))
            self.first_event = False
            return
        event = line.event
        assert event is not None
        if self.first_event and normalize_phase(event.get("ph")) != PH_METADATA:
            violations.add(Violation(n, "metadata-first", "the first event must be metadata (ph 'M')"))
        self.first_event = False
        found = _check_event(n, event)
        violations.extend(found)
        _collect_span(n, event, self.spans, clean=not found)

    def lines(self, number: int, lines: list[bytes], data: bytes) -> None:
        """Check ``lines`` (lines ``number + 1`` on, cut from ``data``) in blocks of
        :data:`_BLOCK_LINES` (few enough for their parsed events to stay in the CPU's
        caches), each by :meth:`events` where it can, else in halves, down to
        :data:`_FEW_LINES` lines checked one by one: a few broken or structural lines
        leave the rest on the fast path."""
        plain = _plain(data)
        for start in range(0, len(lines), _BLOCK_LINES):
            self._block(number + start, lines[start:start + _BLOCK_LINES], plain)

    def _block(self, number: int, lines: list[bytes], plain: bool) -> None:
        if (plain or _plain(b"\n".join(lines))) and self.events(number, lines):
            return
        if len(lines) > _FEW_LINES:
            half = len(lines) // 2
            self._block(number, lines[:half], plain)
            self._block(number + half, lines[half:], plain)
            return
        for n, raw in enumerate(lines, number + 1):
            self.line(parse_line(raw.strip(), n))

    def events(self, number: int, lines: list[bytes]) -> bool:
        """Check ``lines`` (lines ``number + 1`` on, :func:`_plain`) as :meth:`line`
        would, when each is a JSON object read by ``orjson`` as it stands, inside the
        open array after the first event; an event that breaks a rule goes through
        :meth:`line`. False (nothing checked) when the block is not such."""
        if self.state != "open" or self.first_event:
            return False
        try:
            # A line with a trailing comma, whitespace JSON does not allow, a bracket
            # line or invalid UTF-8 fails here.
            parsed = list(map(orjson.loads, lines))
        except orjson.JSONDecodeError:
            return False
        spans = []
        add_span = spans.append
        checked = 0
        for n, event in enumerate(parsed, number + 1):
            if type(event) is not dict:
                self.line(parse_line(lines[n - number - 1].strip(), n))
                continue
            ph, name, cat, pid, tid, ts, dur, args = map(event.get, _RULED_KEYS)
            # event_problems' and _check_event's fast paths in one.
            if (type(ph) is str and ph in _PHASES and type(name) is str and (cat is None or type(cat) is str)
                    and type(pid) is int and 0 <= pid <= MAX_ID
                    and (type(tid) is int and 0 <= tid <= MAX_ID if tid is not None else ph == PH_METADATA)
                    and (type(ts) in _NUMBER and 0 <= ts <= MAX_TIME_US if ts is not None else ph not in _TIMED)
                    and (type(dur) in _NUMBER and 0 <= dur <= MAX_TIME_US if dur is not None
                         else ph != PH_COMPLETE)
                    and (args is None or type(args) is dict)):
                checked += 1
                if ph == PH_COMPLETE:
                    if args is None:
                        args = _NO_ARGS
                    add_span((pid, tid, ts, ts + dur, n, event.get("id"), args.get(ARG_PARENT),
                              args.get(ARG_LEVEL)))
            else:
                self.line(TraceLine(n, lines[n - number - 1].strip(), event, None))
        self.spans.add_many(spans)
        self.events_seen += checked
        return True

    def result(self, size: int) -> list[Violation]:
        violations = self.violations
        if self.strict and self.state == "start":
            violations.add(Violation(0, "empty", "the file holds nothing: no '[' line and no event"))
        if self.state == "open" and not self.cut_frame:
            if self.strict:
                violations.add(Violation(0, "cut", _UNCLOSED))
            elif self.torn is not None:
                self.torn.append(TornTail(size, self.events_seen))
        violations.extend(Violation(*found) for found in self.spans.check())
        return violations.result()


_NO_ARGS: dict[str, Any] = {}


def _check_text(n: int, text: bytes, allow_commas: bool) -> list[Violation]:
    found = []
    try:
        text.decode("utf-8")
    except UnicodeDecodeError as exc:
        found.append(Violation(n, "utf8", f"invalid UTF-8 at byte {exc.start}"))
    if b"\\u" in text and _SURROGATE.search(text):
        found.append(
            Violation(n, "surrogate", "escaped surrogate (\\uD800-\\uDFFF); write raw UTF-8")
        )
    if text.endswith(b",") and not allow_commas:
        found.append(Violation(n, "comma", "events are not separated by commas in .pfw files"))
    return found


_PHASES = frozenset("BEXiIbenstfCMPONDRcvV()=")
_TIMED = (PH_COMPLETE, PH_COUNTER, PH_INSTANT)


def _check_event(n: int, event: dict[str, Any]) -> list[Violation]:
    """The rules every reader needs (:func:`event_problems`), then the writer's
    contract beyond them: phase letters, ``pid`` and ``tid`` present, times on the
    events that have them."""
    problems = event_problems(event)
    ph = event.get("ph")
    if (not problems and type(ph) is str and ph in _PHASES and type(event.get("name")) is str
            and event.get("pid") is not None and (event.get("tid") is not None or ph == PH_METADATA)
            and (event.get("ts") is not None or ph not in _TIMED)
            and (event.get("dur") is not None or ph != PH_COMPLETE)):
        return []  # nearly every line
    found = [Violation(n, rule, message) for rule, message in problems]
    broken = {v.rule for v in found}
    if "ph" not in broken:
        if not isinstance(ph, str):
            found.append(Violation(n, "ph", f"ph must be a phase letter, got {ph!r} (DFTracer 2.2's integer code)"))
        elif ph not in _PHASES:
            found.append(Violation(n, "ph", f"unknown phase {ph!r}"))
    if "name" not in broken and not isinstance(event.get("name"), str):
        found.append(Violation(n, "name", "name must be a string"))
    for key in ("pid", "tid"):
        if event.get(key) is None and (key == "pid" or ph != PH_METADATA):
            found.append(Violation(n, key, f"{key} is missing"))
    if event.get("ts") is None and ph in _TIMED:
        found.append(Violation(n, "ts", "ts is missing"))
    if event.get("dur") is None and ph == PH_COMPLETE:
        found.append(Violation(n, "dur", "dur is missing"))
    return found


def _collect_span(n: int, event: dict[str, Any], spans: SpanChecker, *, clean: bool) -> None:
    """Hand a complete event with usable times and ids to ``spans``; ``clean``: the
    event broke no rule (its times and ids are known to be usable)."""
    ph, ts, dur, pid, tid, args = map(event.get, ("ph", "ts", "dur", "pid", "tid", "args"))
    if ph != PH_COMPLETE:
        return
    if not clean and not (_is_time(ts) and _is_time(dur) and _is_id(pid) and _is_id(tid)):
        return
    if type(args) is not dict:
        args = {}
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
