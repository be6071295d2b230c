"""The auditor's decisions, without a cluster: which bookies are lost, since when,
which ledgers to mark, and the open-ledger grace period of the workers."""

from __future__ import annotations

import random

from quorumlog.meta.ledger_metadata import LedgerMetadata, LedgerState
from quorumlog.meta.underreplication import Mark
from quorumlog.proto.entry import DigestType
from quorumlog.replication.auditor import (
    LossTracker,
    bookie_index,
    bookies_to_repair,
    lost_bookies,
    marks_for_lost,
    sample,
)
from quorumlog.replication.report import LedgerAudit
from quorumlog.replication.worker import grace_over

A, B, C, D = "h:1", "h:2", "h:3", "h:4"


def ledger(ledger_id: int, *ensembles: tuple[int, tuple[str, ...]]) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=len(ensembles[0][1]),
        write_quorum=2,
        ack_quorum=2,
        digest_type=DigestType.CRC32C,
        password_digest="",
        ensembles=tuple(ensembles),
        state=LedgerState.CLOSED,
        last_entry_id=100,
        length=0,
    )


def test_index_names_every_bookie_of_every_fragment() -> None:
    ledgers = {1: ledger(1, (0, (A, B)), (50, (C, B))), 2: ledger(2, (0, (B, D)))}
    assert bookie_index(ledgers) == {A: {1}, B: {1, 2}, C: {1}, D: {2}}


def test_lost_bookies_are_those_named_but_not_available() -> None:
    assert lost_bookies([A, B, C], [B, C, D]) == {A}
    assert lost_bookies([A], [A]) == set()


def test_a_bookie_is_due_only_after_the_delay() -> None:
    tracker = LossTracker()
    tracker.observe({A}, now_s=100.0)
    assert tracker.due(now_s=105.0, delay_s=10) == set()
    assert tracker.next_due_in(now_s=105.0, delay_s=10) == 5.0
    tracker.observe({A, B}, now_s=108.0)  # A keeps its first loss time
    assert tracker.due(now_s=110.0, delay_s=10) == {A}
    assert tracker.due(now_s=118.0, delay_s=10) == {A, B}


def test_a_bookie_back_within_the_delay_costs_nothing_and_starts_over() -> None:
    tracker = LossTracker()
    tracker.observe({A}, now_s=0.0)
    tracker.observe(set(), now_s=5.0)  # restarted within the delay
    assert tracker.due(now_s=100.0, delay_s=10) == set()
    assert tracker.next_due_in(now_s=100.0, delay_s=10) is None
    tracker.observe({A}, now_s=100.0)
    assert tracker.due(now_s=105.0, delay_s=10) == set()
    assert tracker.due(now_s=110.0, delay_s=10) == {A}


def test_zero_delay_marks_at_once() -> None:
    tracker = LossTracker()
    tracker.observe({A}, now_s=3.0)
    assert tracker.due(now_s=3.0, delay_s=0) == {A}


def test_every_ledger_naming_a_due_bookie_is_marked_with_it() -> None:
    index = {A: {1, 2}, B: {2, 3}, C: {4}}
    assert marks_for_lost(index, {A, B}) == {1: {A}, 2: {A, B}, 3: {B}}
    assert marks_for_lost(index, set()) == {}


def test_audit_marks_available_bookies_only() -> None:
    audit = LedgerAudit(
        ledger_id=1,
        closed=True,
        last_entry_id=9,
        entries_checked=10,
        replicas_checked=20,
        missing=[(3, A), (4, C), (6, D)],
        damaged=[(5, B, "digest mismatch")],
        unreachable_bookies=[D],
    )
    # C is not available, D did not answer: the lost-bookie path (with its delay)
    # deals with them.
    assert bookies_to_repair(audit, [A, B, D]) == {A, B}


def test_sample_takes_a_fraction_and_at_least_one() -> None:
    rng = random.Random(7)
    ids = list(range(100))
    chosen = sample(ids, 0.1, rng)
    assert len(chosen) == 10 and set(chosen) <= set(ids) and chosen == sorted(chosen)
    assert len(sample([5], 0.01, rng)) == 1
    assert sample(ids, 1.0, rng) == ids
    assert sample([], 0.5, rng) == []


def test_open_ledger_grace_period() -> None:
    mark = Mark(ledger_id=1, bookies=(A,), marked_ms=10_000, version=0)
    assert not grace_over(mark, now_ms=39_999, grace_s=30)
    assert grace_over(mark, now_ms=40_000, grace_s=30)
