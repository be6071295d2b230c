"""R16 on the client: bounds in bytes with real bookies. What the client holds for a
bookie that does not read is bounded; an entry too large for a frame is refused at
once and costs nothing to other adds or ledgers."""

from __future__ import annotations

from support import run

from quorumlog.aio import BookKeeper as AsyncBookKeeper
from quorumlog.client.config import ClientConfig
from quorumlog.client.connection import BookieConnection

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
