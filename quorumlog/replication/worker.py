"""Replication workers of autorecovery: repair the ledgers the auditor marked.

A worker loops over the marked ledgers (``/underreplication/ledgers``). For each it

1. claims the ledger with an ephemeral lock (``/underreplication/locks/<id>``): one
   worker per ledger, and a worker that dies lets go with its session;
2. reads the mark (its version v and the lost bookies) and, for each lost bookie,
   re-replicates what it held with :func:`~quorumlog.replication.replicate_ledger`:
   copy each fragment's entries to a replacement, then compare-and-set the ensemble.
   A copy cut short leaves the metadata as it was (the swap comes last), so
   another worker simply starts that fragment again;
3. clears the mark at version v, so bookies marked meanwhile keep it for a later
   pass; then releases the lock.

A ledger that is not closed keeps its last fragment with its writer, whose ensemble
change (R5) replaces a failed bookie by itself. Only when the mark is older than
``open_ledger_grace_s`` and the last fragment still names the lost bookie does the
worker fence and close the ledger (open with recovery, R7/R8: the writer loses it),
as BookKeeper's ``openLedgerRereplicationGracePeriod`` does, and then repair it whole.
A ledger that cannot be repaired now (no replacement bookie, no bookie that gives its
master key, a failed copy) is retried after ``retry_backoff_s``; the mark stays. A ledger
with entries of which no copy is left anywhere (every other holder said it has none, or
is gone) is recorded lost (``/underreplication/lost``) and logged once, at ERROR, and its
mark is cleared: it is never retried, so it does not hold up the others. A ledger
deleted while it is being repaired is given up at once (logged once) and its mark
cleared: nothing goes on copying it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quorumlog.errors import BKError, NoNodeError
from quorumlog.meta.store import SessionState
from quorumlog.meta.underreplication import (
    ENABLED_PATH,
    LEDGERS_PATH,
    Mark,
    UnderReplicationManager,
)
from quorumlog.replication.report import LedgerOutcome, LedgerReplication
from quorumlog.replication.rereplicate import LEDGERS_IN_FLIGHT_DEFAULT, replicate_ledger
from quorumlog.replication.throttle import RATE_BYTES_PER_S_DEFAULT, CopyThrottle
from quorumlog.replication.waiting import wait_event

if TYPE_CHECKING:
    from quorumlog.client.bookkeeper import BookKeeper
    from quorumlog.meta.store import Watch, WatchEvent

log = logging.getLogger(__name__)

# BookKeeper's openLedgerRereplicationGracePeriod default.
OPEN_LEDGER_GRACE_S_DEFAULT = 30.0
RETRY_BACKOFF_S_DEFAULT = 10.0
# How often a worker looks at the marks without a watch event (a missed event, a
# backoff or a grace period running out).
POLL_INTERVAL_S_DEFAULT = 5.0

# Outcomes after which the lost bookie no longer matters to the ledger.
_DONE = {LedgerOutcome.REPLICATED, LedgerOutcome.DELETED, LedgerOutcome.UNAFFECTED}


@dataclass
class WorkerConfig:
    open_ledger_grace_s: float = OPEN_LEDGER_GRACE_S_DEFAULT
    retry_backoff_s: float = RETRY_BACKOFF_S_DEFAULT
    poll_interval_s: float = POLL_INTERVAL_S_DEFAULT
    # Ledgers one worker repairs at once (each with its own lock).
    ledgers_in_flight: int = LEDGERS_IN_FLIGHT_DEFAULT
    password: bytes = b""
    # The worker's copy rate, across all its ledgers (0: no bound).
    rate_bytes_per_s: int = RATE_BYTES_PER_S_DEFAULT


@dataclass
class WorkerStats:
    ledgers_repaired: int = 0
    ledgers_deferred: int = 0
    ledgers_failed: int = 0
    # Ledgers found with entries of which no copy is left: recorded once, not retried.
    ledgers_lost: int = 0
    fragments_copied: int = 0
    entries_copied: int = 0
    bytes_copied: int = 0
    # Time copies waited for the copy rate's bound.
    throttled_s: float = 0.0
    errors: list[str] = field(default_factory=list)


def grace_over(mark: Mark, now_ms: int, grace_s: float) -> bool:
    """Whether the grace period of an open ledger's writer has run out for ``mark``
    (then its last fragment may be taken by fencing and closing the ledger)."""
    return now_ms - mark.marked_ms >= grace_s * 1000


class ReplicationWorker:
    """One worker on ``bk``'s store; :meth:`run` loops until cancelled."""

    def __init__(
        self,
        bk: BookKeeper,
        identifier: str,
        config: WorkerConfig | None = None,
        *,
        rng: random.Random | None = None,
        stats: WorkerStats | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bk = bk
        self.identifier = identifier
        self.config = config or WorkerConfig()
        # Wall-clock seconds, which marks record too (the simulator's is virtual).
        self.clock = clock
        self.marks = UnderReplicationManager(bk.store, clock=clock)
        # Given by the daemon, the counts go on across its sessions (its metrics).
        self.stats = stats if stats is not None else WorkerStats()
        self.rng = rng or random.Random()
        self.retry_at: dict[int, float] = {}
        self.current: set[int] = set()  # the ledgers being repaired now
        self._wake = asyncio.Event()
        self.throttle = CopyThrottle(self.config.rate_bytes_per_s)

    def _on_event(self, _event: WatchEvent) -> None:
        self._wake.set()

    async def run(self) -> None:
        watches: list[Watch] = [
            self.bk.store.watch(LEDGERS_PATH, self._on_event, children=True),
            self.bk.store.watch(ENABLED_PATH, self._on_event),
        ]
        try:
            while True:
                self._wake.clear()
                if await self.marks.is_enabled():
                    await self.pass_once()
                await wait_event(self._wake, self.config.poll_interval_s)
        finally:
            for w in watches:
                w.cancel()

    async def pass_once(self) -> int:
        """Try every marked ledger once (those not backing off), ``ledgers_in_flight``
        at a time; how many were repaired."""
        ids = await self.marks.marked_ledgers()
        # Workers start from different places so that they do not queue on one lock.
        self.rng.shuffle(ids)
        pending = iter(ids)
        repaired: list[int] = []

        async def lane() -> None:
            for ledger_id in pending:  # shared: each id is taken by one lane
                if not await self._one(ledger_id):
                    return
                repaired.append(ledger_id)

        lanes = [lane() for _ in range(max(1, min(self.config.ledgers_in_flight, len(ids))))]
        await asyncio.gather(*lanes)
        return len(repaired)

    async def _one(self, ledger_id: int) -> bool | None:
        """Claim, repair and release one ledger: True if repaired, None if skipped or
        not repaired now, False to stop the pass (session not live, disabled)."""
        loop = asyncio.get_running_loop()
        if self.retry_at.get(ledger_id, 0.0) > loop.time():
            return None
        if self.bk.store.session_state is not SessionState.CONNECTED:
            return False  # a lock needs a live session
        if not await self.marks.is_enabled():
            return False
        token = await self.marks.claim(ledger_id, self.identifier)
        if token is None:
            return None
        self.current.add(ledger_id)
        try:
            try:
                done = await self.repair(ledger_id)
            except BKError as exc:
                # A store hiccup or a mark that cannot be acted on: this ledger waits
                # its backoff, the others go on.
                log.warning("autorecovery: ledger %d: %s", ledger_id, exc)
                done = False
            if done:
                self.retry_at.pop(ledger_id, None)
                return True
            self.retry_at[ledger_id] = loop.time() + self.config.retry_backoff_s
            return None
        finally:
            self.current.discard(ledger_id)
            with contextlib.suppress(BKError):
                await self.marks.release(ledger_id, token)

    async def repair(self, ledger_id: int) -> bool:
        """Repair one claimed ledger; True when its mark is cleared."""
        try:
            mark = await self.marks.get(ledger_id)
        except NoNodeError:
            return True  # another worker finished it between the listing and the claim
        close_open = grace_over(mark, int(self.clock() * 1000), self.config.open_ledger_grace_s)
        done = True
        deleted = recorded_lost = False
        for bookie in mark.bookies:
            result = await replicate_ledger(
                self.bk,
                ledger_id,
                bookie,
                password=self.config.password,
                close_open_ledgers=close_open,
                throttle=self.throttle,
            )
            self.stats.throttled_s += self.throttle.waited_s
            self.throttle.waited_s = 0.0
            self._count(result)
            if result.outcome is LedgerOutcome.DELETED:
                # Gone, maybe mid-copy (apache/bookkeeper#3316): nothing is left to copy
                # for any of its bookies. Said once, and the mark is cleared below.
                deleted, done = True, True
                log.info(
                    "ledger %d: deleted while being repaired: given up, its mark is cleared",
                    ledger_id,
                )
                break
            if result.outcome is LedgerOutcome.LOST:
                # Trying again cannot help: report it once, loudly, and stop spending
                # work on it (the auditor leaves recorded ledgers unmarked).
                recorded_lost = True
                if await self.marks.record_lost(ledger_id, [bookie], result.error):
                    self.stats.ledgers_lost += 1
                    log.error(
                        "autorecovery: ledger %d is LOST: %s. No bookie holds these entries "
                        "any more; the ledger is no longer retried (shell "
                        "listunderreplicated --lost lists it). Bring back a bookie that "
                        "held them, or delete the ledger",
                        ledger_id,
                        result.error,
                    )
                continue
            if result.outcome not in _DONE:
                done = False
                if result.outcome is LedgerOutcome.OPEN:
                    self.stats.ledgers_deferred += 1
                    log.info(
                        "ledger %d: last fragment left to its writer for %.0f s more",
                        ledger_id,
                        self.config.open_ledger_grace_s
                        - (self.clock() * 1000 - mark.marked_ms) / 1000,
                    )
                else:
                    self.stats.ledgers_failed += 1
                    message = f"ledger {ledger_id} ({bookie}): {result.error or result.outcome}"
                    self.stats.errors = [*self.stats.errors[-19:], message]
                    log.warning("autorecovery: %s", message)
        if not done:
            return False
        if await self.marks.clear(ledger_id, mark.version):
            self.stats.ledgers_repaired += 1
            if not (deleted or recorded_lost):  # those were said at their own level
                log.info("ledger %d: re-replicated (%s)", ledger_id, ", ".join(mark.bookies))
            return True
        # Marked again while we worked: the next pass repairs the bookies added.
        self._wake.set()
        return True

    def _count(self, result: LedgerReplication) -> None:
        self.stats.entries_copied += result.entries_copied
        self.stats.bytes_copied += result.bytes_copied
        self.stats.fragments_copied += sum(1 for f in result.fragments if f.entries_copied)
