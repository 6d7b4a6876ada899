"""A FUSE filesystem over a real directory whose writes are slow:
``python _slow_fs.py BACKING MOUNTPOINT DELAY_S``.

Every write() takes DELAY_S seconds, then lands in BACKING (slow storage that
still answers: a loaded parallel filesystem). The daemon prints ``write`` when a
write starts, so a test can act while one is under way. Requests are served one
at a time, in order (as a single server would).
"""

from __future__ import annotations

import os
import sys
import time

from fuse import FUSE, FuseOSError, Operations


class SlowFS(Operations):
    def __init__(self, root: str, delay: float) -> None:
        self.root = root
        self.delay = delay

    def _p(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def getattr(self, path: str, fh: int | None = None) -> dict:
        try:
            st = os.lstat(self._p(path))
        except OSError as exc:
            raise FuseOSError(exc.errno) from None
        return {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_size", "st_uid",
                                             "st_gid", "st_atime", "st_mtime", "st_ctime")}

    def access(self, path: str, amode: int) -> int:
        return 0

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._p(path))]

    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._p(path), mode)
        return 0

    def create(self, path: str, mode: int, fi: object = None) -> int:
        try:
            return os.open(self._p(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        except OSError as exc:
            raise FuseOSError(exc.errno) from None

    def open(self, path: str, flags: int) -> int:
        try:
            return os.open(self._p(path), flags & ~(os.O_APPEND | os.O_CREAT | os.O_EXCL))
        except OSError as exc:
            raise FuseOSError(exc.errno) from None

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        print("write", flush=True)
        time.sleep(self.delay)
        return os.pwrite(fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        os.truncate(self._p(path), length)
        return 0

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0

    def unlink(self, path: str) -> int:
        os.unlink(self._p(path))
        return 0


if __name__ == "__main__":
    FUSE(SlowFS(sys.argv[1], float(sys.argv[3])), sys.argv[2], foreground=True, nothreads=True,
         big_writes=True, attr_timeout=0, entry_timeout=0)
