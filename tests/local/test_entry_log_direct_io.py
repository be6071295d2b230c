"""Entry logs written around the page cache (O_DIRECT): every chunk starts and ends on a
block boundary (padding records fill the gap), every record reads back from memory and
from its file, and where the filesystem has no direct I/O the log falls back to the
page cache with a warning."""

from __future__ import annotations

import asyncio
import errno
import logging
import random
from pathlib import Path

import pytest
from support import DirectRecordingFiles, append_blobs, poll_until_async

from quorumlog.bookie.entry_log import (
    DIRECT_IO_ALIGNMENT,
    LOG_HEADER_SIZE,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    EntryLogger,
    format_records,
)
from quorumlog.bookie.storage import LedgerStorage
from quorumlog.errors import BookieIOError
from quorumlog.testing.sim.disk import SimDisk, SimFiles

# Sizes that leave every remainder before a block boundary, 1-7 bytes (too few for a
# padding record's header) among them, and records larger than a write buffer.
SIZES = [100, 3000, 4081, 4087, 1, 10_000, 4095, 500, 65_536, 7, 9000] * 4


def _append_all(logger: EntryLogger) -> list[tuple[int, int, bytes]]:
    return append_blobs(logger, SIZES, flush_every=5)


def _scan(path: Path) -> list[tuple[int, bytes]]:
    """Every record of a log file from its header to its end, ``(offset, blob)``."""
    data = path.read_bytes()
    out, position = [], LOG_HEADER_SIZE
    while position < len(data):
        size, _ = RECORD_HEADER.unpack_from(data, position)
        start = position + RECORD_HEADER_SIZE
        assert start + size <= len(data), f"record at {position} runs past the file's end"
        out.append((position, data[start : start + size]))
        position = start + size
    return out


def _check_log_files(tmp_path: Path, where: list[tuple[int, int, bytes]]) -> None:
    by_offset = {(log_id, offset): blob for log_id, offset, blob in where}
    for log_id in sorted({log_id for log_id, _, _ in where}):
        path = tmp_path / f"{log_id:08x}.log"
        assert path.stat().st_size % DIRECT_IO_ALIGNMENT == 0
        for offset, blob in _scan(path):
            if (log_id, offset) in by_offset:
                assert blob == by_offset.pop((log_id, offset))
            else:  # padding: zeros, shorter than a block and its header
                assert blob == bytes(len(blob))
                assert len(blob) < DIRECT_IO_ALIGNMENT
    assert not by_offset, f"records missing from their files: {sorted(by_offset)[:5]}"


def test_direct_chunks_are_block_aligned_and_every_record_reads_back(tmp_path: Path) -> None:
    ops = DirectRecordingFiles()
    logger = EntryLogger(tmp_path, max_bytes=256 * 1024, write_buffer_bytes=16 * 1024, ops=ops)
    try:
        assert logger.direct_io
        where = _append_all(logger)
        assert len({log_id for log_id, _, _ in where}) > 1  # the logs rotated
        assert ops.direct_writes, "nothing was written through a direct descriptor"
        for offset, length in ops.direct_writes:
            assert offset % DIRECT_IO_ALIGNMENT == 0 and length % DIRECT_IO_ALIGNMENT == 0
        for log_id, offset, blob in where:
            assert logger.read(log_id, offset, len(blob)) == blob  # from the files now
        _check_log_files(tmp_path, where)
    finally:
        logger.close()


def test_direct_chunks_written_by_a_worker_read_back_during_and_after(tmp_path: Path) -> None:
    async def run() -> list[tuple[int, int, bytes]]:
        loop = asyncio.get_running_loop()
        logger = EntryLogger(tmp_path, max_bytes=1 << 20, write_buffer_bytes=8 * 1024)
        logger.writer = lambda job, *args: loop.run_in_executor(None, job, *args)
        try:
            where = []
            for _ in range(3):  # later rounds fill buffers given back by earlier ones
                where += _append_all(logger)
                await poll_until_async(
                    lambda: logger._in_flight == 0, timeout_s=30, what="chunks written"
                )
                for log_id, offset, blob in where:
                    assert logger.read(log_id, offset, len(blob)) == blob
            assert logger.write_error is None
            logger.sync(logger.take_unsynced())
            return where
        finally:
            logger.writer = None
            logger.close()

    _check_log_files(tmp_path, asyncio.run(run()))


def test_without_direct_io_the_log_warns_and_writes_through_the_page_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    logger = EntryLogger(
        tmp_path,
        max_bytes=1 << 20,
        write_buffer_bytes=8 * 1024,
        ops=DirectRecordingFiles(direct=False),
    )
    try:
        assert not logger.direct_io
        assert "direct I/O is not available" in caplog.text
        where = _append_all(logger)
        for log_id, offset, blob in where:
            assert logger.read(log_id, offset, len(blob)) == blob
        size = (tmp_path / f"{logger.current_id:08x}.log").stat().st_size
        assert size == logger.end_offset  # no padding through the page cache
    finally:
        logger.close()


def test_simulated_direct_descriptors_refuse_unaligned_writes() -> None:
    ops = SimFiles(SimDisk(random.Random(1)))
    ops.mkdir(Path("/data"))
    ops.close(ops.create(Path("/data/f")))
    fd = ops.open_direct_write(Path("/data/f"))
    with pytest.raises(OSError) as refused:
        ops.pwrite(fd, memoryview(bytes(100)), 0)
    assert refused.value.errno == errno.EINVAL
    assert ops.pwrite(fd, memoryview(bytes(4096)), 4096) == 4096


def test_a_log_of_the_simulated_disk_is_written_aligned() -> None:
    ops = SimFiles(SimDisk(random.Random(1)))
    logger = EntryLogger(Path("/data/logs"), max_bytes=256 * 1024, write_buffer_bytes=4096, ops=ops)
    try:
        assert logger.direct_io
        where = _append_all(logger)  # an unaligned write would raise here
        for log_id, offset, blob in where:
            assert logger.read(log_id, offset, len(blob)) == blob
    finally:
        logger.close()


def _open_storage(data_dir: Path) -> LedgerStorage:
    return LedgerStorage(
        data_dir,
        entry_log_max_bytes=1 << 20,
        entry_log_write_buffer_bytes=8 * 1024,
        read_cache_max_bytes=1 << 20,
        index_map_size_bytes=1 << 26,
    )


def test_a_log_holding_only_its_padded_header_does_not_stop_a_first_start(
    tmp_path: Path,
) -> None:
    """A bookie stopped before its first checkpoint's mark leaves a log of one block
    (header and padding) and no mark: that is an empty log, not a lost index (R15)."""
    logs_dir = tmp_path / "entrylogs"
    logger = EntryLogger(logs_dir, max_bytes=1 << 20, write_buffer_bytes=8 * 1024)
    logger.close()  # writes the header, padded to a block
    assert (logs_dir / "00000001.log").stat().st_size == DIRECT_IO_ALIGNMENT
    _open_storage(tmp_path).close()


def test_a_log_holding_records_without_an_index_mark_still_stops_the_start(
    tmp_path: Path,
) -> None:
    logs_dir = tmp_path / "entrylogs"
    logger = EntryLogger(logs_dir, max_bytes=1 << 20, write_buffer_bytes=8 * 1024)
    logger.append(format_records([b"x" * 100], [100]))
    logger.close()
    with pytest.raises(BookieIOError, match="no checkpoint mark"):
        _open_storage(tmp_path)
