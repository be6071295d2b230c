"""The metadata store keeps other users out.

ZooKeeper: with ``?digest_file=`` in the URI every quorumlog process authenticates as
the file's ``user:password`` and every node it creates (registrations, cookies,
ledgers, counters, election nodes) carries a digest ACL for that user alone, so
another ZooKeeper user can neither change nor read them. SQLite: the store's file,
its -wal and -shm files and its directory are created owner-only.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo import exceptions as kz  # type: ignore[import-untyped]
from kazoo.client import KazooClient  # type: ignore[import-untyped]
from kazoo.security import make_digest_acl  # type: ignore[import-untyped]
from support import run

from quorumlog.aio import BookKeeper
from quorumlog.errors import InvalidArgumentError, MetadataError
from quorumlog.meta.factory import open_store
from quorumlog.recipes.election import LeaderElection
from quorumlog.server.local_cluster import LocalCluster
from quorumlog.server.local_zookeeper import ZooKeeperServer

_chroots = itertools.count(1)
USER, PASSWORD = "quorumlog", "s3cret-for-tests"


def _secret_file(directory: Path, text: str = f"{USER}:{PASSWORD}\n", mode: int = 0o600) -> Path:
    path = directory / "zk-digest"
    path.write_text(text)
    path.chmod(mode)
    return path


def _kazoo(zk: ZooKeeperServer, auth: str | None = None) -> KazooClient:
    client = KazooClient(
        hosts=f"127.0.0.1:{zk.port}", auth_data=[("digest", auth)] if auth else None
    )
    client.start(timeout=15)
    return client


@pytest.fixture
def secured(zookeeper_server: ZooKeeperServer, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(URI with credentials, its chroot)."""
    chroot = f"/acl-{os.getpid()}-{next(_chroots)}"
    secret = _secret_file(tmp_path)
    yield f"{zookeeper_server.uri(chroot)}?digest_file={secret}", chroot


def _walk(client: KazooClient, path: str) -> Iterator[str]:
    yield path
    for child in client.get_children(path):
        yield from _walk(client, f"{path.rstrip('/')}/{child}")


@pytest.mark.zookeeper
def test_zk_every_node_of_a_secured_cluster_is_for_its_user_alone(
    zookeeper_server: ZooKeeperServer, secured: tuple[str, str], tmp_path: Path
) -> None:
    uri, chroot = secured

    async def use_it() -> None:
        bk = await BookKeeper.connect(uri)
        try:
            ledger = await bk.create_ledger(1, 1, 1)
            await ledger.add_entry(b"x")
            await ledger.close()
            election = LeaderElection(uri, "acl-test", session_timeout_ms=2000)
            await election.start()
            try:
                assert await election.wait_for_leadership(timeout_s=30)
                await check_every_acl()  # the election's node is there now
            finally:
                await election.close()
        finally:
            await bk.close()

    owner_only = [make_digest_acl(USER, PASSWORD, all=True)]
    nodes: list[str] = []

    async def check_every_acl() -> None:
        def walk() -> None:
            client = _kazoo(zookeeper_server, f"{USER}:{PASSWORD}")
            try:
                for path in _walk(client, chroot):
                    acl, _ = client.get_acls(path)
                    assert acl == owner_only, (path, acl)
                    nodes.append(path)
            finally:
                client.stop()
                client.close()

        await asyncio.to_thread(walk)

    args = ["--metadata-session-timeout-ms", "2000"]
    with LocalCluster(uri, tmp_path / "c", 1, extra_args=args, journal_sync=False):
        run(use_it())
    kinds = ("/bookies/available/", "/bookies/cookies/", "/ledgers/", "/election/acl-test/")
    for kind in kinds:
        assert any(kind in node for node in nodes), (kind, nodes)

    stranger = _kazoo(zookeeper_server)
    wrong = _kazoo(zookeeper_server, f"{USER}:not-the-password")
    try:
        cookie_dir = f"{chroot}/bookies/cookies"
        for client in (stranger, wrong):
            for attempt in (
                lambda c: c.set(chroot, b"mine now"),
                lambda c: c.create(f"{chroot}/intruder", b""),
                lambda c: c.get_children(cookie_dir),
                lambda c: c.delete(f"{chroot}/ledgers", recursive=True),
            ):
                with pytest.raises(kz.NoAuthError):
                    attempt(client)
    finally:
        for client in (stranger, wrong):
            client.stop()
            client.close()


@pytest.mark.zookeeper
def test_zk_a_store_without_the_credentials_is_refused_with_the_reason(
    zookeeper_server: ZooKeeperServer, secured: tuple[str, str]
) -> None:
    uri, _ = secured
    run(_create(uri))
    plain = uri.partition("?")[0]
    with pytest.raises(MetadataError, match="not allowed for a session without credentials"):
        run(_create(plain, path="/counters/x"))


async def _create(uri: str, path: str = "/probe") -> None:
    store = await open_store(uri, create=True)
    try:
        await store.create(path, b"")
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("query", "mode", "text", "message"),
    [
        ("digest_file={f}", 0o644, f"{USER}:{PASSWORD}", "readable by others"),
        ("digest_file={f}", 0o600, "no-colon", "expected one line user:password"),
        ("digestfile={f}", 0o600, f"{USER}:{PASSWORD}", "unknown parameter 'digestfile'"),
    ],
)
def test_zk_credentials_that_could_leak_or_mean_nothing_are_refused(
    tmp_path: Path, query: str, mode: int, text: str, message: str
) -> None:
    from quorumlog.meta.zk_store import zk_credentials

    secret = _secret_file(tmp_path, text, mode)
    with pytest.raises(InvalidArgumentError, match=message):
        zk_credentials("zk://127.0.0.1:2181/q?" + query.format(f=secret))


def test_sqlite_store_file_and_directory_are_created_owner_only(tmp_path: Path) -> None:
    directory = tmp_path / "meta"
    old_umask = os.umask(0o022)  # the common default, which would leave them world-readable
    try:
        run(_create(f"sqlite://{directory}/metadata.db"))
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    files = sorted(directory.iterdir())
    assert directory / "metadata.db" in files
    for path in files:  # the database and SQLite's -wal / -shm beside it
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
