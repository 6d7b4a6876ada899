"""The trace file contract shared by dftrace's writer and its readers.

This module is the public face of three parts: the names and codes that appear in
trace files (categories, metadata event names, phase codes including DFTracer's
integer ones, file suffixes and the file-name pattern), a tolerant reader,
:func:`iter_trace_lines`, and the checker, :func:`validate_file`, for the rules in
docs/format.md (section 5). ``__all__`` lists its public API; the other names in
the files' contract are here too (``fmt.PH_COUNTER``).

It depends on the standard library, ``orjson`` and, for ``.zst`` files only,
``zstandard``, so the core and the tests can import it without pulling in the
analysis stack; the names load with the package, the reader and the rules on first
use.
"""

from __future__ import annotations

import importlib
from typing import Any

from .names import (AI_CATEGORIES, ARG_COUNT, ARG_EPOCH, ARG_HOSTNAME_HASH, ARG_INCOMPLETE, ARG_LEVEL,  # noqa: F401
                    ARG_PARENT, ARG_STEP, BLOCK_SUFFIX, CAT_CHECKPOINT, CAT_COMM, CAT_COMPUTE, CAT_DATA,
                    CAT_DATALOADER, CAT_DEVICE, CAT_DFTRACER, CAT_PIPELINE, CAT_SYSTEM, CAT_TRACER,
                    CHROME_SUFFIXES, COMMON_ARGS, DFTRACER_PHASES, DONE_SUFFIX, END_SUFFIX, EPOCH_NAMES,
                    EVALUATION_NAMES, INIT_SUFFIX,
                    ITER_SUFFIX, LOOP_BODY_SUFFIXES, META_CLOCK_ANCHOR, META_CUSTOM, META_DROPPED, META_FILE_HASH,
                    META_HOSTNAME_HASH, META_PROCESS_END, META_PROCESS_INFO, META_PROCESS_NAME,
                    META_PROCESS_SORT_INDEX, META_STRING_HASH, META_THREAD_NAME, META_THREAD_SORT_INDEX,
                    PERFETTO_METADATA, PH_AGGREGATED, PH_COMPLETE, PH_COUNTER, PH_INSTANT, PH_METADATA,
                    TRACE_SUFFIXES, UINT32_MAX, VIRTUAL_TID_BASE, WAIT_SUFFIX, TraceFileName, is_trace_file,
                    normalize_phase, parse_trace_filename)

# The reader and the rules load on first use, so that the recorder, which writes the
# names above, imports only them.
_LAZY = {
    **dict.fromkeys(("DECODED_PIECE", "DecodedTrace", "LINE_PIECE_BYTES", "LinePiece", "MAX_DEPTH",
                     "MAX_LINE_BYTES", "MemberReader", "TraceLine", "iter_decoded_chunks", "iter_line_pieces",
                     "iter_trace_lines", "member_decoder", "parse_line", "read_trace_bytes"), ".reading"),
    **dict.fromkeys(("MAX_ID", "MAX_TIME_US", "MAX_VIOLATIONS", "TornTail", "Violation", "event_problems",
                     "validate_file"), ".rules"),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AI_CATEGORIES",
    "ARG_COUNT",
    "ARG_EPOCH",
    "ARG_HOSTNAME_HASH",
    "ARG_INCOMPLETE",
    "ARG_LEVEL",
    "ARG_PARENT",
    "ARG_STEP",
    "BLOCK_SUFFIX",
    "CAT_CHECKPOINT",
    "CAT_COMM",
    "CAT_COMPUTE",
    "CAT_DATA",
    "CAT_DATALOADER",
    "CAT_DEVICE",
    "CAT_DFTRACER",
    "CAT_PIPELINE",
    "CAT_TRACER",
    "DFTRACER_PHASES",
    "DONE_SUFFIX",
    "END_SUFFIX",
    "DecodedTrace",
    "EPOCH_NAMES",
    "EVALUATION_NAMES",
    "ITER_SUFFIX",
    "LOOP_BODY_SUFFIXES",
    "LinePiece",
    "MAX_DEPTH",
    "MAX_ID",
    "MAX_TIME_US",
    "META_CLOCK_ANCHOR",
    "META_CUSTOM",
    "META_DROPPED",
    "META_HOSTNAME_HASH",
    "META_PROCESS_END",
    "META_PROCESS_INFO",
    "META_PROCESS_NAME",
    "META_PROCESS_SORT_INDEX",
    "META_THREAD_NAME",
    "MemberReader",
    "PH_COMPLETE",
    "PH_METADATA",
    "TraceFileName",
    "TraceLine",
    "UINT32_MAX",
    "VIRTUAL_TID_BASE",
    "Violation",
    "WAIT_SUFFIX",
    "event_problems",
    "is_trace_file",
    "iter_decoded_chunks",
    "iter_line_pieces",
    "iter_trace_lines",
    "member_decoder",
    "normalize_phase",
    "parse_line",
    "parse_trace_filename",
    "read_trace_bytes",
    "validate_file",
]
