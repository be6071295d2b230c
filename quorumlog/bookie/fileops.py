"""The system calls ledger storage makes on its entry logs, in one replaceable object.

:class:`FileOps` does the real ones. A simulated disk (unsynced writes lost at a
power loss, a sync that fails once, a full disk) or a test passes another object
with the same methods to :class:`~quorumlog.bookie.storage.LedgerStorage`.
"""

from __future__ import annotations

import os
from pathlib import Path


class FileOps:
    """Real files. Each method calls ``os`` at call time, so tests may patch it."""

    def create(self, path: Path) -> int:
        """A new file open for reading and writing; it must not exist."""
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)

    def open_read(self, path: Path) -> int:
        return os.open(path, os.O_RDONLY)

    def pwrite(self, fd: int, data: memoryview, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def fsync_directory(self, directory: Path) -> None:
        """Make the directory's entries (a file just created or removed) durable."""
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def unlink(self, path: Path) -> None:
        os.unlink(path)

    def close(self, fd: int) -> None:
        os.close(fd)


REAL_FILES = FileOps()
