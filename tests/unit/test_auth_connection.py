"""A bookie connection that checks tokens (quorumlog.server.connection), on a stand-in
transport: what is answered before, with and after a verified token."""

from __future__ import annotations

import asyncio
import time
import types
from typing import Any

import pytest
from support import run, run_virtual
from tls_certs import HMAC_SECRET

from quorumlog.errors import Status
from quorumlog.proto.codec import (
    AddFlag,
    AddRequest,
    AddResponse,
    AuthRequest,
    AuthResponse,
    BookieInfoRequest,
    BookieInfoResponse,
    FrameDecoder,
    Request,
    Response,
    encode,
)
from quorumlog.security import Role, TokenVerifier, issue_token
from quorumlog.server import connection as server_connection
from quorumlog.server.config import ServerConfig
from quorumlog.server.connection import BookieProtocol

KEY = bytes(20)


class Transport:
    """Records what the connection writes, and whether it closed."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def writelines(self, parts: list[bytes]) -> None:
        for part in parts:
            self.written += part

    def write(self, data: bytes) -> None:
        self.written += data

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def answers(self) -> list[Any]:
        return FrameDecoder().feed(bytes(self.written))


class AnsweringBookie:
    """Answers every request OK at once."""

    def submit(self, request: Request, respond: Any) -> None:
        if isinstance(request, AddRequest):
            respond(AddResponse(request.request_id, Status.OK, request.ledger_id, 0))
        else:
            respond(BookieInfoResponse(request.request_id, Status.OK, False, 1, 2))


async def _connection(verifier: TokenVerifier | None) -> tuple[BookieProtocol, Transport]:
    config = ServerConfig(token_verifier=verifier)
    loop = asyncio.get_running_loop()
    protocol = BookieProtocol(AnsweringBookie(), config, loop, lambda _: None)
    transport = Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return protocol, transport


async def _settle() -> None:
    for _ in range(3):  # answers are flushed once per loop turn
        await asyncio.sleep(0)


def _send(protocol: BookieProtocol, *messages: Request) -> None:
    protocol.data_received(b"".join(encode(m) for m in messages))


VERIFIER = TokenVerifier.from_key_bytes(HMAC_SECRET)


def test_auth_a_request_before_any_token_is_refused_and_the_connection_closed():
    async def scenario() -> list[Response]:
        protocol, transport = await _connection(VERIFIER)
        _send(protocol, BookieInfoRequest(5), BookieInfoRequest(6))
        await _settle()
        assert transport.closing and protocol.closed
        return transport.answers()

    answers = run(scenario())
    assert answers[0] == AuthResponse(0, Status.UNAUTHORIZED, 0, answers[0].reason)
    assert "authentication required" in answers[0].reason
    assert answers[1:] == [BookieInfoResponse(5, Status.UNAUTHORIZED, False, 0, 0)]


def test_auth_roles_decide_each_request_after_the_token_and_the_connection_stays():
    token = issue_token(HMAC_SECRET, [Role.BOOKIE]).encode()

    async def scenario() -> tuple[list[Response], bool]:
        protocol, transport = await _connection(VERIFIER)
        _send(
            protocol,
            AuthRequest(1, token),
            AddRequest(2, 7, KEY, []),  # a writer's add: not for the bookie role
            AddRequest(3, 7, KEY, [], AddFlag.RECOVERY),
        )
        await _settle()
        return transport.answers(), transport.closing

    answers, closed = run(scenario())
    assert answers == [
        AuthResponse(1, Status.OK, 4, ""),
        AddResponse(2, Status.UNAUTHORIZED, 7, 0),
        AddResponse(3, Status.OK, 7, 0),
    ]
    assert not closed


def test_auth_a_connection_ends_when_its_token_expires(monkeypatch: pytest.MonkeyPatch):
    """The connection ends at the token's exp, not before, and says why. The token's exp
    is an hour ahead, so its check (PyJWT, on the real clock) passes however slow the
    machine is; the connection's wall clock is set one second before that exp, on a
    virtual-time loop, so no real time passes between the check and the expiry. (With a
    token of 0.5-1.5 s of real life, a machine that stalled that long failed the check.)"""
    exp_s = int(time.time()) + 3600
    token = issue_token(HMAC_SECRET, [Role.CLIENT], expires_at_s=exp_s).encode()

    async def scenario(loop: asyncio.AbstractEventLoop) -> tuple[list[Response], float]:
        clock = types.SimpleNamespace(time=lambda: exp_s - 1.0 + loop.time())
        monkeypatch.setattr(server_connection, "time", clock)
        protocol, transport = await _connection(VERIFIER)
        started = loop.time()
        _send(protocol, AuthRequest(1, token))
        await _settle()
        assert not transport.closing
        while not transport.closing:
            await asyncio.sleep(0.01)
        return transport.answers(), loop.time() - started

    answers, closed_after_s = run_virtual(scenario)
    assert answers == [
        AuthResponse(1, Status.OK, 1, ""),
        AuthResponse(0, Status.UNAUTHORIZED, 0, "token expired"),
    ]
    assert 1.0 <= closed_after_s < 1.05


def test_auth_a_bookie_without_a_key_answers_ok_and_serves_everyone():
    async def scenario() -> list[Response]:
        protocol, transport = await _connection(None)
        _send(protocol, AuthRequest(1, b"anything"), BookieInfoRequest(2))
        await _settle()
        return transport.answers()

    assert run(scenario()) == [
        AuthResponse(1, Status.OK, 0, "this bookie checks no tokens"),
        BookieInfoResponse(2, Status.OK, False, 1, 2),
    ]


def test_auth_an_unknown_auth_version_is_refused_with_a_reason():
    async def scenario() -> tuple[list[Response], bool]:
        protocol, transport = await _connection(VERIFIER)
        _send(protocol, AuthRequest(1, b"t", version=2))
        await _settle()
        return transport.answers(), transport.closing

    answers, closed = run(scenario())
    assert answers[0].status == Status.BAD_REQUEST and "version 2" in answers[0].reason
    assert closed
