"""R4 when the writer goes idle: the explicit LAC goes out at once, not after
explicit_lac_delay_ms, unless a synchronous caller waits on the add (it adds again
right away, and that add carries the LAC). Real bookie processes, both metadata
drivers. The delay is set far beyond the test, so only the idle rule can tell the
bookies the LAC in time."""

from __future__ import annotations

import asyncio

from quorumlog import BookKeeper, ClientConfig
from quorumlog.aio import BookKeeper as AsyncBookKeeper

NO_DELAYED_LAC = ClientConfig(explicit_lac_delay_ms=600_000)


def test_r4_an_idle_asyncio_writer_tells_the_lac_at_once_a_synchronous_one_waits(cluster3):
    async def asyncio_writer() -> None:
        async with await AsyncBookKeeper.connect(
            cluster3.metadata_uri, config=NO_DELAYED_LAC
        ) as bk:
            lh = await bk.create_ledger(3, 3, 2)
            assert await lh.append(b"only") == 0
            reader = await bk.open_ledger_no_recovery(lh.ledger_id)
            # Answered by the explicit LAC that followed the confirmation; without it
            # the poll would run out (a long bound for a loaded machine).
            lac, entry = await reader.read_last_add_confirmed_and_entry(0, timeout_ms=30_000)
            assert lac == 0 and entry is not None and entry.data == b"only"

    asyncio.run(asyncio_writer())

    with BookKeeper(cluster3.metadata_uri, config=NO_DELAYED_LAC) as bk:
        lh = bk.create_ledger(3, 3, 2)
        assert lh.add_entry(b"first") == 0
        reader = bk.open_ledger_no_recovery(lh.ledger_id)
        # A synchronous add_entry leaves the LAC to the next add (or to the delay).
        lac, entry = reader.read_last_add_confirmed_and_entry(0, timeout_ms=200)
        assert (lac, entry) == (-1, None)
        assert lh.add_entry(b"second") == 1  # carries LAC 0
        lac, entry = reader.read_last_add_confirmed_and_entry(0, timeout_ms=30_000)
        assert lac == 0 and entry is not None and entry.data == b"first"
