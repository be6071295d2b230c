"""TLS contexts from files (quorumlog.security.tls): served over real sockets on 127.0.0.1
with the contexts the bookie and the client use, certificates made by the test.

Each test runs a tiny asyncio echo server: what matters here is the handshake (which
certificate is served, which client is let in), not the bookie protocol.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from support import run
from tls_certs import TlsMaterial, make_tls_material

from quorumlog.security.tls import TlsFiles, TlsReloader, client_context


@pytest.fixture
def material(tmp_path: Path) -> TlsMaterial:
    return make_tls_material(tmp_path / "tls")


class _Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        writer.write(await reader.readexactly(4))
        await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


async def _served_common_name(port: int, context: ssl.SSLContext) -> str:
    """Connect, echo 4 bytes, and return the common name of the certificate served."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname="127.0.0.1"
    )
    try:
        writer.write(b"ping")
        assert await reader.readexactly(4) == b"ping"
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        name = x509.load_der_x509_certificate(der).subject.rfc4514_string()
        return name.removeprefix("CN=")
    finally:
        writer.close()


def _bump_mtime(*paths: Path) -> None:
    # A rewrite within the same clock tick could keep the mtime: move it on explicitly.
    for path in paths:
        stat = os.stat(path)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def test_tls_new_certificates_serve_new_connections_without_a_restart(material: TlsMaterial):
    files = TlsFiles(str(material.server_cert), str(material.server_key))
    clock = _Clock()
    reloader = TlsReloader(files, server_side=True, check_interval_s=1.0, clock=clock)
    trusting = client_context(TlsFiles(ca_file=str(material.ca_cert)))

    async def scenario() -> None:
        server = await asyncio.start_server(
            _echo, "127.0.0.1", 0, ssl=reloader.server_front_context()
        )
        port = server.sockets[0].getsockname()[1]
        async with server:
            assert await _served_common_name(port, trusting) == "bookie"
            # The operator replaces the certificate and key in place.
            new_cert, new_key = material.issue("bookie-renewed")
            material.server_cert.write_bytes(new_cert.read_bytes())
            material.server_key.write_bytes(new_key.read_bytes())
            _bump_mtime(material.server_cert, material.server_key)
            # Not looked at before the interval has passed: still the old one.
            assert await _served_common_name(port, trusting) == "bookie"
            clock.now_s += 1.0
            assert await _served_common_name(port, trusting) == "bookie-renewed"
            assert reloader.reloads == 1

    run(scenario())


def test_tls_half_written_files_keep_the_previous_certificate(material: TlsMaterial):
    files = TlsFiles(str(material.server_cert), str(material.server_key))
    reloader = TlsReloader(files, server_side=True)
    before = reloader.current()
    material.server_key.write_text("not a key yet\n")
    _bump_mtime(material.server_key)
    assert reloader.reload_if_changed() is False
    assert reloader.current() is before


def test_tls_mutual_tls_lets_in_only_clients_with_a_certificate_of_the_ca(
    material: TlsMaterial,
):
    files = TlsFiles(str(material.server_cert), str(material.server_key), str(material.ca_cert))
    reloader = TlsReloader(files, server_side=True)
    with_cert = client_context(
        TlsFiles(str(material.client_cert), str(material.client_key), str(material.ca_cert))
    )
    without_cert = client_context(TlsFiles(ca_file=str(material.ca_cert)))

    async def scenario() -> None:
        server = await asyncio.start_server(
            _echo, "127.0.0.1", 0, ssl=reloader.server_front_context()
        )
        port = server.sockets[0].getsockname()[1]
        async with server:
            assert await _served_common_name(port, with_cert) == "bookie"
            # TLS 1.3: the refusal comes after the client's handshake, as an alert or EOF.
            with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
                await _served_common_name(port, without_cert)

    run(scenario())


def test_tls_client_refuses_an_expired_or_unknown_bookie_certificate(
    material: TlsMaterial, tmp_path: Path
):
    trusting = client_context(TlsFiles(ca_file=str(material.ca_cert)))
    expired = TlsReloader(
        TlsFiles(str(material.expired_cert), str(material.expired_key)), server_side=True
    )
    other = make_tls_material(tmp_path / "other-ca")
    unknown = TlsReloader(TlsFiles(str(other.server_cert), str(other.server_key)), server_side=True)

    async def scenario() -> None:
        for reloader, why in ((expired, "expired"), (unknown, "certificate verify failed")):
            server = await asyncio.start_server(
                _echo, "127.0.0.1", 0, ssl=reloader.server_front_context()
            )
            port = server.sockets[0].getsockname()[1]
            async with server:
                with pytest.raises(ssl.SSLCertVerificationError, match=why):
                    await _served_common_name(port, trusting)

    run(scenario())


def test_tls_files_that_do_not_load_are_named(material: TlsMaterial, tmp_path: Path):
    with pytest.raises(ValueError, match="both the certificate and its key"):
        TlsFiles(cert_file=str(material.server_cert))
    missing = tmp_path / "missing.pem"
    with pytest.raises(ValueError, match=r"missing\.pem: no such file"):
        TlsReloader(TlsFiles(str(missing), str(material.server_key)), server_side=True)
    with pytest.raises(ValueError, match="does not load"):
        TlsReloader(TlsFiles(str(material.server_cert), str(material.client_key)), server_side=True)
