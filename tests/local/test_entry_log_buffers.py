"""The entry log's write buffers: filled in place, handed on whole, reused once written."""

from __future__ import annotations

import asyncio
from pathlib import Path

from support import append_blobs, poll_until_async

from quorumlog.bookie.entry_log import EntryLogger

BUFFER_BYTES = 4096


# Sizes that fill a buffer exactly, straddle it, and exceed it (a record larger than a buffer).
SIZES = [100, 3000, 2000, 4088, 10_000, 1, 4096, 500, 9000, 700] * 3


def _append_all(logger: EntryLogger) -> list[tuple[int, int, bytes]]:
    return append_blobs(logger, SIZES)


def test_records_read_back_across_buffers_written_at_once(tmp_path: Path) -> None:
    logger = EntryLogger(tmp_path, max_bytes=1 << 20, write_buffer_bytes=BUFFER_BYTES)
    try:
        where = _append_all(logger)
        logger.flush()
        for log_id, offset, blob in where:
            assert logger.read(log_id, offset, len(blob)) == blob
    finally:
        logger.close()


def test_records_read_back_while_a_worker_writes_and_after(tmp_path: Path) -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        logger = EntryLogger(tmp_path, max_bytes=1 << 20, write_buffer_bytes=BUFFER_BYTES)
        logger.writer = lambda job, *args: loop.run_in_executor(None, job, *args)
        try:
            for _ in range(3):  # later rounds fill buffers given back by earlier ones
                where = _append_all(logger)
                logger.flush()
                await poll_until_async(
                    lambda: logger._in_flight == 0, timeout_s=30, what="chunks written"
                )
                for log_id, offset, blob in where:
                    assert logger.read(log_id, offset, len(blob)) == blob
            assert logger._spare  # written buffers were kept for reuse
        finally:
            logger.writer = None
            logger.close()

    asyncio.run(run())
