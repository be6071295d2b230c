"""The index reader: a run of a batch's locations in one go (all of them or none), and
single lookups that walk one cursor along consecutive entries, searching only when the
next record is not the one asked for. Gaps, other ledgers, going back and missing
entries all answer as single lookups do, and a recent add still wins over the index."""

from __future__ import annotations

from pathlib import Path

from quorumlog.bookie.index import IndexUpdate, LedgerIndex
from quorumlog.bookie.storage import LedgerStorage
from quorumlog.testing.raw_client import make_entry


def location(ledger_id: int, entry_id: int) -> tuple[int, int, int]:
    return ledger_id, entry_id * 10, 100 + entry_id


def test_lookups_in_any_order_answer_as_single_lookups(tmp_path: Path) -> None:
    index = LedgerIndex(tmp_path / "index", 1 << 24)
    try:
        update = IndexUpdate(mark=(1, 0))
        update.entries = [
            (4, {0: location(4, 0)}),
            (5, {e: location(5, e) for e in range(300) if e != 100}),  # 100 missing
            (6, {0: location(6, 0), 1: location(6, 1)}),
        ]
        index.apply(update)
        asks = [
            *((5, e) for e in range(0, 120)),  # a run across the gap
            (5, 299),
            (5, 300),  # past the ledger's last: the next key is ledger 6's
            (6, 0),
            (6, 1),
            (6, 2),  # past the last key of all
            (4, 0),  # back to an earlier ledger
            (5, 3),
            (5, 4),
            (7, 0),
        ]
        with index.reader() as reader:
            got = [reader.get(ledger_id, entry_id) for ledger_id, entry_id in asks]
        assert got == [index.get(ledger_id, entry_id) for ledger_id, entry_id in asks]
        assert got[100] is None and got[101] == location(5, 101)
        assert got[-1] is None and got[-2] == location(5, 4)
    finally:
        index.close()


def test_a_run_is_every_location_asked_for_or_none(tmp_path: Path) -> None:
    index = LedgerIndex(tmp_path / "index", 1 << 24)
    try:
        update = IndexUpdate(mark=(1, 0))
        update.entries = [
            (5, {e: location(5, e) for e in range(300) if e != 100}),
            (6, {0: location(6, 0)}),
        ]
        index.apply(update)
        with index.reader() as reader:
            assert reader.run(5, 0, 100) == [location(5, e) for e in range(100)]
            assert reader.run(5, 101, 199) == [location(5, e) for e in range(101, 300)]
            assert reader.run(5, 50, 60) == []  # entry 100 is missing
            assert reader.run(5, 250, 51) == []  # past the ledger's last entry
            assert reader.run(5, 0, 0) == []
            assert reader.run(7, 0, 1) == []
            # Single lookups after a run still find their records.
            assert reader.get(5, 7) == location(5, 7)
            assert reader.get(5, 8) == location(5, 8)
            assert reader.run(6, 0, 1) == [location(6, 0)]
            assert reader.get(5, 9) == location(5, 9)
    finally:
        index.close()


def test_entries_rewritten_after_a_checkpoint_are_read_from_their_new_place(
    tmp_path: Path,
) -> None:
    storage = LedgerStorage(
        tmp_path / "data",
        entry_log_max_bytes=1 << 24,
        entry_log_write_buffer_bytes=1 << 16,
        read_cache_max_bytes=1 << 22,
        index_map_size_bytes=1 << 24,
    )
    try:
        st = storage.create_state(3)
        old = [make_entry(3, e, b"old %d" % e) for e in range(40)]
        storage.add_entries(st, old, [len(b) for b in old], range(40), 39)
        journal_dir = tmp_path / "journal"
        journal_dir.mkdir()
        work = storage.capture((1, 0), journal_dir)
        storage.commit(work)
        storage.finish(work, True)
        assert not st.recent
        # A recovery add writes entry 20 again: the index still has its old place.
        new = make_entry(3, 20, b"new 20")
        storage.add_entries(st, [new], [len(new)], [20], 20)
        got = storage.read_entries(st, 0, 40, 1 << 20)
        assert got == [*old[:20], new, *old[21:]]
        assert storage.read_entries(st, 35, 10, 1 << 20) == old[35:]  # stops at the last
    finally:
        storage.close()
