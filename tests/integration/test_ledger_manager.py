"""LedgerManager and BookieRegistry on both metadata drivers (``metadata_uri``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import subprocess
import sys
import time
from typing import TypeVar

import pytest
from support import run

from quorumlog.errors import (
    InvalidArgumentError,
    MetadataError,
    MetadataVersionError,
    NodeExistsError,
    NoSuchLedgerError,
)
from quorumlog.meta.bookies import BookieRegistry
from quorumlog.meta.factory import open_store
from quorumlog.meta.ledger_metadata import LedgerMetadata, LedgerState, new_ledger_metadata
from quorumlog.meta.ledgers import LedgerManager
from quorumlog.proto.entry import DigestType

T = TypeVar("T")

BOOKIES = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")
# A bound for an event to arrive at all, not a latency target: events come within about
# 100 ms (docs/METADATA.md gives the measured figures).
EVENT_DEADLINE_S = 10.0


def metadata(ledger_id: int) -> LedgerMetadata:
    return new_ledger_metadata(ledger_id, BOOKIES, 2, 2, DigestType.CRC32C, "digest-of-key")


async def wait_for_value(queue: asyncio.Queue[T], timeout_s: float = EVENT_DEADLINE_S) -> T:
    return await asyncio.wait_for(queue.get(), timeout_s)


# ---------------------------------------------------------------------- ledgers


def test_ledger_ids_are_unique_across_managers(metadata_uri):
    async def body():
        async with (
            await open_store(metadata_uri) as first,
            await open_store(metadata_uri) as second,
        ):
            managers = [LedgerManager(first), LedgerManager(second)]
            ids = await asyncio.gather(*(m.new_ledger_id() for m in managers for _ in range(25)))
            assert len(set(ids)) == 50
            assert min(ids) >= 1

    run(body())


def test_create_read_round_trip_and_duplicate(metadata_uri):
    async def body():
        async with await open_store(metadata_uri) as store:
            ledgers = LedgerManager(store)
            ledger_id = await ledgers.new_ledger_id()
            md = metadata(ledger_id)
            assert await ledgers.create(md) == 0
            read, version = await ledgers.read(ledger_id)
            assert (read, version) == (md, 0)
            with pytest.raises(NodeExistsError, match=f"ledger {ledger_id}"):
                await ledgers.create(md)

    run(body())


def test_r6_write_is_compare_and_set(metadata_uri):
    """Two writers hold version 0: the first close wins, the second gets a version error."""

    async def body():
        async with await open_store(metadata_uri) as one, await open_store(metadata_uri) as two:
            first, second = LedgerManager(one), LedgerManager(two)
            ledger_id = await first.new_ledger_id()
            await first.create(metadata(ledger_id))
            md, version = await second.read(ledger_id)
            closed = dataclasses.replace(md, state=LedgerState.CLOSED, last_entry_id=9)
            assert await first.write(closed, version) == version + 1
            recovering = dataclasses.replace(md, state=LedgerState.IN_RECOVERY)
            with pytest.raises(MetadataVersionError, match=f"ledger {ledger_id}"):
                await second.write(recovering, version)
            now, now_version = await second.read(ledger_id)
            assert now.state is LedgerState.CLOSED and now.last_entry_id == 9
            assert now_version == version + 1

    run(body())


def test_missing_ledger_errors_name_the_ledger(metadata_uri):
    async def body():
        async with await open_store(metadata_uri) as store:
            ledgers = LedgerManager(store)
            with pytest.raises(NoSuchLedgerError, match="ledger 4242 "):
                await ledgers.read(4242)
            with pytest.raises(NoSuchLedgerError, match="ledger 4242 "):
                await ledgers.delete(4242)
            with pytest.raises(NoSuchLedgerError, match="ledger 4242 "):
                await ledgers.write(metadata(4242), 0)

    run(body())


def test_delete_and_list_sorted_numerically(metadata_uri):
    async def body():
        async with await open_store(metadata_uri) as store:
            ledgers = LedgerManager(store)
            assert await ledgers.list_ledger_ids() == []
            for ledger_id in (10, 9, 100, 2):
                await ledgers.create(metadata(ledger_id))
            assert await ledgers.list_ledger_ids() == [2, 9, 10, 100]
            with pytest.raises(MetadataVersionError, match="ledger 9"):
                await ledgers.delete(9, version=3)
            await ledgers.delete(9, version=0)
            await ledgers.delete(100)
            assert await ledgers.list_ledger_ids() == [2, 10]
            with pytest.raises(NoSuchLedgerError, match="ledger 9 "):
                await ledgers.read(9)

    run(body())


def test_undecodable_metadata_is_a_metadata_error_naming_the_ledger(metadata_uri):
    async def body():
        async with await open_store(metadata_uri) as store:
            await store.create("/ledgers/77", b"not json")
            with pytest.raises(MetadataError, match="ledger 77"):
                await LedgerManager(store).read(77)

    run(body())


def test_watch_reports_each_change_then_none_on_delete(metadata_uri):
    async def body():
        async with (
            await open_store(metadata_uri) as writer_store,
            await open_store(metadata_uri) as watcher_store,
        ):
            writer, watcher = LedgerManager(writer_store), LedgerManager(watcher_store)
            ledger_id = await writer.new_ledger_id()
            await writer.create(metadata(ledger_id))
            seen: asyncio.Queue[LedgerMetadata | None] = asyncio.Queue()
            watch = watcher.watch(ledger_id, seen.put_nowait)
            await watcher.read(ledger_id)  # a round trip: the watch is in force after it
            md, version = await writer.read(ledger_id)
            grown = md.with_new_fragment(5, ("127.0.0.1:3184", *BOOKIES[1:]))
            version = await writer.write(grown, version)
            assert await wait_for_value(seen) == grown
            closed = dataclasses.replace(grown, state=LedgerState.CLOSED, last_entry_id=7)
            await writer.write(closed, version)
            assert await wait_for_value(seen) == closed
            await writer.delete(ledger_id)
            assert await wait_for_value(seen) is None
            watch.cancel()
            # A second watch of the ledger, in force before the re-creation: once it has
            # reported the new ledger, the cancelled one has had its chance to as well.
            after: asyncio.Queue[LedgerMetadata | None] = asyncio.Queue()
            later = watcher.watch(ledger_id, after.put_nowait)
            await watcher_store.exists("/ledgers")  # a round trip: in force
            again = metadata(ledger_id)
            await writer.create(again)
            assert await wait_for_value(after) == again
            later.cancel()
            assert seen.empty()

    run(body())


# ---------------------------------------------------------------------- bookies


def test_register_lists_and_moves_between_writable_and_readonly(metadata_uri):
    async def body():
        async with await open_store(metadata_uri) as store:
            registry = BookieRegistry(store)
            assert await registry.writable_bookies() == []
            assert await registry.readonly_bookies() == []
            for address in reversed(BOOKIES):
                await registry.register(address)
            assert await registry.writable_bookies() == sorted(BOOKIES)
            await registry.register(BOOKIES[0])  # registering again is harmless
            await registry.register(BOOKIES[1], read_only=True)
            assert await registry.writable_bookies() == [BOOKIES[0], BOOKIES[2]]
            assert await registry.readonly_bookies() == [BOOKIES[1]]
            await registry.register(BOOKIES[1])
            assert await registry.readonly_bookies() == []
            await registry.unregister(BOOKIES[2])
            await registry.unregister(BOOKIES[2])  # absent: no error
            assert await registry.writable_bookies() == [BOOKIES[0], BOOKIES[1]]

    run(body())


def test_registrations_go_with_the_session(metadata_uri):
    async def body():
        async with await open_store(metadata_uri) as observer:
            bookie_store = await open_store(metadata_uri)
            await BookieRegistry(bookie_store).register(BOOKIES[0])
            assert await BookieRegistry(observer).writable_bookies() == [BOOKIES[0]]
            await bookie_store.close()
            assert await BookieRegistry(observer).writable_bookies() == []

    run(body())


def test_bad_bookie_address_is_refused(metadata_uri):
    async def body():
        async with await open_store(metadata_uri) as store:
            registry = BookieRegistry(store)
            for bad in ("no-port", "host:0", "host:99999", "a/b:1", ":3181"):
                with pytest.raises(InvalidArgumentError, match="bookie address"):
                    await registry.register(bad)

    run(body())


def test_registry_watch_fires_on_any_list_change(metadata_uri):
    async def body():
        async with (
            await open_store(metadata_uri) as bookie_store,
            await open_store(metadata_uri) as client_store,
        ):
            changes: asyncio.Queue[None] = asyncio.Queue()
            watch = BookieRegistry(client_store).watch(lambda: changes.put_nowait(None))
            await BookieRegistry(client_store).writable_bookies()  # the watch is in force
            registry = BookieRegistry(bookie_store)
            await registry.register(BOOKIES[0])
            await wait_for_value(changes)
            await registry.register(BOOKIES[0], read_only=True)
            await wait_for_value(changes)
            await registry.unregister(BOOKIES[0])
            await wait_for_value(changes)
            watch.cancel()

    run(body())


def test_live_duplicate_registration_is_refused_after_the_wait(metadata_uri):
    async def body():
        async with (
            await open_store(metadata_uri) as first,
            await open_store(metadata_uri) as second,
        ):
            await BookieRegistry(first).register(BOOKIES[0])
            started = time.monotonic()
            with pytest.raises(MetadataError, match=f"bookie {BOOKIES[0]} is already registered"):
                await BookieRegistry(second, stale_wait_ms=300).register(BOOKIES[0])
            # It waited its own stale_wait_ms (300 ms), not the 30 s default: a bound far
            # from both, for a shared machine.
            assert 0.25 <= time.monotonic() - started < 20.0
            assert await BookieRegistry(second).writable_bookies() == [BOOKIES[0]]

    run(body())


REGISTER_AND_HANG = r"""
import asyncio, sys
from quorumlog.meta.factory import open_store
from quorumlog.meta.bookies import BookieRegistry

async def main():
    store = await open_store(sys.argv[1], session_timeout_ms=int(sys.argv[2]))
    await BookieRegistry(store).register(sys.argv[3])
    print("READY", flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


def test_restarted_bookie_registers_once_the_dead_session_expires(metadata_uri):
    """kill -9 a registered bookie and register the same address at once: register waits
    for the old ephemeral to expire instead of failing or deleting a live one."""
    session_ms = 1_000

    async def body():
        proc = subprocess.Popen(
            [sys.executable, "-c", REGISTER_AND_HANG, metadata_uri, str(session_ms), BOOKIES[0]],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 15)
            assert line.strip() == "READY"
            proc.send_signal(signal.SIGKILL)
            async with await open_store(metadata_uri, session_timeout_ms=session_ms) as store:
                registry = BookieRegistry(store, stale_wait_ms=60_000)
                started = time.monotonic()
                await registry.register(BOOKIES[0])
                waited_s = time.monotonic() - started
                # It had to wait for the dead session (1 s) to expire, and registered once
                # it had, long before its 60 s stale wait ran out.
                assert 0.2 <= waited_s < 30.0
                assert await registry.writable_bookies() == [BOOKIES[0]]
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=15)
            if proc.stdout is not None:
                proc.stdout.close()

    run(body())


def test_cookie_is_created_once_then_compare_and_set(metadata_uri):
    async def body():
        async with await open_store(metadata_uri) as store:
            registry = BookieRegistry(store)
            address = BOOKIES[0]
            assert await registry.read_cookie(address) is None
            assert await registry.write_cookie(address, b"instance-1", -1) == 0
            with pytest.raises(MetadataVersionError, match=f"bookie {address}"):
                await registry.write_cookie(address, b"instance-2", -1)
            cookie = await registry.read_cookie(address)
            assert cookie is not None and (cookie.data, cookie.version) == (b"instance-1", 0)
            assert await registry.write_cookie(address, b"instance-1+dir", 0) == 1
            with pytest.raises(MetadataVersionError, match=f"bookie {address}"):
                await registry.write_cookie(address, b"stale", 0)
            await registry.delete_cookie(address)
            assert await registry.read_cookie(address) is None
            with pytest.raises(MetadataVersionError, match=f"bookie {address}"):
                await registry.write_cookie(address, b"gone", 1)

    run(body())
