"""Every change of a log's node whose compare-and-set is applied but whose reply is lost.

The four changes of the ledger list (a writer appending its ledger, ``Log.fence``
sealing the list, ``Log.truncate``, a Spark sink's commit) go through one update path
(quorumlog/log/metadata_updates.py): on an unknown outcome it reads the list again and
runs the same decision on it (R13). Each test here loses the reply of one such
compare-and-set, sometimes with another client's change landing before the re-read,
and checks that the change is in the log exactly once. Same simulator as
test_log_sim.py: virtual time, the same seed gives the same run.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable

import pytest
from test_log_sim import Sim, run_sim

from quorumlog.aio import BookKeeper, LogNamespace
from quorumlog.errors import MetadataError
from quorumlog.log import LogConfig, LogFencedError, Position, record_format
from quorumlog.log.errors import LogOutcomeUnknownError
from quorumlog.log.log import Log
from quorumlog.log.metadata import log_path
from quorumlog.meta.store import Versioned
from quorumlog.spark import commit as commits
from quorumlog.testing.memory_store import MemoryStore, MemoryTree
from quorumlog.testing.sim import SIM_CONFIG


class LostReplyStore(MemoryStore):
    """A session whose next ``lose_sets`` sets of ``path`` are applied and then fail as a
    lost connection does (MetadataError: the outcome is unknown to the caller, as
    MetadataFaults' unknown outcomes). ``meanwhile`` runs after such a set is applied and
    before its error is raised: another client's change that lands before the caller
    reads again. ``applied`` counts the sets of ``path`` applied through this session;
    ``fail_gets`` gets of ``path`` fail unapplied."""

    def __init__(self, tree: MemoryTree, path: str) -> None:
        super().__init__(tree)
        self.path = path
        self.lose_sets = 0
        self.meanwhile: Callable[[], Awaitable[object]] | None = None
        self.applied = 0
        self.fail_gets = 0

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        new_version = await super().set(path, data, version)
        if path != self.path:
            return new_version
        self.applied += 1
        if self.lose_sets > 0:
            self.lose_sets -= 1
            if self.meanwhile is not None:
                meanwhile, self.meanwhile = self.meanwhile, None
                await meanwhile()
            raise MetadataError(f"connection lost: the outcome of set {path} is unknown")
        return new_version

    async def get(self, path: str) -> Versioned:
        if path == self.path and self.fail_gets > 0:
            self.fail_gets -= 1
            raise MetadataError(f"connection lost: get {path} not sent")
        return await super().get(path)


async def lossy_log(
    sim: Sim, name: str, config: LogConfig | None = None
) -> tuple[Log, LostReplyStore]:
    """The log ``name`` on a client of its own whose metadata session loses replies."""
    store = LostReplyStore(sim.tree, log_path(name))
    bk = BookKeeper(store, SIM_CONFIG, pool=sim.network, rng=random.Random(sim.rng.random()))  # type: ignore[arg-type]
    sim.clients.append(bk)
    return await LogNamespace(bk).open_log(name, config), store


async def records(log: Log) -> list[bytes]:
    return [r.data for r in await log.read_all()]


# ---------------------------------------------------------------- appending a ledger


def test_r13_r11_a_rollover_whose_list_reply_is_lost_lists_its_ledger_once() -> None:
    """The rollover's compare-and-set is applied, its reply lost, and a truncation lands
    before the writer reads the list again: the new ledger is in the list once, after
    the truncation, and the writer goes on writing to it."""

    async def body(sim: Sim) -> None:
        log, store = await lossy_log(sim, "append", LogConfig(rollover_size_bytes=4))
        writer = await log.open_writer()
        first = await writer.append(b"1234")  # the next append rolls over
        other = await LogNamespace(sim.client()).open_log("append")
        second = await writer.append(b"5678")  # rolls over from here on
        store.lose_sets = 1
        store.meanwhile = lambda: other.truncate(second)  # before the writer reads again
        store.applied = 0
        third = await writer.append(b"9abc")
        assert store.applied == 1  # one compare-and-set, applied once
        ledgers = await log.ledgers()
        assert ledgers == [second.ledger_id, third.ledger_id]  # once, not appended again
        assert writer.rollovers == 2 and not writer.is_fenced
        fourth = await writer.append(b"defg")
        await writer.close()
        assert first.ledger_id not in ledgers
        assert await records(log) == [b"5678", b"9abc", b"defg"]
        assert fourth.ledger_id == (await log.ledgers())[-1]

    run_sim(body)


def test_r13_r11_opening_a_writer_whose_list_reply_is_lost_lists_its_ledger_once() -> None:
    async def body(sim: Sim) -> None:
        log, store = await lossy_log(sim, "open")
        before = await (await LogNamespace(sim.client()).open_log("open")).open_writer()
        await before.append(b"old")
        store.lose_sets = 1
        writer = await log.open_writer()  # fences `before`, appends its ledger: reply lost
        assert store.applied == 1
        assert await log.ledgers() == [before.ledger_id, writer.ledger_id]
        with pytest.raises(LogFencedError):
            await before.append(b"stale")
        await writer.append(b"new")
        await writer.close()
        assert await records(log) == [b"old", b"new"]

    run_sim(body)


def test_r13_an_append_whose_outcome_stays_unknown_says_so_and_keeps_its_ledger() -> None:
    """The list cannot be read back after the lost reply: the writer does not open, the
    error says that the outcome is unknown, and the ledger that may be listed stays."""

    async def body(sim: Sim) -> None:
        log, store = await lossy_log(sim, "blind")
        store.lose_sets = 1
        store.meanwhile = lambda: _blind(store)
        with pytest.raises(LogOutcomeUnknownError, match="unknown"):
            await log.open_writer()
        store.fail_gets = 0
        other = await LogNamespace(sim.client()).open_log("blind")
        [listed] = await other.ledgers()  # the compare-and-set had been applied
        assert await other.bk.ledger_exists(listed)
        successor = await other.open_writer()
        await successor.append(b"next")
        await successor.close()
        assert await records(other) == [b"next"]

    run_sim(body)


async def _blind(store: LostReplyStore) -> None:
    store.fail_gets = 1_000


# ---------------------------------------------------------------- fencing the log


def test_r13_r11_a_fence_whose_seal_reply_is_lost_seals_once_and_fences_the_writer() -> None:
    async def body(sim: Sim) -> None:
        writer = await (await LogNamespace(sim.client()).open_log("fence")).open_writer()
        confirmed = [await writer.append(b"w%d" % i) for i in range(3)]
        log, store = await lossy_log(sim, "fence")
        store.lose_sets = 1
        assert await log.fence() == [writer.ledger_id]
        assert store.applied == 1  # sealed once, not twice
        metadata, _ = await log.metadata()
        assert metadata.fences == 1
        with pytest.raises(LogFencedError):
            await writer.rollover()
        with pytest.raises(LogFencedError):
            await writer.append(b"late")
        assert [r.position for r in await log.read_all()] == confirmed

    run_sim(body)


# ---------------------------------------------------------------- truncating the log


def test_r13_a_truncation_whose_reply_is_lost_is_not_applied_again_to_a_newer_list() -> None:
    """The truncation's compare-and-set is applied, its reply lost, and the writer rolls
    over before the list is read again: the truncation is done once (the newer list
    keeps the new ledger, nothing is truncated again), and the ledgers it removed are
    deleted."""

    async def body(sim: Sim) -> None:
        config = LogConfig(rollover_size_bytes=4)
        writer = await (await LogNamespace(sim.client()).open_log("trunc", config)).open_writer()
        positions = [await writer.append(b"r%03d" % i) for i in range(4)]  # one per ledger
        log, store = await lossy_log(sim, "trunc", config)
        store.lose_sets = 1
        store.meanwhile = writer.rollover  # a newer list: one more ledger
        removed = await log.truncate(positions[2])
        assert store.applied == 1
        assert removed == [positions[0].ledger_id, positions[1].ledger_id]
        for ledger_id in removed:
            assert not await log.bk.ledger_exists(ledger_id)
        metadata, _ = await log.metadata()
        assert metadata.ledgers == (
            positions[2].ledger_id,
            positions[3].ledger_id,
            writer.ledger_id,
        )
        assert metadata.truncated_before == positions[2]
        last = await writer.append(b"last")
        await writer.close()
        assert [r.position for r in await log.read_all()] == [*positions[2:], last]

    run_sim(body)


# ---------------------------------------------------------------- a Spark sink's commit


async def staged(
    bk: BookKeeper, token: str, log: str, partition: int, rows: int
) -> commits.TaskResult:
    """What a Spark write task does: its ledger, its rows, close (no Spark needed)."""
    await commits.open_staging(bk, token, log)
    ledger_id = await commits.task_ledger_id(bk, token, log, "stage-1", partition, 0, 4)
    handle = await commits.create_task_ledger(bk, token, log, partition, ledger_id, 3, 3, 2)
    for i in range(rows):
        await handle.add_entry(record_format.encode(b"p%d-%d" % (partition, i), i))
    await handle.close()
    return commits.TaskResult(partition, ledger_id, rows)


def test_r13_a_sink_commit_whose_reply_is_lost_appends_its_ledgers_once() -> None:
    """A streaming batch's commit is applied, its reply lost, and a writer appends a
    ledger before the commit reads the log again: the batch's ledgers are in the log
    once, its batch id recorded, the commit reports success; Spark running the batch
    again appends nothing."""

    async def body(sim: Sim) -> None:
        log, store = await lossy_log(sim, "sink")
        bk = log.bk
        token = commits.stream_token("query-1", 0)
        results = [await staged(bk, token, "sink", p, 2) for p in range(2)]
        sink = commits.SinkBatch("q", "query-1", 0)
        writer_log = await LogNamespace(sim.client()).open_log("sink")
        later: list[int] = []

        async def a_writer_opens() -> None:
            writer = await writer_log.open_writer()
            later.append(writer.ledger_id)
            await writer.close()

        store.lose_sets = 1
        store.meanwhile = a_writer_opens
        outcome = await commits.commit(bk, "sink", token, results, sink=sink)
        assert store.applied == 1
        ours = tuple(r.ledger_id for r in results)
        assert outcome.appended == ours and outcome.rows == 4 and not outcome.replayed
        metadata, _ = await log.metadata()
        assert metadata.ledgers == (*ours, *later)
        assert metadata.sink_batches == {"q": 0}
        again = commits.stream_token("query-1", 0)
        replay = await commits.commit(bk, "sink", again, [], sink=sink)
        assert replay.replayed and replay.appended == ()
        assert (await log.metadata())[0].ledgers == (*ours, *later)
        assert await records(log) == [b"p%d-%d" % (p, i) for p in range(2) for i in range(2)]

    run_sim(body)


def test_r13_a_sink_commit_superseded_after_a_lost_reply_says_the_outcome_is_unknown() -> None:
    """The commit's compare-and-set is applied and its reply lost; before the commit
    reads the log again, a writer takes the log over and truncates it past the write's
    ledgers. What the log shows then proves neither outcome: the commit must not report
    a plain failure (the user would write the rows again, and they were in the log) but
    that the outcome is unknown, and the abort Spark then runs deletes nothing."""

    async def body(sim: Sim) -> None:
        log, store = await lossy_log(sim, "superseded")
        bk = log.bk
        token = commits.new_write_token()
        results = [await staged(bk, token, "superseded", p, 2) for p in range(2)]
        other = await LogNamespace(sim.client()).open_log("superseded")

        async def taken_over_and_truncated() -> None:
            writer = await other.open_writer()
            await writer.append(b"w")
            await other.truncate(Position(writer.ledger_id, 0))
            await writer.close()

        store.lose_sets = 1
        store.meanwhile = taken_over_and_truncated
        with pytest.raises(commits.CommitOutcomeUnknownError, match="may be in the log"):
            await commits.commit(bk, "superseded", token, results)
        assert store.applied == 1
        assert await commits.abort(bk, "superseded", token) == ()  # its marker says wait
        assert await records(log) == [b"w"]

    run_sim(body)
