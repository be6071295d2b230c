"""Entry logs hold a bounded number of file descriptors (issue B3): a rotated log's
writers are closed once it is synced, and older logs are read through a small set of
descriptors, the least recently used closed first."""

from __future__ import annotations

import os
from pathlib import Path

from support import append_blobs

from quorumlog.bookie.entry_log import EntryLogger

LOGS = 60


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def _checkpoint(logger: EntryLogger) -> None:
    """What a checkpoint does to the entry logs: sync, then release on the loop."""
    logger.sync(logger.take_unsynced())
    logger.forget_rewritten()
    logger.release_rotated()


def test_b3_descriptors_stay_bounded_over_many_logs_written_and_read(tmp_path: Path) -> None:
    before = _open_descriptors()
    logger = EntryLogger(tmp_path, max_bytes=8192, write_buffer_bytes=4096, max_read_fds=8)
    try:
        where = []
        for _ in range(LOGS):
            where += append_blobs(logger, [3000, 3000], flush_every=1)
            _checkpoint(logger)
        assert logger.current_id >= LOGS
        assert _open_descriptors() - before <= 2 + 8  # the current log's two, the readers
        for log_id, offset, blob in where:  # every log read again, in order
            assert logger.read(log_id, offset, len(blob)) == blob
        assert _open_descriptors() - before <= 2 + 8
    finally:
        logger.close()
    assert _open_descriptors() == before


def test_b3_a_rotated_log_keeps_its_writer_until_it_is_synced(tmp_path: Path) -> None:
    logger = EntryLogger(tmp_path, max_bytes=8192, write_buffer_bytes=4096, max_read_fds=2)
    try:
        first = logger.current_id
        where = append_blobs(logger, [3000, 3000, 3000, 3000], flush_every=1)
        assert logger.current_id > first
        logger.release_rotated()  # nothing synced yet: the rotated log is kept open
        unsynced = logger.take_unsynced()
        assert first in [log_id for log_id, _ in unsynced]
        logger.sync(unsynced)
        logger.release_rotated()
        for log_id, offset, blob in where:
            assert logger.read(log_id, offset, len(blob)) == blob
    finally:
        logger.close()


def test_b3_a_bookie_raises_its_soft_open_files_limit_to_the_hard_one() -> None:
    import resource

    from quorumlog.server.open_files import raise_open_files_limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        lowered = min(256, soft)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
        raised = raise_open_files_limit(cap=4096)
        expected = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
        assert raised == max(lowered, expected)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == raised
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_b3_a_directory_that_cannot_be_opened_is_synced_later_not_a_sticky_failure(
    tmp_path: Path,
) -> None:
    import errno

    from quorumlog.bookie.fileops import FileOps

    class OutOfDescriptorsOnce(FileOps):
        failures = 0

        def fsync_directory(self, directory: Path) -> None:
            if self.failures:
                self.failures -= 1
                raise OSError(errno.EMFILE, "Too many open files")
            super().fsync_directory(directory)

    ops = OutOfDescriptorsOnce()
    logger = EntryLogger(tmp_path, max_bytes=8192, write_buffer_bytes=4096, ops=ops)
    try:
        ops.failures = 2  # the rotation's sync, then the first checkpoint's
        where = append_blobs(logger, [3000, 3000, 3000], flush_every=1)
        assert logger.sync_error is None  # not sticky: the bookie stays writable
        unsynced = logger.take_unsynced()
        try:
            logger.sync(unsynced)
            raise AssertionError("the checkpoint passed an unsynced directory")
        except OSError as exc:
            assert exc.errno == errno.EMFILE
        logger.requeue_unsynced(unsynced)
        assert logger.sync_error is None
        logger.sync(logger.take_unsynced())  # the next checkpoint syncs it and passes
        for log_id, offset, blob in where:
            assert logger.read(log_id, offset, len(blob)) == blob
    finally:
        logger.close()
