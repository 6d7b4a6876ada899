"""A FUSE filesystem that fails only when a file is finished, as NFS write-back does:
``python _writeback_fs.py MOUNTPOINT ERRNO_NAME`` (``EIO``, ``EDQUOT``).

Every write() is accepted and nothing is kept (the server refused the pages the
client had cached); flush (each close()), fsync/fdatasync and release answer the
error. Files can be created, listed and truncated; each stays 0 bytes long.
"""

from __future__ import annotations

import errno
import stat
import sys

from fuse import FUSE, FuseOSError, Operations


class WriteBackFS(Operations):
    def __init__(self, error: int) -> None:
        self.files: set[str] = set()
        self.dirs: set[str] = {"/"}
        self.error = error

    def getattr(self, path: str, fh: int | None = None) -> dict:
        if path in self.dirs:
            return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2}
        if path in self.files:
            return {"st_mode": stat.S_IFREG | 0o644, "st_nlink": 1, "st_size": 0}
        raise FuseOSError(errno.ENOENT)

    def access(self, path: str, amode: int) -> int:
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        self.dirs.add(path)
        return 0

    def readdir(self, path: str, fh: int) -> list[str]:
        prefix = path.rstrip("/") + "/"
        return [".", "..", *(p[len(prefix):] for p in self.files | self.dirs
                             if p.startswith(prefix) and "/" not in p[len(prefix):] and p != "/")]

    def create(self, path: str, mode: int, fi: object = None) -> int:
        self.files.add(path)
        return 0

    def open(self, path: str, flags: int) -> int:
        return 0

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        return 0

    def unlink(self, path: str) -> int:
        self.files.discard(path)
        return 0

    def statfs(self, path: str) -> dict:
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 1 << 20, "f_bfree": 1 << 20,
                "f_bavail": 1 << 20, "f_files": 1 << 20, "f_ffree": 1 << 20, "f_namemax": 255}

    def flush(self, path: str, fh: int) -> int:
        raise FuseOSError(self.error)

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        raise FuseOSError(self.error)

    def release(self, path: str, fh: int) -> int:
        raise FuseOSError(self.error)


if __name__ == "__main__":
    FUSE(WriteBackFS(getattr(errno, sys.argv[2])), sys.argv[1], foreground=True)
