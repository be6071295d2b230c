"""The writer's state machine (core/writer.py) under random schedules (R3, R5, R6, R13).

A property test drives it with random schedules against a model of the bookies and the
metadata store, and checks it against a brute-force reference of the coverage rules:
an entry may be confirmed only once Qa bookies of its write set, in the fragment the
metadata records, acknowledged it, and every entry below it is confirmed. Its
transcripts are tests/unit/test_core_writer.py.
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

from quorumlog.core.metadata import (
    CLOSED,
    IN_RECOVERY,
    OPEN,
    CloseAt,
    LedgerView,
    NewFragment,
    ReadMetadata,
    UpdateMetadata,
)
from quorumlog.core.writer import (
    AddFailed,
    BookiesChosen,
    ChooseBookies,
    Closed,
    CloseFailed,
    CloseRequested,
    Confirm,
    FailAdds,
    HandleFailed,
    LedgerWriter,
    NoBookies,
    SendQueued,
    WriterEffect,
    WriterEvent,
)
from quorumlog.errors import (
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
