"""The asyncio API: the same names as the synchronous one, as coroutines.

Example::

    import asyncio
    from quorumlog.aio import BookKeeper

    async def main() -> None:
        async with await BookKeeper.connect() as bk:
            lh = await bk.create_ledger(3, 3, 2)
            futures = [lh.append(b"x" * 100) for _ in range(1000)]  # pipelined
            await asyncio.gather(*futures)
            await lh.close()

    asyncio.run(main())
"""

from quorumlog.client.config import ClientConfig
from quorumlog.client.reading import ReadHandle
from quorumlog.client.writing import LedgerHandle

# The client with log streams (``await bk.open_log(name)``), composed above the
# client package, which knows ledgers only.
from quorumlog.log.bookkeeper import BookKeeper

__all__ = ["BookKeeper", "ClientConfig", "LedgerHandle", "ReadHandle"]
