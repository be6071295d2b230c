"""quorumlog.testing used as an application's test suite would use it: only the public
names, a local cluster of real bookies, faults by pid."""

from __future__ import annotations

import time
from pathlib import Path

import quorumlog.testing
from quorumlog import BookKeeper
from quorumlog.testing import LocalCluster, local_cluster


def process_state(pid: int) -> str:
    """The state letter of ``/proc/PID/stat`` (``T``: stopped; ``Z``: a zombie)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rpartition(")")[2].split()[0]


def wait_stopped(pid: int, stopped: bool, timeout_s: float = 10.0) -> None:
    """Wait until the signal took effect (it is delivered asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while (process_state(pid) == "T") != stopped:
        assert time.monotonic() < deadline, f"pid {pid}: stopped is not {stopped}"
        time.sleep(0.01)


def test_every_public_name_resolves() -> None:
    for name in quorumlog.testing.__all__:
        assert getattr(quorumlog.testing, name) is not None, name
    assert set(quorumlog.testing.__all__) <= set(dir(quorumlog.testing))


def test_a_3_bookie_cluster_keeps_a_ledger_readable_through_a_crash_and_a_restart(
    tmp_path: Path,
) -> None:
    with local_cluster(3, base_dir=tmp_path) as cluster:
        assert isinstance(cluster, LocalCluster)
        assert len(cluster.addresses) == 3
        assert cluster.metadata_uri == f"sqlite://{tmp_path / 'metadata.db'}"
        payloads = [b"entry-%d" % i for i in range(20)]
        with BookKeeper(cluster.metadata_uri) as bk:
            # Ack quorum 3: every confirmed entry is on every bookie (with 2, the third
            # copy may still be on its way when a bookie is killed).
            writer = bk.create_ledger(3, 3, 3)
            for data in payloads:
                writer.add_entry(data)
            writer.close()

            victim = cluster.bookies[0]
            address, pid = victim.address, victim.pid
            cluster.kill(0)  # kill -9
            assert not victim.alive() and victim.returncode == -9
            reader = bk.open_ledger(writer.ledger_id)
            assert [e.data for e in reader.read_entries(0, 19)] == payloads

            assert cluster.restart(0) == address  # same directories, same port
            assert victim.pid != pid and victim.alive()
            cluster.kill(1)
            cluster.kill(2)  # only the restarted bookie is left: it kept its copy
            reader = bk.open_ledger(writer.ledger_id)
            assert [e.data for e in reader.read_entries(0, 19)] == payloads
    assert not any(bookie.alive() for bookie in cluster.bookies)
    assert (tmp_path / "bookie-0" / "stderr-2.log").exists()  # kept for a post-mortem


def test_without_base_dir_the_cluster_lives_in_a_temporary_directory() -> None:
    with local_cluster(1, journal_sync=False) as cluster:
        base_dir = cluster.base_dir
        assert base_dir.is_dir() and len(cluster.addresses) == 1
        with BookKeeper(cluster.metadata_uri) as bk:
            assert sorted(bk.list_bookies()) == sorted(cluster.addresses)
    assert not base_dir.exists()


def test_a_paused_bookie_is_stopped_until_resumed_and_a_paused_one_can_be_killed(
    tmp_path: Path,
) -> None:
    with local_cluster(1, base_dir=tmp_path, journal_sync=False) as cluster:
        pid = cluster.bookies[0].pid
        cluster.pause(0)
        wait_stopped(pid, True)
        cluster.resume(0)
        wait_stopped(pid, False)
        cluster.pause(0)
        cluster.kill(0)  # a paused process dies too
        assert cluster.bookies[0].returncode == -9
