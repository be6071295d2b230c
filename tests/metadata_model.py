"""What the tests of the core state machines share (tests/unit/test_core_writer.py,
tests/unit/test_core_recovery.py and their random schedules in tests/model/): the
reference write set, a model metadata store, and the settings of random schedules.

The model store carries out ``LedgerManager.update``'s compare-and-set on a
``LedgerView`` with every outcome a real store can have: applied, refused, applied with
its reply lost, not applied with the connection lost (R13).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from hypothesis import HealthCheck, settings

from quorumlog.core.metadata import (
    CLOSED,
    IN_RECOVERY,
    CloseAt,
    LedgerView,
    MarkInRecovery,
    MetadataEvent,
    MetadataRead,
    MetadataReadFailed,
    MetadataRefused,
    MetadataStored,
    MetadataUnknown,
    NewFragment,
    Refused,
    Settled,
    UpdateMetadata,
)
from quorumlog.errors import MetadataError

# What a compare-and-set writes.
Write = NewFragment | MarkInRecovery | CloseAt


def ref_write_set(entry_id: int, ensemble: tuple[str, ...], write_quorum: int) -> list[str]:
    """R1 written out again, apart from core/quorum.py: the Qw bookies of the ensemble
    from index ``entry_id`` mod E."""
    return [ensemble[(entry_id + i) % len(ensemble)] for i in range(write_quorum)]


def read_reply(store: LedgerView, outcome: str) -> MetadataRead | MetadataReadFailed:
    """The answer to a metadata read: the store's view, or a failure (``fail``)."""
    if outcome == "fail":
        return MetadataReadFailed(MetadataError("down"))
    return MetadataRead(store)


def compare_and_set(
    store: LedgerView,
    effect: UpdateMetadata,
    outcome: str,
    before_write: Callable[[LedgerView, Write], None] | None = None,
) -> tuple[LedgerView, MetadataEvent]:
    """The store after ``effect``'s update and the reply its caller gets.

    The effect decides on the store as it is. A write is made unless ``outcome`` is
    ``conflicts`` (refused) or ``not-applied-lost`` (never made, the connection lost);
    ``applied-lost`` makes it and loses the reply; any other outcome makes it and
    answers. ``before_write(store, decision)`` checks the caller's rules on each write."""
    decision = effect.decide(store)
    if isinstance(decision, Settled):
        return store, MetadataStored(store)
    if isinstance(decision, Refused):
        return store, MetadataRefused(decision.error)
    if outcome == "conflicts":
        return store, MetadataRefused(MetadataError("too many conflicting updates"))
    if outcome == "not-applied-lost":
        return store, MetadataUnknown(MetadataError("connection lost"))
    if before_write is not None:
        before_write(store, decision)
    store = _written(store, decision)
    if outcome == "applied-lost":
        return store, MetadataUnknown(MetadataError("lost"))
    return store, MetadataStored(store)


def _written(store: LedgerView, decision: Write) -> LedgerView:
    if isinstance(decision, MarkInRecovery):
        return replace(store, state=IN_RECOVERY)
    if isinstance(decision, NewFragment):
        first = decision.first_entry_id
        kept = tuple(f for f in store.ensembles if f[0] < first)
        return replace(store, ensembles=(*kept, (first, decision.bookies)))
    assert isinstance(decision, CloseAt)
    return replace(store, state=CLOSED, last_entry_id=decision.last_entry_id)


def random_schedule_settings(max_examples: int) -> settings:
    """Hypothesis settings of a state machine's random schedules: 60 steps each, no
    deadline (a schedule's time depends on the machine's load, not on its size)."""
    return settings(
        max_examples=max_examples,
        stateful_step_count=60,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
