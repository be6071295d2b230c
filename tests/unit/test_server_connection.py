"""One bookie connection (``quorumlog.server.connection``) on a stand-in transport and a
stand-in bookie that answers only when told: flow control and bounds (R12, R16)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from support import run

from quorumlog.errors import Status
from quorumlog.proto.codec import (
    FrameDecoder,
    ReadFlag,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    encode,
)
from quorumlog.server.config import ServerConfig
from quorumlog.server.connection import BookieProtocol


class Transport:
    """Enough of an asyncio transport: records what the connection does to it."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.reading = True
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def writelines(self, parts: list[bytes]) -> None:
        for part in parts:
            self.written += part

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def answers(self) -> list[Any]:
        return FrameDecoder().feed(bytes(self.written))


class HeldBookie:
    """Keeps every request with its ``respond``; the test answers them."""

    def __init__(self) -> None:
        self.requests: list[tuple[Request, Callable[[Response], None]]] = []

    def submit(self, request: Request, respond: Callable[[Response], None]) -> None:
        self.requests.append((request, respond))


def connect(**config: Any) -> tuple[BookieProtocol, Transport, HeldBookie]:
    bookie = HeldBookie()
    protocol = BookieProtocol(
        bookie, ServerConfig(**config), asyncio.get_running_loop(), lambda _: None
    )
    transport = Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return protocol, transport, bookie


def poll(request_id: int, ledger_id: int = 7) -> ReadRequest:
    return ReadRequest(request_id, ledger_id, 0, 1, ReadFlag.LONG_POLL, timeout_ms=60_000)


def test_r16_long_polls_beyond_a_connections_bound_are_refused_at_once_never_paused():
    async def scenario() -> None:
        protocol, transport, bookie = connect(max_long_polls_per_connection=3)
        protocol.data_received(b"".join(encode(poll(i)) for i in range(1, 6)))
        await asyncio.sleep(0)  # the flush runs on the next loop turn
        assert [r.request_id for r, _ in bookie.requests] == [1, 2, 3]
        refused = transport.answers()
        assert [(a.request_id, a.status) for a in refused] == [
            (4, Status.TOO_MANY_REQUESTS),
            (5, Status.TOO_MANY_REQUESTS),
        ]
        assert transport.reading, "parked polls stopped the connection's reading"
        # An answered poll frees its place.
        request, respond = bookie.requests[0]
        respond(ReadResponse(request.request_id, Status.OK, 7, 0, -1, []))
        protocol.data_received(encode(poll(6)))
        assert bookie.requests[-1][0].request_id == 6

    run(scenario())


def test_r16_a_poll_woken_while_answers_back_up_carries_the_lac_and_no_entries():
    async def scenario() -> None:
        protocol, transport, bookie = connect()
        protocol.data_received(encode(poll(1)) + encode(poll(2)))
        [(_, answer_first), (_, answer_second)] = bookie.requests
        answer_first(ReadResponse(1, Status.OK, 7, 0, 0, [b"entry zero"]))
        await asyncio.sleep(0)
        protocol.pause_writing()  # the peer stopped reading its answers
        answer_second(ReadResponse(2, Status.OK, 7, 0, 0, [b"entry zero"]))
        protocol.resume_writing()
        await asyncio.sleep(0)
        answers = {a.request_id: a for a in transport.answers()}
        assert answers[1].entries == [b"entry zero"]
        assert (answers[2].status, answers[2].lac, answers[2].entries) == (Status.OK, 0, [])
        assert protocol.in_flight == 0 and protocol.polls == 0

    run(scenario())
