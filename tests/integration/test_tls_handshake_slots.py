"""A TLS bookie process and peers whose handshake fails (a plain client, a scanner) or
never comes: each must give back its connection slot, or a few hundred of them lock
every client out of the bookie for good (``max_connections``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from support import poll_until_async, run
from tls_certs import make_tls_material

from quorumlog.client.connection import BookieConnection, request_future
from quorumlog.errors import BookieUnavailableError
from quorumlog.proto.codec import BookieInfoRequest, BookieInfoResponse
from quorumlog.security.tls import TlsFiles, TlsReloader
from quorumlog.server.local_cluster import LocalCluster

MAX_CONNECTIONS = 3
TIMEOUT_MS = 10_000


async def _failed_handshakes(address: str, count: int) -> None:
    """``count`` peers that speak no TLS: each writes bytes and waits for the close."""
    host, port = address.rsplit(":", 1)
    for _ in range(count):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET / HTTP/1.0\r\n\r\n")
        async with asyncio.timeout(TIMEOUT_MS / 1000):
            while await reader.read(4096):
                pass
        writer.close()


async def _silent_peers(address: str, count: int) -> list[asyncio.StreamWriter]:
    host, port = address.rsplit(":", 1)
    return [(await asyncio.open_connection(host, int(port)))[1] for _ in range(count)]


async def _served(address: str, tls: TlsFiles) -> bool:
    loop = asyncio.get_running_loop()
    connection = BookieConnection(
        address,
        loop,
        connect_timeout_ms=TIMEOUT_MS,
        ssl_context=TlsReloader(tls, server_side=False).current,
    )
    try:
        answer = await request_future(loop, connection, BookieInfoRequest(0), TIMEOUT_MS)
        return isinstance(answer, BookieInfoResponse)
    except BookieUnavailableError:  # a connection over max_connections: closed at once
        return False
    finally:
        connection.close()
        await connection.wait_closed(TIMEOUT_MS / 1000)  # the TLS close, before run() ends


async def _served_again(address: str, tls: TlsFiles, what: str) -> None:
    """Served again once the bookie gave the slots back (a handshake deadline of 500 ms,
    then a second before a connection never made is forgotten). The bound is generous for
    a loaded machine, yet well under asyncio's own 60 s handshake timeout, which would
    free the slots without the deadline."""
    await poll_until_async(lambda: _served(address, tls), timeout_s=20, what=what, interval_s=0.1)


async def _scenario(address: str, tls: TlsFiles) -> None:
    assert await _served(address, tls)
    # Twice the slots in failed handshakes, one after the other.
    await _failed_handshakes(address, 2 * MAX_CONNECTIONS)
    await _served_again(address, tls, "a TLS client after failed handshakes")
    # Peers that open TCP and never start a handshake hold slots until the handshake
    # deadline, then give them back.
    silent = await _silent_peers(address, MAX_CONNECTIONS)
    try:
        await _served_again(address, tls, "a TLS client after silent peers")
    finally:
        for writer in silent:
            writer.close()


def test_tls_failed_and_missing_handshakes_give_their_slots_back(tmp_path: Path):
    material = make_tls_material(tmp_path / "tls")
    metadata_uri = f"sqlite://{tmp_path / 'metadata.db'}"
    flags = [
        "--tls-cert", str(material.server_cert),
        "--tls-key", str(material.server_key),
        "--max-connections", str(MAX_CONNECTIONS),
        "--tls-handshake-timeout-ms", "500",
    ]  # fmt: skip
    with LocalCluster(metadata_uri, tmp_path / "cluster", 0) as cluster:
        cluster.start_new_bookie(flags)
        run(_scenario(cluster.addresses[0], TlsFiles(ca_file=str(material.ca_cert))))
