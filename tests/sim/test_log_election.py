"""The leader election recipe on the in-memory store, in virtual time.

Sessions are driven by hand: ``expire()`` (LOST, the node goes), ``suspend()`` and
``reconnect()`` (SUSPENDED, then CONNECTED with the node kept).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from support import run_virtual

from quorumlog.meta.store import MetadataStore, SessionState
from quorumlog.recipes.election import LeaderElection
from quorumlog.testing.memory_store import MemoryStore, MemoryTree


class ControlledStore(MemoryStore):
    """A memory session whose connection can be suspended and restored."""

    def suspend(self) -> None:
        self._state = SessionState.SUSPENDED
        for listener in self._listeners:
            self._loop.call_soon(listener, SessionState.SUSPENDED)

    def reconnect(self) -> None:
        self._state = SessionState.CONNECTED
        for listener in self._listeners:
            self._loop.call_soon(listener, SessionState.CONNECTED)


class Contender:
    """An election with its own sessions on a shared tree, recording its callbacks."""

    def __init__(self, tree: MemoryTree, name: str) -> None:
        self.sessions: list[ControlledStore] = []
        self.events: list[str] = []

        async def new_session() -> MetadataStore:
            store = ControlledStore(tree)
            self.sessions.append(store)
            return store

        self.election = LeaderElection(
            new_session,
            "group",
            identifier=name,
            session_timeout_ms=1000,
            on_gain=lambda: self.events.append("gain"),
            on_loss=lambda: self.events.append("loss"),
        )

    @property
    def session(self) -> ControlledStore:
        return self.sessions[-1]


def run_on_tree(body: Callable[[MemoryTree], Awaitable[Any]]) -> Any:
    """``body`` on a new in-memory tree, in virtual time."""
    return run_virtual(lambda loop: body(MemoryTree()))


async def settle() -> None:
    await asyncio.sleep(0.05)


def test_the_first_contender_leads_and_the_next_takes_over_when_it_closes() -> None:
    async def body(tree: MemoryTree) -> None:
        a, b, c = (Contender(tree, n) for n in "abc")
        for x in (a, b, c):
            await x.election.start()
        assert await a.election.wait_for_leadership(1)
        assert not b.election.is_leader and not c.election.is_leader
        assert not await b.election.wait_for_leadership(0.2)  # times out
        assert [ident for _, ident in await a.election.contenders()] == ["a", "b", "c"]
        await a.election.close()
        assert a.events == ["gain", "loss"]
        assert await b.election.wait_for_leadership(1)
        assert not c.election.is_leader
        await b.election.close()
        assert await c.election.wait_for_leadership(1)
        await c.election.close()

    run_on_tree(body)


def test_a_middle_contender_leaving_changes_no_leader() -> None:
    async def body(tree: MemoryTree) -> None:
        a, b, c = (Contender(tree, n) for n in "abc")
        for x in (a, b, c):
            await x.election.start()
        await b.election.close()
        await settle()
        assert a.election.is_leader and not c.election.is_leader
        assert c.events == []
        await a.election.close()
        assert await c.election.wait_for_leadership(1)

    run_on_tree(body)


def test_a_lost_session_ends_leadership_at_once_and_requeues_at_the_end() -> None:
    async def body(tree: MemoryTree) -> None:
        a, b = Contender(tree, "a"), Contender(tree, "b")
        await a.election.start()
        await b.election.start()
        assert a.election.is_leader
        a.session.expire()  # heartbeats stopped too long: the node is gone
        await settle()
        assert not a.election.is_leader and a.events == ["gain", "loss"]
        assert await b.election.wait_for_leadership(1)
        await asyncio.sleep(1.0)  # a opens a new session and queues again behind b
        assert len(a.sessions) == 2
        assert [ident for _, ident in await b.election.contenders()] == ["b", "a"]
        assert not a.election.is_leader
        await b.election.close()
        assert await a.election.wait_for_leadership(1)
        await a.election.close()

    run_on_tree(body)


def test_a_suspended_leader_stops_leading_at_once_and_leads_again_if_its_node_survived() -> None:
    async def body(tree: MemoryTree) -> None:
        a, b = Contender(tree, "a"), Contender(tree, "b")
        await a.election.start()
        await b.election.start()
        a.session.suspend()
        await asyncio.sleep(0)  # the listener runs on the next loop turn
        await asyncio.sleep(0)
        assert not a.election.is_leader and a.events == ["gain", "loss"]
        assert not b.election.is_leader  # a's node still exists: b must wait
        a.session.reconnect()
        assert await a.election.wait_for_leadership(1)
        assert a.events == ["gain", "loss", "gain"] and a.election.terms == 2
        assert len(a.sessions) == 1
        await a.election.close()
        await b.election.close()

    run_on_tree(body)


def test_a_node_deleted_behind_the_contenders_back_is_replaced() -> None:
    async def body(tree: MemoryTree) -> None:
        a = Contender(tree, "a")
        await a.election.start()
        assert a.election.is_leader
        node = a.election.node
        admin = MemoryStore(tree)
        await admin.delete(f"/election/group/{node}")
        await asyncio.sleep(1.0)  # the periodic re-check notices
        assert a.election.node != node
        assert a.election.is_leader
        await a.election.close()
        assert await admin.children("/election/group") == []

    run_on_tree(body)
