"""quorumlog db snapshots: the leader snapshots its file into a ledger every N records
and truncates the log behind the snapshots it keeps; a wiped replica rebuilds from the
newest snapshot plus the log. Both metadata drivers."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

from support import holds_for, poll_until

from quorumlog.aio import BookKeeper, LogNamespace
from quorumlog.db.replica import log_name_of
from quorumlog.db.snapshot import Snapshot, list_snapshots
from quorumlog.log.position import Position
from quorumlog.server.local_cluster import LocalCluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from test_db import DB, DbProcess, dump, http, wait_ready

SNAPSHOT_EVERY = 40


def _answers(replica: DbProcess) -> bool:
    try:
        return http(replica.addr, "/status", timeout_s=2)[0] == 200
    except OSError:
        return False


async def _log_state(uri: str) -> tuple[int, object, int]:
    bk = await BookKeeper.connect(uri)
    try:
        the_log = await LogNamespace(bk).open_log(log_name_of(DB))
        metadata, _ = await the_log.metadata()
        snapshots = await list_snapshots(the_log)
        return len(metadata.ledgers), metadata.truncated_before, len(snapshots)
    finally:
        await bk.close()


async def _snapshots(uri: str) -> list[Snapshot]:
    bk = await BookKeeper.connect(uri)
    try:
        return await list_snapshots(await LogNamespace(bk).open_log(log_name_of(DB)))
    finally:
        await bk.close()


def test_db_snapshot_on_the_time_trigger_only_after_writes(
    cluster3: LocalCluster, tmp_path: Path
) -> None:
    """With the record and size triggers off, the leader snapshots a second after its
    last snapshot (or after taking the lead) when something was written, and not when
    nothing was."""
    args = ("--snapshot-every", "0", "--snapshot-every-bytes", "0", "--snapshot-every-s", "1")
    replica = DbProcess(cluster3.metadata_uri, "t0", tmp_path / "db", extra_args=args)
    try:
        wait_ready([replica])
        last = ""
        for sql in ("CREATE TABLE t (n INTEGER)", "INSERT INTO t VALUES (1)"):
            status, answer = http(replica.addr, "/db/execute", [sql])
            assert status == 200, answer
            last = answer["position"]
        taken: list[Snapshot] = []

        def snapshot_of_last_write() -> bool:
            taken[:] = asyncio.run(_snapshots(cluster3.metadata_uri))
            # At the last write, or at the VERIFY record that follows it (docs/DB.md).
            return bool(taken) and taken[-1].position >= Position.parse(last)

        poll_until(snapshot_of_last_write, timeout_s=30, what="a snapshot at the last write")
        count = len(taken)
        holds_for(
            lambda: len(asyncio.run(_snapshots(cluster3.metadata_uri))) == count,
            duration_s=2.5,
            what="no snapshot without writes",
            interval_s=0.25,
        )
    finally:
        replica.stop()


def test_db_wiped_replica_rebuilds_from_snapshot_and_log_stays_truncated(
    cluster3: LocalCluster, tmp_path: Path
) -> None:
    base = tmp_path / "db"
    # Small ledgers, so that truncation behind the snapshots drops whole ledgers.
    args = ("--snapshot-every", str(SNAPSHOT_EVERY), "--rollover-bytes", "8192")
    replicas = [DbProcess(cluster3.metadata_uri, f"s{i}", base, extra_args=args) for i in range(2)]
    try:
        leader = wait_ready(replicas)
        follower = next(r for r in replicas if r is not leader)
        assert http(leader.addr, "/db/execute", ["CREATE TABLE t (n INTEGER)"])[0] == 200
        follower.stop()
        last = ""
        for n in range(300):
            status, answer = http(leader.addr, "/db/execute", [["INSERT INTO t VALUES (?)", n]])
            assert status == 200, answer
            last = answer["position"]
        # about 300 records of ~130 bytes filled several 8 KiB ledgers; the log keeps only
        # those after the oldest snapshot kept (2 snapshots, 40 records apart). Snapshots
        # and the truncation behind them run beside the writes, so the last one may still
        # be under way when the last write is answered: a bound, not an instant.
        state: list[tuple[int, object, int]] = []

        def log_bounded() -> bool:
            state[:] = [asyncio.run(_log_state(cluster3.metadata_uri))]
            ledgers, truncated_before, snapshots = state[0]
            # 300 writes fill 5-6 ledgers; a loaded machine's writes are slower, so more
            # VERIFY records (one a second) sit between them and the kept span may reach
            # one ledger more: at most 4 left still shows whole ledgers dropped.
            return snapshots >= 1 and truncated_before is not None and ledgers <= 4

        try:
            poll_until(log_bounded, timeout_s=30, what="the log truncated", interval_s=0.25)
        except AssertionError as exc:
            raise AssertionError(f"{exc} (ledgers, truncated before, snapshots: {state})") from None
        ledgers, truncated_before, _ = state[0]
        print(f"\nlog after 300 writes: {ledgers} ledgers, truncated before {truncated_before}")
        # the follower was stopped before the truncation point: its file is behind it;
        # wipe it anyway, as a new machine would come
        shutil.rmtree(follower.data_dir)
        replicas[replicas.index(follower)] = follower = DbProcess(
            cluster3.metadata_uri, follower.node_id, base, port=follower.port, extra_args=args
        )
        restarted = follower

        def listens() -> bool:
            # A restarted process that died says why, instead of a bare timeout.
            assert restarted.process.poll() is None, restarted.err_path.read_text()[-3000:]
            return _answers(restarted)

        # A bound for starting at all (a loaded machine starts Python slowly), no target.
        poll_until(listens, timeout_s=60, what="restarted replica listens")
        status, answer = http(
            follower.addr,
            f"/db/query?min_position={last}&q=SELECT+count(*),sum(n)+FROM+t",
            timeout_s=60,
        )
        assert status == 200, answer
        assert answer["results"][0]["values"] == [[300, sum(range(300))]]
        status, info = http(follower.addr, "/status")
        assert info["store"]["restores"] >= 1, info
    finally:
        for replica in replicas:
            replica.stop()
    assert dump(replicas[0].sqlite_path) == dump(replicas[1].sqlite_path)


def test_db_a_deposed_leaders_late_snapshot_never_drops_newer_ones(
    cluster3: LocalCluster, tmp_path: Path
) -> None:
    """The new leader recorded snapshots at positions 1:20 and 1:30; the deposed one,
    whose copy stopped at 1:10, finishes its own snapshot only now. Its snapshot is the
    oldest: it must not push the newer ones out of the list (their ledgers deleted, and
    a replica left to restore from a snapshot the truncated log no longer continues)."""
    from quorumlog.db.machine import EXECUTE, DbRecord, StateMachine
    from quorumlog.db.snapshot import take_snapshot
    from quorumlog.db.sql import Statement
    from quorumlog.log.log import open_log

    def file_at(name: str, entry_id: int) -> Path:
        machine = StateMachine(tmp_path / f"{name}.sqlite")
        create = DbRecord(EXECUTE, (Statement(f"CREATE TABLE t{entry_id} (x)"),))
        machine.apply(Position(1, entry_id), create)
        machine.close()
        return tmp_path / f"{name}.sqlite"

    async def scenario() -> tuple[list[Snapshot], list[Snapshot], list[int]]:
        bk = await BookKeeper.connect(cluster3.metadata_uri)
        try:
            the_log = await open_log(bk, "db/race")
            newer = [await take_snapshot(the_log, file_at(f"n{e}", e)) for e in (20, 30)]
            assert all(s is not None for s in newer)
            before = await list_snapshots(the_log)
            late = await take_snapshot(the_log, file_at("late", 10))
            assert late is not None
            after = await list_snapshots(the_log)
            ledgers = await bk.list_ledgers()
            return before, after, [late.ledger_id, *ledgers]
        finally:
            await bk.close()

    before, after, (late_ledger, *ledgers) = asyncio.run(scenario())
    assert [str(s.position) for s in before] == ["1:20", "1:30"]
    assert after == before  # the late, older snapshot is the one that goes
    assert all(s.ledger_id in ledgers for s in after)
    assert late_ledger not in ledgers
