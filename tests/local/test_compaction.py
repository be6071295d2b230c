"""Entry-log compaction on real files: usage accounting, the rewrite, and a crash or a
failed sync at each step (the storage abandoned between steps and opened again)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from quorumlog.bookie.compaction import CompactionResult, CompactionSettings, Compactor
from quorumlog.bookie.entry_log import list_log_ids, log_file_name
from quorumlog.bookie.fileops import FileOps
from quorumlog.bookie.storage import LedgerStorage
from quorumlog.testing.raw_client import make_entry

LOG_BYTES = 64 * 1024
KEEP = 1
GONE = [2, 3, 4, 5, 6]


def open_storage(data_dir: Path, ops: FileOps | None = None) -> LedgerStorage:
    kwargs = {"ops": ops} if ops is not None else {}
    return LedgerStorage(
        data_dir,
        entry_log_max_bytes=LOG_BYTES,
        entry_log_write_buffer_bytes=8 * 1024,
        # Through the page cache: direct writes pad each 8 KiB chunk to a 4 KiB boundary,
        # which in logs this small moves the live fractions these tests set exactly.
        entry_log_direct_io=False,
        read_cache_max_bytes=1 << 20,
        index_map_size_bytes=1 << 26,
        **kwargs,  # type: ignore[arg-type]
    )


def blob(ledger_id: int, entry_id: int) -> bytes:
    return make_entry(ledger_id, entry_id, b"%d/%d;" % (ledger_id, entry_id) + bytes(300))


def put(storage: LedgerStorage, ledger_id: int, entry_ids: range) -> None:
    st = storage.state(ledger_id) or storage.create_state(ledger_id)
    blobs = [blob(ledger_id, e) for e in entry_ids]
    storage.add_entries(st, blobs, [len(b) for b in blobs], list(entry_ids), max(entry_ids))


def checkpoint(storage: LedgerStorage, data_dir: Path) -> None:
    work = storage.capture((1, 24), data_dir / "journal")
    ok = False
    try:
        storage.commit(work)
        ok = True
    finally:
        storage.finish(work, ok)


def crash(storage: LedgerStorage) -> None:
    """Leave the files as a kill -9 would: the entry-log buffer lost, the index as of
    its last commit."""
    for fd in storage.entry_log._fds.values():
        os.close(fd)
    storage.entry_log._fds.clear()
    storage.index.close()


def fill(storage: LedgerStorage, data_dir: Path, rounds: int = 40) -> None:
    """Ledger KEEP interleaved with the GONE ones over several logs (about 1/6 live once
    the others are dropped), then checkpointed."""
    (data_dir / "journal").mkdir(parents=True, exist_ok=True)
    for r in range(rounds):
        for ledger_id in [KEEP, *GONE]:
            put(storage, ledger_id, range(r * 5, r * 5 + 5))
    checkpoint(storage, data_dir)


def drop_gone(storage: LedgerStorage) -> None:
    for ledger_id in GONE:
        storage.drop_ledger(ledger_id, tombstone=False)


def all_kept_read_back(storage: LedgerStorage, rounds: int = 40) -> None:
    st = storage.state(KEEP)
    assert st is not None
    for e in range(rounds * 5):
        assert storage.read_entries(st, e, 1, 1 << 20) == [blob(KEEP, e)], e


def log_bytes(data_dir: Path) -> int:
    logs = data_dir / "entrylogs"
    return sum((logs / log_file_name(i)).stat().st_size for i in list_log_ids(logs))


def compactor(
    storage: LedgerStorage,
    data_dir: Path,
    checkpoint_fn: Callable[[], Awaitable[None]] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    **settings: float,
) -> Compactor:
    async def run_checkpoint() -> None:
        checkpoint(storage, data_dir)

    return Compactor(
        storage,
        CompactionSettings(**{"rate_bytes_per_s": 0.0, **settings}),
        checkpoint_fn or run_checkpoint,
        sleep=sleep,
    )


# ---------------------------------------------------------------- usage


def test_usage_counts_record_bytes_per_log_and_survives_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    storage = open_storage(data)
    fill(storage, data)
    usage = {log: dict(per) for log, per in storage.log_usage.items() if per}
    assert len(usage) > 3
    # What the index says, entry by entry, is what was counted batch by batch.
    assert usage == {log: per for log, per in storage.index.scan_usage().items()}
    drop_gone(storage)
    checkpoint(storage, data)
    live = {log: dict(per) for log, per in storage.log_usage.items() if per}
    assert all(set(per) == {KEEP} for per in live.values())
    storage.close()
    storage = open_storage(data)
    try:
        assert {log: per for log, per in storage.log_usage.items() if per} == live
        c = compactor(storage, data)
        fractions = [u.live_fraction for u in c.usage()]
        assert fractions and all(0.1 < f < 0.25 for f in fractions[:-1])
    finally:
        storage.close()


# ---------------------------------------------------------------- compaction


def test_compaction_rewrites_mostly_dead_logs_and_frees_their_space(tmp_path: Path) -> None:
    data = tmp_path / "data"
    storage = open_storage(data)
    fill(storage, data)
    drop_gone(storage)
    checkpoint(storage, data)
    old_logs = set(storage.log_ledgers) - {storage.entry_log.current_id}
    before = log_bytes(data)

    async def go() -> None:
        c = compactor(storage, data)
        minor = await c.run(major=False)  # 1/6 live is below 0.2
        assert set(minor.logs_compacted) >= old_logs - {max(old_logs)}
        assert minor.entries_copied > 0 and minor.bytes_freed > 0

    asyncio.run(go())
    after = log_bytes(data)
    assert after < before / 3, (before, after)
    present = set(list_log_ids(data / "entrylogs"))
    assert present == set(storage.log_ledgers)  # no old log left behind
    all_kept_read_back(storage)
    storage.close()
    storage = open_storage(data)
    try:
        all_kept_read_back(storage)
        assert storage.index.scan_usage() == {
            log: per for log, per in storage.log_usage.items() if per
        }
    finally:
        storage.close()


def test_logs_above_the_threshold_are_left_alone(tmp_path: Path) -> None:
    data = tmp_path / "data"
    storage = open_storage(data)
    fill(storage, data)
    storage.drop_ledger(2, tombstone=False)  # 5/6 live
    checkpoint(storage, data)
    before = sorted(list_log_ids(data / "entrylogs"))

    async def go() -> None:
        c = compactor(storage, data)
        assert (await c.run(major=True)).logs_compacted == []  # 0.83 > 0.8

    try:
        asyncio.run(go())
        assert sorted(list_log_ids(data / "entrylogs")) == before
    finally:
        storage.close()


def test_within_a_room_logs_go_one_at_a_time_and_those_that_do_not_fit_stay(
    tmp_path: Path,
) -> None:
    """On a full disk compaction copies at most ``room_bytes`` before space comes back:
    each log is committed and deleted before the next is copied, and a log whose live
    bytes do not fit in what is left stays (with the reason)."""
    data = tmp_path / "data"
    storage = open_storage(data)
    fill(storage, data)
    drop_gone(storage)
    checkpoint(storage, data)
    checkpoints: list[int] = []

    async def counted() -> None:
        checkpoint(storage, data)
        checkpoints.append(log_bytes(data))

    try:
        c = compactor(storage, data, counted)
        live = [u.live_bytes for u in c.candidates(0.8)]
        assert len(live) > 2

        async def go(room: int) -> CompactionResult:
            return await c.run(major=True, room_bytes=room)

        kept = asyncio.run(go(min(live) - 1))
        assert kept.logs_compacted == [] and checkpoints == []
        assert kept.skipped and "room" in kept.skipped[0], kept.skipped
        before = log_bytes(data)
        done = asyncio.run(go(max(live)))
        # One checkpoint per log, each giving the old file's space back.
        assert len(done.logs_compacted) == len(live) == len(checkpoints)
        assert checkpoints == sorted(checkpoints, reverse=True) and checkpoints[0] < before
        all_kept_read_back(storage)
    finally:
        storage.close()


def test_entries_not_yet_checkpointed_are_moved_too(tmp_path: Path) -> None:
    data = tmp_path / "data"
    storage = open_storage(data)
    (data / "journal").mkdir(parents=True)
    for r in range(40):
        for ledger_id in [KEEP, *GONE]:
            put(storage, ledger_id, range(r * 5, r * 5 + 5))
    drop_gone(storage)  # no checkpoint yet: KEEP's locations are only in memory

    async def go() -> None:
        result = await compactor(storage, data).run(major=True)
        assert result.logs_compacted

    asyncio.run(go())
    all_kept_read_back(storage)
    crash(storage)
    storage = open_storage(data)
    try:
        all_kept_read_back(storage)
    finally:
        storage.close()


def test_reads_during_compaction_always_find_the_entry(tmp_path: Path) -> None:
    data = tmp_path / "data"
    storage = open_storage(data)
    fill(storage, data)
    drop_gone(storage)
    checkpoint(storage, data)
    st = storage.state(KEEP)
    assert st is not None

    async def go() -> None:
        # Paced so that the copy spans many loop turns, each followed by full reads.
        c = compactor(storage, data, rate_bytes_per_s=400_000.0)
        task = asyncio.create_task(c.run(major=True))
        passes = 0
        while not task.done():
            for e in range(200):
                assert storage.read_entries(st, e, 1, 1 << 20) == [blob(KEEP, e)]
            passes += 1
            await asyncio.sleep(0.002)
        assert (await task).logs_compacted
        assert passes > 3

    try:
        asyncio.run(go())
        all_kept_read_back(storage)
    finally:
        storage.close()


# ---------------------------------------------------------------- crashes


def test_a_crash_after_the_copy_before_the_index_commit_keeps_the_old_logs(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    storage = open_storage(data)
    fill(storage, data)
    drop_gone(storage)
    checkpoint(storage, data)
    old = set(list_log_ids(data / "entrylogs"))

    class Crash(Exception):
        pass

    async def crash_instead() -> None:
        raise Crash  # the process dies where the checkpoint would start

    async def go() -> None:
        with pytest.raises(Crash):
            await compactor(storage, data, crash_instead).run(major=True)

    asyncio.run(go())
    crash(storage)
    assert old <= set(list_log_ids(data / "entrylogs"))
    storage = open_storage(data)
    try:
        all_kept_read_back(storage)
        checkpoint(storage, data)  # logs no index entry names go now
        all_kept_read_back(storage)

        async def again() -> None:
            assert (await compactor(storage, data).run(major=True)).logs_compacted

        asyncio.run(again())
        all_kept_read_back(storage)
    finally:
        storage.close()


def test_a_crash_in_the_middle_of_the_copy_loses_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    storage = open_storage(data)
    fill(storage, data)
    drop_gone(storage)
    checkpoint(storage, data)

    async def go() -> None:
        copied = asyncio.Event()

        async def paced(delay_s: float) -> None:  # the pace waits after every batch copied
            copied.set()
            await asyncio.sleep(delay_s)

        c = compactor(storage, data, sleep=paced, rate_bytes_per_s=200_000.0)
        task = asyncio.create_task(c.run(major=True))
        await asyncio.wait_for(copied.wait(), 30)
        assert not task.done()
        task.cancel()  # the process stops between two batches

    asyncio.run(go())
    crash(storage)
    storage = open_storage(data)
    try:
        all_kept_read_back(storage)
    finally:
        storage.close()


class UnlinkDies(FileOps):
    """The process dies once the index is committed, before any old log is deleted."""

    armed = False

    def unlink(self, path: Path) -> None:
        if self.armed and path.suffix == ".log":
            raise OSError("the process died here")
        super().unlink(path)


def test_a_crash_after_the_index_commit_before_the_delete_finishes_at_start(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    ops = UnlinkDies()
    storage = open_storage(data, ops)
    fill(storage, data)
    drop_gone(storage)
    checkpoint(storage, data)
    ops.armed = True

    async def go() -> None:
        result = await compactor(storage, data).run(major=True)
        assert result.logs_compacted  # committed; only the files remain

    asyncio.run(go())
    released = [i for i in list_log_ids(data / "entrylogs") if i not in storage.index.load_logs()]
    assert released  # on disk, unknown to the index
    crash(storage)
    storage = open_storage(data)
    try:
        all_kept_read_back(storage)
        checkpoint(storage, data)  # the first checkpoint removes them
        assert not set(released) & set(list_log_ids(data / "entrylogs"))
        all_kept_read_back(storage)
    finally:
        storage.close()


class SyncFails(FileOps):
    armed = False

    def fdatasync(self, fd: int) -> None:
        if self.armed:
            raise OSError(5, "Input/output error")
        super().fdatasync(fd)


def test_r14_a_failed_sync_during_compaction_deletes_nothing_and_stops_it(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    ops = SyncFails()
    storage = open_storage(data, ops)
    fill(storage, data)
    drop_gone(storage)
    checkpoint(storage, data)
    before = set(list_log_ids(data / "entrylogs"))
    index_logs = storage.index.load_logs()
    ops.armed = True

    async def checkpoint_may_fail() -> None:
        # The bookie logs it; the failure is sticky.
        with contextlib.suppress(OSError):
            checkpoint(storage, data)

    async def go() -> None:
        c = compactor(storage, data, checkpoint_may_fail)
        first = await c.run(major=True)
        assert first.logs_compacted == [] and first.entries_copied > 0
        assert storage.failure is not None and storage.failure in first.skipped
        ops.armed = False  # a later sync "succeeding" must not be believed
        second = await c.run(major=True)
        assert second.entries_copied == 0 and storage.failure in second.skipped

    asyncio.run(go())
    assert before <= set(list_log_ids(data / "entrylogs"))
    assert storage.index.load_logs() == index_logs  # the index never moved
    all_kept_read_back(storage)
    crash(storage)
    storage = open_storage(data)
    try:
        all_kept_read_back(storage)
    finally:
        storage.close()


# ---------------------------------------------------------------- power loss


def test_a_power_loss_at_any_disk_call_of_a_compaction_loses_nothing() -> None:
    """The power goes in the middle of the 1st, 2nd, ... mutating disk call of a
    compaction (and after it, once it completes): unsynced pages and directory
    entries are kept or lost at random. Whatever survives, every kept entry reads
    back after the start, and a compaction then finishes the job."""
    from quorumlog.testing.sim.disk import PowerLoss, SimDisk

    data = Path("/sim/bookie/data")
    completed = False
    n = 0
    while not completed:
        n += 1
        assert n < 500, "a compaction should make fewer disk calls than this"
        disk = SimDisk(random.Random(n))
        ops = disk.files()
        ops.mkdir(data / "journal")
        storage = open_storage(data, ops)
        fill(storage, data)
        drop_gone(storage)
        checkpoint(storage, data)
        disk.faults.power_loss_in = n
        try:
            asyncio.run(compactor(storage, data).run(major=True))
            completed = True
            disk.power_loss()
        except PowerLoss:
            pass
        storage = open_storage(data, disk.files())
        all_kept_read_back(storage)
        checkpoint(storage, data)  # what the start leaves to the first checkpoint
        all_kept_read_back(storage)
        asyncio.run(compactor(storage, data).run(major=True))
        all_kept_read_back(storage)
        present = set(list_log_ids(data / "entrylogs", storage.ops))
        assert present == set(storage.log_ledgers), n  # nothing half-done is left
        assert all(u.live_fraction >= 0.8 for u in compactor(storage, data).usage()), n
    assert n > 5, n


def test_b7_compaction_copies_nothing_while_an_entry_log_write_waits_to_be_redone(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    storage = open_storage(data)
    fill(storage, data)
    drop_gone(storage)
    checkpoint(storage, data)
    storage.entry_log.write_error = OSError(5, "Input/output error")

    async def go() -> None:
        result = await compactor(storage, data).run(major=False)
        assert result.entries_copied == 0 and not result.logs_compacted
        assert any("entry logs" in why for why in result.skipped)

    try:
        asyncio.run(go())
    finally:
        storage.entry_log.write_error = None
        storage.close()
