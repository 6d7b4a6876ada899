"""Text made safe for a terminal: what a trace holds (names, paths, reasons) is printed
with its control characters escaped. Needs nothing beyond the standard library, so the
commands that work without the analysis extra (``validate``) can use it."""

from __future__ import annotations

import re
import unicodedata
from typing import Any

#: Characters a terminal acts on instead of showing: C0 and C1 controls (escape
#: sequences, bell, carriage return), DEL, and the invisible ones that reorder text.
_UNPRINTABLE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` safe to print on a terminal: control characters (but the line breaks)
    shown as ``\\x1b``-style escapes, so a name in a trace cannot move the cursor,
    clear the screen or write the clipboard."""
    return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                            else f"\\u{ord(m.group()):04x}", text)


def one_line(text: str) -> str:
    """``text`` :func:`printable`, its line breaks escaped too: a table's cell."""
    return printable(text).replace("\n", "\\n")


def columns(text: str) -> int:
    """How many terminal columns ``text`` takes: wide characters (CJK, most emoji) two."""
    if text.isascii():
        return len(text)
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 0 if unicodedata.combining(c) else 1 for c in text)


def printable_data(value: Any) -> Any:
    """``value`` (dicts, lists, strings) with every string made :func:`printable`."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {k: printable_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(printable_data(v) for v in value)
    return value
