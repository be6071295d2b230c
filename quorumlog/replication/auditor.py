"""The auditor of autorecovery: decides which ledgers are under-replicated and marks them.

One auditor runs at a time among the autorecovery processes (the leader of the
election group ``autorecovery-auditor``). While it leads it

- watches the available bookies (writable and read-only). A bookie that some
  ledger names but that is not available is *lost*; once it has been lost for
  longer than the lost-bookie recovery delay (cluster-wide, in the metadata store),
  every ledger with a fragment on it is marked under-replicated, naming it;
- every ``audit_interval_s`` (and when ``quorumlog shell triggeraudit`` asks),
  audits a sample of the closed ledgers (the replica check of
  :func:`~quorumlog.replication.audit_ledger`) and marks each ledger where an
  available bookie misses or holds a damaged copy, naming that bookie. Open
  ledgers are left out: their last copies may still be on their way (Qa < Qw),
  and their last fragment belongs to the writer;
- in the same walk, given a rack- or region-aware placement policy
  (``AuditorConfig.placement``), checks every closed ledger's ensembles against it
  (BookKeeper's placement policy check), logs each one that breaks it, naming the
  ledger and the write set, and marks it under-replicated naming a bookie to move:
  one of two sharing a rack (or region) in a broken write set, when some writable
  bookie outside the ensemble would do better in its place. That bookie is alive:
  the worker copies its share from the other replicas onto a target the policy
  prefers, as a decommission does.

It never copies anything: the replication workers do. The decisions (which
bookies are lost, since when, which ledgers to mark) are pure functions and a small
clock-driven class, :class:`LossTracker`, tested without a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quorumlog.client.placement import placed
from quorumlog.core.placement import PlacementPolicy, bookie_to_move, shortfall, violations
from quorumlog.errors import BKError, NoNodeError, NoSuchLedgerError
from quorumlog.meta.bookies import BOOKIES_PATH
from quorumlog.meta.layout import WALK_READS_PER_S_DEFAULT
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.meta.underreplication import (
    AUDIT_REQUEST_PATH,
    AUDITOR_PATH,
    DELAY_PATH,
    ENABLED_PATH,
    UnderReplicationManager,
)
from quorumlog.replication.audit import audit_ledger
from quorumlog.replication.report import LedgerAudit
from quorumlog.replication.waiting import wait_event

if TYPE_CHECKING:
    from quorumlog.client.bookkeeper import BookKeeper
    from quorumlog.meta.store import Watch, WatchEvent

log = logging.getLogger(__name__)

# BookKeeper checks all ledgers once a week by default; a day suits smaller clusters.
AUDIT_INTERVAL_S_DEFAULT = 86_400.0
# How often the auditor re-reads every ledger's bookies even without a bookie event
# (a missed watch event, a ledger created on a bookie that then went).
BOOKIE_CHECK_INTERVAL_S_DEFAULT = 60.0
# The longest a stopping auditor waits for its node to be deleted.
UNPUBLISH_TIMEOUT_S = 15.0


# ---------------------------------------------------------------- pure decisions


def bookie_index(ledgers: Mapping[int, LedgerMetadata]) -> dict[str, set[int]]:
    """Which ledgers each bookie holds a fragment of."""
    index: dict[str, set[int]] = {}
    for ledger_id, md in ledgers.items():
        for bookie in md.all_bookies():
            index.setdefault(bookie, set()).add(ledger_id)
    return index


def lost_bookies(referenced: Iterable[str], available: Iterable[str]) -> set[str]:
    """Bookies some ledger names that are not available (writable or read-only)."""
    return set(referenced) - set(available)


class LossTracker:
    """Since when each bookie has been lost, by a monotonic clock the caller passes.

    A bookie that comes back is forgotten: a later loss starts the delay again, as a
    restart within the delay must cost no copying.
    """

    def __init__(self) -> None:
        self.lost_since: dict[str, float] = {}

    def observe(self, lost: Iterable[str], now_s: float) -> None:
        current = set(lost)
        for bookie in list(self.lost_since):
            if bookie not in current:
                del self.lost_since[bookie]
        for bookie in current:
            self.lost_since.setdefault(bookie, now_s)

    def due(self, now_s: float, delay_s: float) -> set[str]:
        """Bookies lost for at least ``delay_s``."""
        return {b for b, since in self.lost_since.items() if now_s - since >= delay_s}

    def next_due_in(self, now_s: float, delay_s: float) -> float | None:
        """Seconds until the next bookie becomes due (0 if one is), None if none is lost."""
        if not self.lost_since:
            return None
        return max(0.0, min(since + delay_s - now_s for since in self.lost_since.values()))


def marks_for_lost(index: Mapping[str, set[int]], due: Iterable[str]) -> dict[int, set[str]]:
    """ledger id -> the due lost bookies it names."""
    marks: dict[int, set[str]] = {}
    for bookie in due:
        for ledger_id in index.get(bookie, ()):
            marks.setdefault(ledger_id, set()).add(bookie)
    return marks


def bookies_to_repair(audit: LedgerAudit, available: Iterable[str]) -> set[str]:
    """The available bookies that answered an audit without some copies, or with
    damaged ones. A bookie that did not answer (unreachable), or is not available,
    is the lost-bookie path's business: its delay lets a restart cost no copying."""
    up = set(available) - set(audit.unreachable_bookies)
    bad = {bookie for _, bookie in audit.missing} | {bookie for _, bookie, _ in audit.damaged}
    return bad & up


def placement_moves(
    policy: PlacementPolicy, md: LedgerMetadata, locations: Mapping[str, str]
) -> tuple[list[str], set[str]]:
    """The write sets of ``md``'s ensembles that break ``policy`` (one line each), and
    the bookies to move to mend them (see :func:`~quorumlog.core.placement.bookie_to_move`;
    ``locations`` places the writable bookies). An ensemble with a bookie that is not
    writable now (read-only, or lost: the lost-bookie path's business) is left alone:
    where it stands is not known."""
    broken: list[str] = []
    moves: set[str] = set()
    if policy.name == "random":
        return broken, moves
    for _, ensemble in md.ensembles:
        if any(b not in locations for b in ensemble):
            continue
        found = violations(policy, ensemble, locations, md.write_quorum)
        if not found:
            continue
        broken.extend(found)
        # One move may not mend every write set: plan the next ones on the ensemble as
        # the first would leave it (its target as the workers rank them, first of equals).
        working = list(ensemble)
        for _ in range(len(working)):
            bookie = bookie_to_move(policy, working, locations, md.write_quorum, list(locations))
            if bookie is None or bookie not in ensemble:
                break
            moves.add(bookie)
            slot = working.index(bookie)
            outside = sorted(b for b in locations if b not in working)
            working[slot] = min(
                outside,
                key=lambda b: shortfall(policy, working, slot, b, locations, md.write_quorum),
            )
    return broken, moves


def chosen(fraction: float, rng: random.Random) -> bool:
    """Whether a ledger met during a walk is audited: each with probability ``fraction``
    (a walk never holds the whole list to sample from)."""
    return fraction >= 1.0 or rng.random() < fraction


# ---------------------------------------------------------------- the auditor


@dataclass
class AuditorConfig:
    audit_interval_s: float = AUDIT_INTERVAL_S_DEFAULT
    # The fraction of closed ledgers each periodic audit checks (1: all of them).
    audit_sample_fraction: float = 1.0
    # Metadata reads per second of the walks over every ledger (BP-66); None: no limit.
    metadata_reads_per_s: float | None = WALK_READS_PER_S_DEFAULT
    bookie_check_interval_s: float = BOOKIE_CHECK_INTERVAL_S_DEFAULT
    # Password of the ledgers (needed for MAC digests); one for all, as BookKeeper's
    # autorecovery uses the configured one.
    password: bytes = b""
    # The placement policy closed ledgers are checked against (core/placement.py):
    # random (no check), rack-aware or region-aware.
    placement: str = "random"
    min_racks_per_write_quorum: int = 2


@dataclass
class AuditorStats:
    bookie_checks: int = 0
    audits: int = 0
    ledgers_marked: int = 0
    lost_marked: set[str] = field(default_factory=set)
    # Closed ledgers found, audit after audit, with write sets that break the policy.
    placement_violations: int = 0


class Auditor:
    """Runs while this process leads the auditor election; :meth:`run` returns when
    cancelled (the daemon cancels it on leadership loss)."""

    def __init__(
        self,
        bk: BookKeeper,
        identifier: str,
        config: AuditorConfig | None = None,
        *,
        rng: random.Random | None = None,
        stats: AuditorStats | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bk = bk
        self.identifier = identifier
        self.config = config or AuditorConfig()
        self.policy = PlacementPolicy(self.config.placement, self.config.min_racks_per_write_quorum)
        # Wall-clock seconds, for marks and audit summaries (the simulator's is virtual).
        self.clock = clock
        self.marks = UnderReplicationManager(bk.store, clock=clock)
        self.tracker = LossTracker()
        # Given by the daemon, the counts go on across its sessions (its metrics).
        self.stats = stats if stats is not None else AuditorStats()
        self.rng = rng or random.Random()
        self._wake = asyncio.Event()
        self._audit_task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        watches: list[Watch] = []
        try:
            await self._publish()
            watches.append(self.bk.registry.watch(self._wake.set))
            for path in (DELAY_PATH, ENABLED_PATH):
                watches.append(self.bk.store.watch(path, self._on_event))
            watches.append(self.bk.store.watch(AUDIT_REQUEST_PATH, self._on_audit_request))
            await self._loop()
        finally:
            if self._audit_task is not None:
                self._audit_task.cancel()
                with contextlib.suppress(BKError, asyncio.CancelledError):
                    await self._audit_task
                self._audit_task = None
            for w in watches:
                w.cancel()
            await self._unpublish_to_the_end()

    def _on_event(self, _event: WatchEvent) -> None:
        self._wake.set()

    def _on_audit_request(self, _event: WatchEvent) -> None:
        self._wake.set()

    async def _publish(self) -> None:
        """Who audits, for ``whoisauditor``: an ephemeral node with our identifier. A
        previous auditor's node may still wait for its session to expire."""
        data = self.identifier.encode()
        with contextlib.suppress(NoNodeError):
            await self.bk.store.delete(AUDITOR_PATH)
        await self.bk.store.create(AUDITOR_PATH, data, ephemeral=True)

    async def _unpublish_to_the_end(self) -> None:
        """Unpublish, and wait for it even if cancelled again (bounded): this task
        ending tells the daemon that a next auditor of this process may publish, and an
        unpublish still running then would delete that auditor's node (same data)."""
        loop = asyncio.get_running_loop()
        unpublish = loop.create_task(self._unpublish())
        deadline = loop.time() + UNPUBLISH_TIMEOUT_S
        cancelled = False
        while not unpublish.done() and loop.time() < deadline:
            try:
                await asyncio.wait({unpublish}, timeout=deadline - loop.time())
            except asyncio.CancelledError:
                cancelled = True
        if not unpublish.done():
            unpublish.cancel()
            log.warning("auditor %s: unpublishing took too long; stopped", self.identifier)
        elif not unpublish.cancelled() and (error := unpublish.exception()) is not None:
            # Its node goes with its session anyway (ephemeral).
            level = logging.DEBUG if isinstance(error, BKError) else logging.WARNING
            log.log(level, "auditor %s: unpublishing failed: %r", self.identifier, error)
        if cancelled:
            raise asyncio.CancelledError

    async def _unpublish(self) -> None:
        node = await self.bk.store.get(AUDITOR_PATH)
        if node.data == self.identifier.encode():
            await self.bk.store.delete(AUDITOR_PATH, node.version)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_audit = loop.time() + self.config.audit_interval_s
        next_index = 0.0
        index: dict[str, set[int]] = {}
        available: set[str] = set()
        while True:
            self._wake.clear()
            enabled = await self.marks.is_enabled()
            delay_s = await self.marks.lost_bookie_recovery_delay_s()
            now = loop.time()
            if enabled:
                new_available = await self.available_bookies()
                if new_available != available or now >= next_index:
                    available = new_available
                    index = await self._read_index()
                    next_index = now + self.config.bookie_check_interval_s
                    await self._tidy_lost(index, available)
                self.stats.bookie_checks += 1
                self.tracker.observe(lost_bookies(index, available), now)
                due = self.tracker.due(now, delay_s)
                if due:
                    # Mark from a fresh read: workers may have taken the bookie out of
                    # ledgers since the index was read, and those must not be marked again.
                    index = await self._read_index()
                    next_index = now + self.config.bookie_check_interval_s
                    self.tracker.observe(lost_bookies(index, available), now)
                    due = self.tracker.due(now, delay_s)
                    await self._mark_lost(index, due, available)
                if self._audit_task is not None and self._audit_task.done():
                    self._audit_task.result()  # an error restarts the auditor
                    self._audit_task = None
                requested = await self.bk.store.exists(AUDIT_REQUEST_PATH) is not None
                if self._audit_task is None and (requested or now >= next_audit):
                    if requested:
                        # Taken before the audit starts: a request made during it
                        # gets an audit of its own.
                        with contextlib.suppress(NoNodeError):
                            await self.bk.store.delete(AUDIT_REQUEST_PATH)
                    # Its own task: a long audit must not hold up marking a lost bookie.
                    self._audit_task = loop.create_task(self._audit(set(available)))
                    next_audit = now + self.config.audit_interval_s
            timeout = min(self.config.bookie_check_interval_s, max(0.0, next_audit - loop.time()))
            pending = self.tracker.next_due_in(loop.time(), delay_s)
            if pending is not None:
                # A due bookie already marked stays due: look again at the check interval.
                timeout = min(timeout, pending if pending > 0 else timeout)
            await wait_event(self._wake, max(0.05, timeout))

    async def available_bookies(self) -> set[str]:
        """The registered bookies, writable and read-only, as the store holds them now.
        A bookie missing here counts as lost, and its ledgers are marked once the delay
        is over: a sync comes first (R18), since a lagging server may not list a bookie
        that registered moments ago. The ledger index read after it is as fresh."""
        await self.bk.store.sync(BOOKIES_PATH)
        available = set(await self.bk.registry.writable_bookies())
        available |= set(await self.bk.registry.readonly_bookies())
        return available

    async def _audit(self, available: set[str]) -> None:
        try:
            await self.audit_all(available)
        finally:
            self._wake.set()

    async def _read_index(self) -> dict[str, set[int]]:
        index: dict[str, set[int]] = {}
        walk = self.bk.ledgers.ledgers(reads_per_s=self.config.metadata_reads_per_s)
        async for ledger_id, md, _ in walk:
            for bookie in md.all_bookies():
                index.setdefault(bookie, set()).add(ledger_id)
        return index

    async def _mark_lost(
        self, index: Mapping[str, set[int]], due: set[str], available: set[str]
    ) -> None:
        marked = 0
        recorded = await self._tidy_lost(index, available)
        for ledger_id, bookies in sorted(marks_for_lost(index, due).items()):
            if set(bookies) <= recorded.get(ledger_id, set()):
                continue  # no copy left to make: reported lost once already
            if await self.marks.mark(ledger_id, bookies):
                marked += 1
        if marked:
            log.warning(
                "auditor: bookie(s) %s lost past the recovery delay: %d ledger(s) marked",
                ", ".join(sorted(due)),
                marked,
            )
        self.stats.ledgers_marked += marked
        self.stats.lost_marked |= due

    async def _tidy_lost(
        self, index: Mapping[str, set[int]], available: set[str]
    ) -> dict[int, set[str]]:
        """The ledgers recorded lost, by id, with their lost bookies; records of ledgers
        that no longer name those bookies (deleted, or repaired by hand) are dropped, and
        so are those a lost bookie came back to (registered again: it holds the copies;
        a bookie still missing gets its ledgers marked again, copied from the one back)."""
        recorded: dict[int, set[str]] = {}
        for lost in await self.marks.lost_ledgers():
            still = {b for b in lost.bookies if lost.ledger_id in index.get(b, set())}
            if still and not still & available:
                recorded[lost.ledger_id] = still
            else:
                await self.marks.forget_lost(lost.ledger_id)
        return recorded

    async def audit_all(self, available: set[str]) -> dict[str, object]:
        """The periodic check: audit a sample of the closed ledgers, mark what is bad."""
        started = self.clock()
        listed, closed, audited, marked, failed = 0, 0, 0, 0, 0
        last_closed: int | None = None
        fraction = self.config.audit_sample_fraction
        locations: dict[str, str] = {}
        if self.policy.name != "random":
            locations = placed(await self.bk.registry.writable_locations())
        misplaced = 0
        walk = self.bk.ledgers.ledgers(reads_per_s=self.config.metadata_reads_per_s)
        async for ledger_id, md, _ in walk:
            listed += 1
            if not md.is_closed:
                continue
            closed += 1
            last_closed = ledger_id
            if locations:
                placement = await self._check_placement(md, locations)
                misplaced += placement != "ok"
                marked += placement == "marked"
            if not chosen(fraction, self.rng):
                continue
            audited += 1
            outcome = await self._audit_one(ledger_id, available)
            marked += outcome == "marked"
            failed += outcome == "failed"
        if closed and not audited and last_closed is not None:  # at least one when any
            audited += 1
            outcome = await self._audit_one(last_closed, available)
            marked += outcome == "marked"
            failed += outcome == "failed"
        summary: dict[str, object] = {
            "auditor": self.identifier,
            "started_ms": int(started * 1000),
            "elapsed_ms": int((self.clock() - started) * 1000),
            "ledgers": listed,
            "closed": closed,
            "audited": audited,
            "marked": marked,
            "failed": failed,
        }
        if locations:
            summary["misplaced"] = misplaced
        self.stats.audits += 1
        self.stats.ledgers_marked += marked
        with contextlib.suppress(BKError):
            await self.marks.put_last_audit(summary)
        return summary

    async def _check_placement(self, md: LedgerMetadata, locations: Mapping[str, str]) -> str:
        """Check one closed ledger's ensembles against the placement policy; "ok",
        "broken" (logged, counted, nothing to move) or "marked"."""
        broken, moves = placement_moves(self.policy, md, locations)
        if not broken:
            return "ok"
        if moves:
            # ``locations`` were read when the walk began, which may be long ago (audits
            # of ledgers whose bookies time out): a rack cut off since still looks
            # writable, and a move towards it would only have a worker shift the write
            # set in one rack onto the racks that are left. Plan on the bookies writable
            # now.
            now = placed(await self.bk.registry.writable_locations())
            if now != locations:
                moves = placement_moves(self.policy, md, now)[1]
        self.stats.placement_violations += 1
        log.warning(
            "auditor: ledger %d breaks the %s placement: %s%s",
            md.ledger_id,
            self.policy.name,
            "; ".join(broken),
            f"; marked to move {', '.join(sorted(moves))}" if moves else "; no bookie can mend it",
        )
        if moves and await self.marks.mark(md.ledger_id, moves):
            return "marked"
        return "broken"

    async def _audit_one(self, ledger_id: int, available: set[str]) -> str:
        """Audit one ledger; "marked", "failed" or "ok"."""
        try:
            audit = await audit_ledger(
                self.bk, ledger_id, password=self.config.password, any_password=True
            )
        except NoSuchLedgerError:
            return "ok"
        except BKError as exc:
            log.warning("auditor: ledger %d could not be audited: %s", ledger_id, exc)
            return "failed"
        bad = bookies_to_repair(audit, available)
        recorded = await self.marks.lost_ledger(ledger_id)
        if recorded is not None and set(bad) <= set(recorded.bookies):
            return "ok"  # reported lost already: nothing left to copy from
        if bad and await self.marks.mark(ledger_id, bad):
            return "marked"
        return "ok"
