"""Compaction inside a running Bookie: the periodic minor compaction, force_gc, a close
in the middle of a paced compaction, and every entry read back after a restart."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from conftest import Driver
from support import poll_until_async

from quorumlog.bookie.disk_checker import DiskUsage
from quorumlog.errors import Status
from quorumlog.proto.codec import AddRequest, ReadRequest
from quorumlog.testing.raw_client import make_entry, master_key

KEY = master_key(b"pw")
LEDGERS = [1, 2, 3, 4, 5, 6]
KEEP = 1
ROUNDS = 40


def blob(ledger_id: int, entry_id: int) -> bytes:
    return make_entry(ledger_id, entry_id, b"%d/%d;" % (ledger_id, entry_id) + bytes(400))


async def fill(driver: Driver) -> None:
    for r in range(ROUNDS):
        for ledger_id in LEDGERS:
            entries = [blob(ledger_id, e) for e in range(r * 5, r * 5 + 5)]
            answer = await driver.call(AddRequest(0, ledger_id, KEY, entries))
            assert answer.status == Status.OK


async def read_kept(driver: Driver) -> None:
    for e in range(ROUNDS * 5):
        answer = await driver.call(ReadRequest(0, KEEP, e))
        assert answer.status == Status.OK and answer.entries == [blob(KEEP, e)], e


def log_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in (data_dir / "entrylogs").glob("*.log"))


def settings(**overrides: object) -> dict[str, object]:
    return {
        "entry_log_max_bytes": 64 * 1024,
        "entry_log_write_buffer_bytes": 16 * 1024,
        "minor_compaction_threshold": 0.5,
        "minor_compaction_interval_ms": 3_600_000,
        "major_compaction_threshold": 0.0,
        "compaction_rate_bytes_per_s": 0.0,
        **overrides,
    }


def test_periodic_minor_compaction_frees_the_dead_part(
    make_driver: Callable[..., Driver], tmp_path: Path
) -> None:
    driver = make_driver(**settings(minor_compaction_interval_ms=100))

    async def scenario() -> None:
        bookie = await driver.start()
        await fill(driver)
        await bookie.checkpoint()
        bookie.garbage_collect((), set(LEDGERS) - {KEEP})
        await bookie.checkpoint()
        before = log_bytes(tmp_path / "data")
        await poll_until_async(
            lambda: bookie.compactor.runs and log_bytes(tmp_path / "data") < before / 2,
            timeout_s=30,
            what="a periodic minor compaction freeing half the entry logs' bytes",
            interval_s=0.05,
        )
        await read_kept(driver)
        await driver.restart()
        await read_kept(driver)
        await driver.close()

    asyncio.run(scenario())
    assert not driver.broken


def test_force_gc_compacts_now_and_reports_it(
    make_driver: Callable[..., Driver], tmp_path: Path
) -> None:
    driver = make_driver(**settings())

    async def scenario() -> None:
        bookie = await driver.start()
        await fill(driver)
        rounds = []

        async def gc_round() -> int:
            rounds.append(1)
            return bookie.garbage_collect((), set(LEDGERS) - {KEEP})

        bookie.gc_round = gc_round
        before = log_bytes(tmp_path / "data")
        result = await bookie.force_gc(major=False)
        assert rounds == [1]
        assert result.logs_compacted and result.bytes_freed > 0 and result.entries_copied > 0
        assert log_bytes(tmp_path / "data") < before / 2
        # Major compaction is off here (threshold 0): forcing one rewrites nothing.
        assert (await bookie.force_gc(major=True)).logs_compacted == []
        await read_kept(driver)
        await driver.restart()
        await read_kept(driver)
        await driver.close()

    asyncio.run(scenario())
    assert not driver.broken


def test_a_close_in_the_middle_of_a_paced_compaction_loses_nothing(
    make_driver: Callable[..., Driver], tmp_path: Path
) -> None:
    driver = make_driver(**settings(compaction_rate_bytes_per_s=50_000.0))

    async def scenario() -> None:
        bookie = await driver.start()
        await fill(driver)
        bookie.garbage_collect((), set(LEDGERS) - {KEEP})
        copied = asyncio.Event()
        pace = bookie.compactor._sleep

        async def paced(delay_s: float) -> None:  # the pace waits after every batch copied
            copied.set()
            await pace(delay_s)

        bookie.compactor._sleep = paced
        task = asyncio.create_task(bookie.force_gc(major=False))
        await asyncio.wait_for(copied.wait(), 30)
        assert not task.done()
        await read_kept(driver)  # reads go on meanwhile
        await driver.close()
        assert task.done()
        bookie = await driver.start()
        await read_kept(driver)
        result = await bookie.force_gc(major=False)  # finishes what was left
        assert result.skipped == [] and result.logs_compacted
        await read_kept(driver)
        await driver.close()

    asyncio.run(scenario())
    assert not driver.broken


def test_a_full_disk_compacts_within_the_room_it_has_left(
    make_driver: Callable[..., Driver], tmp_path: Path
) -> None:
    """A disk over its usage threshold still has room (the threshold is a fraction of
    it): periodic compaction, major included, goes on within what is free beyond the
    reserved space, and wins the dead bytes back. With no such room it is suspended,
    unless the operator allows it regardless."""

    async def scenario(free_bytes: int, allowed: bool) -> tuple[int, bool, float]:
        data_dir = tmp_path / f"data-{free_bytes}-{allowed}"
        driver = make_driver(
            **settings(
                data_dir=data_dir,
                minor_compaction_interval_ms=50,
                major_compaction_threshold=0.9,
                major_compaction_interval_ms=50,
                compaction_allowed_when_disk_full=allowed,
                reserved_space_bytes=4 * 1024 * 1024,
            )
        )
        bookie = await driver.start()
        await fill(driver)
        bookie.garbage_collect((), set(LEDGERS) - {KEEP})
        await bookie.checkpoint()
        before_bytes = log_bytes(data_dir)
        # The disk checker finds a disk at its threshold, at every check from now on
        # (the timer's, and each new entry log's).
        total = 1 << 50
        checker = bookie._disk_checker
        checker._usage_fn = lambda path: DiskUsage(path, 0.99, free_bytes, total)
        checker.check()
        assert checker.full
        await asyncio.sleep(0)
        before = bookie.compactor.runs
        last_major = bookie.compactor.last_major
        # Every tick of the compaction timer asks which compaction is due, then decides
        # with the disk full: wait for several such decisions (and a run, where due).
        ticks: list[float] = []
        due = bookie.compactor.due

        def counted_due(now: float) -> bool | None:
            ticks.append(now)
            return due(now)

        bookie.compactor.due = counted_due  # type: ignore[method-assign]
        await poll_until_async(
            lambda: len(ticks) >= 5 and (free_bytes < 1 << 30 or bookie.compactor.runs > before),
            timeout_s=30,
            what="five compaction ticks with the disk full",
        )
        await poll_until_async(
            lambda: bookie._compaction is None or bookie._compaction.done(),
            timeout_s=30,
            what="the compaction under way to end",
        )
        runs = bookie.compactor.runs - before
        major_ran = bookie.compactor.last_major != last_major
        shrunk = log_bytes(data_dir) / before_bytes
        await read_kept(driver)
        await driver.close()
        assert not driver.broken
        return runs, major_ran, shrunk

    runs, major_ran, shrunk = asyncio.run(scenario(1 << 40, allowed=False))
    assert runs > 0 and major_ran and shrunk < 0.5, (runs, major_ran, shrunk)
    # Less free than the reserved space: no room, so no copy.
    assert asyncio.run(scenario(1 << 20, allowed=False))[0] == 0
    assert asyncio.run(scenario(1 << 20, allowed=True))[0] > 0


def test_the_pace_holds_compaction_to_its_rate(tmp_path: Path) -> None:
    from test_compaction import KEEP as K
    from test_compaction import checkpoint, compactor, drop_gone, fill, open_storage

    data = tmp_path / "data"
    storage = open_storage(data)
    fill(storage, data)
    drop_gone(storage)
    checkpoint(storage, data)
    rate = 200_000.0

    async def go() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        result = await compactor(storage, data, rate_bytes_per_s=rate).run(major=True)
        return result.bytes_copied, loop.time() - started

    try:
        copied, took = asyncio.run(go())
        assert copied > 40_000 and storage.state(K) is not None
        assert took >= copied / rate * 0.95, (copied, took)
    finally:
        storage.close()
