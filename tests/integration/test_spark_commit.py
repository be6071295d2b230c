"""The Spark sink's commit protocol (quorumlog.spark.commit) driven directly, without
Spark, on both metadata drivers: task ledger ids, the one compare-and-set, replays
after a driver died mid-commit, conflicts and clean-up."""

from __future__ import annotations

import asyncio

import pytest

from quorumlog.aio import BookKeeper
from quorumlog.errors import InvalidArgumentError, NoNodeError
from quorumlog.log.errors import LogFencedError
from quorumlog.server.local_cluster import LocalCluster
from quorumlog.spark import commit as commits
from quorumlog.spark.commit import TaskResult

MAX_PARTITIONS = 8


async def task(
    bk: BookKeeper, token: str, log: str, partition: int, rows: int, attempt: int = 0
) -> TaskResult:
    """What a write task does: its ledger id, the ledger, its rows, close."""
    ledger_id = await commits.task_ledger_id(
        bk, token, log, "stage-1", partition, attempt, MAX_PARTITIONS
    )
    handle = await bk.create_ledger(3, 3, 2, ledger_id=ledger_id)
    for i in range(rows):
        await handle.add_entry(b"p%d-%d" % (partition, i))
    await handle.close()
    return TaskResult(partition, ledger_id, rows)


async def log_data(bk: BookKeeper, name: str) -> list[bytes]:
    return [r.data for r in await (await bk.open_log(name)).read_all()]


async def staging(bk: BookKeeper, token: str) -> list[str]:
    try:
        return await bk.store.children(commits.staging_path(token))
    except NoNodeError:
        return []


def test_task_ledgers_sort_by_partition_whatever_order_tasks_run(cluster3: LocalCluster) -> None:
    async def main() -> None:
        async with await BookKeeper.connect(cluster3.metadata_uri) as bk:
            await commits.prepare_log(bk, "ordered")
            token = commits.new_write_token()
            # Partitions run in reverse order; partition 1 fails once after 3 rows.
            results = [await task(bk, token, "ordered", p, 5) for p in (3, 2)]
            failed = await task(bk, token, "ordered", 1, 3)
            results += [await task(bk, token, "ordered", 1, 5, attempt=1)]
            results += [await task(bk, token, "ordered", 0, 5)]
            ids = {r.partition: r.ledger_id for r in results}
            assert ids[0] < ids[1] < ids[2] < ids[3]
            assert failed.ledger_id != ids[1]
            outcome = await commits.commit(bk, "ordered", token, [*results, None])
            assert outcome.appended == tuple(ids[p] for p in range(4)) and outcome.rows == 20
            assert outcome.deleted == (failed.ledger_id,)
            expected = [b"p%d-%d" % (p, i) for p in range(4) for i in range(5)]
            assert await log_data(bk, "ordered") == expected
            assert not await bk.ledger_exists(failed.ledger_id)
            assert await staging(bk, token) == []
            with pytest.raises(InvalidArgumentError, match="maxWritePartitions=8"):
                await commits.task_ledger_id(bk, token, "ordered", "s", 8, 0, MAX_PARTITIONS)

    asyncio.run(main())


def test_a_replayed_batch_keeps_what_the_first_run_committed(cluster3: LocalCluster) -> None:
    """The driver died after the compare-and-set but before the clean-up: the first
    run's registrations are still there when Spark runs the batch again."""

    async def main() -> None:
        async with await BookKeeper.connect(cluster3.metadata_uri) as bk:
            await commits.prepare_log(bk, "replayed")
            token = commits.stream_token("replayed", "q1")
            first = [await task(bk, token, "replayed", p, 4) for p in range(2)]
            await commits.commit(bk, "replayed", token, first, sink=("q1", 7))
            for result in first:  # as if the clean-up never ran
                await bk.store.create(f"{commits.staging_path(token)}/l{result.ledger_id}", b"0")
            again = [await task(bk, token, "replayed", p, 4, attempt=1) for p in range(2)]
            outcome = await commits.commit(bk, "replayed", token, again, sink=("q1", 7))
            assert outcome.replayed and outcome.appended == ()
            assert set(outcome.deleted) == {r.ledger_id for r in again}
            assert all([await bk.ledger_exists(r.ledger_id) for r in first])
            assert await log_data(bk, "replayed") == [
                b"p%d-%d" % (p, i) for p in range(2) for i in range(4)
            ]
            with pytest.raises(InvalidArgumentError, match="new query"):
                await commits.commit(bk, "replayed", token, [], sink=("q1", 3))
            metadata, _ = await (await bk.open_log("replayed")).metadata()
            assert metadata.sink_batches == {"q1": 7}

    asyncio.run(main())


def test_a_writer_appending_during_the_job_makes_the_commit_fail_cleanly(
    cluster3: LocalCluster,
) -> None:
    async def main() -> None:
        async with await BookKeeper.connect(cluster3.metadata_uri) as bk:
            await commits.prepare_log(bk, "contended")
            token = commits.new_write_token()
            results = [await task(bk, token, "contended", 0, 3)]
            writer = await (await bk.open_log("contended")).open_writer()  # a later ledger
            await writer.append(b"w")
            with pytest.raises(LogFencedError, match="added by another writer"):
                await commits.commit(bk, "contended", token, results)
            deleted = await commits.abort(bk, "contended", token)
            assert deleted == (results[0].ledger_id,)
            assert await log_data(bk, "contended") == [b"w"]
            await writer.append(b"still the writer")
            await writer.close()

    asyncio.run(main())


def test_staging_left_by_a_dead_driver_is_swept_by_a_later_commit(cluster3: LocalCluster) -> None:
    async def main() -> None:
        async with await BookKeeper.connect(cluster3.metadata_uri) as bk:
            await commits.prepare_log(bk, "swept")
            dead = commits.new_write_token()
            orphan = await task(bk, dead, "swept", 0, 2)  # its driver never commits
            keep = (await (await bk.open_log("swept")).metadata())[0].ledgers
            assert await commits.sweep_stale(bk, "swept", keep) == ()  # too young
            assert await commits.sweep_stale(bk, "swept", keep, older_than_ms=0) == (
                orphan.ledger_id,
            )
            assert not await bk.ledger_exists(orphan.ledger_id)
            assert await staging(bk, dead) == []

    asyncio.run(main())
