"""Re-replication of a lost bookie's data (BookKeeper's ``bookkeeper shell recover``).

When a bookie is gone for good, every entry it stored has one copy fewer than its
write quorum. :func:`recover_bookie` restores the count: for each ledger whose
ensembles name the lost bookie, and for each fragment that names it, it

1. chooses a replacement among the writable bookies that are not in that
   fragment's ensemble (the one with the fewest entries given to it by this run,
   ties broken at random), never the lost bookie itself;
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
    from quorumlog.rereplication import recover_bookie

    async with await BookKeeper.connect() as bk:
        report = await recover_bookie(bk, "127.0.0.1:3181")
        print(report.summary())
        if report.complete:
            ...  # no ledger references 127.0.0.1:3181 any more
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import hashlib
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from quorumlog.core.quorum import stores_entry, write_set
from quorumlog.errors import (
    BKError,
    DigestMismatchError,
    InvalidArgumentError,
    MetadataError,
    MetadataVersionError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    Status,
    UnauthorizedError,
)
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.proto.codec import AddFlag, AddRequest, AddResponse, ReadRequest, ReadResponse
from quorumlog.proto.entry import ENTRY_HEADER_SIZE, EntryCodec, master_key

if TYPE_CHECKING:
    from quorumlog.client.bookkeeper import BookKeeper

__all__ = [
    "CHUNK_BYTES_DEFAULT",
    "COPIES_IN_FLIGHT_DEFAULT",
    "ENTRIES_PER_CHUNK_DEFAULT",
    "LEDGERS_IN_FLIGHT_DEFAULT",
    "REPLACEMENT_ATTEMPTS_DEFAULT",
    "FragmentReplication",
    "FragmentStatus",
    "LedgerOutcome",
    "LedgerReplication",
    "RecoveryReport",
    "RereplicationError",
    "recover_bookie",
    "replicate_ledger",
]

# A chunk is the unit of the copy pipeline: read from the replicas, then one or a
# few ADD frames to the replacement. Its size is bounded in entries and, with the
# average entry size seen so far, in bytes; ``copies_in_flight`` chunks at most are
# held at once, which bounds the memory of a run (8 x 1 MiB by default).
ENTRIES_PER_CHUNK_DEFAULT = 1_000
CHUNK_BYTES_DEFAULT = 1 << 20
COPIES_IN_FLIGHT_DEFAULT = 8
LEDGERS_IN_FLIGHT_DEFAULT = 2
# How many replacement bookies a fragment may try when a replacement fails mid-copy.
REPLACEMENT_ATTEMPTS_DEFAULT = 3
# Passes over one ledger: a pass may uncover work a concurrent writer created (its
# ensemble change turned the last fragment into an earlier one, or it closed).
_PASSES_MAX = 4
# Before any entry size is known (an open ledger has no length yet).
_FIRST_CHUNK_ENTRIES_UNKNOWN_SIZE = 64
_REPORT_LIST_LIMIT = 100
_SUMMARY_DAMAGED_LIMIT = 5


class RereplicationError(BKError):
    """A fragment could not be re-replicated (e.g. no intact copy of an entry is left)."""


class _ReplacementFailed(BKError):
    """The replacement bookie failed mid-copy: try another one."""


class LedgerOutcome(enum.Enum):
    """What happened to one ledger."""

    REPLICATED = "replicated"  # the ledger no longer names the lost bookie
    PLANNED = "planned"  # dry run: what a real run would copy
    OPEN = "open"  # earlier fragments done; the last one is left to the writer
    SKIPPED_OPEN = "skipped-open"  # skip_open_ledgers: untouched
    DELETED = "deleted"  # gone before or during the run: nothing to recover
    UNAFFECTED = "unaffected"  # asked for explicitly, but it never named the bookie
    FAILED = "failed"  # some fragment could not be recovered (see the errors)


class FragmentStatus(enum.Enum):
    """What happened to one (fragment, ensemble index) naming the lost bookie."""

    COPIED = "copied"  # entries copied and the metadata swapped to the replacement
    PLANNED = "planned"  # dry run
    LEFT_TO_WRITER = "left-to-writer"  # last fragment of a ledger that is not closed
    REPLACED_CONCURRENTLY = "replaced-concurrently"  # someone else replaced the bookie
    FAILED = "failed"


@dataclass(kw_only=True)
class FragmentReplication:
    """One fragment's share of the lost bookie: ``entries`` entries of
    ``first_entry_id..last_entry_id`` (None: open-ended) at ``bookie_index``."""

    first_entry_id: int
    last_entry_id: int | None
    bookie_index: int
    status: FragmentStatus
    replacement: str | None = None
    entries: int = 0
    entries_copied: int = 0
    bytes_copied: int = 0
    # (entry id, bookie, reason) of each copy that was read and failed its check.
    damaged_copies_skipped: list[tuple[int, str, str]] = field(default_factory=list)
    error: str = ""
    elapsed_ms: float = 0.0

    def to_dict(self, list_limit: int = _REPORT_LIST_LIMIT) -> dict[str, Any]:
        limit = max(0, list_limit)
        return {
            "first_entry_id": self.first_entry_id,
            "last_entry_id": self.last_entry_id,
            "bookie_index": self.bookie_index,
            "status": self.status.value,
            "replacement": self.replacement,
            "entries": self.entries,
            "entries_copied": self.entries_copied,
            "bytes_copied": self.bytes_copied,
            "damaged_copies_skipped_count": len(self.damaged_copies_skipped),
            "damaged_copies_skipped": [
                {"entry_id": e, "bookie": b, "reason": r}
                for e, b, r in self.damaged_copies_skipped[:limit]
            ],
            "error": self.error,
            "elapsed_ms": round(self.elapsed_ms, 3),
        }

    def describe(self) -> str:
        if self.last_entry_id is None:
            span = f"entries from {self.first_entry_id} on"
        else:
            span = f"entries {self.first_entry_id}-{self.last_entry_id}"
        where = f"{span} at index {self.bookie_index}"
        if self.status is FragmentStatus.COPIED:
            text = (
                f"{where} -> {self.replacement}: copied {self.entries_copied} entries "
                f"({self.bytes_copied} bytes)"
            )
        elif self.status is FragmentStatus.PLANNED:
            target = self.replacement or "no replacement available"
            text = f"{where} -> {target}: would copy {self.entries} entries"
        elif self.status is FragmentStatus.LEFT_TO_WRITER:
            text = f"{where}: last fragment of a ledger that is not closed, left to its writer"
        elif self.status is FragmentStatus.REPLACED_CONCURRENTLY:
            text = f"{where}: replaced concurrently by another run, now {self.replacement}"
        else:
            text = f"{where}: FAILED"
        if self.damaged_copies_skipped:
            text += f"; skipped {len(self.damaged_copies_skipped)} damaged cop(ies)"
        if self.error:
            text += f": {self.error}"
        return text


@dataclass(kw_only=True)
class LedgerReplication:
    """The result for one ledger. ``references_bookie`` tells whether its metadata,
    as last read, still names the lost bookie."""

    ledger_id: int
    outcome: LedgerOutcome
    state: str = ""
    fragments: list[FragmentReplication] = field(default_factory=list)
    references_bookie: bool = False
    error: str = ""
    elapsed_ms: float = 0.0

    @property
    def entries_copied(self) -> int:
        return sum(f.entries_copied for f in self.fragments)

    @property
    def bytes_copied(self) -> int:
        return sum(f.bytes_copied for f in self.fragments)

    def to_dict(self, list_limit: int = _REPORT_LIST_LIMIT) -> dict[str, Any]:
        return {
            "ledger_id": self.ledger_id,
            "outcome": self.outcome.value,
            "state": self.state,
            "references_bookie": self.references_bookie,
            "entries_copied": self.entries_copied,
            "bytes_copied": self.bytes_copied,
            "fragments": [f.to_dict(list_limit) for f in self.fragments],
            "error": self.error,
            "elapsed_ms": round(self.elapsed_ms, 3),
        }

    def summary(self) -> str:
        """One line for the ledger, then one per fragment."""
        state = f" ({self.state})" if self.state else ""
        head = f"ledger {self.ledger_id}{state}: {self.outcome.value}"
        if self.outcome is LedgerOutcome.REPLICATED and self.entries_copied:
            head += f", {self.entries_copied} entries copied"
        if self.error:
            head += f": {self.error}"
        lines = [head]
        for fragment in self.fragments:
            lines.append(f"  {fragment.describe()}")
            for e, b, r in fragment.damaged_copies_skipped[:_SUMMARY_DAMAGED_LIMIT]:
                lines.append(f"    damaged copy skipped: entry {e} on {b}: {r}")
        return "\n".join(lines)


@dataclass(kw_only=True)
class RecoveryReport:
    """What :func:`recover_bookie` did. ``ledgers`` lists the ledgers that named the
    lost bookie (and any asked for by id), sorted by id."""

    bookie: str
    dry_run: bool
    ledgers_scanned: int
    ledgers: list[LedgerReplication]
    # Whether the "lost" bookie is still registered (writable or read-only): its
    # copies are not read either way, but it keeps serving until it is stopped.
    bookie_registered: bool = False
    elapsed_ms: float = 0.0

    @property
    def failed(self) -> list[LedgerReplication]:
        return [r for r in self.ledgers if r.outcome is LedgerOutcome.FAILED]

    @property
    def still_referencing(self) -> list[LedgerReplication]:
        """Ledgers whose metadata still names the bookie (for a dry run: all planned)."""
        return [r for r in self.ledgers if r.references_bookie]

    @property
    def complete(self) -> bool:
        """No ledger looked at names the bookie any more, and nothing failed."""
        return not self.failed and not self.still_referencing

    @property
    def entries_copied(self) -> int:
        return sum(r.entries_copied for r in self.ledgers)

    @property
    def bytes_copied(self) -> int:
        return sum(r.bytes_copied for r in self.ledgers)

    @property
    def exit_status(self) -> int:
        """0: done (dry run: every affected ledger can be recovered); 1: something
        failed; 2: nothing failed, but ledgers that are not closed still name the
        bookie (left to their writers, or skipped)."""
        if self.failed:
            return 1
        waiting = (LedgerOutcome.OPEN, LedgerOutcome.SKIPPED_OPEN)
        if self.dry_run:
            fragments = [f for r in self.ledgers for f in r.fragments]
            if any(f.status is FragmentStatus.PLANNED and not f.replacement for f in fragments):
                return 1
            return 2 if any(r.outcome in waiting for r in self.ledgers) else 0
        return 2 if self.still_referencing else 0

    def to_dict(self, list_limit: int = _REPORT_LIST_LIMIT) -> dict[str, Any]:
        """Plain JSON values; damaged-copy lists are cut to ``list_limit`` items."""
        outcomes = Counter(r.outcome.value for r in self.ledgers)
        return {
            "bookie": self.bookie,
            "dry_run": self.dry_run,
            "bookie_registered": self.bookie_registered,
            "ledgers_scanned": self.ledgers_scanned,
            "ledgers_affected": len(self.ledgers),
            "outcomes": dict(sorted(outcomes.items())),
            "complete": self.complete,
            "exit_status": self.exit_status,
            "ledgers_still_referencing": [r.ledger_id for r in self.still_referencing],
            "entries_copied": self.entries_copied,
            "bytes_copied": self.bytes_copied,
            "ledgers": [r.to_dict(list_limit) for r in self.ledgers],
            "elapsed_ms": round(self.elapsed_ms, 3),
        }

    def summary(self, *, ledgers: bool = True) -> str:
        """Lines for an operator: each ledger (unless ``ledgers=False``), then totals."""
        lines = [r.summary() for r in self.ledgers] if ledgers else []
        outcomes = Counter(r.outcome.value for r in self.ledgers)
        counts = ", ".join(f"{n} {name}" for name, n in sorted(outcomes.items())) or "none"
        if self.dry_run:
            planned = sum(
                f.entries
                for r in self.ledgers
                for f in r.fragments
                if f.status is FragmentStatus.PLANNED
            )
            verb, copied = "dry run for", f"would copy {planned} entries"
        else:
            verb = "recovered"
            copied = f"copied {self.entries_copied} entries ({self.bytes_copied} bytes)"
        lines.append(
            f"{verb} bookie {self.bookie}: {len(self.ledgers)} ledger(s) affected of "
            f"{self.ledgers_scanned} scanned ({counts}); {copied} in "
            f"{self.elapsed_ms / 1000:.3f} s"
        )
        if self.bookie_registered:
            lines.append(
                f"note: bookie {self.bookie} is still registered (a killed bookie's "
                "registration lasts until its metadata session expires); its copies were "
                "not read either way"
            )
        if self.dry_run:
            lines.append("dry run: nothing was copied and no metadata changed")
        elif self.complete:
            lines.append(f"no ledger references {self.bookie} any more")
        else:
            ids = [r.ledger_id for r in self.still_referencing]
            shown = ", ".join(map(str, ids[:20])) + (" ..." if len(ids) > 20 else "")
            if ids:
                lines.append(f"{len(ids)} ledger(s) still reference {self.bookie}: {shown}")
            if self.failed:
                lines.append(f"{len(self.failed)} ledger(s) failed; run again once fixed")
        return "\n".join(lines)


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
    progress: Callable[[LedgerReplication], None] | None = None,
) -> RecoveryReport:
    """Re-replicate every entry ``lost_bookie`` (``host:port``) held, ledger by ledger.

    Looks at every ledger (or only ``ledger_ids``), and recovers those whose
    ensembles name the bookie, ``ledgers_in_flight`` at a time; see the module
    docstring for how. ``dry_run`` changes nothing and reports what would be copied
    where. ``password`` is the ledgers' password (``passwords`` per ledger id
    overrides it); a ledger with another one fails with UnauthorizedError in its
    result. ``progress`` is called with each ledger's result as it completes.

    Raises InvalidArgumentError for bad arguments and MetadataError if the ledger
    list cannot be read; everything else is in the report.
    """
    started = time.monotonic()
    _check_address(lost_bookie)
    if skip_open_ledgers and close_open_ledgers:
        raise InvalidArgumentError("skip_open_ledgers and close_open_ledgers exclude each other")
    if ledgers_in_flight < 1:
        raise InvalidArgumentError("ledgers_in_flight must be at least 1")
    run = _Run(
        bk,
        lost_bookie,
        copies_in_flight=copies_in_flight,
        entries_per_chunk=entries_per_chunk,
        chunk_bytes=chunk_bytes,
        replacement_attempts=replacement_attempts,
    )
    explicit = ledger_ids is not None
    if ledger_ids is None:
        ids = await run.meta(bk.ledgers.list_ledger_ids(), "the ledger list")
    else:
        ids = sorted(set(ledger_ids))
    registered = lost_bookie in await run.meta(bk.registry.writable_bookies(), "bookies")
    if not registered:
        registered = lost_bookie in await run.meta(bk.registry.readonly_bookies(), "bookies")

    results: list[LedgerReplication] = []
    pending = iter(ids)

    async def worker() -> None:
        for ledger_id in pending:  # shared: each id is taken by one worker
            result = await run.ledger(
                ledger_id,
                (passwords or {}).get(ledger_id, password),
                dry_run=dry_run,
                skip_open_ledgers=skip_open_ledgers,
                close_open_ledgers=close_open_ledgers,
                scanning=not explicit,
            )
            if result is None:
                continue
            results.append(result)
            if progress is not None:
                progress(result)

    await _all_or_cancel([worker() for _ in range(min(ledgers_in_flight, max(1, len(ids))))])
    results.sort(key=lambda r: r.ledger_id)
    return RecoveryReport(
        bookie=lost_bookie,
        dry_run=dry_run,
        ledgers_scanned=len(ids),
        ledgers=results,
        bookie_registered=registered,
        elapsed_ms=(time.monotonic() - started) * 1000,
    )


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


async def _all_or_cancel(coroutines: Sequence[Any]) -> None:
    """Run coroutines together; if one raises, cancel the others and raise."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


# ---------------------------------------------------------------- one run


@dataclass(frozen=True, slots=True)
class _Fragment:
    first: int
    last: int | None  # None: open-ended (the last fragment of a ledger not closed)
    ensemble: tuple[str, ...]
    index: int  # where the lost bookie sits in ``ensemble``


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
        self.meta_timeout_s = bk.config.metadata_session_timeout_ms / 1000
        # Entries handed to each replacement so far: the next one goes to the least loaded.
        self.assigned: Counter[str] = Counter()
        # Replicas that failed to answer (refused, timed out) during this run: not asked
        # again, so that a hung bookie costs one timeout, not one per chunk.
        self.down: dict[str, str] = {}
        # Replacements that failed mid-copy: not chosen again in this run.
        self.bad_targets: set[str] = set()

    async def meta(self, operation: Any, what: str) -> Any:
        """A metadata call with the client's metadata timeout (MetadataError past it)."""
        try:
            return await asyncio.wait_for(operation, self.meta_timeout_s)
        except TimeoutError:
            raise MetadataError(
                f"{what}: no answer from the metadata store within {self.meta_timeout_s:.1f} s"
            ) from None

    async def read_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        result: tuple[LedgerMetadata, int] = await self.meta(
            self.bk.ledgers.read(ledger_id), f"ledger {ledger_id}"
        )
        return result

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
                md, _ = await self.read_metadata(ledger_id)
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
        _check_password(md, password)
        if not md.is_closed and skip_open_ledgers:
            result.outcome, result.references_bookie = LedgerOutcome.SKIPPED_OPEN, True
            return
        close_first = not md.is_closed and close_open_ledgers and self.lost in md.last_ensemble
        if dry_run:
            await self._plan_ledger(result, md, close_first)
            return
        if close_first:
            md = await self._close_by_recovery(ledger_id, password)
            result.state = md.state.value
        codec = EntryCodec(md.digest_type, password)
        key = master_key(password)
        failed = False
        for _ in range(_PASSES_MAX):
            # The last fragment of a ledger that is not closed is open-ended: its
            # writer (or the client recovering it) owns it.
            work = [f for f in _fragments_naming(md, self.lost) if f.last is not None]
            if not work:
                break
            for fragment in work:
                done = await self._fragment(md, fragment, codec, key)
                result.fragments.append(done)
                failed = failed or done.status is FragmentStatus.FAILED
            md, _ = await self.read_metadata(ledger_id)
            if failed:
                break
        result.state = md.state.value
        left = _fragments_naming(md, self.lost)
        result.references_bookie = bool(left)
        if failed:
            result.outcome = LedgerOutcome.FAILED
            result.error = "some fragment could not be recovered; run again once fixed"
        elif left:
            for fragment in left:
                result.fragments.append(_left_to_writer(fragment))
            if md.is_closed:  # closed under us after the last pass: a run again finishes it
                result.outcome = LedgerOutcome.FAILED
                result.error = "the ledger changed while being recovered; run again"
            else:
                result.outcome = LedgerOutcome.OPEN

    async def _plan_ledger(
        self, result: LedgerReplication, md: LedgerMetadata, close_first: bool
    ) -> None:
        """Dry run: what a real run would copy, and where; changes nothing."""
        result.references_bookie = True
        result.outcome = LedgerOutcome.PLANNED
        if close_first:
            result.error = "would first be recovered and closed (fencing its writer)"
        for fragment in _fragments_naming(md, self.lost):
            if fragment.last is None and not close_first:
                result.fragments.append(_left_to_writer(fragment))
                result.outcome = LedgerOutcome.OPEN
            else:
                result.fragments.append(await self._plan(md, fragment))

    async def _close_by_recovery(self, ledger_id: int, password: bytes) -> LedgerMetadata:
        """BookKeeper's recover on an open ledger whose last fragment names the bookie:
        fence, recover and close it (R7, R8), then recover it whole."""
        timeout_s = max(
            60.0, 4 * (self.config.fence_timeout_ms + self.config.read_timeout_ms) / 1000
        )
        try:
            handle = await asyncio.wait_for(self.bk.open_ledger(ledger_id, password), timeout_s)
        except TimeoutError:
            raise RereplicationError(
                f"ledger {ledger_id}: recovery to close it did not end within {timeout_s:.0f} s"
            ) from None
        await handle.close()
        md, _ = await self.read_metadata(ledger_id)
        return md

    # ------------------------------------------------------------ one fragment

    async def _plan(self, md: LedgerMetadata, fragment: _Fragment) -> FragmentReplication:
        entries = _entries_held(md, fragment)
        target = await self._choose_replacement(fragment.ensemble, (), entries)
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
        self, md: LedgerMetadata, fragment: _Fragment, codec: EntryCodec, key: bytes
    ) -> FragmentReplication:
        started = time.monotonic()
        entries = _entries_held(md, fragment)
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
                target = await self._choose_replacement(fragment.ensemble, tried, entries)
                if target is None:
                    errors.append(_no_replacement_message(md.ledger_id, fragment, tried))
                    break
                out.replacement = target
                copier = _FragmentCopier(self, md, fragment, codec, key, target, out)
                try:
                    await copier.run()
                except _ReplacementFailed as exc:
                    tried.append(target)
                    self.bad_targets.add(target)
                    errors.append(exc.message)
                    out.entries_copied = out.bytes_copied = 0
                    continue
                out.status, detail = await self._swap(md.ledger_id, fragment, target)
                if out.status is FragmentStatus.REPLACED_CONCURRENTLY:
                    out.replacement = detail  # who holds the index now; our copy is spare
                elif detail:
                    errors.append(detail)
                break
            else:
                errors.append(f"gave up after {self.replacement_attempts} replacement(s)")
        except (RereplicationError, UnauthorizedError, MetadataError) as exc:
            out.status = FragmentStatus.FAILED
            errors.append(exc.message)
        out.error = "; ".join(errors)
        out.elapsed_ms = (time.monotonic() - started) * 1000
        return out

    async def _choose_replacement(
        self, ensemble: Sequence[str], tried: Sequence[str], entries: int
    ) -> str | None:
        writable: list[str] = await self.meta(self.bk.registry.writable_bookies(), "bookies")
        excluded = {*ensemble, *tried, *self.bad_targets, *self.down, self.lost}
        candidates = sorted(b for b in writable if b not in excluded)
        if not candidates:
            return None
        rng = self.bk.rng
        chosen = min(candidates, key=lambda b: (self.assigned[b], rng.random()))
        self.assigned[chosen] += max(1, entries)
        return chosen

    async def _swap(
        self, ledger_id: int, fragment: _Fragment, target: str
    ) -> tuple[FragmentStatus, str]:
        """Compare-and-set: ``target`` instead of the lost bookie in ``fragment``, on
        the metadata as it is now. Returns the status and an error (empty if none), or
        for REPLACED_CONCURRENTLY the bookie that holds the index now."""
        for _ in range(self.config.metadata_cas_retries):
            md, version = await self.read_metadata(ledger_id)
            bounds = {first: (last, ens) for first, last, ens in md.fragment_bounds()}
            if fragment.first not in bounds:
                return FragmentStatus.FAILED, (
                    f"ledger {ledger_id}: the fragment from entry {fragment.first} changed "
                    "concurrently; run again"
                )
            last, ensemble = bounds[fragment.first]
            if ensemble[fragment.index] != self.lost:
                return FragmentStatus.REPLACED_CONCURRENTLY, ensemble[fragment.index]
            if last != fragment.last or target in ensemble:
                return FragmentStatus.FAILED, (
                    f"ledger {ledger_id}: the fragment from entry {fragment.first} changed "
                    f"concurrently (now {ensemble}, last entry {last}); run again"
                )
            replaced = tuple(target if i == fragment.index else b for i, b in enumerate(ensemble))
            updated = dataclasses.replace(
                md,
                ensembles=tuple(
                    (first, replaced if first == fragment.first else bookies)
                    for first, bookies in md.ensembles
                ),
            )
            try:
                await self.meta(self.bk.ledgers.write(updated, version), f"ledger {ledger_id}")
            except MetadataVersionError:
                continue  # someone else changed it: look again
            return FragmentStatus.COPIED, ""
        return FragmentStatus.FAILED, (
            f"ledger {ledger_id}: too many conflicting metadata updates; run again"
        )


def _check_password(md: LedgerMetadata, password: bytes) -> None:
    expected = hashlib.sha256(master_key(password)).hexdigest()
    if md.password_digest and md.password_digest != expected:
        raise UnauthorizedError(f"ledger {md.ledger_id}: wrong password")


def _no_replacement_message(ledger_id: int, fragment: _Fragment, tried: Sequence[str] = ()) -> str:
    extra = f" (tried {', '.join(tried)})" if tried else ""
    return NotEnoughBookiesError(
        f"ledger {ledger_id}: no writable bookie outside the ensemble "
        f"{', '.join(fragment.ensemble)} to replace the lost one{extra}"
    ).message


def _left_to_writer(fragment: _Fragment) -> FragmentReplication:
    return FragmentReplication(
        first_entry_id=fragment.first,
        last_entry_id=fragment.last,
        bookie_index=fragment.index,
        status=FragmentStatus.LEFT_TO_WRITER,
    )


def _fragments_naming(md: LedgerMetadata, bookie: str) -> list[_Fragment]:
    return [
        _Fragment(first, last, ensemble, index)
        for first, last, ensemble in md.fragment_bounds()
        for index, address in enumerate(ensemble)
        if address == bookie
    ]


def _slot_runs(index: int, size: int, quorum: int, lo: int, hi: int) -> Iterator[tuple[int, int]]:
    """(first, last) runs of consecutive entries of lo..hi whose write set holds
    ``index`` (R1): the whole range when E == Qw, else Qw entries every E."""
    if lo > hi:
        return
    if size == quorum:
        yield lo, hi
        return
    residue = (index - quorum + 1) % size  # where the runs start, modulo E
    start = lo - (lo - residue) % size
    while start <= hi:
        first, last = max(start, lo), min(start + quorum - 1, hi)
        if first <= last:
            yield first, last
        start += size


def _entries_held(md: LedgerMetadata, fragment: _Fragment) -> int:
    if fragment.last is None:
        return 0
    runs = _slot_runs(
        fragment.index, md.ensemble_size, md.write_quorum, fragment.first, fragment.last
    )
    return sum(last - first + 1 for first, last in runs)


# ---------------------------------------------------------------- copying one fragment


class _FragmentCopier:
    """Copies the entries one fragment's lost index held to ``target``.

    ``copies_in_flight`` workers take chunks in turn; each reads its chunk from the
    surviving replicas (verifying every copy) and sends it to the target as recovery
    adds, then takes the next chunk. A failure of the target raises
    _ReplacementFailed; an entry without any intact copy raises RereplicationError.
    """

    def __init__(
        self,
        run: _Run,
        md: LedgerMetadata,
        fragment: _Fragment,
        codec: EntryCodec,
        key: bytes,
        target: str,
        out: FragmentReplication,
    ) -> None:
        assert fragment.last is not None
        self._run = run
        self._pool = run.bk.pool
        self._config = run.config
        self._md = md
        self._ledger_id = md.ledger_id
        self._fragment = fragment
        self._codec = codec
        self._key = key
        self._target = target
        self._out = out
        self._rotation = 0
        # Average blob size for chunk sizing; the ledger length gives a first guess.
        overhead = ENTRY_HEADER_SIZE + md.digest_type.digest_size
        if md.is_closed and md.last_entry_id >= 0 and md.length > 0:
            self._seen_entries, self._seen_bytes = (
                md.last_entry_id + 1,
                md.length + (md.last_entry_id + 1) * overhead,
            )
        else:
            self._seen_entries, self._seen_bytes = 0, 0

    async def run(self) -> None:
        chunks = self._chunks()
        workers = [self._worker(chunks) for _ in range(self._run.copies_in_flight)]
        await _all_or_cancel(workers)

    async def _worker(self, chunks: Iterator[list[tuple[int, int]]]) -> None:
        # The generator is shared: next() never awaits, so each chunk goes to one worker.
        for chunk in chunks:
            blobs = await self._read_chunk(chunk)
            await self._write(blobs)
            size = sum(map(len, blobs))
            self._out.entries_copied += len(blobs)
            self._out.bytes_copied += size
            self._seen_entries += len(blobs)
            self._seen_bytes += size

    def _chunk_entries(self) -> int:
        if self._seen_entries == 0:
            return min(self._run.entries_per_chunk, _FIRST_CHUNK_ENTRIES_UNKNOWN_SIZE)
        average = max(1, self._seen_bytes // self._seen_entries)
        return max(1, min(self._run.entries_per_chunk, self._run.chunk_bytes // average))

    def _chunks(self) -> Iterator[list[tuple[int, int]]]:
        """Chunks of runs (first, last), in entry order, sized as entries are seen."""
        md, fragment = self._md, self._fragment
        assert fragment.last is not None
        chunk: list[tuple[int, int]] = []
        count = 0
        for first, last in _slot_runs(
            fragment.index, md.ensemble_size, md.write_quorum, fragment.first, fragment.last
        ):
            while first <= last:
                limit = self._chunk_entries()
                take = max(1, min(last - first + 1, limit - count))
                chunk.append((first, first + take - 1))
                count += take
                first += take
                if count >= limit:
                    yield chunk
                    chunk, count = [], 0
        if chunk:
            yield chunk

    # ------------------------------------------------------------ reading

    def _replicas(self, entry_id: int) -> list[int]:
        """Ensemble indexes holding ``entry_id``, other than the lost one's."""
        md = self._md
        return [
            i
            for i in write_set(entry_id, md.ensemble_size, md.write_quorum)
            if i != self._fragment.index and self._fragment.ensemble[i] != self._run.lost
        ]

    def _choose_replica(self, first: int, last: int, failed: set[str]) -> str | None:
        """The replica of ``first`` to ask for ``first..last``: among those that did not
        fail it and are not down, the one holding the longest prefix of the run (with
        striping, fewer requests), rotating among equals to spread the load."""
        md, ensemble, down = self._md, self._fragment.ensemble, self._run.down
        options = [
            i
            for i in self._replicas(first)
            if ensemble[i] not in failed and ensemble[i] not in down
        ]
        if not options:
            return None
        size, quorum = md.ensemble_size, md.write_quorum

        def prefix(i: int) -> int:
            span = min(last - first + 1, size)  # the pattern repeats every E entries
            n = 0
            while n < span and stores_entry(i, first + n, size, quorum):
                n += 1
            return n if n < span else last - first + 1

        self._rotation += 1
        lengths = {i: prefix(i) for i in options}
        best = max(lengths.values())
        tied = [i for i in options if lengths[i] == best]
        return ensemble[tied[self._rotation % len(tied)]]

    async def _read_chunk(self, runs: list[tuple[int, int]]) -> list[bytes]:
        """The verified blobs of every entry of ``runs``, in entry order.

        Rounds: each run still to read goes to one replica; what comes back intact is
        kept, the rest is asked of another replica in the next round. Every round
        settles at least one entry, or one replica of one entry, or one bookie as down,
        so the rounds are bounded.
        """
        got: dict[int, bytes] = {}
        failed: dict[int, set[str]] = {}
        reasons: dict[int, list[str]] = {}
        todo = runs
        total = sum(last - first + 1 for first, last in runs)
        rounds_max = total * (self._md.write_quorum + 1) + len(self._fragment.ensemble) + 2
        for _ in range(rounds_max):
            if not todo:
                break
            sends: list[tuple[int, int, str, asyncio.Future[Any]]] = []
            for first, last in todo:
                replica = self._choose_replica(first, last, failed.get(first, set()))
                if replica is None:
                    raise self._unreadable(first, reasons.get(first, []))
                request = ReadRequest(
                    0,
                    self._ledger_id,
                    first,
                    last - first + 1,
                    max_bytes=self._config.read_batch_max_bytes,
                )
                future = self._pool.request(replica, request, self._config.read_timeout_ms)
                sends.append((first, last, replica, future))
            answers = await asyncio.gather(*(s[3] for s in sends), return_exceptions=True)
            todo = []
            for (first, last, replica, _), answer in zip(sends, answers, strict=True):
                self._settle(first, last, replica, answer, got, failed, reasons)
                todo.extend(_missing_runs(first, last, got))
        if todo:
            raise RereplicationError(
                f"ledger {self._ledger_id}: entries from {todo[0][0]} still unread after "
                f"{rounds_max} rounds"
            )
        return [got[e] for first, last in runs for e in range(first, last + 1)]

    def _settle(
        self,
        first: int,
        last: int,
        replica: str,
        answer: object,
        got: dict[int, bytes],
        failed: dict[int, set[str]],
        reasons: dict[int, list[str]],
    ) -> None:
        def fail(entry_id: int, reason: str) -> None:
            failed.setdefault(entry_id, set()).add(replica)
            reasons.setdefault(entry_id, []).append(f"{replica}: {reason}")

        if isinstance(answer, BKError):
            self._run.down.setdefault(replica, answer.message)
            reasons.setdefault(first, []).append(answer.message)
            return
        if isinstance(answer, BaseException):
            raise answer
        if not isinstance(answer, ReadResponse):
            self._run.down.setdefault(replica, f"answered READ with {type(answer).__name__}")
            return
        status = answer.status
        if status == Status.OK and answer.entries:
            decode = self._codec.decode
            entry_id = first
            for blob in answer.entries[: last - first + 1]:
                try:
                    decode(blob, self._ledger_id, entry_id)
                except DigestMismatchError as exc:
                    reason = _short_reason(exc, self._ledger_id, entry_id)
                    fail(entry_id, reason)
                    self._out.damaged_copies_skipped.append((entry_id, replica, reason))
                else:
                    got.setdefault(entry_id, bytes(blob))
                entry_id += 1
        elif status in (Status.OK, Status.NO_SUCH_ENTRY):
            fail(first, "no such entry")
        elif status == Status.NO_SUCH_LEDGER:
            for entry_id in range(first, last + 1):
                fail(entry_id, "no such ledger")
        elif status == Status.IO_ERROR:
            # R9: the bookie found its own record damaged.
            reason = "bookie could not read it (I/O error)"
            fail(first, reason)
            self._out.damaged_copies_skipped.append((first, replica, reason))
        else:
            self._run.down.setdefault(replica, f"answered READ with {_status_name(status)}")

    def _unreadable(self, entry_id: int, reasons: list[str]) -> RereplicationError:
        holders = [self._fragment.ensemble[i] for i in self._replicas(entry_id)]
        detail = "; ".join(reasons[-4:]) or "every other replica is down"
        down = [b for b in holders if b in self._run.down]
        if down and not reasons:
            detail = "; ".join(f"{b}: {self._run.down[b]}" for b in down)
        return RereplicationError(
            f"ledger {self._ledger_id} entry {entry_id}: no intact copy on "
            f"{', '.join(holders) or 'any other bookie'} ({detail})"
        )

    # ------------------------------------------------------------ writing

    async def _write(self, blobs: list[bytes]) -> None:
        """Recovery adds of ``blobs`` to the target, in frames of bounded size; returns
        once the target acknowledged every one (durably, R2)."""
        max_entries = self._config.add_batch_max_entries
        max_bytes = self._config.add_batch_max_bytes
        batches: list[list[bytes]] = []
        batch: list[bytes] = []
        size = 0
        for blob in blobs:
            if batch and (len(batch) >= max_entries or size + len(blob) > max_bytes):
                batches.append(batch)
                batch, size = [], 0
            batch.append(blob)
            size += len(blob)
        if batch:
            batches.append(batch)
        target = self._target
        futures = [
            self._pool.request(
                target,
                AddRequest(0, self._ledger_id, self._key, batch, AddFlag.RECOVERY),
                self._config.add_timeout_ms,
            )
            for batch in batches
        ]
        for answer in await asyncio.gather(*futures, return_exceptions=True):
            if isinstance(answer, BKError):
                raise _ReplacementFailed(f"replacement {target}: {answer.message}")
            if isinstance(answer, BaseException):
                raise answer
            status = answer.status if isinstance(answer, AddResponse) else Status.BAD_REQUEST
            if status == Status.OK:
                continue
            if status == Status.NO_SUCH_LEDGER:
                raise NoSuchLedgerError(
                    f"ledger {self._ledger_id}: deleted (bookie {target} has dropped it)"
                )
            if status == Status.UNAUTHORIZED:
                raise UnauthorizedError(
                    f"ledger {self._ledger_id}: bookie {target} holds it with another master key"
                )
            raise _ReplacementFailed(
                f"replacement {target}: recovery add answered {_status_name(status)}"
            )


def _missing_runs(first: int, last: int, got: dict[int, bytes]) -> Iterator[tuple[int, int]]:
    """The runs of ``first..last`` not in ``got``."""
    start: int | None = None
    for entry_id in range(first, last + 1):
        if entry_id in got:
            if start is not None:
                yield start, entry_id - 1
                start = None
        elif start is None:
            start = entry_id
    if start is not None:
        yield start, last


def _short_reason(exc: DigestMismatchError, ledger_id: int, entry_id: int) -> str:
    prefix = f"ledger {ledger_id} entry {entry_id}: "
    message = exc.message
    return message[len(prefix) :] if message.startswith(prefix) else message


def _status_name(status: int) -> str:
    try:
        return f"status {Status(status).name}"
    except ValueError:
        return f"status {status}"
