"""A FUSE filesystem whose writes never return: ``python _hung_fs.py MOUNTPOINT [all]``.

Files can be created and listed; a write() blocks until the daemon is killed
(storage that stopped answering: a hard NFS/Lustre mount, a hung FUSE daemon).
With ``all``, every request about anything but the mount's root blocks too
(a lookup, a mkdir, an access check): a mount that stopped answering altogether.
"""

from __future__ import annotations

import errno
import stat
import sys
import threading

from fuse import FUSE, FuseOSError, Operations


def _hang() -> None:
    threading.Event().wait()  # never answers


class HungFS(Operations):
    def __init__(self, everything: bool) -> None:
        self.files: set[str] = set()
        self.everything = everything

    def getattr(self, path: str, fh: int | None = None) -> dict:
        if path == "/":
            return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2}
        if self.everything:
            _hang()
        if path in self.files:
            return {"st_mode": stat.S_IFREG | 0o644, "st_nlink": 1, "st_size": 0}
        raise FuseOSError(errno.ENOENT)

    def access(self, path: str, amode: int) -> int:
        if self.everything:
            _hang()
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        if self.everything:
            _hang()
        raise FuseOSError(errno.EROFS)

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *(p[1:] for p in self.files)]

    def create(self, path: str, mode: int, fi: object = None) -> int:
        if self.everything:
            _hang()
        self.files.add(path)
        return 0

    def open(self, path: str, flags: int) -> int:
        return 0

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        _hang()
        return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        return 0


if __name__ == "__main__":
    everything = sys.argv[2:] == ["all"]
    FUSE(HungFS(everything), sys.argv[1], foreground=True,
         **({"attr_timeout": 0, "entry_timeout": 0} if everything else {}))
