"""Bookie storage under disk faults, on real files: damaged journals (S2), entry-log ids
and reads of the wrong record (S9), a lost index (S3, R15), failed syncs (R14, S1) and
failed writes (S5)."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from quorumlog.bookie import journal as jm
from quorumlog.bookie.entry_log import format_records
from quorumlog.testing.raw_client import make_entry

PAGE = 4096


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
    directory: Path, monkeypatch: pytest.MonkeyPatch, batches: list[list[jm.Record]]
) -> None:
    """Write each list of records as one journal batch (one write, one sync), in order."""
    sync = StepSync()
    monkeypatch.setattr(jm, "fdatasync", sync)

    async def scenario() -> None:
        journal = jm.Journal(
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
        assert sizes == [sum(size for _, size in batch) for batch in batches]

    asyncio.run(asyncio.wait_for(scenario(), 20))
    monkeypatch.undo()


def scan_all(directory: Path, skip: bool = False) -> tuple[list[tuple[int, bytes]], jm.ScanReport]:
    report = jm.ScanReport()
    records = [(kind, bytes(payload)) for kind, payload in jm.scan(directory, None, skip, report)]
    return records, report


def only_file(directory: Path) -> Path:
    (file_id,) = jm.list_journal_ids(directory)
    return directory / jm.journal_file_name(file_id)


def record_bytes(record: jm.Record) -> bytes:
    return b"".join(record[0])


# ---------------------------------------------------------------- S2: journal replay


def test_s2_replay_never_takes_a_record_from_inside_another_records_payload(tmp_path, monkeypatch):
    # An entry whose payload holds a well-formed DELETE of ledger 99, checksum and all.
    forged = record_bytes(jm.delete_record(99))
    entry = make_entry(7, 0, b"x" * 16 + forged + b"y" * 16)
    add = jm.add_record(7, format_records([entry], [len(entry)]))
    write_batches(tmp_path, monkeypatch, [[add], [jm.lac_record(7, 0)]])
    path = only_file(tmp_path)
    data = bytearray(path.read_bytes())
    at = data.find(record_bytes(add))
    data[at + add[1] - 1] ^= 0xFF  # the add record's own checksum
    path.write_bytes(bytes(data))

    with pytest.raises(jm.JournalCorruptionError):  # acknowledged data is damaged
        scan_all(tmp_path)
    records, report = scan_all(tmp_path, skip=True)
    # Skipping the damage never lands inside the add's payload: no DELETE appears.
    assert [kind for kind, _ in records] == [jm.RECORD_LAC]
    assert report.skipped and report.skipped[0][1] == at


def test_s2_out_of_order_pages_of_the_last_batch_are_a_torn_tail(tmp_path, monkeypatch):
    acked = [jm.lac_record(1, n) for n in range(10)]
    last = [jm.lac_record(2, n) for n in range(500)]  # one batch over several pages
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
    lacs = [jm.decode_ledger_lac(memoryview(p)) for _, p in records]
    assert lacs == [(1, n) for n in range(10)] + [(2, n) for n in range((hole - first) // size)]
    assert path.stat().st_size == torn_at


def test_s2_damage_in_an_earlier_file_is_an_error_never_a_torn_tail(tmp_path, monkeypatch):
    write_batches(tmp_path, monkeypatch, [[jm.lac_record(1, n) for n in range(10)]])
    first = only_file(tmp_path)
    # The writer moved on to the next file (created, nothing in it yet): everything in
    # the first one was synced, so damage there is acknowledged data.
    os.close(jm.create_journal_file(tmp_path, 2))
    data = bytearray(first.read_bytes())
    data[-2] ^= 0xFF  # the last record's checksum
    first.write_bytes(bytes(data))

    with pytest.raises(jm.JournalCorruptionError) as info:
        scan_all(tmp_path)
    assert info.value.path == first
    assert first.stat().st_size == len(data)  # nothing was cut
