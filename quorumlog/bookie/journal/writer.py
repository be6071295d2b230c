"""The journal writer: records queued on the event loop, written and synced in batches.

Group commit: the event loop appends records to a queue; one writer thread takes
everything queued (up to ``journal_max_batch_records`` / ``_bytes``, and for no
longer than ``journal_max_group_wait_ms``), writes it with one system call,
fdatasyncs once, and hands the whole batch's completions back to the loop with
one ``call_soon_threadsafe``. When the queue is empty it syncs at once: an idle
journal never waits for company. A batch is written only after the one before
it was synced, in this file or an earlier one. Given an executor instead (a
simulation's deterministic scheduler), each batch is one job on it, timed by the
loop's clock; files go through a :class:`~quorumlog.bookie.fileops.FileOps`.

The mark (:attr:`Journal.mark`) is the position after the last batch written:
every record before it was queued, hence applied to ledger storage, before the
loop reads it, so a checkpoint may record it.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quorumlog.bookie.fileops import REAL_FILES, FileOps
from quorumlog.bookie.journal.direct_io import (
    PREALLOC_MAX_BATCH_BYTES,
    StagedDirectWrites,
    open_direct_writes,
    padded_size,
)
from quorumlog.bookie.journal.format import (
    BATCH_MARKER_SIZE,
    FACTS_MAX_BYTES,
    FILE_HEADER_SIZE,
    LEDGER_FACTS,
    MANIFEST_OVERHEAD,
    NO_ENTRY,
    OUT_OF_DESCRIPTORS,
    PAGE_BYTES,
    RECORD_ADD,
    SALT_SIZE,
    Fact,
    Record,
    Summary,
    batch_marker,
    create_journal_file,
    journal_file_name,
    manifest_record,
    note_state,
)
from quorumlog.bookie.metrics import BookieCounters

log = logging.getLogger(__name__)

# Looked up at call time so that tests can slow it down or count it.
fdatasync = os.fdatasync

# Synced journal bytes are dropped from the page cache once this many have gathered:
# one fadvise call per MiB, not per batch, on the small-entry path.
DROP_CACHE_STEP_BYTES = 1024 * 1024
# A batch whose parts average this much or more is written as a list (writev), not
# joined first; at most this many parts (Linux's IOV_MAX is 1024).
_WRITEV_MIN_PART_BYTES = 4096
_WRITEV_MAX_PARTS = 1024


# ---------------------------------------------------------------- writer

Done = tuple[Callable[[Any], None], Any]  # called as done[0](done[1]) on the loop
BatchCallback = Callable[[list[Done], int, BaseException | None], None]


class Journal:
    """The journal writer: records queued on the loop, written and synced on its own thread."""

    def __init__(
        self,
        directory: Path,
        first_file_id: int,
        *,
        sync: bool,
        max_group_wait_ms: float,
        max_batch_bytes: int,
        max_batch_records: int,
        file_max_bytes: int,
        remove_pages_from_cache: bool = True,
        direct_io: bool = False,
        prealloc_bytes: int = 0,
        ops: FileOps = REAL_FILES,
    ) -> None:
        """``direct_io``: write around the page cache where the filesystem allows it
        (where it does not, a warning says so and writes go through the cache);
        ``prealloc_bytes``: with direct writes, zeros written ahead of the batches
        (:mod:`~.direct_io`), 0 for none."""
        self.directory = directory
        self._ops = ops
        self._clock: Callable[[], float] = time.monotonic
        self.sync_enabled = sync
        self.max_group_wait_s = max_group_wait_ms / 1000
        self.max_batch_bytes = max_batch_bytes
        self.max_batch_records = max_batch_records
        self.file_max_bytes = file_max_bytes
        # The journal is read only at replay, so its synced pages are dropped from the
        # page cache (BookKeeper's journalRemovePagesFromCache): kept, they would make
        # the cache grow by every byte journaled and take a fresh page for each 4 KiB
        # written, which costs far more than reusing pages the kernel just freed.
        self.remove_pages_from_cache = remove_pages_from_cache
        self._cache_kept_from = 0  # offset in the current file of pages not yet dropped
        self.direct_io = direct_io
        self._direct_fd: int | None = None  # the current file's, for direct writes
        self._direct = StagedDirectWrites()
        self.prealloc_bytes = prealloc_bytes + -prealloc_bytes % PAGE_BYTES
        self._zeroed_to = 0  # where the zeros written ahead in the current file end
        self._salt = b""  # the current file's
        self._records_from = FILE_HEADER_SIZE  # where the current file's first batch goes
        # Held for the journal's life: a new file needs no descriptor but its own, and
        # one that cannot be had (EMFILE) leaves the journal in its current file.
        self._dir_fd = ops.open_directory(directory)
        self._file_refused = 0  # the file id a rollover last found no descriptor for
        # The first file exists (header durable) before any record is queued, so a
        # checkpoint mark can always name an existing file.
        try:
            self._open_file(first_file_id)
        except BaseException:
            ops.close(self._dir_fd)
            raise
        self._unsynced = False
        # Writer side: where the next batch goes. Read on the loop as the mark (a tuple
        # is replaced whole, so the loop never sees half of one).
        self._mark = (first_file_id, self._records_from)
        self._queue: collections.deque[tuple[list[bytes], int, Done | None, Fact]] = (
            collections.deque()
        )
        self.queued_bytes = 0  # loop side: queued and not yet completed
        self._wake: _Wakeup | _Jobs = _Wakeup()
        self._idle = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._jobs: _Jobs | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_batch: BatchCallback | None = None
        self._failure: BaseException | None = None
        self._stopped: asyncio.Future[None] | None = None
        # Counters, written by the writer thread only.
        self.counters = BookieCounters()  # the bookie's, once it is opened
        # When the oldest record still queued was queued (a lower bound after a batch
        # left records behind): what an add's latency counts from.
        self._oldest_queued_at = 0.0
        self.sync_count = 0
        self.batch_count = 0
        self.records_written = 0

    @property
    def mark(self) -> tuple[int, int]:
        """The position after the last batch written.

        Every record before it was queued (so applied to ledger storage) before the
        caller reads it: what a checkpoint records. Records queued and not yet written
        come after it and are replayed again after a crash (replay is idempotent).
        """
        return self._mark

    @property
    def failed(self) -> BaseException | None:
        return self._failure

    def start(
        self,
        loop: asyncio.AbstractEventLoop,
        on_batch: BatchCallback,
        executor: concurrent.futures.Executor | None = None,
    ) -> None:
        """Start the writer thread; ``on_batch(dones, nbytes, error)`` runs on ``loop``.

        With ``executor`` (a deterministic scheduler that runs jobs on the loop's
        thread, as a simulation's), each batch is a job on it instead, timed by the
        loop's clock.
        """
        self._loop = loop
        self._on_batch = on_batch
        self._stopped = loop.create_future()
        if executor is not None:
            self._clock = loop.time
            self._jobs = jobs = _Jobs(self, executor)
            self._wake = jobs  # append()'s set() submits a job
            self._idle = True
            return
        self._thread = threading.Thread(target=self._run, name="bookie-journal", daemon=True)
        self._thread.start()

    def append(self, record: Record, done: Done | None) -> None:
        """Queue one record (loop thread). ``done`` is completed once it is durable."""
        parts, size, fact = record
        self.queued_bytes += size
        if not self._queue:
            self._oldest_queued_at = self._clock()
        self._queue.append((parts, size, done, fact))
        if self._idle:
            self._wake.set()

    def abandon(self) -> None:
        """Close the file of a journal that was never started."""
        if self._thread is None and self._jobs is None:
            with contextlib.suppress(OSError):
                self._close_files()

    async def close(self) -> None:
        """Write and sync what is queued, deliver its completions, stop the thread."""
        if self._thread is None and self._jobs is None:
            self._close_files()
            return
        self._stopping = True
        self._wake.set()
        assert self._stopped is not None
        await self._stopped
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # ------------------------------------------------------------ writer thread

    def _run(self) -> None:
        queue = self._queue
        loop = self._loop
        wake = self._wake
        assert loop is not None and isinstance(wake, _Wakeup)
        try:
            while True:
                if not queue:
                    self._idle = True
                    if not queue and not self._stopping:
                        wake.wait(0.1)
                    wake.clear()
                    self._idle = False
                    if not queue:
                        if self._stopping:
                            break
                        continue
                self._write_batch(queue, loop)
        finally:
            self._stop_writing(loop)

    def _stop_writing(self, loop: asyncio.AbstractEventLoop) -> None:
        with contextlib.suppress(OSError):
            if self._failure is None:
                self._cut_zeros()  # every batch is synced: the file ends in whole records
            self._close_files()
        with contextlib.suppress(RuntimeError):  # the loop was closed under us
            loop.call_soon_threadsafe(self._finish)

    def _finish(self) -> None:
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)

    def _write_batch(
        self,
        queue: collections.deque[tuple[list[bytes], int, Done | None, Fact]],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        max_records = self.max_batch_records
        max_bytes = self.max_batch_bytes
        clock = self._clock
        cut_at = clock()
        queued_at = min(self._oldest_queued_at, cut_at)
        deadline = cut_at + self.max_group_wait_s
        dones: list[Done] = []
        # Pieces of the batch, each for one file: that file's batch marker, a manifest of
        # the piece (what it holds, per ledger), its records, the manifest again. Only
        # the first piece goes to the current file.
        max_file = self.file_max_bytes
        piece_overhead = BATCH_MARKER_SIZE + 2 * MANIFEST_OVERHEAD
        file_used = self._mark[1] + piece_overhead
        has_records = self._mark[1] > self._records_from
        pieces: list[tuple[list[bytes], Summary]] = []
        parts: list[bytes] = [b"", b""]  # the marker and the manifest, written last
        summary: Summary = {}
        total = 0
        count = 0
        popleft = queue.popleft
        while queue and count < max_records and total < max_bytes:
            rec_parts, size, done, fact = popleft()
            if has_records and file_used + size + FACTS_MAX_BYTES > max_file:
                # The file is full: what follows goes to a new file, after a sync.
                pieces.append((parts, summary))
                parts = [b"", b""]
                summary = {}
                file_used = self._records_from + piece_overhead
            parts += rec_parts
            file_used += size
            ledger_id, kind, a, b, key = fact
            facts = summary.get(ledger_id)
            if facts is None:
                facts = summary[ledger_id] = [NO_ENTRY, -1, 0, -1, b""]
                file_used += 2 * LEDGER_FACTS.size  # in both manifests
            if kind == RECORD_ADD:
                if a < facts[0]:
                    facts[0] = a
                if b > facts[1]:
                    facts[1] = b
            else:
                file_used += 2 * note_state(facts, kind, a, key)
            has_records = True
            total += size
            count += 1
            if done is not None:
                dones.append(done)
            if count & 63 == 0 and clock() >= deadline:
                break
        # Whatever is left was queued before this cut.
        self._oldest_queued_at = cut_at
        pieces.append((parts, summary))
        error: BaseException | None = self._failure
        if error is None:
            try:
                for n, (piece, piece_summary) in enumerate(pieces):
                    if not piece_summary:
                        continue  # the current file was full before the first record
                    if n:
                        self._sync_current()
                        self._next_file(self._mark[0] + 1)
                    manifest = manifest_record(self._salt, piece_summary)
                    piece[0] = self._marker
                    piece[1] = manifest
                    piece.append(manifest)
                    written = self._write_piece(piece)
                    self._mark = (self._mark[0], self._mark[1] + written)
                self._sync_current()
                self.records_written += count
                counters = self.counters
                counters.journal_batch_records.observe(count)
                counters.journal_batch_bytes += total
            except BaseException as exc:  # reported to every waiter
                log.error("journal %s: write failed: %s", self.directory, exc)
                self._failure = error = exc
        self.batch_count += 1
        loop.call_soon_threadsafe(self._deliver, dones, total, error, queued_at)

    def _deliver(
        self, dones: list[Done], size: int, error: BaseException | None, queued_at: float = 0.0
    ) -> None:
        self.queued_bytes -= size
        if dones and error is None:
            # One observation per batch, standing for each request it answers.
            self.counters.add_latency.observe(self._clock() - queued_at, len(dones))
        assert self._on_batch is not None
        self._on_batch(dones, size, error)

    def _write_piece(self, parts: list[bytes]) -> int:
        """Write a batch's parts (all of them, or it raises); returns how far the file's
        end moved (their size, and the PAD after them when written directly)."""
        size = sum(map(len, parts))
        if self._direct_fd is not None:
            start = self._mark[1]
            zeros = self._zeros_after(start, size)
            written = self._direct.write(self._ops, self._direct_fd, parts, size, start, zeros)
            if zeros:
                self._zeroed_to = start + written + zeros
            self._unsynced = True
            return written
        if len(parts) > _WRITEV_MAX_PARTS or size < len(parts) * _WRITEV_MIN_PART_BYTES:
            # Small records: one join is cheaper than the kernel walking many small parts.
            self._write_all(b"".join(parts))
            return size
        # Large records (big entries) go as they are: joining would copy each once more.
        written = self._ops.write_parts(self._fd, parts)
        if written < size:  # a short write (a full disk, a signal): the rest in one piece
            self._write_all(b"".join(parts)[written:])
        self._unsynced = True
        return size

    def _zeros_after(self, start: int, size: int) -> int:
        """How many bytes of zeros to write after a batch of ``size`` bytes at ``start``:
        the next ``prealloc_bytes`` when it passes the zeros written so far and is small,
        never past the file's size limit."""
        end = start + padded_size(size)
        if not self.prealloc_bytes or end <= self._zeroed_to or size > PREALLOC_MAX_BATCH_BYTES:
            return 0
        room = self.file_max_bytes - end
        return min(self.prealloc_bytes, max(0, room - room % PAGE_BYTES))

    def _cut_zeros(self) -> None:
        """Cut the zeros after the last batch off the current file, durably, before a
        file after it exists (the writer leaves a file only after its last batch
        synced), so that every file but the last ends in whole records. Replay ends a
        file at such zeros too, for a cut that a failed sync lost."""
        end = self._mark[1]
        if self._zeroed_to > end:
            self._ops.truncate(self.directory / journal_file_name(self._mark[0]), end)
            self._ops.fsync(self._fd)
        self._zeroed_to = end

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        written = 0
        while written < len(view):
            written += self._ops.write(self._fd, view[written:])
        self._unsynced = True

    def _sync_current(self) -> None:
        if self.sync_enabled and self._unsynced:
            started = self._clock()
            if self._ops is REAL_FILES:
                fdatasync(self._fd)  # the module's, which tests may replace
            else:
                self._ops.fdatasync(self._fd)
            self.counters.journal_sync_latency.observe(self._clock() - started)
            self.sync_count += 1
            if self.remove_pages_from_cache and self._direct_fd is None:
                self._drop_synced_pages(DROP_CACHE_STEP_BYTES)
        self._unsynced = False

    def _drop_synced_pages(self, at_least_bytes: int) -> None:
        """Drop the current file's synced pages, once ``at_least_bytes`` have gathered."""
        end = self._mark[1]
        kept_from = self._cache_kept_from
        if end - kept_from < at_least_bytes:
            return
        try:
            self._ops.drop_cached(self._fd, kept_from, end - kept_from)
        except OSError as exc:  # only a hint to the kernel: the data is synced either way
            log.warning("journal %s: dropping cached pages failed: %s", self.directory, exc)
            self.remove_pages_from_cache = False
            return
        # A partly written last page stays cached; it is dropped with the next range.
        self._cache_kept_from = end - end % PAGE_BYTES

    def _open_file(self, file_id: int) -> None:
        salt = os.urandom(SALT_SIZE)
        # Direct writes start each batch on a block of its own, the first one after the
        # header's block (which a PAD record fills).
        block = PAGE_BYTES if self.direct_io else 0
        self._fd = create_journal_file(
            self.directory, file_id, salt, self._ops, block, self._dir_fd
        )
        self._salt = salt
        self._marker = batch_marker(salt)
        self._records_from = self._zeroed_to = block or FILE_HEADER_SIZE
        if self.direct_io:
            path = self.directory / journal_file_name(file_id)
            self._direct_fd, self.direct_io = open_direct_writes(self._ops, path, file_id)

    def _close_file(self) -> None:
        try:
            if self._direct_fd is not None:
                self._ops.close(self._direct_fd)
                self._direct_fd = None
        finally:
            self._ops.close(self._fd)

    def _close_files(self) -> None:
        """The current file's descriptors and the directory's (the journal is done)."""
        try:
            self._close_file()
        finally:
            if self._dir_fd >= 0:
                self._ops.close(self._dir_fd)
                self._dir_fd = -1

    def _next_file(self, file_id: int) -> None:
        """Go on in file ``file_id``, created now; or, when no descriptor can be had for
        it (EMFILE), in the current file, past ``file_max_bytes``: the next batch that
        finds the file full tries again. Out of descriptors is no failure of the disk,
        and nothing is created then (the open fails before it creates the file)."""
        self._cut_zeros()
        current = (self._fd, self._direct_fd, self._salt, self._marker, self._records_from)
        self._direct_fd = None
        try:
            self._open_file(file_id)
        except BaseException as exc:
            self._fd, self._direct_fd, self._salt, self._marker, self._records_from = current
            if not isinstance(exc, OSError) or exc.errno not in OUT_OF_DESCRIPTORS:
                raise
            if self._file_refused != file_id:  # once, not at every batch meanwhile
                self._file_refused = file_id
                log.warning(
                    "journal %s: cannot create file %d (%s); file %d goes on past %d "
                    "bytes until it can",
                    self.directory,
                    file_id,
                    exc,
                    self._mark[0],
                    self.file_max_bytes,
                )
            return
        new = (self._fd, self._direct_fd)
        self._fd, self._direct_fd = current[0], current[1]
        try:
            if self.remove_pages_from_cache and self.sync_enabled and self._direct_fd is None:
                self._drop_synced_pages(1)  # the whole file is synced before it is left
            self._close_file()
        finally:
            self._fd, self._direct_fd = new
        self._mark = (file_id, self._records_from)
        self._cache_kept_from = 0


class _Wakeup:
    """The writer thread's wake-up, as ``threading.Event`` is used here (set, wait with a
    timeout, clear) but cheaper on the one-add-at-a-time path: a ``SimpleQueue`` (C, one
    semaphore) instead of a Condition that allocates a lock and runs Python code on each
    wait and set. ``set`` puts one token unless one is pending; the thread always looks
    at the record queue again after ``clear``, so no wake-up is lost.
    """

    __slots__ = ("_pending", "_tokens")

    def __init__(self) -> None:
        self._tokens: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._pending = False

    def set(self) -> None:
        if not self._pending:
            self._pending = True
            self._tokens.put(None)

    def wait(self, timeout_s: float) -> None:
        with contextlib.suppress(queue.Empty):
            self._tokens.get(timeout=timeout_s)

    def clear(self) -> None:
        self._pending = False


class _Jobs:
    """The writer as jobs of an executor instead of a thread.

    Stands in for the thread's wake-up event: ``set()`` (what :meth:`Journal.append`
    calls on an idle journal, and :meth:`Journal.close`) submits one job; a job
    writes one batch and submits the next while records wait. Meant for executors
    that run jobs one at a time on the loop's thread (a simulation's scheduler).
    """

    def __init__(self, journal: Journal, executor: concurrent.futures.Executor) -> None:
        self._journal = journal
        self._executor = executor
        self._submitted = False

    def set(self) -> None:
        if not self._submitted:
            self._submitted = True
            self._journal._idle = False
            self._executor.submit(self._run)

    def _run(self) -> None:
        journal = self._journal
        loop = journal._loop
        assert loop is not None
        self._submitted = False
        if journal._queue:
            journal._write_batch(journal._queue, loop)
        if journal._queue:
            self.set()
        elif journal._stopping:
            journal._stop_writing(loop)
        else:
            journal._idle = True
