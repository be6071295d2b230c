"""How a local cluster starts its bookies: the servers' entry point, not the command."""

from __future__ import annotations

from pathlib import Path


def test_a_local_cluster_starts_the_servers_entry_point_not_the_command(tmp_path: Path) -> None:
    from quorumlog.server.local_cluster import LocalCluster

    cluster = LocalCluster(f"sqlite://{tmp_path / 'm.db'}", tmp_path, 1)
    bookie = cluster._new_bookie()
    assert cluster.command(bookie)[1:3] == ["-m", "quorumlog.server"]
    command = LocalCluster("sqlite:///m.db", tmp_path, 1, entry_point=("-m", "quorumlog", "bookie"))
    assert command.command(bookie)[1:4] == ["-m", "quorumlog", "bookie"]
