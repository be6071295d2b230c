"""The Spark sink's commit protocol (quorumlog.spark.commit) driven directly, without
Spark, on both metadata drivers: task ledger ids, the one compare-and-set, replays
after a driver died mid-commit, conflicts and clean-up."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager

import pytest

from quorumlog.aio import BookKeeper, LogNamespace
from quorumlog.errors import InvalidArgumentError, MetadataError, NoNodeError
from quorumlog.log import record_format
from quorumlog.log.errors import LogFencedError
from quorumlog.log.metadata import log_path
from quorumlog.meta.store import (
    MetadataStore,
    Op,
    SessionCallback,
    SessionState,
    Versioned,
    Watch,
    WatchCallback,
)
from quorumlog.server.local_cluster import LocalCluster
from quorumlog.spark import commit as commits
from quorumlog.spark.commit import TaskResult

MAX_PARTITIONS = 8


@pytest.fixture(autouse=True)
def _close_the_drivers_clients() -> Iterator[None]:
    """Tests here reach the driver's own clients (``scan.client_for``); closed after
    each, or their ZooKeeper clients outlive the test's server, reconnecting for ever."""
    from quorumlog.spark import scan

    try:
        yield
    finally:
        scan.shutdown()


async def task(
    bk: BookKeeper,
    token: str,
    log: str,
    partition: int,
    rows: int,
    attempt: int = 0,
    password: bytes = b"",
    opens_staging: bool = True,
    stage: str = "stage-1",
) -> TaskResult:
    """What a write task does: its ledger id, the ledger, its rows, close. A streaming
    batch's task opens the staging itself (``opens_staging``); a batch write's driver
    opened it before any task ran."""
    if opens_staging:
        await commits.open_staging(bk, token, log)
    ledger_id = await commits.task_ledger_id(
        bk, token, log, stage, partition, attempt, MAX_PARTITIONS
    )
    handle = await commits.create_task_ledger(
        bk, token, log, partition, ledger_id, 3, 3, 2, password=password
    )
    for i in range(rows):
        await handle.add_entry(record_format.encode(b"p%d-%d" % (partition, i), i))
    await handle.close()
    return TaskResult(partition, ledger_id, rows)


async def log_data(bk: BookKeeper, name: str) -> list[bytes]:
    return [r.data for r in await (await LogNamespace(bk).open_log(name)).read_all()]


async def staging(bk: BookKeeper, token: str) -> list[str]:
    try:
        return await bk.store.children(commits.staging_path(token))
    except NoNodeError:
        return []


class FaultyStore(MetadataStore):
    """A metadata store that fails as ZooKeeper does on a lost connection: the outcome
    of the operation is unknown (a plain MetadataError), whether it was applied or not.

    ``lose_set_reply[path]``: that many set() calls on ``path`` are applied, then raise;
    ``drop_set[path]``: that many are not applied, and raise; ``fail_staging``: every
    children() and delete() under the Spark staging raises, as long as it is set."""

    def __init__(self, inner: MetadataStore) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.lose_set_reply: dict[str, int] = {}
        self.drop_set: dict[str, int] = {}
        self.fail_staging = False
        # defer_set[path]: that many set() calls raise at once and are applied only
        # by apply_deferred() (a request that reaches the server late); reads of that
        # path fail meanwhile while blind_while_deferred is set.
        self.defer_set: dict[str, int] = {}
        self.deferred: list[tuple[str, bytes, int]] = []
        self.blind_while_deferred = False
        # hold[path]: get() of that path waits for the event (a store that hangs);
        # cancelled_holds counts the waits that were cancelled instead.
        self.hold: dict[str, asyncio.Event] = {}
        self.cancelled_holds = 0
        # hold_set[path]: set() of that path is applied, and its reply waits for the
        # event (a reply that comes late).
        self.hold_set: dict[str, asyncio.Event] = {}

    async def apply_deferred(self) -> None:
        for path, data, version in self.deferred:
            await self.inner.set(path, data, version)
        self.deferred.clear()

    def _staging_fails(self, path: str) -> None:
        if self.fail_staging and path.startswith(commits.STAGING_PATH):
            raise MetadataError(f"connection lost during an operation on {path}")

    async def get(self, path: str) -> Versioned:
        gate = self.hold.get(path)
        if gate is not None:
            try:
                await gate.wait()
            except asyncio.CancelledError:
                self.cancelled_holds += 1
                raise
        if self.blind_while_deferred and any(path == p for p, _, _ in self.deferred):
            raise MetadataError(f"connection lost while reading {path}")
        return await self.inner.get(path)

    async def exists(self, path: str) -> int | None:
        return await self.inner.exists(path)

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = True,
    ) -> str:
        return await self.inner.create(
            path, data, ephemeral=ephemeral, sequential=sequential, make_parents=make_parents
        )

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        if self.defer_set.get(path, 0) > 0:
            self.defer_set[path] -= 1
            self.deferred.append((path, data, version))
            raise MetadataError(f"connection lost while setting {path} (on its way)")
        if self.drop_set.get(path, 0) > 0:
            self.drop_set[path] -= 1
            raise MetadataError(f"connection lost while setting {path} (not applied)")
        new_version = await self.inner.set(path, data, version)
        gate = self.hold_set.get(path)
        if gate is not None:
            await gate.wait()
        if self.lose_set_reply.get(path, 0) > 0:
            self.lose_set_reply[path] -= 1
            raise MetadataError(f"connection lost while setting {path} (applied)")
        return new_version

    async def delete(self, path: str, version: int = -1) -> None:
        self._staging_fails(path)
        await self.inner.delete(path, version)

    async def multi(self, ops: Sequence[Op]) -> None:
        for op in ops:
            self._staging_fails(op.path)
        await self.inner.multi(ops)

    async def children(self, path: str) -> list[str]:
        self._staging_fails(path)
        return await self.inner.children(path)

    async def sync(self, path: str = "/") -> None:
        await self.inner.sync(path)

    async def next_id(self, counter: str, count: int = 1) -> int:
        return await self.inner.next_id(counter, count)

    def watch(self, path: str, callback: WatchCallback, *, children: bool = False) -> Watch:
        return self.inner.watch(path, callback, children=children)

    def add_session_listener(self, callback: SessionCallback) -> None:
        self.inner.add_session_listener(callback)

    @property
    def session_state(self) -> SessionState:
        return self.inner.session_state

    async def close(self) -> None:
        await self.inner.close()


async def open_faulty_client(uri: str) -> tuple[BookKeeper, FaultyStore]:
    """A client whose metadata store is a :class:`FaultyStore` over the real one."""
    plain = await BookKeeper.connect(uri)
    plain.pool.close()  # only its store is used, through the wrapper
    store = FaultyStore(plain.store)
    return BookKeeper(store, plain.config), store


@asynccontextmanager
async def faulty_client(uri: str) -> AsyncIterator[tuple[BookKeeper, FaultyStore]]:
    bk, store = await open_faulty_client(uri)
    try:
        yield bk, store
    finally:
        await bk.close()


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


def test_a_task_that_starts_after_the_abort_creates_no_ledger_and_no_staging(
    cluster3: LocalCluster,
) -> None:
    """Spark runs the driver's abort while a task of the failed job is still running
    (killing it takes time), so the straggler asks for its ledger id after the clean-up.
    It fails, naming the write, and leaves no ledger and no staging behind."""

    async def main() -> None:
        async with await BookKeeper.connect(cluster3.metadata_uri) as bk:
            await commits.prepare_log(bk, "straggler")
            token = commits.new_write_token()
            await commits.open_staging(bk, token, "straggler")  # the driver, before tasks
            done = await task(bk, token, "straggler", 0, 3, opens_staging=False)
            before = set(await bk.list_ledgers())
            assert await commits.abort(bk, "straggler", token) == (done.ledger_id,)
            with pytest.raises(commits.WriteEndedError, match=f"write {token}"):
                await task(bk, token, "straggler", 2, 3, opens_staging=False)
            assert set(await bk.list_ledgers()) == before - {done.ledger_id}
            assert token not in await bk.store.children(commits.STAGING_PATH)

    asyncio.run(main())


def test_a_task_that_creates_its_ledger_after_the_abort_deletes_it_again(
    cluster3: LocalCluster,
) -> None:
    """The straggler registered its ledger id before the abort, which found no ledger
    to delete; the ledger created after it is deleted by the task itself, which fails."""

    async def main() -> None:
        async with await BookKeeper.connect(cluster3.metadata_uri) as bk:
            await commits.prepare_log(bk, "late-ledger")
            token = commits.new_write_token()
            await commits.open_staging(bk, token, "late-ledger")
            ledger_id = await commits.task_ledger_id(
                bk, token, "late-ledger", "stage-1", 1, 0, MAX_PARTITIONS
            )
            assert await commits.abort(bk, "late-ledger", token) == ()
            with pytest.raises(commits.WriteEndedError, match=f"ledger {ledger_id}"):
                await commits.create_task_ledger(bk, token, "late-ledger", 1, ledger_id, 3, 3, 2)
            assert not await bk.ledger_exists(ledger_id)
            assert token not in await bk.store.children(commits.STAGING_PATH)

    asyncio.run(main())


def test_r10_a_write_with_a_password_deletes_the_ledgers_it_does_not_keep(
    cluster3: LocalCluster,
) -> None:
    """Bookies purge a ledger only for its master key (R10): the clean-ups of a write
    whose ledgers have a password delete them with it."""

    async def main() -> None:
        async with await BookKeeper.connect(cluster3.metadata_uri) as bk:
            await commits.prepare_log(bk, "secret")
            token = commits.new_write_token()
            failed = await task(bk, token, "secret", 0, 2, password=b"pw")
            kept = await task(bk, token, "secret", 0, 2, attempt=1, password=b"pw")
            outcome = await commits.commit(bk, "secret", token, [kept], password=b"pw")
            assert outcome.deleted == (failed.ledger_id,)
            assert not await bk.ledger_exists(failed.ledger_id)
            assert await staging(bk, token) == []
            aborted = commits.new_write_token()
            staged = await task(bk, aborted, "secret", 0, 2, password=b"pw")
            assert await commits.abort(bk, "secret", aborted, password=b"pw") == (staged.ledger_id,)
            assert await staging(bk, aborted) == []

    asyncio.run(main())


def test_a_replayed_batch_keeps_what_the_first_run_committed(cluster3: LocalCluster) -> None:
    """The driver died after the compare-and-set but before the clean-up: the first
    run's registrations are still there when Spark runs the batch again."""

    async def main() -> None:
        async with await BookKeeper.connect(cluster3.metadata_uri) as bk:
            await commits.prepare_log(bk, "replayed")
            token = commits.stream_token("query-1", 7)
            sink = commits.SinkBatch("q1", "query-1", 7)
            first = [await task(bk, token, "replayed", p, 4) for p in range(2)]
            await commits.commit(bk, "replayed", token, first, sink=sink)
            for result in first:  # as if the clean-up never ran
                await bk.store.create(f"{commits.staging_path(token)}/l{result.ledger_id}", b"0")
            again = [await task(bk, token, "replayed", p, 4, attempt=1) for p in range(2)]
            outcome = await commits.commit(bk, "replayed", token, again, sink=sink)
            assert outcome.replayed and outcome.appended == ()
            assert set(outcome.deleted) == {r.ledger_id for r in again}
            assert all([await bk.ledger_exists(r.ledger_id) for r in first])
            assert await log_data(bk, "replayed") == [
                b"p%d-%d" % (p, i) for p in range(2) for i in range(4)
            ]
            with pytest.raises(InvalidArgumentError, match="new query"):
                await commits.commit(
                    bk, "replayed", token, [], sink=commits.SinkBatch("q1", "query-1", 3)
                )
            metadata, _ = await (await LogNamespace(bk).open_log("replayed")).metadata()
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
            writer = await (
                await LogNamespace(bk).open_log("contended")
            ).open_writer()  # a later ledger
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
            keep = (await (await LogNamespace(bk).open_log("swept")).metadata())[0].ledgers
            assert await commits.sweep_stale(bk, "swept", keep) == ()  # too young
            assert await commits.sweep_stale(bk, "swept", keep, older_than_ms=0) == (
                orphan.ledger_id,
            )
            assert not await bk.ledger_exists(orphan.ledger_id)
            assert await staging(bk, dead) == []

    asyncio.run(main())


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not-applied"])
@pytest.mark.parametrize("streaming", [False, True], ids=["batch", "stream"])
def test_l3_r13_a_commit_whose_compare_and_set_outcome_is_unknown_appends_once_and_succeeds(
    cluster3: LocalCluster, applied: bool, streaming: bool
) -> None:
    """The log's compare-and-set raises an outcome-unknown error, once: applied but its
    reply lost, or not applied. The commit re-reads the log to learn which (R13), and
    either way reports success with the rows in the log exactly once."""

    async def main() -> None:
        async with faulty_client(cluster3.metadata_uri) as (bk, store):
            await commits.prepare_log(bk, "unknown")
            token = commits.new_write_token()
            results = [await task(bk, token, "unknown", p, 3) for p in range(2)]
            faults = store.lose_set_reply if applied else store.drop_set
            faults[log_path("unknown")] = 1
            sink = commits.SinkBatch("q", "query-1", 0) if streaming else None
            outcome = await commits.commit(bk, "unknown", token, results, sink=sink)
            assert faults[log_path("unknown")] == 0  # the fault did happen
            assert outcome.appended == tuple(r.ledger_id for r in results)
            assert outcome.rows == 6 and not outcome.replayed
            assert await log_data(bk, "unknown") == [
                b"p%d-%d" % (p, i) for p in range(2) for i in range(3)
            ]
            if streaming:
                assert (await (await LogNamespace(bk).open_log("unknown")).metadata())[
                    0
                ].sink_batches == {"q": 0}
            assert all([await bk.ledger_exists(r.ledger_id) for r in results])
            assert await staging(bk, token) == []

    asyncio.run(main())


def test_l3_a_clean_up_that_fails_after_the_commit_does_not_fail_the_write(
    cluster3: LocalCluster,
) -> None:
    """Once the compare-and-set appended the rows, the write has succeeded: a clean-up
    that then fails (the store drops the connection) is left for a later one, and the
    commit reports success, so the user does not write the rows again."""

    async def main() -> None:
        async with faulty_client(cluster3.metadata_uri) as (bk, store):
            await commits.prepare_log(bk, "messy")
            token = commits.new_write_token()
            failed = await task(bk, token, "messy", 0, 2)  # a failed attempt to clean up
            results = [await task(bk, token, "messy", 0, 3, attempt=1)]
            store.fail_staging = True
            outcome = await commits.commit(bk, "messy", token, results)
            assert outcome.appended == (results[0].ledger_id,) and outcome.deleted == ()
            assert await log_data(bk, "messy") == [b"p0-%d" % i for i in range(3)]
            store.fail_staging = False
            # Left for later: the next clean-up of that write (here the day-old sweep's).
            keep = (await (await LogNamespace(bk).open_log("messy")).metadata())[0].ledgers
            assert await commits.sweep_stale(bk, "messy", keep, older_than_ms=0) == (
                failed.ledger_id,
            )
            assert await staging(bk, token) == []
            assert await log_data(bk, "messy") == [b"p0-%d" % i for i in range(3)]

    asyncio.run(main())


def test_l3_r13_abort_deletes_nothing_while_the_commits_outcome_is_unknown(
    cluster3: LocalCluster,
) -> None:
    """The compare-and-set has no answer and the log cannot be read to tell: the commit
    says the outcome is unknown, and the abort Spark then calls deletes nothing, since
    the compare-and-set can still land (here it does, late): the log lists the ledgers,
    and they are all there."""

    async def main() -> None:
        async with faulty_client(cluster3.metadata_uri) as (bk, store):
            await commits.prepare_log(bk, "late")
            token = commits.new_write_token()
            results = [await task(bk, token, "late", p, 2) for p in range(2)]
            store.defer_set[log_path("late")] = 1
            store.blind_while_deferred = True
            with pytest.raises(MetadataError) as raised:
                await commits.commit(bk, "late", token, results, timeout_s=0.5)
            store.blind_while_deferred = False
            assert await commits.abort(bk, "late", token) == ()
            await store.apply_deferred()  # the compare-and-set lands after all
            assert await log_data(bk, "late") == [
                b"p%d-%d" % (p, i) for p in range(2) for i in range(2)
            ]
            assert "may be in the log" in str(raised.value)
            keep = (await (await LogNamespace(bk).open_log("late")).metadata())[0].ledgers
            assert await commits.sweep_stale(bk, "late", keep, older_than_ms=0) == ()
            assert await staging(bk, token) == []

    asyncio.run(main())


@pytest.mark.parametrize("damage", ["deleted", "open", "short", "foreign"])
def test_l2_the_commit_refuses_a_ledger_that_is_not_closed_with_the_rows_reported(
    cluster3: LocalCluster, damage: str
) -> None:
    """Before the compare-and-set, every ledger to append must be closed, hold the rows
    its task reported, and carry this write's tag: a ledger deleted meanwhile (another
    write's clean-up), still open, or short fails the commit, and the log is unchanged."""

    async def main() -> None:
        async with await BookKeeper.connect(cluster3.metadata_uri) as bk:
            name = f"checked-{damage}"
            await commits.prepare_log(bk, name)
            token = commits.new_write_token()
            results = [await task(bk, token, name, p, 3) for p in range(2)]
            victim = results[1]
            if damage == "deleted":
                await bk.delete_ledger(victim.ledger_id)
            elif damage == "short":
                results[1] = TaskResult(victim.partition, victim.ledger_id, victim.rows + 1)
            elif damage == "foreign":  # another write's ledger, closed with as many rows
                results[1] = await task(bk, commits.new_write_token(), name, 1, 3)
            else:
                ledger_id = await commits.task_ledger_id(
                    bk, token, name, "stage-1", 2, 0, MAX_PARTITIONS
                )
                handle = await bk.create_ledger(3, 3, 2, ledger_id=ledger_id)
                await handle.add_entry(b"not closed")
                results.append(TaskResult(2, ledger_id, 1))
            culprit = results[-1].ledger_id
            with pytest.raises(commits.StagedLedgerError, match=f"ledger {culprit} of partition"):
                await commits.commit(bk, name, token, results)
            assert await log_data(bk, name) == []
            assert list((await (await LogNamespace(bk).open_log(name)).metadata())[0].ledgers) == []

    asyncio.run(main())


def test_l2_two_queries_with_one_sink_id_never_lose_rows(cluster3: LocalCluster) -> None:
    """Two streaming queries write one log with the same (default) sinkId. The second
    one's first batch must neither pass for a replay of the first query's batch nor
    touch the first query's staged ledgers: its commit fails, naming the sinkId, and
    every row the first query committed is in the log."""

    async def main() -> None:
        async with await BookKeeper.connect(cluster3.metadata_uri) as bk:
            await commits.prepare_log(bk, "shared")

            async def batch(query: str, batch_id: int) -> tuple[str, list[TaskResult]]:
                token = commits.stream_token(query, batch_id)
                return token, [await task(bk, token, "shared", p, 2) for p in range(2)]

            token, batch0 = await batch("query-1", 0)
            await commits.commit(
                bk, "shared", token, batch0, sink=commits.SinkBatch("spark", "query-1", 0)
            )
            # Query 1 stages its batch 1 while query 2 commits its batch 0.
            token1, batch1 = await batch("query-1", 1)
            token2, other = await batch("query-2", 0)
            with pytest.raises(InvalidArgumentError, match="sinkId 'spark' belongs to another"):
                await commits.commit(
                    bk, "shared", token2, other, sink=commits.SinkBatch("spark", "query-2", 0)
                )
            assert await commits.abort(bk, "shared", token2) == tuple(
                sorted(r.ledger_id for r in other)
            )
            await commits.commit(
                bk, "shared", token1, batch1, sink=commits.SinkBatch("spark", "query-1", 1)
            )
            rows = [b"p%d-%d" % (p, i) for p in range(2) for i in range(2)]
            assert await log_data(bk, "shared") == rows + rows

    asyncio.run(main())


def test_l2_a_commit_the_driver_gave_up_on_is_cancelled_and_appends_nothing(
    cluster3: LocalCluster,
) -> None:
    """The driver runs the commit with a time limit (scan.run). When the limit passes,
    the commit is cancelled rather than left running: otherwise it could go on to append
    ledgers that the abort Spark calls next is deleting."""
    from quorumlog.spark import scan

    bk, store = scan.run(open_faulty_client(cluster3.metadata_uri))
    try:

        async def stage() -> tuple[str, list[TaskResult]]:
            await commits.prepare_log(bk, "hung")
            token = commits.new_write_token()
            results = [await task(bk, token, "hung", p, 2) for p in range(2)]
            store.hold[log_path("hung")] = asyncio.Event()  # the store stops answering
            return token, results

        token, results = scan.run(stage())
        with pytest.raises(TimeoutError):
            scan.run(commits.commit(bk, "hung", token, results), timeout_s=0.5)
        assert store.cancelled_holds == 1  # cancelled, not carrying on behind the caller

        async def store_answers_again() -> None:
            store.hold.pop(log_path("hung")).set()

        scan.run(store_answers_again())
        deleted = scan.run(commits.abort(bk, "hung", token))
        assert deleted == tuple(sorted(r.ledger_id for r in results))
        assert scan.run(log_data(bk, "hung")) == []
    finally:
        scan.run(bk.close())


def test_k1_a_clean_up_past_the_drivers_time_limit_does_not_fail_the_committed_write(
    cluster3: LocalCluster,
) -> None:
    """The compare-and-set appended the rows, then deleting the discarded ledgers is
    slow (a hung bookie makes each delete wait): the driver's time limit passes during
    the clean-up. The write has succeeded, and the commit says so (a failure would make
    the user write the rows again); the clean-up finishes by itself."""
    from quorumlog.spark import scan

    bk = scan.run(BookKeeper.connect(cluster3.metadata_uri))
    try:

        async def stage() -> tuple[str, list[TaskResult], list[TaskResult]]:
            await commits.prepare_log(bk, "slowclean")
            token = commits.new_write_token()
            failed = [await task(bk, token, "slowclean", 0, 1, attempt=a) for a in range(4)]
            return token, failed, [await task(bk, token, "slowclean", 0, 3, attempt=4)]

        token, failed, results = scan.run(stage())
        delete = bk.delete_ledger

        async def slow_delete(ledger_id: int, password: bytes = b"") -> None:
            await asyncio.sleep(0.3)
            await delete(ledger_id, password)

        bk.delete_ledger = slow_delete  # type: ignore[method-assign]
        outcome = scan.run(commits.commit(bk, "slowclean", token, results), timeout_s=0.5)
        assert outcome.appended == (results[0].ledger_id,) and outcome.rows == 3
        assert scan.run(log_data(bk, "slowclean")) == [b"p0-%d" % i for i in range(3)]

        async def cleaned() -> bool:
            gone = [not await bk.ledger_exists(r.ledger_id) for r in failed]
            return all(gone) and await staging(bk, token) == []

        for _ in range(100):
            if scan.run(cleaned()):
                break
            time.sleep(0.05)
        assert scan.run(cleaned())  # the clean-up went on by itself after the commit
        assert scan.run(bk.ledger_exists(results[0].ledger_id))
    finally:
        scan.run(bk.close())


def test_k1_a_clean_up_is_bounded_and_leaves_the_rest_for_a_later_one(
    cluster3: LocalCluster,
) -> None:
    """The commit's own bound on its clean-up: past it, the commit returns (success)
    and the ledgers not deleted yet stay registered, for a later clean-up."""

    async def main() -> None:
        async with await BookKeeper.connect(cluster3.metadata_uri) as bk:
            await commits.prepare_log(bk, "bounded")
            token = commits.new_write_token()
            failed = [await task(bk, token, "bounded", 0, 1, attempt=a) for a in range(4)]
            results = [await task(bk, token, "bounded", 0, 2, attempt=4)]
            delete = bk.delete_ledger

            async def slow_delete(ledger_id: int, password: bytes = b"") -> None:
                await asyncio.sleep(0.3)
                await delete(ledger_id, password)

            bk.delete_ledger = slow_delete  # type: ignore[method-assign]
            loop = asyncio.get_running_loop()
            started = loop.time()
            outcome = await commits.commit(bk, "bounded", token, results, clean_up_timeout_s=0.4)
            assert loop.time() - started < 1.2
            assert outcome.appended == (results[0].ledger_id,)
            assert 0 < len(outcome.deleted) < len(failed)
            bk.delete_ledger = delete  # type: ignore[method-assign]
            keep = (await (await LogNamespace(bk).open_log("bounded")).metadata())[0].ledgers
            later = await commits.clean_up(bk, "bounded", token, keep)
            assert sorted(outcome.deleted + later) == sorted(r.ledger_id for r in failed)
            assert await log_data(bk, "bounded") == [b"p0-0", b"p0-1"]

    asyncio.run(main())


def test_k1_r13_a_compare_and_set_in_flight_at_the_drivers_limit_is_outcome_unknown(
    cluster3: LocalCluster,
) -> None:
    """The compare-and-set is applied, its reply late: when the driver's time limit
    passes, the commit fails with CommitOutcomeUnknownError (not a bare timeout), and
    the abort Spark calls next deletes nothing: the rows are in the log."""
    from quorumlog.spark import scan

    bk, store = scan.run(open_faulty_client(cluster3.metadata_uri))
    try:

        async def stage() -> tuple[str, list[TaskResult]]:
            await commits.prepare_log(bk, "latereply")
            token = commits.new_write_token()
            results = [await task(bk, token, "latereply", p, 2) for p in range(2)]
            store.hold_set[log_path("latereply")] = asyncio.Event()
            return token, results

        token, results = scan.run(stage())
        with pytest.raises(commits.CommitOutcomeUnknownError, match="may be in the log"):
            scan.run(commits.commit(bk, "latereply", token, results), timeout_s=0.5)
        assert scan.run(commits.abort(bk, "latereply", token)) == ()

        async def reply_comes() -> None:
            store.hold_set.pop(log_path("latereply")).set()

        scan.run(reply_comes())
        assert scan.run(log_data(bk, "latereply")) == [
            b"p%d-%d" % (p, i) for p in range(2) for i in range(2)
        ]
        assert all(scan.run(bk.ledger_exists(r.ledger_id)) for r in results)
    finally:
        scan.run(bk.close())


DAY_MS = 24 * 3600 * 1000


async def make_silent(bk: BookKeeper, token: str, for_ms: int) -> None:
    """Make a staging and its registrations look as if their writers last showed life
    ``for_ms`` ago (a driver or tasks that died then)."""
    root = commits.staging_path(token)
    then = int(time.time() * 1000) - for_ms
    header = json.loads((await bk.store.get(root)).data)
    header.update(created_ms=then, alive_ms=then)
    await bk.store.set(root, json.dumps(header).encode())
    for name in await bk.store.children(root):
        if name.startswith("l"):
            record = json.loads((await bk.store.get(f"{root}/{name}")).data)
            record = record if isinstance(record, dict) else {"partition": record}
            record["alive_ms"] = then
            await bk.store.set(f"{root}/{name}", json.dumps(record).encode())


@pytest.mark.parametrize("streaming", [False, True], ids=["long-batch", "replay"])
def test_k4_the_sweep_judges_a_staging_by_its_last_sign_of_life_not_its_age(
    cluster3: LocalCluster, streaming: bool
) -> None:
    """A write whose staging is two days old but whose task writes now (a batch job
    running for days; a streaming batch run again two days after its driver died) is
    alive: another write's commit must not sweep it, and it commits. A write silent
    for two days is swept."""

    async def main() -> None:
        async with await BookKeeper.connect(cluster3.metadata_uri) as bk:
            name = "alive-stream" if streaming else "alive-batch"
            await commits.prepare_log(bk, name)
            dead_token = commits.new_write_token()
            dead = await task(bk, dead_token, name, 0, 2)
            await make_silent(bk, dead_token, 2 * DAY_MS)
            if streaming:
                token = commits.stream_token("query-1", 0)
                first_run = await task(bk, token, name, 0, 2)  # then its driver died
            else:
                token = commits.new_write_token()
                await commits.open_staging(bk, token, name)  # the job was planned
            await make_silent(bk, token, 2 * DAY_MS)
            # Another write to the log, committed while the first one's task writes.
            other = commits.new_write_token()
            others = [await task(bk, other, name, 0, 1)]
            if streaming:  # the batch run again by the restarted query (a new stage)
                live = await task(bk, token, name, 0, 2, stage="stage-2")
            else:  # the job's write stage, two days after it was planned
                live = await task(bk, token, name, 0, 2, opens_staging=False)
            swept = await commits.commit(bk, name, other, others)
            assert dead.ledger_id in swept.deleted and live.ledger_id not in swept.deleted
            assert not await bk.ledger_exists(dead.ledger_id)
            assert await staging(bk, dead_token) == []
            sink = commits.SinkBatch("spark", "query-1", 0) if streaming else None
            outcome = await commits.commit(bk, name, token, [live], sink=sink)
            assert outcome.appended == (live.ledger_id,)
            assert await log_data(bk, name) == [b"p0-0", b"p0-0", b"p0-1"]
            if streaming:
                assert not await bk.ledger_exists(first_run.ledger_id)

    asyncio.run(main())


def test_k4_a_write_task_shows_life_while_it_writes(
    cluster3: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write task refreshes its registration while it writes, however long it takes
    (here a heartbeat every 0.1 s over a slow input), so the sweep sees it alive."""
    import pyarrow as pa  # type: ignore[import-untyped]

    from quorumlog.spark import scan, writing
    from quorumlog.spark.options import WriteOptions

    monkeypatch.setattr(commits, "STAGING_HEARTBEAT_S", 0.1)
    opts = WriteOptions.parse({"log": "heartbeat", "metadata": cluster3.metadata_uri})
    token = commits.new_write_token()

    async def prepare() -> BookKeeper:
        bk = await scan.client_for(cluster3.metadata_uri)
        await commits.prepare_log(bk, "heartbeat")
        await commits.open_staging(bk, token, "heartbeat")
        return bk

    bk = scan.run(prepare())
    seen: list[int] = []

    async def alive_ms() -> int:
        root = commits.staging_path(token)
        names = [n for n in await bk.store.children(root) if n.startswith("l")]
        return int(json.loads((await bk.store.get(f"{root}/{names[0]}")).data)["alive_ms"])

    def batches() -> Iterator[pa.RecordBatch]:
        for i in range(4):
            yield pa.RecordBatch.from_pydict({"data": [b"r%d" % i]})
            time.sleep(0.3)
            seen.append(scan.run(alive_ms()))

    who = writing.TaskIdentity(stage_id=1, partition=0, task_attempt=0)
    result = writing.write_task(opts, token, who, batches())
    assert result.rows == 4
    assert seen == sorted(seen) and seen[-1] > seen[0]  # refreshed while the task ran
