"""ReadHandle.read_payloads: the data of a range, as read_entries reads it, without an
Entry per entry (what the Spark data source builds its columns from)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import quorumlog.aio as aio
from quorumlog.errors import InvalidArgumentError, NoSuchEntryError
from quorumlog.server.local_cluster import LocalCluster, embedded_metadata_uri


def test_r4_read_payloads_gives_each_entrys_data_in_order_up_to_the_lac(tmp_path: Path) -> None:
    uri = embedded_metadata_uri(tmp_path)
    with LocalCluster(uri, tmp_path / "bookies", 3).start():

        async def scenario() -> None:
            async with await aio.BookKeeper.connect(uri) as bk:
                writer = await bk.create_ledger(3, 3, 2)
                # More than one read batch (1,000 entries), so chunks are joined in order.
                data = [b"entry %d" % i for i in range(2_500)]
                await asyncio.gather(*(writer.append(d) for d in data))
                # Pipelined adds may all leave before any is confirmed, so they can carry
                # LAC -1, and the explicit LAC follows a moment later. One more add,
                # sent once all 2,500 are confirmed, carries LAC 2,499 to the bookies
                # that acknowledge it.
                data.append(b"tail")
                await writer.append(data[-1])
                reader = await bk.open_ledger_no_recovery(writer.ledger_id)
                await reader.read_last_add_confirmed()
                lac = reader.last_add_confirmed
                assert lac >= 2_499
                assert await reader.read_payloads(0, lac) == data[: lac + 1]
                entries = await reader.read_entries(990, 1_010)
                assert [e.data for e in entries] == await reader.read_payloads(990, 1_010)
                assert [e.entry_id for e in entries] == list(range(990, 1_011))
                # One past the LAC the reader knows now: the reads above may have taught it
                # a later one (each answer carries its bookie's LAC, and the tail add's
                # explicit LAC reaches the bookies a moment after the add is confirmed).
                with pytest.raises(NoSuchEntryError):
                    await reader.read_payloads(0, reader.last_add_confirmed + 1)
                with pytest.raises(InvalidArgumentError):
                    await reader.read_payloads(5, 4)
                await writer.close()

        asyncio.run(asyncio.wait_for(scenario(), 60))
