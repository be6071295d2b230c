"""One bookie connection (``quorumlog.server.connection``) on a stand-in transport and a
stand-in bookie that answers only when told: flow control and bounds (R12, R16)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from support import run

from quorumlog.errors import Status
from quorumlog.proto.codec import (
    AddRequest,
    AddResponse,
    FrameDecoder,
    ReadFlag,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    encode,
)
from quorumlog.server.config import ServerConfig
from quorumlog.server.connection import BookieProtocol, RequestBudget
from quorumlog.testing.raw_client import make_entry, master_key

KEY = master_key(b"connection-test")


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


def connect(
    budget: RequestBudget | None = None, **config: Any
) -> tuple[BookieProtocol, Transport, HeldBookie]:
    bookie = HeldBookie()
    protocol = BookieProtocol(
        bookie, ServerConfig(**config), asyncio.get_running_loop(), lambda _: None, budget
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


def add_frame(request_id: int, size: int, ledger_id: int = 9) -> bytes:
    blob = make_entry(ledger_id, request_id, bytes(size))
    return encode(AddRequest(request_id, ledger_id, KEY, [blob]))


def test_r16_a_connection_stops_reading_at_its_share_of_request_bytes():
    """Requests count their frame's bytes until answered: a flood of large adds that the
    bookie holds (its journal is behind) stops the connection's reading at its share, not at
    a number of requests."""

    async def scenario() -> None:
        protocol, transport, bookie = connect(
            max_in_flight_bytes=4 << 20, max_frame_size_bytes=1 << 20
        )
        frame = add_frame(1, 256 << 10)
        fed = 0
        while transport.reading and fed < 100:
            protocol.data_received(frame)
            fed += 1
        assert not transport.reading, f"still reading after {fed} frames of {len(frame)} bytes"
        assert len(bookie.requests) * len(frame) < (4 << 20) + len(frame)
        for request, respond in bookie.requests:
            respond(AddResponse(request.request_id, Status.OK, 9, 1))
        await asyncio.sleep(0)  # the flush, which looks at the bounds again
        assert transport.reading

    run(scenario())


def test_r16_connections_share_the_request_bytes_and_a_flooder_holds_only_its_share():
    async def scenario() -> None:
        budget = RequestBudget(8 << 20, floor_bytes=1 << 20)
        config = {"max_in_flight_bytes": 8 << 20, "max_frame_size_bytes": 1 << 20}
        flooder, flooder_transport, held = connect(budget=budget, **config)
        frame = add_frame(1, 512 << 10)
        while flooder_transport.reading:
            flooder.data_received(frame)
        alone = len(held.requests)
        assert alone * len(frame) < (8 << 20) + len(frame)  # alone: the whole budget
        other, other_transport, other_bookie = connect(budget=budget, **config)
        # Two connections now: the flooder is over its share and stays paused until it is
        # back under it; the other connection reads as much as its own share.
        for request, respond in held.requests[: alone // 4]:
            respond(AddResponse(request.request_id, Status.OK, 9, 1))
        await asyncio.sleep(0)
        assert not flooder_transport.reading
        fed = 0
        while other_transport.reading and fed < 100:
            other.data_received(frame)
            fed += 1
        assert len(other_bookie.requests) * len(frame) >= (4 << 20)
        assert len(other_bookie.requests) * len(frame) < (4 << 20) + len(frame)
        other.connection_lost(None)  # alone again: the flooder reads as its share grows
        for request, respond in held.requests[alone // 4 :]:
            respond(AddResponse(request.request_id, Status.OK, 9, 1))
        await asyncio.sleep(0)
        assert flooder_transport.reading

    run(scenario())


def test_a_request_answered_twice_is_a_broken_invariant_not_a_second_answer():
    async def scenario() -> None:
        broken: list[tuple[str, BaseException]] = []
        bookie = HeldBookie()
        protocol = BookieProtocol(
            bookie,
            ServerConfig(),
            asyncio.get_running_loop(),
            lambda _: None,
            on_broken_invariant=lambda where, exc: broken.append((where, exc)),
        )
        transport = Transport()
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.data_received(encode(ReadRequest(1, 7, 0)))
        [(_, respond)] = bookie.requests
        respond(ReadResponse(1, Status.OK, 7, 0, -1, [b"e"]))
        respond(ReadResponse(1, Status.OK, 7, 0, -1, [b"e"]))
        [(where, exc)] = broken
        assert "answering a request" in where and "second answer" in str(exc)
        assert transport.closing
        assert [a.request_id for a in transport.answers()] == [1]  # one answer only

    run(scenario())
