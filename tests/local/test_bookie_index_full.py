"""A bookie whose index (LMDB map) fills: adds stop cleanly, nothing is lost, and a
restart grows the map and serves every acknowledged entry (issue B5)."""

from __future__ import annotations

from functools import partial

import support

from quorumlog.errors import Status
from quorumlog.proto.codec import AddRequest, ReadRequest
from quorumlog.testing.raw_client import make_entry, master_key

KEY = master_key(b"password")
run = partial(support.run, timeout_s=120)
LEDGERS = 40
ENTRIES = 400  # each; 16,000 index records do not fit a 256 KiB map


def _blob(ledger_id: int, entry_id: int) -> bytes:
    return make_entry(ledger_id, entry_id, b"%d/%d" % (ledger_id, entry_id), lac=entry_id - 1)


def test_b5_a_full_index_stops_adds_and_a_restart_grows_it_losing_nothing(make_driver):
    driver = make_driver(index_map_size_bytes=256 * 1024)

    async def main() -> None:
        bookie = await driver.start()
        for ledger_id in range(1, LEDGERS + 1):
            for first in range(0, ENTRIES, 100):
                blobs = [_blob(ledger_id, e) for e in range(first, first + 100)]
                answer = await driver.call(AddRequest(0, ledger_id, KEY, blobs))
                assert answer.status == Status.OK
        for _ in range(3):  # every checkpoint fails: the map is full
            await bookie.checkpoint()
        assert bookie.read_only
        reason = bookie.read_only_reason or ""
        assert "checkpoints in a row failed" in reason and "index_map_size_bytes" in reason
        refused = await driver.call(AddRequest(0, 999, KEY, [_blob(999, 0)]))
        assert refused.status == Status.READ_ONLY
        await driver.crash()
        bookie = await driver.start()  # replay grows the map and commits
        assert not bookie.read_only
        for ledger_id in (1, LEDGERS // 2, LEDGERS):
            for entry_id in (0, ENTRIES - 1):
                answer = await driver.call(ReadRequest(0, ledger_id, entry_id, 1))
                assert answer.status == Status.OK
                assert answer.entries[0] == _blob(ledger_id, entry_id)
        await driver.close()

    run(main())
