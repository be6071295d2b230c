"""A ZooKeeper call cancelled in the very turn kazoo fails it stays cancelled.

kazoo fails every pending call (SessionExpired) at the moment it reports a session
lost, which is when the owners of ephemerals cancel what they were doing. On Python
3.11 ``asyncio.wait_for`` returns the inner future's outcome instead of the cancel if
both land in one turn, so a task that was told to stop went on retrying on the dead
session (a bookie that never registered again). No ZooKeeper server is needed: the
kazoo call is a stand-in that fails at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kazoo import exceptions as kz  # type: ignore[import-untyped]

from quorumlog.meta.zk_store import ZkStore
from quorumlog.recipes.zk_election import KazooContender


class _FailedAtOnce:
    """A kazoo AsyncResult already failed with SessionExpired."""

    value: Any = None
    exception = kz.SessionExpiredError()

    def successful(self) -> bool:
        return False

    def rawlink(self, callback: Any) -> None:
        callback(self)  # as kazoo's thread would: the loop hears of it in its next turn


async def _cancelled_in_the_turn_it_fails(call: Any) -> None:
    task = asyncio.get_running_loop().create_task(call)
    await asyncio.sleep(0)  # the task now waits; the failure is queued on the loop
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_a_store_call_cancelled_as_kazoo_fails_it_is_cancelled() -> None:
    async def scenario() -> None:
        store = ZkStore("zk://127.0.0.1:1/x", "127.0.0.1:1", "/x", 1000)  # never connected
        await _cancelled_in_the_turn_it_fails(store._call("get", "/a", _FailedAtOnce))

    asyncio.run(scenario())


def test_an_election_call_cancelled_as_kazoo_fails_it_is_cancelled() -> None:
    async def scenario() -> None:
        contender = KazooContender(
            "zk://127.0.0.1:1/x",
            group="g",
            path="/election/g",
            identifier="me",
            session_timeout_ms=1000,
            set_leader=lambda _leading: None,
        )
        contender._loop = asyncio.get_running_loop()
        call = contender._call("children", "/election/g", lambda _path: _FailedAtOnce())
        await _cancelled_in_the_turn_it_fails(call)

    asyncio.run(scenario())


def test_an_autorecovery_loop_cancelled_as_its_call_fails_stops() -> None:
    """The auditor's and the worker's loops run again after an error; one cancelled (its
    session lost) in the turn its call failed must stop, not run again on a closed
    client (a second auditor, or a session that never rejoins)."""
    from quorumlog.errors import SessionExpiredError
    from quorumlog.replication.autorecovery import AutoRecovery, AutoRecoveryConfig

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        daemon = AutoRecovery("sqlite:///unused.db", AutoRecoveryConfig(), identifier="t")
        runs = 0

        async def a_store_call() -> None:
            nonlocal runs
            runs += 1
            failing: asyncio.Future[None] = loop.create_future()
            # The call fails in the next turn, as kazoo's thread would report it.
            loop.call_soon(failing.set_exception, SessionExpiredError("session expired"))
            await asyncio.wait_for(failing, 10)  # as the client's own calls wait

        task = loop.create_task(daemon._again_on_error("worker", a_store_call))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.wait({task}, timeout=3)
        assert task.done() and task.cancelled()
        assert runs == 1

    asyncio.run(scenario())


def test_registering_on_a_session_lost_meanwhile_gives_up_at_once() -> None:
    """A bookie registering again on a new session that is itself lost before the
    registration is confirmed (a second partition) must hear of it at once: waiting out
    the registration timeout hid the second loss, and the bookie never came back."""
    from support import run_virtual

    from quorumlog.errors import BKError
    from quorumlog.meta.bookies import BookieRegistry
    from quorumlog.server.registration import Registration
    from quorumlog.testing.memory_store import MemoryStore, MetadataFaults

    async def scenario(loop: asyncio.AbstractEventLoop) -> float:
        import random

        store = MemoryStore(faults=MetadataFaults(random.Random(1), partitioned=True))
        registration = Registration(BookieRegistry(store), store, "10.0.0.1:3181")
        started_at = loop.time()
        loop.call_later(1.0, store.expire)  # cut off, then expired
        with pytest.raises(BKError, match="session"):
            await registration.start(read_only=False, timeout_s=30)
        await registration.abandon()
        return loop.time() - started_at

    assert run_virtual(scenario) < 2.0
