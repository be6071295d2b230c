"""A process cut off from ZooKeeper long enough for its session to expire comes back.

Every process reaches ZooKeeper through a TCP forwarder that the test can cut (every
connection reset, new ones closed at once) and heal. While it is cut, ZooKeeper hears
nothing from the session and expires it, deleting its ephemeral nodes: the bookie's
registration, an election candidate. Once healed, kazoo learns on reconnecting that
the session is gone (LOST) and starts a new one; the process must put its ephemerals
back on the new session (or exit so a supervisor restarts it), never keep retrying on
the dead one.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import (
    CuttableLink,
    holds_for,
    poll_until,
    port_for_a_child,
    run,
    start_quorumlog,
    stop_process,
)

from quorumlog.errors import NoNodeError
from quorumlog.meta.bookies import BookieRegistry
from quorumlog.meta.factory import open_store
from quorumlog.server.local_cluster import LocalCluster
from quorumlog.server.local_zookeeper import ZooKeeperServer
from quorumlog.testing.raw_client import RawClient, make_entry, master_key

pytestmark = pytest.mark.zookeeper

# Short sessions (the test ZooKeeper's tickTime is 100 ms): expiry takes about a second.
SESSION_TIMEOUT_MS = 1000
_chroots = itertools.count(1)


@pytest.fixture
def link(zookeeper_server: ZooKeeperServer) -> Iterator[CuttableLink]:
    forwarder = CuttableLink("127.0.0.1", zookeeper_server.port)
    try:
        yield forwarder
    finally:
        forwarder.close()


def _store_behind(zookeeper_server: ZooKeeperServer, link: CuttableLink) -> tuple[str, str]:
    """A new chroot, created: its URI as the test reaches it (never cut) and as the
    processes under test reach it (through ``link``)."""
    chroot = f"/expiry-{os.getpid()}-{next(_chroots)}"
    direct_uri = zookeeper_server.uri(chroot)
    run(_writable(direct_uri))
    return direct_uri, f"zk://127.0.0.1:{link.port}{chroot}"


def _one_bookie(cut_uri: str, tmp_path: Path) -> LocalCluster:
    """One bookie whose metadata session expires after SESSION_TIMEOUT_MS cut off."""
    args = ["--metadata-session-timeout-ms", str(SESSION_TIMEOUT_MS)]
    return LocalCluster(cut_uri, tmp_path / "c", 1, extra_args=args, journal_sync=False)


async def _writable(uri: str) -> list[str]:
    store = await open_store(uri, create=True)
    try:
        return await BookieRegistry(store).writable_bookies()
    finally:
        await store.close()


def test_a_bookie_comes_back_after_partition_after_partition(
    zookeeper_server: ZooKeeperServer, link: CuttableLink, tmp_path: Path
) -> None:
    """Each cut starts as soon as the bookie is listed again, so that it often falls
    while the bookie is still confirming its new registration: the new session is then
    lost too, and the bookie must start over rather than wait on the dead one."""
    direct_uri, cut_uri = _store_behind(zookeeper_server, link)
    with _one_bookie(cut_uri, tmp_path) as c:
        address = c.addresses[0]
        for round_number in range(4):
            poll_until(
                lambda: run(_writable(direct_uri)) == [address],
                timeout_s=30,
                interval_s=0.02,
                what=f"listed before cut {round_number}",
            )
            link.cut()
            poll_until(
                lambda: run(_writable(direct_uri)) == [],
                timeout_s=30,
                interval_s=0.1,
                what=f"session expired in cut {round_number}",
            )
            link.heal()
        poll_until(
            lambda: run(_writable(direct_uri)) == [address],
            timeout_s=30,
            interval_s=0.1,
            what="listed after the last cut",
        )
        assert c.bookies[0].alive()


async def _delete_cookie(uri: str, address: str) -> None:
    store = await open_store(uri, create=True)
    try:
        await store.delete(f"/bookies/cookies/{address}")
    finally:
        await store.close()


def test_a_bookie_whose_cookie_went_while_it_was_cut_off_exits_instead_of_registering(
    zookeeper_server: ZooKeeperServer, link: CuttableLink, tmp_path: Path
) -> None:
    """Re-registering checks the cookie on the new session: the store no longer knowing
    this bookie (its record removed, or the wrong store) stops it with status 2, so its
    supervisor's restart reports the refusal, instead of it joining again unchecked."""
    direct_uri, cut_uri = _store_behind(zookeeper_server, link)
    with _one_bookie(cut_uri, tmp_path) as c:
        address = c.addresses[0]
        link.cut()
        poll_until(
            lambda: run(_writable(direct_uri)) == [],
            timeout_s=30,
            interval_s=0.2,
            what="the cut-off bookie's session expired",
        )
        run(_delete_cookie(direct_uri, address))
        link.heal()
        assert c.wait_exit(0, timeout_s=30) == 2
        stderr = c.bookies[0].stderr_text()
        assert "refusing to go on" in stderr and "cookie" in stderr
        assert run(_writable(direct_uri)) == []


async def _election_identifiers(uri: str, group: str) -> list[str]:
    """The data of every node in election ``group`` (each contender's identifier)."""
    store = await open_store(uri, create=True)
    try:
        path = f"/election/{group}"
        try:
            names = await store.children(path)
        except NoNodeError:
            return []
        found = []
        for name in names:
            with contextlib.suppress(NoNodeError):
                found.append((await store.get(f"{path}/{name}")).data.decode())
        return found
    finally:
        await store.close()


def test_every_ephemeral_comes_back_after_its_session_expired_behind_a_partition(
    zookeeper_server: ZooKeeperServer, link: CuttableLink, tmp_path: Path
) -> None:
    """A bookie, an autorecovery daemon and a database replica, all reaching ZooKeeper
    through one link, cut for longer than their sessions and than the bookie's
    registration check (10 s), so that calls are in flight when kazoo reports the
    sessions lost: once healed, each is back on a new session."""
    direct_uri, cut_uri = _store_behind(zookeeper_server, link)
    session = str(SESSION_TIMEOUT_MS)
    with _one_bookie(cut_uri, tmp_path) as c:
        address = c.addresses[0]
        daemon = start_quorumlog(
            tmp_path,
            "ar",
            ["autorecovery", "--metadata", cut_uri, "--autorecovery-session-timeout-ms", session],
        )
        db_args = ["db", "serve", "--metadata", cut_uri, "--name", "expiry", "--data-dir"]
        db_args += [str(tmp_path / "db"), "--http-addr", f"127.0.0.1:{port_for_a_child()}"]
        db_args += ["--session-timeout-ms", session, "--ensemble", "1", "--write-quorum", "1"]
        db = start_quorumlog(
            tmp_path, "db", [*db_args, "--ack-quorum", "1", "--node-id", "replica"]
        )
        try:

            def everyone_there() -> bool:
                return (
                    run(_writable(direct_uri)) == [address]
                    and len(run(_election_identifiers(direct_uri, "autorecovery-auditor"))) == 1
                    and len(run(_election_identifiers(direct_uri, "db.expiry"))) == 1
                )

            def nobody_there() -> bool:
                return (
                    run(_writable(direct_uri)) == []
                    and run(_election_identifiers(direct_uri, "autorecovery-auditor")) == []
                    and run(_election_identifiers(direct_uri, "db.expiry")) == []
                )

            poll_until(everyone_there, timeout_s=60, interval_s=0.2, what="all joined")
            link.cut()
            # ZooKeeper expires the silent sessions and deletes their ephemerals.
            poll_until(nobody_there, timeout_s=30, interval_s=0.2, what="sessions expired")
            # Past the bookie's registration check: calls are in flight at the heal.
            holds_for(nobody_there, duration_s=10, interval_s=0.5, what="nobody while cut")
            link.heal()
            poll_until(everyone_there, timeout_s=30, interval_s=0.2, what="all back")
            assert c.bookies[0].alive() and daemon.poll() is None and db.poll() is None
        finally:
            stop_process(daemon)
            stop_process(db)

        async def add() -> int:
            client = await RawClient.connect(address)
            try:
                key = master_key(b"")
                return (await client.add(7, key, [make_entry(7, 0, b"after")])).status
            finally:
                await client.close()

        assert run(add()) == 0  # OK: the bookie serves on
