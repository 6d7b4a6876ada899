"""A FUSE filesystem whose writes never return: ``python _hung_fs.py MOUNTPOINT``.

Files can be created and listed; a write() blocks until the daemon is killed
(storage that stopped answering: a hard NFS/Lustre mount, a hung FUSE daemon).
"""

from __future__ import annotations

import errno
import stat
import sys
import threading

from fuse import FUSE, FuseOSError, Operations


class HungFS(Operations):
    def __init__(self) -> None:
        self.files: set[str] = set()

    def getattr(self, path: str, fh: int | None = None) -> dict:
        if path == "/":
            return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2}
        if path in self.files:
            return {"st_mode": stat.S_IFREG | 0o644, "st_nlink": 1, "st_size": 0}
        raise FuseOSError(errno.ENOENT)

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *(p[1:] for p in self.files)]

    def create(self, path: str, mode: int, fi: object = None) -> int:
        self.files.add(path)
        return 0

    def open(self, path: str, flags: int) -> int:
        return 0

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        threading.Event().wait()  # never answers
        return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        return 0


if __name__ == "__main__":
    FUSE(HungFS(), sys.argv[1], foreground=True)
