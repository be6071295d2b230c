"""The leader election on ZooKeeper is kazoo's ``Lock`` recipe.

- A separate kazoo client sees our contenders through ``Lock(...).contenders()``,
  and a plain kazoo ``Lock`` waits in the same line as our contenders.
- A connection cut shorter than the session timeout (a TCP proxy between one
  contender and ZooKeeper): the leader stops leading at once and leads again when
  the session comes back; a cut longer than the session timeout: another contender
  leads, and the old one queues again with a fresh node.
- A SIGSTOPped leader (a real process) loses its node after the session timeout;
  resumed, it reports the loss, does not lead, and is in kazoo's line again.
- close() ends every thread the election started (kazoo's included), promptly even
  while the connection is cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient  # type: ignore[import-untyped]
from kazoo.recipe.lock import Lock  # type: ignore[import-untyped]
from support import holds_for, holds_for_async
from tcp_proxy import CuttableProxy
from test_election import SESSION_TIMEOUT_MS, ContenderProcess

from quorumlog.recipes.election import LeaderElection
from quorumlog.server.local_zookeeper import ZooKeeperServer

pytestmark = pytest.mark.zookeeper

KAZOO_LOCK_NODE = re.compile(r"[0-9a-f]{32}__lock__\d{10}")
# A bound for a contender to lead at all once the line lets it (a watch, or a session
# expiry of 1 s): generous, since ZooKeeper on a loaded machine answers in seconds.
LEADERSHIP_BOUND_S = 30
_roots = itertools.count(1)


@pytest.fixture
def zk_root(zookeeper_server: ZooKeeperServer) -> str:
    return f"/test-election-kazoo-{os.getpid()}-{next(_roots)}"


@contextlib.contextmanager
def kazoo_client(server: ZooKeeperServer, root: str) -> Iterator[KazooClient]:
    """A kazoo client of the test's own, chrooted where the elections are."""
    client = KazooClient(hosts=server.hosts, timeout=5)
    client.start(timeout=10)
    client.ensure_path(root)
    client.chroot = root
    try:
        yield client
    finally:
        client.stop()
        client.close()


def node_of(client: KazooClient, path: str, identifier: str) -> str | None:
    """The name of the node whose data is ``identifier``, as a kazoo program finds it."""
    for name in client.get_children(path):
        if client.get(f"{path}/{name}")[0] == identifier.encode():
            return str(name)
    return None


def eventually(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"{what}: not within {timeout_s} s")


async def until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{what}: not within {timeout_s} s")


def election(
    uri: str,
    group: str,
    name: str,
    events: list[str] | None = None,
    session_timeout_ms: int = SESSION_TIMEOUT_MS,
) -> LeaderElection:
    log = events if events is not None else []
    return LeaderElection(
        uri,
        group,
        identifier=name,
        session_timeout_ms=session_timeout_ms,
        on_gain=lambda: log.append("gain"),
        on_loss=lambda: log.append("loss"),
    )


# ---------------------------------------------------------------- kazoo sees the same line


def test_election_on_zookeeper_is_kazoos_lock_and_shares_its_line(
    zookeeper_server: ZooKeeperServer, zk_root: str
) -> None:
    uri = zookeeper_server.uri(zk_root)
    threads_before = set(threading.enumerate())

    async def main(client: KazooClient) -> None:
        kazoo_line = Lock(client, "/election/jobs")
        a, b, c = (election(uri, "jobs", name) for name in "abc")
        for contender in (a, b, c):
            await contender.start()
        assert await a.wait_for_leadership(LEADERSHIP_BOUND_S)
        ours = await a.contenders()
        assert [ident for _, ident in ours] == ["a", "b", "c"]
        assert all(KAZOO_LOCK_NODE.fullmatch(name) for name, _ in ours), ours
        assert [name for name, _ in ours] == [a.node, b.node, c.node]
        assert kazoo_line.contenders() == ["a", "b", "c"]

        await a.close()
        assert await b.wait_for_leadership(LEADERSHIP_BOUND_S)
        assert kazoo_line.contenders() == ["b", "c"]

        # A plain kazoo Lock queues behind our contenders, and ours behind it.
        outsider = Lock(client, "/election/jobs", "outsider")
        acquired: list[bool] = []
        waiter = threading.Thread(target=lambda: acquired.append(outsider.acquire(timeout=20)))
        waiter.start()
        try:
            await until(lambda: len(kazoo_line.contenders()) == 3, 20, "the outsider queued")
            assert kazoo_line.contenders() == ["b", "c", "outsider"]
            await b.close()
            assert await c.wait_for_leadership(LEADERSHIP_BOUND_S)
            await c.close()
            await until(lambda: acquired == [True], 20, "the outsider holds the lock")
            d = election(uri, "jobs", "d")
            await d.start()
            await holds_for_async(  # kazoo's lock holder leads the line
                lambda: not d.is_leader, duration_s=0.3, what="d waits behind the outsider"
            )
            assert [ident for _, ident in await d.contenders()] == ["outsider", "d"]
            outsider.release()
            assert await d.wait_for_leadership(LEADERSHIP_BOUND_S)
            await d.close()
            assert not d.is_leader
        finally:
            outsider.cancel()
            waiter.join(25)
        assert client.get_children("/election/jobs") == []  # every close deleted its node

    with kazoo_client(zookeeper_server, zk_root) as client:
        asyncio.run(main(client))
    left = [t for t in set(threading.enumerate()) - threads_before if t.is_alive()]
    assert left == [], f"threads still running after close: {left}"


# ---------------------------------------------------------------- connection cuts


def test_election_zk_connection_cut_suspends_the_leader_and_a_long_one_requeues_it(
    zookeeper_server: ZooKeeperServer, zk_root: str
) -> None:
    proxy = CuttableProxy(zookeeper_server.port)
    direct_uri = zookeeper_server.uri(zk_root)
    proxied_uri = f"zk://127.0.0.1:{proxy.port}{zk_root}"
    threads_before = set(threading.enumerate())

    async def main() -> None:
        events_1: list[str] = []
        events_2: list[str] = []
        first = election(proxied_uri, "cut", "first", events_1)
        second = election(direct_uri, "cut", "second", events_2)
        await first.start()
        await second.start()
        assert await first.wait_for_leadership(LEADERSHIP_BOUND_S)
        node = first.node

        # A cut well within the session timeout: the session survives.
        proxy.cut()
        await until(lambda: not first.is_leader, 2, "the cut-off leader steps down")
        await holds_for_async(  # first's node is still there: second waits
            lambda: not second.is_leader,
            duration_s=SESSION_TIMEOUT_MS / 1000 / 4,
            what="second waits during a short cut",
        )
        proxy.restore()
        assert await first.wait_for_leadership(LEADERSHIP_BOUND_S)
        assert first.node == node and first.terms == 2
        assert events_1 == ["gain", "loss", "gain"] and events_2 == []

        # A cut longer than the session timeout: ZooKeeper expires first's session.
        proxy.cut()
        assert await second.wait_for_leadership(5 * SESSION_TIMEOUT_MS / 1000)
        assert not first.is_leader and events_1 == ["gain", "loss", "gain", "loss"]
        proxy.restore()
        await until(
            lambda: first.node not in (None, node), 10, "first queues again with a fresh node"
        )
        line = await second.contenders()
        assert [ident for _, ident in line] == ["second", "first"]
        assert line[1][0] == first.node
        await holds_for_async(
            lambda: second.is_leader and not first.is_leader,
            duration_s=0.5,
            what="second leads, first waits behind it",
        )
        assert events_1 == ["gain", "loss", "gain", "loss"]
        await second.close()
        assert await first.wait_for_leadership(LEADERSHIP_BOUND_S)
        await first.close()

    try:
        asyncio.run(main())
    finally:
        proxy.stop()
    left = [t for t in set(threading.enumerate()) - threads_before if t.is_alive()]
    assert left == [], f"threads still running after close: {left}"


def test_election_zk_close_while_cut_off_is_prompt_and_ends_every_thread(
    zookeeper_server: ZooKeeperServer, zk_root: str
) -> None:
    proxy = CuttableProxy(zookeeper_server.port)
    uri = f"zk://127.0.0.1:{proxy.port}{zk_root}"
    threads_before = set(threading.enumerate())

    # Sessions of 10 s put the elections' operation timeout at 20 s, so a prompt close is
    # told from a timed-out one with a bound generous for a shared machine.
    session_timeout_ms = 10_000

    async def main() -> list[float]:
        leader = election(uri, "cut", "leader", session_timeout_ms=session_timeout_ms)
        waiting = election(uri, "cut", "waiting", session_timeout_ms=session_timeout_ms)
        await leader.start()
        await waiting.start()
        assert leader.is_leader and not waiting.is_leader
        proxy.cut()
        await until(lambda: not leader.is_leader, 2, "the cut-off leader steps down")
        close_s = []
        for contender in (waiting, leader):  # one in Lock.acquire(), one holding the lock
            started = time.monotonic()
            await contender.close()
            close_s.append(time.monotonic() - started)
        return close_s

    try:
        close_s = asyncio.run(main())
    finally:
        proxy.stop()
    print(f"close while cut off: waiting {close_s[0]:.2f} s, leader {close_s[1]:.2f} s")
    # kazoo's next reconnection attempt (at most 1 s) at most, not a 20 s timeout
    assert max(close_s) < 10.0
    left = [t for t in set(threading.enumerate()) - threads_before if t.is_alive()]
    assert left == [], f"threads still running after close: {left}"


# ---------------------------------------------------------------- a frozen leader


def test_election_zk_sigstopped_leader_is_replaced_and_requeues_in_kazoos_line(
    zookeeper_server: ZooKeeperServer, zk_root: str, tmp_path: Path
) -> None:
    uri = zookeeper_server.uri(zk_root)
    started: list[ContenderProcess] = []

    def contender(name: str) -> ContenderProcess:
        proc = ContenderProcess(uri, "frozen", name, tmp_path)
        started.append(proc)
        proc.wait_for(lambda: any(w == "joined" for w, _ in proc.lines()), 30, "joined")
        return proc

    try:
        a = contender("a")
        a.wait_for(lambda: a.state() == "leader", 10, "a leads")
        b = contender("b")
        with kazoo_client(zookeeper_server, zk_root) as client:
            kazoo_line = Lock(client, "/election/frozen")
            assert kazoo_line.contenders() == ["a", "b"]
            a_node = node_of(client, "/election/frozen", "a")
            a.signal(signal.SIGSTOP)
            try:
                b.wait_for(lambda: b.state() == "leader", 10, "b leads while a is frozen")
                assert kazoo_line.contenders() == ["b"]  # a's node went with its session
                time.sleep(SESSION_TIMEOUT_MS / 1000)
            finally:
                a.signal(signal.SIGCONT)
            a.wait_for(lambda: a.state() == "follower", 5, "a reports the loss")
            eventually(lambda: kazoo_line.contenders() == ["b", "a"], 10, "a queues again")
            assert node_of(client, "/election/frozen", "a") not in (None, a_node)
            holds_for(
                lambda: a.state() == "follower" and b.state() == "leader",
                duration_s=1.0,
                what="one leader, b, after a resumed",
            )
            assert [w for w, _ in a.lines() if w in ("leader", "follower")] == [
                "leader",
                "follower",
            ]
    finally:
        for proc in started:
            proc.stop()
