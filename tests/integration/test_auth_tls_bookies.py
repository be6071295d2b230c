"""TLS and tokens on real bookie processes, on both metadata drivers (docs/SECURITY.md).

One cluster per driver: two bookies serving mutual TLS and checking tokens (an HMAC key
file), then a third, plain bookie. A client with the right certificate and token writes
and reads; every other kind of client gets an error that says what is wrong: no TLS,
TLS without a client certificate, no token, a token signed with another key, an expired
token, a role that may not send the request; TLS against the plain bookie. Then the
bookie's certificate is replaced on disk and a new connection gets the new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from support import BOOKIE_COMMAND, poll_until, port_for_a_child, run
from tls_certs import HMAC_SECRET, TlsMaterial, make_tls_material, write_hmac_key

from quorumlog.aio import BookKeeper
from quorumlog.client.config import ClientConfig
from quorumlog.client.connection import BookieConnection, request_future
from quorumlog.errors import AuthenticationError, BKError, BookieUnavailableError, Status
from quorumlog.proto.codec import (
    AddRequest,
    BookieInfoRequest,
    BookieInfoResponse,
    DeleteLedgerRequest,
    Request,
    Response,
)
from quorumlog.security import Role, issue_token
from quorumlog.security.tls import TlsFiles, TlsReloader
from quorumlog.server.local_cluster import LocalCluster

KEY = bytes(20)
TIMEOUT_MS = 10_000


def _token(*roles: Role | str, expires_in_s: float = 3600, key: bytes = HMAC_SECRET) -> str:
    return issue_token(key, roles, subject="test", expires_at_s=time.time() + expires_in_s)


async def _ask(
    address: str,
    request: Request,
    *,
    tls: TlsFiles | None,
    token: str | None,
) -> Response:
    """``request`` on a new connection with these credentials: the answer, or the error."""
    loop = asyncio.get_running_loop()
    context = TlsReloader(tls, server_side=False).current if tls is not None else None
    connection = BookieConnection(
        address,
        loop,
        connect_timeout_ms=TIMEOUT_MS,
        ssl_context=context,
        token=lambda: token,
    )
    try:
        return await request_future(loop, connection, request, TIMEOUT_MS)
    finally:
        connection.close()
        await connection.wait_closed(TIMEOUT_MS / 1000)  # the TLS close, before run() ends


def _error_of(address: str, request: Request, **credentials: object) -> BKError:
    with pytest.raises(BKError) as caught:
        run(_ask(address, request, **credentials))  # type: ignore[arg-type]
    return caught.value


@pytest.fixture
def material(tmp_path: Path) -> TlsMaterial:
    return make_tls_material(tmp_path / "tls")


def test_tls_and_tokens_let_in_only_clients_with_both_and_say_why_to_others(
    metadata_uri: str, tmp_path: Path, material: TlsMaterial
):
    key_file = write_hmac_key(tmp_path)
    secure = [
        "--tls-cert", str(material.server_cert),
        "--tls-key", str(material.server_key),
        "--tls-ca", str(material.ca_cert),
        "--token-key-file", str(key_file),
        "--http-port", "0",
    ]  # fmt: skip
    mutual = TlsFiles(str(material.client_cert), str(material.client_key), str(material.ca_cert))
    token_file = tmp_path / "client.token"
    token_file.write_text(_token(Role.CLIENT))
    # The second bookie takes the same settings from a configuration file.
    config_file = tmp_path / "bookie.toml"
    config_file.write_text(
        f'tls_cert = "{material.server_cert}"\ntls_key = "{material.server_key}"\n'
        f'tls_ca = "{material.ca_cert}"\ntoken_key_file = "{key_file}"\nhttp_port = 0\n'
    )
    # --config is the command's: these bookies run ``quorumlog bookie``.
    with LocalCluster(metadata_uri, tmp_path / "cluster", 0, entry_point=BOOKIE_COMMAND) as cluster:
        cluster.start_new_bookie(secure)
        cluster.start_new_bookie(["--config", str(config_file)])
        assert b" admin https://" in cluster.bookies[1].stdout_path.read_bytes()
        bookie = cluster.addresses[0]

        # The right certificate and token: a ledger written, closed and read back.
        async def write_and_read() -> list[bytes]:
            config = ClientConfig(tls=mutual, token_file=str(token_file))
            bk = await BookKeeper.connect(metadata_uri, config=config)
            try:
                lh = await bk.create_ledger(2, 2, 2, password=b"pw")
                for i in range(5):
                    await lh.add_entry(b"entry-%d" % i)
                await lh.close()
                rh = await bk.open_ledger(lh.ledger_id, b"pw")
                return [e.data for e in await rh.read_entries(0, 4)]
            finally:
                await bk.close()

        assert run(write_and_read()) == [b"entry-%d" % i for i in range(5)]

        info = BookieInfoRequest(0)
        good = _token(Role.CLIENT)
        assert isinstance(run(_ask(bookie, info, tls=mutual, token=good)), BookieInfoResponse)

        # A plain client: the TLS bookie closes without a byte; the client says why.
        plain = _error_of(bookie, info, tls=None, token=good)
        assert "tls setting" in str(plain), plain
        # TLS, but no client certificate for a bookie that asks for one.
        no_cert = _error_of(bookie, info, tls=TlsFiles(ca_file=str(material.ca_cert)), token=good)
        assert isinstance(no_cert, BookieUnavailableError), no_cert

        # Tokens: missing, signed with another key, expired; each refused with its reason.
        cases = {
            None: "authentication required",
            _token(Role.CLIENT, key=b"z" * 40): "signature does not verify",
            _token(Role.CLIENT, expires_in_s=-10): "token expired",
        }
        for token, reason in cases.items():
            refused = _error_of(bookie, info, tls=mutual, token=token)
            assert isinstance(refused, AuthenticationError), refused
            assert reason in str(refused) and bookie in str(refused)

        # Roles: a bookie token may not add as a writer; only an admin deletes.
        add = AddRequest(0, 1, KEY, [])
        as_bookie = run(_ask(bookie, add, tls=mutual, token=_token(Role.BOOKIE)))
        assert as_bookie.status == Status.UNAUTHORIZED
        delete = DeleteLedgerRequest(0, 999, KEY)
        as_client = run(_ask(bookie, delete, tls=mutual, token=good))
        assert as_client.status == Status.UNAUTHORIZED
        as_admin = run(_ask(bookie, delete, tls=mutual, token=_token(Role.ADMIN)))
        assert as_admin.status != Status.UNAUTHORIZED

        # The admin API: HTTPS with the same certificates, the same tokens as Bearer.
        admin_url = re.search(rb"admin (https://\S+)", cluster.bookies[0].stdout_path.read_bytes())
        assert admin_url is not None
        statuses = run(_admin_statuses(admin_url.group(1).decode(), mutual, good))
        assert statuses == {
            "heartbeat, no token": 200,
            "info, no token": 401,
            "info, client": 200,
            "read-only switch, client": 403,
            "read-only switch, admin": 200,
        }

        # The shell's gc goes through each bookie's admin API: with an admin token and
        # the shell's TLS settings it collects; with a client token it is refused.
        admin_file = tmp_path / "admin.token"
        admin_file.write_text(_token(Role.ADMIN))
        shell_tls = [
            "--tls-ca", str(material.ca_cert),
            "--tls-cert", str(material.client_cert), "--tls-key", str(material.client_key),
        ]  # fmt: skip
        as_admin_gc = _shell(metadata_uri, [*shell_tls, "--token-file", str(admin_file), "gc"])
        assert as_admin_gc.returncode == 0, as_admin_gc.stderr
        as_client_gc = _shell(metadata_uri, [*shell_tls, "--token-file", str(token_file), "gc"])
        assert as_client_gc.returncode != 0 and "HTTP 403" in as_client_gc.stderr

        # The database's API: HTTPS and tokens; its replica reaches the bookies with
        # mutual TLS and its own client token.
        db_statuses = _db_statuses(metadata_uri, tmp_path, material, key_file, token_file)
        assert db_statuses == {
            "readyz, no token": 200,
            "execute, no token": 401,
            "execute, client": 200,
            "query, client": 200,
            "backup, client": 403,
        }

        # The reverse: a TLS client against a bookie that serves no TLS.
        plain_index = cluster.start_new_bookie()
        assert [b.alive() for b in cluster.bookies] == [True, True, True]
        plain_bookie = cluster.bookies[plain_index].address
        reverse = _error_of(plain_bookie, info, tls=mutual, token=None)
        assert isinstance(reverse, AuthenticationError), reverse
        assert "does not serve TLS" in str(reverse)

        # Certificates replaced on disk serve the next connection, without a restart.
        renewed_cert, renewed_key = material.issue("bookie-renewed")
        material.server_key.write_bytes(renewed_key.read_bytes())
        material.server_cert.write_bytes(renewed_cert.read_bytes())

        def served_name() -> str:
            return run(_served_common_name(bookie, mutual))

        poll_until(
            lambda: served_name() == "bookie-renewed",
            timeout_s=30,
            what="the bookie serves the renewed certificate to a new connection",
            interval_s=0.2,
        )
        assert isinstance(run(_ask(bookie, info, tls=mutual, token=good)), BookieInfoResponse)


def _shell(metadata_uri: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "quorumlog", "shell", "--metadata", metadata_uri, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def _db_statuses(
    metadata_uri: str, tmp_path: Path, material: TlsMaterial, key_file: Path, token_file: Path
) -> dict[str, int]:
    """Run ``quorumlog db serve`` on the secure bookies; the status of each request."""
    address = f"127.0.0.1:{port_for_a_child()}"
    command = [
        sys.executable, "-m", "quorumlog", "db", "serve", "--metadata", metadata_uri,
        "--name", "secure", "--data-dir", str(tmp_path / "db"),
        "--http-addr", address,
        "--ensemble", "2", "--write-quorum", "2", "--ack-quorum", "2",
        "--http-tls-cert", str(material.server_cert), "--http-tls-key", str(material.server_key),
        "--token-key-file", str(key_file),
        "--tls-ca", str(material.ca_cert), "--tls-cert", str(material.client_cert),
        "--tls-key", str(material.client_key), "--token-file", str(token_file),
    ]  # fmt: skip
    out = tmp_path / "db.out"
    with out.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    try:
        poll_until(
            lambda: b"serving on https://" in out.read_bytes() or process.poll() is not None,
            timeout_s=60,
            what="the database replica serves",
            interval_s=0.05,
        )
        found = re.search(rb"serving on (https://\S+)", out.read_bytes())
        assert found is not None, out.read_text()
        mutual = TlsFiles(ca_file=str(material.ca_cert))
        return run(_db_requests(found.group(1).decode(), mutual, token_file.read_text()))
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def _db_requests(url: str, tls: TlsFiles, client_token: str) -> dict[str, int]:
    context = TlsReloader(tls, server_side=False).current()
    asks = {
        "readyz, no token": ("GET", "/readyz", None, None),
        "execute, no token": ("POST", "/db/execute", None, ["CREATE TABLE t (x INTEGER)"]),
        "execute, client": ("POST", "/db/execute", client_token, ["CREATE TABLE t (x INTEGER)"]),
        "query, client": ("GET", "/db/query?q=SELECT+count(*)+FROM+t", client_token, None),
        "backup, client": ("GET", "/db/backup", client_token, None),
    }
    statuses: dict[str, int] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        for name, (method, path, token, body) in asks.items():
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            for _ in range(100):  # readyz may say "not yet" while the replica starts
                async with session.request(method, url + path, headers=headers, json=body) as r:
                    statuses[name] = r.status
                if r.status != 503:
                    break
                await asyncio.sleep(0.1)
    return statuses


async def _admin_statuses(url: str, tls: TlsFiles, client_token: str) -> dict[str, int]:
    context = TlsReloader(tls, server_side=False).current()
    admin_token = _token(Role.ADMIN)
    asks = {
        "heartbeat, no token": ("GET", "/heartbeat", None, None),
        "info, no token": ("GET", "/api/v1/bookie/info", None, None),
        "info, client": ("GET", "/api/v1/bookie/info", client_token, None),
        "read-only switch, client": ("PUT", "/api/v1/bookie/state", client_token, False),
        "read-only switch, admin": ("PUT", "/api/v1/bookie/state", admin_token, False),
    }
    statuses: dict[str, int] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        for name, (method, path, token, read_only) in asks.items():
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            body = None if read_only is None else {"readOnly": read_only}
            async with session.request(method, url + path, headers=headers, json=body) as r:
                statuses[name] = r.status
    return statuses


async def _served_common_name(address: str, tls: TlsFiles) -> str:
    host, _, port = address.rpartition(":")
    context = TlsReloader(tls, server_side=False).current()
    _, writer = await asyncio.open_connection(host, int(port), ssl=context, server_hostname=host)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).subject.rfc4514_string().removeprefix("CN=")
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await asyncio.wait_for(writer.wait_closed(), TIMEOUT_MS / 1000)
