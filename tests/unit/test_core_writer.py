"""The writer's state machine (core/writer.py): adds, acks, bookie failures, ensemble
changes, metadata outcomes known and unknown, close (R3, R5, R6, R13), as transcripts of
the cases that matter most.

The property test that drives it with random schedules against a brute-force reference
of the coverage rules is tests/model/test_core_writer_schedules.py (minutes, not
seconds).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from quorumlog.core.invariants import CoreInvariantError
from quorumlog.core.metadata import (
    CLOSED,
    IN_RECOVERY,
    OPEN,
    CloseAt,
    LedgerView,
    MetadataRead,
    MetadataReadFailed,
    MetadataRefused,
    MetadataStored,
    MetadataUnknown,
    NewFragment,
    ReadMetadata,
    Refused,
    Settled,
    UpdateMetadata,
)
from quorumlog.core.writer import (
    AddAcked,
    AddFailed,
    BookiesChosen,
    ChooseBookies,
    Closed,
    CloseDecision,
    CloseFailed,
    CloseRequested,
    Confirm,
    FailAdds,
    FragmentDecision,
    HandleFailed,
    LedgerWriter,
    NoBookies,
    SendQueued,
    WriterEffect,
    decide_close,
    decide_fragment,
)
from quorumlog.errors import (
    LedgerClosedError,
    LedgerFencedError,
    MetadataError,
    NotEnoughBookiesError,
    Status,
)
from quorumlog.proto.entry import ENTRY_HEADER

LEDGER = 1


def blob(entry_id: int) -> bytes:
    # The writer reads the ledger length from the header of the last entry confirmed.
    return ENTRY_HEADER.pack(LEDGER, entry_id, -1, 10 * (entry_id + 1)) + b"x" * 10


# ------------------------------------------------------------------ transcripts


def view_of(*fragments: tuple[int, tuple[str, ...]], state: str = OPEN, last: int = -1):
    return LedgerView(state, last, tuple(fragments))


def add(writer: LedgerWriter, count: int) -> list[tuple[int, int, list[int]]]:
    """Add ``count`` entries; returns what the writer sends: (slot, generation, ids)."""
    for _ in range(count):
        writer.add(blob(writer.tracker.next_entry_id), None)
    return [(slot, gen, [p.entry_id for p in q]) for slot, gen, q in writer.take_sends()]


def ids(effects: list[WriterEffect], kind: type) -> list[int]:
    return [p.entry_id for e in effects if isinstance(e, kind) for p in e.entries]


def two_bookie_writer_with_entry_10_acked_by_b_only() -> LedgerWriter:
    """E=Qw=Qa=2 on A, B: 0-9 confirmed, 10 acked by B, then B fails on 11."""
    writer = LedgerWriter(LEDGER, 2, 2, 2, view_of((0, ("A", "B"))))
    add(writer, 10)
    writer.ack(0, 0, range(10))
    assert [p.entry_id for p in writer.ack(1, 0, range(10))] == list(range(10))
    add(writer, 1)
    assert not writer.ack(1, 0, [10])  # B has 10; A is slow
    add(writer, 1)
    effects = writer.step(AddFailed(1, 0, Status.IO_ERROR, "B: connection lost"))
    assert effects == [ChooseBookies((1,), frozenset({"A", "B"}))]
    assert not writer.ack(1, 0, [11])  # B's late answers are dropped from now on
    [update] = writer.step(BookiesChosen((1,), ("C",)))
    assert isinstance(update, UpdateMetadata)
    assert update.decide(view_of((0, ("A", "B")))) == NewFragment(10, ("A", "C"))
    # A acknowledges 10 and 11 during the change: Qa=2 acks for 10 (A, B), held.
    assert not writer.ack(0, 0, [10, 11])
    return writer


def test_c1_r13_an_unknown_fragment_outcome_is_read_before_anything_is_confirmed():
    writer = two_bookie_writer_with_entry_10_acked_by_b_only()
    effects = writer.step(MetadataUnknown(MetadataError("connection lost")))
    assert effects == [ReadMetadata(0)]
    # The write was applied: 10 lives on A and C now, and C has nothing yet.
    recorded = view_of((0, ("A", "B")), (10, ("A", "C")))
    effects = writer.step(MetadataRead(recorded))
    assert effects == [SendQueued()]
    assert writer.ensemble == ["A", "C"]
    assert writer.lac == 9  # B's acknowledgement of 10 no longer counts
    assert [(s, [p.entry_id for p in q]) for s, _, q in writer.take_sends()] == [(1, [10, 11])]
    assert [p.entry_id for p in writer.ack(1, 2, [10, 11])] == [10, 11]  # C has them


def test_c1_r13_a_fragment_write_that_did_not_happen_is_tried_again_on_the_version_read():
    writer = two_bookie_writer_with_entry_10_acked_by_b_only()
    writer.step(MetadataUnknown(MetadataError("operation timeout")))
    [retry] = writer.step(MetadataRead(view_of((0, ("A", "B")))))
    assert isinstance(retry, UpdateMetadata)
    assert retry.decide(view_of((0, ("A", "B")))) == NewFragment(10, ("A", "C"))
    assert writer.lac == 9


def test_c1_r5_a_fenced_answer_during_the_change_waits_for_its_outcome():
    writer = two_bookie_writer_with_entry_10_acked_by_b_only()
    add(writer, 1)  # 12, sent to A (slot 0) at once
    assert writer.step(AddFailed(0, 0, Status.FENCED, "A: fenced")) == []
    assert writer.refusal() is not None  # no more adds meanwhile
    effects = writer.step(MetadataStored(view_of((0, ("A", "B")), (10, ("A", "C")))))
    # Recorded: 10's write set is A, C; C never had it. Nothing past 9 is confirmed.
    assert ids(effects, Confirm) == []
    assert ids(effects, FailAdds) == [10, 11, 12]
    assert isinstance(effects[-1], HandleFailed)
    assert writer.lac == 9


def test_c1_a_fenced_answer_after_a_refused_change_confirms_from_the_old_write_sets():
    writer = two_bookie_writer_with_entry_10_acked_by_b_only()
    assert writer.step(AddFailed(0, 0, Status.FENCED, "A: fenced")) == []
    effects = writer.step(MetadataRefused(LedgerFencedError("IN_RECOVERY")))
    # Not written: 10's write set is still A, B, and both have it (R8 keeps it).
    assert ids(effects, Confirm) == [10]
    assert ids(effects, FailAdds) == [11]


def test_c1_r13_an_outcome_that_stays_unknown_confirms_only_what_both_fragments_cover():
    writer = LedgerWriter(LEDGER, 3, 3, 2, view_of((0, ("A", "B", "D")), state=OPEN))
    add(writer, 2)  # 0 and 1 on A, B, D
    writer.ack(1, 0, [0, 1])  # B
    writer.step(AddFailed(1, 0, Status.IO_ERROR, "B: timeout"))
    writer.step(BookiesChosen((1,), ("C",)))
    writer.ack(0, 0, [0, 1])  # A
    writer.ack(2, 0, [0])  # D: now 0 has A, B, D and 1 has A, B, both held
    assert writer.step(AddFailed(0, 0, Status.FENCED, "A: fenced")) == []
    assert writer.step(MetadataUnknown(MetadataError("lost"))) == [ReadMetadata(0)]
    effects = []
    while not effects or isinstance(effects[0], ReadMetadata):
        effects = writer.step(MetadataReadFailed(MetadataError("still down")))
    # Old fragment: 0 (A, B, D) and 1 (A, B) are safe. New fragment (A, C, D): 0 has
    # A, D; 1 has only A. Only 0 is safe under both.
    assert ids(effects, Confirm) == [0]
    assert ids(effects, FailAdds) == [1]


def three_bookie_writer_whose_change_from_1_has_an_unknown_outcome() -> LedgerWriter:
    """E=3, Qw=Qa=2 on A, B, C: A and B ack 0 (confirmed), A acks 2, B acks 1; A fails
    on 3, so the writer changes from entry 1 (A -> R); that write's reply is lost."""
    writer = LedgerWriter(LEDGER, 3, 2, 2, view_of((0, ("A", "B", "C"))))
    add(writer, 4)  # 0: A, B   1: B, C   2: C, A   3: A, B
    assert not writer.ack(0, 0, [0, 2])
    assert [p.entry_id for p in writer.ack(1, 0, [0, 1])] == [0]
    assert writer.step(AddFailed(0, 0, Status.IO_ERROR, "A: refused 3")) == [
        ChooseBookies((0,), frozenset({"A", "B", "C"}))
    ]
    [update] = writer.step(BookiesChosen((0,), ("R",)))
    assert isinstance(update, UpdateMetadata)
    assert update.decide(view_of((0, ("A", "B", "C")))) == NewFragment(1, ("R", "B", "C"))
    assert writer.step(MetadataUnknown(MetadataError("connection lost"))) == [ReadMetadata(0)]
    assert isinstance(
        writer.step(MetadataReadFailed(MetadataError("reconnecting")))[0], ReadMetadata
    )
    assert not writer.ack(2, 0, [1, 2])  # C's delayed acks: 1 (B, C) and 2 (C, A), held
    return writer


def test_p1_r13_a_refusal_read_after_an_unknown_outcome_is_not_never_written():
    writer = three_bookie_writer_whose_change_from_1_has_an_unknown_outcome()
    # Meanwhile the change was applied, and a recovery fenced R, B, C, found 1 on B, got
    # NO_SUCH_ENTRY for 2 from R, rewrote 1 replacing B and closed at 1: the writer's
    # fragment is gone from the metadata it reads.
    closed = view_of((0, ("A", "B", "C")), (1, ("R", "A", "C")), state=CLOSED, last=1)
    effects = writer.step(MetadataRead(closed))
    # 1 is on B and C under both fragments; 2 counted A's ack, which the fragment from 1
    # took away from it: it must not be confirmed (the ledger ends at 1).
    assert ids(effects, Confirm) == [1]
    assert ids(effects, FailAdds) == [2, 3]
    assert isinstance(effects[-1], HandleFailed)
    assert writer.lac == 1


def test_p1_r13_a_conflict_after_an_unknown_outcome_is_not_never_written():
    writer = three_bookie_writer_whose_change_from_1_has_an_unknown_outcome()
    # The read shows the change not applied (a lagging read): try again ...
    [retry] = writer.step(MetadataRead(view_of((0, ("A", "B", "C")))))
    assert isinstance(retry, UpdateMetadata)
    # ... and the update loop gives up on conflicts: the first write may be among them.
    effects = writer.step(MetadataRefused(LedgerFencedError("version conflicts")))
    assert ids(effects, Confirm) == [1]
    assert ids(effects, FailAdds) == [2, 3]
    assert writer.lac == 1


def test_r5_a_second_failure_during_a_change_waits_for_it_then_changes_again():
    writer = LedgerWriter(LEDGER, 3, 3, 2, view_of((0, ("A", "B", "D"))))
    add(writer, 1)
    writer.step(AddFailed(1, 0, Status.IO_ERROR, "B"))
    writer.step(BookiesChosen((1,), ("C",)))
    assert writer.step(AddFailed(2, 0, Status.IO_ERROR, "D")) == []  # one update at a time
    effects = writer.step(MetadataStored(view_of((0, ("A", "B", "D")), (0, ("A", "C", "D")))))
    assert effects == [SendQueued(), ChooseBookies((2,), frozenset({"A", "B", "C", "D"}))]


def test_r5_no_replacement_fails_the_handle_and_keeps_what_a_quorum_holds():
    writer = LedgerWriter(LEDGER, 3, 3, 2, view_of((0, ("A", "B", "D"))))
    add(writer, 2)
    writer.step(AddFailed(2, 0, Status.IO_ERROR, "D"))
    writer.ack(0, 0, [0, 1])
    writer.ack(1, 0, [0])  # 0 is on A and B: Qa, held by the change
    effects = writer.step(NoBookies(NotEnoughBookiesError("no bookies")))
    assert ids(effects, Confirm) == [0]
    assert ids(effects, FailAdds) == [1]


def test_r6_close_waits_for_a_change_and_an_unknown_close_is_read_back():
    writer = LedgerWriter(LEDGER, 3, 3, 2, view_of((0, ("A", "B", "D"))))
    add(writer, 1)
    writer.ack(0, 0, [0])
    writer.ack(1, 0, [0])  # 0 confirmed
    writer.step(AddFailed(2, 0, Status.IO_ERROR, "D"))  # e.g. its explicit LAC failed
    writer.begin_close()
    assert writer.refusal() is not None
    writer.step(BookiesChosen((2,), ("C",)))
    assert writer.step(CloseRequested()) == []  # the change goes first
    recorded = view_of((0, ("A", "B", "D")), (1, ("A", "B", "C")))
    effects = writer.step(MetadataStored(recorded))
    [close] = [e for e in effects if isinstance(e, UpdateMetadata)]
    assert close.decide(recorded) == CloseAt(0, 10)
    assert writer.step(MetadataUnknown(MetadataError("lost"))) == [ReadMetadata(0)]
    closed = replace(recorded, state=CLOSED, last_entry_id=0)
    assert writer.step(MetadataRead(closed)) == [Closed(closed)]


def test_p2_r6_an_add_given_up_by_its_owner_is_not_confirmed_past_the_close():
    writer = LedgerWriter(LEDGER, 3, 3, 2, view_of((0, ("A", "B", "D"))))
    add(writer, 2)
    writer.ack(0, 0, [0])
    assert [p.entry_id for p in writer.ack(1, 0, [0])] == [0]
    # 1's owner cancelled its future; close() waits only for the others.
    writer.begin_close()
    [close] = writer.step(CloseRequested())
    assert isinstance(close, UpdateMetadata)
    assert close.decide(view_of((0, ("A", "B", "D")))) == CloseAt(0, 10)
    # Acks for 1 arrive during the close's compare-and-set: it lies past the end.
    assert not writer.ack(0, 0, [1])
    assert not writer.ack(1, 0, [1])
    assert writer.step(AddAcked(2, 0, [1])) == []
    assert writer.lac == 0
    closed = view_of((0, ("A", "B", "D")), state=CLOSED, last=0)
    effects = writer.step(MetadataStored(closed))
    assert ids(effects, FailAdds) == [1]
    assert effects[-1] == Closed(closed)
    assert writer.lac == 0


def test_p2_r6_a_fenced_answer_during_the_close_confirms_nothing_past_it():
    writer = LedgerWriter(LEDGER, 3, 3, 2, view_of((0, ("A", "B", "D"))))
    add(writer, 2)
    writer.ack(0, 0, [0])
    writer.ack(1, 0, [0])
    writer.begin_close()
    writer.step(CloseRequested())
    writer.ack(0, 0, [1])
    writer.ack(1, 0, [1])
    effects = writer.step(AddFailed(2, 0, Status.FENCED, "D: fenced"))
    assert ids(effects, Confirm) == []
    assert ids(effects, FailAdds) == [1]
    assert writer.lac == 0


def test_p2_r6_a_close_that_fails_fails_the_adds_still_tracked():
    writer = LedgerWriter(LEDGER, 3, 3, 2, view_of((0, ("A", "B", "D"))))
    add(writer, 2)
    writer.ack(0, 0, [0])
    writer.ack(1, 0, [0])
    writer.begin_close()
    writer.step(CloseRequested())
    writer.ack(0, 0, [1])
    writer.ack(1, 0, [1])
    effects = writer.step(MetadataRefused(LedgerFencedError("IN_RECOVERY")))
    assert ids(effects, Confirm) == []
    assert ids(effects, FailAdds) == [1]
    assert isinstance(effects[-1], CloseFailed)
    assert writer.lac == 0


def test_r6_close_decisions():
    view = view_of((0, ("A", "B")))
    assert decide_close(LEDGER, 4, 50, view) == CloseAt(4, 50)
    refused = decide_close(LEDGER, 4, 50, replace(view, state=IN_RECOVERY))
    assert isinstance(refused, Refused) and isinstance(refused.error, LedgerFencedError)
    assert decide_close(LEDGER, 4, 50, replace(view, state=CLOSED, last_entry_id=4)) == Settled()
    other = decide_close(LEDGER, 4, 50, replace(view, state=CLOSED, last_entry_id=3))
    assert isinstance(other, Refused) and isinstance(other.error, LedgerClosedError)


def test_c3_r5_a_fragment_is_never_written_to_a_ledger_that_is_not_open():
    for state in (IN_RECOVERY, CLOSED):
        decision = decide_fragment(LEDGER, 5, ("A", "C"), view_of((0, ("A", "B")), state=state))
        assert isinstance(decision, Refused)
    # Found on a ledger no longer OPEN, the fragment may be a recovery's, not the
    # writer's own (tests/model: test_p4_r5_r13_...): a refusal, never Settled.
    applied = view_of((0, ("A", "B")), (5, ("A", "C")), state=IN_RECOVERY)
    assert isinstance(decide_fragment(LEDGER, 5, ("A", "C"), applied), Refused)
    still_open = view_of((0, ("A", "B")), (5, ("A", "C")))
    assert decide_fragment(LEDGER, 5, ("A", "C"), still_open) == Settled()


# ------------------------------------------------------------------ random schedules


def test_a_writer_whose_lac_fell_fails_loudly_at_the_end_of_the_step():
    writer = LedgerWriter(LEDGER, 3, 3, 2, view_of((0, ("A", "B", "D"))))
    add(writer, 2)
    writer.ack(0, 0, [0, 1])
    writer.ack(1, 0, [0, 1])
    assert writer.step(AddAcked(2, 0, [0])) == []
    writer.tracker.lac = 0  # a bug elsewhere moved it back
    with pytest.raises(CoreInvariantError, match="LAC fell"):
        writer.step(AddAcked(2, 0, [1]))


def test_effects_are_plain_data_that_compare_by_value():
    """A transcript can be written down and compared: an update carries its decision as
    a value, not a closure."""
    writer = LedgerWriter(LEDGER, 2, 2, 2, view_of((0, ("A", "B"))))
    add(writer, 1)
    writer.step(AddFailed(1, 0, Status.IO_ERROR, "B"))
    effects = writer.step(BookiesChosen((1,), ("C",)))
    assert effects == [UpdateMetadata(FragmentDecision(LEDGER, 0, ("A", "C")))]
    assert "FragmentDecision(ledger_id=1, first_entry_id=0, bookies=('A', 'C'))" in repr(effects)
    writer.step(MetadataStored(view_of((0, ("A", "C")))))
    writer.begin_close()
    assert writer.step(CloseRequested()) == [UpdateMetadata(CloseDecision(LEDGER, -1, 0))]
