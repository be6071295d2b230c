"""The journal and the entry log drop their written pages from the page cache: only pages
that are clean (synced, or behind the entry log's cached window), never a byte that is
not yet written, and a failed drop is only a warning."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from quorumlog.bookie import entry_log as em
from quorumlog.bookie.entry_log import EntryLogger, format_records
from quorumlog.bookie.fileops import FileOps
from quorumlog.bookie.journal import format as journal_format
from quorumlog.bookie.journal import writer as journal_writer


class RecordingFiles(FileOps):
    """Real files; notes each drop and checks it against what was synced or written."""

    def __init__(self, fail_drops: bool = False) -> None:
        self.fail_drops = fail_drops
        self.drops: list[tuple[int, int, int]] = []  # fd, offset, length
        self.synced_size: dict[int, int] = {}
        self.written_end: dict[int, int] = {}
        self.problems: list[str] = []

    def pwrite(self, fd: int, data: memoryview, offset: int) -> int:
        written = super().pwrite(fd, data, offset)
        self.written_end[fd] = max(self.written_end.get(fd, 0), offset + written)
        return written

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        self.synced_size[fd] = os.fstat(fd).st_size

    def drop_cached(self, fd: int, offset: int, length: int) -> None:
        self.drops.append((fd, offset, length))
        if self.fail_drops:
            raise OSError(22, "Invalid argument (test)")
        super().drop_cached(fd, offset, length)


def _write_journal(directory: Path, ops: RecordingFiles, records: int, **options: bool) -> int:
    """Journal ``records`` LAC records one batch at a time; the file's size at the end."""

    directory.mkdir(exist_ok=True)

    async def scenario() -> int:
        journal = journal_writer.Journal(
            directory,
            1,
            sync=options.get("sync", True),
            max_group_wait_ms=0.0,
            max_batch_bytes=1 << 20,
            max_batch_records=1000,
            file_max_bytes=1 << 30,
            remove_pages_from_cache=options.get("remove", True),
            ops=ops,
        )
        loop = asyncio.get_running_loop()
        confirmed = asyncio.Queue[None]()
        journal.start(loop, lambda dones, size, error: [confirmed.put_nowait(None) for _ in dones])
        for n in range(records):
            journal.append(journal_format.lac_record(1, n), (lambda _: None, n))
            await confirmed.get()  # one batch each: many syncs
        size = journal.mark[1]
        await journal.close()
        assert journal.failed is None
        return size

    return asyncio.run(asyncio.wait_for(scenario(), 30))


def test_journal_drops_only_synced_pages_once_a_step_has_gathered(tmp_path, monkeypatch):
    monkeypatch.setattr(journal_writer, "DROP_CACHE_STEP_BYTES", 8192)
    ops = RecordingFiles()
    size = _write_journal(tmp_path, ops, 2000)
    assert ops.drops, "no page was dropped"
    ends = []
    for fd, offset, length in ops.drops:
        assert length >= 8192 and offset % 4096 == 0
        assert offset + length <= ops.synced_size[fd]  # never past what was synced
        ends.append(offset + length)
    assert ends == sorted(ends)  # each drop goes on from where the last one stopped
    assert ends[-1] > size - 8192 - 4096  # and they keep up with the file
    assert len(ops.drops) <= size // 8192  # one per step, not one per sync (2,000)


def test_journal_keeps_its_pages_when_told_or_when_it_does_not_sync(tmp_path):
    kept = RecordingFiles()
    _write_journal(tmp_path / "kept", kept, 200, remove=False)
    unsynced = RecordingFiles()
    _write_journal(tmp_path / "unsynced", unsynced, 200, sync=False)
    assert kept.drops == [] and unsynced.drops == []


def test_a_journal_whose_drops_fail_keeps_confirming_and_stops_asking(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(journal_writer, "DROP_CACHE_STEP_BYTES", 4096)
    ops = RecordingFiles(fail_drops=True)
    _write_journal(tmp_path, ops, 1000)  # every add confirmed, or it would time out
    assert len(ops.drops) == 1
    assert "dropping cached pages failed" in caplog.text


WINDOW_BYTES = 64 * 1024
STEP_BYTES = 16 * 1024


def _new_logger(
    directory: Path, ops: RecordingFiles, window_bytes: int = WINDOW_BYTES, max_bytes: int = 1 << 30
) -> EntryLogger:
    """An entry log of 4 KiB write buffers (written at once: no worker thread), through
    the page cache (direct writes leave nothing in it to drop)."""
    return EntryLogger(
        directory,
        max_bytes=max_bytes,
        write_buffer_bytes=4096,
        page_cache_max_bytes=window_bytes,
        direct_io=False,
        ops=ops,
    )


def _fill_log(logger: EntryLogger, count: int) -> list[tuple[int, int, bytes]]:
    where = []
    for n in range(count):
        blob = bytes([n % 251]) * 1000
        log_id, offset = logger.append(format_records([blob], [len(blob)]))
        where.append((log_id, offset, blob))
    return where


def test_entry_log_drops_written_pages_behind_its_window_and_reads_them_from_the_file(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(em, "_DROP_STEP_BYTES", STEP_BYTES)
    ops = RecordingFiles()
    logger = _new_logger(tmp_path, ops)
    try:
        where = _fill_log(logger, 600)  # about 600 KB, written 4 KiB at a time
        assert ops.drops, "no page was dropped"
        for fd, offset, length in ops.drops:
            assert length > 0 and offset + length <= ops.written_end[fd] - WINDOW_BYTES
        logger.flush()
        logger.sync(logger.take_unsynced())
        fd, offset, length = ops.drops[-1]  # after the sync: everything behind the window
        assert (offset, length) == (0, ops.written_end[fd] - WINDOW_BYTES)
        for log_id, offset, blob in where:
            assert logger.read(log_id, offset, len(blob)) == blob
    finally:
        logger.close()


def test_a_rotated_entry_log_is_dropped_whole_once_synced(tmp_path, monkeypatch):
    monkeypatch.setattr(em, "_DROP_STEP_BYTES", STEP_BYTES)
    ops = RecordingFiles()
    logger = _new_logger(tmp_path, ops, max_bytes=200_000)
    try:
        first = logger.current_id
        where = _fill_log(logger, 300)  # past max_bytes: a second log
        assert logger.current_id != first
        logger.sync(logger.take_unsynced())
        first_fd = logger._fds[first]
        assert ops.synced_size[first_fd] > 0
        assert (first_fd, 0, 0) in ops.drops  # the whole file (length 0: to its end)
        for log_id, offset, blob in where:
            assert logger.read(log_id, offset, len(blob)) == blob
    finally:
        logger.close()


@pytest.mark.parametrize("window_bytes", [0, WINDOW_BYTES])
def test_entry_log_drops_that_fail_or_are_off_change_nothing_else(
    tmp_path, monkeypatch, window_bytes
):
    monkeypatch.setattr(em, "_DROP_STEP_BYTES", STEP_BYTES)
    ops = RecordingFiles(fail_drops=True)
    logger = _new_logger(tmp_path, ops, window_bytes)
    try:
        where = _fill_log(logger, 300)
        logger.sync(logger.take_unsynced())
        assert logger.write_error is None and logger.sync_error is None
        assert bool(ops.drops) == bool(window_bytes)
        for log_id, offset, blob in where:
            assert logger.read(log_id, offset, len(blob)) == blob
    finally:
        logger.close()
