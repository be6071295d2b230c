"""Entry logs: append-only files holding the entries of many ledgers, interleaved.

File layout::

    header   8 bytes magic b"QLENTLG1", uint64 log id
    records  uint32 blob size, uint32 CRC32C of the blob, blob      (big-endian)

Each record carries its own checksum, so a flipped byte is found when that
entry is read (R9: the read answers an I/O error, never "no such entry"). The
index says where each entry is: (log id, record offset, blob size).

Writes go to an in-memory buffer that is written to the file (by the checkpoint
worker thread, off the event loop) when it grows past ``write_buffer_bytes`` and
at every checkpoint; entries not yet in the file are read from memory. Files
are fsynced only at checkpoints: until then the journal is what makes an entry
durable. A log is never appended to after a restart (the
bookie starts a new one), so a torn tail of an old log is never read.

With direct I/O (``direct_io``, BookKeeper's direct-I/O entry logger) the chunks are
written around the page cache (``O_DIRECT``): no copy into cached pages, no writeback
by the kernel later, so a large entry costs a fraction of the CPU. Such writes must
start and end on block boundaries, so a chunk that would end inside a block is first
filled up to the boundary with a padding record (an all-zero blob, at most
``DIRECT_IO_ALIGNMENT + RECORD_HEADER_SIZE`` bytes); chunks never share a block, so
they can still be written in any order. Reads go through the page cache as before.

A new log's directory entry is fsynced when it is created, before any index
entry can name it, and a new log's id is above every id in the directory and in
the index: an id is never given to two logs, so a location can never name a
record of another log.

Descriptors are bounded (issue B3), and running out of them stops nothing for good:
the directory is synced through a descriptor held from the start, so a checkpoint
never needs a new one, and it releases the writers of the logs it synced; a log
that cannot be created for want of descriptors (``EMFILE``) is not rotated to, the
current one goes on past ``max_bytes`` until a checkpoint has released some; a
reader that cannot open a log closes the least recently read ones first.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import functools
import logging
import mmap
import re
import struct
import threading
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate, repeat
from operator import add
from pathlib import Path
from typing import NamedTuple

from crc32c import crc32c

from quorumlog.bookie.fileops import REAL_FILES, FileOps
from quorumlog.errors import BookieIOError

log = logging.getLogger(__name__)

LOG_MAGIC = b"QLENTLG1"
_FILE_HEADER = struct.Struct(">8sQ")
LOG_HEADER_SIZE = _FILE_HEADER.size
# A failed open for want of descriptors: nothing was written or synced, try again later.
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)

RECORD_HEADER = struct.Struct(">II")  # blob size, CRC32C of the blob
RECORD_HEADER_SIZE = RECORD_HEADER.size
_NAME = re.compile(r"^([0-9a-f]{8})\.log$")


def log_file_name(log_id: int) -> str:
    return f"{log_id:08x}.log"


def list_log_ids(directory: Path, ops: FileOps = REAL_FILES) -> list[int]:
    ids = []
    for name in ops.listdir(directory):
        match = _NAME.match(name)
        if match:
            ids.append(int(match.group(1), 16))
    return sorted(ids)


def log_holds_records(path: Path, ops: FileOps = REAL_FILES) -> bool:
    """Whether the log file holds anything but its header and padding (direct writes pad
    even a log with no entry to a block). Reads up to the first record that is not
    padding; anything unreadable as padding counts as held."""
    size = ops.size(path)
    if size <= LOG_HEADER_SIZE:
        return False
    fd = ops.open_read(path)
    try:
        position = LOG_HEADER_SIZE
        while position < size:
            head = ops.pread(fd, RECORD_HEADER_SIZE, position)
            if len(head) < RECORD_HEADER_SIZE:
                return True
            (blob_size,) = struct.unpack_from(">I", head)
            if blob_size >= DIRECT_IO_ALIGNMENT:
                return True
            padding = _padding_record(blob_size + RECORD_HEADER_SIZE)
            blob = ops.pread(fd, blob_size, position + RECORD_HEADER_SIZE)
            if head + blob != padding:
                return True
            position += len(padding)
        return False
    finally:
        ops.close(fd)


class LogRecord(NamedTuple):
    """One record of an entry log as it lies there (:func:`log_records`): its offset and
    blob; ``padding`` for a record of zeros that fills a direct write to a block's end;
    ``damage`` (and no blob) for a record that is cut short or fails its checksum."""

    offset: int
    blob: bytes
    padding: bool = False
    damage: str = ""


def log_header(path: Path, ops: FileOps = REAL_FILES) -> tuple[int | None, str]:
    """The log id an entry log's header names, or None and why it is not whole."""
    fd = ops.open_read(path)
    try:
        head = ops.pread(fd, LOG_HEADER_SIZE, 0)
    finally:
        ops.close(fd)
    if len(head) < LOG_HEADER_SIZE:
        return None, f"shorter ({len(head)} bytes) than its header"
    magic, log_id = _FILE_HEADER.unpack(head)
    if magic != LOG_MAGIC:
        return None, f"bad magic {magic!r}"
    return int(log_id), ""


def log_records(
    path: Path, ops: FileOps = REAL_FILES, start: int = LOG_HEADER_SIZE
) -> Iterator[LogRecord]:
    """Every record of an entry log file from ``start`` (a record's offset), in order,
    padding included, each checked by its CRC32C, for tools that show a log; reads one
    record at a time and writes nothing. A damaged record ends it (an entry log has no
    marker to find the next record by): it is yielded with ``damage`` set."""
    size = ops.size(path)
    fd = ops.open_read(path)
    try:
        position = start
        while position < size:
            head = ops.pread(fd, RECORD_HEADER_SIZE, position)
            if len(head) < RECORD_HEADER_SIZE:
                yield LogRecord(position, b"", damage="a record header cut short")
                return
            blob_size, crc = RECORD_HEADER.unpack(head)
            blob = ops.pread(fd, blob_size, position + RECORD_HEADER_SIZE)
            if len(blob) < blob_size:
                yield LogRecord(position, b"", damage=f"a record of {blob_size} bytes cut short")
                return
            if crc32c(blob) != crc:
                yield LogRecord(position, b"", damage="checksum mismatch")
                return
            padding = blob_size < DIRECT_IO_ALIGNMENT and blob == bytes(blob_size)
            yield LogRecord(position, blob, padding)
            position += RECORD_HEADER_SIZE + blob_size
    finally:
        ops.close(fd)


def format_records(entries: list[bytes], sizes: list[int]) -> bytes:
    """The entry-log bytes of ``entries``: one record (size, CRC32C, blob) each.

    The same bytes go into the journal's add record, so they are built once.
    """
    heads = list(map(RECORD_HEADER.pack, sizes, map(crc32c, entries)))
    parts: list[bytes] = [b""] * (2 * len(entries))
    parts[::2] = heads
    parts[1::2] = entries
    return b"".join(parts)


def record_offsets(start: int, sizes: list[int]) -> list[int]:
    """Offsets of consecutive records whose blobs have ``sizes``, the first at ``start``."""
    offsets = list(accumulate(map(add, sizes, repeat(RECORD_HEADER_SIZE)), initial=start))
    offsets.pop()
    return offsets


def parse_records(data: bytes | memoryview, where: str) -> tuple[list[bytes], list[int]]:
    """Split formatted records back into blobs (journal replay); checks every CRC."""
    entries: list[bytes] = []
    sizes: list[int] = []
    view = memoryview(data)
    pos, end = 0, len(view)
    unpack = RECORD_HEADER.unpack_from
    while pos < end:
        if end - pos < RECORD_HEADER_SIZE:
            raise BookieIOError(f"{where}: truncated entry record at byte {pos}")
        size, crc = unpack(view, pos)
        start = pos + RECORD_HEADER_SIZE
        if start + size > end:
            raise BookieIOError(f"{where}: entry record at byte {pos} runs past its end")
        blob = bytes(view[start : start + size])
        if crc32c(blob) != crc:
            raise BookieIOError(f"{where}: entry record at byte {pos} fails its checksum")
        entries.append(blob)
        sizes.append(size)
        pos = start + size
    return entries, sizes


# Hands a chunk write (a function and its arguments) to a worker thread; the returned
# future completes on the loop.
ChunkWriter = Callable[..., "asyncio.Future[None]"]
_MAX_IN_FLIGHT_CHUNKS = 4
Chunk = tuple[int, int, memoryview]  # log id, file offset, bytes (a filled write buffer)
_SPARE_BUFFERS = 2  # written buffers kept for reuse
# Room past write_buffer_bytes in each buffer (a quarter of it), for the record that
# crosses it: a buffer is handed on after the record that fills it, as ever (the chunks
# written are the same).
_BUFFER_SLACK_DIVISOR = 4
# Pages behind the cached window are dropped in steps of this size, each range asked
# twice (its pages still being written back the first time are clean by the second).
_DROP_STEP_BYTES = 16 * 1024 * 1024
# Direct writes start and end on multiples of this (a page: a multiple of the logical
# block size of every common device), from page-aligned memory.
DIRECT_IO_ALIGNMENT = 4096


@functools.lru_cache(maxsize=64)  # a bookie pads with a few sizes over and over
def _padding_record(total_bytes: int) -> bytes:
    """A record of ``total_bytes`` in all whose blob is zeros (fills a chunk to a block
    boundary; nothing names it in the index, so no read returns it)."""
    blob = bytes(total_bytes - RECORD_HEADER_SIZE)
    return RECORD_HEADER.pack(len(blob), crc32c(blob)) + blob


class EntryLogger:
    """The entry logs of one data directory. Used on one thread (the event loop),
    except :meth:`sync` and :meth:`unlink`, which the checkpoint runs on its worker.

    With a ``writer`` (set once the bookie runs) full buffers are written by the
    checkpoint worker, so the loop never waits for the page cache; the worker runs
    jobs in order, so a checkpoint's fsync always follows the writes before it.
    Without one (journal replay at open) writes are synchronous.

    Failures (R14): a failed write is not lost data, the bytes are still in memory
    (and in the journal). The chunk stays readable from memory and the next
    checkpoint writes it again before it syncs; until then :attr:`write_error` says
    why, and ``on_write_error`` is told on the loop. A failed fdatasync (or fsync of
    the directory) is different: the kernel reports a writeback error once and may
    have dropped the pages, so syncing again would succeed over lost data. It is
    sticky (:attr:`sync_error`): every later :meth:`sync` fails, so no checkpoint
    passes it and the journal that holds the only durable copy is kept.
    """

    def __init__(
        self,
        directory: Path,
        max_bytes: int,
        write_buffer_bytes: int,
        *,
        known_ids: Iterable[int] = (),
        page_cache_max_bytes: int = 0,
        direct_io: bool = True,
        ops: FileOps = REAL_FILES,
        max_read_fds: int = 64,
    ) -> None:
        """``known_ids``: log ids the index names, which may be missing from the directory
        (a log whose directory entry was lost keeps its id: a reader finds it gone, never
        another log under its name). ``page_cache_max_bytes``: how much of the current
        log, back from its end, is left in the page cache; 0 leaves all of it to the
        kernel (and so does ``direct_io``, which leaves nothing written in it).
        ``direct_io``: write chunks around the page cache, where the filesystem allows
        (where it does not, a warning says so and writes go through the cache).
        ``max_read_fds``: descriptors kept open for reading older logs (the least
        recently read is closed first), so a long-lived bookie holds a bounded number
        whatever the count of its logs."""
        self.directory = directory
        self.max_bytes = max_bytes
        self.write_buffer_bytes = write_buffer_bytes
        # Written pages further back are dropped from the page cache (once written back;
        # reads of them go to the disk). Left to grow, the cache takes a fresh page for
        # every 4 KiB logged, which on a virtual machine whose host backs guest memory
        # only when touched costs ten times the reuse of a page the kernel just freed.
        self.page_cache_max_bytes = page_cache_max_bytes
        self._written_end: dict[int, int] = {}  # log id -> end of its last written chunk
        self._cache_dropped_to: dict[int, int] = {}  # log id -> pages before it dropped
        self.ops = ops
        ops.mkdir(directory)
        # Descriptors by log id: the logs still written or synced (the current one, and
        # a rotated one until its bytes are synced and no chunk of it is in flight) ...
        self._fds: dict[int, int] = {}
        # ... and older logs opened for reading, least recently read first.
        self._read_fds: collections.OrderedDict[int, int] = collections.OrderedDict()
        self.max_read_fds = max(1, max_read_fds)
        self.direct_io = direct_io
        self._direct_fds: dict[int, int] = {}  # log id -> descriptor for direct writes
        # Held for the logger's life: syncing the directory never needs a descriptor
        # more, so a process out of them still checkpoints (and so releases some).
        self._dir_fd = ops.open_directory(directory)
        # A new log could not be created for want of descriptors: the current one goes
        # on past max_bytes until the next checkpoint has released some.
        self._rotation_blocked = False
        self.current_id = max([0, *list_log_ids(directory, ops), *known_ids]) + 1
        # The write buffer is allocated at its full size and filled up to _fill: appends
        # copy into it once, where a growing bytearray was reallocated (and its new pages
        # faulted in) again and again on its way to write_buffer_bytes, each time a
        # buffer was handed on. Written buffers are reused (_spare) for the same reason.
        self._spare: list[bytearray | mmap.mmap] = []
        self._buffer_bytes = max(
            write_buffer_bytes + write_buffer_bytes // _BUFFER_SLACK_DIVISOR, LOG_HEADER_SIZE
        )
        self._buffer = self._new_buffer(0)
        self._fill = 0
        self._buffer_start = 0  # file offset of the buffer's first byte
        self._end = 0  # logical end of the current log, buffer included
        self._synced_end = 0
        self._unsynced: set[int] = set()  # rotated logs not yet fsynced
        # Chunks not known to be in their file, read from memory meanwhile: handed to
        # the writer, or whose write failed and waits for the next checkpoint.
        self._pending: list[Chunk] = []
        self._in_flight = 0  # chunks handed to the writer, outcome not known yet
        self.writer: ChunkWriter | None = None
        self.on_write_error: Callable[[OSError], None] | None = None
        # Called on the loop after each new log is created (the bookie checks its disks).
        self.on_rotate: Callable[[], None] | None = None
        # Shared by the loop and the worker: chunks to write again, and why.
        self._lock = threading.Lock()
        self._rewrite: list[tuple[Chunk, int]] = []  # (chunk, fd)
        self._rewritten: list[Chunk] = []  # written again; the loop forgets them
        self.write_error: OSError | None = None
        self.sync_error: OSError | None = None  # sticky
        try:
            self._create(self.current_id, strict=True)
        except BaseException:
            ops.close(self._dir_fd)
            raise

    # ------------------------------------------------------------ writing

    def _path(self, log_id: int) -> Path:
        return self.directory / log_file_name(log_id)

    def _create(self, log_id: int, strict: bool) -> None:
        """Create log ``log_id`` and make it the current one. Without ``strict``, a failed
        fsync of the directory is recorded (sticky) and reported instead of raised."""
        fd = self.ops.create(self._path(log_id))
        self._fds[log_id] = fd
        if self.direct_io:
            self._open_direct(log_id)
        self.current_id = log_id
        assert self._fill == 0, "a log is created after its predecessor's buffer is flushed"
        self._buffer[:LOG_HEADER_SIZE] = _FILE_HEADER.pack(LOG_MAGIC, log_id)
        self._fill = LOG_HEADER_SIZE
        self._buffer_start = 0
        self._end = LOG_HEADER_SIZE
        self._synced_end = 0
        # Once per log, not per entry: without it a power loss may forget the log
        # while a checkpoint has made the index point into it.
        try:
            self.ops.fsync(self._dir_fd)
        except OSError as exc:
            self._sync_failed(exc, f"fsync of the directory after creating log {log_id}")
            if strict:
                del self._fds[log_id]
                self.ops.close(fd)
                raise
            # The log's name may not be durable: writes go on (the journal has them),
            # no checkpoint will pass (sync_error), and the listener hears of it.
            if self.on_write_error is not None:
                self.on_write_error(exc)

    def _open_direct(self, log_id: int) -> None:
        try:
            self._direct_fds[log_id] = self.ops.open_direct_write(self._path(log_id))
        except OSError as exc:
            if exc.errno in _OUT_OF_DESCRIPTORS:
                # Not the filesystem's doing: this log is written through the page cache
                # (its read-write descriptor), the next ones directly again.
                log.warning(
                    "entry log %s: no descriptor for direct writes of log %d (%s); "
                    "writing it through the page cache",
                    self.directory,
                    log_id,
                    exc,
                )
                return
            # tmpfs and some other filesystems refuse O_DIRECT: correct either way.
            log.warning(
                "entry log %s: direct I/O is not available here (%s); writing through "
                "the page cache",
                self.directory,
                exc,
            )
            self.direct_io = False

    def append(self, data: bytes) -> tuple[int, int]:
        """Append formatted records; returns (log id, offset of the first record)."""
        size = len(data)
        if self._end + size > self.max_bytes and self._end > LOG_HEADER_SIZE:
            self._rotate()
        start = self._end
        fill = self._fill
        if fill + size > len(self._buffer):
            # Past the slack (a record of over a quarter buffer): a larger one, once. The
            # current one has no views yet (they are taken when it is handed on).
            bigger = self._new_buffer(fill + size)
            bigger[:fill] = memoryview(self._buffer)[:fill]
            self._buffer = bigger
        self._buffer[fill : fill + size] = data  # same length: one copy, no reallocation
        self._fill = fill + size
        self._end = start + size
        if self._fill >= self.write_buffer_bytes:
            self.flush()
        return self.current_id, start

    def _new_buffer(self, at_least_bytes: int) -> bytearray | mmap.mmap:
        size = max(self._buffer_bytes, at_least_bytes)
        if self._spare and len(self._spare[-1]) >= size:
            return self._spare.pop()
        if self.direct_io:  # page-aligned memory, as direct writes need
            return mmap.mmap(-1, -(-size // DIRECT_IO_ALIGNMENT) * DIRECT_IO_ALIGNMENT)
        return bytearray(size)

    def _reuse(self, chunk: memoryview) -> None:
        """A chunk written and forgotten: its buffer takes the next appends."""
        # The view is not released: a stale reference to it (the entry tuple of a done
        # future's callback) would fail on comparison; nothing reads it any more.
        buffer = chunk.obj
        if (
            isinstance(buffer, (bytearray, mmap.mmap))
            and len(buffer) >= self._buffer_bytes
            and len(self._spare) < _SPARE_BUFFERS
        ):
            self._spare.append(buffer)

    def _rotate(self) -> None:
        if self._rotation_blocked:
            return
        self.flush()
        previous, unsynced = self.current_id, self._synced_end < self._end
        try:
            self._create(previous + 1, strict=False)
        except OSError as exc:
            if exc.errno not in _OUT_OF_DESCRIPTORS:
                raise
            # Nothing was created (the open is _create's first step): the add goes on
            # in the current log, whose writers a checkpoint never releases.
            self._rotation_blocked = True
            log.warning(
                "entry log %s: cannot create log %d (%s); log %d goes on past %d bytes "
                "until a checkpoint has released descriptors",
                self.directory,
                previous + 1,
                exc,
                previous,
                self.max_bytes,
            )
            return
        if unsynced:
            self._unsynced.add(previous)
        if self.on_rotate is not None:
            self.on_rotate()

    def flush(self) -> None:
        """Hand the buffer to the writer (or write it now); no fsync. Never raises for a
        failed write: the chunk stays readable and the next checkpoint writes it again."""
        if not self._fill:
            return
        if self.direct_io:
            self._pad_to_block()
        chunk = memoryview(self._buffer)[: self._fill]
        offset = self._buffer_start
        fd = self._direct_fds.get(self.current_id, self._fds[self.current_id])
        self._buffer = self._new_buffer(0)
        self._fill = 0
        self._buffer_start = offset + len(chunk)
        entry = (self.current_id, offset, chunk)
        self._pending.append(entry)
        if self.writer is None or self._in_flight >= _MAX_IN_FLIGHT_CHUNKS:
            # No worker, or it is behind: write here (back-pressure on the loop).
            try:
                self._write_chunk(entry, fd)
            except OSError as exc:
                if self.on_write_error is not None:
                    self.on_write_error(exc)
                return
            self._pending.remove(entry)
            self._reuse(chunk)
            return
        self._in_flight += 1
        future = self.writer(self._write_chunk, entry, fd)
        future.add_done_callback(lambda f: self._chunk_written(entry, fd, f))

    def _pad_to_block(self) -> None:
        """End the buffer on a block boundary with a padding record (direct writes)."""
        pad = -(self._buffer_start + self._fill) % DIRECT_IO_ALIGNMENT
        if not pad:
            return
        if pad < RECORD_HEADER_SIZE:
            pad += DIRECT_IO_ALIGNMENT
        fill = self._fill
        if fill + pad > len(self._buffer):
            bigger = self._new_buffer(fill + pad)
            bigger[:fill] = memoryview(self._buffer)[:fill]
            self._buffer = bigger
        self._buffer[fill : fill + pad] = _padding_record(pad)
        self._fill = fill + pad
        self._end += pad

    def _write_chunk(self, entry: Chunk, fd: int) -> None:
        log_id, offset, chunk = entry
        try:
            self._pwrite_all(fd, chunk, offset)
            if self.page_cache_max_bytes and not self.direct_io:
                self._drop_pages_behind(log_id, fd, offset + len(chunk))
        except OSError as exc:
            # Noted here, on the thread that wrote, before any later job of the worker
            # (a checkpoint's sync) can run: that checkpoint writes it again first.
            with self._lock:
                self._rewrite.append((entry, fd))
                if self.write_error is None:
                    self.write_error = exc
            log.error("entry log %s: write at offset %d failed: %s", self.directory, offset, exc)
            raise

    def _drop_pages_behind(self, log_id: int, fd: int, written_end: int) -> None:
        """Drop the log's pages more than ``page_cache_max_bytes`` behind what is written.

        Dirty pages are not dropped, only sent to the disk; the range is asked again a
        step later, when they are clean. Nothing is lost either way: dropped pages were
        written back, and a read of them goes to the file.
        """
        with self._lock:
            self._written_end[log_id] = max(self._written_end.get(log_id, 0), written_end)
            dropped_to = self._cache_dropped_to.get(log_id, 0)
            drop_to = written_end - self.page_cache_max_bytes
            if drop_to - dropped_to < _DROP_STEP_BYTES:
                return
            self._cache_dropped_to[log_id] = drop_to
        start = max(0, dropped_to - _DROP_STEP_BYTES)
        self._drop_cached(log_id, fd, start, drop_to - start)

    def _drop_synced_pages(self, log_id: int, fd: int) -> None:
        """After a log's fdatasync: its pages outside the cached window are clean, so all
        of them go (the whole log once it is no longer the current one)."""
        with self._lock:
            if log_id == self.current_id:
                drop_to = self._written_end.get(log_id, 0) - self.page_cache_max_bytes
                if drop_to <= 0:
                    return
                length = drop_to
            else:
                length = 0  # to the end of the file
                self._written_end.pop(log_id, None)
                self._cache_dropped_to.pop(log_id, None)
        self._drop_cached(log_id, fd, 0, length)

    def _drop_cached(self, log_id: int, fd: int, offset: int, length: int) -> None:
        try:
            self.ops.drop_cached(fd, offset, length)
        except OSError as exc:  # only a hint to the kernel: nothing is lost
            log.warning(
                "entry log %s: dropping cached pages of log %d failed: %s",
                self.directory,
                log_id,
                exc,
            )

    def _pwrite_all(self, fd: int, chunk: memoryview, offset: int) -> None:
        view = memoryview(chunk)
        try:
            written = 0
            while written < len(view):
                written += self.ops.pwrite(fd, view[written:], offset + written)
        finally:
            view.release()

    def _chunk_written(self, entry: Chunk, fd: int, future: asyncio.Future[None]) -> None:
        self._in_flight -= 1
        if future.cancelled():
            with self._lock:  # never ran: the next checkpoint writes it
                self._rewrite.append((entry, fd))
            return
        error = future.exception()
        if error is None:
            with contextlib.suppress(ValueError):
                self._pending.remove(entry)
                self._reuse(entry[2])
        elif isinstance(error, OSError) and self.on_write_error is not None:
            self.on_write_error(error)  # the chunk stays readable from memory

    def take_unsynced(self) -> list[tuple[int, int]]:
        """Flush, and hand over (log id, fd) of every log with bytes not yet fsynced."""
        self.flush()
        out = [(log_id, self._fds[log_id]) for log_id in sorted(self._unsynced)]
        self._unsynced.clear()
        if self._synced_end < self._end:
            out.append((self.current_id, self._fds[self.current_id]))
            self._synced_end = self._end
        return out

    def requeue_unsynced(self, logs: Iterable[tuple[int, int]]) -> None:
        """A checkpoint failed: these logs still need their fsync."""
        for log_id, _ in logs:
            if log_id == self.current_id:
                self._synced_end = 0
            else:
                self._unsynced.add(log_id)

    def sync(self, fds: Iterable[tuple[int, int]]) -> None:
        """Write again what failed, then fdatasync the given logs (checkpoint worker,
        after the writes queued before). Raises if either fails; a failed sync is sticky."""
        if self.sync_error is not None:
            raise OSError(
                f"entry log {self.directory}: an earlier sync failed ({self.sync_error}); "
                f"the pages it covered may be lost, so no checkpoint can pass it"
            )
        with self._lock:
            rewrite, self._rewrite = self._rewrite, []
        for n, (entry, fd) in enumerate(rewrite):
            try:
                self._pwrite_all(fd, entry[2], entry[1])
            except OSError as exc:
                with self._lock:
                    self._rewrite[:0] = rewrite[n:]
                    self.write_error = exc
                raise OSError(
                    f"entry log {self.directory}: writing log {entry[0]} at offset "
                    f"{entry[1]} failed again: {exc}"
                ) from exc
            with self._lock:
                self._rewritten.append(entry)
        for log_id, fd in fds:
            try:
                self.ops.fdatasync(fd)
            except OSError as exc:
                self._sync_failed(exc, f"fdatasync of log {log_id}")
                raise
            if self.page_cache_max_bytes and not self.direct_io:
                self._drop_synced_pages(log_id, fd)
        with self._lock:
            if not self._rewrite:
                self.write_error = None

    def _sync_failed(self, exc: OSError, what: str) -> None:
        if self.sync_error is None:
            self.sync_error = exc
        log.error(
            "entry log %s: %s failed: %s; no checkpoint will pass this (the journal is kept)",
            self.directory,
            what,
            exc,
        )

    def forget_rewritten(self) -> None:
        """On the loop after a checkpoint: chunks written again are read from their file."""
        with self._lock:
            done, self._rewritten = self._rewritten, []
        for entry in done:
            with contextlib.suppress(ValueError):
                self._pending.remove(entry)

    # ------------------------------------------------------------ reading

    def _fd(self, log_id: int) -> int:
        fd = self._fds.get(log_id)
        if fd is not None:
            return fd
        readers = self._read_fds
        fd = readers.get(log_id)
        if fd is not None:
            readers.move_to_end(log_id)
            return fd
        while True:
            try:
                fd = self.ops.open_read(self._path(log_id))
                break
            except OSError as exc:
                if exc.errno in _OUT_OF_DESCRIPTORS and readers:
                    # Out of descriptors: give up the least recently read log's first.
                    self.ops.close(readers.popitem(last=False)[1])
                    continue
                raise BookieIOError(f"entry log {self._path(log_id)}: cannot open: {exc}") from exc
        readers[log_id] = fd
        while len(readers) > self.max_read_fds:
            _, oldest = readers.popitem(last=False)
            self.ops.close(oldest)
        return fd

    def release_rotated(self) -> None:
        """On the loop after a checkpoint (done or failed): close the writers of rotated
        logs whose bytes are synced and of which no chunk is in flight or waits to be
        written again. Reads of them reopen through the bounded readers. A rotation
        that found no descriptor is tried again at the next append past max_bytes."""
        self._rotation_blocked = False
        current = self.current_id
        busy = {chunk[0] for chunk in self._pending} | self._unsynced | {current}
        with self._lock:
            busy.update(entry[0] for entry, _ in self._rewrite)
        for log_id in [log_id for log_id in self._fds if log_id not in busy]:
            for fds in (self._fds, self._direct_fds):
                fd = fds.pop(log_id, None)
                if fd is not None:
                    self.ops.close(fd)

    def read_ahead(self, log_id: int, offset: int, max_bytes: int) -> list[tuple[int, bytes]]:
        """The records from ``offset`` on, read from the log's file in one pread of at
        most ``max_bytes``: ``(record offset, blob)`` each, up to the first record the
        read cut off or that is damaged (its own :meth:`read` then says why).

        Stops before the write buffer and before chunks not yet written: those records
        are in memory, where :meth:`read` finds them."""
        limit = offset + max_bytes
        if log_id == self.current_id:
            limit = min(limit, self._buffer_start)
        for chunk_log, chunk_offset, chunk in self._pending:
            if chunk_log != log_id:
                continue
            if chunk_offset <= offset < chunk_offset + len(chunk):
                return []
            if chunk_offset > offset:
                limit = min(limit, chunk_offset)
        if limit - offset <= RECORD_HEADER_SIZE:
            return []
        try:
            raw = self.ops.pread(self._fd(log_id), limit - offset, offset)
        except (OSError, BookieIOError):
            return []  # the single read reports it
        records: list[tuple[int, bytes]] = []
        unpack = RECORD_HEADER.unpack_from
        position, end = 0, len(raw)
        while position + RECORD_HEADER_SIZE <= end:
            size, crc = unpack(raw, position)
            start = position + RECORD_HEADER_SIZE
            if start + size > end:
                break
            blob = raw[start : start + size]
            if crc32c(blob) != crc:
                break
            records.append((offset + position, blob))
            position = start + size
        return records

    def read(self, log_id: int, offset: int, size: int) -> bytes:
        """The blob of the record at ``offset``; BookieIOError if it is damaged or unreadable."""
        if log_id == self.current_id and offset >= self._buffer_start:
            start = offset - self._buffer_start + RECORD_HEADER_SIZE
            return bytes(self._buffer[start : min(start + size, self._fill)])
        for chunk_log, chunk_offset, chunk in self._pending:
            if chunk_log == log_id and chunk_offset <= offset < chunk_offset + len(chunk):
                start = offset - chunk_offset + RECORD_HEADER_SIZE
                return bytes(chunk[start : start + size])
        want = size + RECORD_HEADER_SIZE
        try:
            raw = self.ops.pread(self._fd(log_id), want, offset)
        except OSError as exc:
            raise BookieIOError(
                f"entry log {self._path(log_id)}: read of {want} bytes at offset {offset} "
                f"failed: {exc}"
            ) from exc
        if len(raw) != want:
            raise BookieIOError(
                f"entry log {self._path(log_id)}: record at offset {offset} is truncated "
                f"({len(raw)} of {want} bytes)"
            )
        got_size, crc = RECORD_HEADER.unpack_from(raw)
        blob = raw[RECORD_HEADER_SIZE:]
        if got_size != size or crc32c(blob) != crc:
            raise BookieIOError(
                f"entry log {self._path(log_id)}: damaged record at offset {offset} "
                f"(size or checksum mismatch)"
            )
        return blob

    # ------------------------------------------------------------ removal

    def unlink(self, log_id: int) -> None:
        """Delete a log file (never the current one). Its descriptor is closed by forget()."""
        if log_id == self.current_id:
            raise ValueError("the current entry log cannot be deleted")
        with contextlib.suppress(FileNotFoundError):
            self.ops.unlink(self._path(log_id))

    def forget(self, log_id: int) -> None:
        """Close a deleted log's descriptor (on the loop, the worker idle for it)."""
        with self._lock:  # a collected log's failed writes need not be done again
            self._rewrite = [r for r in self._rewrite if r[0][0] != log_id]
        self._pending = [c for c in self._pending if c[0] != log_id]
        for fds in (self._fds, self._direct_fds, self._read_fds):
            fd = fds.pop(log_id, None)
            if fd is not None:
                self.ops.close(fd)
        self._unsynced.discard(log_id)

    def close(self) -> None:
        """Write what is buffered and close every file (the worker must be idle)."""
        self.writer = None
        self.flush()
        for fds in (self._fds, self._direct_fds, self._read_fds):
            for fd in fds.values():
                self.ops.close(fd)
            fds.clear()
        if self._dir_fd >= 0:
            self.ops.close(self._dir_fd)
            self._dir_fd = -1

    @property
    def end_offset(self) -> int:
        return self._end
