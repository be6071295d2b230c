"""Entry logs hold a bounded number of file descriptors (issue B3): a rotated log's
writers are closed once it is synced, and older logs are read through a small set of
descriptors, the least recently used closed first. Running out of descriptors stops
nothing for good: the log goes on, checkpoints pass, readers make room."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from support import append_blobs

from quorumlog.bookie.entry_log import EntryLogger
from quorumlog.bookie.fileops import FileOps

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
        # The directory, the current log's two, the readers.
        assert _open_descriptors() - before <= 3 + 8
        for log_id, offset, blob in where:  # every log read again, in order
            assert logger.read(log_id, offset, len(blob)) == blob
        assert _open_descriptors() - before <= 3 + 8
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


class OutOfDescriptors(FileOps):
    """Real files, but no new descriptor while ``exhausted``: every open fails EMFILE."""

    exhausted = False

    def _check(self, path: Path) -> None:
        if self.exhausted:
            raise OSError(errno.EMFILE, "Too many open files", str(path))

    def create(self, path: Path) -> int:
        self._check(path)
        return super().create(path)

    def open_read(self, path: Path) -> int:
        self._check(path)
        return super().open_read(path)

    def open_direct_write(self, path: Path) -> int:
        self._check(path)
        return super().open_direct_write(path)

    def open_directory(self, directory: Path) -> int:
        self._check(directory)
        return super().open_directory(directory)

    def fsync_directory(self, directory: Path) -> None:
        self._check(directory)
        super().fsync_directory(directory)


def test_b3_out_of_descriptors_the_current_log_goes_on_and_checkpoints_still_pass(
    tmp_path: Path,
) -> None:
    """Was: the new log's open failed the add (EMFILE), and every checkpoint failed to
    open the directory to sync it while the rotated logs it would have released held
    the descriptors: adds refused for good."""
    ops = OutOfDescriptors()
    logger = EntryLogger(tmp_path, max_bytes=8192, write_buffer_bytes=4096, ops=ops)
    try:
        first = logger.current_id
        ops.exhausted = True
        where = append_blobs(logger, [3000] * 6, flush_every=1)  # about 18 KiB
        assert logger.current_id == first  # no new log, no failed append
        assert logger.end_offset > logger.max_bytes
        _checkpoint(logger)  # the directory is synced through the descriptor held
        assert logger.sync_error is None and logger.write_error is None
        ops.exhausted = False
        where += append_blobs(logger, [3000], flush_every=1)
        assert logger.current_id == first + 1  # rotation tried again after the checkpoint
        _checkpoint(logger)
        for log_id, offset, blob in where:
            assert logger.read(log_id, offset, len(blob)) == blob
    finally:
        logger.close()


def test_b3_a_reader_out_of_descriptors_closes_the_least_recently_read_logs(
    tmp_path: Path,
) -> None:
    class FewReaders(FileOps):
        """Opens for reading fail with EMFILE while two readers are open."""

        logger: EntryLogger | None = None

        def open_read(self, path: Path) -> int:
            if self.logger is not None and len(self.logger._read_fds) >= 2:
                raise OSError(errno.EMFILE, "Too many open files", str(path))
            return super().open_read(path)

    ops = FewReaders()
    logger = EntryLogger(tmp_path, max_bytes=8192, write_buffer_bytes=4096, ops=ops)
    try:
        where = []
        for _ in range(5):
            where += append_blobs(logger, [3000, 3000], flush_every=1)
            _checkpoint(logger)
        older = {}
        for log_id, offset, blob in where:
            if log_id != logger.current_id:
                older.setdefault(log_id, (offset, blob))
        assert len(older) >= 4
        ops.logger = logger
        for _ in range(2):  # every log read twice, each open closing an older reader
            for log_id, (offset, blob) in older.items():
                assert logger.read(log_id, offset, len(blob)) == blob
                assert log_id in logger._read_fds and len(logger._read_fds) <= 2
    finally:
        logger.close()
