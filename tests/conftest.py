"""Fixtures shared by every test directory.

- ``zookeeper_server``: one real ZooKeeper (Debian package ``zookeeper``) per test
  session, started the first time a test asks for it, stopped by pid at the end.
- ``metadata_uri``: a fresh, empty metadata store per test, once for each driver:
  ``sqlite`` (a file under ``tmp_path``) and ``zk`` (a chroot of its own on the
  shared ZooKeeper; those cases carry the ``zookeeper`` marker, so
  ``-m "not zookeeper"`` leaves them out). It exists, as if a bookie had made it:
  clients refuse a store that does not.
- ``cluster3``, ``cluster4``: three or four real bookie processes (journal sync on) on
  the test's ``metadata_uri``, stopped by pid after the test.

Helpers that test modules call (``run``, ``shell``, ...) live in ``support.py`` beside
this file: ``from support import run``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog.meta.factory import open_store
from quorumlog.server.local_cluster import LocalCluster, running_cluster
from quorumlog.server.local_zookeeper import (
    ZooKeeperServer,
    missing_zookeeper_message,
    zookeeper_installed,
)

_chroot_numbers = itertools.count(1)


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[ZooKeeperServer]:
    """A standalone ZooKeeper on 127.0.0.1 (tickTime 100 ms: sessions down to 200 ms)."""
    if not zookeeper_installed():
        pytest.fail(missing_zookeeper_message(), pytrace=False)
    server = ZooKeeperServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", pytest.param("zk", marks=pytest.mark.zookeeper)])
def metadata_uri(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> str:
    """A metadata URI nobody else uses: ``sqlite:///<tmp>/metadata.db`` or ``zk://.../<chroot>``."""
    if request.param == "sqlite":
        uri = f"sqlite://{os.path.join(os.fspath(tmp_path), 'metadata.db')}"
    else:
        server: ZooKeeperServer = request.getfixturevalue("zookeeper_server")
        uri = server.uri(f"/test-{os.getpid()}-{next(_chroot_numbers)}")
    asyncio.run(_make_store(uri))
    return uri


async def _make_store(uri: str) -> None:
    """Create the store at ``uri``, as a cluster's first bookie would."""
    store = await open_store(uri, create=True)
    await store.close()


@pytest.fixture
def cluster3(metadata_uri: str, tmp_path: Path) -> Iterator[LocalCluster]:
    """Three bookies with journal sync on."""
    yield from running_cluster(metadata_uri, tmp_path / "cluster", 3)


@pytest.fixture
def cluster4(metadata_uri: str, tmp_path: Path) -> Iterator[LocalCluster]:
    """Four bookies with journal sync on."""
    yield from running_cluster(metadata_uri, tmp_path / "cluster", 4)
