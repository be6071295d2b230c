"""LedgerManager.update: the one read-decide-compare-and-set loop on ledger metadata."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from quorumlog.errors import (
    LedgerFencedError,
    MetadataError,
    NoSuchLedgerError,
)
from quorumlog.meta.ledger_metadata import LedgerMetadata, LedgerState, new_ledger_metadata
from quorumlog.meta.ledgers import (
    Done,
    GiveUp,
    LedgerManager,
    MetadataConflictsError,
)
from quorumlog.proto.entry import DigestType
from quorumlog.testing.memory_store import MemoryStore, MemoryTree

ENSEMBLE = ("10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181")
LEDGER = 7


class RacingStore(MemoryStore):
    """Another client changes the ledger (with ``change``) just before each of the next
    ``races`` writes of this one, so that each of them meets a version conflict."""

    def __init__(
        self, tree: MemoryTree, races: int, change: Callable[[LedgerMetadata], LedgerMetadata]
    ) -> None:
        super().__init__(tree)
        self.races = races
        self.change = change
        self.writes = 0

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        self.writes += 1
        if self.races > 0:
            self.races -= 1
            found = await self.get(path)
            changed = self.change(LedgerMetadata.from_bytes(found.data))
            await super().set(path, changed.to_bytes(), found.version)
        return await super().set(path, data, version)


def open_ledger() -> LedgerMetadata:
    return new_ledger_metadata(LEDGER, ENSEMBLE, 3, 2, DigestType.CRC32C, "")


def close_at(last_entry_id: int) -> Callable[[LedgerMetadata], LedgerMetadata]:
    def change(md: LedgerMetadata) -> LedgerMetadata:
        return dataclasses.replace(md, state=LedgerState.CLOSED, last_entry_id=last_entry_id)

    return change


def tag(md: LedgerMetadata) -> LedgerMetadata:
    """A harmless concurrent change: one more custom metadata key."""
    custom = dict(md.custom_metadata)
    custom[f"k{len(custom)}"] = b"v"
    return dataclasses.replace(md, custom_metadata=custom)


def with_ledger(
    races: int,
    change: Callable[[LedgerMetadata], LedgerMetadata],
    body: Callable[[LedgerManager, RacingStore], Awaitable[Any]],
) -> Any:
    async def main() -> Any:
        tree = MemoryTree()
        store = RacingStore(tree, races, change)
        ledgers = LedgerManager(store)
        await ledgers.create(open_ledger())
        return await body(ledgers, store)

    return asyncio.run(main())


def mark_in_recovery(md: LedgerMetadata) -> LedgerMetadata | Done[str]:
    if md.is_closed:
        return Done("closed")
    return dataclasses.replace(md, state=LedgerState.IN_RECOVERY)


def test_a_decision_on_known_metadata_is_written_without_a_read() -> None:
    async def body(ledgers: LedgerManager, store: RacingStore) -> None:
        md, version = await ledgers.read(LEDGER)
        result = await ledgers.update(LEDGER, mark_in_recovery, attempts=3, known=(md, version))
        assert result.written and result.version == version + 1
        assert result.metadata.state is LedgerState.IN_RECOVERY
        assert await ledgers.read(LEDGER) == (result.metadata, result.version)
        assert store.writes == 1

    with_ledger(0, tag, body)


def test_a_conflict_is_read_again_and_decided_again() -> None:
    seen: list[LedgerMetadata] = []

    def decide(md: LedgerMetadata) -> LedgerMetadata | Done[str]:
        seen.append(md)
        return mark_in_recovery(md)

    async def body(ledgers: LedgerManager, store: RacingStore) -> None:
        result = await ledgers.update(LEDGER, decide, attempts=5)
        assert result.written and store.writes == 3
        # The other client's changes are kept: each decision saw the version as read.
        assert [len(md.custom_metadata) for md in seen] == [0, 1, 2]
        assert len(result.metadata.custom_metadata) == 2
        assert (await ledgers.read(LEDGER))[0].state is LedgerState.IN_RECOVERY

    with_ledger(2, tag, body)


def test_done_after_a_conflict_writes_nothing_and_hands_back_its_value() -> None:
    async def body(ledgers: LedgerManager, store: RacingStore) -> None:
        result = await ledgers.update(LEDGER, mark_in_recovery, attempts=5)
        assert not result.written and result.value == "closed"
        assert result.metadata.is_closed and result.metadata.last_entry_id == 4
        assert (result.metadata, result.version) == await ledgers.read(LEDGER)
        assert store.writes == 1

    with_ledger(1, close_at(4), body)


def test_give_up_raises_its_error_and_writes_nothing() -> None:
    def decide(md: LedgerMetadata) -> LedgerMetadata | GiveUp:
        if md.state is not LedgerState.OPEN:
            return GiveUp(LedgerFencedError(f"ledger {md.ledger_id} is {md.state.value}"))
        return tag(md)

    async def body(ledgers: LedgerManager, store: RacingStore) -> None:
        with pytest.raises(LedgerFencedError, match="is CLOSED"):
            await ledgers.update(LEDGER, decide, attempts=5)
        assert store.writes == 1
        assert (await ledgers.read(LEDGER))[0].custom_metadata == {}

    with_ledger(1, close_at(2), body)


def test_attempts_bound_the_writes_and_the_last_read_is_still_decided() -> None:
    async def body(ledgers: LedgerManager, store: RacingStore) -> None:
        with pytest.raises(MetadataConflictsError) as raised:
            await ledgers.update(LEDGER, tag, attempts=3)
        assert isinstance(raised.value, MetadataError)
        assert raised.value.message == f"ledger {LEDGER}: too many conflicting metadata updates"
        assert store.writes == 3

    with_ledger(10, tag, body)

    async def settled_by_the_last_read(ledgers: LedgerManager, store: RacingStore) -> None:
        result = await ledgers.update(LEDGER, mark_in_recovery, attempts=1)
        assert not result.written and result.value == "closed" and store.writes == 1

    with_ledger(1, close_at(0), settled_by_the_last_read)


def test_other_errors_are_raised_as_they_are() -> None:
    async def body(ledgers: LedgerManager, store: RacingStore) -> None:
        await ledgers.delete(LEDGER)
        with pytest.raises(NoSuchLedgerError):
            await ledgers.update(LEDGER, tag, attempts=3)
        md = open_ledger()
        with pytest.raises(NoSuchLedgerError):  # deleted after it was read
            await ledgers.update(LEDGER, tag, attempts=3, known=(md, 0))

    with_ledger(0, tag, body)


def test_guard_runs_every_read_and_write() -> None:
    calls: list[str] = []

    async def guard(operation: Awaitable[Any], what: str) -> Any:
        calls.append(what)
        return await operation

    async def body(ledgers: LedgerManager, store: RacingStore) -> None:
        result = await ledgers.update(LEDGER, tag, attempts=3, guard=guard)
        assert result.written
        # read, write (conflict), read, write
        assert calls == [f"ledger {LEDGER}"] * 4

    with_ledger(1, tag, body)
