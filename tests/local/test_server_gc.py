"""Garbage collection's decisions (``quorumlog.server.gc``) on a stand-in bookie and a
stand-in metadata store, and on a real bookie's storage: R15, absence is not permission;
R13, unknown is not absent; R18, reads can be stale (sync before what leads to a delete)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

import pytest
from conftest import Driver
from support import run

from quorumlog.errors import BKError, MetadataError, Status
from quorumlog.meta.bookies import COOKIES_PATH
from quorumlog.meta.ledgers import LEDGERS_PATH
from quorumlog.meta.store import Versioned
from quorumlog.proto.codec import AddRequest, ReadRequest
from quorumlog.server.gc import GcSkipped, StoreGcMetadata, collect_once
from quorumlog.testing.memory_store import MemoryStore, MemoryTree
from quorumlog.testing.raw_client import make_entry, master_key


class Bookie:
    def __init__(self, ledger_ids: set[int]) -> None:
        self.held = set(ledger_ids)
        self.dropped: set[int] = set()
        self.broken: list[str] = []

    def ledger_ids(self) -> set[int]:
        return set(self.held)

    def garbage_collect(self, live_ledger_ids: Iterable[int], snapshot: set[int]) -> int:
        gone = snapshot - set(live_ledger_ids)
        self.held -= gone
        self.dropped |= gone
        return len(gone)

    def halt(self, where: str, exc: BaseException) -> None:
        self.broken.append(f"{where}: {exc}")


class Metadata:
    """A listing, the ledgers that exist when read one by one, and the cookie; ``calls``
    records every call in order ("sync", "cookie", "list", "exists <id>")."""

    def __init__(
        self, listed: set[int], existing: set[int], unknown: frozenset[int] = frozenset()
    ) -> None:
        self.listed = listed
        self.existing = existing
        self.unknown = unknown
        self.cookie_reads: list[bool] = []
        self.cookie = [True, True]  # what the first and the second cookie read find
        self.calls: list[str] = []
        self.sync_fails = False

    async def sync(self) -> None:
        self.calls.append("sync")
        if self.sync_fails:
            raise MetadataError("connection lost during sync (outcome unknown)")

    async def cookie_exists(self) -> bool:
        self.calls.append("cookie")
        found = self.cookie[min(len(self.cookie_reads), len(self.cookie) - 1)]
        self.cookie_reads.append(found)
        return found

    async def list_ledgers(self, among: set[int]) -> tuple[set[int], int]:
        self.calls.append("list")
        return self.listed & among, len(self.listed)

    async def ledger_exists(self, ledger_id: int) -> bool:
        self.calls.append(f"exists {ledger_id}")
        if ledger_id in self.unknown:
            raise BKError(f"ledger {ledger_id}: the read timed out")
        return ledger_id in self.existing


def test_r15_only_ledgers_confirmed_absent_one_by_one_are_dropped():
    # 1 and 2 are listed; 3 is missing from a stale listing but exists; 4 is gone.
    bookie = Bookie({1, 2, 3, 4})
    metadata = Metadata(listed={1, 2}, existing={1, 2, 3})
    assert run(collect_once(bookie, metadata)) == 1
    assert bookie.dropped == {4} and bookie.held == {1, 2, 3}
    assert metadata.cookie_reads == [True, True]  # before the listing and before dropping


def test_r13_r15_a_failed_read_of_one_candidate_drops_nothing():
    bookie = Bookie({1, 4, 5})
    metadata = Metadata(listed={1}, existing={1}, unknown={5})
    with pytest.raises(BKError, match="timed out"):
        run(collect_once(bookie, metadata))
    assert bookie.dropped == set()


def test_r15_no_cookie_for_this_bookie_skips_the_round():
    bookie = Bookie({1, 2})
    metadata = Metadata(listed=set(), existing=set())
    metadata.cookie = [False]
    with pytest.raises(GcSkipped, match="no cookie for this bookie"):
        run(collect_once(bookie, metadata))
    assert bookie.dropped == set()


def test_r15_a_store_wiped_while_candidates_are_read_drops_nothing():
    bookie = Bookie({1, 2})
    metadata = Metadata(listed={1}, existing={1})
    metadata.cookie = [True, False]  # the cookie was there at the start of the round only
    with pytest.raises(GcSkipped):
        run(collect_once(bookie, metadata))
    assert bookie.dropped == set()


def test_a_failure_inside_the_bookies_collection_is_a_broken_invariant():
    bookie = Bookie({1, 2})

    def impossible(live: Iterable[int], snapshot: set[int]) -> int:
        raise KeyError(2)

    bookie.garbage_collect = impossible  # type: ignore[method-assign]
    assert run(collect_once(bookie, Metadata(listed={1}, existing={1}))) == 0
    assert bookie.broken == ["garbage collection: 2"]


# ---------------------------------------------------------------- R18: sync first


def test_r18_gc_syncs_before_the_listing_and_before_the_existence_reads():
    """A listing or an existence read from a lagging ZooKeeper follower can miss a ledger
    created moments ago, whose entries this bookie already holds: each read that can
    lead to a drop goes out after a sync."""
    bookie = Bookie({1, 2, 3, 4})
    metadata = Metadata(listed={1, 2}, existing={1, 2, 3})
    assert run(collect_once(bookie, metadata)) == 1
    assert metadata.calls == [
        "sync",
        "cookie",
        "list",
        "sync",
        "exists 3",
        "exists 4",
        "cookie",
    ]


def test_r18_every_batch_of_existence_reads_follows_a_sync_of_its_own():
    bookie = Bookie(set(range(1, 41)))
    metadata = Metadata(listed={1}, existing=set(range(1, 21)))
    assert run(collect_once(bookie, metadata)) == 20
    reads = [i for i, call in enumerate(metadata.calls) if call.startswith("exists")]
    assert len(reads) == 39
    # Each read's nearest earlier sync lies after the previous batch's reads were sent:
    # no batch is read on the strength of a sync that went out before an earlier batch.
    syncs = [i for i, call in enumerate(metadata.calls) if call == "sync"]
    batches = {max(s for s in syncs if s < i) for i in reads}
    assert len(batches) == 3  # 39 candidates, 16 reads in flight at a time
    assert metadata.calls[: syncs[0] + 1] == ["sync"]


def test_r18_a_failed_sync_drops_nothing():
    bookie = Bookie({1, 2})
    metadata = Metadata(listed={1}, existing={1})
    metadata.sync_fails = True
    with pytest.raises(MetadataError, match="outcome unknown"):
        run(collect_once(bookie, metadata))
    assert bookie.dropped == set()
    assert metadata.calls == ["sync"]


class RecordingStore(MemoryStore):
    """A metadata store that records what it is asked, in order ("sync /ledgers", ...)."""

    def __init__(self, tree: MemoryTree, calls: list[str]) -> None:
        super().__init__(tree)
        self.calls = calls

    async def sync(self, path: str = "/") -> None:
        self.calls.append(f"sync {path}")
        await super().sync(path)

    async def get(self, path: str) -> Versioned:
        self.calls.append(f"get {path}")
        return await super().get(path)

    async def children(self, path: str) -> list[str]:
        self.calls.append(f"children {path}")
        return await super().children(path)


def test_r18_the_server_gc_metadata_syncs_the_store_it_then_reads():
    """StoreGcMetadata on a store double: the sync reaches the store before the listing
    and before the existence reads; after a lost session (the server's store replaced
    between a sync and a read) the new store is synced before it is read."""

    async def scenario() -> list[str]:
        tree = MemoryTree()
        calls: list[str] = []
        first, second = RecordingStore(tree, calls), RecordingStore(tree, calls)
        await first.create(f"{COOKIES_PATH}/127.0.0.1:3181", b"cookie")
        await first.create(f"{LEDGERS_PATH}/1", b"")
        current = [first]
        metadata = StoreGcMetadata(lambda: current[0], "127.0.0.1:3181")
        calls.clear()
        await metadata.sync()
        assert await metadata.cookie_exists()
        assert await metadata.list_ledgers({1, 2}) == ({1}, 1)
        current[0] = second  # the session was lost: the server opened a new store
        assert not await metadata.ledger_exists(2)
        return calls

    calls = run(scenario())
    assert calls[0] == f"sync {LEDGERS_PATH}"
    assert calls[1:3] == [f"get {COOKIES_PATH}/127.0.0.1:3181", f"children {LEDGERS_PATH}"]
    # The existence read went to the new store, which was synced first.
    assert calls[3].startswith("sync ") and calls[4].startswith(f"get {LEDGERS_PATH}/")


# ---------------------------------------------------------------- R15 on a bookie's storage

KEY = master_key(b"gc")


async def _fill(driver: Driver, ledger_ids: Iterable[int]) -> None:
    for ledger_id in ledger_ids:
        entries = [make_entry(ledger_id, e, b"gc %d/%d" % (ledger_id, e)) for e in range(5)]
        answer = await driver.call(AddRequest(0, ledger_id, KEY, entries))
        assert answer.status == Status.OK


async def _readable(driver: Driver, ledger_id: int) -> bool:
    answer = await driver.call(ReadRequest(0, ledger_id, 4))
    return bool(answer.status == Status.OK)


def test_r15_an_empty_listing_with_the_cookie_present_drops_nothing(
    make_driver: Callable[..., Driver],
):
    """The store lists no ledger at all while this bookie holds three, and its cookie is
    there: a store being restored, or a listing from a server that lost its data, proves
    nothing. The round refuses, says why, and every entry stays; even ledgers that the
    one-by-one reads would call absent are kept."""
    driver = make_driver()

    async def scenario() -> None:
        bookie = await driver.start()
        await _fill(driver, (1, 2, 3))
        metadata = Metadata(listed=set(), existing=set())
        with pytest.raises(GcSkipped, match="lists no ledgers") as skipped:
            await collect_once(bookie, metadata)
        assert "3 ledgers" in str(skipped.value) and "nothing deleted" in str(skipped.value)
        assert not any(call.startswith("exists") for call in metadata.calls)
        assert bookie.ledger_ids() == {1, 2, 3}
        await bookie.checkpoint()
        await driver.restart()
        for ledger_id in (1, 2, 3):
            assert await _readable(driver, ledger_id), ledger_id
        await driver.close()

    asyncio.run(scenario())
    assert not driver.broken


def test_r15_a_stale_listing_drops_only_what_is_absent_when_read_alone(
    make_driver: Callable[..., Driver],
):
    """The listing misses ledgers 2 and 3 (a stale listing); 2 exists when read on its
    own, 3 does not: 2 stays readable, 3 goes (so the round did run)."""
    driver = make_driver()

    async def scenario() -> None:
        bookie = await driver.start()
        await _fill(driver, (1, 2, 3))
        metadata = Metadata(listed={1}, existing={1, 2})
        assert await collect_once(bookie, metadata) == 1
        assert bookie.ledger_ids() == {1, 2}
        await bookie.checkpoint()
        await driver.restart()
        assert await _readable(driver, 1) and await _readable(driver, 2)
        assert not await _readable(driver, 3)
        await driver.close()

    asyncio.run(scenario())
    assert not driver.broken
