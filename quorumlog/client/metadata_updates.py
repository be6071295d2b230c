"""Between the pure decisions of ``core/`` and the ledger metadata in the store.

``core/`` decides on a :class:`~quorumlog.core.metadata.LedgerView` and answers with a
:data:`~quorumlog.core.metadata.Decision`; ``LedgerManager.update`` wants a function
of ``LedgerMetadata`` returning the metadata to write, ``Done`` or ``GiveUp``. These
helpers translate both ways, and sort an update's failure into "certainly not
written" and "may or may not be written" (R13), which is what the state machines act on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from quorumlog.core.metadata import (
    CloseAt,
    Decision,
    LedgerView,
    MarkInRecovery,
    NewFragment,
    Settled,
)
from quorumlog.errors import BKError, MetadataError, NoSuchLedgerError
from quorumlog.meta.ledger_metadata import LedgerMetadata, LedgerState
from quorumlog.meta.ledgers import Done, GiveUp, MetadataConflictsError


def ledger_view(metadata: LedgerMetadata) -> LedgerView:
    return LedgerView(metadata.state.value, metadata.last_entry_id, metadata.ensembles)


def apply_decision(
    current: LedgerMetadata, decision: Decision
) -> LedgerMetadata | Done[None] | GiveUp:
    """The metadata a core decision asks ``LedgerManager.update`` to write, or its stop."""
    if isinstance(decision, NewFragment):
        return current.with_new_fragment(decision.first_entry_id, decision.bookies)
    if isinstance(decision, CloseAt):
        return dataclasses.replace(
            current,
            state=LedgerState.CLOSED,
            last_entry_id=decision.last_entry_id,
            length=decision.length_bytes,
        )
    if isinstance(decision, MarkInRecovery):
        return dataclasses.replace(current, state=LedgerState.IN_RECOVERY)
    if isinstance(decision, Settled):
        return Done(None)
    return GiveUp(decision.error)


def metadata_decider(
    decide: Callable[[LedgerView], Decision],
) -> Callable[[LedgerMetadata], LedgerMetadata | Done[None] | GiveUp]:
    """``decide`` as ``LedgerManager.update`` takes it."""

    def on_metadata(current: LedgerMetadata) -> LedgerMetadata | Done[None] | GiveUp:
        return apply_decision(current, decide(ledger_view(current)))

    return on_metadata


# What a failing metadata store raises: its drivers' BKErrors (MetadataError and its
# kin), and OSError or a timeout from below them. These are retried or read back
# (R13); anything else is a bug of the client's own, and fails the handle with it.
STORE_FAILURES: tuple[type[BaseException], ...] = (BKError, OSError, TimeoutError)


def outcome_is_known(error: BaseException) -> bool:
    """Whether an update that failed with ``error`` certainly wrote nothing.

    Its decision gave up, every compare-and-set met a conflict, or the ledger is gone:
    known. Any other failure of the store (a lost connection, a timeout, an expired
    session) may have come after the write was applied: unknown, resolved by a read.
    """
    if isinstance(error, MetadataConflictsError | NoSuchLedgerError):
        return True
    return isinstance(error, BKError) and not isinstance(error, MetadataError)


def as_metadata_error(error: BaseException) -> BKError:
    """A BKError for any failure of a metadata operation (a bug's exception included)."""
    if isinstance(error, BKError):
        return error
    return MetadataError(f"metadata operation failed: {error!r}")
