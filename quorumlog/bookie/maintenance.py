"""A bookie's care of its disks: read-only mode and garbage collection.

Read-only mode refuses adds while a disk is full (measured every
``disk_check_interval_ms`` and at every new entry log, with hysteresis; short of its
reserved space counts as full, :mod:`.disk_checker`), after the
journal failed or an entry-log sync failed (R14: a failed sync is never retried as
if the data were there, so adds stay refused until a restart), or while entry-log
bytes whose write failed wait in memory for a checkpoint to write them again (so
that memory and the journal stop growing). Reads, fences, explicit LACs and deletes
go on unless the journal failed. :attr:`ReadOnlyMode.reason` says why. Listeners
hear of every change (the server moves its registration).

Garbage collection drops the ledgers the server found gone from the metadata store;
the next checkpoint removes their index entries and every entry log left without a
ledger.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from quorumlog.bookie.disk_checker import DiskChecker
from quorumlog.bookie.reads import Reads
from quorumlog.bookie.storage import LedgerStorage
from quorumlog.bookie.timers import Timers

__all__ = ["ReadOnlyListener", "ReadOnlyMode", "drop_dead_ledgers"]

log = logging.getLogger(__name__)

ReadOnlyListener = Callable[[bool], None]

# After a failed entry-log write, checks in a row (checkpoints) that must find the bytes
# written before the bookie takes adds again.
WRITABLE_AFTER_CLEAN_CHECKPOINTS = 2


class ReadOnlyMode:
    """Whether a bookie refuses adds, and why (event loop only).

    ``read_only`` is "a disk is full, the journal failed, or ledger storage cannot
    take writes"; the disk verdict comes from the :class:`DiskChecker` at open and at
    every check, the journal failure from the request side, the storage verdict from
    :meth:`storage_checked`. Listeners are called on every change of ``read_only``.
    """

    def __init__(
        self, disk_checker: DiskChecker, timers: Timers, check_interval_ms: float, data_dir: Path
    ) -> None:
        self.disk_checker = disk_checker
        self.journal_failed = False
        self.storage_failure: str | None = None  # R14: until a restart
        self.write_failure: str | None = None  # until checkpoints write it again
        self._clean_checks = 0  # checks in a row without a write failure since one
        self.operator = False  # set through the admin API, until cleared or a restart
        self.read_only = disk_checker.full
        self._timers = timers
        self._check_interval_ms = check_interval_ms
        self._data_dir = data_dir
        self._listeners: list[ReadOnlyListener] = []

    def add_listener(self, listener: ReadOnlyListener) -> None:
        self._listeners.append(listener)

    def start(self) -> None:
        """Check the disks every ``check_interval_ms`` from now on."""
        self._timers.schedule(self._check_interval_ms, self._disk_tick)

    def journal_failure(self) -> None:
        """The journal failed: adds are refused until a restart (R14)."""
        self.journal_failed = True
        self._update()

    def set_operator(self, read_only: bool) -> None:
        """An operator's read-only mode (BookKeeper's admin API): on top of the other
        reasons, never instead of them, so clearing it cannot hide a failed disk."""
        if read_only != self.operator:
            log.warning(
                "bookie %s: read-only mode %s by an operator",
                self._data_dir,
                "set" if read_only else "cleared",
            )
        self.operator = read_only
        self._update()

    def storage_checked(self, storage: LedgerStorage) -> None:
        """After a checkpoint, or a failed entry-log write: follow ledger storage's verdict.

        A failed entry-log write makes the bookie read-only at once; it becomes writable
        again only after ``WRITABLE_AFTER_CLEAN_CHECKPOINTS`` checks in a row found the
        bytes written (hysteresis): a disk that fails every other write would otherwise
        flap, moving the bookie's registration each time (issue B7)."""
        failure, write_failure = storage.failure, storage.write_failure
        if write_failure is not None:
            self._clean_checks = 0
        elif self.write_failure is not None:
            self._clean_checks += 1
            if self._clean_checks < WRITABLE_AFTER_CLEAN_CHECKPOINTS:
                write_failure = self.write_failure  # not yet: keep the reason
        if failure == self.storage_failure and write_failure == self.write_failure:
            return
        for now, before in ((failure, self.storage_failure), (write_failure, self.write_failure)):
            if now is not None and now != before:
                log.error("bookie %s: refusing adds: %s", self._data_dir, now)
        if write_failure is None and self.write_failure is not None:
            log.warning("bookie %s: entry-log bytes written again", self._data_dir)
        self.storage_failure, self.write_failure = failure, write_failure
        self._update()

    @property
    def reason(self) -> str | None:
        """Why adds are refused, in words; None while they are not."""
        if not self.read_only:
            return None
        reasons = [
            "the journal failed; restart the bookie" if self.journal_failed else None,
            self.storage_failure,
            self.write_failure,
            self.disk_checker.why_full,
            "set by an operator" if self.operator else None,
        ]
        return "; ".join(r for r in reasons if r)

    def _update(self) -> None:
        read_only = (
            self.disk_checker.full
            or self.operator
            or self.journal_failed
            or self.storage_failure is not None
            or self.write_failure is not None
        )
        if read_only == self.read_only:
            return
        self.read_only = read_only
        for listener in list(self._listeners):
            try:
                listener(read_only)
            except Exception:
                log.exception("read-only listener failed")

    def check_disks(self) -> None:
        """Measure the disks now (the timer, and every new entry log: a fast writer
        fills a small disk between two ticks)."""
        try:
            if self.disk_checker.check():
                self._update()
        except OSError as exc:
            log.warning("bookie %s: disk check failed: %s", self._data_dir, exc)

    def _disk_tick(self) -> None:
        if self._timers.stopped:
            return
        self.check_disks()
        self._timers.schedule(self._check_interval_ms, self._disk_tick)


def drop_dead_ledgers(
    storage: LedgerStorage, reads: Reads, live_ledger_ids: Iterable[int], snapshot: set[int]
) -> int:
    """Drop the ledgers of ``snapshot`` that are not live (tombstones stay); how many."""
    live = set(live_ledger_ids)
    states = storage.states
    dropped = 0
    for ledger_id in snapshot:
        if ledger_id in live:
            continue
        st = states.get(ledger_id)
        if st is None or st.deleted:
            continue
        reads.drop(ledger_id)
        storage.drop_ledger(ledger_id, tombstone=False)
        dropped += 1
    return dropped
