"""The auditor's decisions, without a cluster: which bookies are lost, since when,
which ledgers to mark, and the open-ledger grace period of the workers."""

from __future__ import annotations

import asyncio
import random

from quorumlog.client.bookkeeper import BookKeeper
from quorumlog.meta.ledger_metadata import LedgerMetadata, LedgerState
from quorumlog.meta.store import Versioned
from quorumlog.meta.underreplication import AUDITOR_PATH, Mark, UnderReplicationManager
from quorumlog.proto.entry import DigestType
from quorumlog.replication.auditor import (
    LossTracker,
    bookie_index,
    bookies_to_repair,
    chosen,
    lost_bookies,
    marks_for_lost,
    placement_moves,
)
from quorumlog.replication.autorecovery import AutoRecovery
from quorumlog.replication.report import LedgerAudit
from quorumlog.replication.worker import grace_over
from quorumlog.testing.memory_store import MemoryStore, MemoryTree

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


def test_placement_check_names_broken_write_sets_and_a_bookie_to_move() -> None:
    from quorumlog.core.placement import PlacementPolicy

    racks = {A: "/r/a", B: "/r/a", C: "/r/b", D: "/r/c"}
    rack_aware = PlacementPolicy("rack-aware")
    # Fragment one: (A, B, C) with Qw 2 puts (A, B) in rack a; fragment two is fine.
    md = ledger(1, (0, (A, B, C)), (50, (A, D, C)))
    broken, moves = placement_moves(rack_aware, md, racks)
    assert broken == [f"write set {A}, {B} spans 1 rack(s), 2 wanted"]
    assert moves in ({A}, {B})
    assert placement_moves(PlacementPolicy(), md, racks) == ([], set())
    # A bookie not writable now (unplaced): its ensemble is left to the lost-bookie path.
    assert placement_moves(rack_aware, md, {B: "/r/a", C: "/r/b", D: "/r/c"}) == ([], set())
    # Broken, but no bookie outside the ensemble would do better: reported, nothing moved.
    broken, moves = placement_moves(rack_aware, ledger(2, (0, (A, B, C))), {**racks, D: "/r/b"})
    assert broken and moves == set()
    # Two write sets in one rack each: two bookies to move, planned together.
    e, f = "h:5", "h:6"
    six = {**racks, D: "/r/b", e: "/r/c", f: "/r/c"}
    broken, moves = placement_moves(rack_aware, ledger(3, (0, (A, B, C, D))), six)
    assert len(broken) == 2 and len(moves) == 2
    assert len(moves & {A, B}) == 1 and len(moves & {C, D}) == 1


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


def test_sample_takes_each_ledger_with_the_fraction_as_the_walk_meets_it() -> None:
    rng = random.Random(7)
    taken = sum(chosen(0.1, rng) for _ in range(10_000))
    assert 800 < taken < 1200
    assert all(chosen(1.0, rng) for _ in range(100))


def test_open_ledger_grace_period() -> None:
    mark = Mark(ledger_id=1, bookies=(A,), marked_ms=10_000, version=0)
    assert not grace_over(mark, now_ms=39_999, grace_s=30)
    assert grace_over(mark, now_ms=40_000, grace_s=30)


def test_marks_record_the_time_of_the_clock_given() -> None:
    """The simulator runs autorecovery on its virtual clock: a mark's time, and so the
    worker's grace period, come from the clock the manager (and the worker) are given."""

    async def main() -> None:
        marks = UnderReplicationManager(MemoryStore(MemoryTree()), clock=lambda: 12.5)
        assert await marks.mark(7, [A])
        assert (await marks.get(7)).marked_ms == 12_500

    asyncio.run(main())


class SlowAuditorReads(MemoryStore):
    """A session whose reads of the auditor's node take a while (a slow store)."""

    async def get(self, path: str) -> Versioned:
        if path == AUDITOR_PATH:
            await asyncio.sleep(0.05)
        return await super().get(path)


def test_k5_leadership_lost_and_regained_at_once_keeps_the_auditor_published() -> None:
    """The daemon loses the auditor election and wins it again at once: the old
    auditor's unpublish must not delete the node the new one published (both carry
    this process's identifier), so whoisauditor still names it."""

    async def main() -> None:
        bk = BookKeeper(SlowAuditorReads(MemoryTree()))
        daemon = AutoRecovery("memory:", identifier="ar-1")
        marks = UnderReplicationManager(bk.store)
        tasks: list[asyncio.Task[None]] = []
        try:
            daemon._become_auditor(bk, tasks)
            for _ in range(100):
                if await marks.auditor() == "ar-1":
                    break
            assert await marks.auditor() == "ar-1"
            daemon._stop_auditing(tasks)  # leadership lost ...
            daemon._become_auditor(bk, tasks)  # ... and regained
            await asyncio.sleep(0.5)
            assert await marks.auditor() == "ar-1"
            assert not tasks[0].done()
        finally:
            daemon._stop_auditing(tasks)
            await asyncio.sleep(0.2)
            await bk.close()

    asyncio.run(main())


def test_a_placement_move_is_marked_only_if_the_bookies_writable_now_can_mend_it() -> None:
    """An audit walk reads where the writable bookies stand once, at its start, and may
    last long (audits of ledgers whose bookies time out). If a rack is cut off meanwhile,
    its bookies still look writable to the walk: a move planned towards them would have
    the worker copy a share onto the racks that are left, only shifting the write set in
    one rack elsewhere. The move is checked against the bookies writable at marking."""
    import json

    from quorumlog.replication.auditor import Auditor, AuditorConfig

    e, f = "h:5", "h:6"
    racks = {A: "/r/a", B: "/r/a", C: "/r/b", D: "/r/b", e: "/r/c", f: "/r/c"}
    left = {C, D, e, f}  # rack a cut off since the walk began

    async def main() -> tuple[str, list[int], str]:
        bk = BookKeeper(MemoryStore(MemoryTree()))
        try:
            for bookie in left:
                info = json.dumps({"rack": racks[bookie]}).encode()
                await bk.registry.register(bookie, service_info=info)
            auditor = Auditor(bk, "ar-1", AuditorConfig(placement="rack-aware"))
            # (e, C, D) with Qw 2: (C, D) in rack b; only rack a could mend it.
            stale = await auditor._check_placement(ledger(7, (0, (e, C, D))), racks)
            marked = await auditor.marks.marked_ledgers()
            # With rack a back, the same check marks the move.
            for bookie in (A, B):
                info = json.dumps({"rack": racks[bookie]}).encode()
                await bk.registry.register(bookie, service_info=info)
            fresh = await auditor._check_placement(ledger(7, (0, (e, C, D))), racks)
            return stale, marked, fresh
        finally:
            await bk.close()

    stale, marked, fresh = asyncio.run(main())
    assert (stale, marked) == ("broken", []), (stale, marked)
    assert fresh == "marked"
