"""MemoryStore's injected faults (R13): unknown outcomes, failures, slow replies, partitions
and session expiry, and ZooKeeper's consistency (R18): lagging servers, late watch
events; as the simulator uses them (virtual time)."""

from __future__ import annotations

import asyncio
import random

import pytest
from support import run_virtual

from quorumlog.errors import MetadataError, MetadataVersionError, SessionExpiredError
from quorumlog.meta.store import SessionState, Versioned, WatchEvent
from quorumlog.testing.memory_store import MemoryStore, MemoryTree, MetadataFaults, StaleReads


def test_r13_an_unknown_outcome_is_applied_and_reported_as_an_error() -> None:
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        tree = MemoryTree()
        faults = MetadataFaults(random.Random(1), unknown_probability=1.0)
        store, other = MemoryStore(tree, faults=faults), MemoryStore(tree)
        await other.create("/n", b"0")
        with pytest.raises(MetadataError, match="unknown"):
            await store.set("/n", b"1", 0)
        assert (await other.get("/n")).data == b"1"  # applied: only the reply was lost
        with pytest.raises(MetadataError, match="unknown"):
            await store.next_id("ids")
        assert await other.next_id("ids") == 2  # the lost reply still used id 1
        assert faults.unknown == ["set /n", "next_id ids"]
        assert await store.exists("/n") == 1  # reads are never "applied, reply lost"

    run_virtual(body)


def test_a_failed_operation_changes_nothing() -> None:
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        tree = MemoryTree()
        store = MemoryStore(tree, faults=MetadataFaults(random.Random(1), fail_probability=1.0))
        with pytest.raises(MetadataError, match="not sent"):
            await store.create("/n", b"x")
        assert await MemoryStore(tree).exists("/n") is None

    run_virtual(body)


def test_a_partitioned_session_times_out_unapplied_and_recovers_when_healed() -> None:
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        tree = MemoryTree()
        faults = MetadataFaults(random.Random(1), partitioned=True, timeout_ms=300)
        store = MemoryStore(tree, faults=faults)
        started = loop.time()
        with pytest.raises(MetadataError, match="unreachable"):
            await store.create("/n", b"x")
        assert loop.time() - started == pytest.approx(0.3)
        assert await MemoryStore(tree).exists("/n") is None
        faults.partitioned = False
        assert await store.create("/n", b"x") == "/n"

    run_virtual(body)


def test_a_slow_reply_comes_after_others_see_the_change() -> None:
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        tree = MemoryTree()
        faults = MetadataFaults(random.Random(3), slow_probability=1.0, slow_ms_max=100)
        store, other = MemoryStore(tree, faults=faults), MemoryStore(tree)
        writing = asyncio.ensure_future(store.create("/slow", b"x"))
        await asyncio.sleep(0)
        assert await other.exists("/slow") == 0 and not writing.done()
        assert await writing == "/slow"

    run_virtual(body)


def test_expiry_drops_ephemerals_and_refuses_new_ones_while_other_calls_go_on() -> None:
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        tree = MemoryTree()
        store, other = MemoryStore(tree), MemoryStore(tree)
        states: list[SessionState] = []
        store.add_session_listener(states.append)
        await store.create("/e", b"", ephemeral=True)
        store.expire()
        await asyncio.sleep(0)
        assert states == [SessionState.LOST]
        assert await other.exists("/e") is None
        with pytest.raises(SessionExpiredError):
            await store.create("/e2", b"", ephemeral=True)
        with pytest.raises(SessionExpiredError, match="/e"):
            await store.get("/e")
        assert await store.create("/persistent", b"") == "/persistent"

    run_virtual(body)


def test_r13_every_kind_of_write_can_be_applied_with_its_reply_lost() -> None:
    """create, set, delete and next_id each: applied, then a MetadataError (unknown)."""

    async def body(loop: asyncio.AbstractEventLoop) -> None:
        tree = MemoryTree()
        faults = MetadataFaults(random.Random(1), unknown_probability=1.0)
        store, other = MemoryStore(tree, faults=faults), MemoryStore(tree)
        with pytest.raises(MetadataError, match="unknown"):
            await store.create("/n", b"0")
        assert await other.exists("/n") == 0
        with pytest.raises(MetadataError, match="unknown"):
            await store.create("/e", b"", ephemeral=True)
        assert await other.exists("/e") == 0
        with pytest.raises(MetadataError, match="unknown"):
            await store.set("/n", b"1", 0)
        assert (await other.get("/n")).data == b"1"
        with pytest.raises(MetadataError, match="unknown"):
            await store.delete("/n", 1)
        assert await other.exists("/n") is None
        with pytest.raises(MetadataError, match="unknown"):
            await store.next_id("ids")
        assert [w.split()[0] for w in faults.unknown] == [
            "create",
            "create",
            "set",
            "delete",
            "next_id",
        ]

    run_virtual(body)


def test_r13_every_kind_of_write_can_fail_unapplied() -> None:
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        tree = MemoryTree()
        other = MemoryStore(tree)
        await other.create("/n", b"0")
        store = MemoryStore(tree, faults=MetadataFaults(random.Random(1), fail_probability=1.0))
        for write in (
            store.create("/m", b""),
            store.set("/n", b"1", 0),
            store.delete("/n", 0),
            store.next_id("ids"),
        ):
            with pytest.raises(MetadataError, match="not sent"):
                await write
        assert await other.get("/n") == Versioned(b"0", 0)
        assert await other.exists("/m") is None
        assert await other.next_id("ids") == 1

    run_virtual(body)


def _lagging(
    tree: MemoryTree, *, watch_delay_ms: float = 0.0, max_lag_s: float | None = None
) -> MemoryStore:
    """A session whose server catches up only when it must."""
    store = MemoryStore(tree)
    store.stale = StaleReads(
        random.Random(1),
        catch_up_probability=0.0,
        watch_delay_ms=watch_delay_ms,
        max_lag_s=max_lag_s,
    )
    return store


def test_r18_a_lagging_session_reads_old_data_until_it_syncs() -> None:
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        tree = MemoryTree()
        writer, reader = MemoryStore(tree), _lagging(tree)
        await writer.create("/n", b"0")
        assert await reader.get("/n") == Versioned(b"0", 0)  # its first read catches up
        await writer.set("/n", b"1")
        assert await reader.get("/n") == Versioned(b"0", 0)  # a follower behind the quorum
        assert await reader.children("/") == ["n"]
        await writer.create("/m", b"")
        assert await reader.exists("/m") is None
        await reader.sync()
        assert await reader.get("/n") == Versioned(b"1", 1)
        assert await reader.exists("/m") == 0
        assert reader.stale is not None and reader.stale.stale_reads == 3

    run_virtual(body)


def test_r18_a_lagging_server_is_at_most_max_lag_behind() -> None:
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        tree = MemoryTree()
        writer, reader = MemoryStore(tree), _lagging(tree, max_lag_s=0.5)
        await writer.create("/n", b"0")
        await reader.get("/n")
        await writer.set("/n", b"1")
        await asyncio.sleep(0.4)
        assert (await reader.get("/n")).data == b"0"
        await asyncio.sleep(0.2)
        assert (await reader.get("/n")).data == b"1"

    run_virtual(body)


def test_r13_r18_a_write_whose_reply_was_lost_may_be_missing_from_the_next_read() -> None:
    """A client that lost its connection may reconnect to a server that has not applied
    the write yet (it never saw the write, so ZooKeeper lets it read without it): only a
    sync makes it visible. A write whose answer arrived is visible at once."""

    async def body(loop: asyncio.AbstractEventLoop) -> None:
        tree = MemoryTree()
        faults = MetadataFaults(random.Random(1))
        store = _lagging(tree)
        store.faults = faults
        await store.create("/n", b"0")
        assert await store.get("/n") == Versioned(b"0", 0)  # its own answered write
        faults.unknown_probability = 1.0
        with pytest.raises(MetadataError, match="unknown"):
            await store.set("/n", b"1", 0)
        faults.unknown_probability = 0.0
        assert await store.get("/n") == Versioned(b"0", 0)
        with pytest.raises(MetadataVersionError):  # a refused write is answered: caught up
            await store.set("/n", b"2", 0)
        assert await store.get("/n") == Versioned(b"1", 1)

    run_virtual(body)


def test_a_lagging_server_sends_watch_events_late_in_order_and_before_the_data() -> None:
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        tree = MemoryTree()
        writer, reader = MemoryStore(tree), _lagging(tree, watch_delay_ms=50.0)
        await writer.create("/n", b"0")
        await reader.get("/n")
        events: list[WatchEvent] = []
        reader.watch("/n", events.append)
        await writer.set("/n", b"1")
        await writer.set("/n", b"2")
        await asyncio.sleep(0)
        assert events == []  # held by the lagging server
        assert (await reader.get("/n")).data == b"0"
        await reader.sync()  # catching up, the server sends what it held first
        assert [e.path for e in events] == ["/n", "/n"]
        assert (await reader.get("/n")).data == b"2"
        await writer.set("/n", b"3")
        await asyncio.sleep(0.06)  # at most watch_delay_ms late
        assert len(events) == 3
        assert (await reader.get("/n")).data == b"3"  # it caught up to send the event
        assert reader.stale is not None and reader.stale.late_events == 3

    run_virtual(body)
