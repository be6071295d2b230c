"""Re-replication of a lost bookie's data (BookKeeper's ``bookkeeper shell recover``).

When a bookie is gone for good, every entry it stored has one copy fewer than its
write quorum. :func:`recover_bookie` restores the count: for each ledger whose
ensembles name the lost bookie, and for each fragment that names it, it

1. chooses a replacement among the writable bookies that are not in that
   fragment's ensemble (the one with the fewest entries given to it by this run,
   ties broken at random; with the client's rack- or region-aware placement, first
   those that keep the fragment's write sets within the policy), never the lost
   bookie itself;
2. copies every entry of the fragment whose write set holds the lost bookie's
   index (R1), reading it from the other replicas of its write set, with each copy
   checked against the entry digest (a damaged copy is skipped for another one,
   R9), and writing the stored blob unchanged, byte for byte, to the replacement
   with recovery adds (the ledger's master key, R10; accepted even if the ledger
   is fenced, R7). Reads and adds are pipelined, a bounded number of chunks in
   flight, and the replacement acknowledges only what it has made durable (R2);
3. only then compare-and-sets the ledger metadata: the lost bookie is replaced by
   the new one in that fragment, on the metadata as re-read (a concurrent close, an
   ensemble change or another recovery is kept; a version conflict is retried
   from a fresh read).

Closed ledgers are recovered whole. A ledger that is not closed (OPEN or
IN_RECOVERY) has every fragment recovered except the last one: the last fragment
belongs to the writer (its ensemble change replaces a failed bookie, R5) or to the
client recovering it. Its result says so (outcome ``open``), and a later run
finishes the job once the writer has moved on or the ledger is closed. Options:
``skip_open_ledgers`` leaves such ledgers untouched, and ``close_open_ledgers``
does what BookKeeper's recover does when the last fragment names the lost bookie:
open the ledger with recovery (fencing its writer, R7/R8, which then loses the
ledger) and recover it whole.

Nothing here fences, except ``close_open_ledgers``. Every request has a timeout,
every retry loop a bound: a run always ends. A ledger deleted while it is being
recovered is reported as deleted; a fragment that another run replaced meanwhile
is reported as such; failures are results, never exceptions.

Example::

    from quorumlog.aio import BookKeeper
    from quorumlog.replication import recover_bookie

    async with await BookKeeper.connect() as bk:
        report = await recover_bookie(bk, "127.0.0.1:3181")
        print(report.summary())
        if report.complete:
            ...  # no ledger references 127.0.0.1:3181 any more
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from quorumlog.client.placement import placed
from quorumlog.errors import (
    BKError,
    InvalidArgumentError,
    MetadataError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    UnauthorizedError,
)
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.meta.ledgers import LEDGERS_PATH
from quorumlog.proto.entry import EntryCodec
from quorumlog.replication.copy import (
    CHUNK_BYTES_DEFAULT,
    COPIES_IN_FLIGHT_DEFAULT,
    ENTRIES_PER_CHUNK_DEFAULT,
    EntriesLostError,
    FragmentCopier,
    ReplacementFailed,
    RereplicationError,
    all_or_cancel,
)
from quorumlog.replication.metadata import (
    LedgerAccess,
    LedgerKeyUnavailableError,
    ledger_access,
    metadata_call,
    read_ledger_metadata,
    swap_replacement,
)
from quorumlog.replication.plan import Fragment, entries_held, fragments_naming, left_to_writer
from quorumlog.replication.report import (
    FragmentReplication,
    FragmentStatus,
    LedgerOutcome,
    LedgerReplication,
    RecoveryReport,
)
from quorumlog.replication.throttle import CopyThrottle

if TYPE_CHECKING:
    from quorumlog.client.bookkeeper import BookKeeper


LEDGERS_IN_FLIGHT_DEFAULT = 2
# How many replacement bookies a fragment may try when a replacement fails mid-copy.
REPLACEMENT_ATTEMPTS_DEFAULT = 3
# Passes over one ledger: a pass may uncover work a concurrent writer created (its
# ensemble change turned the last fragment into an earlier one, or it closed).
_PASSES_MAX = 4


# ---------------------------------------------------------------- public entry points


async def recover_bookie(
    bk: BookKeeper,
    lost_bookie: str,
    *,
    ledger_ids: Iterable[int] | None = None,
    dry_run: bool = False,
    skip_open_ledgers: bool = False,
    close_open_ledgers: bool = False,
    password: bytes = b"",
    passwords: Mapping[int, bytes] | None = None,
    ledgers_in_flight: int = LEDGERS_IN_FLIGHT_DEFAULT,
    copies_in_flight: int = COPIES_IN_FLIGHT_DEFAULT,
    entries_per_chunk: int = ENTRIES_PER_CHUNK_DEFAULT,
    chunk_bytes: int = CHUNK_BYTES_DEFAULT,
    replacement_attempts: int = REPLACEMENT_ATTEMPTS_DEFAULT,
    throttle: CopyThrottle | None = None,
    progress: Callable[[LedgerReplication], None] | None = None,
) -> RecoveryReport:
    """Re-replicate every entry ``lost_bookie`` (``host:port``) held, ledger by ledger.

    Looks at every ledger (or only ``ledger_ids``), and recovers those whose
    ensembles name the bookie, ``ledgers_in_flight`` at a time; see the module
    docstring for how. ``dry_run`` changes nothing and reports what would be copied
    where. ``password`` is the ledgers' password (``passwords`` per ledger id
    overrides it); a ledger with another one fails with UnauthorizedError in its
    result. ``throttle`` bounds the copy rate (none by default). ``progress`` is called
    with each ledger's result as it completes.

    Raises InvalidArgumentError for bad arguments and MetadataError if the ledger
    list cannot be read; everything else is in the report.
    """
    started = time.monotonic()
    _check_recover_arguments(lost_bookie, skip_open_ledgers, close_open_ledgers, ledgers_in_flight)
    run = _Run(
        bk,
        lost_bookie,
        copies_in_flight=copies_in_flight,
        entries_per_chunk=entries_per_chunk,
        chunk_bytes=chunk_bytes,
        replacement_attempts=replacement_attempts,
        throttle=throttle,
    )
    explicit = ledger_ids is not None
    # R18: a ledger a lagging server does not have yet would be left out (or reported
    # deleted), and a report that no ledger names the bookie lets it be forgotten.
    await metadata_call(bk, bk.store.sync(LEDGERS_PATH), "sync")
    # A scan walks the layout a level at a time (never the whole cluster's ids in one
    # list); explicit ids are few.
    ids: AsyncIterator[int] = (
        bk.ledgers.ledger_ids() if ledger_ids is None else _each(sorted(set(ledger_ids)))
    )
    registered = await _is_registered(bk, lost_bookie)

    def recover_one(ledger_id: int) -> Awaitable[LedgerReplication | None]:
        return run.ledger(
            ledger_id,
            (passwords or {}).get(ledger_id, password),
            dry_run=dry_run,
            skip_open_ledgers=skip_open_ledgers,
            close_open_ledgers=close_open_ledgers,
            scanning=not explicit,
        )

    results, scanned = await _recover_each(bk, ids, recover_one, ledgers_in_flight, progress)
    return RecoveryReport(
        bookie=lost_bookie,
        dry_run=dry_run,
        ledgers_scanned=scanned,
        ledgers=results,
        bookie_registered=registered,
        elapsed_ms=(time.monotonic() - started) * 1000,
        only_ledgers_asked=explicit,
    )


def _check_recover_arguments(
    lost_bookie: str, skip_open_ledgers: bool, close_open_ledgers: bool, ledgers_in_flight: int
) -> None:
    _check_address(lost_bookie)
    if skip_open_ledgers and close_open_ledgers:
        raise InvalidArgumentError("skip_open_ledgers and close_open_ledgers exclude each other")
    if ledgers_in_flight < 1:
        raise InvalidArgumentError("ledgers_in_flight must be at least 1")


async def _is_registered(bk: BookKeeper, bookie: str) -> bool:
    """Whether ``bookie`` is registered, writable or read-only."""
    return bookie in await _registered(bk)


async def _registered(bk: BookKeeper) -> set[str]:
    """The registered bookies, writable and read-only."""
    writable = await metadata_call(bk, bk.registry.writable_bookies(), "bookies")
    return set(writable) | set(await metadata_call(bk, bk.registry.readonly_bookies(), "bookies"))


async def _each(ids: list[int]) -> AsyncIterator[int]:
    for ledger_id in ids:
        yield ledger_id


async def _recover_each(
    bk: BookKeeper,
    ids: AsyncIterator[int],
    recover_one: Callable[[int], Awaitable[LedgerReplication | None]],
    ledgers_in_flight: int,
    progress: Callable[[LedgerReplication], None] | None,
) -> tuple[list[LedgerReplication], int]:
    """``recover_one`` for every id, ``ledgers_in_flight`` at a time; the results (None
    left out) by ledger id, and how many ids there were."""
    results: list[LedgerReplication] = []
    taking = asyncio.Lock()  # one walk, shared: each id is taken by one worker
    scanned = 0

    async def next_id() -> int | None:
        nonlocal scanned
        async with taking:
            try:
                ledger_id = await metadata_call(bk, anext(ids), "the ledger list")
            except StopAsyncIteration:
                return None
            scanned += 1
            return ledger_id

    async def worker() -> None:
        while (ledger_id := await next_id()) is not None:
            result = await recover_one(ledger_id)
            if result is None:
                continue
            results.append(result)
            if progress is not None:
                progress(result)

    await all_or_cancel([worker() for _ in range(ledgers_in_flight)])
    results.sort(key=lambda r: r.ledger_id)
    return results, scanned


async def replicate_ledger(
    bk: BookKeeper,
    ledger_id: int,
    lost_bookie: str,
    *,
    password: bytes = b"",
    dry_run: bool = False,
    skip_open_ledgers: bool = False,
    close_open_ledgers: bool = False,
    copies_in_flight: int = COPIES_IN_FLIGHT_DEFAULT,
    entries_per_chunk: int = ENTRIES_PER_CHUNK_DEFAULT,
    chunk_bytes: int = CHUNK_BYTES_DEFAULT,
    replacement_attempts: int = REPLACEMENT_ATTEMPTS_DEFAULT,
    throttle: CopyThrottle | None = None,
) -> LedgerReplication:
    """Re-replicate what ``lost_bookie`` held of one ledger (see :func:`recover_bookie`).

    Never raises for bookie or metadata failures: they are in the result
    (``outcome`` FAILED, DELETED, ...).
    """
    _check_address(lost_bookie)
    if skip_open_ledgers and close_open_ledgers:
        raise InvalidArgumentError("skip_open_ledgers and close_open_ledgers exclude each other")
    run = _Run(
        bk,
        lost_bookie,
        copies_in_flight=copies_in_flight,
        entries_per_chunk=entries_per_chunk,
        chunk_bytes=chunk_bytes,
        replacement_attempts=replacement_attempts,
        throttle=throttle,
    )
    # R18: "deleted" or "unaffected" clears the ledger's under-replication mark; a
    # lagging server would say so of a ledger it does not have yet, or of an ensemble
    # as it was before a change.
    try:
        await metadata_call(bk, bk.store.sync(LEDGERS_PATH), "sync")
    except BKError as exc:
        return LedgerReplication(
            ledger_id=ledger_id,
            outcome=LedgerOutcome.FAILED,
            error=f"ledger {ledger_id}: the metadata store could not be synced: {exc.message}",
            references_bookie=True,
        )
    result = await run.ledger(
        ledger_id,
        password,
        dry_run=dry_run,
        skip_open_ledgers=skip_open_ledgers,
        close_open_ledgers=close_open_ledgers,
        scanning=False,
    )
    assert result is not None  # only a scan leaves ledgers out
    return result


def _check_address(address: str) -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise InvalidArgumentError(f"bad bookie address {address!r}: expected host:port")


# ---------------------------------------------------------------- one run


class _Run:
    """State shared by the ledgers of one run: placement counts, bookies found down."""

    def __init__(
        self,
        bk: BookKeeper,
        lost_bookie: str,
        *,
        copies_in_flight: int,
        entries_per_chunk: int,
        chunk_bytes: int,
        replacement_attempts: int,
        throttle: CopyThrottle | None,
    ) -> None:
        if copies_in_flight < 1 or entries_per_chunk < 1 or chunk_bytes < 1:
            raise InvalidArgumentError(
                "copies_in_flight, entries_per_chunk and chunk_bytes must be at least 1"
            )
        if replacement_attempts < 1:
            raise InvalidArgumentError("replacement_attempts must be at least 1")
        self.bk = bk
        self.config = bk.config
        self.lost = lost_bookie
        self.copies_in_flight = copies_in_flight
        self.entries_per_chunk = entries_per_chunk
        self.chunk_bytes = chunk_bytes
        self.replacement_attempts = replacement_attempts
        # No bound unless given one (autorecovery's workers are: WorkerConfig).
        self.throttle = throttle or CopyThrottle(0)
        # Entries handed to each replacement so far: the next one goes to the least loaded.
        self.assigned: Counter[str] = Counter()
        # Replicas that failed to answer (refused, timed out) during this run: not asked
        # again, so that a hung bookie costs one timeout, not one per chunk.
        self.down: dict[str, str] = {}
        # Replacements that failed mid-copy: not chosen again in this run.
        self.bad_targets: set[str] = set()

    # ------------------------------------------------------------ one ledger

    async def ledger(
        self,
        ledger_id: int,
        password: bytes,
        *,
        dry_run: bool,
        skip_open_ledgers: bool,
        close_open_ledgers: bool,
        scanning: bool,
    ) -> LedgerReplication | None:
        """Recover one ledger; None when scanning and the ledger does not concern us."""
        started = time.monotonic()
        result = LedgerReplication(ledger_id=ledger_id, outcome=LedgerOutcome.REPLICATED)
        try:
            try:
                md, _ = await read_ledger_metadata(self.bk, ledger_id)
            except NoSuchLedgerError:
                if scanning:
                    return None  # deleted between the listing and now
                raise
            if self.lost not in md.all_bookies():
                if scanning:
                    return None
                result.outcome, result.state = LedgerOutcome.UNAFFECTED, md.state.value
                return result
            await self._replicate(
                result, md, password, dry_run, skip_open_ledgers, close_open_ledgers
            )
        except NoSuchLedgerError:
            result.outcome, result.references_bookie = LedgerOutcome.DELETED, False
            result.error = f"ledger {ledger_id} does not exist (deleted)"
        except BKError as exc:
            result.outcome, result.error = LedgerOutcome.FAILED, exc.message
            result.references_bookie = True
        finally:
            result.elapsed_ms = (time.monotonic() - started) * 1000
        return result

    async def _replicate(
        self,
        result: LedgerReplication,
        md: LedgerMetadata,
        password: bytes,
        dry_run: bool,
        skip_open_ledgers: bool,
        close_open_ledgers: bool,
    ) -> None:
        ledger_id = md.ledger_id
        result.state = md.state.value
        # The password given, or the master key from a bookie (H1): a repair heals every
        # ledger whatever its password.
        try:
            access = await ledger_access(self.bk, md, password, frozenset({self.lost, *self.down}))
        except LedgerKeyUnavailableError as exc:
            # No key, and maybe no copy either: every bookie that could hold the lost
            # index's entries is gone. Then the ledger is lost whatever its password
            # (reported once), not a repair to retry for ever.
            if not await self._no_copy_left(md, exc.absent):
                raise
            await self._lost_not_deleted(ledger_id)
            result.outcome, result.references_bookie = LedgerOutcome.LOST, True
            result.error = (
                f"entries with no copy left: every other bookie of the fragments naming "
                f"{self.lost} is gone or holds no such ledger ({exc.message})"
            )
            return
        if not md.is_closed and skip_open_ledgers:
            result.outcome, result.references_bookie = LedgerOutcome.SKIPPED_OPEN, True
            return
        close_first = not md.is_closed and close_open_ledgers and self.lost in md.last_ensemble
        if dry_run:
            await self._plan_ledger(result, md, close_first)
            return
        if close_first:
            md = await self._close_by_recovery(ledger_id, access)
            result.state = md.state.value
        codec, key = access.codec, access.key
        failed = False
        for _ in range(_PASSES_MAX):
            # The last fragment of a ledger that is not closed is open-ended: its
            # writer (or the client recovering it) owns it.
            work = [f for f in fragments_naming(md, self.lost) if f.last is not None]
            if not work:
                break
            for fragment in work:
                done = await self._fragment(md, fragment, codec, key)
                result.fragments.append(done)
                failed = failed or done.status in (FragmentStatus.FAILED, FragmentStatus.LOST)
            md, _ = await read_ledger_metadata(self.bk, ledger_id)
            if failed:
                break
        result.state = md.state.value
        left = fragments_naming(md, self.lost)
        result.references_bookie = bool(left)
        lost = [f for f in result.fragments if f.status is FragmentStatus.LOST]
        if lost:
            await self._lost_not_deleted(ledger_id)
            result.outcome = LedgerOutcome.LOST
            result.error = "entries with no copy left: " + "; ".join(f.error for f in lost)
        elif failed:
            result.outcome = LedgerOutcome.FAILED
            result.error = "some fragment could not be recovered; run again once fixed"
        elif left:
            for fragment in left:
                result.fragments.append(left_to_writer(fragment))
            if md.is_closed:  # closed under us after the last pass: a run again finishes it
                result.outcome = LedgerOutcome.FAILED
                result.error = "the ledger changed while being recovered; run again"
            else:
                result.outcome = LedgerOutcome.OPEN

    async def _lost_not_deleted(self, ledger_id: int) -> None:
        """A ledger deleted while it was copied reads as lost (its copies are being
        purged): only a read after a sync (R18) can call it lost rather than gone;
        NoSuchLedgerError when it is gone."""
        await metadata_call(self.bk, self.bk.store.sync(LEDGERS_PATH), "sync")
        await read_ledger_metadata(self.bk, ledger_id)

    async def _no_copy_left(self, md: LedgerMetadata, absent: frozenset[str]) -> bool:
        """Whether no bookie but the lost one can hold an entry it held: each other
        bookie of every closed fragment naming it (with entries there) said it holds no
        such ledger, or is registered neither writable nor read-only (R17: a bookie never
        calls absent what it acknowledged). False when nothing is left to copy."""
        work = [
            f
            for f in fragments_naming(md, self.lost)
            if f.last is not None and entries_held(md, f) > 0
        ]
        if not work:
            return False
        present = await _registered(self.bk) - absent
        return all(b == self.lost or b not in present for f in work for b in f.ensemble)

    async def _plan_ledger(
        self, result: LedgerReplication, md: LedgerMetadata, close_first: bool
    ) -> None:
        """Dry run: what a real run would copy, and where; changes nothing."""
        result.references_bookie = True
        if await self._no_copy_left(md, frozenset()):
            result.outcome = LedgerOutcome.LOST
            result.error = (
                f"entries with no copy left: no other bookie of the fragments naming "
                f"{self.lost} is registered; a real run records the ledger lost"
            )
            return
        result.outcome = LedgerOutcome.PLANNED
        if close_first:
            result.error = "would first be recovered and closed (fencing its writer)"
        for fragment in fragments_naming(md, self.lost):
            if fragment.last is None and not close_first:
                result.fragments.append(left_to_writer(fragment))
                result.outcome = LedgerOutcome.OPEN
            else:
                result.fragments.append(await self._plan(md, fragment))

    async def _close_by_recovery(self, ledger_id: int, access: LedgerAccess) -> LedgerMetadata:
        """BookKeeper's recover on an open ledger whose last fragment names the bookie:
        fence, recover and close it (R7, R8), then recover it whole."""
        timeout_s = max(
            60.0, 4 * (self.config.fence_timeout_ms + self.config.read_timeout_ms) / 1000
        )
        try:
            if access.password is not None:
                opening = self.bk.open_ledger(ledger_id, access.password)
                handle = await asyncio.wait_for(opening, timeout_s)
                await handle.close()
            else:
                recovering = self.bk.recover_ledger_with_key(ledger_id, access.key)
                await asyncio.wait_for(recovering, timeout_s)
        except TimeoutError:
            raise RereplicationError(
                f"ledger {ledger_id}: recovery to close it did not end within {timeout_s:.0f} s"
            ) from None
        md, _ = await read_ledger_metadata(self.bk, ledger_id)
        return md

    # ------------------------------------------------------------ one fragment

    async def _plan(self, md: LedgerMetadata, fragment: Fragment) -> FragmentReplication:
        entries = entries_held(md, fragment)
        target = await self._choose_replacement(fragment, md.write_quorum, (), entries)
        return FragmentReplication(
            first_entry_id=fragment.first,
            last_entry_id=fragment.last,
            bookie_index=fragment.index,
            status=FragmentStatus.PLANNED,
            replacement=target,
            entries=entries,
            error="" if target else _no_replacement_message(md.ledger_id, fragment),
        )

    async def _fragment(
        self, md: LedgerMetadata, fragment: Fragment, codec: EntryCodec, key: bytes
    ) -> FragmentReplication:
        started = time.monotonic()
        entries = entries_held(md, fragment)
        out = FragmentReplication(
            first_entry_id=fragment.first,
            last_entry_id=fragment.last,
            bookie_index=fragment.index,
            status=FragmentStatus.FAILED,
            entries=entries,
        )
        tried: list[str] = []
        errors: list[str] = []
        try:
            for _ in range(self.replacement_attempts):
                target = await self._choose_replacement(fragment, md.write_quorum, tried, entries)
                if target is None:
                    errors.append(_no_replacement_message(md.ledger_id, fragment, tried))
                    break
                out.replacement = target
                copier = FragmentCopier(self, md, fragment, codec, key, target, out)
                try:
                    await copier.run()
                except ReplacementFailed as exc:
                    tried.append(target)
                    self.bad_targets.add(target)
                    errors.append(exc.message)
                    out.entries_copied = out.bytes_copied = 0
                    continue
                out.status, detail = await swap_replacement(
                    self.bk, md.ledger_id, fragment, self.lost, target
                )
                if out.status is FragmentStatus.REPLACED_CONCURRENTLY:
                    out.replacement = detail  # who holds the index now; our copy is spare
                elif detail:
                    errors.append(detail)
                break
            else:
                errors.append(f"gave up after {self.replacement_attempts} replacement(s)")
        except EntriesLostError as exc:
            out.status = FragmentStatus.LOST
            errors.append(exc.message)
        except (RereplicationError, UnauthorizedError, MetadataError) as exc:
            out.status = FragmentStatus.FAILED
            errors.append(exc.message)
        out.error = "; ".join(errors)
        out.elapsed_ms = (time.monotonic() - started) * 1000
        return out

    async def _choose_replacement(
        self, fragment: Fragment, write_quorum: int, tried: Sequence[str], entries: int
    ) -> str | None:
        """The placement of one fragment's copy: a writable bookie outside its ensemble
        that was not tried, did not fail and is not down in this run, the one given the
        fewest entries so far (ties broken at random); None if there is none. With a
        rack- or region-aware policy, first those that keep the write sets through the
        fragment's slot closest to the policy."""
        excluded = {*fragment.ensemble, *tried, *self.bad_targets, *self.down, self.lost}
        placement = self.bk.placement
        if placement.needs_locations:
            locations = await metadata_call(
                self.bk, self.bk.registry.writable_locations(), "bookies"
            )
            elsewhere = await self._places_of_unwritable(fragment, locations)
            chosen = placement.least_loaded_placed(
                placed(locations),
                excluded,
                self.assigned,
                fragment.ensemble,
                fragment.index,
                write_quorum,
                elsewhere,
            )
        else:
            writable = await metadata_call(self.bk, self.bk.registry.writable_bookies(), "bookies")
            chosen = placement.least_loaded(writable, excluded, self.assigned)
        if chosen is None:
            return None
        self.assigned[chosen] += max(1, entries)
        return chosen

    async def _places_of_unwritable(
        self, fragment: Fragment, writable: Mapping[str, str | None]
    ) -> dict[str, str]:
        """Where the fragment's other bookies that are not writable stand, as their
        registrations say (a read-only bookie still holds its copies, so a target in its
        rack would put two copies of a write set there); a bookie not registered at all
        is left out (its place is not known)."""
        others = [b for b in fragment.ensemble if b not in writable and b != self.lost]
        if not others:
            return {}
        registry = self.bk.registry
        infos = await metadata_call(
            self.bk,
            asyncio.gather(*(registry.read_service_info(b) for b in others)),
            "bookies",
        )
        return {
            bookie: info["rack"]
            for bookie, info in zip(others, infos, strict=True)
            if info is not None and info.get("rack")
        }


def _no_replacement_message(ledger_id: int, fragment: Fragment, tried: Sequence[str] = ()) -> str:
    extra = f" (tried {', '.join(tried)})" if tried else ""
    return NotEnoughBookiesError(
        f"ledger {ledger_id}: no writable bookie outside the ensemble "
        f"{', '.join(fragment.ensemble)} to replace the lost one{extra}"
    ).message
