"""How the analysis commands use this process's C heap (glibc's; nothing elsewhere).

A command's process (``command_heap``) keeps the heap in one arena, and kept for the
pieces of the files it reads: each piece's blocks reused rather than mapped and
unmapped each time. While the summary's answers are built (``heap_for_answers``),
what the reading left free is handed back and glibc's own sizes are set: the
answers' large arrays are then mapped on their own and given back as soon as they
are freed, where the heap kept for pieces held the pages of each to the end (144 MB
resident, freed, at the end of a 10M-event summary). Files read afterwards (diff's
other side, the spans read again for GPU time) have the heap kept for pieces again.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ...format.reading import LINE_PIECE_BYTES

#: glibc's mallopt() parameters: the most arenas its heap may have; the size from
#: which a block is mapped on its own; the free space at the heap's top it keeps.
_M_ARENA_MAX, _M_MMAP_THRESHOLD, _M_TRIM_THRESHOLD = -8, -3, -1
#: glibc's own starting size for both thresholds.
_GLIBC_THRESHOLD = 128 << 10


def _glibc(name: str) -> Any:
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


_MALLOPT = _glibc("mallopt")
_MALLOC_TRIM = _glibc("malloc_trim")
#: Whether this process is a command's (``command_heap``): its heap is then set for
#: what it does, reading or answering.
_command = False


def command_heap() -> None:
    """Keep this process's C heap in one arena, and for pieces (``_thresholds``).
    A file's next piece is decoded on a thread of its own and freed by the thread
    that reduced it; with glibc's arena per thread, each arena kept the high-water
    mark of the pieces it held (about 60 MB more for a 4M-event summary). Set before
    the process starts a thread (glibc fixes its arena limit then).

    A piece of decoded text (``LINE_PIECE_BYTES``, 64 MiB; the summary's, 6 MiB,
    from chunks of up to 8 MiB) is above the size from which glibc maps a
    block on its own (raised to the largest block freed, 32 MiB at most), and glibc
    hands back the free top of its heap beyond twice that size: a piece was mapped
    on its own, or the heap's top returned, and every page of the next one faulted
    in anew (a quarter of the summary's page faults). From the heap, kept, each
    piece takes the place the one before it freed."""
    global _command
    if _MALLOPT is None:
        return
    _MALLOPT(_M_ARENA_MAX, 1)
    _command = True
    _thresholds(4 * LINE_PIECE_BYTES)


def _thresholds(size: int) -> None:
    if _command:
        _MALLOPT(_M_MMAP_THRESHOLD, size)
        _MALLOPT(_M_TRIM_THRESHOLD, size)


def hand_back() -> None:
    """Hand the pages the C heap holds free back to the system: those of large tables
    made while files were read, and freed once the answers used them."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


@contextmanager
def heap_for_answers() -> Iterator[None]:
    """Around the building of the answers, once every file is read: the pages the C
    heap holds free are handed back to the system first. glibc keeps what was freed
    (a piece's bytes and columns, numpy's work arrays) for reuse, up to about a
    hundred megabytes while files are read. (Returned after each file, the next file
    took them back page by page: a tenth of the summary's CPU in page faults, for no
    lower peak.) In a command's process, glibc's own sizes hold meanwhile, so the
    answers' large arrays come and go once each; the heap is kept for pieces again
    after."""
    hand_back()
    _thresholds(_GLIBC_THRESHOLD)
    try:
        yield
    finally:
        _thresholds(4 * LINE_PIECE_BYTES)
