"""The asyncio API: the same names as the synchronous one, as coroutines.

Example::

    import asyncio
    from quorumlog.aio import BookKeeper, LogNamespace

    async def main() -> None:
        async with await BookKeeper.connect() as bk:
            lh = await bk.create_ledger(3, 3, 2)
            futures = [lh.append(b"x" * 100) for _ in range(1000)]  # pipelined
            await asyncio.gather(*futures)
            await lh.close()
            log = await LogNamespace(bk).open_log("orders")   # log streams over the client

    asyncio.run(main())
"""

from quorumlog.client.bookkeeper import BookKeeper
from quorumlog.client.config import ClientConfig
from quorumlog.client.reading import ReadHandle
from quorumlog.client.writing import LedgerHandle
from quorumlog.log.namespace import LogNamespace

__all__ = ["BookKeeper", "ClientConfig", "LedgerHandle", "LogNamespace", "ReadHandle"]
