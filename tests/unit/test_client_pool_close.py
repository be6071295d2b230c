"""A closed client opens no connection. Closing the pool fails the requests in flight, and
what reacts to that (a writer handle moving to another bookie, an explicit LAC falling
due) asks the pool for a connection again: a new socket then would belong to nobody and
outlive the client's event loop ("unclosed transport" when the loop is gone). A real
client connection pool and a listening socket on 127.0.0.1."""

from __future__ import annotations

import asyncio

import pytest
from support import poll_until_async, run

from quorumlog.client.connection import ConnectionPool, request_future
from quorumlog.errors import BookieUnavailableError
from quorumlog.proto.codec import BookieInfoRequest


def test_a_closed_pool_hands_out_only_closed_connections() -> None:
    async def scenario() -> None:
        accepted: list[asyncio.StreamWriter] = []
        server = await asyncio.start_server(
            lambda _reader, writer: accepted.append(writer), "127.0.0.1", 0
        )
        address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        loop = asyncio.get_running_loop()
        pool = ConnectionPool(loop, connect_timeout_ms=30_000)
        try:
            first = pool.get(address)
            await poll_until_async(
                lambda: len(accepted) == 1, timeout_s=30, what="the pool's connection"
            )
            pool.close()
            assert first.closed
            late = pool.get(address)  # as a handle reacting to the close would
            assert late.closed, "a connection opened after the pool was closed"
            with pytest.raises(BookieUnavailableError):
                await request_future(loop, late, BookieInfoRequest(0), 30_000)
        finally:
            pool.close()
            for writer in accepted:
                writer.close()
            server.close()
            await server.wait_closed()

    run(scenario())
