"""Bookie storage under disk faults, on real files: damaged journals (S2), entry-log ids
and reads of the wrong record (S9), a lost index (S3, R15), failed syncs (R14, S1) and
failed writes (S5)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shutil
import threading
from pathlib import Path

import pytest

from quorumlog.bookie.bookie import Bookie
from quorumlog.bookie.entry_log import EntryLogger, format_records, list_log_ids, log_file_name
from quorumlog.bookie.errors import BookieStartError
from quorumlog.bookie.fileops import FileOps
from quorumlog.bookie.journal import format as journal_format
from quorumlog.bookie.journal import replay as journal_replay
from quorumlog.bookie.journal import writer as journal_writer
from quorumlog.bookie.storage import LedgerStorage
from quorumlog.errors import BookieIOError, Status
from quorumlog.proto.codec import AddRequest, FenceRequest, ReadRequest
from quorumlog.testing.raw_client import make_entry, master_key

PAGE = 4096
KEY = master_key(b"password")


class StepSync:
    """Replaces the journal's fdatasync: each sync waits until the test lets it go, so the
    test decides exactly which records form each batch."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self.go = threading.Semaphore(0)

    def __call__(self, fd: int) -> None:
        self.entered.release()
        if not self.go.acquire(timeout=10):
            raise AssertionError("sync never released")
        os.fdatasync(fd)


def write_batches(
    directory: Path, monkeypatch: pytest.MonkeyPatch, batches: list[list[journal_format.Record]]
) -> None:
    """Write each list of records as one journal batch (one write, one sync), in order."""
    sync = StepSync()
    monkeypatch.setattr(journal_writer, "fdatasync", sync)

    async def scenario() -> None:
        journal = journal_writer.Journal(
            directory,
            1,
            sync=True,
            max_group_wait_ms=10_000,
            max_batch_bytes=1 << 22,
            max_batch_records=100_000,
            file_max_bytes=1 << 24,
        )
        sizes: list[int] = []
        for record in batches[0]:
            journal.append(record, None)
        journal.start(asyncio.get_running_loop(), lambda dones, size, error: sizes.append(size))
        for batch in batches[1:]:
            assert await asyncio.to_thread(sync.entered.acquire, True, 10)
            for record in batch:  # queued while the writer waits in the previous sync
                journal.append(record, None)
            sync.go.release()
        assert await asyncio.to_thread(sync.entered.acquire, True, 10)
        sync.go.release()
        await journal.close()
        assert sizes == [sum(record[1] for record in batch) for batch in batches]

    asyncio.run(asyncio.wait_for(scenario(), 20))
    monkeypatch.undo()


def scan_all(
    directory: Path, skip: bool = False
) -> tuple[list[tuple[int, bytes]], journal_replay.ScanReport]:
    report = journal_replay.ScanReport()
    records = [
        (kind, bytes(payload))
        for kind, payload in journal_replay.scan(directory, None, skip, report)
    ]
    return records, report


def only_file(directory: Path) -> Path:
    (file_id,) = journal_format.list_journal_ids(directory)
    return directory / journal_format.journal_file_name(file_id)


def record_bytes(record: journal_format.Record) -> bytes:
    return b"".join(record[0])


# ---------------------------------------------------------------- S2: journal replay


def test_s2_replay_never_takes_a_record_from_inside_another_records_payload(tmp_path, monkeypatch):
    # An entry whose payload holds a well-formed DELETE of ledger 99, checksum and all.
    forged = record_bytes(journal_format.delete_record(99))
    entry = make_entry(7, 0, b"x" * 16 + forged + b"y" * 16)
    add = journal_format.add_record(7, format_records([entry], [len(entry)]))
    write_batches(tmp_path, monkeypatch, [[add], [journal_format.lac_record(7, 0)]])
    path = only_file(tmp_path)
    data = bytearray(path.read_bytes())
    at = data.find(record_bytes(add))
    data[at + add[1] - 1] ^= 0xFF  # the add record's own checksum
    path.write_bytes(bytes(data))

    with pytest.raises(journal_replay.JournalCorruptionError):  # acknowledged data is damaged
        scan_all(tmp_path)
    records, report = scan_all(tmp_path, skip=True)
    # Skipping the damage never lands inside the add's payload: no DELETE appears.
    assert [kind for kind, _ in records] == [journal_format.RECORD_LAC]
    assert report.skipped and report.skipped[0][1] == at


def test_s2_out_of_order_pages_of_the_last_batch_are_a_torn_tail(tmp_path, monkeypatch):
    acked = [journal_format.lac_record(1, n) for n in range(10)]
    last = [journal_format.lac_record(2, n) for n in range(500)]  # one batch over several pages
    write_batches(tmp_path, monkeypatch, [acked, last])
    path = only_file(tmp_path)
    data = bytearray(path.read_bytes())
    first = data.find(record_bytes(last[0]))
    size = last[0][1]
    # A crash before the batch's sync: the page after its first one never reached the
    # disk, the pages after it did.
    hole = (first // PAGE + 1) * PAGE
    data[hole : hole + PAGE] = bytes(PAGE)
    assert data.find(record_bytes(last[-1])) > hole + PAGE  # valid records follow the hole
    path.write_bytes(bytes(data))

    records, report = scan_all(tmp_path)
    torn_at = first + (hole - first) // size * size  # the first record the hole touches
    assert report.truncated == [(path, torn_at)]
    lacs = [
        journal_format.decode_ledger_lac(memoryview(p))
        for k, p in records
        if k != journal_format.RECORD_MANIFEST
    ]
    assert lacs == [(1, n) for n in range(10)] + [(2, n) for n in range((hole - first) // size)]
    assert path.stat().st_size == torn_at
    # The batch's manifests (its first and last pages reached the disk) say what it held:
    # the file cannot tell this torn write from a synced batch with damage, so replay is
    # told, and keeps what they prove (here an explicit LAC, safe to keep either way).
    manifests = [
        journal_format.decode_manifest(p) for k, p in records if k == journal_format.RECORD_MANIFEST
    ]
    assert manifests == 2 * [[journal_format.LedgerFacts(2, -1, -1, explicit_lac=499)]]
    assert report.manifests == [(path, torn_at)]


def test_s2_damage_in_an_earlier_file_is_an_error_never_a_torn_tail(tmp_path, monkeypatch):
    write_batches(tmp_path, monkeypatch, [[journal_format.lac_record(1, n) for n in range(10)]])
    first = only_file(tmp_path)
    # The writer moved on to the next file (created, nothing in it yet): everything in
    # the first one was synced, so damage there is acknowledged data.
    os.close(journal_format.create_journal_file(tmp_path, 2))
    data = bytearray(first.read_bytes())
    data[-2] ^= 0xFF  # the last record's checksum
    first.write_bytes(bytes(data))

    with pytest.raises(journal_replay.JournalCorruptionError) as info:
        scan_all(tmp_path)
    assert info.value.path == first
    assert first.stat().st_size == len(data)  # nothing was cut


# ---------------------------------------------------------------- ledger storage helpers


def open_storage(data_dir: Path, ops: FileOps | None = None, **overrides: int) -> LedgerStorage:
    settings = {
        "entry_log_max_bytes": 1 << 20,
        "entry_log_write_buffer_bytes": 1 << 16,
        "read_cache_max_bytes": 1 << 20,
        "index_map_size_bytes": 1 << 26,
    }
    settings.update(overrides)
    if ops is None:
        return LedgerStorage(data_dir, **settings)
    return LedgerStorage(data_dir, ops=ops, **settings)


def put(storage: LedgerStorage, ledger_id: int, entry_ids: range, size: int = 100) -> list[bytes]:
    """Store entries the way an add does; returns their blobs."""
    st = storage.state(ledger_id) or storage.create_state(ledger_id)
    blobs = [make_entry(ledger_id, e, b"%d/%d" % (ledger_id, e) + bytes(size)) for e in entry_ids]
    sizes = [len(b) for b in blobs]
    storage.add_entries(st, blobs, sizes, list(entry_ids), max(entry_ids))
    return blobs


def checkpoint(storage: LedgerStorage, journal_dir: Path, mark: tuple[int, int] = (1, 24)) -> None:
    work = storage.capture(mark, journal_dir)
    ok = False
    try:
        storage.commit(work)
        ok = True
    finally:
        storage.finish(work, ok)


def read(storage: LedgerStorage, ledger_id: int, entry_id: int, count: int = 1) -> list[bytes]:
    st = storage.state(ledger_id)
    assert st is not None
    return storage.read_entries(st, entry_id, count, 1 << 22)


# ---------------------------------------------------------------- S9: entry-log ids, reads


def test_s9_entry_log_ids_are_never_reused_after_a_lost_directory_entry(tmp_path):
    data_dir, journal_dir = tmp_path / "data", tmp_path / "journal"
    journal_dir.mkdir()
    storage = open_storage(data_dir)
    put(storage, 1, range(10))
    checkpoint(storage, journal_dir)  # the index now points into the current log
    used = list_log_ids(data_dir / "entrylogs")
    storage.close()
    # Power loss: the logs' directory entries never reached the disk.
    for log_id in used:
        os.unlink(data_dir / "entrylogs" / log_file_name(log_id))

    storage = open_storage(data_dir)
    try:
        assert storage.entry_log.current_id > max(used)
        put(storage, 2, range(10))  # same sizes: the same offsets in a reused log
        with pytest.raises(BookieIOError):
            read(storage, 1, 0)  # never ledger 2's entry 0
    finally:
        storage.close()


def test_s9_a_new_entry_log_is_durable_in_its_directory(tmp_path, monkeypatch):
    logs_dir = tmp_path / "entrylogs"
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    logger = EntryLogger(logs_dir, max_bytes=4096, write_buffer_bytes=1 << 16)
    try:
        assert synced.count(str(logs_dir)) == 1  # log 1 created
        for n in range(20):  # about 8 KiB: at least one rotation
            logger.append(format_records([make_entry(1, n, bytes(400))], [432]))
        assert logger.current_id > 1
        assert synced.count(str(logs_dir)) == logger.current_id
    finally:
        logger.close()


def test_s9_a_read_never_serves_a_record_of_another_entry(tmp_path):
    storage = open_storage(tmp_path / "data")
    try:
        blobs = put(storage, 1, range(3))
        st = storage.state(1)
        assert st is not None
        # A location that names the wrong record (an index entry gone stale, a reused
        # log): the record is intact, its checksum fine, its ids not the ones asked for.
        st.recent[0] = st.recent[1]
        with pytest.raises(BookieIOError, match="entry 0"):
            read(storage, 1, 0)
        assert read(storage, 1, 1, count=2) == blobs[1:]
        # A later entry that is wrong ends the batch; asked next, it is an error.
        st.recent[2] = st.recent[1]
        assert read(storage, 1, 1, count=2) == blobs[1:2]
        with pytest.raises(BookieIOError):
            read(storage, 1, 2)
    finally:
        storage.close()


# ---------------------------------------------------------------- S3: a lost index (R15)


def log_files(data_dir: Path) -> dict[str, bytes]:
    logs_dir = data_dir / "entrylogs"
    return {p.name: p.read_bytes() for p in sorted(logs_dir.iterdir())}


def test_s3_a_lost_index_beside_entry_logs_refuses_to_start_and_removes_nothing(tmp_path):
    data_dir, journal_dir = tmp_path / "data", tmp_path / "journal"
    journal_dir.mkdir()
    storage = open_storage(data_dir)
    put(storage, 1, range(10))
    checkpoint(storage, journal_dir)
    storage.close()
    before = log_files(data_dir)
    (data_dir / "index" / "data.mdb").unlink()  # removed by hand, or never restored

    with pytest.raises(BookieIOError) as info:
        open_storage(data_dir)
    message = info.value.message
    assert str(data_dir / "index") in message and "checkpoint mark" in message
    assert "entrylogs" in message
    assert log_files(data_dir) == before  # not one log unlinked


def test_s3_a_bookie_whose_index_directory_is_gone_refuses_to_start(make_driver):
    driver = make_driver()
    data_dir = driver.config.data_dir
    blobs = [make_entry(5, e, b"acked %d" % e) for e in range(3)]

    async def write() -> None:
        await driver.start()
        assert (await driver.call(AddRequest(0, 5, KEY, blobs))).status == Status.OK
        await driver.close()

    asyncio.run(asyncio.wait_for(write(), 30))
    before = log_files(data_dir)
    shutil.rmtree(data_dir / "index")  # a mount that is not there: an empty path
    with pytest.raises(BookieStartError, match="checkpoint mark") as info:
        Bookie.open(driver.config)
    assert str(data_dir / "index") in str(info.value)
    assert log_files(data_dir) == before


def test_s3_a_lost_index_with_only_the_journal_left_refuses_to_start(make_driver):
    # A ledger fenced here and holding no entries: its state lives in the index alone
    # once checkpoints removed the first journal files.
    driver = make_driver()

    async def fence() -> None:
        await driver.start()
        assert (await driver.call(FenceRequest(0, 6, KEY))).status == Status.OK
        await driver.restart()
        await driver.close()

    asyncio.run(asyncio.wait_for(fence(), 30))
    (driver.config.data_dir / "index" / "data.mdb").unlink()
    with pytest.raises(BookieStartError, match="checkpoint mark"):
        Bookie.open(driver.config)  # rather than forget the fence (R7)


def test_s3_a_missing_journal_file_named_by_the_mark_refuses_to_start(make_driver):
    driver = make_driver()
    blobs = [make_entry(7, 0, b"acked")]

    async def write() -> None:
        await driver.start()
        assert (await driver.call(AddRequest(0, 7, KEY, blobs))).status == Status.OK
        await driver.crash()  # the entry is in the journal only

    asyncio.run(asyncio.wait_for(write(), 30))
    journal_dir = driver.config.journal_path
    for file_id in journal_format.list_journal_ids(journal_dir):
        (journal_dir / journal_format.journal_file_name(file_id)).unlink()
    with pytest.raises(BookieStartError, match="missing") as info:
        Bookie.open(driver.config)  # rather than answer "no such entry" for entry 7/0
    assert str(journal_dir) in str(info.value)


# ---------------------------------------------------------------- S1: failed syncs (R14)


class FaultyFiles(FileOps):
    """Real files, except the faults a test asks for: the next ``fail_syncs`` fdatasyncs
    and the next ``fail_writes`` pwrites fail with EIO / ENOSPC (once each: the kernel
    reports a writeback error once, then the pages are clean and gone)."""

    def __init__(self) -> None:
        self.fail_syncs = 0
        self.fail_writes = 0
        self.syncs = 0

    def fdatasync(self, fd: int) -> None:
        self.syncs += 1
        if self.fail_syncs:
            self.fail_syncs -= 1
            raise OSError(5, "Input/output error (simulated writeback error)")
        super().fdatasync(fd)

    def pwrite(self, fd: int, data: memoryview, offset: int) -> int:
        if self.fail_writes:
            self.fail_writes -= 1
            raise OSError(28, "No space left on device (simulated)")
        return super().pwrite(fd, data, offset)


def journal_files(journal_dir: Path, *ids: int) -> None:
    for file_id in ids:
        os.close(journal_format.create_journal_file(journal_dir, file_id))


def test_r14_failed_entry_log_sync_is_sticky(tmp_path):
    data_dir, journal_dir = tmp_path / "data", tmp_path / "journal"
    journal_dir.mkdir()
    journal_files(journal_dir, 1, 2, 3)
    files = FaultyFiles()
    storage = open_storage(data_dir, files)
    try:
        checkpoint(storage, journal_dir, mark=(1, 24))
        blobs = put(storage, 1, range(20))
        files.fail_syncs = 1
        with pytest.raises(OSError):
            checkpoint(storage, journal_dir, mark=(2, 24))
        # The same descriptor would sync fine now, though the pages may be gone: the
        # journal holds the only durable copy, so no checkpoint may pass the failure.
        with pytest.raises(OSError, match="sync"):
            checkpoint(storage, journal_dir, mark=(3, 24))
        assert storage.index.load_mark() == (1, 24)
        assert journal_format.list_journal_ids(journal_dir) == [1, 2, 3]
        assert storage.failure is not None and "sync" in storage.failure
        assert read(storage, 1, 0, count=20) == blobs  # reads still work
    finally:
        storage.close()


async def wait_until(condition, timeout_s: float = 10) -> None:
    """Wait for ``condition()`` on the running loop (the event, not a fixed sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def fail_once(
    monkeypatch: pytest.MonkeyPatch, name: str, error: OSError, files_in: str = "entrylogs"
) -> list[int]:
    """Make ``os.<name>`` fail once on a file in a directory named ``files_in`` (the entry
    logs': the journal writes through FileOps too, and binds its own fdatasync); returns
    the list of calls on such files."""
    real = getattr(os, name)
    calls: list[int] = []

    def call(fd: int, *args: object) -> object:
        if f"/{files_in}/" in os.readlink(f"/proc/self/fd/{fd}"):
            calls.append(fd)
            if len(calls) == 1:
                raise error
        return real(fd, *args)

    monkeypatch.setattr(os, name, call)
    return calls


def zero_entry_logs(data_dir: Path) -> None:
    """What the disk holds after a lost writeback: the pages never arrived."""
    for path in (data_dir / "entrylogs").iterdir():
        size = path.stat().st_size
        with open(path, "r+b") as f:
            f.seek(24)
            f.write(bytes(max(0, size - 24)))


def test_r14_failed_entry_log_sync_turns_the_bookie_read_only_and_keeps_the_journal(
    make_driver, monkeypatch
):
    driver = make_driver()
    blobs = [make_entry(8, e, b"acked %d" % e) for e in range(20)]

    async def scenario() -> None:
        bookie = await driver.start()
        changes: list[bool] = []
        bookie.add_read_only_listener(changes.append)
        assert (await driver.call(AddRequest(0, 8, KEY, blobs))).status == Status.OK
        fail_once(monkeypatch, "fdatasync", OSError(5, "Input/output error (simulated)"))
        await bookie.checkpoint()  # fails
        assert bookie.read_only and changes == [True]
        assert "sync" in (bookie.read_only_reason or "")
        refused = await driver.call(AddRequest(0, 8, KEY, [make_entry(8, 20, b"late")]))
        assert refused.status == Status.READ_ONLY
        zero_entry_logs(driver.config.data_dir)  # the failed writeback lost the pages
        await bookie.checkpoint()  # the retry would succeed: it must not pass
        await driver.close()  # nor may the checkpoint of a close; the close itself works
        monkeypatch.undo()
        bookie = await driver.start()  # replays the journal into a new log
        read = await driver.call(ReadRequest(0, 8, 0, 20, max_bytes=1 << 20))
        assert read.status == Status.OK and read.entries == blobs
        assert not bookie.read_only
        await driver.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


# ---------------------------------------------------------------- S5: failed writes


def test_s5_a_failed_synchronous_entry_log_write_keeps_entries_readable(tmp_path):
    data_dir, journal_dir = tmp_path / "data", tmp_path / "journal"
    journal_dir.mkdir()
    files = FaultyFiles()
    # No writer thread (as during replay): a full buffer is written on the spot.
    storage = open_storage(data_dir, files, entry_log_write_buffer_bytes=4096)
    try:
        blobs = put(storage, 1, range(10))  # buffered, acknowledged in a bookie
        files.fail_writes = 1
        blobs += put(storage, 1, range(10, 40))  # fills the buffer: its write fails
        assert storage.write_failure is not None and "No space" in storage.write_failure
        assert read(storage, 1, 0, count=40) == blobs  # still served, from memory
        checkpoint(storage, journal_dir)  # writes them again, then syncs
        assert storage.write_failure is None
    finally:
        storage.close()
    storage = open_storage(data_dir)
    try:
        assert read(storage, 1, 0, count=40) == blobs  # from the file
    finally:
        storage.close()


def test_s5_an_entry_log_write_error_is_retried_by_the_next_checkpoint(tmp_path):
    data_dir, journal_dir = tmp_path / "data", tmp_path / "journal"
    journal_dir.mkdir()
    journal_files(journal_dir, 1, 2, 3)
    files = FaultyFiles()
    storage = open_storage(data_dir, files, entry_log_write_buffer_bytes=4096)
    executor = concurrent.futures.ThreadPoolExecutor(1)

    async def scenario() -> list[bytes]:
        loop = asyncio.get_running_loop()
        storage.entry_log.writer = lambda fn, *args: loop.run_in_executor(executor, fn, *args)
        files.fail_writes = 1
        blobs = put(storage, 1, range(40))  # a full buffer goes to the worker, which fails
        await loop.run_in_executor(executor, lambda: None)
        await asyncio.sleep(0)  # the failed write's callback
        assert read(storage, 1, 0, count=40) == blobs

        async def checkpoint_now(mark: tuple[int, int]) -> None:
            work = storage.capture(mark, journal_dir)
            ok = False
            try:
                await loop.run_in_executor(executor, storage.commit, work)
                ok = True
            finally:
                storage.finish(work, ok)

        await checkpoint_now((2, 24))  # the failed write is done again first
        assert storage.write_failure is None
        assert journal_format.list_journal_ids(journal_dir) == [2, 3]
        blobs += put(storage, 1, range(40, 80))
        await checkpoint_now((3, 24))
        return blobs

    try:
        blobs = asyncio.run(asyncio.wait_for(scenario(), 20))
    finally:
        executor.shutdown()
        storage.close()
    storage = open_storage(data_dir)
    try:
        assert read(storage, 1, 0, count=80) == blobs
    finally:
        storage.close()


def test_s5_an_entry_log_write_error_turns_read_only_until_a_checkpoint_writes_it_again(
    make_driver, monkeypatch
):
    driver = make_driver(entry_log_write_buffer_bytes=4096)
    blobs = [make_entry(9, e, bytes(300)) for e in range(200)]  # about 66 KiB

    async def scenario() -> None:
        bookie = await driver.start()
        changes: list[bool] = []
        bookie.add_read_only_listener(changes.append)
        calls = fail_once(monkeypatch, "pwrite", OSError(28, "No space left on device"))
        acked: list[bytes] = []
        for e in range(0, 200, 10):  # full buffers go to the worker; the first write fails
            answer = await driver.call(AddRequest(0, 9, KEY, blobs[e : e + 10]))
            if answer.status != Status.OK:
                assert answer.status == Status.READ_ONLY  # the in-memory copy stops growing
                break
            acked += blobs[e : e + 10]
        await wait_until(lambda: bool(calls) and bookie.read_only)
        assert acked and changes == [True]
        assert "write" in (bookie.read_only_reason or "")
        read = await driver.call(ReadRequest(0, 9, 0, 200, max_bytes=1 << 20))
        assert read.entries == acked  # the failed chunk is served from memory
        await bookie.checkpoint()  # writes the chunk again, syncs, commits
        assert bookie.read_only  # B7: writable again only after clean checks in a row
        await bookie.checkpoint()
        assert not bookie.read_only and changes == [True, False]
        assert bookie.read_only_reason is None
        more = [make_entry(9, len(acked), b"writable again")]
        assert (await driver.call(AddRequest(0, 9, KEY, more))).status == Status.OK
        await driver.crash()
        monkeypatch.undo()
        await driver.start()
        read = await driver.call(ReadRequest(0, 9, 0, 200, max_bytes=1 << 20))
        assert read.entries == acked + more
        await driver.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_s5_the_checkpoint_timer_survives_a_failed_checkpoint(make_driver, monkeypatch):
    driver = make_driver(checkpoint_interval_ms=10)

    async def scenario() -> None:
        bookie = await driver.start()
        real_capture = bookie.storage.capture
        failures: list[int] = []

        def capture(*args: object) -> object:
            if not failures:
                failures.append(1)
                raise MemoryError("simulated")
            return real_capture(*args)

        monkeypatch.setattr(bookie.storage, "capture", capture)
        await wait_until(lambda: bool(failures))
        done = bookie.checkpoints_done
        await wait_until(lambda: bookie.checkpoints_done >= done + 2, timeout_s=5)
        await driver.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))
