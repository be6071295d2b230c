"""The writer's state machine (core/writer.py): adds, acks, bookie failures, ensemble
changes, metadata outcomes known and unknown, close (R3, R5, R6, R13).

First a few transcripts of the cases that matter most, then a property test that
drives the state machine with random schedules against a model of the bookies and the
metadata store, and checks it against a brute-force reference of the coverage rules:
an entry may be confirmed only once Qa bookies of its write set, in the fragment the
metadata records, acknowledged it, and every entry below it is confirmed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from metadata_model import compare_and_set, random_schedule_settings, read_reply, ref_write_set

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
    WriterEvent,
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


# ------------------------------------------------------------------ the reference


def ref_fragment(entry_id: int, view: LedgerView) -> tuple[str, ...]:
    """The ensemble of the last fragment that starts at or before ``entry_id``."""
    return [bookies for first, bookies in view.ensembles if first <= entry_id][-1]


def ref_may_confirm(
    entry_id: int, view: LedgerView, acks: dict[str, set[int]], write_quorum: int, ack_quorum: int
) -> bool:
    """Qa bookies of the entry's write set, in the fragment ``view`` records, acked it."""
    holders = [
        b
        for b in ref_write_set(entry_id, ref_fragment(entry_id, view), write_quorum)
        if entry_id in acks.get(b, set())
    ]
    return len(holders) >= ack_quorum


def ref_lac(
    view: LedgerView, acks: dict[str, set[int]], next_entry_id: int, wq: int, aq: int
) -> int:
    """R3: the largest entry id below which (inclusive) every entry may be confirmed."""
    lac = -1
    while lac + 1 < next_entry_id and ref_may_confirm(lac + 1, view, acks, wq, aq):
        lac += 1
    return lac


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


@dataclass
class Model:
    """The world around one writer: bookies that store what they acknowledge, and a
    metadata store that applies compare-and-sets, loses replies and lets a recovery in.
    It carries out the writer's effects the way the ledger handle does."""

    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    writer: LedgerWriter = field(init=False)
    store: LedgerView = field(init=False)
    in_flight: list[tuple[str, int, int, list[int]]] = field(default_factory=list)
    # Entries each bookie acknowledged: it holds them durably (R2).
    acked: dict[str, set[int]] = field(default_factory=dict)
    # The same, before the bookie was reported failed: after that the writer trusts
    # nothing it says, so these are what it must have confirmed from.
    told: dict[str, set[int]] = field(default_factory=dict)
    distrusted: set[str] = field(default_factory=set)
    choosing: ChooseBookies | None = None
    pending: UpdateMetadata | ReadMetadata | None = None
    reply: WriterEvent | None = None  # of an update done in the store, not yet delivered
    confirmed: list[int] = field(default_factory=list)
    failed: set[int] = field(default_factory=set)
    handle_failed: bool = False
    close_outcome: WriterEffect | None = None
    fresh_bookies: int = 0

    def __post_init__(self) -> None:
        bookies = tuple(f"b{i}" for i in range(self.ensemble_size))
        self.fresh_bookies = self.ensemble_size
        self.store = LedgerView(OPEN, -1, ((0, bookies),))
        self.writer = LedgerWriter(
            LEDGER,
            self.ensemble_size,
            self.write_quorum,
            self.ack_quorum,
            self.store,
            metadata_attempts=3,
        )

    # -------------------------------------------------------- the handle's part

    def carry_out(self, effects: list[WriterEffect]) -> None:
        for effect in effects:
            if isinstance(effect, Confirm):
                self.confirm(effect.entries)
            elif isinstance(effect, FailAdds):
                for p in effect.entries:
                    assert p.entry_id not in self.confirmed
                    self.failed.add(p.entry_id)
            elif isinstance(effect, HandleFailed):
                assert not self.handle_failed, "the handle failed twice"
                self.handle_failed = True
            elif isinstance(effect, SendQueued):
                self.flush()
            elif isinstance(effect, ChooseBookies):
                assert self.choosing is None
                self.choosing = effect
            elif isinstance(effect, UpdateMetadata | ReadMetadata):
                # One policy: one metadata update (or the read resolving it) at a time.
                assert self.pending is None and self.reply is None, (self.pending, effect)
                self.pending = effect
            elif isinstance(effect, Closed | CloseFailed):
                assert self.close_outcome is None
                self.close_outcome = effect

    def confirm(self, entries) -> None:
        for p in entries:
            assert p.entry_id == len(self.confirmed), "R3: confirmed out of order"
            assert p.entry_id not in self.failed
            self.confirmed.append(p.entry_id)

    def flush(self) -> None:
        for slot, generation, queue in self.writer.take_sends():
            address = self.writer.ensemble[slot]
            self.in_flight.append((address, slot, generation, [p.entry_id for p in queue]))

    # -------------------------------------------------------- actions

    def add(self) -> None:
        if self.writer.refusal() is None:
            self.writer.add(blob(self.writer.tracker.next_entry_id), None)
            self.flush()

    def deliver(self, index: int, outcome: str) -> None:
        if not self.in_flight:
            return
        address, slot, generation, entry_ids = self.in_flight.pop(index % len(self.in_flight))
        if outcome == "ack":
            self.acked.setdefault(address, set()).update(entry_ids)
            if address not in self.distrusted:
                self.told.setdefault(address, set()).update(entry_ids)
            self.confirm(self.writer.ack(slot, generation, entry_ids))
        elif outcome == "fenced" and self.store.state != OPEN:
            self.carry_out(self.writer.step(AddFailed(slot, generation, Status.FENCED, "")))
        else:  # a timeout or an error: the bookie may or may not have the entries
            self.distrusted.add(address)
            self.carry_out(self.writer.step(AddFailed(slot, generation, Status.IO_ERROR, "")))

    def recovery_starts(self) -> None:
        if self.store.state == OPEN:
            self.store = replace(self.store, state=IN_RECOVERY)

    def choose(self, outcome: str) -> None:
        effect, self.choosing = self.choosing, None
        if effect is None:
            return
        if outcome == "fail":
            self.carry_out(self.writer.step(NoBookies(NotEnoughBookiesError("none"))))
            return
        chosen = []
        for _ in effect.slots:
            chosen.append(f"b{self.fresh_bookies}")
            self.fresh_bookies += 1
        assert not set(chosen) & effect.excluded
        self.carry_out(self.writer.step(BookiesChosen(effect.slots, tuple(chosen))))

    def answer_pending(self, outcome: str) -> None:
        """The store works on the pending update (its reply waits for deliver_reply, so
        that a recovery or a FENCED answer can come between) or answers the read."""
        effect, self.pending = self.pending, None
        if effect is None:
            return
        if isinstance(effect, ReadMetadata):
            self.carry_out(self.writer.step(read_reply(self.store, outcome)))
        else:
            self.update(effect, outcome)

    def update(self, effect: UpdateMetadata, outcome: str) -> None:
        """LedgerManager.update on the model store: decide, write, maybe lose the reply."""
        if outcome == "race":  # a recovery's compare-and-set wins first: decide again
            self.recovery_starts()
        self.store, self.reply = compare_and_set(self.store, effect, outcome, self.check_write)

    def deliver_reply(self) -> None:
        event, self.reply = self.reply, None
        if event is not None:
            self.carry_out(self.writer.step(event))

    def check_write(self, store: LedgerView, decision: object) -> None:
        assert store.state == OPEN, "C3: a write to a ledger that is not OPEN"
        if isinstance(decision, NewFragment):
            # R5: a new fragment starts past every entry confirmed so far.
            assert decision.first_entry_id > (self.confirmed[-1] if self.confirmed else -1)
        else:
            assert isinstance(decision, CloseAt)  # the writer never marks a recovery

    def close(self, request: bool) -> None:
        self.writer.begin_close()
        if request and len(self.writer.tracker) == 0 and self.close_outcome is None:
            self.carry_out(self.writer.step(CloseRequested()))

    # -------------------------------------------------------- what must hold

    def check(self) -> None:
        writer = self.writer
        shape = (self.write_quorum, self.ack_quorum)
        # Safety: everything confirmed is on Qa bookies of the write set the store
        # records for it, whatever happened to the replies.
        for entry_id in self.confirmed:
            assert ref_may_confirm(entry_id, self.store, self.acked, *shape), (
                f"entry {entry_id} confirmed, but the write set {self.store} records "
                f"for it holds fewer than Qa of {self.acked}"
            )
        assert writer.lac == (self.confirmed[-1] if self.confirmed else -1)
        # Exactness: when nothing holds confirmation back, the writer has confirmed all
        # that the reference allows from what it was told.
        if not writer.confirmations_held:
            expected = ref_lac(self.store, self.told, writer.tracker.next_entry_id, *shape)
            assert writer.lac == expected, (writer.lac, expected, self.store, self.told)
        if self.store.state == CLOSED and isinstance(self.close_outcome, Closed):
            assert self.store.last_entry_id == writer.lac

    def settle(self) -> None:
        """Let everything finish without faults; then no add is left unresolved, and a
        writer that did not fail confirmed everything it added."""
        for _ in range(1_000):
            if self.reply is not None:
                self.deliver_reply()
            elif self.choosing is not None:
                self.choose("ok")
            elif self.pending is not None:
                self.answer_pending("ok")
            elif self.in_flight:
                self.deliver(0, "ack")
            else:
                break
            self.check()
        added = self.writer.tracker.next_entry_id
        if self.writer.failure is None:
            assert self.confirmed == list(range(added))
        else:
            assert set(self.confirmed) | self.failed == set(range(added))


SHAPES = st.integers(1, 4).flatmap(
    lambda e: st.integers(1, e).flatmap(
        lambda wq: st.tuples(st.just(e), st.just(wq), st.integers(1, wq))
    )
)


class RandomSchedules(RuleBasedStateMachine):
    """Random schedules of adds, answers, failures, recoveries and metadata outcomes;
    after each step the model checks the writer against the reference (Model.check)."""

    def __init__(self) -> None:
        super().__init__()
        self.model: Model | None = None

    @initialize(shape=SHAPES)
    def start(self, shape: tuple[int, int, int]) -> None:
        self.model = Model(*shape)

    @rule(count=st.integers(1, 3))
    def add(self, count: int) -> None:
        for _ in range(count):
            self.m.add()

    @precondition(lambda self: self.m.in_flight)
    @rule(index=st.integers(0, 50), outcome=st.sampled_from(["ack", "ack", "ack", "error"]))
    def bookie_answers(self, index: int, outcome: str) -> None:
        self.m.deliver(index, outcome)

    @precondition(lambda self: self.m.in_flight and self.m.store.state != OPEN)
    @rule(index=st.integers(0, 50))
    def bookie_answers_fenced(self, index: int) -> None:
        self.m.deliver(index, "fenced")

    @precondition(lambda self: self.m.store.state == OPEN)
    @rule()
    def recovery_starts(self) -> None:
        self.m.recovery_starts()

    @precondition(lambda self: self.m.choosing is not None)
    @rule(outcome=st.sampled_from(["ok", "ok", "ok", "fail"]))
    def bookies_chosen(self, outcome: str) -> None:
        self.m.choose(outcome)

    @precondition(lambda self: self.m.pending is not None)
    @rule(
        outcome=st.sampled_from(
            ["ok", "ok", "applied-lost", "not-applied-lost", "conflicts", "race", "fail"]
        )
    )
    def store_works(self, outcome: str) -> None:
        self.m.answer_pending(outcome)

    @precondition(lambda self: self.m.reply is not None)
    @rule()
    def store_replies(self) -> None:
        self.m.deliver_reply()

    @rule(request=st.booleans())
    def close(self, request: bool) -> None:
        self.m.close(request)

    @property
    def m(self) -> Model:
        assert self.model is not None
        return self.model

    @invariant()
    def writer_agrees_with_the_reference(self) -> None:
        if self.model is not None:
            self.model.check()

    def teardown(self) -> None:
        if self.model is not None:
            self.model.settle()


RandomSchedules.TestCase.settings = random_schedule_settings(max_examples=600)
test_c1_r3_r5_r13_random_schedules_never_confirm_what_the_recorded_write_sets_lack = (
    RandomSchedules.TestCase
)


@pytest.mark.parametrize("shape", [(2, 2, 2), (3, 3, 2), (3, 2, 2), (4, 3, 1)])
def test_r3_without_faults_every_entry_is_confirmed_in_order(shape):
    model = Model(*shape)
    for _ in range(30):
        model.add()
    model.settle()
    assert model.confirmed == list(range(30))


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
