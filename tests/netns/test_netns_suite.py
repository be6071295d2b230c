"""The namespace suite: a cluster across network namespaces (ZooKeeper servers,
bookies behind their fault proxies, database replicas, clients: one namespace each)
under every nemesis, on both metadata drivers, as root.

Each run puts a workload under load, applies one nemesis for a few seconds, heals it,
waits for service to come back, reads everything back and checks the history: no
acknowledged write lost, none duplicated or invented, one order for every reader,
real-time order, nothing acknowledged by a fenced writer, strong database reads
linearizable, and service back within RECOVERY_BOUND_S of healing. The nemeses that
cut the metadata store's network run on ZooKeeper only: the SQLite store is a file
every namespace shares, with no network to cut.

Histories and summaries stay under pytest's temporary directory, or under
$QUORUMLOG_NETNS_OUT when it is set (the failure message names the run's directory);
``python -m tests.harness.netns`` runs the same suite outside pytest and prints
each run's summary.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog.server.local_zookeeper import missing_zookeeper_message, zookeeper_installed
from tests.harness.netns.cluster import BOOKIE_PORT, NetnsCluster
from tests.harness.netns.network import netns_unavailable_reason, removal_on_signals
from tests.harness.netns.runner import (
    RECOVERY_BOUND_S,
    SUITE,
    SUITE_SPECS,
    ensure_db,
    run_nemesis,
)


def _base_dir(driver: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    kept = os.environ.get("QUORUMLOG_NETNS_OUT")
    if kept:
        return Path(kept) / driver
    return tmp_path_factory.mktemp(f"netns-{driver}")


def _cluster(driver: str, base: Path) -> Iterator[NetnsCluster]:
    reason = netns_unavailable_reason()
    if reason is not None:
        pytest.fail(f"the namespace suite cannot run here: {reason}", pytrace=False)
    if driver == "zk" and not zookeeper_installed():
        pytest.fail(missing_zookeeper_message(), pytrace=False)
    # SIGTERM (a CI timeout) exits through finally and atexit, which kill the cluster's
    # processes and delete its namespaces; Ctrl-C already does.
    with removal_on_signals(), NetnsCluster(driver, base / "cluster") as cluster:
        cluster.start()
        yield cluster


def _check_run(cluster: NetnsCluster, name: str, out: Path) -> None:
    result = run_nemesis(cluster, SUITE[name], out)
    print(result.summary_line())
    where = f"{result.summary_line()}\nhistory: {result.directory}"
    assert result.valid, where
    assert result.acknowledged > 0, f"nothing was acknowledged: {where}"
    assert result.lost == 0 and result.duplicated == 0, where
    assert result.recovery_s is not None and result.recovery_s <= RECOVERY_BOUND_S, where
    if result.linearizable is not None:
        assert result.linearizable, where


def _check_listeners(cluster: NetnsCluster) -> None:
    """Every server listens on its namespace's own addresses, none on 127.0.0.1 or on a
    wildcard (the database's replicas included: started here if no run started them)."""
    ensure_db(cluster)
    listening: set[str] = set()
    for host in cluster.network.hosts.values():
        done = host.run(["ss", "-Hltn"], timeout_s=10)
        assert done.returncode == 0, done.stderr
        local = [line.split()[3] for line in done.stdout.splitlines() if line.strip()]
        for address in local:
            ip = address.rsplit(":", 1)[0]
            assert ip in host.addresses, f"{host.name} listens on {address}: {local}"
        listening.update(local)
    expected = {f"{b.bind_address}:{BOOKIE_PORT}" for b in cluster.bookies}
    expected |= {b.address for b in cluster.bookies}  # the proxies
    expected |= {cluster.db_address(r) for r in cluster.db_replicas}
    if cluster.zookeeper is not None:
        expected |= {node.address for node in cluster.zookeeper.nodes}
    assert expected <= listening, f"not listening: {sorted(expected - listening)}"


class TestOnSqlite:
    @pytest.fixture(scope="class")
    @classmethod
    def cluster(cls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsCluster]:
        yield from _cluster("sqlite", _base_dir("sqlite", tmp_path_factory))

    @pytest.mark.parametrize(
        "name", [spec.name for spec in SUITE_SPECS if "sqlite" in spec.drivers]
    )
    def test_nemesis(self, cluster: NetnsCluster, name: str) -> None:
        _check_run(cluster, name, cluster.base_dir.parent / "runs")

    def test_servers_listen_only_on_their_namespace_addresses(self, cluster: NetnsCluster) -> None:
        _check_listeners(cluster)


@pytest.mark.zookeeper
class TestOnZooKeeper:
    @pytest.fixture(scope="class")
    @classmethod
    def cluster(cls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsCluster]:
        yield from _cluster("zk", _base_dir("zk", tmp_path_factory))

    @pytest.mark.parametrize("name", [spec.name for spec in SUITE_SPECS if "zk" in spec.drivers])
    def test_nemesis(self, cluster: NetnsCluster, name: str) -> None:
        _check_run(cluster, name, cluster.base_dir.parent / "runs")

    def test_servers_listen_only_on_their_namespace_addresses(self, cluster: NetnsCluster) -> None:
        _check_listeners(cluster)
