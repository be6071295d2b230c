"""A client connection renews its token before the bookie would end the connection:
a real client connection (quorumlog.client.connection) and a real bookie connection
(quorumlog.server.connection) over a socket on 127.0.0.1, with a stand-in bookie."""

from __future__ import annotations

import asyncio
import time
import types
from typing import Any

import pytest
from support import holds_for_async, run
from tls_certs import HMAC_SECRET

from quorumlog.client import connection as client_connection
from quorumlog.client.connection import BookieConnection, request_future
from quorumlog.errors import Status
from quorumlog.proto.codec import BookieInfoRequest, BookieInfoResponse, Request
from quorumlog.security import Role, TokenVerifier, issue_token
from quorumlog.security.tokens import renewal_delay_s
from quorumlog.server import connection as server_connection
from quorumlog.server.config import ServerConfig
from quorumlog.server.connection import BookieProtocol


class InfoBookie:
    def submit(self, request: Request, respond: Any) -> None:
        respond(BookieInfoResponse(request.request_id, Status.OK, False, 1, 2))


def test_auth_renewal_comes_halfway_through_a_short_life_and_30_s_before_a_long_one():
    assert renewal_delay_s(expires_at_s=110.0, now_s=100.0) == 5.0
    assert renewal_delay_s(expires_at_s=1000.0, now_s=100.0) == 870.0
    assert renewal_delay_s(expires_at_s=90.0, now_s=100.0) == 0.0


def test_auth_a_renewed_token_keeps_the_connection_past_the_first_ones_expiry(
    monkeypatch: pytest.MonkeyPatch,
):
    """The token's exp is an hour ahead, so its check (PyJWT, on the real clock) passes
    however slow the machine is. The connections' wall clocks are set so that the bookie
    ends the connection 3 s from now, while the client sees the token 0.4 s from its end
    and renews it at once: only a stall of most of those 3 s could fail this. (A token of
    2-3 s of real life, renewed halfway, failed whenever the machine stalled for about a
    second at the wrong moment.)"""
    exp_s = int(time.time()) + 3600
    holder = {"token": issue_token(HMAC_SECRET, [Role.CLIENT], expires_at_s=exp_s)}
    real_time, started_s = time.time, time.time()
    first_expiry_s = started_s + 3.0  # on the real clock: when the bookie ends it
    bookie_clock = types.SimpleNamespace(time=lambda: exp_s - 3.0 + real_time() - started_s)
    client_clock = types.SimpleNamespace(time=lambda: exp_s - 0.4 + real_time() - started_s)
    monkeypatch.setattr(server_connection, "time", bookie_clock)
    monkeypatch.setattr(client_connection, "time", client_clock)

    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        connections: list[BookieProtocol] = []
        config = ServerConfig(token_verifier=TokenVerifier.from_key_bytes(HMAC_SECRET))

        def protocol() -> BookieProtocol:
            connections.append(BookieProtocol(InfoBookie(), config, loop, lambda _: None))
            return connections[-1]

        server = await loop.create_server(protocol, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = BookieConnection(
            f"127.0.0.1:{port}", loop, connect_timeout_ms=5_000, token=lambda: holder["token"]
        )
        try:
            answer = await request_future(loop, client, BookieInfoRequest(0), 5_000)
            assert isinstance(answer, BookieInfoResponse)
            subjects = [connections[0].identity.subject]  # type: ignore[union-attr]
            # The token source now holds a renewed token: the client presents it itself.
            holder["token"] = issue_token(
                HMAC_SECRET, [Role.CLIENT], subject="renewed", expires_at_s=exp_s + 3600
            )
            await holds_for_async(
                lambda: not client.closed,
                duration_s=first_expiry_s - real_time() + 1.0,
                what="the connection stays open past the first token's expiry",
            )
            answer = await request_future(loop, client, BookieInfoRequest(0), 5_000)
            assert isinstance(answer, BookieInfoResponse)
            subjects.append(connections[0].identity.subject)  # type: ignore[union-attr]
            assert len(connections) == 1  # the same connection all along
            return subjects
        finally:
            client.close()
            server.close()

    assert run(scenario()) == ["", "renewed"]
