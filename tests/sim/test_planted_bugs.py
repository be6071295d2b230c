"""The checkers' power: known protocol bugs, planted one at a time, fail a named rule.

Each bug is planted by patching the real code in this process (never by editing a
file); the simulator's seeds then run in order in forked workers, which inherit the
patch, until one breaks a rule. The test asserts that this happens within a bounded
number of seeds, and that the first failing seed names one of the rules the bug
breaks (quorumlog.testing.checkers), not only a hang or an exception.

``QUORUMLOG_PLANTED_MAX_SEEDS`` raises or lowers the bound.
"""

from __future__ import annotations

import os
import types
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from quorumlog.bookie import ledger_changes, ledger_state, reads, requests, storage
from quorumlog.bookie.journal import format as journal_format
from quorumlog.bookie.journal import writer as journal_writer
from quorumlog.client import bookkeeper as client_bookkeeper
from quorumlog.client import recovery as client_recovery
from quorumlog.client import writing as client_writing
from quorumlog.core import metadata as core_metadata
from quorumlog.core import recovery as core_recovery
from quorumlog.core import writer as core_writer
from quorumlog.core.adds import AddTracker
from quorumlog.core.writer import BookiesChosen
from quorumlog.errors import BookieIOError, MetadataError, Status
from quorumlog.log import writer as log_writer
from quorumlog.proto.codec import AddRequest, ReadFlag, ReadLacResponse, Response
from quorumlog.replication import copy as replication_copy
from quorumlog.server import gc as server_gc
from tests.harness.sim.runner import first_failure

MAX_SEEDS = int(os.environ.get("QUORUMLOG_PLANTED_MAX_SEEDS", "2000"))


@dataclass(frozen=True)
class Planted:
    plant: Callable[[pytest.MonkeyPatch], None]
    rules: frozenset[str]  # a first failing seed must name at least one of these


def _recovery_reads_without_fence(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(client_recovery, "ReadFlag", types.SimpleNamespace(FENCE=ReadFlag(0)))


def _fragment_one_entry_late(mp: pytest.MonkeyPatch) -> None:
    replace = AddTracker.replace_bookie
    mp.setattr(AddTracker, "replace_bookie", lambda self, i, first: replace(self, i, first + 1))


def _ack_quorum_off_by_one(mp: pytest.MonkeyPatch) -> None:
    init = AddTracker.__init__

    def off_by_one(self: AddTracker, ensemble: int, write: int, ack: int, lac: int = -1) -> None:
        init(self, ensemble, write, ack, lac)
        self.ack_quorum = ack - 1

    mp.setattr(AddTracker, "__init__", off_by_one)


def _acks_before_the_journal_sync(mp: pytest.MonkeyPatch) -> None:
    def no_sync(self: journal_writer.Journal) -> None:
        self._unsynced = False

    mp.setattr(journal_writer.Journal, "_sync_current", no_sync)


def _fence_not_persisted(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(
        ledger_changes, "fence_record", lambda ledger_id: journal_format.lac_record(ledger_id, -1)
    )
    mp.setattr(ledger_state, "_FLAG_FENCED", 0)


def _recovery_counts_errors_as_missing(mp: pytest.MonkeyPatch) -> None:
    read = core_recovery.EntryRecoveryRead
    mp.setattr(read, "on_unknown", read.on_missing)


def _log_writer_skips_fencing(mp: pytest.MonkeyPatch) -> None:
    async def fence_nothing(log_obj: object, metadata: object) -> list[int]:
        return []

    mp.setattr(log_writer, "fence_previous_ledgers", fence_nothing)


def _unknown_metadata_outcome_taken_as_refused(mp: pytest.MonkeyPatch) -> None:
    """C1: a compare-and-set whose reply was lost counts as not written, so a writer whose
    fragment was in fact recorded confirms entries from the old write set, counting the
    replaced bookie's acks (R13)."""
    on_event = core_metadata.PendingUpdate.on_event

    def unknown_is_refused(
        self: core_metadata.PendingUpdate, event: core_metadata.MetadataEvent
    ) -> object:
        if isinstance(event, core_metadata.MetadataUnknown):
            return core_metadata.Refused(event.error)
        return on_event(self, event)

    mp.setattr(core_metadata.PendingUpdate, "on_event", unknown_is_refused)


def _gc_reads_without_sync(mp: pytest.MonkeyPatch) -> None:
    """R18: garbage collection believes a lagging server's listing (the simulator's stale
    listing), which misses a ledger created since, and drops the bookie's copy of it."""

    async def no_sync(self: server_gc.StoreGcMetadata) -> None:
        return None

    async def unsynced(self: server_gc.StoreGcMetadata) -> object:
        return self._store()

    mp.setattr(server_gc.StoreGcMetadata, "sync", no_sync)
    mp.setattr(server_gc.StoreGcMetadata, "_read_store", unsynced)


def _a_read_after_an_unknown_outcome_taken_as_current(mp: pytest.MonkeyPatch) -> None:
    """R13 with R18: after a compare-and-set whose reply was lost, a read that does not
    show the write is taken to prove it was not applied (refused), as if the read were
    current. A client that lost its connection may read from a server that has not
    applied its write yet (the simulator's lagging clients): the writer then confirms
    entries from a fragment the metadata no longer names, as C1 does."""
    on_event = core_metadata.PendingUpdate.on_event

    def read_taken_as_current(
        self: core_metadata.PendingUpdate, event: core_metadata.MetadataEvent
    ) -> object:
        if isinstance(event, core_metadata.MetadataRead) and self._unknown:
            decision = self.decide(event.view)
            if not isinstance(decision, core_metadata.Settled | core_metadata.Refused):
                return core_metadata.Refused(MetadataError("not written, as read"))
        return on_event(self, event)

    mp.setattr(core_metadata.PendingUpdate, "on_event", read_taken_as_current)


def _rereplication_copies_nothing(mp: pytest.MonkeyPatch) -> None:
    """Re-replication puts the replacement into the fragment without copying the lost
    bookie's entries to it: the metadata names a bookie that holds nothing."""

    async def copy_nothing(self: replication_copy.FragmentCopier, blobs: list[bytes]) -> None:
        return None

    mp.setattr(replication_copy.FragmentCopier, "_write", copy_nothing)


def _second_replacement_gets_only_its_own_entries(mp: pytest.MonkeyPatch) -> None:
    """P3 (found by the model checker, fixed in core/recovery.py): when a recovery's
    replacement dies part-way and another replaces it, only the entries from the second
    change's first stuck entry are checked again, though the fragment recorded names
    the second replacement from the first change's entry. The method as it was.

    Planted by tests/model/test_model_checker.py (found in a second): the simulator's
    seeds reach a replacement dying during a recovery's rewrites too rarely to be sure
    of it within the bounded seeds."""
    machine = core_recovery.LedgerRecoveryMachine

    def own_entries_only(
        self: core_recovery.LedgerRecoveryMachine, event: BookiesChosen
    ) -> list[core_recovery.RecoveryEffect]:
        replaced = self._choosing
        if (
            replaced is None
            or event.slots != replaced
            or self.phase is not core_recovery.RecoveryPhase.READING
        ):
            return []
        self._choosing = None
        first = min(self._stuck)
        self._stuck.clear()
        if self._fragment_first is None or first < self._fragment_first:
            self._fragment_first = first
        bookies = list(self.write_ensemble)
        for slot, bookie in zip(event.slots, event.bookies, strict=True):
            self._replaced_bookies.add(bookies[slot])
            bookies[slot] = bookie
        self.write_ensemble = tuple(bookies)
        gone = set(replaced)
        for entry_id in [e for e in self._rewritten if e >= first]:
            if len(self._rewritten[entry_id].acked - gone) < self.ack_quorum:
                self._rewrites[entry_id] = self._rewritten.pop(entry_id)
            else:
                self._rewritten[entry_id].acked -= gone
        effects: list[core_recovery.RecoveryEffect] = []
        for entry_id in sorted(self._rewrites):
            rewrite = self._rewrites[entry_id]
            slots = rewrite.restart(self._write_set(entry_id), replaced)
            effects.append(core_recovery.SendRewrite(entry_id, rewrite.blob, slots))
        return effects + self._maybe_close()

    mp.setattr(machine, "_on_bookies_chosen", own_entries_only)


def _a_given_up_add_breaks_the_handle(mp: pytest.MonkeyPatch) -> None:
    """An add whose owner gave up on it (a cancelled future) is confirmed later, and the
    handle sets the result on the cancelled future, which raises."""
    mp.setattr(client_writing, "_ALREADY_SETTLED", ())


def _striping_off_by_one(mp: pytest.MonkeyPatch) -> None:
    """R1: the writer sends entry e to the write set of entry e + 1 (striping, E > Qw):
    readers and recoveries look for it where R1 says it is."""
    init = AddTracker.__init__

    def shifted(self: AddTracker, ensemble: int, write: int, ack: int, lac: int = -1) -> None:
        init(self, ensemble, write, ack, lac)
        self._write_sets = self._write_sets[1:] + self._write_sets[:1]

    mp.setattr(AddTracker, "__init__", shifted)


def _any_shape_accepted(mp: pytest.MonkeyPatch) -> None:
    """R1: creation no longer checks E >= Qw >= Qa >= 1."""
    mp.setattr(client_bookkeeper, "check_quorum_shape", lambda *shape: None)


def _lac_answered_as_the_last_entry(mp: pytest.MonkeyPatch) -> None:
    """R4: a bookie answers a LAC read with the last entry it stores, confirmed or not."""
    read_lac = reads.Reads.read_lac

    def last_entry(self: reads.Reads, request: object, respond: Callable[..., None]) -> None:
        def answer(response: Response) -> None:
            if isinstance(response, ReadLacResponse) and response.status == Status.OK:
                response.lac = max(response.lac, response.last_entry_id)
            respond(response)

        read_lac(self, request, answer)  # type: ignore[arg-type]

    mp.setattr(reads.Reads, "read_lac", last_entry)


def _close_one_past_the_lac(mp: pytest.MonkeyPatch) -> None:
    """R6: the writer closes one entry past its LAC."""
    decide = core_writer.decide_close

    def one_past(ledger_id: int, last: int, length: int, current: object) -> object:
        return decide(ledger_id, last + 1, length, current)  # type: ignore[arg-type]

    mp.setattr(core_writer, "decide_close", one_past)


def _confirming_during_the_close(mp: pytest.MonkeyPatch) -> None:
    """R6, P2 as it was: confirmations go on while the close's compare-and-set runs, so
    an add its owner gave up on (still in flight) is confirmed past the closed end."""
    next_close = core_writer.LedgerWriter._next_close

    def not_held(self: core_writer.LedgerWriter) -> list[object]:
        holding = self._holding
        effects = next_close(self)
        self._holding = holding
        return effects  # type: ignore[return-value]

    mp.setattr(core_writer.LedgerWriter, "_next_close", not_held)


def _corruption_read_as_absence(mp: pytest.MonkeyPatch) -> None:
    """R9: a bookie that finds a damaged entry answers "no such entry"."""
    read_entries = storage.LedgerStorage.read_entries

    def absent(self: storage.LedgerStorage, *args: object) -> list[bytes]:
        try:
            return read_entries(self, *args)  # type: ignore[arg-type]
        except BookieIOError:
            return []

    mp.setattr(storage.LedgerStorage, "read_entries", absent)


def _any_master_key_accepted(mp: pytest.MonkeyPatch) -> None:
    """R10: a bookie takes an add or a fence with another master key as its own."""
    add = requests.Requests._add
    keyed = ledger_changes.LedgerChanges._keyed_state

    def any_key_add(self: requests.Requests, request: AddRequest, respond: object) -> None:
        st = self._states.get(request.ledger_id)
        if st is not None and st.master_key is not None:
            request.master_key = st.master_key
        add(self, request, respond)  # type: ignore[arg-type]

    def any_key_state(
        self: ledger_changes.LedgerChanges, request: object, key: bytes, respond: object
    ) -> object:
        st = self._storage.states.get(request.ledger_id)  # type: ignore[attr-defined]
        if st is not None and st.master_key is not None:
            key = st.master_key
        return keyed(self, request, key, respond)  # type: ignore[arg-type]

    mp.setattr(requests.Requests, "_add", any_key_add)
    mp.setattr(ledger_changes.LedgerChanges, "_keyed_state", any_key_state)


def _a_failed_sync_taken_as_done(mp: pytest.MonkeyPatch) -> None:
    """R14: the journal takes a failed fdatasync as done (its pages were dropped, as
    Linux drops them) and acknowledges the batch."""
    sync = journal_writer.Journal._sync_current

    def as_done(self: journal_writer.Journal) -> None:
        try:
            sync(self)
        except OSError:
            self._unsynced = False

    mp.setattr(journal_writer.Journal, "_sync_current", as_done)


DURABILITY = frozenset({"R3-replicas", "R7-fencing", "R8-durability", "R8-final", "R8-agreement"})

PLANTED = {
    "recovery reads sent without the fence flag (BookKeeper #2614/#2616)": Planted(
        _recovery_reads_without_fence, frozenset({"R7-fencing", "R8-durability"})
    ),
    "a new fragment starting one entry too late (R5)": Planted(
        _fragment_one_entry_late, DURABILITY
    ),
    # Entries confirmed one ack short: lost from the ledger (durability), or read by a
    # tailer under a LAC past the end the recovery then finds (R4-tail).
    "an ack quorum off by one (R3)": Planted(
        _ack_quorum_off_by_one, DURABILITY | frozenset({"R4-tail"})
    ),
    "acks before the journal sync (R2)": Planted(_acks_before_the_journal_sync, DURABILITY),
    "fence state not persisted across a restart (R7)": Planted(
        _fence_not_persisted, frozenset({"R7-fencing", "R8-durability"})
    ),
    "recovery counting errors as missing (R8, R9)": Planted(
        _recovery_counts_errors_as_missing, DURABILITY
    ),
    "an unknown metadata outcome taken as refused (C1, R13)": Planted(
        _unknown_metadata_outcome_taken_as_refused, DURABILITY
    ),
    "garbage collection reading without a sync (R18)": Planted(_gc_reads_without_sync, DURABILITY),
    "a log writer skipping R11's fencing": Planted(
        _log_writer_skips_fencing, frozenset({"R11-log"})
    ),
    "a read after an unknown metadata outcome taken as current (R13, R18)": Planted(
        _a_read_after_an_unknown_outcome_taken_as_current, DURABILITY
    ),
    "re-replication swapping in a replacement it copied nothing to": Planted(
        _rereplication_copies_nothing, DURABILITY
    ),
    "the writer striping entries one write set off (R1)": Planted(_striping_off_by_one, DURABILITY),
    "creation accepting any quorum shape (R1)": Planted(
        _any_shape_accepted, frozenset({"R1-shape"})
    ),
    "a bookie answering its last entry as the LAC (R4)": Planted(
        _lac_answered_as_the_last_entry, frozenset({"R4-lac", "R4-tail"})
    ),
    "a writer closing one entry past its LAC (R6)": Planted(_close_one_past_the_lac, DURABILITY),
    "confirmations during the close's compare-and-set (R6, P2)": Planted(
        _confirming_during_the_close, DURABILITY | {"R4-lac", "R4-tail", "core-invariant"}
    ),
    "a bookie answering a damaged entry as absent (R9)": Planted(
        _corruption_read_as_absence, DURABILITY | {"R9-absence"}
    ),
    # A client without the password then fences, recovers and writes as if it were the
    # owner: a second value, or a confirmed entry left on fewer than Qa bookies.
    "a bookie accepting any master key (R10)": Planted(
        _any_master_key_accepted, frozenset({"R10-password", "single-value", "R3-replicas"})
    ),
    "a failed journal sync taken as done (R14)": Planted(
        _a_failed_sync_taken_as_done, DURABILITY | {"R9-absence", "bookie-restart"}
    ),
    "an add given up by its owner breaking the handle when confirmed": Planted(
        _a_given_up_add_breaks_the_handle, frozenset({"system-error"})
    ),
}


@pytest.mark.timeout(1800)  # up to MAX_SEEDS seeds: longer than the suite's per-test bound
@pytest.mark.parametrize("name", list(PLANTED))
def test_a_planted_bug_fails_a_named_rule_within_bounded_seeds(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bug = PLANTED[name]
    bug.plant(monkeypatch)
    failed = first_failure(range(MAX_SEEDS))
    assert failed is not None, f"{name}: no seed of {MAX_SEEDS} broke a rule"
    named = {v.rule for v in failed.violations}
    print(f"{name}: seed {failed.seed} ({failed.workload}): {sorted(named)}")
    assert named & bug.rules, (
        f"{name}: seed {failed.seed} failed without naming one of {sorted(bug.rules)}: "
        + "; ".join(str(v) for v in failed.violations)
    )
