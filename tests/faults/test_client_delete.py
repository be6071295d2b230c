"""Deleting a ledger with real bookies, when the metadata store fails on the way (R13, R15):
the metadata goes first, so no failure can leave metadata that names deleted data."""

from __future__ import annotations

import pytest

from quorumlog import BookKeeper
from quorumlog.errors import MetadataError


def test_r15_a_failed_metadata_delete_leaves_the_ledger_whole_and_readable(cluster3, monkeypatch):
    with BookKeeper(cluster3.metadata_uri) as bk:
        lh = bk.create_ledger(3, 3, 2, password=b"pw")
        for i in range(10):
            lh.add_entry(b"kept %d" % i)
        lh.close()

        async def connection_lost(ledger_id: int, version: int = -1) -> None:
            raise MetadataError(f"ledger {ledger_id}: connection lost, outcome unknown")

        monkeypatch.setattr(bk.aio.ledgers, "delete", connection_lost)
        with pytest.raises(MetadataError, match="connection lost"):
            bk.delete_ledger(lh.ledger_id, b"pw")
        monkeypatch.undo()

        # The metadata still names the ledger, so every bookie must still hold it.
        assert lh.ledger_id in bk.list_ledgers()
        rh = bk.open_ledger(lh.ledger_id, b"pw")
        assert [e.data for e in rh.read_entries(0, 9)] == [b"kept %d" % i for i in range(10)]

        bk.delete_ledger(lh.ledger_id, b"pw")  # a retry once the store answers again
        assert lh.ledger_id not in bk.list_ledgers()
