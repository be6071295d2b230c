"""Damage to the index (LMDB) is an I/O error, never absence (R9, R17; issue B2).

Every value the index stores carries a CRC32C of its key and value. The tests damage
the index of a closed bookie the way a flipped bit would (a bit of a stored value, or
of a key, which moves the record elsewhere) through LMDB itself, then start the bookie
on it again and look at the answers.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from functools import partial
from os import close
from pathlib import Path
from typing import Any

import lmdb
import pytest
import support

from quorumlog.bookie.bookie import Bookie, BookieStartError
from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.index import IndexUpdate, LedgerIndex
from quorumlog.bookie.journal.format import create_journal_file
from quorumlog.errors import BookieIOError, Status
from quorumlog.proto.codec import (
    AddFlag,
    AddRequest,
    DeleteLedgerRequest,
    FenceRequest,
    ReadLacRequest,
    ReadRequest,
    WriteLacRequest,
)
from quorumlog.testing.raw_client import make_entry, master_key

KEY = master_key(b"password")
run = partial(support.run, timeout_s=60)


def _blob(ledger_id: int, entry_id: int, size: int = 20) -> bytes:
    return make_entry(ledger_id, entry_id, bytes([entry_id % 251]) * size, lac=entry_id - 1)


def _damage(config: BookieConfig, table: bytes, change: Callable[[lmdb.Transaction], None]) -> None:
    """Change the closed bookie's index table ``table`` through LMDB."""
    env = lmdb.open(str(Path(config.data_dir) / "index"), max_dbs=8, subdir=True)
    try:
        db = env.open_db(table)
        with env.begin(write=True, db=db) as txn:
            change(txn)
    finally:
        env.close()


def _flip_value_bit(key: bytes, byte: int, bit: int) -> Callable[[lmdb.Transaction], None]:
    def change(txn: lmdb.Transaction) -> None:
        value = bytearray(txn.get(key))
        value[byte] ^= 1 << bit
        txn.put(key, bytes(value))

    return change


def _move_record(key: bytes, new_key: bytes) -> Callable[[lmdb.Transaction], None]:
    """A flipped bit in a key: the record is found under another key only."""

    def change(txn: lmdb.Transaction) -> None:
        value = txn.get(key)
        assert value is not None and txn.get(new_key) is None
        txn.delete(key)
        txn.put(new_key, value)

    return change


def _ledger_key(ledger_id: int) -> bytes:
    return struct.pack(">Q", ledger_id)


def _entry_key(ledger_id: int, entry_id: int) -> bytes:
    return struct.pack(">QQ", ledger_id, entry_id)


async def _add(driver: Any, ledger_id: int, entry_ids: range) -> None:
    blobs = [_blob(ledger_id, e) for e in entry_ids]
    answer = await driver.call(AddRequest(0, ledger_id, KEY, blobs))
    assert answer.status == Status.OK


# ---------------------------------------------------------------- entries


@pytest.mark.parametrize(
    "moved_to",
    [(5 ^ (1 << 20), 3), (5, 3 ^ (1 << 33))],
    ids=["a bit of its ledger id", "a bit of its entry id"],
)
def test_r17_an_entry_record_lost_under_a_damaged_key_reads_as_an_io_error(
    make_driver, moved_to: tuple[int, int]
) -> None:
    driver = make_driver()

    async def main() -> None:
        await driver.start()
        await _add(driver, 5, range(10))
        await _add(driver, 8, range(4))
        await driver.close()  # checkpoints: every location is in LMDB
        _damage(driver.config, b"entries", _move_record(_entry_key(5, 3), _entry_key(*moved_to)))
        await driver.start()
        lost = await driver.call(ReadRequest(0, 5, 3, 1))
        assert lost.status == Status.IO_ERROR  # was NO_SUCH_ENTRY: an acknowledged entry
        batch = await driver.call(ReadRequest(0, 5, 0, 10))
        assert batch.status == Status.OK and batch.entries == [_blob(5, e) for e in range(3)]
        after = await driver.call(ReadRequest(0, 5, 4, 6))
        assert after.status == Status.OK and after.entries == [_blob(5, e) for e in range(4, 10)]
        beyond = await driver.call(ReadRequest(0, 5, 10, 1))  # above its last entry: absent
        assert beyond.status == Status.NO_SUCH_ENTRY
        other = await driver.call(ReadRequest(0, 8, 0, 4))
        assert other.status == Status.OK and len(other.entries) == 4
        await driver.close()

    run(main())


def test_r17_a_gap_of_a_striped_ledger_is_still_no_such_entry(make_driver) -> None:
    """Entries a bookie never had below its last one (striping, E > Qw) are proven absent
    by the ledger's entry count, so they stay NO_SUCH_ENTRY."""
    driver = make_driver()

    async def main() -> None:
        await driver.start()
        for e in range(0, 30, 3):
            await _add(driver, 9, range(e, e + 1))
        await driver.restart()  # a close checkpoints: the index has every location
        for e in range(0, 30):
            answer = await driver.call(ReadRequest(0, 9, e, 1))
            expected = Status.OK if e % 3 == 0 else Status.NO_SUCH_ENTRY
            assert answer.status == expected, e
        await driver.close()

    run(main())


def test_r9_a_damaged_entry_location_is_an_io_error_and_ends_a_batch(make_driver) -> None:
    driver = make_driver()

    async def main() -> None:
        await driver.start()
        await _add(driver, 5, range(10))
        await driver.close()
        # A bit of the location's offset: it points 8 bytes into the record.
        _damage(driver.config, b"entries", _flip_value_bit(_entry_key(5, 6), 11, 3))
        await driver.start()
        batch = await driver.call(ReadRequest(0, 5, 0, 10))
        assert batch.status == Status.OK and batch.entries == [_blob(5, e) for e in range(6)]
        damaged = await driver.call(ReadRequest(0, 5, 6, 4))
        assert damaged.status == Status.IO_ERROR
        await driver.close()

    run(main())


# ---------------------------------------------------------------- ledger states


@pytest.mark.parametrize(
    ("byte", "bit"),
    [(0, 0), (9, 3), (30, 5)],
    ids=["the fence flag", "the LAC", "the master key"],
)
def test_r7_r10_r17_a_damaged_ledger_state_is_unknown_until_a_delete(
    make_driver, byte: int, bit: int
) -> None:
    driver = make_driver()

    async def main() -> None:
        await driver.start()
        await _add(driver, 6, range(5))
        await _add(driver, 7, range(5))
        assert (await driver.call(FenceRequest(0, 6, KEY))).status == Status.OK
        await driver.close()
        _damage(driver.config, b"ledgers", _flip_value_bit(_ledger_key(6), byte, bit))
        bookie = await driver.start()  # the other ledgers are served
        assert 6 in bookie.ledger_ids()
        for request in (
            AddRequest(0, 6, KEY, [_blob(6, 5)]),  # was OK when the fence flag flipped (R7)
            AddRequest(0, 6, KEY, [_blob(6, 5)], AddFlag.RECOVERY),
            FenceRequest(0, 6, KEY),
            ReadRequest(0, 6, 0, 1),
            ReadRequest(0, 6, 7, 1),
            ReadLacRequest(0, 6),
            WriteLacRequest(0, 6, KEY, 3),
        ):
            answer = await driver.call(request)
            assert answer.status == Status.IO_ERROR, request
        fine = await driver.call(ReadRequest(0, 7, 0, 5))
        assert fine.status == Status.OK and len(fine.entries) == 5
        await driver.restart()  # still unknown: nothing wrote a state over it
        assert (await driver.call(ReadRequest(0, 6, 0, 1))).status == Status.IO_ERROR
        # A delete settles it: a tombstone, as for a ledger never seen.
        assert (await driver.call(DeleteLedgerRequest(0, 6, KEY))).status == Status.OK
        await driver.restart()
        gone = await driver.call(ReadRequest(0, 6, 0, 1))
        assert gone.status == Status.NO_SUCH_LEDGER
        refused = await driver.call(AddRequest(0, 6, KEY, [_blob(6, 5)]))
        assert refused.status == Status.NO_SUCH_LEDGER
        await driver.close()

    run(main())


def test_r17_a_damaged_ledger_state_is_dropped_by_garbage_collection(make_driver) -> None:
    driver = make_driver()

    async def main() -> None:
        await driver.start()
        await _add(driver, 6, range(5))
        await driver.close()
        _damage(driver.config, b"ledgers", _flip_value_bit(_ledger_key(6), 0, 1))
        bookie = await driver.start()
        assert bookie.garbage_collect(set(), {6}) == 1
        await bookie.checkpoint()
        await driver.restart()
        answer = await driver.call(ReadRequest(0, 6, 0, 1))
        assert answer.status == Status.NO_SUCH_LEDGER
        await driver.close()

    run(main())


def test_r7_a_ledger_state_under_a_damaged_key_stops_the_start(make_driver) -> None:
    driver = make_driver()

    async def main() -> None:
        await driver.start()
        await _add(driver, 6, range(5))
        assert (await driver.call(FenceRequest(0, 6, KEY))).status == Status.OK
        await driver.close()
        _damage(driver.config, b"ledgers", _move_record(_ledger_key(6), _ledger_key(6 ^ 1 << 9)))
        with pytest.raises(BookieStartError, match=r"ledger 6\b"):
            Bookie.open(driver.config)  # was: started with ledger 6 unfenced, unknown

    run(main())


# ---------------------------------------------------------------- the mark, the format


def test_a_damaged_checkpoint_mark_stops_the_start(make_driver) -> None:
    driver = make_driver()

    async def main() -> None:
        await driver.start()
        await _add(driver, 6, range(5))
        await driver.close()
        _damage(driver.config, b"meta", _flip_value_bit(b"last_mark", 14, 0))
        with pytest.raises(BookieStartError, match="checkpoint mark"):
            Bookie.open(driver.config)  # was: replay from another place in the journal

    run(main())


def test_an_index_without_checksums_is_refused_with_a_clear_message(make_config) -> None:
    config = make_config()
    # What the versions before checksums wrote: values alone, no format record.
    index = Path(config.data_dir) / "index"
    index.mkdir(parents=True)
    env = lmdb.open(str(index), max_dbs=8)
    try:
        for name in (b"entries", b"ledgers", b"logs", b"usage"):
            env.open_db(name)
        meta = env.open_db(b"meta")
        with env.begin(write=True, db=meta) as txn:
            txn.put(b"last_mark", struct.pack(">QQ", 1, 0))
    finally:
        env.close()
    journal_dir = Path(config.journal_path)
    journal_dir.mkdir(parents=True)
    close(create_journal_file(journal_dir, 1))
    with pytest.raises(BookieStartError, match="without checksums"):
        Bookie.open(config)


# ---------------------------------------------------------------- the entry-log tables


def test_r9_a_damaged_entry_log_table_is_rebuilt_and_compaction_loses_nothing(
    make_driver,
) -> None:
    driver = make_driver(entry_log_max_bytes=64 * 1024, entry_log_direct_io=False)

    async def main() -> None:
        bookie = await driver.start()
        await _add(driver, 20, range(3))  # small and live
        for first in range(0, 80, 10):  # big, deleted below: the log becomes mostly dead
            blobs = [_blob(21, e, 1000) for e in range(first, first + 10)]
            assert (await driver.call(AddRequest(0, 21, KEY, blobs))).status == Status.OK
        [log_id] = [i for i, ledgers in bookie.storage.log_ledgers.items() if 20 in ledgers]
        assert log_id != bookie.storage.entry_log.current_id
        assert (await driver.call(DeleteLedgerRequest(0, 21, KEY))).status == Status.OK
        await driver.close()
        # The log's list names ledger 20 with one bit flipped.
        log_key = struct.pack(">I", log_id)
        _damage(driver.config, b"logs", _flip_value_bit(log_key, 7, 1))
        bookie = await driver.start()
        # Compaction copies the entries of the ledgers the log's list names: taken as
        # it reads, the list would have ledger 20's entries deleted with the log.
        result = await bookie.force_gc(major=False)
        read = await driver.call(ReadRequest(0, 20, 0, 3))
        assert read.status == Status.OK and read.entries == [_blob(20, e) for e in range(3)]
        assert log_id in result.logs_compacted  # the list was rebuilt from the entries
        await driver.restart()
        read = await driver.call(ReadRequest(0, 20, 0, 3))
        assert read.status == Status.OK and read.entries == [_blob(20, e) for e in range(3)]
        await driver.close()

    run(main())


# ---------------------------------------------------------------- the index alone


def test_each_stored_value_is_checked_when_read(tmp_path: Path) -> None:
    index = LedgerIndex(tmp_path / "index", 1 << 24)
    try:
        update = IndexUpdate(mark=(1, 0))
        update.entries = [(5, {e: (1, 100 + 30 * e, 22) for e in range(20)})]
        index.apply(update)
        with index.reader() as reader:
            assert reader.run(5, 0, 20) == [(1, 100 + 30 * e, 22) for e in range(20)]
    finally:
        index.close()
    env = lmdb.open(str(tmp_path / "index"), max_dbs=8)
    try:
        db = env.open_db(b"entries")
        with env.begin(write=True, db=db) as txn:
            _flip_value_bit(_entry_key(5, 7), 3, 4)(txn)
    finally:
        env.close()
    index = LedgerIndex(tmp_path / "index", 1 << 24)
    try:
        with index.reader() as reader:
            assert reader.get(5, 6) == (1, 100 + 30 * 6, 22)
            with pytest.raises(BookieIOError, match="ledger 5 entry 7"):
                reader.get(5, 7)
            assert reader.run(5, 8, 12) == [(1, 100 + 30 * e, 22) for e in range(8, 20)]
        with pytest.raises(BookieIOError, match="ledger 5 entry 7"):
            index.get(5, 7)
        with pytest.raises(BookieIOError, match="ledger 5"):
            index.prove_complete(5)
    finally:
        index.close()
