"""MemoryStore's injected faults (R13): unknown outcomes, failures, slow replies, partitions
and session expiry, as the simulator uses them (virtual time)."""

from __future__ import annotations

import asyncio
import random

import pytest
from support import run_virtual

from quorumlog.errors import MetadataError, SessionExpiredError
from quorumlog.meta.store import SessionState
from quorumlog.testing.memory_store import MemoryStore, MemoryTree, MetadataFaults


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
