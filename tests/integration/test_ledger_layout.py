"""Ledger layouts on both metadata drivers: the hierarchical layout of a new cluster, a
flat cluster from before layouts still served, levels that never exceed their fan-out,
and walks in id order (docs/METADATA.md)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import pytest
from support import run

from quorumlog.errors import MetadataVersionError, NodeExistsError, NoSuchLedgerError
from quorumlog.meta.factory import open_store
from quorumlog.meta.layout import (
    LAYOUT_PATH,
    LEDGERS_PATH,
    Layout,
    ReadPacer,
    flat_ledger_id,
    flat_path,
)
from quorumlog.meta.ledger_metadata import LedgerMetadata, LedgerState, new_ledger_metadata
from quorumlog.meta.ledgers import FLAT_VERSION_BASE, LedgerManager
from quorumlog.meta.migrate import mark_hierarchical
from quorumlog.meta.store import MetadataStore
from quorumlog.proto.entry import DigestType
from quorumlog.server.gc import StoreGcMetadata, collect_once

BOOKIES = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")
SMALL = Layout.hierarchical(2)  # fan-out 100: levels fill with a few hundred ledgers


def metadata(ledger_id: int) -> LedgerMetadata:
    return new_ledger_metadata(ledger_id, BOOKIES, 3, 2, DigestType.CRC32C, "digest-of-key")


async def make_flat(store: MetadataStore, ledger_ids: list[int]) -> None:
    """A cluster from before layouts: /ledgers/<id> nodes and no marker."""
    for ledger_id in ledger_ids:
        await store.create(flat_path(ledger_id), metadata(ledger_id).to_bytes())


async def max_children(store: MetadataStore, path: str = LEDGERS_PATH) -> int:
    names = await store.children(path)
    most = len(names)
    for name in names:
        most = max(most, await max_children(store, f"{path}/{name}"))
    return most


async def flat_ids(store: MetadataStore) -> list[int]:
    names = await store.children(LEDGERS_PATH)
    return sorted(i for i in map(flat_ledger_id, names) if i is not None)


def test_a_new_cluster_is_hierarchical_with_1000_names_a_level(metadata_uri):
    async def body():
        async with await open_store(metadata_uri) as store:
            ledgers = LedgerManager(store)
            assert await ledgers.layout() is None  # nothing yet: no marker, no /ledgers
            assert await ledgers.create(metadata(1)) == 0
            born = Layout.hierarchical(3).born_with_ledgers_path()
            assert await ledgers.layout() == born
            assert Layout.from_bytes((await store.get(LAYOUT_PATH)).data) == born
            assert await ledgers.path_of(1) == "/ledgers/000/000/000/000/000/000/L001"
            assert await store.children(LEDGERS_PATH) == ["000", "LAYOUT"]
            await ledgers.create(metadata(12_345_678))
            assert await ledgers.path_of(12_345_678) == "/ledgers/000/000/000/000/012/345/L678"
            biggest = (1 << 63) - 1
            await ledgers.create(metadata(biggest))
            assert await ledgers.path_of(biggest) == "/ledgers/009/223/372/036/854/775/L807"
            # 4 digits a level: BookKeeper's own split, but for the leading 0.
            bookkeeper_like = Layout.hierarchical(4)
            assert bookkeeper_like.path(12_345_678) == "/ledgers/0000/0000/0000/1234/L5678"
            assert bookkeeper_like.path(biggest) == "/ledgers/0922/3372/0368/5477/L5807"
            with pytest.raises(NodeExistsError, match="ledger 1 "):
                await ledgers.create(metadata(1))
            # A second client sees the same layout and every ledger.
            other = LedgerManager(store)
            assert await other.list_ledger_ids() == [1, 12_345_678, biggest]
            md, version = await other.read(12_345_678)
            assert version == 0
            closed = dataclasses.replace(md, state=LedgerState.CLOSED, last_entry_id=-1)
            assert await other.write(closed, version) == 1
            with pytest.raises(MetadataVersionError, match="ledger 12345678"):
                await ledgers.write(closed, 0)
            await ledgers.delete(12_345_678, 1)
            with pytest.raises(NoSuchLedgerError, match="ledger 12345678 "):
                await other.read(12_345_678)

    run(body())


def test_a_flat_cluster_without_marker_keeps_working_as_flat(metadata_uri):
    async def body():
        async with await open_store(metadata_uri) as store:
            await make_flat(store, [3, 1, 20])
            ledgers = LedgerManager(store)
            assert await ledgers.layout() == Layout.flat(marked=False)
            assert await ledgers.list_ledger_ids() == [1, 3, 20]
            md, version = await ledgers.read(3)
            assert version == FLAT_VERSION_BASE  # a flat node's version 0
            grown = md.with_new_fragment(4, ("127.0.0.1:3184", *BOOKIES[1:]))
            assert await ledgers.write(grown, version) == FLAT_VERSION_BASE + 1
            with pytest.raises(MetadataVersionError, match="ledger 3"):
                await ledgers.write(md, version)
            assert await ledgers.create(metadata(21)) == FLAT_VERSION_BASE
            assert await store.exists(flat_path(21)) == 0
            await ledgers.delete(1)
            assert await ledgers.list_ledger_ids() == [3, 20, 21]
            assert await store.exists(LAYOUT_PATH) is None  # served as is, not converted

    run(body())


def test_a_cluster_born_hierarchical_creates_without_looking_for_flat_nodes(metadata_uri):
    """A store whose /ledgers came with its marker never held a flat ledger: a create
    there is one write, not a read of the flat place first."""

    async def body():
        async with await open_store(metadata_uri) as store:
            ledgers = LedgerManager(store)
            await ledgers.create(metadata(1))
            assert json.loads((await store.get(LAYOUT_PATH)).data)["flat_ledgers"] is False
            looked: list[str] = []
            exists, get = store.exists, store.get

            async def counted_exists(path: str, *args, **options):
                looked.append(path)
                return await exists(path, *args, **options)

            async def counted_get(path: str, *args, **options):
                looked.append(path)
                return await get(path, *args, **options)

            store.exists = counted_exists  # type: ignore[method-assign]
            store.get = counted_get  # type: ignore[method-assign]
            await asyncio.gather(*(ledgers.create(metadata(i)) for i in range(2, 40)))
            await LedgerManager(store).create(metadata(40))  # a client new to the cluster
            assert [p for p in looked if p != LAYOUT_PATH] == []

    run(body())


def test_a_cluster_marked_hierarchical_after_flat_ledgers_still_looks_for_them(metadata_uri):
    async def body():
        async with await open_store(metadata_uri) as store:
            await make_flat(store, [3])
            await mark_hierarchical(store, 4)
            await make_flat(store, [7])  # a client that had not seen the marker yet
            ledgers = LedgerManager(store)
            assert (await ledgers.layout()).flat_ledgers
            with pytest.raises(NodeExistsError, match="ledger 7 already exists"):
                await ledgers.create(metadata(7))
            assert await ledgers.create(metadata(8)) == 0

    run(body())


def test_no_level_has_more_children_than_its_fan_out_and_walks_are_in_order(metadata_uri):
    """A fan-out of 100 (2 digits a level) shows the split with a few hundred ledgers;
    the default's 1,000 is the same code with 3 digits."""

    async def body():
        async with await open_store(metadata_uri) as store:
            ledgers = LedgerManager(store, new_layout=SMALL)
            far = [0, 99, 10_000, 123_456_789, 10**18, (1 << 63) - 1]
            created = sorted({*range(1, 251), *far})
            for ledger_id in created:
                await ledgers.create(metadata(ledger_id))
            assert await ledgers.path_of(250) == "/ledgers/00/00/00/00/00/00/00/00/02/L50"
            assert await max_children(store) <= SMALL.fan_out
            leaf_dir = (await ledgers.path_of(150)).rsplit("/", 1)[0]
            assert len(await store.children(leaf_dir)) == SMALL.fan_out  # full, not over
            assert [i async for i in ledgers.ledger_ids()] == created
            # A walk lists one level at a time: listings of at most the fan-out.
            sizes: list[int] = []
            children = store.children

            async def listed(path: str) -> list[str]:
                names = await children(path)
                sizes.append(len(names))
                return names

            store.children = listed  # type: ignore[method-assign]
            assert await LedgerManager(store).list_ledger_ids() == created
            assert max(sizes) <= SMALL.fan_out
            assert len(sizes) > 10

    run(body())


def test_creates_in_flight_into_a_new_leaf_make_its_parent_once(metadata_uri):
    """Ids come in order, so the creates in flight enter a new leaf together: one of
    them makes the leaf's parent and the others wait for it, instead of each making
    the parents itself (a failed create and a path of creates each, in one burst)."""

    async def body():
        async with await open_store(metadata_uri) as store:
            ledgers = LedgerManager(store, new_layout=SMALL)
            await ledgers.create(metadata(1))  # the cluster's marker and first leaf
            made: list[str] = []
            create = store.create

            async def counted(path: str, data: bytes = b"", **options) -> str:
                if not path.rsplit("/", 1)[1].startswith("L"):
                    made.append(path)
                return await create(path, data, **options)

            store.create = counted  # type: ignore[method-assign]
            # 64 in flight: ledgers 100-163 fill two new leaves (100-199 is one).
            await asyncio.gather(*(ledgers.create(metadata(i)) for i in range(100, 164)))
            await asyncio.gather(*(ledgers.create(metadata(i)) for i in range(1000, 1064)))
            assert made == [
                "/ledgers/00/00/00/00/00/00/00/00/01",
                "/ledgers/00/00/00/00/00/00/00/00/10",
            ]
            assert [i async for i in ledgers.ledger_ids()] == [
                1,
                *range(100, 164),
                *range(1000, 1064),
            ]

    run(body())


def test_a_walk_is_paced_to_its_reads_per_second():
    async def body():
        pacer = ReadPacer(50.0)
        started = time.monotonic()
        for _ in range(11):
            await pacer.wait()
        return time.monotonic() - started

    assert run(body()) >= 0.19  # 10 intervals of 20 ms
    assert ReadPacer(None).interval_s == 0


def test_a_listing_is_paced_as_the_reads_its_names_are_worth():
    """A 10,000-name level costs 100 reads' time before the walk's next read, so a
    paced walk of a million ledgers never sends its listings back to back."""

    async def body(names: int) -> float:
        pacer = ReadPacer(1000.0)
        await pacer.wait()
        pacer.listed(names)
        started = time.monotonic()
        await pacer.wait()
        return time.monotonic() - started

    assert run(body(10_000)) >= 0.098  # 100 reads at 1 ms, less the one paid before
    unpaced = ReadPacer(None)
    unpaced.listed(10_000)
    assert unpaced.interval_s == 0


def test_gc_walks_the_hierarchical_layout_and_drops_only_deleted_ledgers(metadata_uri):
    class Bookie:
        def __init__(self, held: set[int]) -> None:
            self.held = set(held)

        def ledger_ids(self) -> set[int]:
            return set(self.held)

        def garbage_collect(self, live, snapshot):
            self.held -= set(snapshot)
            return len(snapshot)

        def halt(self, where, exc):
            raise AssertionError(f"{where}: {exc}")

    async def body():
        async with await open_store(metadata_uri) as store:
            from quorumlog.meta.bookies import BookieRegistry

            await BookieRegistry(store).write_cookie(BOOKIES[0], b"cookie", -1)
            ledgers = LedgerManager(store, new_layout=SMALL)
            for ledger_id in (5, 150, 10**12):
                await ledgers.create(metadata(ledger_id))
            await make_flat(store, [7])  # a flat leftover is live too
            bookie = Bookie({5, 7, 150, 151, 10**12, 10**12 + 1})
            gc = StoreGcMetadata(lambda: store, BOOKIES[0])
            assert await collect_once(bookie, gc) == 2
            assert bookie.held == {5, 7, 150, 10**12}

    run(body())
