"""Log streams on the simulator under metadata faults and crashed writers.

Unknown outcomes of the list's compare-and-set (R13), fencing what crashed writers
left open (R11), resuming from a checkpoint next to the truncation point, and a
fenced log staying final. Same simulator as test_log_sim.py: virtual time, the same
seed gives the same run.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from test_log_sim import Sim, run_sim

from quorumlog.aio import BookKeeper, LogNamespace
from quorumlog.client.writing import LedgerHandle
from quorumlog.errors import MetadataError
from quorumlog.log import LogConfig, LogFencedError, LogTruncatedError, Position
from quorumlog.log.log import Log
from quorumlog.log.metadata import log_path
from quorumlog.log.record_format import encode
from quorumlog.log.writer import LogWriter
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.meta.store import Versioned
from quorumlog.testing.memory_store import MemoryStore, MemoryTree
from quorumlog.testing.sim import SIM_CONFIG


class LostReplyStore(MemoryStore):
    """A session whose next ``lose_sets`` sets of ``path`` are applied and then fail as
    a lost connection would (MetadataError: the outcome is unknown to the caller); after
    such a set, the next ``then_fail_gets`` gets of ``path`` fail unapplied."""

    def __init__(self, tree: MemoryTree, path: str) -> None:
        super().__init__(tree)
        self.path = path
        self.lose_sets = 0
        self.then_fail_gets = 0
        self.fail_gets = 0

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        new_version = await super().set(path, data, version)
        if path == self.path and self.lose_sets > 0:
            self.lose_sets -= 1
            self.fail_gets = self.then_fail_gets
            raise MetadataError(f"connection lost: the outcome of set {path} is unknown")
        return new_version

    async def get(self, path: str) -> Versioned:
        if path == self.path and self.fail_gets > 0:
            self.fail_gets -= 1
            raise MetadataError(f"connection lost: get {path} not sent")
        return await super().get(path)


def client_on(sim: Sim, store: MemoryStore) -> BookKeeper:
    """A client of the simulated cluster whose metadata session is ``store``."""
    bk = BookKeeper(store, SIM_CONFIG, pool=sim.network, rng=random.Random(sim.rng.random()))  # type: ignore[arg-type]
    sim.clients.append(bk)
    return bk


async def assert_listed_ledgers_exist_and_read(log: Log, expected: list[bytes]) -> None:
    """Every listed ledger exists, and a reader reads exactly ``expected`` (in order)."""
    for ledger_id in await log.ledgers():
        assert await log.bk.ledger_exists(ledger_id), f"ledger {ledger_id} is listed but deleted"
    reader = await log.open_reader()
    got = [await reader.read_next(2000) for _ in expected]
    await reader.close()
    assert [r.data if r else None for r in got] == expected


# ---------------------------------------------------------------- L4 (R13)


def test_l4_r13_open_writer_whose_list_cas_reply_is_lost_keeps_its_listed_ledger() -> None:
    async def body(sim: Sim) -> None:
        store = LostReplyStore(sim.tree, log_path("lost"))
        log = await LogNamespace(client_on(sim, store)).open_log("lost")
        store.lose_sets = 1  # the compare-and-set adding the writer's ledger
        writer = await log.open_writer()  # re-reads the list: its ledger is in it
        assert (await log.ledgers())[-1] == writer.ledger_id
        await writer.append(b"after")
        await writer.close()
        await assert_listed_ledgers_exist_and_read(log, [b"after"])

    run_sim(body)


def test_l4_r13_rollover_whose_list_cas_reply_is_lost_keeps_its_listed_ledger() -> None:
    async def body(sim: Sim) -> None:
        store = LostReplyStore(sim.tree, log_path("lostroll"))
        log = await LogNamespace(client_on(sim, store)).open_log(
            "lostroll", LogConfig(rollover_size_bytes=4)
        )
        writer = await log.open_writer()
        first = await writer.append(b"1234")
        store.lose_sets = 1  # the next append rolls over: its compare-and-set is lost
        second = await writer.append(b"5678")
        assert second.ledger_id > first.ledger_id and writer.rollovers == 1
        await writer.close()
        await assert_listed_ledgers_exist_and_read(log, [b"1234", b"5678"])

    run_sim(body)


def test_l4_r13_an_unresolved_cas_outcome_never_deletes_the_ledger() -> None:
    async def body(sim: Sim) -> None:
        store = LostReplyStore(sim.tree, log_path("unknown"))
        log = await LogNamespace(client_on(sim, store)).open_log("unknown")
        store.lose_sets = 1
        store.then_fail_gets = 1_000  # the list cannot be read back: the outcome stays unknown
        with pytest.raises(MetadataError):
            await log.open_writer()  # it gives up, but must not delete a ledger maybe listed
        store.fail_gets = 0
        other = await LogNamespace(sim.client()).open_log("unknown")
        successor = await other.open_writer()
        position = await successor.append(b"next")
        assert position.ledger_id == successor.ledger_id
        await successor.close()
        await assert_listed_ledgers_exist_and_read(other, [b"next"])

    run_sim(body)


# ---------------------------------------------------------------- L5 (R11)


async def _two_crashed_writers(sim: Sim, name: str) -> tuple[Log, LogWriter, list[Position]]:
    """A log whose first ledger is open behind a closed one: writer 1 crashed mid-rollover
    (its next ledger listed, its current one not closed), then writer 2 crashed while
    fencing, after it had closed the newer ledger and before the older one."""
    log = await LogNamespace(sim.client()).open_log(name)
    first = await log.open_writer()
    confirmed = [await first.append(b"a%d" % i) for i in range(3)]
    following = await log.create_ledger()  # writer 1's rollover: created, listed ...
    metadata, version = await log.metadata()
    await log.store.set(log.path, metadata.with_ledger(following.ledger_id).to_bytes(), version)
    # ... and writer 1 stops. Writer 2 fences the newest ledger, then stops too.
    await (await sim.client().open_ledger(following.ledger_id)).close()
    assert not (await log.bk.ledger_metadata(first.ledger_id)).is_closed
    return log, first, confirmed


def test_l5_r11_a_new_writer_fences_an_open_ledger_behind_a_closed_one() -> None:
    async def body(sim: Sim) -> None:
        log, first, confirmed = await _two_crashed_writers(sim, "crashes")
        third = await (await LogNamespace(sim.client()).open_log("crashes")).open_writer()
        assert (await log.bk.ledger_metadata(first.ledger_id)).is_closed
        with pytest.raises(LogFencedError):
            await first.append(b"stale")
        after = await third.append(b"c")
        reader = await log.open_reader()
        got = [await reader.read_next(3000) for _ in range(4)]
        assert [r.position if r else None for r in got] == [*confirmed, after]

    run_sim(body)


def test_l5_r11_log_fence_closes_an_open_ledger_behind_a_closed_one() -> None:
    async def body(sim: Sim) -> None:
        log, first, confirmed = await _two_crashed_writers(sim, "fenced")
        assert first.ledger_id in await log.fence()
        assert (await log.bk.ledger_metadata(first.ledger_id)).is_closed
        assert [r.position for r in await log.read_all()] == confirmed

    run_sim(body)


def test_l5_opening_a_writer_reads_only_the_ledgers_a_previous_writer_may_hold() -> None:
    async def body(sim: Sim) -> None:
        config = LogConfig(rollover_size_bytes=4)
        for _ in range(2):  # writers rolling over many times, then a crashed one
            writer = await (await LogNamespace(sim.client()).open_log("long", config)).open_writer()
            for i in range(8):
                await writer.append(b"r%03d" % i)
        crashed = writer.ledger_id
        bk = sim.client()
        log = await LogNamespace(bk).open_log("long", config)
        assert len(await log.ledgers()) == 16  # one ledger per record
        looked_at: list[int] = []
        read_metadata = bk.ledger_metadata

        async def counted(ledger_id: int) -> LedgerMetadata:
            looked_at.append(ledger_id)
            return await read_metadata(ledger_id)

        bk.ledger_metadata = counted  # type: ignore[method-assign]
        await log.open_writer()
        # The ledgers before the crashed writer's previous one were closed when it rolled
        # over (and those before it when it opened): only those two are looked at.
        assert crashed in looked_at and len(looked_at) <= 2, looked_at
        assert (await read_metadata(crashed)).is_closed

    run_sim(body)


# ---------------------------------------------------------------- L6


def test_l6_a_reader_at_the_end_of_a_closed_ledger_resumes_after_a_truncation_next_to_it() -> None:
    async def body(sim: Sim) -> None:
        log = await LogNamespace(sim.client()).open_log("resume", LogConfig(rollover_size_bytes=4))
        writer = await log.open_writer()
        positions = [await writer.append(b"r%03d" % i) for i in range(4)]  # one per ledger
        assert len({p.ledger_id for p in positions}) == 4
        live = await log.open_reader()
        assert [(await live.read_next(1000)).position for _ in range(2)] == positions[:2]  # type: ignore[union-attr]
        checkpoint = live.position  # the end of the second ledger, which is closed
        assert checkpoint == positions[1].next()
        unread = await log.open_reader(positions[1])  # one record before the cut not read yet
        await log.truncate(positions[2])  # the cut is the next ledger's first record
        resumed = await log.open_reader(checkpoint)
        for reader in (live, resumed):
            got = [await reader.read_next(1000) for _ in range(2)]
            assert [r.position if r else None for r in got] == positions[2:]
        with pytest.raises(LogTruncatedError):
            await unread.read_next(1000)
        with pytest.raises(LogTruncatedError):
            await log.open_reader(positions[1])

    run_sim(body)


def test_l6_empty_ledgers_before_the_truncation_point_hold_nothing_to_miss() -> None:
    async def body(sim: Sim) -> None:
        bk = sim.client()
        log = await LogNamespace(bk).open_log("empties")
        writer = await log.open_writer()
        first = await writer.append(b"first")
        await writer.close()
        # Two writers that wrote nothing: two empty closed ledgers, then a record.
        for _ in range(2):
            await (await log.open_writer()).close()
        writer = await log.open_writer()
        last = await writer.append(b"last")
        ledgers = await log.ledgers()
        assert len(ledgers) == 4
        checkpoint = first.next()
        await log.truncate(Position(ledgers[2], 0))  # before the second empty ledger
        await log.truncate(Position(ledgers[3], 0))  # then before the last record
        for start in (checkpoint, Position(ledgers[1], 0), Position(ledgers[2], 0)):
            reader = await log.open_reader(start)
            assert (await reader.read_next(1000))[:2] == (last, b"last")
        with pytest.raises(LogTruncatedError):
            await log.open_reader(first)

    run_sim(body)


# ---------------------------------------------------------------- L7


def test_l7_r11_log_fence_stops_a_writer_that_rolls_over_afterwards() -> None:
    async def body(sim: Sim) -> None:
        writer = await (await LogNamespace(sim.client()).open_log("final")).open_writer()
        confirmed = [await writer.append(b"w%d" % i) for i in range(3)]
        log = await LogNamespace(sim.client()).open_log("final")
        assert await log.fence() == [writer.ledger_id]
        with pytest.raises(LogFencedError):
            await writer.rollover()  # its old ledger closed where the fence closed it
        with pytest.raises(LogFencedError):
            await writer.append(b"late")
        assert [r.position for r in await log.read_all()] == confirmed
        # A next writer still opens, after the fence, and appends.
        successor = await log.open_writer()
        after = await successor.append(b"next")
        await successor.close()  # its ledger's LAC is then known to every reader
        assert [r.position for r in await log.read_all()] == [*confirmed, after]

    run_sim(body)


def test_l7_r11_read_all_fenced_is_final_for_a_writer_rolling_over_by_age() -> None:
    async def body(sim: Sim) -> None:
        config = LogConfig(rollover_age_ms=100)
        writer = await (await LogNamespace(sim.client()).open_log("aged", config)).open_writer()
        confirmed = [await writer.append(b"w%d" % i) for i in range(3)]
        log = await LogNamespace(sim.client()).open_log("aged", config)
        final = await log.read_all(fence=True)
        assert [r.position for r in final] == confirmed
        await asyncio.sleep(0.2)  # the next append rolls over to a new ledger
        with pytest.raises(LogFencedError):
            await writer.append(b"late")
        assert await log.read_all() == final

    run_sim(body)


# ---------------------------------------------------------------- K2


def test_k2_read_available_and_read_next_0_fetch_what_is_readable_now() -> None:
    """Neither waits, and both read from the bookies what is readable at the time: the
    records of closed ledgers, and an open ledger's up to the LAC its bookies report."""

    async def body(sim: Sim) -> None:
        log = await LogNamespace(sim.client()).open_log("now", LogConfig(long_poll_ms=5_000))
        writer = await log.open_writer()
        closed = [await writer.append(b"c%d" % i) for i in range(10)]
        await writer.close()
        loop = asyncio.get_running_loop()
        reader = await log.open_reader()
        started = loop.time()
        first = await reader.read_next(timeout_ms=0)
        assert first is not None and first.position == closed[0]
        assert [r.position for r in await reader.read_available()] == closed[1:]
        assert await reader.read_next(timeout_ms=0) is None
        assert await reader.read_available() == []
        # An open ledger: what its bookies confirmed is readable now.
        writer = await log.open_writer()
        more = [await writer.append(b"o%d" % i) for i in range(3)]
        await asyncio.sleep(0.05)  # the writer's explicit LAC reaches the bookies
        assert [r.position for r in await reader.read_available()] == more
        assert await reader.read_next(timeout_ms=0) is None
        assert loop.time() - started < 1.0  # no long poll waited
        # Only the buffered records: what was read ahead and not yet returned.
        fresh = await log.open_reader()
        assert fresh.take_buffered() == []
        assert (await fresh.read_next(timeout_ms=0))[:2] == (closed[0], b"c0")
        assert [r.position for r in fresh.take_buffered(4)] == closed[1:5]
        await writer.close()
        await reader.close()
        await fresh.close()

    run_sim(body)


# ---------------------------------------------------------------- K3


async def _rollover_under_way(log: Log, records: int) -> tuple[LedgerHandle, LedgerHandle]:
    """A writer's rollover between its steps 2 and 3: the old ledger holds ``records``
    confirmed records and is still open, the new one is listed after it."""
    old = await log.create_ledger()
    metadata, version = await log.metadata()
    version = await log.store.set(log.path, metadata.with_ledger(old.ledger_id).to_bytes(), version)
    for i in range(records):
        await old.add_entry(encode(b"a%d" % i, i))
    new = await log.create_ledger()
    metadata, version = await log.metadata()
    await log.store.set(log.path, metadata.with_ledger(new.ledger_id).to_bytes(), version)
    return old, new


def test_k3_a_truncation_during_a_rollover_records_where_the_old_ledger_ends() -> None:
    """The truncation waits for the rollover to close the old ledger, so it knows where
    that ledger's records end (removed_end): a reader at its end lost nothing."""

    async def body(sim: Sim) -> None:
        log = await LogNamespace(sim.client()).open_log("rolling")
        old, new = await _rollover_under_way(log, 3)
        await new.add_entry(encode(b"b0", 3))
        live = await log.open_reader()
        assert [(await live.read_next(1000)).data for _ in range(3)] == [b"a0", b"a1", b"a2"]  # type: ignore[union-attr]
        checkpoint = live.position
        assert checkpoint == Position(old.ledger_id, 3)

        async def close_soon() -> None:
            await asyncio.sleep(0.2)  # the rollover's step 3: the old ledger's adds settle
            await old.close()

        closing = asyncio.ensure_future(close_soon())
        removed = await log.truncate(Position(new.ledger_id, 0))
        await closing  # the writer's close succeeded: the ledger was not deleted under it
        assert removed == [old.ledger_id]
        metadata, _ = await log.metadata()
        assert metadata.removed_end == checkpoint
        resumed = await log.open_reader(checkpoint)
        for reader in (live, resumed):
            assert (await reader.read_next(1000))[:2] == (Position(new.ledger_id, 0), b"b0")

    run_sim(body)


def test_k3_a_truncation_waits_a_bounded_time_for_an_old_ledger_no_one_closes() -> None:
    """A writer that died mid-rollover leaves its old ledger open: the truncation goes
    on after ``truncate_close_wait_ms``, and where the old ledger ends stays unknown."""

    async def body(sim: Sim) -> None:
        log = await LogNamespace(sim.client()).open_log(
            "stuck", LogConfig(truncate_close_wait_ms=300)
        )
        old, new = await _rollover_under_way(log, 2)
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await log.truncate(Position(new.ledger_id, 0)) == [old.ledger_id]
        assert 0.3 <= loop.time() - started < 2
        assert (await log.metadata())[0].removed_end is None
        with pytest.raises(LogTruncatedError):
            await log.open_reader(Position(old.ledger_id, 2))

    run_sim(body)


# ---------------------------------------------------------------- K6


def test_k6_a_writer_whose_ledger_a_recovery_fenced_says_so_not_another_writer() -> None:
    """Autorecovery of a lost bookie fences and closes an idle writer's open ledger
    (open with recovery, as here). No other writer took the log: the error says that a
    recovery of the ledger fenced it. A writer that another writer fenced still says so,
    and so does one that log.fence() stopped."""

    async def body(sim: Sim) -> None:
        log = await LogNamespace(sim.client()).open_log("idle")
        writer = await log.open_writer()
        await writer.append(b"before")
        await (await sim.client().open_ledger(writer.ledger_id)).close()  # the recovery
        with pytest.raises(LogFencedError, match="recovery of the ledger") as raised:
            await writer.append(b"late")
        assert "fenced by another writer" not in raised.value.message
        assert writer.is_fenced and writer.failure is raised.value
        with pytest.raises(LogFencedError, match="recovery of the ledger"):
            await writer.append(b"later")

        taken = await LogNamespace(sim.client()).open_log("taken")
        first = await taken.open_writer()
        await first.append(b"first")
        second = await (await LogNamespace(sim.client()).open_log("taken")).open_writer()
        with pytest.raises(LogFencedError, match="fenced by another writer") as raised:
            await first.append(b"late")
        assert f"ledger {second.ledger_id}" in raised.value.message

        sealed = await LogNamespace(sim.client()).open_log("sealed")
        third = await sealed.open_writer()
        await third.append(b"third")
        await (await LogNamespace(sim.client()).open_log("sealed")).fence()
        with pytest.raises(LogFencedError, match=r"log\.fence\(\)"):
            await third.append(b"late")

    run_sim(body)
