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

from quorumlog.bookie import journal as journal_mod
from quorumlog.bookie import ledger_changes, ledger_state
from quorumlog.client import recovery as client_recovery
from quorumlog.core import metadata as core_metadata
from quorumlog.core import recovery as core_recovery
from quorumlog.core.adds import AddTracker
from quorumlog.log import writer as log_writer
from quorumlog.proto.codec import ReadFlag
from quorumlog.server import gc as server_gc
from quorumlog.testing.sim.runner import first_failure

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
    def no_sync(self: journal_mod.Journal) -> None:
        self._unsynced = False

    mp.setattr(journal_mod.Journal, "_sync_current", no_sync)


def _fence_not_persisted(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(
        ledger_changes, "fence_record", lambda ledger_id: journal_mod.lac_record(ledger_id, -1)
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


DURABILITY = frozenset({"R3-replicas", "R7-fencing", "R8-durability", "R8-final", "R8-agreement"})

PLANTED = {
    "recovery reads sent without the fence flag (BookKeeper #2614/#2616)": Planted(
        _recovery_reads_without_fence, frozenset({"R7-fencing", "R8-durability"})
    ),
    "a new fragment starting one entry too late (R5)": Planted(
        _fragment_one_entry_late, DURABILITY
    ),
    "an ack quorum off by one (R3)": Planted(_ack_quorum_off_by_one, DURABILITY),
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
}


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
