"""Entry-log compaction: rewrite entry logs that hold mostly dead data.

Garbage collection frees an entry log only once every ledger in it is gone. A log
where most ledgers are gone but one lives on keeps its whole size. Compaction, as
BookKeeper's garbage collector does it, copies the live entries of such a log into
the current entry log and then deletes the old one:

- **Choice.** Each entry log's live bytes are estimated from ``log_usage`` (record
  bytes per ledger per log, kept per add batch, saved by checkpoints, dropped with a
  ledger). A log whose live fraction (live bytes / file bytes) is below the threshold
  is rewritten: a *minor* compaction (default threshold 0.2, every hour) catches the
  nearly empty logs cheaply, a *major* one (0.8, every day) rewrites most logs.
- **Copy.** On the event loop, in batches: each entry the index (or a recent,
  not yet checkpointed add) places in the old log is read and appended to the current
  log like an add, and its new location goes where a recent add's goes, so reads
  find the copy from then on; before that they find the original, which stays until
  the index has moved. A batch is a few hundred kilobytes, and the copying is paced
  to ``rate_bytes_per_s``, so adds and reads go on in between.
- **Switch.** When every entry has moved, the old log is released and a checkpoint
  runs: it fdatasyncs the new log (its directory entry was fsynced when it was made),
  commits in one LMDB transaction the new locations *and* the removal of the old log
  from the index, and only then deletes the old file.

Crash safety comes from that order. A crash before the commit leaves the index
pointing at the old log, which is intact; the copies are unnamed bytes (a log no
index entry names is removed at the next start, a named one just holds dead bytes
that a later compaction reclaims). A crash after the commit but before the delete
leaves an old log that the index no longer names: the first checkpoint after the
start removes it, as for any log the index does not name. So a start always finds
either the old state or the new one, and finishes it without a special case.

On a full disk (over its usage threshold) compaction is what wins space back, and it
needs little: ``room_bytes`` (what the disk has free beyond the space reserved for a
start) bounds it. Each log is then committed and deleted before the next is copied,
so at most one log's live bytes are ever written ahead of the space they give back;
a log whose live bytes do not fit in what is left stays, and the result says so.

A failed sync (R14) is sticky: the checkpoint fails before the commit, so no old log
is deleted, and compaction stops until a restart. A damaged record (R9) is not copied
and keeps its log: its entry goes on answering an I/O error rather than vanishing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from quorumlog.bookie.entry_log import LOG_HEADER_SIZE, log_file_name
from quorumlog.bookie.storage import LedgerStorage
from quorumlog.errors import BookieIOError

__all__ = ["CompactionResult", "CompactionSettings", "Compactor", "LogUsage"]

log = logging.getLogger(__name__)

# Entries looked at per loop turn while listing a log's entries, and bytes copied per
# batch: each turn of the loop spent on compaction stays short.
_SCAN_STEP = 5_000
_BATCH_BYTES = 256 * 1024


@dataclass(slots=True)
class CompactionSettings:
    minor_threshold: float = 0.2
    minor_interval_s: float = 3600.0
    major_threshold: float = 0.8
    major_interval_s: float = 86400.0
    # Copy pace; 0 means unpaced.
    rate_bytes_per_s: float = 16 * 1024 * 1024
    rate_entries_per_s: float = 0.0


@dataclass(slots=True, frozen=True)
class LogUsage:
    log_id: int
    live_bytes: int  # estimated, never below the truth
    total_bytes: int  # the file's records

    @property
    def live_fraction(self) -> float:
        return self.live_bytes / self.total_bytes if self.total_bytes > 0 else 1.0


@dataclass(slots=True)
class CompactionResult:
    logs_compacted: list[int] = field(default_factory=list)
    entries_copied: int = 0
    bytes_copied: int = 0
    bytes_freed: int = 0  # old log files deleted (their whole size)
    skipped: list[str] = field(default_factory=list)  # why a log was kept, in words
    duration_s: float = 0.0


class Compactor:
    """Compaction of one bookie's entry logs (event loop only).

    ``checkpoint()`` runs a checkpoint and waits for it; ``stopped()`` says the bookie
    is closing (compaction then stops between batches).
    """

    def __init__(
        self,
        storage: LedgerStorage,
        settings: CompactionSettings,
        checkpoint: Callable[[], Awaitable[None]],
        stopped: Callable[[], bool] = lambda: False,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.storage = storage
        self.settings = settings
        self._checkpoint = checkpoint
        self._stopped = stopped
        self._sleep = sleep
        self._lock = asyncio.Lock()  # one compaction at a time
        self.last_minor = 0.0
        self.last_major = 0.0
        self.runs = 0

    # ------------------------------------------------------------ choice

    def usage(self) -> list[LogUsage]:
        """Live and total bytes of every entry log but the current one."""
        storage = self.storage
        current = storage.entry_log.current_id
        out = []
        for log_id in sorted(storage.log_ledgers):
            if log_id >= current:
                continue
            path = storage.entry_log.directory / log_file_name(log_id)
            try:
                total = storage.ops.size(path) - LOG_HEADER_SIZE
            except OSError:
                continue  # missing: reads of its entries answer I/O errors already
            live = sum(storage.log_usage.get(log_id, {}).values())
            out.append(LogUsage(log_id, live, max(total, 0)))
        return out

    def candidates(self, threshold: float) -> list[LogUsage]:
        """Logs below ``threshold`` live, emptiest first. Logs without a live ledger are
        left to garbage collection, which frees them without copying."""
        found = [
            u
            for u in self.usage()
            if self.storage.log_ledgers.get(u.log_id) and u.live_fraction < threshold
        ]
        found.sort(key=lambda u: u.live_fraction)
        return found

    # ------------------------------------------------------------ running

    def due(self, now: float) -> bool | None:
        """Which compaction is due at ``now`` (the loop's clock): True major, False minor."""
        s = self.settings
        if s.major_threshold > 0 and now - self.last_major >= s.major_interval_s:
            return True
        if s.minor_threshold > 0 and now - self.last_minor >= s.minor_interval_s:
            return False
        return None

    async def run(self, major: bool, room_bytes: int | None = None) -> CompactionResult:
        """One minor or major compaction of every log below its threshold; with
        ``room_bytes`` (a full disk), one log at a time and only what fits in it."""
        s = self.settings
        threshold = s.major_threshold if major else s.minor_threshold
        async with self._lock:
            now = asyncio.get_running_loop().time()
            self.last_minor = now
            if major:
                self.last_major = now
            self.runs += 1
            return await self._run(threshold, room_bytes)

    async def _run(self, threshold: float, room_bytes: int | None) -> CompactionResult:
        result = CompactionResult()
        loop = asyncio.get_running_loop()
        started = loop.time()
        storage = self.storage
        moved: list[tuple[int, int]] = []  # (log id, file bytes)
        pace = _Pace(self.settings, self._sleep)
        for usage in self.candidates(threshold):
            why = self._cannot_go_on()
            if why:
                result.skipped.append(why)
                break
            if room_bytes is not None and usage.live_bytes > room_bytes:
                result.skipped.append(
                    f"entry log {usage.log_id}: its {usage.live_bytes} live bytes do not fit "
                    f"in the {max(room_bytes, 0)} bytes of room the full disk has left"
                )
                continue
            log.info(
                "compacting entry log %d: %d of %d bytes live",
                usage.log_id,
                usage.live_bytes,
                usage.total_bytes,
            )
            try:
                entries, size = await self._copy_log(usage.log_id, pace)
            except BookieIOError as exc:
                # R9: a record that cannot be read is not copied; its log stays, so
                # its entry goes on answering an I/O error instead of vanishing.
                result.skipped.append(f"entry log {usage.log_id}: {exc.message}")
                log.error("compaction keeps entry log %d: %s", usage.log_id, exc.message)
                continue
            if self._cannot_go_on():
                break
            storage.release_log(usage.log_id)
            moved.append((usage.log_id, usage.total_bytes + LOG_HEADER_SIZE))
            result.entries_copied += entries
            result.bytes_copied += size
            if room_bytes is not None:
                # A full disk: this log's file goes before the next one is copied.
                freed = await self._switch(moved, result)
                moved = []
                room_bytes += freed - size
                if storage.failure is not None:
                    break
        if moved:
            await self._switch(moved, result)
        if storage.failure is not None and storage.failure not in result.skipped:
            result.skipped.append(storage.failure)
        result.duration_s = round(loop.time() - started, 3)
        if moved:
            log.info(
                "compaction below %.2f live: %d logs rewritten, %d entries (%d bytes) "
                "copied, %d bytes freed in %.3f s",
                threshold,
                len(result.logs_compacted),
                result.entries_copied,
                result.bytes_copied,
                result.bytes_freed,
                result.duration_s,
            )
        return result

    async def _switch(self, moved: list[tuple[int, int]], result: CompactionResult) -> int:
        """New locations and the release commit together, then the files go; returns
        the bytes freed."""
        await self._checkpoint()
        freed = 0
        for log_id, file_bytes in moved:
            if log_id in self.storage.log_ledgers:
                continue  # the checkpoint failed; the next one retries
            result.logs_compacted.append(log_id)
            freed += file_bytes
        result.bytes_freed += freed
        return freed

    def _cannot_go_on(self) -> str | None:
        if self._stopped():
            return "the bookie is closing"
        # R14: past a failed sync nothing more is written or deleted; while entry-log
        # bytes wait in memory to be written again, copying would only pile up more.
        return self.storage.failure or self.storage.write_failure

    async def _copy_log(self, log_id: int, pace: _Pace) -> tuple[int, int]:
        """Copy every live entry of ``log_id`` into the current log; (entries, bytes)."""
        storage = self.storage
        copied = [0, 0]
        for ledger_id in sorted(storage.log_ledgers.get(log_id, ())):
            st = storage.states.get(ledger_id)
            if st is None:
                continue
            # First the recent adds placing entries in this log, then the index: an
            # entry committed meanwhile moves from the first to the second, so none is
            # missed. One ledger, and a bounded slice of it, at a time.
            recent = [
                e
                for locations in (st.recent, st.flushing or {})
                for e, loc in locations.items()
                if loc[0] == log_id
            ]
            after: int | None = -1
            while after is not None:
                found, after = storage.index.entries_in_log(ledger_id, log_id, after, _SCAN_STEP)
                await self._copy(ledger_id, log_id, found, pace, copied)
            await self._copy(ledger_id, log_id, recent, pace, copied)
        return copied[0], copied[1]

    async def _copy(
        self, ledger_id: int, log_id: int, entry_ids: list[int], pace: _Pace, copied: list[int]
    ) -> None:
        storage = self.storage
        batch_entries = batch_bytes = 0
        for entry_id in entry_ids:
            if self._stopped():
                raise BookieIOError("the bookie is closing")
            if storage.write_failure is not None:
                raise BookieIOError("stopped: an entry-log write failed")
            st = storage.states.get(ledger_id)
            if st is None or st.deleted:
                return  # dropped meanwhile
            loc = st.location(entry_id) or storage.index.get(ledger_id, entry_id)
            if loc is None or loc[0] != log_id:
                continue  # already copied, written again elsewhere, or purged
            blob = storage.entry_log.read(*loc)
            # The same path as an add: the copy is readable at once, and the next
            # checkpoint writes its location (and the log's usage) to the index.
            storage.add_one(st, blob, len(blob), entry_id)
            batch_entries += 1
            batch_bytes += len(blob)
            if batch_bytes >= _BATCH_BYTES:
                copied[0] += batch_entries
                copied[1] += batch_bytes
                await pace.wait(batch_entries, batch_bytes)
                batch_entries = batch_bytes = 0
        copied[0] += batch_entries
        copied[1] += batch_bytes
        await pace.wait(batch_entries, batch_bytes)


class _Pace:
    """Sleeps so that copying stays under the configured bytes/s and entries/s; it
    also yields the loop after every batch, so adds and reads go on."""

    def __init__(self, settings: CompactionSettings, sleep: Callable[[float], Awaitable[None]]):
        self._settings = settings
        self._sleep = sleep
        self._loop = asyncio.get_running_loop()  # its clock: virtual in a simulation
        self._start = self._loop.time()
        self._entries = 0
        self._bytes = 0

    async def wait(self, entries: int, size: int) -> None:
        s = self._settings
        self._entries += entries
        self._bytes += size
        need = 0.0
        if s.rate_bytes_per_s > 0:
            need = max(need, self._bytes / s.rate_bytes_per_s)
        if s.rate_entries_per_s > 0:
            need = max(need, self._entries / s.rate_entries_per_s)
        delay = need - (self._loop.time() - self._start)
        await self._sleep(max(delay, 0.0))
