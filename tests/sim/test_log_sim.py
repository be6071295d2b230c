"""Log streams on the simulator: real bookies on simulated machines and network, in-memory
metadata, virtual time (seconds of timeouts run in milliseconds, the same seed gives the
same run).

Each test names the rule it checks; R11 is the log made of ledgers.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support import run_virtual

from quorumlog.aio import BookKeeper, LogNamespace
from quorumlog.errors import BKError, InvalidArgumentError, UnauthorizedError
from quorumlog.log import (
    LogConfig,
    LogFencedError,
    LogTruncatedError,
    NoSuchLogError,
    Position,
)
from quorumlog.log.checker import check_observations
from quorumlog.testing.sim import Cluster, NetworkFaults


class Sim:
    """Four real bookies, a network and a metadata tree; ``client()`` is a new BookKeeper
    on them. ``network`` is a shared pool for clients a test builds itself."""

    def __init__(self, loop: asyncio.AbstractEventLoop, seed: int, faults: NetworkFaults) -> None:
        self.loop = loop
        self.rng = random.Random(seed)
        self.cluster = Cluster(
            loop, random.Random(self.rng.random()), bookies=4, network_faults=faults
        )
        self.tree = self.cluster.tree
        self.network = self.cluster.network.pool("test")
        self.clients: list[BookKeeper] = []

    async def register(self) -> None:
        await self.cluster.start()

    def client(self) -> BookKeeper:
        bk: BookKeeper = self.cluster.client()
        self.clients.append(bk)
        return bk

    async def close(self) -> None:
        for bk in self.clients:
            await bk.close()
        await self.cluster.close()


def run_sim(
    body: Callable[[Sim], Awaitable[Any]], seed: int = 1, faults: NetworkFaults | None = None
) -> Any:
    async def main(loop: asyncio.AbstractEventLoop) -> Any:
        sim = Sim(loop, seed, faults or NetworkFaults())
        await sim.register()
        try:
            return await body(sim)
        finally:
            await sim.close()

    return run_virtual(main)


SMALL = LogConfig(rollover_size_bytes=40, read_batch_entries=7)


def test_r11_append_returns_ordered_positions_and_a_reader_reads_them_all() -> None:
    async def body(sim: Sim) -> None:
        log = await LogNamespace(sim.client()).open_log("events")
        writer = await log.open_writer()
        positions = [await writer.append(b"r%d" % i) for i in range(30)]
        assert positions == sorted(positions) and len(set(positions)) == 30
        reader = await (await LogNamespace(sim.client()).open_log("events")).open_reader()
        got = [await reader.read_next(1000) for _ in range(30)]
        assert [r.position for r in got if r] == positions
        assert [r.data for r in got if r] == [b"r%d" % i for i in range(30)]
        assert await reader.read_next(timeout_ms=50) is None  # nothing more, no hang

    run_sim(body)


def test_records_carry_their_append_time_which_never_goes_back(monkeypatch) -> None:
    """The writer stamps its clock, the previous record's time if the clock went back,
    or the time given; readers and read_all return it with the payload."""
    from quorumlog.log import writer as writer_module

    clock_ns = iter([5_000_000_000, 4_000_000_000, 6_000_000_000] + [7_000_000_000] * 10)
    monkeypatch.setattr(writer_module.time, "time_ns", lambda: next(clock_ns))

    async def body(sim: Sim) -> None:
        log = await LogNamespace(sim.client()).open_log("stamps")
        writer = await log.open_writer()
        for data in (b"a", b"b", b"c"):
            await writer.append(data)
        await writer.append(b"replayed", 1_234)  # taken as is
        await writer.append(b"d")
        assert writer.last_timestamp_ms == 7_000
        with pytest.raises(InvalidArgumentError, match="64-bit"):
            writer.append_nowait(b"x", 1 << 63)
        wanted = [(b"a", 5_000), (b"b", 5_000), (b"c", 6_000), (b"replayed", 1_234), (b"d", 7_000)]
        assert [(r.data, r.timestamp_ms) for r in await log.read_all()] == wanted
        reader = await log.open_reader()
        got = [await reader.read_next(1000) for _ in range(5)]
        assert [(r.data, r.timestamp_ms) for r in got if r] == wanted

    run_sim(body)


def test_r11_rollover_by_size_adds_then_closes_and_reader_follows() -> None:
    async def body(sim: Sim) -> None:
        bk = sim.client()
        log = await LogNamespace(bk).open_log("roll", SMALL)
        reader = await (await LogNamespace(sim.client()).open_log("roll", SMALL)).open_reader()
        writer = await log.open_writer()
        positions = [await writer.append(b"0123456789") for _ in range(20)]
        ledgers = await log.ledgers()
        assert len(ledgers) == 5 and writer.rollovers == 4
        assert sorted({p.ledger_id for p in positions}) == ledgers
        for ledger_id in ledgers[:-1]:  # every ledger but the current one is closed
            assert (await bk.ledger_metadata(ledger_id)).is_closed
        read = [await reader.read_next(2000) for _ in range(20)]
        assert [r.position for r in read if r] == positions

    run_sim(body)


def test_r11_rollover_by_age() -> None:
    async def body(sim: Sim) -> None:
        log = await LogNamespace(sim.client()).open_log("aged", LogConfig(rollover_age_ms=100))
        writer = await log.open_writer()
        first = await writer.append(b"a")
        await asyncio.sleep(0.2)
        second = await writer.append(b"b")
        assert second.ledger_id > first.ledger_id
        assert len(await log.ledgers()) == 2

    run_sim(body)


def test_r11_pipelined_appends_keep_order_across_a_rollover() -> None:
    async def body(sim: Sim) -> None:
        log = await LogNamespace(sim.client()).open_log("pipe", LogConfig(rollover_size_bytes=200))
        writer = await log.open_writer()
        futures = [writer.append_nowait(b"%04d" % i) for i in range(300)]
        positions = await asyncio.gather(*futures)
        assert list(positions) == sorted(positions)
        await writer.close()
        records = await log.read_all()
        assert [r.data for r in records] == [b"%04d" % i for i in range(300)]
        assert [r.position for r in records] == list(positions)
        assert writer.rollovers >= 1

    run_sim(body)


def test_r11_new_writer_fences_the_old_one_which_fails_on_every_later_append() -> None:
    async def body(sim: Sim) -> None:
        old = await (await LogNamespace(sim.client()).open_log("owned")).open_writer()
        confirmed = [await old.append(b"old%d" % i) for i in range(5)]
        new_log = await LogNamespace(sim.client()).open_log("owned")
        new = await new_log.open_writer()
        assert (await new_log.bk.ledger_metadata(old.ledger_id)).is_closed  # fenced, recovered
        for attempt in range(3):
            with pytest.raises(LogFencedError, match="log owned"):
                await old.append(b"stale%d" % attempt)
        assert old.is_fenced
        after = await new.append(b"new")
        # Fenced, so the result is final: right after an append the bookies may not yet
        # know its LAC, and a reader of an open ledger stops at the LAC (R4).
        records = await new_log.read_all(fence=True)
        assert [r.position for r in records] == [*confirmed, after]
        assert b"stale0" not in [r.data for r in records]

    run_sim(body)


def test_r11_two_writers_opening_at_once_exactly_one_wins() -> None:
    async def body(sim: Sim) -> None:
        logs = [await LogNamespace(sim.client()).open_log("race") for _ in range(2)]
        outcomes = await asyncio.gather(*(lg.open_writer() for lg in logs), return_exceptions=True)
        opened = [o for o in outcomes if not isinstance(o, BaseException)]
        assert all(isinstance(o, LogFencedError) for o in outcomes if o not in opened)
        # Whether the loser lost at open (its CAS) or on its first append (fenced by the
        # winner's open), exactly one writer can append.
        appended = await asyncio.gather(*(w.append(b"x") for w in opened), return_exceptions=True)
        wins = [a for a in appended if isinstance(a, Position)]
        assert len(wins) == 1
        assert all(isinstance(a, LogFencedError) for a in appended if a not in wins)
        assert [r.position for r in await logs[0].read_all(fence=True)] == wins
        assert (await logs[0].ledgers())[-1] == wins[0].ledger_id

    run_sim(body)


def test_r11_rollover_losing_its_compare_and_set_fences_the_writer() -> None:
    async def body(sim: Sim) -> None:
        log = await LogNamespace(sim.client()).open_log("cas", LogConfig(rollover_size_bytes=4))
        writer = await log.open_writer()
        await writer.append(b"1234")  # the next append rolls over
        # Another writer appends a ledger first; the old writer's CAS must lose.
        other_log = await LogNamespace(sim.client()).open_log("cas")
        metadata, version = await other_log.metadata()
        await other_log.store.set(other_log.path, metadata.with_ledger(10_000).to_bytes(), version)
        with pytest.raises(LogFencedError, match="another writer changed the ledger list"):
            await writer.append(b"x")
        with pytest.raises(LogFencedError):
            writer.append_nowait(b"y")

    run_sim(body)


def test_r11_truncation_during_rollover_does_not_fence_the_writer() -> None:
    async def body(sim: Sim) -> None:
        log = await LogNamespace(sim.client()).open_log("trunc", LogConfig(rollover_size_bytes=4))
        writer = await log.open_writer()
        positions = [await writer.append(b"abcd") for _ in range(3)]
        # A truncation changes the list version under the writer's feet.
        removed = await (await LogNamespace(sim.client()).open_log("trunc")).truncate(positions[2])
        assert removed == [positions[0].ledger_id, positions[1].ledger_id]
        more = [await writer.append(b"efgh") for _ in range(3)]
        assert not writer.is_fenced
        records = await log.read_all()
        assert [r.position for r in records] == [positions[2], *more]

    run_sim(body)


def test_truncate_removes_whole_ledgers_and_readers_before_it_get_a_clear_error() -> None:
    async def body(sim: Sim) -> None:
        bk = sim.client()
        log = await LogNamespace(bk).open_log("cut", LogConfig(rollover_size_bytes=8))
        writer = await log.open_writer()
        positions = [await writer.append(b"1234") for _ in range(8)]  # 2 per ledger
        early_reader = await log.open_reader()
        assert (await early_reader.read_next(1000))[:2] == (positions[0], b"1234")
        cut = positions[5]  # second record of the third ledger
        removed = await log.truncate(cut)
        assert removed == sorted({p.ledger_id for p in positions[:4]})
        for ledger_id in removed:
            assert not await bk.ledger_exists(ledger_id)
        with pytest.raises(LogTruncatedError, match=f"before the truncation point {cut}"):
            await log.open_reader(positions[0])
        with pytest.raises(LogTruncatedError):
            await log.open_reader(positions[4])  # its ledger stays, but it is before the cut
        with pytest.raises(LogTruncatedError, match="truncated"):
            for _ in range(10):
                await early_reader.read_next(1000)
        from_start = await log.open_reader()
        assert (await from_start.read_next(1000))[:2] == (cut, b"1234")
        info = await log.positions()
        assert info.first == cut and info.last == positions[-1] and info.record_count == 3
        with pytest.raises(InvalidArgumentError):
            await log.truncate(Position(999_999, 0))
        assert await log.truncate(positions[0]) == []  # already truncated: nothing to do

    run_sim(body)


def test_reader_follows_a_crashed_writer_replaced_by_a_new_one() -> None:
    async def body(sim: Sim) -> None:
        reader = await (await LogNamespace(sim.client()).open_log("handover")).open_reader()
        crashed = await (await LogNamespace(sim.client()).open_log("handover")).open_writer()
        first = [await crashed.append(b"a%d" % i) for i in range(3)]
        got = [await reader.read_next(1000) for _ in range(3)]
        assert [r.position for r in got if r] == first
        # The first writer stops without closing (a crash); a new writer fences its ledger.
        successor = await (await LogNamespace(sim.client()).open_log("handover")).open_writer()
        second = [await successor.append(b"b%d" % i) for i in range(3)]
        got = [await reader.read_next(3000) for _ in range(3)]
        assert [r.position for r in got if r] == second

    run_sim(body)


def test_reader_from_a_position_is_inclusive_and_skips_missing_ledgers() -> None:
    async def body(sim: Sim) -> None:
        log = await LogNamespace(sim.client()).open_log("from", LogConfig(rollover_size_bytes=2))
        writer = await log.open_writer()
        positions = [await writer.append(b"xy") for _ in range(4)]  # one per ledger
        reader = await log.open_reader(positions[2])
        assert (await reader.read_next(1000)).position == positions[2]  # type: ignore[union-attr]
        # A position past a ledger's end moves on to the next ledger of the list.
        after = await log.open_reader(Position(positions[1].ledger_id, 5))
        assert (await after.read_next(1000)).position == positions[2]  # type: ignore[union-attr]
        assert positions[2] < reader.position <= positions[3]
        assert (await reader.read_next(1000)).position == positions[3]  # type: ignore[union-attr]

    run_sim(body)


def test_positions_report_first_last_and_count() -> None:
    async def body(sim: Sim) -> None:
        log = await LogNamespace(sim.client()).open_log("count", LogConfig(rollover_size_bytes=3))
        empty = await log.positions()
        assert empty.first is None and empty.last is None and empty.record_count == 0
        writer = await log.open_writer()
        positions = [await writer.append(b"abc") for _ in range(5)]
        await writer.close()
        info = await log.positions()
        assert (info.first, info.last, info.record_count) == (positions[0], positions[-1], 5)
        assert info.count_exact

    run_sim(body)


def test_delete_log_removes_the_list_and_its_ledgers_and_stops_the_writer() -> None:
    async def body(sim: Sim) -> None:
        bk = sim.client()
        log = await LogNamespace(bk).open_log("gone", LogConfig(rollover_size_bytes=3))
        writer = await log.open_writer()
        for _ in range(3):
            await writer.append(b"abc")
        ledgers = await log.ledgers()
        assert await LogNamespace(bk).list_logs() == ["gone"]
        assert await LogNamespace(bk).delete_log("gone") == ledgers
        assert await LogNamespace(bk).list_logs() == []
        for ledger_id in ledgers:
            assert not await bk.ledger_exists(ledger_id)
        with pytest.raises(LogFencedError):
            for _ in range(3):  # the ledger is gone on its bookies, or the list is
                await writer.append(b"abc")
        with pytest.raises(NoSuchLogError):
            await LogNamespace(bk).delete_log("gone")

    run_sim(body)


# ---------------------------------------------------------------- seeded competition


async def _compete(sim: Sim, writers: int, appends: int) -> dict[str, Any]:
    """Writers take the log from each other while the network drops and delays
    messages; a reader tails. Returns what each observer saw and the final log."""
    config = LogConfig(rollover_size_bytes=64)
    confirmed: dict[str, list[tuple[Position, bytes]]] = {f"w{i}": [] for i in range(writers)}
    tailed: list[tuple[Position, bytes]] = []
    fenced = 0

    async def write(name: str) -> None:
        nonlocal fenced
        log = await LogNamespace(sim.client()).open_log("shared", config)
        sent = 0
        for _ in range(200):  # bounded number of terms
            if sent >= appends:
                return
            try:
                writer = await log.open_writer()
            except BKError:
                await asyncio.sleep(sim.rng.uniform(0.001, 0.02))
                continue
            try:
                while sent < appends:
                    data = f"{name}-{sent}".encode()
                    sent += 1
                    position = await writer.append(data)
                    confirmed[name].append((position, data))
                    await asyncio.sleep(sim.rng.uniform(0, 0.003))
            except LogFencedError:
                fenced += 1
            except BKError:
                pass
            await asyncio.sleep(sim.rng.uniform(0.001, 0.02))

    async def tail(stop: asyncio.Event) -> None:
        reader = await (await LogNamespace(sim.client()).open_log("shared", config)).open_reader()
        while not stop.is_set():
            record = await reader.read_next(50)
            if record is not None:
                tailed.append(tuple(record))  # type: ignore[arg-type]

    stop = asyncio.Event()
    tailer = asyncio.ensure_future(tail(stop))
    await asyncio.gather(*(write(f"w{i}") for i in range(writers)))
    final = await (await LogNamespace(sim.client()).open_log("shared", config)).read_all(fence=True)
    await asyncio.sleep(1.0)  # let the reader catch up
    stop.set()
    await tailer
    return {"confirmed": confirmed, "tailed": tailed, "final": final, "fenced": fenced}


@pytest.mark.parametrize("seed", range(6))
def test_r11_competing_writers_seeded_history_is_consistent(seed: int) -> None:
    faults = NetworkFaults(drop_probability=0.002 * (seed % 3), delay_ms_max=4.0)
    result = run_sim(lambda sim: _compete(sim, writers=3, appends=40), seed=seed, faults=faults)
    final = [tuple(r) for r in result["final"]]
    report = check_observations(
        final, prefixes={"reader": result["tailed"]}, subsets=result["confirmed"]
    )
    assert report.ok, report.problems
    assert report.divergent_positions == 0
    assert result["fenced"] >= 1  # the writers did take the log from each other
    all_confirmed = sum(len(v) for v in result["confirmed"].values())
    assert all_confirmed <= len(final) and all_confirmed > 0


def test_r10_reader_with_the_wrong_password_gets_an_error_not_silence() -> None:
    async def body(sim: Sim) -> None:
        writer = await (
            await LogNamespace(sim.client()).open_log("secret", LogConfig(password=b"pw"))
        ).open_writer()
        await writer.append(b"hidden")
        reader = await (
            await LogNamespace(sim.client()).open_log("secret", LogConfig(password=b"wrong"))
        ).open_reader()
        with pytest.raises(UnauthorizedError, match="wrong password"):
            await reader.read_next(1000)

    run_sim(body)
