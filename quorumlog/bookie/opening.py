"""Opening a bookie's files: directory locks, ledger storage, journal replay.

:func:`open_storage` locks the data and journal directories (one bookie process per
directory), checks their cookies, opens ledger storage, replays the journal from the
checkpoint mark into it, starts a new journal file and checkpoints, so the old
journal files go before the first request is taken. Damage the journal scan finds
stops the start, unless it lies in the last batch or ``journal_skip_corruption`` is
set (:func:`quorumlog.bookie.journal.replay.scan`; docs/STORAGE.md, Replay). Damage in the
last batch is cut off (its bytes kept beside the file); what the batch's manifest
proves is kept, and the entries it names that replay could not read are recorded as
unknown (:mod:`.suspicion`), durably before the cut.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from pathlib import Path
from typing import NamedTuple

import lmdb

from quorumlog.bookie import suspicion
from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.cookie import check_directories
from quorumlog.bookie.disk_checker import DiskChecker, ReservedSpace
from quorumlog.bookie.errors import BookieStartError
from quorumlog.bookie.fileops import REAL_FILES, FileOps
from quorumlog.bookie.journal import format as journal_format
from quorumlog.bookie.journal import replay as journal_replay
from quorumlog.bookie.journal.format import list_journal_ids
from quorumlog.bookie.journal.replay import JournalCorruptionError, ScanReport
from quorumlog.bookie.journal.writer import Journal
from quorumlog.bookie.ledger_changes import raise_explicit_lac
from quorumlog.bookie.storage import LedgerStorage
from quorumlog.errors import BKError

__all__ = ["DirectoryLocks", "OpenedStorage", "open_storage", "replay"]

log = logging.getLogger(__name__)

_LOCK_FILE_NAME = "LOCK"


class DirectoryLocks:
    """flock of each directory a bookie runs on, held until :meth:`release`."""

    def __init__(self, ops: FileOps = REAL_FILES) -> None:
        self._ops = ops
        self._fds: list[int] = []

    def lock(self, directory: Path) -> None:
        path = directory / _LOCK_FILE_NAME
        try:
            fd = self._ops.lock(path)
        except BlockingIOError:
            raise BookieStartError(
                f"directory {directory} is in use by another bookie process (lock {path})"
            ) from None
        self._fds.append(fd)

    def release(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                self._ops.close(fd)
        self._fds.clear()


class OpenedStorage(NamedTuple):
    storage: LedgerStorage
    journal: Journal  # not started yet
    disk_checker: DiskChecker  # checked once


def open_storage(
    config: BookieConfig,
    data_dir: Path,
    journal_dir: Path,
    locks: DirectoryLocks,
    report: ScanReport,
    ops: FileOps = REAL_FILES,
) -> OpenedStorage:
    """Lock, check, open and replay; ends with a checkpoint. The caller releases ``locks``
    if this raises (every failure is a :class:`BookieStartError` with the reason)."""
    locked: set[Path] = set()
    for name, directory in (("data", data_dir), ("journal", journal_dir)):
        try:
            ops.mkdir(directory)
        except OSError as exc:
            raise BookieStartError(f"{name} directory {directory}: {exc}") from None
        if directory.resolve() not in locked:  # the journal may share the data directory
            locks.lock(directory)
            locked.add(directory.resolve())
    problem = check_directories(data_dir, journal_dir)
    if problem:
        raise BookieStartError(f"bookie {data_dir}: {problem}")
    # The reserved space goes first: the replay and its checkpoint may need its room
    # (issue B4). The disk checker sets it aside again at the end.
    reserve = ReservedSpace([data_dir, journal_dir], config.reserved_space_bytes, ops, ops.device)
    try:
        released = reserve.release()
    except OSError as exc:
        raise BookieStartError(f"bookie {data_dir}: releasing the reserved space: {exc}") from None
    try:
        storage = LedgerStorage(
            data_dir,
            entry_log_max_bytes=config.entry_log_max_bytes,
            entry_log_write_buffer_bytes=config.entry_log_write_buffer_bytes,
            entry_log_page_cache_max_bytes=config.entry_log_page_cache_max_bytes,
            entry_log_direct_io=config.entry_log_direct_io,
            read_cache_max_bytes=config.read_cache_max_bytes,
            index_map_size_bytes=config.index_map_size_bytes,
            ops=ops,
        )
    except (BKError, OSError) as exc:
        raise BookieStartError(f"ledger storage in {data_dir}: {exc}") from None
    journal: Journal | None = None
    # Nothing else reads the index while the bookie starts: a full map may grow.
    storage.index.grow_when_full = True
    try:
        replay(storage, journal_dir, config.journal_skip_corruption, report, data_dir)
        existing = list_journal_ids(journal_dir, ops)
        last = max([*existing, storage.mark[0] if storage.mark else 0])
        journal = Journal(
            journal_dir,
            last + 1,
            sync=config.journal_sync,
            max_group_wait_ms=config.journal_max_group_wait_ms,
            max_batch_bytes=config.journal_max_batch_bytes,
            max_batch_records=config.journal_max_batch_records,
            file_max_bytes=config.journal_file_max_bytes,
            remove_pages_from_cache=config.journal_remove_pages_from_cache,
            direct_io=config.journal_direct_io,
            prealloc_bytes=config.journal_prealloc_bytes,
            ops=ops,
        )
        # Everything replayed goes to ledger storage now, and the old journal files go.
        work = storage.capture(journal.mark, journal_dir)
        storage.commit(work)
        storage.finish(work, True)
        disk_checker = DiskChecker(
            [data_dir, journal_dir],
            config.disk_usage_threshold,
            config.disk_usage_lwm_threshold,
            usage_fn=ops.disk_usage,
            device_fn=ops.device,
            reserve=reserve,
        )
        disk_checker.check()
        storage.index.grow_when_full = False
    except BaseException as exc:
        if journal is not None:
            journal.abandon()
        storage.close()
        if isinstance(exc, JournalCorruptionError):
            raise BookieStartError(exc.message) from None
        if isinstance(exc, BKError | OSError):
            raise BookieStartError(
                f"bookie {data_dir}: opening failed: {exc}{_no_space_hint(exc, released)}"
            ) from None
        if isinstance(exc, lmdb.Error):
            raise BookieStartError(
                f"bookie {data_dir}: the index (LMDB) failed while opening: {exc!r}; the "
                "journal is kept, so nothing acknowledged is lost: fix the cause (space, "
                "index_map_size_bytes) and start again"
            ) from exc
        raise
    # Replayed fences were synced before the crash or close: no fencing read waits again.
    for st in storage.states.values():
        st.fence_durable = st.fenced
    return OpenedStorage(storage, journal, disk_checker)


def _no_space_hint(exc: BaseException, released: int) -> str:
    """What to do when a start failed for want of space (ENOSPC anywhere in the chain)."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno == errno.ENOSPC:
            return (
                f" (the disk is full even with the {released} reserved bytes released and "
                f"the entry logs' copies of the journal removed: free some space or grow "
                f"the filesystem, then start again; nothing acknowledged is lost, the "
                f"journal is kept)"
            )
        cause = cause.__cause__ or cause.__context__
    return ""


def replay(
    storage: LedgerStorage,
    journal_dir: Path,
    skip_corruption: bool,
    report: ScanReport,
    data_dir: Path,
) -> None:
    """Apply the journal records after the checkpoint mark to ``storage`` (idempotent)."""
    states = storage.states
    ops = storage.ops
    found, generation = suspicion.load(data_dir, ops)
    records = journal_replay.scan(
        journal_dir, storage.mark, skip_corruption, report, ops, defer_cuts=True
    )
    for kind, payload in records:
        if (
            kind == journal_format.RECORD_MANIFEST
            or kind == journal_format.RECORD_UNCLOSED_MANIFEST
        ):
            # Only a batch closed by its manifest may have been acknowledged.
            _apply_manifest(storage, payload, report, kind == journal_format.RECORD_MANIFEST)
            continue
        ledger_id = journal_format.decode_ledger(payload)
        st = states.get(ledger_id)
        if kind == journal_format.RECORD_DELETE:
            storage.drop_ledger(ledger_id, tombstone=True)
            continue
        if st is None:
            st = storage.create_state(ledger_id)
        elif st.deleted:
            continue  # nothing may follow a delete; ignore rather than revive
        if kind == journal_format.RECORD_ADD:
            where = f"journal add record of ledger {ledger_id}"
            lac = storage.replay_add(st, payload[8:], where)
            if lac > st.lac:
                st.lac = lac
        elif kind == journal_format.RECORD_MASTER_KEY:
            st.master_key = bytes(payload[8:])
            storage.mark_dirty(st)
        elif kind == journal_format.RECORD_FENCE:
            st.fenced = True
            storage.mark_dirty(st)
        elif kind == journal_format.RECORD_LAC:
            _, lac = journal_format.decode_ledger_lac(payload)
            raise_explicit_lac(storage, st, lac)  # no poll is parked before the start
    # Ranges kept from earlier starts, less the ledgers gone and the entries held again.
    suspicion.restore(storage, found)
    now = suspicion.ranges(storage)
    if report.manifests and report.pending_cuts:
        # What a manifest proved is durable before the bytes that prove it go: a crash
        # after the cut must not start without it.
        mark = storage.mark or (report.first_file_id, journal_format.FILE_HEADER_SIZE)
        work = storage.capture(mark, journal_dir)
        storage.commit(work)
        storage.finish(work, True)
    if now != found:
        suspicion.save(data_dir, now, generation, ops)
    journal_replay.cut_torn_tails(report, ops)
    if report.suspect:
        log.error(
            "bookie %s: a damaged journal batch held entries that replay could not read "
            "(ledger, first, last): %s; they are answered as unknown (I/O error), never "
            "as absent, until a recovery writes them again or the ledger goes",
            data_dir,
            report.suspect,
        )
    if report.records or report.truncated or report.skipped:
        log.info(
            "bookie %s: replayed %d journal records from %s (torn tails cut: %s, "
            "damaged ranges skipped: %s)",
            data_dir,
            report.records,
            storage.mark,
            report.truncated or "none",
            report.skipped or "none",
        )


def _apply_manifest(
    storage: LedgerStorage, payload: memoryview, report: ScanReport, entries_suspect: bool
) -> None:
    """Apply what a damaged batch's manifest proves: changes safe to apply even if they
    were never acknowledged (each was asked for), and, with ``entries_suspect`` (the
    batch may have been acknowledged), its entries as unknown."""
    states = storage.states
    for facts in journal_format.decode_manifest(payload):
        ledger_id = facts.ledger_id
        if facts.deleted:
            storage.drop_ledger(ledger_id, tombstone=True)
            continue
        st = states.get(ledger_id)
        if st is None:
            st = storage.create_state(ledger_id)
        elif st.deleted:
            continue
        if facts.master_key is not None and st.master_key is None:
            st.master_key = facts.master_key
            storage.mark_dirty(st)
        if facts.fenced and not st.fenced:
            st.fenced = True
            storage.mark_dirty(st)
        if facts.explicit_lac is not None:
            raise_explicit_lac(storage, st, facts.explicit_lac)
        if facts.last_entry_id < 0 or not entries_suspect:
            continue
        recorded = suspicion.note(storage, st, facts.first_entry_id, facts.last_entry_id)
        if recorded is not None and (ledger_id, *recorded) not in (report.suspect or []):
            report.suspect = [*(report.suspect or []), (ledger_id, *recorded)]
