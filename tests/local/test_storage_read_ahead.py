"""A batch read reads ahead: one pread for the records of a batch that are in the entry
log's file, never past what is still in memory, and a damaged record still answers an
I/O error when it is asked for (R9), never data and never "no such entry"."""

from __future__ import annotations

from pathlib import Path

import pytest

from quorumlog.bookie.fileops import FileOps
from quorumlog.bookie.storage import LedgerStorage
from quorumlog.errors import BookieIOError
from quorumlog.testing.raw_client import make_entry


class CountingFiles(FileOps):
    """The real files, counting preads."""

    def __init__(self) -> None:
        self.preads = 0

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        self.preads += 1
        return super().pread(fd, size, offset)


def open_storage(data_dir: Path, ops: FileOps, write_buffer_bytes: int = 1 << 16) -> LedgerStorage:
    return LedgerStorage(
        data_dir,
        entry_log_max_bytes=1 << 24,
        entry_log_write_buffer_bytes=write_buffer_bytes,
        read_cache_max_bytes=1 << 22,
        index_map_size_bytes=1 << 26,
        ops=ops,
    )


def put(storage: LedgerStorage, ledger_id: int, entry_ids: range) -> list[bytes]:
    st = storage.state(ledger_id) or storage.create_state(ledger_id)
    blobs = [make_entry(ledger_id, e, b"%d/%05d" % (ledger_id, e) + bytes(100)) for e in entry_ids]
    storage.add_entries(st, blobs, [len(b) for b in blobs], list(entry_ids), max(entry_ids))
    return blobs


def read(storage: LedgerStorage, ledger_id: int, first: int, count: int) -> list[bytes]:
    st = storage.state(ledger_id)
    assert st is not None
    return storage.read_entries(st, first, count, 1 << 20)


def test_a_batch_of_entries_in_the_file_costs_one_pread(tmp_path: Path) -> None:
    files = CountingFiles()
    storage = open_storage(tmp_path / "data", files)
    try:
        blobs = put(storage, 1, range(500))
        storage.entry_log.flush()  # into the file: no writer thread here, written at once
        assert read(storage, 1, 0, 500) == blobs
        assert files.preads == 1
        # The records read ahead went to that answer, not through the read cache (only
        # the first entry of a read is kept there): another read is one more pread.
        assert len(storage.read_cache) == 1
        assert read(storage, 1, 100, 50) == blobs[100:150]
        assert files.preads == 2
    finally:
        storage.close()


def test_entries_in_the_write_buffer_are_shared_by_their_readers(tmp_path: Path) -> None:
    # Tailing readers of recent entries get one bytes object, not a copy each.
    storage = open_storage(tmp_path / "data", CountingFiles())
    try:
        blobs = put(storage, 1, range(20))
        first = read(storage, 1, 0, 20)
        again = read(storage, 1, 0, 20)
        assert first == blobs
        assert all(a is b for a, b in zip(first, again, strict=True))
    finally:
        storage.close()


def test_interleaved_ledgers_and_entries_still_in_memory_are_read_whole(tmp_path: Path) -> None:
    files = CountingFiles()
    storage = open_storage(tmp_path / "data", files)
    try:
        ones, twos = [], []
        for start in range(0, 300, 30):
            ones += put(storage, 1, range(start, start + 30))
            twos += put(storage, 2, range(start, start + 30))
        storage.entry_log.flush()
        ones += put(storage, 1, range(300, 340))  # in the write buffer
        assert read(storage, 1, 0, 340) == ones
        # Half of each read-ahead is the other ledger's: a few preads, not one per entry.
        assert files.preads <= 4
        before = files.preads
        assert read(storage, 2, 0, 300) == twos
        assert files.preads - before <= 4
    finally:
        storage.close()


def test_r9_a_damaged_record_ends_the_batch_and_is_an_error_when_asked_for(tmp_path: Path) -> None:
    files = CountingFiles()
    storage = open_storage(tmp_path / "data", files)
    try:
        blobs = put(storage, 1, range(100))
        storage.entry_log.flush()
        st = storage.state(1)
        assert st is not None
        log_id, offset, _ = st.recent[60]
        path = storage.entry_log._path(log_id)
        raw = bytearray(path.read_bytes())
        raw[offset + 8 + 40] ^= 0x01  # a flipped byte inside entry 60's blob
        path.write_bytes(bytes(raw))

        assert read(storage, 1, 0, 100) == blobs[:60]
        with pytest.raises(BookieIOError, match="entry 60"):
            read(storage, 1, 60, 40)
        assert read(storage, 1, 61, 39) == blobs[61:]
    finally:
        storage.close()
