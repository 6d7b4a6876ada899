"""What a hostile process holding a shared-memory ring writes into it (the layout of
shm_hdr_t, shm_slot_t and rec_t in dftrace/_core/engine_c/common.h)."""

from __future__ import annotations

import struct

#: Offsets of the ring header's fields.
HDR = {"nslots": 12, "slot_size": 16, "slots_off": 24, "kinds_off": 32, "kinds_cap": 40,
       "next_seq": 72, "open_off": 168, "open_cap": 176}
#: Offsets in a slot: its record count; the first record's args offset and length.
SLOT_N, REC0_AOFF, REC0_ALEN = 4, 64 + 56, 64 + 60
#: The first record of a slot: its offset, its fields' layout (t0, t1, id, parent,
#: kind, level_flags, tid, count, aoff, alen), and the flag of a file-I/O call.
REC0, REC_LAYOUT, F_IO = 64, "<qqQQIIQqII", 8


def rewrite_header(mm) -> None:
    """Point the header's layout far outside the region."""
    struct.pack_into("<I", mm, HDR["nslots"], 0xFFFFFFFF)
    for field, value in (("slot_size", 8), ("slots_off", 1 << 44), ("kinds_off", 1 << 40),
                         ("kinds_cap", 1 << 40), ("next_seq", 12345)):
        struct.pack_into("<Q", mm, HDR[field], value)


def corrupt_first_slot(mm, slots_off: int) -> None:
    """The first slot claims 2**32-1 records; its first record's args lie far outside."""
    struct.pack_into("<I", mm, slots_off + SLOT_N, 0xFFFFFFFF)
    struct.pack_into("<II", mm, slots_off + REC0_AOFF, 0xFFFFFF00, 0xFFFFFF00)
