"""The system calls a bookie makes on its files, in one replaceable object.

:class:`FileOps` does the real ones: journal, entry logs, index (LMDB), directory
locks and disk usage all go through it. A simulated disk (unsynced writes lost at
a power loss, a sync that fails once, a full disk) or a test passes another object
with the same methods to :class:`~quorumlog.bookie.bookie.Bookie` (or to
:class:`~quorumlog.bookie.storage.LedgerStorage`).
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from quorumlog.bookie.disk_checker import DiskUsage, disk_usage
from quorumlog.bookie.index import LedgerIndex


class FileOps:
    """Real files. Each method calls ``os`` at call time, so tests may patch it."""

    def create(self, path: Path) -> int:
        """A new file open for reading and writing; it must not exist."""
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)

    def open_read(self, path: Path) -> int:
        return os.open(path, os.O_RDONLY)

    def open_direct_write(self, path: Path) -> int:
        """A second descriptor of an existing file whose writes bypass the page cache
        (``O_DIRECT``): memory, offset and length of each write must be block-aligned.
        OSError where the platform or the filesystem has no direct I/O."""
        direct = getattr(os, "O_DIRECT", 0)
        if not direct:
            raise OSError(errno.EINVAL, "this platform has no O_DIRECT", str(path))
        return os.open(path, os.O_WRONLY | direct)

    def pwrite(self, fd: int, data: memoryview, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def drop_cached(self, fd: int, offset: int, length: int) -> None:
        """Ask the kernel to drop the file's cached pages in this range (synced, so
        clean: nothing is written or lost, a later read goes to the disk)."""
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)

    def fsync_directory(self, directory: Path) -> None:
        """Make the directory's entries (a file just created or removed) durable."""
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def open_directory(self, directory: Path) -> int:
        """A descriptor of ``directory`` whose :meth:`fsync` makes its entries durable
        (held by whoever must sync it with no descriptor to spare)."""
        return os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))

    def unlink(self, path: Path) -> None:
        os.unlink(path)

    def close(self, fd: int) -> None:
        os.close(fd)

    # The journal's files: appended to, read whole at replay, cut at a torn tail.

    def create_append(self, path: Path) -> int:
        """A new file open for appending; it must not exist."""
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        return os.write(fd, data)

    def write_parts(self, fd: int, parts: list[bytes]) -> int:
        """Write the parts one after the other with one system call (``writev``, at most
        ``os.sysconf("SC_IOV_MAX")`` parts); returns the bytes written, maybe fewer."""
        return os.writev(fd, parts)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def read_file(self, path: Path) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def truncate(self, path: Path, size: int) -> None:
        os.truncate(path, size)

    def allocate(self, fd: int, size: int) -> None:
        """Give the file ``size`` bytes of disk blocks now (``posix_fallocate``): ENOSPC
        if the filesystem has not that much free."""
        os.posix_fallocate(fd, 0, size)

    def size(self, path: Path) -> int:
        return os.stat(path).st_size

    # Directories, locks, space.

    def listdir(self, directory: Path) -> list[str]:
        return os.listdir(directory)

    def mkdir(self, directory: Path) -> None:
        """Create ``directory`` and its parents if missing."""
        Path(directory).mkdir(parents=True, exist_ok=True)

    def lock(self, path: Path) -> int:
        """An open descriptor of ``path`` (created if missing) holding an exclusive lock;
        BlockingIOError if another process holds it."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def disk_usage(self, path: Path) -> DiskUsage:
        return disk_usage(path)

    def device(self, path: Path) -> int:
        """The filesystem ``path`` is on (one usage check per filesystem)."""
        return os.stat(path).st_dev

    def open_index(self, directory: Path, map_size_bytes: int) -> LedgerIndex:
        """The durable index in ``directory`` (LMDB)."""
        return LedgerIndex(directory, map_size_bytes)


REAL_FILES = FileOps()
