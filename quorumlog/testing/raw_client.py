"""A protocol-level bookie client for tests: raw frames over one socket, nothing hidden.

Unlike the real client it does no retries, placement or digest checks; it lets a
test choose request ids, send arbitrary bytes, and see exactly what the bookie
answered, or that it closed the connection.

Example::

    client = await RawClient.connect("127.0.0.1:3181")
    key = master_key(b"pw")
    blob = make_entry(7, 0, b"hello")
    answer = await client.request(AddRequest(0, 7, key, [blob]))
    assert answer.status == Status.OK
    await client.close()
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import cast

from quorumlog.errors import ProtocolError
from quorumlog.proto.codec import (
    MAX_FRAME_SIZE_BYTES_DEFAULT,
    AddFlag,
    AddRequest,
    AddResponse,
    FenceRequest,
    FenceResponse,
    FrameDecoder,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    encode,
)
from quorumlog.proto.entry import DigestType, EntryCodec, master_key

DEFAULT_TIMEOUT_S = 10.0


def make_entry(
    ledger_id: int,
    entry_id: int,
    payload: bytes,
    *,
    lac: int = -1,
    length: int = 0,
    digest_type: DigestType = DigestType.CRC32C,
    password: bytes = b"",
) -> bytes:
    """An entry blob as a writer builds it (header, digest, payload)."""
    return EntryCodec(digest_type, password).encode(
        ledger_id, entry_id, lac, length or len(payload), payload
    )


class RawClient(asyncio.Protocol):
    """One connection to one bookie; answers are matched by request id."""

    def __init__(self, address: str, max_frame_size_bytes: int) -> None:
        self.address = address
        self._decoder = FrameDecoder(max_frame_size_bytes)
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, asyncio.Future[Response]] = {}
        self._next_id = 1
        self.unmatched: list[Response] = []
        self.decode_error: ProtocolError | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @classmethod
    async def connect(
        cls,
        address: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_frame_size_bytes: int = MAX_FRAME_SIZE_BYTES_DEFAULT,
    ) -> RawClient:
        host, _, port = address.rpartition(":")
        loop = asyncio.get_running_loop()
        client = cls(address, max_frame_size_bytes)
        await asyncio.wait_for(loop.create_connection(lambda: client, host, int(port)), timeout_s)
        return client

    # ------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            messages = self._decoder.feed(data)
        except ProtocolError as exc:
            self.decode_error = exc
            if self._transport is not None:
                self._transport.close()
            return
        for message in messages:
            future = self._pending.pop(message.request_id, None)
            if future is None or future.done():
                self.unmatched.append(message)  # type: ignore[arg-type]
            else:
                future.set_result(message)  # type: ignore[arg-type]

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        error = ConnectionError(f"bookie {self.address}: connection closed ({exc})")
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        if not self.closed.done():
            self.closed.set_result(None)

    # ------------------------------------------------------------ sending

    @property
    def is_closed(self) -> bool:
        return self.closed.done()

    def next_request_id(self) -> int:
        request_id = self._next_id
        self._next_id += 1
        return request_id

    def send(self, request: Request, *, assign_id: bool = True) -> asyncio.Future[Response]:
        """Write ``request`` now; the future gets its answer (ConnectionError if closed).

        With ``assign_id`` the request gets a fresh id, else its own is kept.
        """
        if assign_id:
            request.request_id = self.next_request_id()
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        if self._transport is None:
            future.set_exception(ConnectionError(f"bookie {self.address}: not connected"))
            return future
        self._pending[request.request_id] = future
        self._transport.write(encode(request))
        return future

    async def request(self, request: Request, timeout_s: float = DEFAULT_TIMEOUT_S) -> Response:
        return await asyncio.wait_for(self.send(request), timeout_s)

    def send_raw(self, data: bytes) -> None:
        """Write arbitrary bytes (hostile-input tests)."""
        if self._transport is not None:
            self._transport.write(data)

    async def wait_closed(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
        """True once the bookie closed the connection, False if still open after ``timeout_s``."""
        try:
            await asyncio.wait_for(asyncio.shield(self.closed), timeout_s)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
        await self.wait_closed(5.0)

    # ------------------------------------------------------------ conveniences

    async def add(
        self,
        ledger_id: int,
        key: bytes,
        entries: Sequence[bytes],
        *,
        recovery: bool = False,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> AddResponse:
        flags = AddFlag.RECOVERY if recovery else AddFlag.NONE
        answer = await self.request(AddRequest(0, ledger_id, key, list(entries), flags), timeout_s)
        assert isinstance(answer, AddResponse)
        return answer

    async def read(
        self,
        ledger_id: int,
        first_entry_id: int,
        count: int = 1,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> ReadResponse:
        answer = await self.request(ReadRequest(0, ledger_id, first_entry_id, count), timeout_s)
        assert isinstance(answer, ReadResponse)
        return answer

    async def fence(
        self, ledger_id: int, key: bytes, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> FenceResponse:
        answer = await self.request(FenceRequest(0, ledger_id, key), timeout_s)
        assert isinstance(answer, FenceResponse)
        return answer


__all__ = ["RawClient", "make_entry", "master_key"]
