"""R16 on the client: bounds in bytes with real bookies. What the client holds for a
bookie that does not read is bounded; an entry too large for a frame is refused at
once and costs nothing to other adds or ledgers."""

from __future__ import annotations

import asyncio

import pytest
from support import run

from quorumlog import BookKeeper
from quorumlog.aio import BookKeeper as AsyncBookKeeper
from quorumlog.client.config import ClientConfig
from quorumlog.client.connection import BookieConnection
from quorumlog.errors import InvalidArgumentError

MiB = 1 << 20


def _held_for(conn: BookieConnection | None) -> int:
    """Bytes a connection holds that its bookie has not taken: its own queue and the
    transport's write buffer."""
    if conn is None:
        return 0
    transport = conn._transport
    buffered = transport.get_write_buffer_size() if transport is not None else 0
    return buffered + sum(map(len, conn._out))


def test_r16_a_hung_bookie_holds_bounded_client_memory_and_is_replaced(cluster4):
    limit = 4 * MiB
    # The add timeout alone would replace the hung bookie only after two minutes; the
    # byte bound must do it long before, with the client's memory bounded meanwhile.
    config = ClientConfig(max_queued_bytes_per_connection=limit, add_timeout_ms=120_000)
    payload = b"h" * (256 * 1024)

    async def main() -> None:
        bk = await AsyncBookKeeper.connect(cluster4.metadata_uri, config=config)
        try:
            lh = await bk.create_ledger(3, 3, 2)
            await lh.add_entry(b"warm up")  # connections open
            hung = lh.ensemble[2]
            index = next(b.index for b in cluster4.bookies if b.address == hung)
            cluster4.pause(index)
            try:
                held = 0
                for _ in range(200):  # 50 MiB, each confirmed by the two others (Qa = 2)
                    await lh.add_entry(payload)
                    held = max(held, _held_for(bk.pool._connections.get(hung)))
                assert held <= limit, f"{held} bytes held for a hung bookie"
                assert hung not in lh.ensemble
                md = await bk.ledger_metadata(lh.ledger_id)
                assert hung not in md.last_ensemble
            finally:
                cluster4.resume(index)
            await lh.close()
            rh = await bk.open_ledger(lh.ledger_id)
            entries = await rh.read_entries(0, 200)
            assert [e.data for e in entries[1:]] == [payload] * 200
        finally:
            await bk.close()

    run(main(), timeout_s=100)


def test_r16_oversized_entry_fails_at_once_and_affects_nothing_else(cluster3):
    async def main() -> None:
        bk = await AsyncBookKeeper.connect(cluster3.metadata_uri)
        try:
            big_one = await bk.create_ledger(3, 3, 2)
            other = await bk.create_ledger(3, 3, 2)  # same three bookies, same connections
            await big_one.add_entry(b"before")
            in_flight = [other.append(b"other %d" % i) for i in range(2000)]
            limit = bk.config.max_entry_size_bytes
            refused: InvalidArgumentError | None = None
            try:
                big_one.append(b"x" * 9 * MiB)
            except InvalidArgumentError as exc:
                refused = exc
            results = await asyncio.gather(*in_flight, return_exceptions=True)
            assert [r for r in results if not isinstance(r, int)] == []
            assert refused is not None
            assert f"{9 * MiB} bytes" in refused.message and str(limit) in refused.message
            # The refused entry took no id and changed no ensemble.
            assert await big_one.add_entry(b"after") == 1
            for handle in (big_one, other):
                md = await bk.ledger_metadata(handle.ledger_id)
                assert len(md.ensembles) == 1
                await handle.close()
            rh = await bk.open_ledger(big_one.ledger_id)
            assert [e.data for e in await rh.read_entries(0, 1)] == [b"before", b"after"]
        finally:
            await bk.close()

    run(main())


def test_r16_a_batch_closes_before_an_entry_would_push_it_past_the_frame_limit(cluster3):
    first = b"a" * (MiB - 1000)  # under add_batch_max_bytes: the batch stays open
    second = b"b" * (8 * MiB - 200)  # fits a frame alone, not with the first

    async def main() -> None:
        bk = await AsyncBookKeeper.connect(cluster3.metadata_uri)
        try:
            lh = await bk.create_ledger(3, 3, 2)
            # Both in one event-loop turn: one flush batches them for each bookie.
            futures = [lh.append(first), lh.append(second)]
            assert await asyncio.gather(*futures) == [0, 1]
            md = await bk.ledger_metadata(lh.ledger_id)
            assert len(md.ensembles) == 1
            await lh.close()
            rh = await bk.open_ledger(lh.ledger_id)
            assert [e.data for e in await rh.read_entries(0, 1)] == [first, second]
        finally:
            await bk.close()

    run(main())


def test_r16_an_entry_over_max_entry_size_bytes_is_refused_by_the_sync_api(cluster3):
    config = ClientConfig(max_entry_size_bytes=1000)
    with BookKeeper(cluster3.metadata_uri, config=config) as bk:
        lh = bk.create_ledger(3, 3, 2)
        too_big = r"1001 bytes.*limit of 1000 bytes.*max_entry_size_bytes"
        with pytest.raises(InvalidArgumentError, match=too_big):
            lh.add_entry(b"y" * 1001)
        assert lh.add_entry(b"y" * 1000) == 0
        lh.close()
