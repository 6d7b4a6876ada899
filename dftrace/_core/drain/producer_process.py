"""The producer process as the kernel tells it to the drainer: a pidfd held while it
lives, a line written to its standard error, and how it ended once it is gone."""

from __future__ import annotations

import os
import select
import stat
import struct
import time
from typing import Any

__all__ = ["how_ended", "pidfd_of", "tell"]


def tell(pid: int, pidfd: int | None, line: str) -> bool:
    """Write ``line`` to the standard error of process ``pid``, still running (this
    process has no stream of the job's: see registration). A pipe or a terminal is
    opened anew through /proc for this one line, without blocking (a full pipe loses
    the line, never the drainer's time); a file is written through the process's own
    descriptor (``pidfd_getfd``), at its offset, so that its next lines follow ours
    instead of overwriting them. False where it was not said."""
    if pidfd is None or select.select([pidfd], [], [], 0)[0]:
        return False  # it ended (or no pidfd: its pid may be another process's)
    stream = f"/proc/{pid}/fd/2"
    try:
        if stat.S_ISREG(os.stat(stream).st_mode):
            fd = _their_fd(pidfd, 2)
        else:
            fd = os.open(stream, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.write(fd, line.encode("utf-8", "replace")) > 0
    except OSError:
        return False
    finally:
        os.close(fd)


#: pidfd_getfd(2)'s number, the same on every architecture (Linux 5.6 and later).
_SYS_PIDFD_GETFD = 438


def _their_fd(pidfd: int, fd: int) -> int:
    """A descriptor of the open file that the process of ``pidfd`` has as ``fd``."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    got = libc.syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0)
    if got < 0:
        raise OSError(ctypes.get_errno(), "pidfd_getfd")
    return got


def pidfd_of(pid: int) -> int | None:
    """A pidfd of process ``pid`` (None where the kernel has none)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


#: ioctl(PIDFD_GET_INFO) with struct pidfd_info (64 bytes in its first version), and
#: the mask bit asking for the exit status (Linux 6.15 and later).
_PIDFD_GET_INFO = 0xC040FF0B
_PIDFD_INFO_EXIT = 0x8
_PIDFD_INFO_SIZE = 64
_PIDFD_EXIT_CODE_AT = 60


def _exit_status(pidfd: int | None) -> int | None:
    """The wait status of the process of ``pidfd`` once it has been reaped (None
    before, or where the kernel cannot tell it)."""
    if pidfd is None:
        return None
    import fcntl

    buf = bytearray(_PIDFD_INFO_SIZE)
    struct.pack_into("<Q", buf, 0, _PIDFD_INFO_EXIT)
    try:
        fcntl.ioctl(pidfd, _PIDFD_GET_INFO, buf, True)
    except (OSError, ValueError):
        return None
    if not struct.unpack_from("<Q", buf, 0)[0] & _PIDFD_INFO_EXIT:
        return None
    return struct.unpack_from("<i", buf, _PIDFD_EXIT_CODE_AT)[0]


def _zombie_status(pid: int) -> int | None:
    """The wait status of process ``pid`` while it is a zombie its parent has not
    reaped (None otherwise)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    if fields[:1] in ([b"Z"], [b"X"]) and len(fields) >= 50:
        return int(fields[49])  # exit_code: a wait status
    return None


def _described(code: int) -> dict[str, Any]:
    """A wait status, as process_end's args say it."""
    if code & 0x7F:
        return {"how": f"killed by signal {code & 0x7F}", "signal": code & 0x7F}
    return {"how": f"exited with status {(code >> 8) & 0xFF} without finalize",
            "exit_status": (code >> 8) & 0xFF}


def how_ended(pid: int, pidfd: int | None = None, wait_s: float = 0.2) -> dict[str, Any]:
    """How process ``pid`` ended: from its zombie's /proc entry while its parent has
    not reaped it, from its pidfd (opened while it lived) once the parent has: the
    kernel keeps the exit status for a pidfd (Linux 6.15 on). Else, within
    ``wait_s``: it ended without finalize, cause unknown."""
    deadline = time.monotonic() + wait_s
    while True:
        code = _zombie_status(pid)
        if code is None:
            code = _exit_status(pidfd)
        if code is not None:
            return _described(code)
        if time.monotonic() >= deadline:
            return {"how": "ended without finalize"}
        time.sleep(0.005)
