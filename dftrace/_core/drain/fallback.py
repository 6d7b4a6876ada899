"""When the drainer is gone (it died, was killed, or answered what it should not):
this process writes its ring itself from then on, with the writer thread's
:class:`~.._core.writer.Writer`, from the drainer's last commit, into a file of the
next free name, the drainer's file cut back to that commit (a frame written after
it is written again here, so nothing is in two files)."""

from __future__ import annotations

import mmap
import os
import stat
from typing import Any

from .. import state as _state
from ..state import STATE

__all__ = ["take_over"]


def take_over(session: Any, ring: mmap.mmap) -> Any:
    """The Writer that writes ``ring`` for ``session`` from the drainer's last commit
    on (the session's sink is replaced by the Writer's)."""
    from ..sink import FileSink
    from ..writer import Writer

    try:
        reader = _state.native.ShmReader(ring, True)
    except Exception as exc:  # its header was written over
        reader = None
        STATE.warn_once("ring-unreadable", f"the trace ring is unreadable ({exc}); its records are lost")
    committed = reader.committed if reader is not None else None
    # The file the drainer was writing, cut back to its last commit.
    dead_file = session.sink.name_of(committed[0], committed[1]) if committed else ""
    first = [True]

    def source(enc: Any, max_records: int) -> tuple[bytes, int]:
        if reader is None:
            return b"", 0
        if first[0]:  # on the writer's thread: storage never holds the program
            first[0] = False
            if committed is not None:
                _cut_back(dead_file, committed[2])
        try:
            data, n = reader.drain(max_records, enc.pid_piece, enc.hh_piece,
                                   enc.offset_ns, enc.min_id, True)
        except _state.native.RingError as exc:  # written over meanwhile
            STATE.warn_once("ring-unreadable", f"the trace ring is unreadable ({exc}); its records are lost")
            return b"", 0
        reader.commit(0, 0, -1)  # no successor after this one: free at once
        return data, n

    c = session.config
    sink = FileSink(session.base, c.compression, c.compression_level, c.max_file_size,
                    session.sink.header(), meta=session._meta)
    session.sink = sink
    # In-memory traces get their lines from the relay, which goes on feeding the ring.
    return Writer(session.encoder, sink, c.flush_interval, source, deliver=False)


def _cut_back(path: str, size: int) -> None:
    """Cut the file a dead drainer was writing back to ``size`` bytes, its last
    commit: a frame written after it (whole or in part) is written again by the
    successor, so nothing is in two files. Only a regular file of this user's."""
    flags = os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | os.O_NONBLOCK
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_size > size:
            os.ftruncate(fd, size)
    except OSError:
        pass
    finally:
        os.close(fd)
