"""TLS as an attacker and an operator see it (quorumlog.security.tls), over real sockets on
127.0.0.1: a client certificate of another CA, a bookie certificate that does not name
the address dialled, and a certificate file left half-written for a while."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from pathlib import Path

import pytest
from support import run
from tls_certs import TlsMaterial, make_tls_material

from quorumlog.security.tls import TlsFiles, TlsReloader, client_context


@pytest.fixture
def material(tmp_path: Path) -> TlsMaterial:
    return make_tls_material(tmp_path / "tls")


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        writer.write(await reader.readexactly(4))
        await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


async def _echo_over(port: int, context: ssl.SSLContext, server_hostname: str) -> bytes:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname=server_hostname
    )
    try:
        writer.write(b"ping")
        return await reader.readexactly(4)
    finally:
        writer.close()


def test_tls_mutual_tls_refuses_a_client_certificate_of_another_ca(
    material: TlsMaterial, tmp_path: Path
):
    other = make_tls_material(tmp_path / "other")  # a CA the bookie does not trust
    reloader = TlsReloader(
        TlsFiles(str(material.server_cert), str(material.server_key), str(material.ca_cert)),
        server_side=True,
    )
    # The stranger trusts the bookie's CA, so only the bookie's check can refuse it.
    stranger = client_context(
        TlsFiles(str(other.client_cert), str(other.client_key), str(material.ca_cert))
    )
    member = client_context(
        TlsFiles(str(material.client_cert), str(material.client_key), str(material.ca_cert))
    )

    async def scenario() -> None:
        server = await asyncio.start_server(
            _echo, "127.0.0.1", 0, ssl=reloader.server_front_context()
        )
        port = server.sockets[0].getsockname()[1]
        async with server:
            assert await _echo_over(port, member, "127.0.0.1") == b"ping"
            with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
                await _echo_over(port, stranger, "127.0.0.1")

    run(scenario())


def test_tls_clients_check_that_the_certificate_names_the_address(
    material: TlsMaterial,
):
    """The bookie's certificate names 127.0.0.1 (an IP address SAN): a client that dials
    it by another name refuses it, though the CA is right."""
    context = client_context(TlsFiles(ca_file=str(material.ca_cert)))
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    reloader = TlsReloader(
        TlsFiles(str(material.server_cert), str(material.server_key)), server_side=True
    )

    async def scenario() -> None:
        server = await asyncio.start_server(
            _echo, "127.0.0.1", 0, ssl=reloader.server_front_context()
        )
        port = server.sockets[0].getsockname()[1]
        async with server:
            assert await _echo_over(port, context, "127.0.0.1") == b"ping"
            with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
                await _echo_over(port, context, "localhost")

    run(scenario())


class _Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def _bump_mtime(path: Path) -> None:
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def test_tls_a_file_left_half_written_is_logged_once_and_the_old_context_serves(
    material: TlsMaterial, caplog: pytest.LogCaptureFixture
):
    clock = _Clock()
    reloader = TlsReloader(
        TlsFiles(str(material.server_cert), str(material.server_key)),
        server_side=True,
        check_interval_s=1.0,
        clock=clock,
    )
    before = reloader.current()
    good_key = material.server_key.read_bytes()
    material.server_key.write_bytes(good_key[: len(good_key) // 2])
    _bump_mtime(material.server_key)
    with caplog.at_level(logging.WARNING, logger="quorumlog.security.tls"):
        for _ in range(5):  # five seconds of new connections with the file half-written
            clock.now_s += 1.0
            assert reloader.current() is before
    warnings = [r for r in caplog.records if "do not load" in r.getMessage()]
    assert len(warnings) == 1
    assert str(material.server_key) in warnings[0].getMessage()
    # Finished: the next look loads it.
    material.server_key.write_bytes(good_key)
    _bump_mtime(material.server_key)
    clock.now_s += 1.0
    assert reloader.current() is not before
    assert reloader.reloads == 1


def test_tls_a_replaced_ca_file_decides_who_comes_in_after_the_reload(
    material: TlsMaterial, tmp_path: Path
):
    """An operator who replaces the CA (one that leaked) expects clients of the old CA
    to be refused from the next connection on, though the listener's front context
    was built with the old CA."""
    other = make_tls_material(tmp_path / "other")
    clock = _Clock()
    ca_file = tmp_path / "clients-ca.pem"
    ca_file.write_bytes(material.ca_cert.read_bytes())
    reloader = TlsReloader(
        TlsFiles(str(material.server_cert), str(material.server_key), str(ca_file)),
        server_side=True,
        clock=clock,
    )
    trusting_bookie = [str(material.ca_cert)]
    old_client = client_context(
        TlsFiles(str(material.client_cert), str(material.client_key), *trusting_bookie)
    )
    new_client = client_context(
        TlsFiles(str(other.client_cert), str(other.client_key), *trusting_bookie)
    )

    async def scenario() -> None:
        server = await asyncio.start_server(
            _echo, "127.0.0.1", 0, ssl=reloader.server_front_context()
        )
        port = server.sockets[0].getsockname()[1]
        async with server:
            assert await _echo_over(port, old_client, "127.0.0.1") == b"ping"
            ca_file.write_bytes(other.ca_cert.read_bytes())
            _bump_mtime(ca_file)
            clock.now_s += 2.0
            assert await _echo_over(port, new_client, "127.0.0.1") == b"ping"
            assert reloader.reloads == 1
            with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
                await _echo_over(port, old_client, "127.0.0.1")

    run(scenario())
