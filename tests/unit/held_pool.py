"""A stand-in for the client's ConnectionPool whose bookies answer adds when a test says,
and a runner for a BookKeeper client on it over an in-memory metadata store (one spare
bookie registered for replacements): ``from held_pool import HeldPool, run_client``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from quorumlog.client.bookkeeper import BookKeeper
from quorumlog.client.config import ClientConfig
from quorumlog.client.connection import ResponseCallback, request_future
from quorumlog.errors import Status
from quorumlog.meta.bookies import BookieRegistry
from quorumlog.proto.codec import (
    AddRequest,
    AddResponse,
    Op,
    Request,
    Response,
    StatusResponse,
    WriteLacRequest,
)
from quorumlog.testing.memory_store import MemoryStore

BOOKIES = ("10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181")
SPARE = "10.0.0.4:3181"


class _Sender:
    def __init__(self, pool: HeldPool, address: str) -> None:
        self.pool = pool
        self.address = address
        self.closed = False

    def send(self, request: Request, callback: ResponseCallback, timeout_ms: float | None) -> None:
        if isinstance(request, WriteLacRequest):  # explicit LACs are answered at once
            answer = StatusResponse(request.request_id, Op.WRITE_LAC, 0, request.ledger_id)
            asyncio.get_running_loop().call_soon(callback, answer)
            return
        self.pool.held.append((self.address, request, callback))


class HeldPool:
    """A stand-in for the ConnectionPool: requests wait until :meth:`answer_adds`."""

    def __init__(self) -> None:
        self.held: list[tuple[str, Request, ResponseCallback]] = []

    def get(self, address: str) -> _Sender:
        return _Sender(self, address)

    def request(
        self, address: str, request: Request, timeout_ms: float | None
    ) -> asyncio.Future[Response]:
        return request_future(asyncio.get_running_loop(), self.get(address), request, timeout_ms)

    def answer_adds(self, address: str, status: Status = Status.OK) -> int:
        """Answer every ADD held for ``address``; the number of entries answered."""
        answered = 0
        for held in [h for h in self.held if h[0] == address and isinstance(h[1], AddRequest)]:
            self.held.remove(held)
            _, request, callback = held
            assert isinstance(request, AddRequest)
            callback(
                AddResponse(request.request_id, status, request.ledger_id, len(request.entries))
            )
            answered += len(request.entries)
        return answered

    def close(self) -> None:
        return


def run_client(
    main: Callable[[BookKeeper, HeldPool], Awaitable[None]], config: ClientConfig
) -> None:
    async def runner() -> None:
        store = MemoryStore()
        await BookieRegistry(store).register(SPARE)
        pool = HeldPool()
        bk = BookKeeper(store, config, pool=pool)  # type: ignore[arg-type]
        try:
            await asyncio.wait_for(main(bk, pool), 30)
        finally:
            await bk.close()

    asyncio.run(runner())


async def turns(count: int = 5) -> None:
    for _ in range(count):
        await asyncio.sleep(0)
