"""Recovery as a state machine (core/recovery.py LedgerRecoveryMachine): R7, R8, R13,
as transcripts.

Random schedules against a brute-force reference of the coverage rules are
tests/model/test_core_recovery_schedules.py (minutes, not seconds).
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
    MarkInRecovery,
    MetadataRead,
    MetadataStored,
    MetadataUnknown,
    NewFragment,
    ReadMetadata,
    Refused,
    Settled,
    UpdateMetadata,
)
from quorumlog.core.recovery import (
    EntryRead,
    EntryRewritten,
    FenceAnswered,
    LedgerRecoveryMachine,
    LengthRead,
    ReadLength,
    Recovered,
    RecoveryEffect,
    RecoveryFailed,
    SendFence,
    SendRecoveryRead,
    SendRewrite,
)
from quorumlog.core.writer import BookiesChosen, ChooseBookies
from quorumlog.errors import LedgerRecoveryError, MetadataError, Status

LEDGER = 1


def blob(entry_id: int) -> bytes:
    return b"entry %d" % entry_id


def length(entry_id: int) -> int:
    return 10 * (entry_id + 1)


# ------------------------------------------------------------------ transcripts


def machine(view: LedgerView, shape=(3, 3, 2)) -> LedgerRecoveryMachine:
    return LedgerRecoveryMachine(LEDGER, *shape, view, reads_in_flight=2, metadata_attempts=3)


def test_r7_r8_a_recovery_from_start_to_close():
    view = LedgerView(OPEN, -1, ((0, ("A", "B", "C")),))
    m = machine(view)
    [mark] = m.start()
    assert isinstance(mark, UpdateMetadata) and mark.decide(view) == MarkInRecovery()
    marked = replace(view, state=IN_RECOVERY)
    assert m.step(MetadataStored(marked)) == [SendFence((0, 1, 2))]
    assert m.step(FenceAnswered(0, Status.OK, lac=4)) == []
    # (Qw - Qa) + 1 = 2 bookies of every write set: fenced without waiting for C.
    effects = m.step(FenceAnswered(1, Status.OK, lac=3))
    assert effects == [SendRecoveryRead(5, (2, 0, 1)), SendRecoveryRead(6, (0, 1, 2))]
    assert m.step(EntryRead(6, 0, Status.NO_SUCH_ENTRY)) == []
    assert m.step(EntryRead(6, 1, Status.NO_SUCH_ENTRY)) == []  # 6 is missing, 5 undecided
    effects = m.step(EntryRead(5, 2, Status.OK, blob(5), length(5)))
    assert effects == [SendRewrite(5, blob(5), (2, 0, 1))]  # and reading stops at 6
    assert m.step(EntryRewritten(5, 2, Status.OK)) == []
    [close] = m.step(EntryRewritten(5, 0, Status.OK))
    assert isinstance(close, UpdateMetadata) and close.decide(marked) == CloseAt(5, length(5))
    closed = replace(marked, state=CLOSED, last_entry_id=5)
    assert m.step(MetadataStored(closed)) == [Recovered(closed, ran_to_close=True)]


def test_r8_r9_an_error_is_unknown_never_missing():
    view = LedgerView(IN_RECOVERY, -1, ((0, ("A", "B", "C")),))
    m = machine(view, shape=(3, 3, 2))
    m.start()
    m.step(MetadataStored(view))
    m.step(FenceAnswered(0, Status.OK))
    m.step(FenceAnswered(1, Status.OK))
    m.step(EntryRead(0, 0, Status.NO_SUCH_ENTRY))
    m.step(EntryRead(0, 1, Status.IO_ERROR))
    [failed] = m.step(EntryRead(0, 2, Status.IO_ERROR))
    assert isinstance(failed, RecoveryFailed)
    assert isinstance(failed.error, LedgerRecoveryError)


def test_r8_nothing_found_closes_at_the_entry_before_with_its_recorded_length():
    view = LedgerView(IN_RECOVERY, -1, ((0, ("A", "B", "C")), (7, ("A", "B", "D"))))
    m = machine(view)
    m.start()
    m.step(MetadataStored(view))
    m.step(FenceAnswered(0, Status.OK, lac=3))
    effects = m.step(FenceAnswered(1, Status.OK, lac=3))
    # Never before the last fragment, even though the LAC is older.
    assert [e.entry_id for e in effects if isinstance(e, SendRecoveryRead)] == [7, 8]
    m.step(EntryRead(7, 0, Status.NO_SUCH_ENTRY))
    [ask] = m.step(EntryRead(7, 1, Status.NO_SUCH_ENTRY))
    # Entry 6 lives in the first fragment: its write set there is C, A, B.
    assert ask == ReadLength(6, ("A", "B", "C"))
    [close] = m.step(LengthRead(length(6)))
    assert isinstance(close, UpdateMetadata) and close.decide(view) == CloseAt(6, length(6))


def test_r13_an_unknown_close_is_read_back_and_another_recoverys_close_is_adopted():
    view = LedgerView(IN_RECOVERY, -1, ((0, ("A", "B")),))
    m = machine(view, shape=(2, 2, 2))
    m.start()
    m.step(MetadataStored(view))
    m.step(FenceAnswered(0, Status.OK, lac=-1))
    m.step(EntryRead(0, 1, Status.NO_SUCH_ENTRY))
    assert m.step(MetadataUnknown(MetadataError("lost"))) == [ReadMetadata(0)]
    theirs = replace(view, state=CLOSED, last_entry_id=-1)
    assert m.step(MetadataRead(theirs)) == [Recovered(theirs, ran_to_close=True)]


def test_r8_a_dead_bookie_is_replaced_for_the_recovery_adds_when_qa_equals_qw():
    """E = Qw = Qa = 2 and bookie B gone for good: every rewrite needs B, so without an
    ensemble change the ledger could never be closed. As BookKeeper's recovery adds do,
    the recovery replaces B and closes; the replacement gets the entries first, and the
    fragment naming it is written only then."""
    view = LedgerView(IN_RECOVERY, -1, ((0, ("A", "B")), (3, ("A", "B"))))
    m = LedgerRecoveryMachine(LEDGER, 2, 2, 2, view, reads_in_flight=2, rewrite_attempts=2)
    m.start()
    m.step(MetadataStored(view))
    m.step(FenceAnswered(1, Status.IO_ERROR))
    effects = m.step(FenceAnswered(0, Status.OK, lac=3))  # one bookie a write set: fenced
    assert effects == [SendRecoveryRead(4, (0, 1)), SendRecoveryRead(5, (1, 0))]
    effects = m.step(EntryRead(4, 0, Status.OK, blob(4), length(4)))
    assert effects == [SendRewrite(4, blob(4), (0, 1)), SendRecoveryRead(6, (0, 1))]
    assert m.step(EntryRewritten(4, 0, Status.OK, bookie="A")) == []
    assert m.step(EntryRewritten(4, 1, Status.IO_ERROR, bookie="B")) == [
        SendRewrite(4, blob(4), (1,))
    ]
    # Out of rounds, but the end is not known yet: nothing is replaced before it is.
    assert m.step(EntryRewritten(4, 1, Status.IO_ERROR, bookie="B")) == []
    [choose] = m.step(EntryRead(5, 0, Status.NO_SUCH_ENTRY))  # the end: one "no" suffices
    assert choose == ChooseBookies((1,), frozenset({"A", "B"}))  # never B or A again
    # C gets entry 4 first; A's ack still counts (A holds it under the new fragment too).
    assert m.step(BookiesChosen((1,), ("C",))) == [SendRewrite(4, blob(4), (1,))]
    assert m.write_ensemble == ("A", "C")
    assert m.step(EntryRewritten(4, 1, Status.OK, bookie="B")) == []  # B's late answer
    [update] = m.step(EntryRewritten(4, 1, Status.OK, bookie="C"))
    assert isinstance(update, UpdateMetadata)
    # The fragment starts at the first entry being rewritten, after the fenced LAC.
    assert update.decide(view) == NewFragment(4, ("A", "C"))
    changed = replace(view, ensembles=(*view.ensembles, (4, ("A", "C"))))
    assert update.decide(changed) == Settled()  # an earlier attempt was applied
    theirs = replace(view, ensembles=(*view.ensembles, (4, ("A", "D"))))
    assert isinstance(update.decide(theirs), Refused)  # another recovery moved on
    [close] = m.step(MetadataStored(changed))
    assert isinstance(close, UpdateMetadata) and close.decide(changed) == CloseAt(4, length(4))
    # Had another recovery changed the ensemble meanwhile, this one must not close.
    assert isinstance(close.decide(theirs), Refused)
    closed = replace(changed, state=CLOSED, last_entry_id=4)
    assert m.step(MetadataStored(closed)) == [Recovered(closed, ran_to_close=True)]


def test_r8_the_replacement_gets_the_entries_rewritten_before_the_change():
    """E = 3, Qw = Qa = 2: entry 4 reached Qa on B and C before C failed entry 5; once C
    is replaced from entry 5, entry 4 stays with C in the old fragment, entry 5 goes to
    D."""
    view = LedgerView(IN_RECOVERY, -1, ((0, ("A", "B", "C")),))
    m = LedgerRecoveryMachine(LEDGER, 3, 2, 2, view, reads_in_flight=3, rewrite_attempts=1)
    m.start()
    m.step(MetadataStored(view))
    m.step(FenceAnswered(0, Status.OK, lac=3))
    m.step(FenceAnswered(1, Status.OK, lac=3))
    m.step(FenceAnswered(2, Status.IO_ERROR))
    m.step(EntryRead(4, 1, Status.OK, blob(4), length(4)))  # write set (1, 2)
    m.step(EntryRead(5, 2, Status.OK, blob(5), length(5)))  # write set (2, 0)
    m.step(EntryRewritten(4, 1, Status.OK))
    m.step(EntryRewritten(4, 2, Status.OK))  # 4 is on Qa bookies: B and C
    m.step(EntryRewritten(5, 0, Status.OK))
    assert m.step(EntryRewritten(5, 2, Status.IO_ERROR)) == []  # the end is not known yet
    [choose] = m.step(EntryRead(6, 0, Status.NO_SUCH_ENTRY))
    assert choose == ChooseBookies((2,), frozenset({"A", "B", "C"}))
    assert m.step(BookiesChosen((2,), ("D",))) == [SendRewrite(5, blob(5), (2,))]
    [update] = m.step(EntryRewritten(5, 2, Status.OK))
    assert update.decide(view) == NewFragment(5, ("A", "B", "D"))  # 4 stays with C
    changed = replace(view, ensembles=(*view.ensembles, (5, ("A", "B", "D"))))
    [close] = m.step(MetadataStored(changed))
    assert close.decide(changed) == CloseAt(5, length(5))


def test_p3_r8_a_second_replacement_gets_every_entry_of_the_fragment():
    """E = Qw = Qa = 3, Y1 dead: the recovery replaces Y1 by X1 from entry 0; X1 takes
    0-2 and dies on 3; X2 replaces X1. The fragment recorded from 0 names X2 for 0-2, so
    X2 must get them too, not only 3."""
    view = LedgerView(IN_RECOVERY, -1, ((0, ("Y0", "Y1", "Y2")),))
    m = LedgerRecoveryMachine(LEDGER, 3, 3, 3, view, reads_in_flight=5, rewrite_attempts=1)
    m.start()
    m.step(MetadataStored(view))
    m.step(FenceAnswered(1, Status.IO_ERROR))
    m.step(FenceAnswered(0, Status.OK, lac=-1))  # one bookie of each write set: fenced
    for entry_id in range(4):
        m.step(EntryRead(entry_id, 0, Status.OK, blob(entry_id), length(entry_id)))
    m.step(EntryRead(4, 0, Status.NO_SUCH_ENTRY))  # the end: one "no" suffices
    for entry_id in range(4):
        m.step(EntryRewritten(entry_id, 0, Status.OK, bookie="Y0"))
        m.step(EntryRewritten(entry_id, 2, Status.OK, bookie="Y2"))
    effects: list[RecoveryEffect] = []
    for entry_id in range(4):
        effects = m.step(EntryRewritten(entry_id, 1, Status.IO_ERROR, bookie="Y1"))
    assert effects == [ChooseBookies((1,), frozenset({"Y0", "Y1", "Y2"}))]
    effects = m.step(BookiesChosen((1,), ("X1",)))
    assert effects == [SendRewrite(e, blob(e), (1,)) for e in range(4)]
    for entry_id in range(3):
        assert m.step(EntryRewritten(entry_id, 1, Status.OK, bookie="X1")) == []
    [choose] = m.step(EntryRewritten(3, 1, Status.IO_ERROR, bookie="X1"))
    assert choose == ChooseBookies((1,), frozenset({"Y0", "X1", "Y2", "Y1"}))
    effects = m.step(BookiesChosen((1,), ("X2",)))
    # The fragment will start at 0: X2 needs 0-2 as well as 3.
    assert effects == [SendRewrite(e, blob(e), (1,)) for e in range(4)]
    for entry_id in range(3):
        assert m.step(EntryRewritten(entry_id, 1, Status.OK, bookie="X2")) == []
    [update] = m.step(EntryRewritten(3, 1, Status.OK, bookie="X2"))
    assert isinstance(update, UpdateMetadata)
    assert update.decide(view) == NewFragment(0, ("Y0", "X2", "Y2"))


# ------------------------------------------------------------------ random schedules


def test_an_answer_before_its_request_could_be_sent_fails_loudly():
    view = LedgerView(OPEN, -1, ((0, ("A", "B", "C")),))
    m = machine(view)
    m.start()  # marking: no fence, read or rewrite was sent yet
    for early in (
        FenceAnswered(0, Status.OK, lac=3),
        EntryRead(0, 0, Status.OK, blob(0), length(0)),
        EntryRewritten(0, 0, Status.OK),
        BookiesChosen((0,), ("D",)),
    ):
        with pytest.raises(CoreInvariantError, match="before any such request"):
            m.step(early)
    m.step(MetadataStored(replace(view, state=IN_RECOVERY)))
    with pytest.raises(CoreInvariantError, match="before any such request"):
        m.step(EntryRead(0, 0, Status.OK, blob(0), length(0)))  # fencing, not reading


def test_a_metadata_answer_with_no_update_under_way_fails_loudly():
    view = LedgerView(IN_RECOVERY, -1, ((0, ("A", "B", "C")),))
    m = machine(view)
    m.start()
    m.step(MetadataStored(view))  # fencing now: no update under way
    with pytest.raises(CoreInvariantError, match="no update under way"):
        m.step(MetadataStored(view))
