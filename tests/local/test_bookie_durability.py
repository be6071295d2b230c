"""Durability: answers only after the journal sync (R2), group commit, replay after a
crash, checkpoints, garbage collection, back-pressure, journal failure, locking."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from functools import partial

import pytest
import support

from quorumlog.bookie.bookie import Bookie, BookieStartError
from quorumlog.bookie.entry_log import list_log_ids
from quorumlog.bookie.journal import format as journal_format
from quorumlog.bookie.journal import writer as journal_writer
from quorumlog.errors import Status
from quorumlog.proto.codec import (
    AddFlag,
    AddRequest,
    DeleteLedgerRequest,
    FenceRequest,
    ReadFlag,
    ReadLacRequest,
    ReadRequest,
    WriteLacRequest,
)
from quorumlog.testing.raw_client import make_entry, master_key

KEY = master_key(b"password")


run = partial(support.run, timeout_s=30)


def blob(ledger_id: int, entry_id: int, size: int = 100) -> bytes:
    payload = (b"%d/%d:" % (ledger_id, entry_id)).ljust(size, b".")
    return make_entry(ledger_id, entry_id, payload, lac=entry_id - 1)


def add(ledger_id: int, blobs: list[bytes]) -> AddRequest:
    return AddRequest(0, ledger_id, KEY, blobs)


class GatedSync:
    """Replaces the journal's fdatasync: blocks until opened, counts calls."""

    def __init__(self, open_: bool = False, delay_s: float = 0.0, fail: bool = False) -> None:
        self.gate = threading.Event()
        if open_:
            self.gate.set()
        self.delay_s = delay_s
        self.fail = fail
        self.calls = 0
        self.entered = threading.Event()

    def __call__(self, fd: int) -> None:
        self.calls += 1
        self.entered.set()
        if not self.gate.wait(10):
            raise AssertionError("sync gate never opened")
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail:
            raise OSError(5, "simulated I/O error")


# ---------------------------------------------------------------- R2, group commit


def test_r2_no_answer_before_the_journal_sync(driver, monkeypatch):
    sync = GatedSync()
    monkeypatch.setattr(journal_writer, "fdatasync", sync)

    async def scenario():
        await driver.start()
        answer = driver.send(add(1, [blob(1, 0)]))
        assert await asyncio.to_thread(sync.entered.wait, 5)  # written, sync in progress
        # A later request that needs no sync is answered: the bookie did everything it
        # does for the add short of the sync, which the gate holds.
        assert (await driver.call(ReadLacRequest(0, 1))).status == Status.OK
        assert not answer.done()  # R2: not durable, not answered
        sync.gate.set()
        assert (await asyncio.wait_for(answer, 5)).status == Status.OK
        await driver.close()

    run(scenario())


def test_r2_fence_and_write_lac_and_delete_are_answered_after_sync(driver, monkeypatch):
    sync = GatedSync()
    monkeypatch.setattr(journal_writer, "fdatasync", sync)

    async def scenario():
        await driver.start()
        answers = [
            driver.send(FenceRequest(0, 2, KEY)),
            driver.send(WriteLacRequest(0, 3, KEY, 7)),
            driver.send(DeleteLedgerRequest(0, 4, KEY)),
            driver.send(ReadRequest(0, 5, 0, 1, flags=1, master_key=KEY)),  # fencing read
        ]
        assert await asyncio.to_thread(sync.entered.wait, 5)
        # A later request that needs no sync is answered: the bookie did everything it
        # does for these requests short of the sync, which the gate holds.
        assert (await driver.call(ReadLacRequest(0, 99))).status == Status.NO_SUCH_LEDGER
        assert not any(a.done() for a in answers)
        sync.gate.set()
        statuses = [(await asyncio.wait_for(a, 5)).status for a in answers]
        assert statuses == [Status.OK, Status.OK, Status.OK, Status.NO_SUCH_ENTRY]
        await driver.close()

    run(scenario())


def test_group_commit_many_adds_few_syncs(driver, monkeypatch):
    sync = GatedSync(open_=True, delay_s=0.002)  # a disk with a 2 ms sync
    monkeypatch.setattr(journal_writer, "fdatasync", sync)
    requests = 2000

    async def scenario():
        await driver.start()
        answers = []
        # Writers arrive in waves, as pipelined clients do.
        for wave in range(20):
            for i in range(requests // 20):
                entry_id = wave * (requests // 20) + i
                answers.append(driver.send(add(6, [blob(6, entry_id)])))
            await asyncio.sleep(0.001)
        results = await asyncio.wait_for(asyncio.gather(*answers), 20)
        assert all(r.status == Status.OK for r in results)
        await driver.close()

    run(scenario())
    assert 1 <= sync.calls <= requests / 10, sync.calls


def test_group_commit_respects_the_batch_record_bound(make_driver, monkeypatch):
    sync = GatedSync()
    monkeypatch.setattr(journal_writer, "fdatasync", sync)
    driver = make_driver(journal_max_batch_records=50)

    async def scenario():
        bookie = await driver.start()
        answers = [driver.send(add(7, [blob(7, i)])) for i in range(500)]
        sync.gate.set()
        results = await asyncio.wait_for(asyncio.gather(*answers), 20)
        assert all(r.status == Status.OK for r in results)
        assert bookie.journal.batch_count >= 500 // 50
        await driver.close()

    run(scenario())
    assert sync.calls >= 10


def test_idle_journal_syncs_at_once(make_driver):
    # A long group wait must not delay a lone add: with nothing else queued, sync now.
    # The bound below is that behaviour (far below the 10-minute group wait), not a
    # latency target: it leaves room for a slow shared disk.
    driver = make_driver(journal_max_group_wait_ms=600_000)

    async def scenario():
        await driver.start()
        loop = asyncio.get_running_loop()
        for i in range(5):
            started = loop.time()
            assert (await driver.call(add(8, [blob(8, i)]), timeout_s=120)).status == Status.OK
            assert loop.time() - started < 60, "a lone add waited for the group window"
        await driver.close()

    run(scenario())


def test_journal_sync_off_answers_without_sync_and_warns(make_driver, caplog):
    driver = make_driver(journal_sync=False)

    async def scenario():
        bookie = await driver.start()
        answers = [driver.send(add(9, [blob(9, i)])) for i in range(100)]
        results = await asyncio.wait_for(asyncio.gather(*answers), 10)
        assert all(r.status == Status.OK for r in results)
        assert bookie.journal.sync_count == 0
        await driver.close()

    with caplog.at_level(logging.WARNING, logger="quorumlog.bookie.bookie"):
        run(scenario())
    assert any("JOURNAL SYNC IS OFF" in r.getMessage() for r in caplog.records)


def test_back_pressure_holds_adds_until_the_journal_drains(make_driver, monkeypatch):
    sync = GatedSync()
    monkeypatch.setattr(journal_writer, "fdatasync", sync)
    driver = make_driver(journal_queue_max_bytes=2_000)

    async def scenario():
        bookie = await driver.start()
        answers = [driver.send(add(10, [blob(10, i)])) for i in range(100)]
        assert bookie.stats()["deferred_adds"] > 50  # held, in order, not journaled yet
        assert bookie.journal.queued_bytes < 3_000
        sync.gate.set()
        results = await asyncio.wait_for(asyncio.gather(*answers), 20)
        assert all(r.status == Status.OK for r in results)
        read = await driver.call(ReadRequest(0, 10, 0, 100))
        assert read.entries == [blob(10, i) for i in range(100)]
        await driver.close()

    run(scenario())


def test_journal_failure_answers_io_error_and_turns_read_only(driver, monkeypatch):
    sync = GatedSync(open_=True, fail=True)
    monkeypatch.setattr(journal_writer, "fdatasync", sync)

    async def scenario():
        bookie = await driver.start()
        changes = []
        bookie.add_read_only_listener(changes.append)
        failed = await driver.call(add(11, [blob(11, 0)]))
        assert failed.status == Status.IO_ERROR
        assert bookie.read_only and changes == [True]
        again = await driver.call(add(11, [blob(11, 1)]))
        assert again.status == Status.IO_ERROR
        assert (await driver.call(FenceRequest(0, 11, KEY))).status == Status.IO_ERROR
        await driver.close()

    run(scenario())


# ---------------------------------------------------------------- crash and replay


def test_r2_replay_after_crash_restores_every_acknowledged_change(driver):
    async def scenario():
        bookie = await driver.start()
        before = [blob(20, i) for i in range(50)]
        assert (await driver.call(add(20, before))).status == Status.OK
        await bookie.checkpoint()  # these are in ledger storage and the index
        after = [blob(20, i) for i in range(50, 120)]
        for i in range(0, len(after), 7):
            assert (await driver.call(add(20, after[i : i + 7]))).status == Status.OK
        await driver.call(add(21, [blob(21, 0), blob(21, 1)]))
        await driver.call(FenceRequest(0, 21, KEY))
        await driver.call(WriteLacRequest(0, 22, KEY, 9))
        await driver.call(add(23, [blob(23, 0)]))
        await driver.call(DeleteLedgerRequest(0, 23, KEY))
        await driver.crash()

        bookie = await driver.start()
        assert bookie.replay_report.records > 0
        read = await driver.call(ReadRequest(0, 20, 0, 200, max_bytes=1 << 22))
        assert read.entries == before + after
        lac = await driver.call(ReadLacRequest(0, 20))
        assert (lac.lac, lac.last_entry_id) == (118, 119)
        assert (await driver.call(add(21, [blob(21, 2)]))).status == Status.FENCED
        assert (await driver.call(ReadLacRequest(0, 22))).lac == 9
        assert (await driver.call(add(23, [blob(23, 1)]))).status == Status.NO_SUCH_LEDGER
        assert bookie.ledger_ids() == {20, 21, 22}
        # Replay is idempotent: a second crash right away changes nothing.
        await driver.crash()
        await driver.start()
        assert (await driver.call(ReadRequest(0, 20, 0, 200, max_bytes=1 << 22))).entries == (
            before + after
        )
        await driver.close()

    run(scenario())


def _last_journal_file(config):
    directory = config.journal_path
    ids = journal_format.list_journal_ids(directory)
    return directory / journal_format.journal_file_name(ids[-1])


def _journal_with_records(driver, ledger_id, count):
    """Crash a bookie after ``count`` acknowledged single-entry adds; returns their blobs."""

    async def scenario():
        await driver.start()
        blobs = [blob(ledger_id, i) for i in range(count)]
        for b in blobs:  # one journal record each
            assert (await driver.call(add(ledger_id, [b]))).status == Status.OK
        await driver.crash()
        return blobs

    return run(scenario())


def test_torn_tail_is_cut_off_and_the_bookie_starts(driver):
    blobs = _journal_with_records(driver, 30, 5)
    path = _last_journal_file(driver.config)
    # Where the next batch would have gone: the end of the whole records, before the
    # zeros written ahead of them (a direct journal's batches end on a block's end).
    good_size = len(path.read_bytes().rstrip(b"\x00"))
    good_size += -good_size % journal_format.PAGE_BYTES
    parts, _, _ = journal_format.add_record(30, b"\x00" * 300)
    torn = b"".join(parts)[:150]  # a write that a crash cut short
    with open(path, "r+b") as f:
        f.seek(good_size)
        f.write(torn)

    async def scenario():
        bookie = await driver.start()
        assert bookie.replay_report.truncated == [(path, good_size)]
        read = await driver.call(ReadRequest(0, 30, 0, 10))
        assert read.entries == blobs
        await driver.close()

    run(scenario())


def test_r17_a_bad_checksum_in_the_last_acknowledged_record_is_unknown_never_absent(driver):
    """The last synced batch's add record loses a bit. The file alone cannot tell that
    from a torn write, but the batch's manifest says which entries it held: the entry is
    answered as an I/O error (unknown, R8), never "no such entry", across restarts, until
    a recovery add writes it again."""
    blobs = _journal_with_records(driver, 31, 5)
    path = _last_journal_file(driver.config)
    data = bytearray(path.read_bytes())
    last_record_size = journal_format.add_record(31, b"x")[1] - 1 + len(blobs[-1]) + 8
    # The last record ends with its checksum, after the last blob (the batch's manifest,
    # and a PAD record when the journal is written directly, follow it).
    last_record_end = data.rfind(blobs[-1]) + len(blobs[-1]) + 4
    data[last_record_end - 2] ^= 0xFF  # inside the last record's checksum
    path.write_bytes(bytes(data))
    cut_at = last_record_end - last_record_size

    async def scenario():
        bookie = await driver.start()
        assert bookie.replay_report.truncated == [(path, cut_at)]
        assert bookie.replay_report.suspect == [(31, 4, 4)]
        # The cut bytes were moved aside, not destroyed.
        aside = path.with_name(f"{path.name}.torn-{cut_at}")
        assert aside.read_bytes() == bytes(data[cut_at:])
        for _ in range(2):  # the suspicion outlives a restart (and the journal file)
            read = await driver.call(ReadRequest(0, 31, 0, 10))
            assert read.status == Status.OK and read.entries == blobs[:4]
            assert (await driver.call(ReadRequest(0, 31, 4))).status == Status.IO_ERROR
            fencing = ReadRequest(0, 31, 4, flags=ReadFlag.FENCE, master_key=KEY)
            assert (await driver.call(fencing)).status == Status.IO_ERROR
            assert (await driver.call(ReadLacRequest(0, 31))).status == Status.IO_ERROR
            await driver.restart()
        # Entries the batch never held are absent as before.
        assert (await driver.call(ReadRequest(0, 31, 5))).status == Status.NO_SUCH_ENTRY
        # Recovery writes the entry again (the ledger was fenced by the fencing read).
        rewrite = AddRequest(0, 31, KEY, [blobs[4]], flags=AddFlag.RECOVERY)
        assert (await driver.call(rewrite)).status == Status.OK
        assert (await driver.call(ReadRequest(0, 31, 4))).entries == blobs[4:]
        lac = await driver.call(ReadLacRequest(0, 31))
        assert (lac.status, lac.lac, lac.last_entry_id) == (Status.OK, 3, 4)
        await driver.restart()
        assert driver.bookie.state(31).suspect is None  # settled for good
        assert not list(driver.config.data_dir.glob("suspect-*"))
        assert (await driver.call(ReadRequest(0, 31, 0, 10))).entries == blobs
        await driver.close()

    run(scenario())


def _flip_bit_in(path, record: bytes, at: int) -> None:
    """Flip one bit of the last copy of ``record`` in the journal file, ``at`` bytes into it."""
    data = bytearray(path.read_bytes())
    start = data.rfind(record)
    assert start > 0, "record not in the journal"
    data[start + at] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("direct_io", [True, False], ids=["direct", "page-cache"])
def test_r17_r7_a_flipped_bit_in_an_acknowledged_fence_keeps_the_ledger_fenced(
    make_driver, direct_io
):
    """The FENCE record of the journal's last synced batch loses one bit: replay must not
    take it for a torn write and bring the ledger back unfenced (issue 21, B1)."""
    driver = make_driver(journal_direct_io=direct_io)

    async def scenario():
        await driver.start()
        assert (await driver.call(add(34, [blob(34, 0)]))).status == Status.OK
        assert (await driver.call(FenceRequest(0, 34, KEY))).status == Status.OK  # synced
        await driver.crash()
        fence = b"".join(journal_format.fence_record(34)[0])
        _flip_bit_in(_last_journal_file(driver.config), fence, 7)  # in the ledger id
        await driver.start()
        late = await driver.call(add(34, [blob(34, 1)]))
        assert late.status == Status.FENCED  # R7: the fence survives the restart
        assert (await driver.call(ReadRequest(0, 34, 0))).entries == [blob(34, 0)]
        await driver.close()

    run(scenario())


def _damage_middle_record(driver, ledger_id):
    blobs = _journal_with_records(driver, ledger_id, 6)
    path = _last_journal_file(driver.config)
    data = bytearray(path.read_bytes())
    at = data.find(b"%d/2:" % ledger_id)  # inside entry 2's record: records 3.. follow
    assert at > 0
    data[at] ^= 0x40
    path.write_bytes(bytes(data))
    return blobs, path


def test_junk_in_the_middle_refuses_to_start_with_a_clear_message(driver):
    _blobs, path = _damage_middle_record(driver, 32)
    with pytest.raises(BookieStartError) as info:
        Bookie.open(driver.config)
    message = str(info.value)
    assert str(path) in message and "offset" in message and "journal_skip_corruption" in message
    assert path.stat().st_size > 0  # nothing was cut


def test_junk_in_the_middle_starts_with_the_skip_flag(make_driver):
    driver = make_driver()
    blobs, _ = _damage_middle_record(driver, 33)
    skipping = make_driver(journal_skip_corruption=True)

    async def scenario():
        bookie = await skipping.start()
        assert bookie.replay_report.skipped
        assert (await skipping.call(ReadRequest(0, 33, 0, 10))).entries == blobs[:2]
        assert (await skipping.call(ReadRequest(0, 33, 3, 10))).entries == blobs[3:]
        assert (await skipping.call(ReadRequest(0, 33, 2))).status == Status.NO_SUCH_ENTRY
        await skipping.close()
        # The start checkpointed past the damage: a normal start works again.
        plain = make_driver()
        await plain.start()
        assert (await plain.call(ReadRequest(0, 33, 3, 10))).entries == blobs[3:]
        await plain.close()

    run(scenario())


# ---------------------------------------------------------------- checkpoints


def test_checkpoint_deletes_old_journal_files_and_data_survives(make_driver):
    driver = make_driver(journal_file_max_bytes=16 * 1024, entry_log_max_bytes=64 * 1024)

    async def scenario():
        bookie = await driver.start()
        blobs = [blob(40, i, size=500) for i in range(400)]
        for i in range(0, 400, 10):
            assert (await driver.call(add(40, blobs[i : i + 10]))).status == Status.OK
        journal_dir = driver.config.journal_path
        assert len(journal_format.list_journal_ids(journal_dir)) > 5  # rotated
        assert len(list_log_ids(driver.config.data_dir / "entrylogs")) > 2
        await bookie.checkpoint()
        assert len(journal_format.list_journal_ids(journal_dir)) == 1  # only the current one
        # After the checkpoint the entries come from entry logs and the index alone.
        await driver.crash()
        await driver.start()
        read = await driver.call(ReadRequest(0, 40, 0, 400, max_bytes=1 << 22))
        assert read.entries == blobs
        await driver.close()
        await driver.start()
        assert (await driver.call(ReadRequest(0, 40, 399))).entries == blobs[399:]
        await driver.close()

    run(scenario())


def test_periodic_checkpoint_runs(make_driver):
    driver = make_driver(checkpoint_interval_ms=20)

    async def scenario():
        bookie = await driver.start()
        await driver.call(add(41, [blob(41, 0)]))
        first = bookie.checkpoints_done
        await support.poll_until_async(
            lambda: bookie.checkpoints_done >= first + 3,
            timeout_s=30,
            what="three periodic checkpoints (every 20 ms)",
        )
        assert bookie.state(41).recent == {}
        assert (await driver.call(ReadRequest(0, 41, 0))).entries == [blob(41, 0)]
        await driver.close()

    run(scenario())


# ---------------------------------------------------------------- garbage collection


def test_garbage_collection_drops_dead_ledgers_and_their_entry_logs(make_driver):
    driver = make_driver(entry_log_max_bytes=32 * 1024)

    async def scenario():
        bookie = await driver.start()
        logs_dir = driver.config.data_dir / "entrylogs"
        # Ledger 50 fills the first logs alone; then 51 and 52 share the later ones.
        for i in range(0, 200, 20):
            await driver.call(add(50, [blob(50, j, size=400) for j in range(i, i + 20)]))
        await driver.call(DeleteLedgerRequest(0, 53, KEY))  # a tombstone: never collected
        for i in range(0, 100, 20):
            await driver.call(add(51, [blob(51, j, size=400) for j in range(i, i + 20)]))
            await driver.call(add(52, [blob(52, j, size=400) for j in range(i, i + 20)]))
        await bookie.checkpoint()
        logs_before = set(list_log_ids(logs_dir))
        held = dict(bookie.storage.log_ledgers)
        only_50 = {log for log, ledgers in held.items() if ledgers == {50}}
        assert only_50
        snapshot = bookie.ledger_ids()
        assert snapshot == {50, 51, 52}
        dropped = bookie.garbage_collect([51, 99], snapshot)
        assert dropped == 2
        assert bookie.ledger_ids() == {51}
        await bookie.checkpoint()
        logs_after = set(list_log_ids(logs_dir))
        assert only_50 <= logs_before - logs_after  # files with only dead ledgers are gone
        assert bookie.storage.index.count_entries(50) == 0
        assert (await driver.call(ReadRequest(0, 50, 0))).status == Status.NO_SUCH_LEDGER
        read = await driver.call(ReadRequest(0, 51, 0, 100, max_bytes=1 << 22))
        assert read.entries == [blob(51, j, size=400) for j in range(100)]
        await driver.restart()
        assert driver.bookie.ledger_ids() == {51}
        assert (await driver.call(AddRequest(0, 53, KEY, [blob(53, 0)]))).status == (
            Status.NO_SUCH_LEDGER
        )
        read = await driver.call(ReadRequest(0, 51, 0, 100, max_bytes=1 << 22))
        assert len(read.entries) == 100
        await driver.close()

    run(scenario())


# ---------------------------------------------------------------- directories


def test_a_second_bookie_on_the_same_directories_is_refused(driver):
    async def scenario():
        await driver.start()
        with pytest.raises(BookieStartError, match="in use by another bookie"):
            Bookie.open(driver.config)
        await driver.close()
        again = Bookie.open(driver.config)  # released on close
        await again.close()

    run(scenario())


def test_bad_settings_refuse_to_start(make_config):
    with pytest.raises(BookieStartError, match="disk usage thresholds"):
        Bookie.open(make_config(disk_usage_threshold=0.5, disk_usage_lwm_threshold=0.8))


def test_journal_in_the_data_directory_itself(make_driver, tmp_path):
    driver = make_driver(journal_dir=tmp_path / "data")

    async def scenario():
        await driver.start()
        await driver.call(add(60, [blob(60, 0)]))
        await driver.crash()
        await driver.start()
        assert (await driver.call(ReadRequest(0, 60, 0))).entries == [blob(60, 0)]
        await driver.close()

    run(scenario())
