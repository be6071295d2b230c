"""A simulated disk for the real bookie: what survives a crash, and the faults a disk has.

:class:`SimDisk` is one machine's disk; it outlives the bookie processes that use
it. Each process gets its own :class:`SimFiles` (``disk.files()``), the
:class:`~quorumlog.bookie.fileops.FileOps` the bookie makes its system calls
through, with its own descriptors. When the process dies the handle dies with it:
every later call through it raises :class:`PowerLoss`, so code of a dead process
that is still on the stack can never touch the disk of the next one.

What survives, as POSIX promises and no more:

- file contents: a write lands in the page cache (what reads see); a page reaches
  the platter at a successful ``fdatasync``/``fsync`` of its file. At a power loss
  every page written since is kept or lost independently (pages reach the disk in
  any order, so a write can be torn), and the file's size is the synced one or the
  newest one;
- directory entries: a file created or unlinked since its directory was last
  fsynced may come back as it was before at a power loss;
- a failed sync is reported once (EIO) and its pages are marked clean without
  reaching the disk, as Linux does: they stay readable until the power goes, a
  later sync succeeds without them, and a power loss loses them;
- the index (:class:`MemoryIndex`, LMDB's stand-in): a committed transaction
  survives, nothing else does.

Faults are set on :attr:`SimDisk.faults` by the simulation: a power loss in the
middle of the n-th write or sync from now, the next sync failing, a full disk
(ENOSPC), and :meth:`SimDisk.flip_bit` in a stored file.
"""

from __future__ import annotations

import errno
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from quorumlog.bookie.disk_checker import DiskUsage
from quorumlog.bookie.fileops import FileOps
from quorumlog.bookie.index import IndexReader, IndexUpdate, LedgerIndex
from quorumlog.bookie.ledger_state import LedgerState, Location

__all__ = ["DiskFaults", "MemoryIndex", "PowerLoss", "SimDisk", "SimFiles"]

PAGE_SIZE = 4096


class PowerLoss(BaseException):
    """The simulated machine lost power (or the process died) during this call.

    A BaseException, so that the bookie's own ``except Exception`` handlers, which
    answer errors and carry on, do not take it for a failure to answer: the process
    that made the call no longer exists.
    """


@dataclass
class DiskFaults:
    """Faults the next calls meet; the simulation sets them from its seed."""

    # Lose power in the middle of the n-th mutating call from now (1 = the next one).
    power_loss_in: int | None = None
    # The next n syncs of a file fail with EIO (their pages are then lost).
    failing_syncs: int = 0
    # Writes and file creations fail with ENOSPC; the usage the disk reports is full.
    full: bool = False
    # Chance that a page written but not synced reaches the disk anyway at a power loss.
    page_survives: float = 0.5


class _Inode:
    __slots__ = (
        "allocated",
        "data",
        "dirty",
        "durable",
        "durable_allocated",
        "lost_pages",
        "size_dirty",
    )

    def __init__(self) -> None:
        self.data = bytearray()  # what reads see (the page cache)
        self.durable = bytearray()  # what is on the platter
        self.dirty: set[int] = set()  # pages written since their last sync
        self.size_dirty = False
        self.lost_pages = 0  # pages whose sync failed (for the trace)
        # Bytes of blocks given to the file (fallocate) beyond its data: counted as used,
        # never stored; kept at a power loss once synced.
        self.allocated = 0
        self.durable_allocated = 0

    @property
    def used_bytes(self) -> int:
        return max(len(self.data), self.allocated)

    def write(self, offset: int, data: bytes | memoryview) -> None:
        end = offset + len(data)
        if end > len(self.data):
            self.data.extend(bytes(end - len(self.data)))
            self.size_dirty = True
        self.data[offset:end] = data
        if end > offset:
            self.dirty.update(range(offset // PAGE_SIZE, (end - 1) // PAGE_SIZE + 1))

    def sync(self) -> None:
        self.durable_allocated = self.allocated
        for page in self.dirty:
            self._copy_page(page)
        if self.size_dirty or len(self.durable) != len(self.data):
            self._resize_durable(len(self.data))
        self.dirty.clear()
        self.size_dirty = False

    def _copy_page(self, page: int) -> None:
        start = page * PAGE_SIZE
        end = min(start + PAGE_SIZE, len(self.data))
        if start >= end:
            return
        if end > len(self.durable):
            self.durable.extend(bytes(end - len(self.durable)))
        self.durable[start:end] = self.data[start:end]

    def _resize_durable(self, size: int) -> None:
        if size < len(self.durable):
            del self.durable[size:]
        else:
            self.durable.extend(bytes(size - len(self.durable)))

    def lose_sync(self) -> None:
        """A failed sync: the pages are marked clean without reaching the disk."""
        self.lost_pages += len(self.dirty)
        self.dirty.clear()
        self.size_dirty = False

    def power_loss(self, rng: random.Random, page_survives: float) -> None:
        self.allocated = self.durable_allocated
        if self.dirty or self.size_dirty:
            # Pages reach the disk on their own, in any order, before the power goes.
            for page in sorted(self.dirty):
                if rng.random() < page_survives:
                    self._copy_page(page)
            if self.size_dirty and rng.random() < 0.5:
                self._resize_durable(len(self.data))
        self.data = bytearray(self.durable)
        self.dirty.clear()
        self.size_dirty = False


@dataclass
class _Dir:
    entries: dict[str, _Inode] = field(default_factory=dict)
    durable: dict[str, _Inode] = field(default_factory=dict)

    def power_loss(self, rng: random.Random) -> None:
        """Each change since the last fsync of the directory survives or not."""
        names = set(self.entries) | set(self.durable)
        result: dict[str, _Inode] = {}
        for name in sorted(names):
            now, before = self.entries.get(name), self.durable.get(name)
            chosen = now if now is before or rng.random() < 0.5 else before
            if chosen is not None:
                result[name] = chosen
        self.entries = dict(result)
        self.durable = result


@dataclass
class _IndexData:
    """What a committed index holds (the durable part of :class:`MemoryIndex`)."""

    entries: dict[tuple[int, int], Location] = field(default_factory=dict)
    states: dict[int, bytes] = field(default_factory=dict)
    logs: dict[int, list[int]] = field(default_factory=dict)
    usage: dict[int, dict[int, int]] = field(default_factory=dict)
    mark: tuple[int, int] | None = None
    log_end: tuple[int, int] | None = None


class SimDisk:
    """One simulated machine's disk: files, directories and index data."""

    def __init__(self, rng: random.Random, name: str = "disk") -> None:
        self.rng = rng
        self.name = name
        self.faults = DiskFaults()
        self.capacity_bytes = 1 << 30
        self._dirs: dict[str, _Dir] = {"/": _Dir()}
        self._indexes: dict[str, _IndexData] = {}
        self._handle: SimFiles | None = None
        # Told (on the simulation's side) when a fault cuts the power mid-call.
        self.on_power_loss: Callable[[], None] | None = None
        self.power_losses = 0
        self.syncs_failed = 0
        self.bits_flipped = 0

    # ------------------------------------------------------------ processes

    def files(self) -> SimFiles:
        """The FileOps of a new process on this machine (the previous one must be dead)."""
        if self._handle is not None:
            self._handle.alive = False
        self._handle = SimFiles(self)
        return self._handle

    def crash(self) -> None:
        """The process dies (kill -9): its descriptors go, the page cache stays."""
        if self._handle is not None:
            self._handle.alive = False
            self._handle = None

    def power_loss(self) -> None:
        """The machine loses power: the process dies and what was not synced may go."""
        self.crash()
        self.power_losses += 1
        page_survives = self.faults.page_survives
        seen: set[int] = set()
        for directory in self._dirs.values():
            directory.power_loss(self.rng)
            for inode in directory.entries.values():
                if id(inode) not in seen:
                    seen.add(id(inode))
                    inode.power_loss(self.rng, page_survives)
        self.faults.power_loss_in = None

    # ------------------------------------------------------------ faults

    def _mutating(self) -> None:
        """Count one mutating call; the power goes in the middle of the armed one."""
        left = self.faults.power_loss_in
        if left is None:
            return
        if left > 1:
            self.faults.power_loss_in = left - 1
            return
        self._cut_power()

    def _cut_power(self) -> None:
        self.power_loss()
        if self.on_power_loss is not None:
            self.on_power_loss()
        raise PowerLoss(f"{self.name}: power lost")

    def stored_files(self) -> list[tuple[str, int]]:
        """(path, durable size) of every file with bytes on the platter."""
        out = []
        for dir_path, directory in sorted(self._dirs.items()):
            for name, inode in sorted(directory.durable.items()):
                if inode.durable:
                    out.append((f"{dir_path.rstrip('/')}/{name}", len(inode.durable)))
        return out

    def flip_bit(self, path: str, offset: int, bit: int) -> bool:
        """Flip one stored bit (a bad sector that still reads): on the platter and in
        the page cache. False if the file is not there or shorter."""
        dir_path, name = path.rsplit("/", 1)
        inode = self._dirs.get(dir_path or "/", _Dir()).entries.get(name)
        if inode is None or offset >= len(inode.durable):
            return False
        inode.durable[offset] ^= 1 << bit
        if offset < len(inode.data):
            inode.data[offset] ^= 1 << bit
        self.bits_flipped += 1
        return True

    def used_bytes(self) -> int:
        seen: dict[int, int] = {}
        for directory in self._dirs.values():
            for inode in directory.entries.values():
                seen[id(inode)] = inode.used_bytes
        return sum(seen.values())

    # ------------------------------------------------------------ lookups

    def _dir(self, path: Path | str) -> _Dir:
        found = self._dirs.get(str(path))
        if found is None:
            raise FileNotFoundError(errno.ENOENT, "No such directory (simulated)", str(path))
        return found

    def _split(self, path: Path) -> tuple[_Dir, str]:
        return self._dir(path.parent), path.name


# Direct writes must start and end on multiples of this (as on a real device).
_DIRECT_BLOCK = 512


class SimFiles(FileOps):
    """One process's system calls on a :class:`SimDisk` (the bookie's FileOps)."""

    def __init__(self, disk: SimDisk) -> None:
        self.disk = disk
        self.alive = True
        self._fds: dict[int, _Inode] = {}
        self._next_fd = 3
        self._direct: set[int] = set()  # descriptors opened for direct writes
        self._directories: dict[int, Path] = {}  # descriptors of directories

    def _live(self) -> SimDisk:
        if not self.alive:
            raise PowerLoss(f"{self.disk.name}: the process that made this call is gone")
        return self.disk

    def _inode(self, fd: int) -> _Inode:
        self._live()
        inode = self._fds.get(fd)
        if inode is None:
            raise OSError(errno.EBADF, "Bad file descriptor (simulated)")
        return inode

    def _open(self, inode: _Inode) -> int:
        fd = self._next_fd
        self._next_fd += 1
        self._fds[fd] = inode
        return fd

    def _check_space(self, size: int) -> None:
        disk = self.disk
        if disk.faults.full or disk.used_bytes() + size > disk.capacity_bytes:
            raise OSError(errno.ENOSPC, "No space left on device (simulated)")

    # ------------------------------------------------------------ files

    def create(self, path: Path) -> int:
        disk = self._live()
        directory, name = disk._split(path)
        if name in directory.entries:
            raise FileExistsError(errno.EEXIST, "File exists (simulated)", str(path))
        self._check_space(0)
        disk._mutating()
        inode = _Inode()
        directory.entries[name] = inode
        return self._open(inode)

    def create_append(self, path: Path) -> int:
        return self.create(path)

    def open_read(self, path: Path) -> int:
        disk = self._live()
        directory, name = disk._split(path)
        inode = directory.entries.get(name)
        if inode is None:
            raise FileNotFoundError(errno.ENOENT, "No such file (simulated)", str(path))
        return self._open(inode)

    def open_direct_write(self, path: Path) -> int:
        """As a real O_DIRECT descriptor: writes not on block boundaries fail (EINVAL)."""
        fd = self.open_read(path)
        self._direct.add(fd)
        return fd

    def pwrite(self, fd: int, data: memoryview, offset: int) -> int:
        inode = self._inode(fd)
        if fd in self._direct and (offset % _DIRECT_BLOCK or len(data) % _DIRECT_BLOCK):
            raise OSError(errno.EINVAL, "Invalid argument (unaligned direct write, simulated)")
        self._check_space(len(data))
        disk = self.disk
        left = disk.faults.power_loss_in
        if left == 1:
            # The power goes while the bytes are on their way: a prefix got there.
            inode.write(offset, bytes(data[: disk.rng.randrange(len(data) + 1)]))
        disk._mutating()
        inode.write(offset, data)
        return len(data)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        inode = self._inode(fd)
        return self.pwrite(fd, memoryview(data), len(inode.data))

    def write_parts(self, fd: int, parts: list[bytes]) -> int:
        return self.write(fd, b"".join(parts))

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        inode = self._inode(fd)
        return bytes(inode.data[offset : offset + size])

    def fdatasync(self, fd: int) -> None:
        inode = self._inode(fd)
        disk = self.disk
        disk._mutating()
        if disk.faults.failing_syncs and (inode.dirty or inode.size_dirty):
            disk.faults.failing_syncs -= 1
            disk.syncs_failed += 1
            inode.lose_sync()
            raise OSError(errno.EIO, "Input/output error (simulated writeback error)")
        inode.sync()

    def drop_cached(self, fd: int, offset: int, length: int) -> None:
        self._inode(fd)  # the simulated disk has no page cache to drop

    def fsync(self, fd: int) -> None:
        directory = self._directories.get(fd)
        if directory is not None:
            self._live()
            self.fsync_directory(directory)
            return
        self.fdatasync(fd)

    def open_directory(self, directory: Path) -> int:
        self._live()._dir(directory)  # it exists
        fd = self._next_fd
        self._next_fd += 1
        self._directories[fd] = directory
        return fd

    def fsync_directory(self, directory: Path) -> None:
        disk = self._live()
        found = disk._dir(directory)
        disk._mutating()
        found.durable = dict(found.entries)

    def unlink(self, path: Path) -> None:
        disk = self._live()
        directory, name = disk._split(path)
        if name not in directory.entries:
            raise FileNotFoundError(errno.ENOENT, "No such file (simulated)", str(path))
        disk._mutating()
        del directory.entries[name]

    def close(self, fd: int) -> None:
        self._live()
        if self._directories.pop(fd, None) is not None:
            return
        if self._fds.pop(fd, None) is None:
            raise OSError(errno.EBADF, "Bad file descriptor (simulated)")
        self._direct.discard(fd)

    def truncate(self, path: Path, size: int) -> None:
        disk = self._live()
        directory, name = disk._split(path)
        inode = directory.entries.get(name)
        if inode is None:
            raise FileNotFoundError(errno.ENOENT, "No such file (simulated)", str(path))
        disk._mutating()
        if size < len(inode.data):
            del inode.data[size:]
        else:
            inode.data.extend(bytes(size - len(inode.data)))
        inode.size_dirty = True

    def allocate(self, fd: int, size: int) -> None:
        inode = self._inode(fd)
        self._check_space(max(0, size - inode.used_bytes))
        self.disk._mutating()
        inode.allocated = max(inode.allocated, size)

    def read_file(self, path: Path) -> bytes:
        disk = self._live()
        directory, name = disk._split(path)
        inode = directory.entries.get(name)
        if inode is None:
            raise FileNotFoundError(errno.ENOENT, "No such file (simulated)", str(path))
        return bytes(inode.data)

    def size(self, path: Path) -> int:
        disk = self._live()
        directory, name = disk._split(path)
        inode = directory.entries.get(name)
        if inode is None:
            raise FileNotFoundError(errno.ENOENT, "No such file (simulated)", str(path))
        return max(len(inode.data), inode.allocated)

    # ------------------------------------------------------------ directories

    def listdir(self, directory: Path) -> list[str]:
        return sorted(self._live()._dir(directory).entries)

    def mkdir(self, directory: Path) -> None:
        # Directories are created durable: the bookie's directories exist before it
        # runs, and their own loss is not what the simulation looks for.
        disk = self._live()
        path = Path(directory)
        for part in (*reversed(path.parents), path):
            disk._dirs.setdefault(str(part), _Dir())

    def lock(self, path: Path) -> int:
        self._live()
        return self._open(_Inode())

    # ------------------------------------------------------------ space, index

    def disk_usage(self, path: Path) -> DiskUsage:
        disk = self._live()
        total = disk.capacity_bytes
        used = total if disk.faults.full else min(disk.used_bytes(), total)
        return DiskUsage(Path(path), used / total, total - used, total)

    def device(self, path: Path) -> int:
        return 1

    def open_index(self, directory: Path, map_size_bytes: int) -> MemoryIndex:
        disk = self._live()
        data = disk._indexes.setdefault(str(directory), _IndexData())
        return MemoryIndex(self, Path(directory), data)


_LOG_KEY = struct.Struct(">Q")


class MemoryIndex(LedgerIndex):
    """The bookie's index (:class:`~quorumlog.bookie.index.LedgerIndex`) with LMDB's
    guarantees and nothing more: :meth:`apply` is one transaction, durable when it
    returns; readers see committed transactions only. Every method is its own (none
    reaches LMDB, so LedgerIndex's __init__ is not called)."""

    def __init__(self, files: SimFiles, directory: Path, data: _IndexData) -> None:
        self._files = files
        self.directory = directory
        self._data = data

    def load_states(self) -> dict[int, LedgerState]:
        self._files._live()
        return {lid: LedgerState.from_bytes(lid, raw) for lid, raw in self._data.states.items()}

    def load_logs(self) -> dict[int, set[int]]:
        self._files._live()
        return {log_id: set(ledgers) for log_id, ledgers in self._data.logs.items()}

    def load_mark(self) -> tuple[int, int] | None:
        self._files._live()
        return self._data.mark

    def load_usage(self) -> dict[int, dict[int, int]] | None:
        self._files._live()
        if not self._data.usage and self._data.entries:
            return None
        return {log_id: dict(per) for log_id, per in self._data.usage.items()}

    def load_log_end(self) -> tuple[int, int] | None:
        self._files._live()
        return self._data.log_end

    def scan_logs(self) -> tuple[dict[int, set[int]], dict[int, dict[int, int]]]:
        logs: dict[int, set[int]] = {}
        usage: dict[int, dict[int, int]] = {}
        for (ledger_id, _), (log_id, _, size) in self._data.entries.items():
            logs.setdefault(log_id, set()).add(ledger_id)
            per = usage.setdefault(log_id, {})
            per[ledger_id] = per.get(ledger_id, 0) + size + 8
        return logs, usage

    def scan_usage(self) -> dict[int, dict[int, int]]:
        return self.scan_logs()[1]

    def prove_complete(self, ledger_id: int) -> None:
        self._files._live()  # its records are never damaged: nothing can be missing

    def entries_in_log(
        self, ledger_id: int, log_id: int, after: int, limit: int
    ) -> tuple[list[int], int | None]:
        self._files._live()
        ids = sorted(e for lid, e in self._data.entries if lid == ledger_id and e > after)
        found = [e for e in ids[:limit] if self._data.entries[(ledger_id, e)][0] == log_id]
        return found, (ids[limit - 1] if len(ids) > limit else None)

    def get(self, ledger_id: int, entry_id: int) -> Location | None:
        self._files._live()
        return self._data.entries.get((ledger_id, entry_id))

    def reader(self) -> IndexReader:
        return _MemoryReader(self)

    def count_entries(self, ledger_id: int) -> int:
        return sum(1 for lid, _ in self._data.entries if lid == ledger_id)

    def apply(self, update: IndexUpdate) -> None:
        files = self._files
        disk = files._live()
        if disk.faults.power_loss_in == 1 and disk.rng.random() < 0.5:
            # The commit reached the disk just before the power went.
            self._apply(update)
        disk._mutating()
        if disk.faults.full:
            raise OSError(errno.ENOSPC, "No space left on device (simulated, index)")
        self._apply(update)

    def _apply(self, update: IndexUpdate) -> None:
        data = self._data
        for ledger_id in update.purge_ledgers:
            for key in [k for k in data.entries if k[0] == ledger_id]:
                del data.entries[key]
        for ledger_id, locations in update.entries:
            for entry_id, loc in locations.items():
                data.entries[(ledger_id, entry_id)] = loc
        for ledger_id in update.dropped_states:
            data.states.pop(ledger_id, None)
        for ledger_id, state_bytes in update.states:
            data.states[ledger_id] = state_bytes
        if update.replace_log_tables:
            data.logs.clear()
            data.usage.clear()
        for log_id in update.dropped_logs:
            data.logs.pop(log_id, None)
            data.usage.pop(log_id, None)
        for log_id, ledger_ids in update.logs:
            data.logs[log_id] = list(ledger_ids)
        for log_id, per_ledger in update.usage:
            data.usage[log_id] = dict(per_ledger)
        data.mark = update.mark
        if update.log_end is not None:
            data.log_end = update.log_end

    def close(self) -> None:
        pass


class _MemoryReader(IndexReader):
    """Lookups as of now (a committed index never changes under a reader here)."""

    def __init__(self, index: MemoryIndex) -> None:  # no LMDB transaction to open
        self._index = index

    def get(self, ledger_id: int, entry_id: int) -> Location | None:
        return self._index.get(ledger_id, entry_id)

    def run(self, ledger_id: int, first_entry_id: int, count: int) -> list[Location]:
        found: list[Location] = []
        for entry_id in range(first_entry_id, first_entry_id + count):
            loc = self._index.get(ledger_id, entry_id)
            if loc is None:
                return []
            found.append(loc)
        return found

    def close(self) -> None:
        pass
