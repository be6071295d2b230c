"""A closed client opens no connection. Closing the pool fails the requests in flight, and
what reacts to that (a writer handle moving to another bookie, an explicit LAC falling
due) asks the pool for a connection again: a new socket then would belong to nobody and
outlive the client's event loop ("unclosed transport" when the loop is gone). A real
client connection pool and a listening socket on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from pathlib import Path

import pytest
from support import poll_until_async, run
from tls_certs import make_tls_material

from quorumlog.client.connection import ConnectionPool, request_future
from quorumlog.errors import BookieUnavailableError
from quorumlog.proto.codec import BookieInfoRequest
from quorumlog.security.tls import TlsFiles, TlsReloader


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


def _slow_tls_peer(listener: socket.socket, context: ssl.SSLContext, answers: list[str]) -> None:
    """One TLS connection, in a thread: the handshake, then 0.3 s of delay before it reads
    the client's close_notify (a bookie on a loaded machine), then the close."""
    listener.settimeout(30)
    conn, _ = listener.accept()
    with context.wrap_socket(conn, server_side=True) as tls:
        time.sleep(0.3)
        tls.settimeout(30)
        with contextlib.suppress(OSError):
            answers.append(repr(tls.recv(1)))  # b'' at the close_notify


def test_a_closed_pool_waits_until_its_tls_sockets_are_closed(tmp_path: Path) -> None:
    """Closing a TLS connection is a close_notify exchange that needs the event loop a
    moment more; a client that ended its loop at once (asyncio.run) left the socket open
    for the garbage collector ("unclosed transport"). ``wait_closed`` waits for it."""
    material = make_tls_material(tmp_path / "tls")
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(material.server_cert, material.server_key)
    client_side = TlsReloader(TlsFiles(ca_file=str(material.ca_cert)), server_side=False)
    listener = socket.create_server(("127.0.0.1", 0))
    answers: list[str] = []
    peer = threading.Thread(target=_slow_tls_peer, args=(listener, server_side, answers))
    peer.start()

    async def scenario() -> socket.socket:
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        pool = ConnectionPool(
            asyncio.get_running_loop(), connect_timeout_ms=30_000, ssl_context=client_side.current
        )
        conn = pool.get(address)
        await poll_until_async(
            lambda: conn._transport is not None, timeout_s=30, what="the TLS handshake"
        )
        assert conn._transport is not None
        raw = conn._transport.get_extra_info("socket")
        pool.close()
        await pool.wait_closed()
        return raw  # type: ignore[no-any-return]

    try:
        raw = run(scenario())
    finally:
        peer.join(60)
        listener.close()
    assert answers == ["b''"]  # the peer got the client's close_notify
    assert raw.fileno() == -1, "the TLS socket outlived the client's event loop"
