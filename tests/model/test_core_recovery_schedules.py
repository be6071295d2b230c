"""Recovery as a state machine (core/recovery.py LedgerRecoveryMachine) under random
schedules: R7, R8, R13.

A dead writer left each entry of the last fragment on a random subset of its write set;
bookies answer fences, fencing reads and recovery adds in any order, some with errors;
the metadata store loses replies and another recovery may close first. Checked against
a brute-force reference of the coverage rules: the ledger never closes before an entry
Qa bookies of its write set held (one the writer may have confirmed), never past an
entry that could not have been confirmed, and every entry up to the end is on Qa
bookies when the close is written. Its transcripts are tests/unit/test_core_recovery.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

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
    OPEN,
    LedgerView,
    NewFragment,
    ReadMetadata,
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
    SendFence,
    SendRecoveryRead,
    SendRewrite,
)
from quorumlog.core.writer import BookiesChosen, ChooseBookies, NoBookies
from quorumlog.errors import MetadataError, Status

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
