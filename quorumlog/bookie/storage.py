"""Ledger storage: entry logs + index + per-ledger state, and checkpoints.

This is what the journal protects. Adds land here at once (entry-log buffer and
an in-memory index), so they are readable right away; a checkpoint later makes
them durable here, after which the journal before the checkpoint's mark can go.

Checkpoint, in three steps:

1. ``capture`` (event loop): note the journal mark (everything the journal
   has written so far was queued earlier, so is already applied here), write
   the entry-log buffer to its file, and take the index updates, changed ledger
   states and the entry-log table collected since the last checkpoint;
2. ``commit`` (worker thread): fdatasync every entry log written since, then
   one LMDB transaction with the index updates, states, table and mark (synced
   on commit), then delete the entry logs no ledger needs and the journal files
   wholly before the mark;
3. ``finish`` (event loop): forget what was committed from memory.

Used from one thread at a time: the event loop once the bookie runs, the
opening thread before.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path

from crc32c import crc32c

from quorumlog.bookie.entry_log import (
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    EntryLogger,
    format_records,
    list_log_ids,
    log_file_name,
    log_holds_records,
    parse_records,
    record_offsets,
)
from quorumlog.bookie.fileops import REAL_FILES, FileOps
from quorumlog.bookie.index import IndexDamageError, IndexUpdate, LedgerIndex
from quorumlog.bookie.journal.format import delete_journal_files_before
from quorumlog.bookie.ledger_state import LedgerState, Location
from quorumlog.bookie.read_cache import ReadCache
from quorumlog.errors import BookieIOError
from quorumlog.proto.entry import ENTRY_HEADER

log = logging.getLogger(__name__)

_IDS = struct.Struct(">qq")  # the ledger id and entry id an entry blob starts with
# The most one batch read reads ahead in one pread (a bound on wasted bytes when a
# ledger's entries are interleaved with other ledgers' in the entry log).
READ_AHEAD_MAX_BYTES = 1 << 20

# Checkpoints failing in a row before adds are refused (issue B5): each failure keeps
# the index updates in memory and the journal on disk, so neither may grow for ever.
READ_ONLY_AFTER_FAILED_CHECKPOINTS = 3


@dataclass(slots=True)
class CheckpointWork:
    update: IndexUpdate
    sync_logs: list[tuple[int, int]]  # (log id, fd)
    free_logs: list[int]
    journal_dir: Path
    flushed: list[LedgerState] = field(default_factory=list)
    removed_journal_files: list[int] = field(default_factory=list)


class LedgerStorage:
    """Entries, index and ledger state of one data directory."""

    def __init__(
        self,
        data_dir: Path,
        *,
        entry_log_max_bytes: int,
        entry_log_write_buffer_bytes: int,
        read_cache_max_bytes: int,
        entry_log_page_cache_max_bytes: int = 0,
        entry_log_direct_io: bool = True,
        index_map_size_bytes: int,
        ops: FileOps = REAL_FILES,
    ) -> None:
        self.data_dir = data_dir
        self.ops = ops
        self.failed_checkpoints = 0  # in a row
        self.last_checkpoint_error: BaseException | None = None
        self.index: LedgerIndex = ops.open_index(data_dir / "index", index_map_size_bytes)
        try:
            self.states: dict[int, LedgerState] = self.index.load_states()
            self.mark = self.index.load_mark()
            # The ledgers of each entry log, and the record bytes of each there
            # (compaction's estimate of live data).
            self.log_ledgers: dict[int, set[int]]
            self.log_usage: dict[int, dict[int, int]]
            self._rebuilt_log_tables = self._load_log_tables()
            logs_dir = data_dir / "entrylogs"
            ops.mkdir(logs_dir)
            removed = self._free_dead_copies(logs_dir, self._check_logs(logs_dir))
            self.entry_log = EntryLogger(
                logs_dir,
                entry_log_max_bytes,
                entry_log_write_buffer_bytes,
                known_ids=[*self.log_ledgers, *removed],  # ids only grow
                page_cache_max_bytes=entry_log_page_cache_max_bytes,
                direct_io=entry_log_direct_io,
                ops=ops,
            )
        except BaseException:
            self.index.close()
            raise
        self.log_ledgers.setdefault(self.entry_log.current_id, set())
        self.read_cache = ReadCache(read_cache_max_bytes)
        self._dirty_states: set[int] = set()
        self._dropped_states: set[int] = set()
        self._purge: set[int] = set()
        self._dirty_logs: set[int] = {self.entry_log.current_id}
        if self._rebuilt_log_tables:
            self._dirty_logs.update(self.log_ledgers)
        # Ledgers whose index records were all found sound and counted (R17: an entry
        # the index lacks below the ledger's last one is then proven absent); until a
        # checkpoint writes more of their entries.
        self._proven_complete: set[int] = set()

    def _load_log_tables(self) -> bool:
        """Load the entry-log tables; rebuild them from the entries if a value is damaged
        (the first checkpoint then writes them whole). True if rebuilt."""
        try:
            self.log_ledgers = self.index.load_logs()
            usage = self.index.load_usage()
        except IndexDamageError as exc:
            log.error(
                "%s: rebuilding the entry-log tables from the index's entries (nothing is "
                "lost: they only summarize the entries)",
                exc.message,
            )
            self.log_ledgers, self.log_usage = self.index.scan_logs()
            return True
        self.log_usage = usage if usage is not None else self.index.scan_usage()
        return False

    def _check_logs(self, logs_dir: Path) -> list[int]:
        """Check the entry logs against the index; returns the logs it does not name.

        R15: an index without a checkpoint mark beside logs that hold entries was lost
        or replaced, not empty: refuse, and remove nothing.
        """
        present = list_log_ids(logs_dir, self.ops)
        if self.mark is None:
            holding = [
                log_file_name(log_id)
                for log_id in present
                if log_holds_records(logs_dir / log_file_name(log_id), self.ops)
            ]
            if holding:
                shown = ", ".join(holding[:5]) + (", ..." if len(holding) > 5 else "")
                raise BookieIOError(
                    f"index {self.index.directory} has no checkpoint mark but the entry logs "
                    f"in {logs_dir} hold entries ({shown}): the index was lost or replaced "
                    f"(an unmounted directory? a removed data.mdb?), and starting would "
                    f"answer 'no such entry' for acknowledged data; refusing to start, "
                    f"nothing was removed. Restore the index"
                )
        missing = [
            log_id
            for log_id, ledgers in self.log_ledgers.items()
            if ledgers and log_id not in present
        ]
        if missing:
            log.error(
                "entry logs %s are named by the index but missing from %s: reads of their "
                "entries answer I/O errors",
                missing,
                logs_dir,
            )
        # A log the index does not name was created after the last checkpoint (the
        # journal holds all of it: replay writes it again) or was collected but not yet
        # unlinked (_free_dead_copies removes it).
        return [log_id for log_id in present if log_id not in self.log_ledgers]

    def _free_dead_copies(self, logs_dir: Path, orphans: list[int]) -> list[int]:
        """Before replay: remove the logs the index does not name, and cut the log that
        was current at the last checkpoint back to its end then. What they hold beyond
        the index was written after that checkpoint, so the journal holds it after the
        mark and replay writes it again (or it was collected): a bookie that filled its
        disk gets that room back for its replay (issue B4). Returns the logs removed."""
        removed, freed = [], 0
        for log_id in orphans:
            path = logs_dir / log_file_name(log_id)
            try:
                size = self.ops.size(path)
                self.ops.unlink(path)
            except FileNotFoundError:
                continue
            removed.append(log_id)
            freed += size
        try:
            log_end = self.index.load_log_end()
        except IndexDamageError as exc:
            log.warning("%s; the tail of the last current entry log stays", exc.message)
            log_end = None
        if log_end is not None and log_end[0] in self.log_ledgers:
            log_id, end = log_end
            path = logs_dir / log_file_name(log_id)
            try:
                size = self.ops.size(path)
            except FileNotFoundError:
                size = 0
            if size > end:
                self.ops.truncate(path, end)
                freed += size - end
        if freed:
            log.info(
                "entry logs %s: removed logs %s and tails past the last checkpoint (%d bytes), "
                "which only held what the journal holds",
                logs_dir,
                removed,
                freed,
            )
        return removed

    # ------------------------------------------------------------ state

    def state(self, ledger_id: int) -> LedgerState | None:
        return self.states.get(ledger_id)

    def create_state(self, ledger_id: int) -> LedgerState:
        st = LedgerState(ledger_id)
        self.states[ledger_id] = st
        self._dropped_states.discard(ledger_id)
        self.mark_dirty(st)
        return st

    def mark_dirty(self, st: LedgerState) -> None:
        if not st.dirty:
            st.dirty = True
            self._dirty_states.add(st.ledger_id)

    def ledger_ids(self) -> set[int]:
        return {lid for lid, st in self.states.items() if not st.deleted}

    @property
    def failure(self) -> str | None:
        """Why no checkpoint can succeed any more (R14: a failed sync), or why adds must
        stop until one does (checkpoints failing in a row: the index updates held in
        memory and the journal would grow without bound), or None."""
        error = self.entry_log.sync_error
        if error is None:
            if self.failed_checkpoints >= READ_ONLY_AFTER_FAILED_CHECKPOINTS:
                return (
                    f"{self.failed_checkpoints} checkpoints in a row failed (last: "
                    f"{self.last_checkpoint_error}); adds are refused until one succeeds, "
                    "so that memory and the journal stay bounded"
                )
            return None
        return (
            f"a sync of the entry logs in {self.entry_log.directory} failed ({error}): "
            f"written entries may be lost from them, so no checkpoint passes this and the "
            f"journal is kept; restart the bookie to replay the journal into new logs"
        )

    @property
    def write_failure(self) -> str | None:
        """Why entry-log bytes wait in memory to be written again, or None."""
        error = self.entry_log.write_error
        if error is None:
            return None
        return (
            f"a write to the entry logs in {self.entry_log.directory} failed ({error}); "
            f"the entries are kept in memory and the next checkpoint writes them again"
        )

    # ------------------------------------------------------------ entries

    def add_entries(
        self,
        st: LedgerState,
        entries: list[bytes],
        sizes: list[int],
        entry_ids: Iterable[int],
        max_entry_id: int,
        data: bytes | None = None,
    ) -> bytes:
        """Store validated entries of ``st``'s ledger; returns their formatted bytes
        (``data`` if given), which the journal's add record reuses."""
        if data is None:
            data = format_records(entries, sizes)
        log_id, start = self.entry_log.append(data)
        offsets = record_offsets(start, sizes)
        st.recent.update(zip(entry_ids, zip(repeat(log_id), offsets, sizes), strict=True))
        if max_entry_id > st.last_entry_id:
            st.last_entry_id = max_entry_id
        if not st.dirty:
            st.dirty = True
            self._dirty_states.add(st.ledger_id)
        ledgers = self.log_ledgers.get(log_id)
        if ledgers is None:
            ledgers = self.log_ledgers[log_id] = set()
        if st.ledger_id not in ledgers:
            ledgers.add(st.ledger_id)
            self._dirty_logs.add(log_id)
        self._count_usage(log_id, st.ledger_id, len(data))
        return data

    def _count_usage(self, log_id: int, ledger_id: int, size: int) -> None:
        # Once per batch; the logs written since a checkpoint are saved by that checkpoint.
        per_ledger = self.log_usage.get(log_id)
        if per_ledger is None:
            per_ledger = self.log_usage[log_id] = {}
        per_ledger[ledger_id] = per_ledger.get(ledger_id, 0) + size

    def add_one(self, st: LedgerState, blob: bytes, size: int, entry_id: int) -> bytes:
        """:meth:`add_entries` for one entry, with less machinery."""
        data = RECORD_HEADER.pack(size, crc32c(blob)) + blob
        log_id, start = self.entry_log.append(data)
        st.recent[entry_id] = (log_id, start, size)
        if entry_id > st.last_entry_id:
            st.last_entry_id = entry_id
        if not st.dirty:
            st.dirty = True
            self._dirty_states.add(st.ledger_id)
        ledgers = self.log_ledgers.get(log_id)
        if ledgers is None or st.ledger_id not in ledgers:
            self.log_ledgers.setdefault(log_id, set()).add(st.ledger_id)
            self._dirty_logs.add(log_id)
        self._count_usage(log_id, st.ledger_id, len(data))
        return data

    def release_log(self, log_id: int) -> None:
        """Compaction moved every live entry out of ``log_id``: the next checkpoint writes
        the new locations, drops the log from the index in the same transaction, and only
        then deletes the file."""
        if log_id == self.entry_log.current_id:
            raise ValueError("the current entry log cannot be released")
        ledgers = self.log_ledgers.get(log_id)
        if ledgers:
            ledgers.clear()
            self._dirty_logs.add(log_id)
        self.log_usage.pop(log_id, None)

    def replay_add(self, st: LedgerState, data: bytes | memoryview, where: str) -> int:
        """Apply a journaled add record's entries; returns the largest LAC they carry."""
        entries, sizes = parse_records(data, where)
        if not entries:
            return -1
        headers = [ENTRY_HEADER.unpack_from(b) for b in entries]
        entry_ids = [h[1] for h in headers]
        self.add_entries(st, entries, sizes, entry_ids, max(entry_ids), bytes(data))
        return int(max(h[2] for h in headers))

    def _read_ahead(
        self, loc: Location, ahead_entries: int, budget_bytes: int
    ) -> list[tuple[int, bytes]] | None:
        """Read-ahead for a batch read: the records after ``loc`` usually hold the next
        entries asked for (a ledger's entries are written in order), so one pread of the
        size of ``ahead_entries`` records like this one (within ``budget_bytes`` and
        ``READ_AHEAD_MAX_BYTES``) reads them instead of a pread each.

        Returns the sound records read, ``(offset, blob)`` in the log's order, the one
        at ``loc`` first; None if that one did not come out whole and sound (it is then
        read alone, which reports why). They go to the batch being answered, not through
        the read cache: a cold read of file data gains nothing from sharing, and the
        cache's bookkeeping per entry cost more than the read itself."""
        log_id, offset, size = loc
        # An eighth more than records of this size take: entry sizes vary a little.
        ahead_bytes = min(
            ahead_entries * (size + RECORD_HEADER_SIZE) * 9 // 8,
            budget_bytes,
            READ_AHEAD_MAX_BYTES,
        )
        if ahead_bytes <= size + RECORD_HEADER_SIZE or ahead_bytes > self.read_cache.max_bytes:
            return None
        records = self.entry_log.read_ahead(log_id, offset, ahead_bytes)
        if not records or records[0][0] != offset or len(records[0][1]) != size:
            return None
        return records

    def read_entries(
        self, st: LedgerState, first_entry_id: int, count: int, max_bytes: int
    ) -> list[bytes]:
        """Entries from ``first_entry_id`` on, stopping at the first missing one, after
        ``count``, or before passing ``max_bytes`` (always at least one).

        BookieIOError if the first entry is damaged or is not the entry asked for; such
        a later entry ends the batch (the reader asks for it next and gets the error then).
        """
        out: list[bytes] = []
        total = 0
        ledger_id = st.ledger_id
        end_entry_id = first_entry_id + max(count, 1)
        locations = _batch_locations(self.index, st, first_entry_id, end_entry_id)
        next_location = locations.__next__
        ahead = _ReadAheadCursor()
        take_ahead = ahead.take
        pack_ids = _IDS.pack
        blob = b""
        try:
            for entry_id in range(first_entry_id, end_entry_id):
                try:
                    loc = next_location()
                    if loc is not None:
                        taken = take_ahead(loc)
                        blob = (
                            taken
                            if taken is not None
                            else self._read_blob(
                                loc, ahead, end_entry_id - entry_id, max_bytes - total
                            )
                        )
                        # A sound record in the wrong place (a stale location, a log
                        # that lost its name) must not be served as this entry.
                        if not blob.startswith(pack_ids(ledger_id, entry_id)):
                            got = _IDS.unpack_from(blob) if len(blob) >= 16 else "a short blob"
                            raise BookieIOError(
                                f"entry log {loc[0]} offset {loc[1]} holds {got}, not this entry"
                            )
                except BookieIOError as exc:  # R9: a damaged index or entry-log record
                    if out:
                        break
                    raise BookieIOError(
                        f"ledger {ledger_id} entry {entry_id}: {exc.message}"
                    ) from exc
                if loc is None:
                    if not out and entry_id <= st.last_entry_id:
                        self._prove_absent(st, entry_id)
                    break
                if out and total + len(blob) > max_bytes:
                    break
                out.append(blob)
                total += len(blob)
        finally:
            locations.close()
        return out

    def _read_blob(
        self, loc: Location, ahead: _ReadAheadCursor, ahead_entries: int, budget_bytes: int
    ) -> bytes:
        """The record at ``loc`` when the last read-ahead does not hold it: from the read
        cache, or read now, with a read-ahead of the records after it when worth it."""
        key = (loc[0], loc[1])
        blob = self.read_cache.get(key)
        if blob is None:
            records = self._read_ahead(loc, ahead_entries, budget_bytes)
            if records is not None:
                ahead.start(loc[0], records)
                blob = records[0][1]
            else:
                blob = self.entry_log.read(*loc)
            # The first of a read stays shared: that is the one a repeated read or
            # another reader of the batch asks for.
            self.read_cache.put(key, blob)
        return blob

    def _prove_absent(self, st: LedgerState, entry_id: int) -> None:
        """R17: ``entry_id`` is below the ledger's last entry, and neither recent adds nor
        the index hold it. It is absent (the bookie was never sent it: striping, a write
        that failed) only if the index holds every record it committed for the ledger,
        sound; otherwise its record may have been lost to damage: BookieIOError.
        One pass over the ledger's index records, then remembered until a checkpoint
        writes more of them."""
        ledger_id = st.ledger_id
        if ledger_id in self._proven_complete:
            return
        try:
            self.index.prove_complete(ledger_id)
        except BookieIOError as exc:
            raise BookieIOError(
                f"ledger {ledger_id} entry {entry_id} is not in the index, below the "
                f"ledger's last entry {st.last_entry_id}, and its absence cannot be proven: "
                f"{exc.message}"
            ) from exc
        self._proven_complete.add(ledger_id)

    def has_entry(self, st: LedgerState, entry_id: int) -> bool:
        """Whether the bookie holds the entry (a damaged index record: not held)."""
        if st.location(entry_id) is not None:
            return True
        try:
            return self.index.get(st.ledger_id, entry_id) is not None
        except BookieIOError:
            return False

    # ------------------------------------------------------------ dropping ledgers

    def drop_ledger(self, ledger_id: int, tombstone: bool) -> None:
        """Forget a ledger's entries; keep a tombstone (deleted) or nothing (collected)."""
        if tombstone:
            st = LedgerState(ledger_id)
            st.deleted = True
            self.states[ledger_id] = st
            self._dropped_states.discard(ledger_id)
            self.mark_dirty(st)
        else:
            self.states.pop(ledger_id, None)
            self._dirty_states.discard(ledger_id)
            self._dropped_states.add(ledger_id)
        self._purge.add(ledger_id)
        self._proven_complete.discard(ledger_id)
        for per_ledger in self.log_usage.values():
            per_ledger.pop(ledger_id, None)
        for log_id, ledgers in self.log_ledgers.items():
            if ledger_id in ledgers:
                ledgers.discard(ledger_id)
                self._dirty_logs.add(log_id)

    # ------------------------------------------------------------ checkpoint

    def capture(self, mark: tuple[int, int], journal_dir: Path) -> CheckpointWork:
        """Step 1, on the loop: everything applied so far, as of journal position ``mark``."""
        sync_logs = self.entry_log.take_unsynced()
        update = IndexUpdate(mark=mark)
        # What the index may point into ends here: past it, the current log holds only
        # what was written after this checkpoint (the journal has it).
        update.log_end = (self.entry_log.current_id, self.entry_log.end_offset)
        update.replace_log_tables = self._rebuilt_log_tables
        update.purge_ledgers = sorted(self._purge)
        self._purge.clear()
        flushed: list[LedgerState] = []
        for ledger_id in sorted(self._dirty_states):
            st = self.states.get(ledger_id)
            if st is None:
                continue
            st.dirty = False
            if st.damaged is None:  # an unknown state is never written as if known
                update.states.append((ledger_id, st.to_bytes()))
            if st.recent or st.flushing:
                if st.flushing:  # a previous commit failed: write both, newest last
                    st.flushing.update(st.recent)
                else:
                    st.flushing = st.recent
                st.recent = {}
                update.entries.append((ledger_id, st.flushing))
                flushed.append(st)
        self._dirty_states.clear()
        update.dropped_states = sorted(self._dropped_states)
        self._dropped_states.clear()
        current = self.entry_log.current_id
        free_logs = [
            log_id
            for log_id, ledgers in self.log_ledgers.items()
            if not ledgers and log_id != current
        ]
        # Logs written since the last checkpoint have new usage to save.
        self._dirty_logs.update(log_id for log_id, _ in sync_logs)
        for log_id in free_logs:
            self.log_ledgers.pop(log_id, None)
            self.log_usage.pop(log_id, None)
            self._dirty_logs.discard(log_id)
        update.dropped_logs = free_logs
        for log_id in sorted(self._dirty_logs):
            ledgers = self.log_ledgers.get(log_id)
            if ledgers is not None:
                update.logs.append((log_id, sorted(ledgers)))
                update.usage.append((log_id, dict(self.log_usage.get(log_id, {}))))
        self._dirty_logs.clear()
        return CheckpointWork(update, sync_logs, free_logs, journal_dir, flushed)

    def commit(self, work: CheckpointWork) -> None:
        """Step 2, on a worker thread (or the opening thread): make it durable."""
        self.entry_log.sync(work.sync_logs)
        self.index.apply(work.update)
        # Committed. What follows only frees space; a failure is retried next time.
        try:
            for log_id in work.free_logs:
                self.entry_log.unlink(log_id)
            work.removed_journal_files = delete_journal_files_before(
                work.journal_dir, work.update.mark[0], self.ops
            )
        except OSError as exc:
            log.warning("checkpoint: could not remove old files: %s", exc)

    def finish(self, work: CheckpointWork, ok: bool, error: BaseException | None = None) -> None:
        """Step 3, on the loop: drop what the index now holds from memory."""
        self.entry_log.forget_rewritten()
        if ok:
            self.failed_checkpoints = 0
            self.last_checkpoint_error = None
        else:
            self.failed_checkpoints += 1
            self.last_checkpoint_error = error
        if ok:
            for st in work.flushed:
                st.flushing = None
                self._proven_complete.discard(st.ledger_id)
            if work.update.replace_log_tables:
                self._rebuilt_log_tables = False
            self.mark = work.update.mark
            for log_id in work.free_logs:
                self.entry_log.forget(log_id)
                self.read_cache.drop_log(log_id)
            self.entry_log.release_rotated()
            return
        # Put everything back so that the next checkpoint writes it again.
        for st in work.flushed:
            self.mark_dirty(st)
        self._purge.update(work.update.purge_ledgers)
        self._dropped_states.update(
            lid for lid in work.update.dropped_states if lid not in self.states
        )
        for ledger_id, _ in work.update.states:
            current = self.states.get(ledger_id)
            if current is not None:
                self.mark_dirty(current)
        for log_id in work.free_logs:
            self.log_ledgers.setdefault(log_id, set())
        self._dirty_logs.update(log_id for log_id, _ in work.update.logs)
        self._dirty_logs.update(work.free_logs)
        self.entry_log.requeue_unsynced(work.sync_logs)
        self.entry_log.release_rotated()

    def close(self) -> None:
        try:
            self.entry_log.close()
        finally:
            self.index.close()


def _batch_locations(
    index: LedgerIndex, st: LedgerState, first_entry_id: int, end_entry_id: int
) -> Generator[Location | None, None, None]:
    """Where the entries ``first_entry_id`` to ``end_entry_id - 1`` of one batch read
    are, one after the other; None for one neither recent adds nor the index hold.

    Recent adds (not yet checkpointed) are looked at first, then the index, whose read
    transaction is opened at the first entry recent adds do not hold. From there the
    locations of the rest of the batch come in one go when the index holds them all (as
    it does for a ledger written long ago), else one lookup per entry. A damaged index
    record (R9) or a failed index read raises BookieIOError, which ends the iteration.
    Close the iterator to end the index's read transaction."""
    ledger_id = st.ledger_id
    # Read once: nothing runs on the loop during a batch read.
    recent = st.recent or None
    flushing = st.flushing or None
    reader = None
    try:
        entry_id = first_entry_id
        while entry_id < end_entry_id:
            loc = recent.get(entry_id) if recent is not None else None
            if loc is None and flushing is not None:
                loc = flushing.get(entry_id)
            if loc is not None:
                yield loc
                entry_id += 1
                continue
            if reader is None:
                reader = index.reader()
                end = min(end_entry_id, st.last_entry_id + 1)
                run = reader.run(ledger_id, entry_id, end - entry_id)
                if run:
                    if recent is None and flushing is None:
                        yield from run  # the usual case for older entries
                        entry_id += len(run)
                        continue
                    for n, loc in enumerate(run):
                        # Recent adds come first, as for every entry.
                        recent_loc = recent.get(entry_id + n) if recent is not None else None
                        if recent_loc is None and flushing is not None:
                            recent_loc = flushing.get(entry_id + n)
                        yield loc if recent_loc is None else recent_loc
                    entry_id += len(run)
                    continue
            yield reader.get(ledger_id, entry_id)
            entry_id += 1
    finally:
        if reader is not None:
            reader.close()


class _ReadAheadCursor:
    """The records of a batch read's last read-ahead (``(offset, blob)`` in the log's
    order, from :meth:`LedgerStorage._read_ahead`) and the next one to look at. A
    ledger's entries follow each other in the log, with other ledgers' records between
    them when written at the same time, so the entry asked for is usually the next
    record, and otherwise a later one: the cursor only moves forward."""

    __slots__ = ("_count", "_log_id", "_next", "_records")

    def __init__(self) -> None:
        self._records: list[tuple[int, bytes]] = []
        self._log_id = -1
        self._next = self._count = 0

    def start(self, log_id: int, records: list[tuple[int, bytes]]) -> None:
        """Records read ahead in entry log ``log_id``; the first one is being served."""
        self._records, self._log_id, self._next = records, log_id, 1
        self._count = len(records)

    def take(self, loc: Location) -> bytes | None:
        """The record at ``loc`` if the read-ahead holds it at or after the cursor (which
        then moves past it), else None."""
        n = self._next
        if n >= self._count or loc[0] != self._log_id:
            return None
        offset = loc[1]
        records = self._records
        record = records[n]
        if record[0] == offset:  # the usual case: the next record
            self._next = n + 1
            return record[1]
        count = self._count
        while n < count and records[n][0] < offset:
            n += 1
        if n < count and records[n][0] == offset:
            self._next = n + 1
            return records[n][1]
        self._next = n
        return None
