"""The index reader walks one cursor along a batch's consecutive entries and searches
only when the next record is not the one asked for: gaps, other ledgers, going back
and a missing entry all answer as single lookups do."""

from __future__ import annotations

from pathlib import Path

from quorumlog.bookie.index import IndexUpdate, LedgerIndex


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
