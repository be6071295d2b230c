"""Fixtures of the Spark tests: one SparkSession for the whole run, real bookies on an
embedded SQLite store.

- ``spark``: one session-scoped SparkSession, ``local[2,4]`` (two task threads, a failed
  task tried up to 4 times), on 127.0.0.1 with the ``quorumlog`` source registered.
  A JVM start costs seconds and ~430 MiB: every Spark test shares this one (no
  pytest-xdist). Stopped, with this process's quorumlog clients, at the end.
- ``metadata_uri``: here SQLite only (the ZooKeeper driver is covered by the other
  directories; the Spark tests stay quick).
- ``module_cluster``: three bookie processes shared by a module's tests (give each
  test its own log names); ``fresh_cluster``: three of a test's own (the root
  ``cluster3``), for tests that kill or stop bookies. Both carry their store as
  ``cluster.metadata_uri``.
- ``bk``: a client of ``module_cluster`` shared by a module's tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import quorumlog
from quorumlog.server.local_cluster import LocalCluster, running_cluster

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SPARK_MASTER = "local[2,4]"
SPARK_TEST_CONF = {
    "spark.ui.showConsoleProgress": "false",
    # Small data: fewer shuffle tasks than the session's default.
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
}


def sqlite_uri(directory: Path) -> str:
    """An embedded store in ``directory`` (``sqlite:///<dir>/meta.db``)."""
    return f"sqlite://{os.path.join(os.path.abspath(directory), 'meta.db')}"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The one SparkSession of the test run."""
    from quorumlog.spark import scan
    from quorumlog.spark.session import local_session

    session = local_session(SPARK_MASTER, app_name="quorumlog-tests", conf=SPARK_TEST_CONF)
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        try:
            session.stop()
        finally:
            scan.shutdown()  # the driver's clients, opened by planning and commits


@pytest.fixture
def metadata_uri(tmp_path: Path) -> str:
    """A fresh embedded store (Spark tests run on SQLite only)."""
    return sqlite_uri(tmp_path)


@pytest.fixture(scope="module")
def module_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three bookies (journal sync on) shared by the tests of one module."""
    base = tmp_path_factory.mktemp("spark-cluster")
    yield from running_cluster(sqlite_uri(base), base / "cluster", 3)


@pytest.fixture(scope="module")
def bk(module_cluster: LocalCluster) -> Iterator[quorumlog.BookKeeper]:
    """A client of the module's cluster."""
    with quorumlog.BookKeeper(module_cluster.metadata_uri) as client:
        yield client


@pytest.fixture
def fresh_cluster(cluster3: LocalCluster) -> LocalCluster:
    """Three bookies of this test's own (for tests that kill or stop bookies)."""
    return cluster3
