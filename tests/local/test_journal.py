"""The journal on its own: record format, group-commit writer, rotation, and replay's
handling of torn tails and damage in the middle."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from quorumlog.bookie.entry_log import format_records, parse_records
from quorumlog.bookie.fileops import REAL_FILES, FileOps
from quorumlog.bookie.journal import format as journal_format
from quorumlog.bookie.journal import replay as journal_replay
from quorumlog.bookie.journal import writer as journal_writer
from quorumlog.testing.raw_client import make_entry


def write_journal(
    directory: Path,
    records: list[journal_format.Record],
    file_max_bytes: int = 1 << 20,
    ops: FileOps = REAL_FILES,
) -> int:
    """Write records through the real writer thread; returns how many batches it made."""

    async def scenario() -> int:
        journal = journal_writer.Journal(
            directory,
            1,
            sync=True,
            max_group_wait_ms=1.0,
            max_batch_bytes=1 << 20,
            max_batch_records=1000,
            file_max_bytes=file_max_bytes,
            ops=ops,
        )
        done: list[int] = []
        loop = asyncio.get_running_loop()
        journal.start(loop, lambda dones, size, error: done.append(len(dones)))
        for n, record in enumerate(records):
            journal.append(record, (lambda _: None, n))
        await journal.close()
        assert sum(done) == len(records)
        return journal.batch_count

    return asyncio.run(asyncio.wait_for(scenario(), 20))


def sample_records() -> list[journal_format.Record]:
    blobs = [make_entry(7, i, b"payload %d" % i) for i in range(3)]
    return [
        journal_format.master_key_record(7, b"k" * 20),
        journal_format.add_record(7, format_records(blobs, [len(b) for b in blobs])),
        journal_format.fence_record(7),
        journal_format.lac_record(7, 2),
        journal_format.delete_record(8),
    ]


def scan_all(
    directory: Path, skip: bool = False
) -> tuple[list[tuple[int, bytes]], journal_replay.ScanReport]:
    report = journal_replay.ScanReport()
    records = [
        (kind, bytes(payload))
        for kind, payload in journal_replay.scan(directory, None, skip, report)
    ]
    return records, report


def test_records_round_trip_through_writer_and_scan(tmp_path):
    write_journal(tmp_path, sample_records())
    records, report = scan_all(tmp_path)
    kinds = [kind for kind, _ in records]
    assert kinds == [
        journal_format.RECORD_MASTER_KEY,
        journal_format.RECORD_ADD,
        journal_format.RECORD_FENCE,
        journal_format.RECORD_LAC,
        journal_format.RECORD_DELETE,
    ]
    assert records[0][1] == (7).to_bytes(8, "big") + b"k" * 20
    entries, _ = parse_records(records[1][1][8:], "test")
    assert entries == [make_entry(7, i, b"payload %d" % i) for i in range(3)]
    assert journal_format.decode_ledger_lac(memoryview(records[3][1])) == (7, 2)
    assert journal_format.decode_ledger(memoryview(records[4][1])) == 8
    assert report.records == 5 and report.truncated is None


def test_writer_rotates_files_and_scan_reads_them_in_order(tmp_path):
    records = [journal_format.lac_record(1, n) for n in range(200)]
    write_journal(tmp_path, records, file_max_bytes=1000)
    ids = journal_format.list_journal_ids(tmp_path)
    assert len(ids) >= 6
    for file_id in ids:
        assert (tmp_path / journal_format.journal_file_name(file_id)).stat().st_size <= 1000
    scanned, _ = scan_all(tmp_path)
    assert [journal_format.decode_ledger_lac(memoryview(p))[1] for _, p in scanned] == list(
        range(200)
    )
    assert journal_format.delete_journal_files_before(tmp_path, ids[-1]) == ids[:-1]
    assert journal_format.list_journal_ids(tmp_path) == ids[-1:]


def test_zero_filled_tail_is_cut_quickly(tmp_path, monkeypatch):
    write_journal(tmp_path, sample_records())
    path = tmp_path / journal_format.journal_file_name(1)
    size = path.stat().st_size
    examined: list[int] = []  # offsets where the scan checked for a record
    check_record = journal_format.record_at

    def counted(buf: bytes, view: memoryview, pos: int, end: int) -> tuple[int, str]:
        examined.append(pos)
        return check_record(buf, view, pos, end)

    monkeypatch.setattr(journal_replay, "record_at", counted)
    scan_all(tmp_path)
    checks_without_tail = len(examined)
    with open(path, "ab") as f:
        f.write(bytes(4 << 20))  # a file extended by the filesystem, never written
    examined.clear()
    records, report = scan_all(tmp_path)
    # Quickly: the 4 MiB of zeros cost one record check (then a search for a batch
    # marker), not work per byte.
    assert len(examined) == checks_without_tail + 1
    assert len(records) == 5
    assert report.truncated == [(path, size)]
    assert path.stat().st_size == size


def test_file_with_torn_header_at_the_end_is_removed(tmp_path):
    write_journal(tmp_path, sample_records())
    (tmp_path / journal_format.journal_file_name(2)).write_bytes(b"QLJR")  # created, header torn
    records, _report = scan_all(tmp_path)
    assert len(records) == 5
    assert journal_format.list_journal_ids(tmp_path) == [1]


@pytest.mark.parametrize("version", [b"01", b"03"])
def test_a_journal_in_another_format_is_refused_naming_the_file(tmp_path, version):
    write_journal(tmp_path, sample_records())
    path = tmp_path / journal_format.journal_file_name(journal_format.list_journal_ids(tmp_path)[0])
    data = bytearray(path.read_bytes())
    data[6:8] = version  # the format digits of the magic
    path.write_bytes(bytes(data))
    for skip in (False, True):  # never skipped as damage: nothing is wrong with it
        with pytest.raises(journal_replay.JournalFormatError) as info:
            scan_all(tmp_path, skip=skip)
        assert info.value.path == path
        assert str(path) in info.value.message
        assert f"format {int(version)}" in info.value.message
    assert journal_format.file_header(bytes(data), 1)[1].startswith(
        f"journal format {int(version)}"
    )
    assert path.read_bytes() == bytes(data)  # left as it was


def test_damage_at_the_end_of_a_file_followed_by_a_later_file_is_in_the_middle(tmp_path):
    records = [journal_format.lac_record(1, n) for n in range(100)]
    write_journal(tmp_path, records, file_max_bytes=1000)
    first = tmp_path / journal_format.journal_file_name(
        journal_format.list_journal_ids(tmp_path)[0]
    )
    data = bytearray(first.read_bytes())
    # The last record of the first file, before the manifest that closes its last batch.
    manifest_size = len(
        journal_format.manifest_record(
            bytes(8), journal_format.summarize([journal_format.lac_record(1, 0)])
        )
    )
    size = journal_format.lac_record(1, 0)[1]
    damaged_at = len(data) - manifest_size - size
    data[damaged_at + size - 2] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.raises(journal_replay.JournalCorruptionError) as info:
        scan_all(tmp_path)
    assert info.value.path == first
    assert info.value.offset == damaged_at
    assert "followed by valid records" in info.value.message
    scanned, report = scan_all(tmp_path, skip=True)
    assert len(scanned) == 99  # all but the damaged one
    assert report.skipped == [(first, damaged_at, len(data))]


def test_scan_starts_at_the_mark(tmp_path):
    async def scenario() -> tuple[int, int]:
        journal = journal_writer.Journal(
            tmp_path,
            1,
            sync=True,
            max_group_wait_ms=1.0,
            max_batch_bytes=1 << 20,
            max_batch_records=1000,
            file_max_bytes=1 << 20,
        )
        loop = asyncio.get_running_loop()
        written = asyncio.Event()
        journal.start(loop, lambda dones, size, error: dones and written.set())
        for n in range(4):
            journal.append(journal_format.lac_record(1, n), None)
        journal.append(journal_format.lac_record(1, 4), (lambda _: None, None))
        await written.wait()
        mark = journal.mark  # after the batch that holds the first five records
        for n in range(5, 10):
            journal.append(journal_format.lac_record(1, n), None)
        await journal.close()
        return mark

    mark = asyncio.run(asyncio.wait_for(scenario(), 20))
    report = journal_replay.ScanReport()
    scanned = [
        journal_format.decode_ledger_lac(p)[1]
        for _, p in journal_replay.scan(tmp_path, mark, False, report)
    ]
    assert scanned == list(range(5, 10))


def test_group_commit_writer_batches_a_burst(tmp_path):
    batches = write_journal(tmp_path, [journal_format.lac_record(1, n) for n in range(5000)])
    assert batches <= 50  # 5000 records queued at once: a few batches, not 5000


class ShortWrites(FileOps):
    """Real files, but a list of parts is written only half at a time, as a full disk or
    a signal may make ``writev`` do."""

    def __init__(self) -> None:
        self.part_writes = 0

    def write_parts(self, fd: int, parts: list[bytes]) -> int:
        self.part_writes += 1
        data = b"".join(parts)
        return os.write(fd, data[: len(data) // 2])


@pytest.mark.parametrize("ops", [REAL_FILES, ShortWrites()], ids=["writev", "short"])
def test_large_records_written_as_parts_round_trip(tmp_path, ops):
    """Batches of big entries go to the file as a list of parts (no join); a short
    write of them is finished, so every record is read back whole."""
    blobs = [make_entry(5, i, bytes([i]) * 65536) for i in range(12)]
    records = [journal_format.add_record(5, format_records([blob], [len(blob)])) for blob in blobs]
    write_journal(tmp_path, records, file_max_bytes=1 << 30, ops=ops)
    read, report = scan_all(tmp_path)
    assert [parse_records(payload[8:], "test")[0] for _, payload in read] == [[b] for b in blobs]
    assert report.truncated is None
    if isinstance(ops, ShortWrites):
        assert ops.part_writes >= 1


class NoNewFiles(FileOps):
    """Real files; while ``exhausted``, every open fails for want of descriptors."""

    exhausted = False

    def create_append(self, path: Path) -> int:
        if self.exhausted:
            raise OSError(errno.EMFILE, "Too many open files", str(path))
        return super().create_append(path)

    def fsync_directory(self, directory: Path) -> None:
        if self.exhausted:
            raise OSError(errno.EMFILE, "Too many open files", str(directory))
        super().fsync_directory(directory)


def test_b3_out_of_descriptors_the_journal_goes_on_in_its_file_and_rolls_over_later(
    tmp_path: Path,
) -> None:
    """Was: the rollover's new file (or the open of the directory to sync it) failed
    with EMFILE, and the journal failed for good: every later add IO_ERROR, the
    bookie read-only until a restart."""
    ops = NoNewFiles()

    async def scenario() -> tuple[list[BaseException | None], list[int]]:
        journal = journal_writer.Journal(
            tmp_path,
            1,
            sync=True,
            max_group_wait_ms=0.0,
            max_batch_bytes=1 << 20,
            max_batch_records=1000,
            file_max_bytes=1000,
            ops=ops,
        )
        errors: list[BaseException | None] = []
        files: list[int] = []  # the current file after each batch
        batch_done = asyncio.Event()

        def on_batch(
            dones: list[journal_writer.Done], size: int, error: BaseException | None
        ) -> None:
            errors.append(error)
            batch_done.set()

        journal.start(asyncio.get_running_loop(), on_batch)
        for n in range(60):
            ops.exhausted = 20 <= n < 40
            batch_done.clear()
            journal.append(journal_format.lac_record(1, n), (lambda _: None, n))
            await batch_done.wait()  # one record a batch: each may roll over
            files.append(journal.mark[0])
        await journal.close()
        return errors, files

    errors, files = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert errors == [None] * 60
    assert files[19] > files[0]  # rolled over before
    assert set(files[20:40]) == {files[19]}  # not while out of descriptors
    stretched = tmp_path / journal_format.journal_file_name(files[19])
    assert stretched.stat().st_size > 1000
    assert files[-1] > files[19]  # and again after
    scanned, report = scan_all(tmp_path)
    assert [journal_format.decode_ledger_lac(memoryview(p))[1] for _, p in scanned] == list(
        range(60)
    )
    assert report.truncated is None
