"""Batches of adds through both facades against real bookie processes (R3: ids
consecutive and in order; every entry readable with its bytes), on both metadata
drivers; large entries leave a connection without being joined first."""

from __future__ import annotations

import asyncio
import os

from quorumlog import BookKeeper
from quorumlog.aio import BookKeeper as AsyncBookKeeper


def test_r3_add_entries_on_both_facades_gives_consecutive_ids_and_readable_entries(cluster3):
    payloads = [b"entry-%04d" % i for i in range(600)]
    with BookKeeper(cluster3.metadata_uri) as bk:
        lh = bk.create_ledger(3, 3, 2, password=b"pw")
        assert lh.add_entry(payloads[0]) == 0
        assert lh.add_entries(payloads[1:100]) == list(range(1, 100))
        # Pipelined from this thread: batches and single adds interleaved, in order.
        pending = [lh.add_entries_async(payloads[i : i + 100]) for i in range(100, 500, 100)]
        singles = [lh.add_entry_async(p) for p in payloads[500:]]
        assert [i for f in pending for i in f.result(timeout=60)] == list(range(100, 500))
        assert [f.result(timeout=60) for f in singles] == list(range(500, 600))
        assert lh.add_entries([]) == []
        # A buffer the caller reuses at once: the entry is what it held when added.
        buffer = bytearray(b"reused-0")
        last = lh.add_entry_async(buffer)
        buffer[:] = b"changed!"
        assert last.result(timeout=60) == 600
        lh.close()
        entries = bk.open_ledger(lh.ledger_id, b"pw").read_entries(0, 600)
        assert [e.data for e in entries] == [*payloads, b"reused-0"]
        assert bk.ledger_metadata(lh.ledger_id).length == sum(map(len, payloads)) + 8

    async def aio() -> None:
        async with await AsyncBookKeeper.connect(cluster3.metadata_uri) as abk:
            alh = await abk.create_ledger(3, 3, 2)
            first = alh.append_entries(payloads[:300])
            assert await alh.add_entries(payloads[300:]) == list(range(300, 600))
            assert await first == list(range(300))
            # 64 KiB entries: frames leave by writelines (no join), small ones beside them.
            large = [os.urandom(65536) if i % 3 else b"small-%d" % i for i in range(24)]
            assert await alh.add_entries(large) == list(range(600, 624))
            await alh.close()
            read = await (await abk.open_ledger(alh.ledger_id)).read_entries(0, 623)
            assert [e.data for e in read] == payloads + large

    asyncio.run(aio())
