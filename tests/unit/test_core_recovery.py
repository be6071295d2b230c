"""Recovery as a state machine (core/recovery.py LedgerRecoveryMachine): R7, R8, R13.

A few transcripts, then random schedules: a dead writer left each entry of the last
fragment on a random subset of its write set; bookies answer fences, fencing reads and
recovery adds in any order, some with errors; the metadata store loses replies and
another recovery may close first. Checked against a brute-force reference of the
coverage rules: the ledger never closes before an entry Qa bookies of its write set
held (one the writer may have confirmed), never past an entry that could not have been
confirmed, and every entry up to the end is on Qa bookies when the close is written.
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
from quorumlog.core.writer import BookiesChosen, ChooseBookies, NoBookies
from quorumlog.errors import LedgerRecoveryError, MetadataError, Status

LEDGER = 1


def blob(entry_id: int) -> bytes:
    return b"entry %d" % entry_id


def length(entry_id: int) -> int:
    return 10 * (entry_id + 1)


# ------------------------------------------------------------------ the reference


def ref_held_by_qa(
    entry_id: int, holders: dict[int, set[str]], ensemble: tuple[str, ...], wq: int, aq: int
) -> bool:
    """Qa bookies of the entry's write set hold it: the writer may have confirmed it."""
    on = [b for b in ref_write_set(entry_id, ensemble, wq) if b in holders.get(entry_id, set())]
    return len(on) >= aq


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


@dataclass
class World:
    """The bookies a dead writer left behind and the metadata store; answers the
    machine's requests honestly, late, or with errors."""

    shape: tuple[int, int, int]
    first: int  # first entry of the last fragment
    holders: dict[int, set[str]]  # entry -> bookies holding it (last fragment)
    lac_of: dict[int, int]  # entry -> the LAC it carries
    dead: str | None = None  # a bookie gone for good: it fails every request
    store: LedgerView = field(init=False)
    m: LedgerRecoveryMachine = field(init=False)
    requests: list[tuple] = field(default_factory=list)  # bookie requests not answered
    metadata: UpdateMetadata | ReadMetadata | ReadLength | ChooseBookies | None = None
    replacements: int = 0
    outcome: RecoveryEffect | None = None
    errors_injected: bool = False
    confirmable_end: int = field(init=False)  # the reference: last entry maybe confirmed

    def __post_init__(self) -> None:
        e, wq, aq = self.shape
        self.ensemble = tuple(f"b{i}" for i in range(e))
        fragments = ((0, tuple(f"old{i}" for i in range(e))), (self.first, self.ensemble))
        self.store = LedgerView(OPEN, -1, fragments if self.first > 0 else fragments[1:])
        self.m = LedgerRecoveryMachine(
            LEDGER, e, wq, aq, self.store, reads_in_flight=3, rewrite_attempts=2,
            metadata_attempts=3,
        )  # fmt: skip
        end = self.first - 1  # everything before the last fragment was confirmed (R5)
        while ref_held_by_qa(end + 1, self.holders, self.ensemble, wq, aq):
            end += 1
        self.confirmable_end = end
        self.original = {k: set(v) for k, v in self.holders.items()}
        self.carry_out(self.m.start())

    def carry_out(self, effects: list[RecoveryEffect]) -> None:
        for effect in effects:
            if isinstance(effect, SendFence):
                self.requests += [("fence", slot) for slot in effect.slots]
            elif isinstance(effect, SendRecoveryRead):
                # R8: recovery only touches the last fragment.
                assert effect.entry_id >= self.first
                self.requests += [("read", effect.entry_id, s) for s in effect.slots]
            elif isinstance(effect, SendRewrite):
                assert effect.blob == blob(effect.entry_id)
                to = self.m.write_ensemble
                self.requests += [("rewrite", effect.entry_id, to[s], s) for s in effect.slots]
            elif isinstance(effect, UpdateMetadata | ReadMetadata | ReadLength | ChooseBookies):
                assert self.metadata is None, (self.metadata, effect)
                self.metadata = effect
            else:
                assert self.outcome is None
                self.outcome = effect
                if isinstance(effect, Recovered):
                    self.check_close(effect.view)

    def bookie_lac(self, slot: int) -> int:
        held = [self.lac_of[e] for e, on in self.holders.items() if self.ensemble[slot] in on]
        return max(held, default=-1)

    def answer(self, index: int, honest: bool) -> None:
        if not self.requests:
            return
        request = self.requests.pop(index % len(self.requests))
        kind, slot = request[0], request[-1]
        target = request[2] if kind == "rewrite" else self.ensemble[slot]
        if target == self.dead:
            honest = False  # not an injected error: the recovery must live with it
        elif not honest:
            self.errors_injected = True
        if kind == "fence":
            status = Status.OK if honest else Status.IO_ERROR
            event = FenceAnswered(slot, status, self.bookie_lac(slot) if honest else -1)
        elif kind == "read":
            entry_id = request[1]
            if not honest:
                event = EntryRead(entry_id, slot, Status.IO_ERROR)
            elif self.ensemble[slot] in self.holders.get(entry_id, set()):
                event = EntryRead(entry_id, slot, Status.OK, blob(entry_id), length(entry_id))
            else:
                event = EntryRead(entry_id, slot, Status.NO_SUCH_ENTRY)
        else:
            entry_id, bookie = request[1], request[2]
            if honest:
                self.holders.setdefault(entry_id, set()).add(bookie)
            status = Status.OK if honest else Status.IO_ERROR
            event = EntryRewritten(entry_id, slot, status, bookie=bookie)
        self.carry_out(self.m.step(event))

    def answer_metadata(self, outcome: str) -> None:
        effect, self.metadata = self.metadata, None
        if effect is None:
            return
        if isinstance(effect, ChooseBookies):
            # Never a bookie of the ensemble, nor one replaced before.
            assert set(self.m.write_ensemble) <= effect.excluded
            if outcome == "fail":
                self.carry_out(self.m.step(NoBookies(MetadataError("no bookies"))))
                return
            chosen = tuple(f"new{self.replacements + i}" for i in range(len(effect.slots)))
            self.replacements += len(effect.slots)
            self.carry_out(self.m.step(BookiesChosen(effect.slots, chosen)))
            return
        if isinstance(effect, ReadLength):
            known = outcome != "fail"
            self.carry_out(self.m.step(LengthRead(length(effect.entry_id) if known else None)))
            return
        if isinstance(effect, ReadMetadata):
            self.carry_out(self.m.step(read_reply(self.store, outcome)))
            return
        if outcome == "other-closes":  # a concurrent recovery closes at the true end
            self.store = replace(self.store, state=CLOSED, last_entry_id=self.confirmable_end)
        self.store, event = compare_and_set(self.store, effect, outcome, self.check_write)
        self.carry_out(self.m.step(event))

    def check_write(self, store: LedgerView, decision: object) -> None:
        if isinstance(decision, NewFragment):
            # R8: never reaches into an earlier fragment.
            assert decision.first_entry_id >= self.first

    def check_close(self, view: LedgerView) -> None:
        _, wq, aq = self.shape
        last = view.last_entry_id
        # Nothing the writer may have confirmed is cut off (R8) ...
        assert last >= self.confirmable_end, (last, self.confirmable_end, self.original)
        if self.store.last_entry_id != view.last_entry_id:
            return
        # ... nothing is invented past an entry that could not have been confirmed ...
        assert last == self.first - 1 or self.original.get(last), (last, self.original)
        assert not ref_held_by_qa(last + 1, self.original, self.ensemble, wq, aq)
        # ... and every entry up to the end is on Qa bookies of its write set as the
        # metadata records it (after the recovery's ensemble changes), readable.
        for entry_id in range(self.first, last + 1):
            ensemble = view.ensemble_for(entry_id)
            assert ref_held_by_qa(entry_id, self.holders, ensemble, wq, aq), (entry_id, view)

    def settle(self) -> None:
        """Answer everything honestly: a recovery that saw no error must finish."""
        for _ in range(10_000):
            if self.metadata is not None:
                self.answer_metadata("ok")
            elif self.requests:
                self.answer(0, honest=True)
            else:
                break
        # With a bookie gone for good, recovery still ends when one explicit answer
        # less than Qw suffices to fence and to find the end (Qa >= 2); with Qa = Qw it
        # replaces the dead bookie for its rewrites.
        _, _, aq = self.shape
        if not self.errors_injected and (self.dead is None or aq >= 2):
            assert isinstance(self.outcome, Recovered), self.outcome


@st.composite
def histories(draw):
    e = draw(st.integers(1, 4))
    wq = draw(st.integers(1, e))
    aq = draw(st.integers(1, wq))
    first = draw(st.sampled_from([0, 0, 3]))
    count = draw(st.integers(0, 8))
    ensemble = [f"b{i}" for i in range(e)]
    holders: dict[int, set[str]] = {}
    lac_of: dict[int, int] = {}
    confirmed = first - 1
    for entry_id in range(first, first + count):
        write_set = ref_write_set(entry_id, tuple(ensemble), wq)
        on = draw(st.sets(st.sampled_from(write_set)))
        holders[entry_id] = on
        # The LAC an entry carries was confirmed when it was sent: at most the end of
        # the prefix held by Qa bookies before it.
        lac_of[entry_id] = draw(st.integers(first - 1, max(first - 1, confirmed)))
        if confirmed == entry_id - 1 and len(on) >= aq:
            confirmed = entry_id
    dead = draw(st.sampled_from([None, None, "b0"]))
    return (e, wq, aq), first, holders, lac_of, dead


class RandomRecoveries(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world: World | None = None

    @initialize(history=histories())
    def start(self, history) -> None:
        shape, first, holders, lac_of, dead = history
        self.world = World(shape, first, holders, lac_of, dead)

    @property
    def w(self) -> World:
        assert self.world is not None
        return self.world

    @precondition(lambda self: self.w.requests)
    @rule(index=st.integers(0, 40), honest=st.sampled_from([True] * 4 + [False]))
    def bookie_answers(self, index: int, honest: bool) -> None:
        self.w.answer(index, honest)

    @precondition(lambda self: self.w.metadata is not None)
    @rule(
        outcome=st.sampled_from(
            ["ok", "ok", "ok", "applied-lost", "not-applied-lost", "other-closes", "fail"]
        )
    )
    def store_answers(self, outcome: str) -> None:
        if outcome != "ok":
            self.w.errors_injected = True
        self.w.answer_metadata(outcome)

    @rule()
    def time_passes(self) -> None:
        """Nothing answers (hung bookies, a slow store): the machine just waits."""

    @invariant()
    def at_most_one_outcome(self) -> None:
        if self.world is not None and self.world.outcome is not None:
            assert self.world.m.step(LengthRead(0)) == []  # done: deaf to late answers

    def teardown(self) -> None:
        if self.world is not None:
            self.world.settle()


RandomRecoveries.TestCase.settings = random_schedule_settings(max_examples=500)
test_r7_r8_r13_random_recoveries_keep_every_entry_qa_bookies_held = RandomRecoveries.TestCase


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
