"""What the replication package reports: an audit's findings, a re-replication's
outcomes, and the text that explains them.

Each result has ``to_dict`` (plain JSON values, for report rows and ``--json``)
and ``summary`` (lines for an operator, what the shell prints). Nothing here does
I/O.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from quorumlog.errors import DigestMismatchError, Status

# How many items of each list ``to_dict`` keeps (the counts are always whole).
REPORT_LIST_LIMIT = 100
_SUMMARY_LIST_LIMIT = 10
_SUMMARY_DAMAGED_LIMIT = 5


def status_name(status: int) -> str:
    """``status NAME`` for a bookie's answer, or the raw number if it is unknown."""
    try:
        return f"status {Status(status).name}"
    except ValueError:
        return f"status {status}"


def digest_reason(exc: DigestMismatchError, ledger_id: int, entry_id: int) -> str:
    """Why a copy failed its check, without the ``ledger L entry E:`` prefix that the
    report already gives next to it."""
    prefix = f"ledger {ledger_id} entry {entry_id}: "
    message = exc.message
    return message[len(prefix) :] if message.startswith(prefix) else message


# ---------------------------------------------------------------- audit


@dataclass(frozen=True, kw_only=True)
class LedgerAudit:
    """What an audit found for one ledger.

    ``missing`` holds ``(entry_id, bookie)`` for each copy a bookie of the entry's
    write set does not have (or could not be asked for: see ``unreachable_bookies``);
    ``damaged`` holds ``(entry_id, bookie, reason)`` for each copy that the bookie
    could not read back or that fails the entry digest. Both are sorted by entry id,
    then bookie. Every replica checked is exactly one of good, missing or damaged.
    """

    ledger_id: int
    closed: bool
    last_entry_id: int
    entries_checked: int
    replicas_checked: int
    missing: list[tuple[int, str]]
    damaged: list[tuple[int, str, str]]
    unreachable_bookies: list[str]
    state: str = "CLOSED"
    ensemble_size: int = 0
    write_quorum: int = 0
    ack_quorum: int = 0
    fragments: int = 0
    # Why each unreachable bookie is listed (connection refused, timed out, ...).
    unreachable_reasons: dict[str, str] = field(default_factory=dict)
    elapsed_ms: float = field(default=0.0, compare=False)

    @property
    def good_replicas(self) -> int:
        return self.replicas_checked - len(self.missing) - len(self.damaged)

    @cached_property
    def _bad_copies_per_entry(self) -> Counter[int]:
        bad: Counter[int] = Counter(e for e, _ in self.missing)
        bad.update(e for e, _, _ in self.damaged)
        return bad

    @property
    def under_replicated(self) -> bool:
        """Some entry has fewer good copies than the write quorum."""
        return bool(self.missing or self.damaged)

    @cached_property
    def under_replicated_entries(self) -> list[int]:
        """Entries with fewer good copies than the write quorum, in order."""
        return sorted(self._bad_copies_per_entry)

    @cached_property
    def unreadable_entries(self) -> list[int]:
        """Entries with no good copy at all, in order."""
        quorum = self.write_quorum
        return sorted(e for e, bad in self._bad_copies_per_entry.items() if bad >= quorum)

    @property
    def healthy(self) -> bool:
        """Every checked entry is good on its whole write set and every bookie answered."""
        return not (self.missing or self.damaged or self.unreachable_bookies)

    def to_dict(self, list_limit: int = REPORT_LIST_LIMIT) -> dict[str, Any]:
        """Plain JSON values (for a report row); each list keeps its first ``list_limit``
        items and has a ``*_count`` key with its full length.

        ``missing`` items are ``{"entry_id": int, "bookie": str}``, ``damaged`` items
        ``{"entry_id": int, "bookie": str, "reason": str}``.
        """
        limit = max(0, list_limit)
        unreadable = self.unreadable_entries
        return {
            "ledger_id": self.ledger_id,
            "state": self.state,
            "closed": self.closed,
            "last_entry_id": self.last_entry_id,
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "fragments": self.fragments,
            "entries_checked": self.entries_checked,
            "replicas_checked": self.replicas_checked,
            "good_replicas": self.good_replicas,
            "healthy": self.healthy,
            "under_replicated": self.under_replicated,
            "under_replicated_entry_count": len(self.under_replicated_entries),
            "unreadable_entry_count": len(unreadable),
            "unreadable_entries": unreadable[:limit],
            "missing_count": len(self.missing),
            "missing": [{"entry_id": e, "bookie": b} for e, b in self.missing[:limit]],
            "damaged_count": len(self.damaged),
            "damaged": [
                {"entry_id": e, "bookie": b, "reason": r} for e, b, r in self.damaged[:limit]
            ],
            "unreachable_bookie_count": len(self.unreachable_bookies),
            "unreachable_bookies": self.unreachable_bookies[:limit],
            "elapsed_ms": round(self.elapsed_ms, 3),
        }

    def summary(self) -> str:
        """A few lines for an operator (what ``quorumlog shell auditledger`` prints)."""
        if self.healthy:
            verdict = "HEALTHY"
        elif self.unreadable_entries:
            verdict = "UNREADABLE ENTRIES"
        elif self.under_replicated:
            verdict = "UNDER-REPLICATED"
        else:
            verdict = "INCOMPLETE (bookies unreachable)"
        lines = [
            f"ledger {self.ledger_id}: {self.state}, last "
            f"{'entry' if self.closed else 'add confirmed'} {self.last_entry_id}, "
            f"{self.fragments} fragment(s), ensemble {self.ensemble_size}, "
            f"write quorum {self.write_quorum}, ack quorum {self.ack_quorum}",
            f"checked {self.entries_checked} entries, {self.replicas_checked} replicas "
            f"({self.good_replicas} good) in {self.elapsed_ms / 1000:.3f} s: {verdict}",
        ]
        if not self.closed:
            lines.append("the ledger is open: entries past the last add confirmed are not checked")
        for bookie in self.unreachable_bookies:
            why = self.unreachable_reasons.get(bookie, "")
            lines.append(f"unreachable bookie {bookie}" + (f": {why}" if why else ""))
        if self.missing:
            shown = ", ".join(f"{e}@{b}" for e, b in self.missing[:_SUMMARY_LIST_LIMIT])
            more = " ..." if len(self.missing) > _SUMMARY_LIST_LIMIT else ""
            lines.append(f"missing replicas: {len(self.missing)}: {shown}{more}")
        if self.damaged:
            lines.append(f"damaged replicas: {len(self.damaged)}")
            for e, b, r in self.damaged[:_SUMMARY_LIST_LIMIT]:
                lines.append(f"  entry {e} on {b}: {r}")
            if len(self.damaged) > _SUMMARY_LIST_LIMIT:
                lines.append("  ...")
        if self.under_replicated:
            unreadable = self.unreadable_entries
            shown = ", ".join(map(str, unreadable[:_SUMMARY_LIST_LIMIT]))
            more = " ..." if len(unreadable) > _SUMMARY_LIST_LIMIT else ""
            lines.append(
                f"under-replicated entries: {len(self.under_replicated_entries)}; "
                f"with no good copy: {len(unreadable)}" + (f": {shown}{more}" if shown else "")
            )
        return "\n".join(lines)


# ---------------------------------------------------------------- re-replication


class LedgerOutcome(enum.Enum):
    """What happened to one ledger."""

    REPLICATED = "replicated"  # the ledger no longer names the lost bookie
    PLANNED = "planned"  # dry run: what a real run would copy
    OPEN = "open"  # earlier fragments done; the last one is left to the writer
    SKIPPED_OPEN = "skipped-open"  # skip_open_ledgers: untouched
    DELETED = "deleted"  # gone before or during the run: nothing to recover
    UNAFFECTED = "unaffected"  # asked for explicitly, but it never named the bookie
    FAILED = "failed"  # some fragment could not be recovered (see the errors)
    LOST = "lost"  # some entry has no copy left anywhere: reported, not retried


class FragmentStatus(enum.Enum):
    """What happened to one (fragment, ensemble index) naming the lost bookie."""

    COPIED = "copied"  # entries copied and the metadata swapped to the replacement
    PLANNED = "planned"  # dry run
    LEFT_TO_WRITER = "left-to-writer"  # last fragment of a ledger that is not closed
    REPLACED_CONCURRENTLY = "replaced-concurrently"  # someone else replaced the bookie
    FAILED = "failed"
    LOST = "lost"  # an entry has no copy left: no other bookie holds it


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

    def to_dict(self, list_limit: int = REPORT_LIST_LIMIT) -> dict[str, Any]:
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

    def to_dict(self, list_limit: int = REPORT_LIST_LIMIT) -> dict[str, Any]:
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
    # Only the ledgers asked for were looked at (``--ledger``): others may name the bookie.
    only_ledgers_asked: bool = False

    @property
    def failed(self) -> list[LedgerReplication]:
        return [r for r in self.ledgers if r.outcome in (LedgerOutcome.FAILED, LedgerOutcome.LOST)]

    @property
    def lost(self) -> list[LedgerReplication]:
        """Ledgers with entries of which no copy is left (reported, never retried)."""
        return [r for r in self.ledgers if r.outcome is LedgerOutcome.LOST]

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

    def to_dict(self, list_limit: int = REPORT_LIST_LIMIT) -> dict[str, Any]:
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
            "only_ledgers_asked": self.only_ledgers_asked,
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
        elif self.complete and self.only_ledgers_asked:
            lines.append(
                f"none of the ledger(s) asked for references {self.bookie} any more "
                "(no other ledger was looked at)"
            )
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
