"""Connections from a client to bookies: many requests in flight, one write per loop turn.

``send`` never blocks and never awaits: it encodes the request, queues the
bytes and registers a callback under a fresh request id. Everything queued in
one event-loop turn leaves in one ``transport.write``. Answers are matched by
request id and may arrive in any order. When the connection fails, every
callback still waiting gets a :class:`BookieUnavailableError`; a request that
outlives its timeout gets a timeout error (its late answer is dropped).

Memory is bounded in bytes (R16): the bytes a connection holds that its bookie
has not taken (its own queue and the socket's write buffer) stay under
``max_queued_bytes_per_connection``; past it a request fails at once with
:class:`TooManyRequestsError` naming the bookie. While the transport asks to
pause (the bookie is not reading), frames wait in the connection's own queue, so
that the count is exact.

R12 holds for answers too: an answer of the wrong type, for another ledger or
entry, or with more entries than asked is not handed on; its callback gets a
:class:`ProtocolError` naming the bookie, as for a failed request. The check is
per answer (a frame), never per entry.

Security (docs/SECURITY.md): with TLS, the connection is made with the context its
source gives at that moment (certificates replaced on disk serve the next connection);
with a token, an AUTH request is the connection's first frame, and a refusal fails every
request of the connection with an :class:`AuthenticationError` saying why. The token is
read again for each new connection; and before a token's ``exp`` (30 s before, or
halfway through a shorter life) the connection presents the token source's newer token
with a second AUTH, so that a renewed token file keeps long-lived connections open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import struct
import time
from collections.abc import Callable
from typing import Protocol, cast

from quorumlog.errors import (
    AuthenticationError,
    BKError,
    BookieUnavailableError,
    ProtocolError,
    TimeoutError_,
    TooManyRequestsError,
)
from quorumlog.proto.codec import (
    MAX_FRAME_SIZE_BYTES_DEFAULT,
    AddRequest,
    AddResponse,
    AuthRequest,
    AuthResponse,
    BookieInfoRequest,
    BookieInfoResponse,
    DeleteLedgerRequest,
    FenceRequest,
    FenceResponse,
    FrameDecoder,
    LedgerKeyRequest,
    LedgerKeyResponse,
    Op,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    StatusResponse,
    WriteLacRequest,
    encode_parts,
)
from quorumlog.security.tokens import renewal_delay_s, unverified_expiry_s

log = logging.getLogger(__name__)

MAX_QUEUED_BYTES_DEFAULT = 64 * 1024 * 1024
# How long a closing client waits for its sockets to close (a TLS close is a round trip
# with each bookie); a bookie that does not answer costs no more than this.
CLOSE_WAIT_S = 1.0
_LENGTH = struct.Struct(">I")  # a frame's length prefix (quorumlog.proto.codec)
# Queued parts averaging this size or more leave without being joined first (_flush).
_GATHER_MIN_PART_BYTES = 4096

ResponseCallback = Callable[[Response | BKError], None]
# Where a new connection gets its TLS context and its token (each called per connection).
SslContextSource = Callable[[], ssl.SSLContext]
TokenSource = Callable[[], str | None]
# The first bytes of a TLS record (handshake 0x16 or alert 0x15, version 3.x): a plain
# frame's length prefix never starts so (frames are at most a few MiB).
_TLS_RECORD_PREFIXES = (b"\x15\x03", b"\x16\x03")

# The answer each request must get, and the operation named in messages.
_ANSWERS: dict[type, tuple[type, Op]] = {
    AddRequest: (AddResponse, Op.ADD),
    ReadRequest: (ReadResponse, Op.READ),
    ReadLacRequest: (ReadLacResponse, Op.READ_LAC),
    FenceRequest: (FenceResponse, Op.FENCE),
    WriteLacRequest: (StatusResponse, Op.WRITE_LAC),
    DeleteLedgerRequest: (StatusResponse, Op.DELETE_LEDGER),
    BookieInfoRequest: (BookieInfoResponse, Op.BOOKIE_INFO),
    AuthRequest: (AuthResponse, Op.AUTH),
    LedgerKeyRequest: (LedgerKeyResponse, Op.LEDGER_KEY),
}
_ANSWER_OPS: dict[type, Op] = {
    AddResponse: Op.ADD,
    ReadResponse: Op.READ,
    ReadLacResponse: Op.READ_LAC,
    FenceResponse: Op.FENCE,
    BookieInfoResponse: Op.BOOKIE_INFO,
    AuthResponse: Op.AUTH,
    LedgerKeyResponse: Op.LEDGER_KEY,
}


def _answer_name(answer: object) -> str:
    op = answer.op if isinstance(answer, StatusResponse) else _ANSWER_OPS.get(type(answer), -1)
    try:
        return Op(op).name
    except ValueError:
        return type(answer).__name__


def answer_problem(request: Request, answer: Response) -> str | None:
    """What makes ``answer`` unfit as the answer to ``request``; None if nothing does.

    A decoded frame is well formed, not necessarily an answer to what was asked: a
    bookie that acknowledges an add for another ledger, or sends entries past those
    asked (past the LAC, possibly), must not be believed (R12 both ways).
    """
    expected, op = _ANSWERS[type(request)]
    if type(answer) is not expected or (isinstance(answer, StatusResponse) and answer.op != op):
        return f"a {_answer_name(answer)} answer"
    if isinstance(request, BookieInfoRequest | AuthRequest) or isinstance(
        answer, BookieInfoResponse | AuthResponse
    ):
        return None
    if answer.ledger_id != request.ledger_id:
        return f"an answer for ledger {answer.ledger_id}"
    if isinstance(request, AddRequest) and isinstance(answer, AddResponse):
        if answer.entry_count != len(request.entries):
            return f"{answer.entry_count} entries acknowledged, {len(request.entries)} sent"
    elif isinstance(request, ReadRequest) and isinstance(answer, ReadResponse):
        if answer.first_entry_id != request.first_entry_id:
            return f"entries from {answer.first_entry_id}, asked from {request.first_entry_id}"
        if len(answer.entries) > request.count:
            return f"{len(answer.entries)} entries, asked {request.count}"
    return None


class BookieConnection(asyncio.Protocol):
    """One TCP connection to one bookie, opened on construction."""

    def __init__(
        self,
        address: str,
        loop: asyncio.AbstractEventLoop,
        *,
        connect_timeout_ms: int,
        max_frame_size_bytes: int = MAX_FRAME_SIZE_BYTES_DEFAULT,
        max_queued_bytes: int = MAX_QUEUED_BYTES_DEFAULT,
        on_closed: Callable[[BookieConnection], None] | None = None,
        ssl_context: SslContextSource | None = None,
        token: TokenSource | None = None,
    ) -> None:
        """``ssl_context``: TLS on, with the context it returns; ``token``: the token to
        present first (None from it: present none)."""
        self.address = address
        self._loop = loop
        self._decoder = FrameDecoder(max_frame_size_bytes)
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._max_queued_bytes = max_queued_bytes
        self._paused = False  # the transport's buffer is over its high-water mark
        # Each request waiting for its answer: the callback, the timeout, and the request
        # itself, to check the answer against (answer_problem).
        self._pending: dict[int, tuple[ResponseCallback, asyncio.TimerHandle | None, Request]] = {}
        self._next_request_id = 1
        self._flush_scheduled = False
        self._transport: asyncio.Transport | None = None
        # Done once the socket is closed (see wait_closed).
        self._lost: asyncio.Future[None] = loop.create_future()
        self._on_closed = on_closed
        self.closed = False
        self._tls = ssl_context is not None
        self._received_bytes = 0
        self._token_source = token
        self._renewal: asyncio.TimerHandle | None = None
        self._credential = token() if token is not None else None
        if self._credential is not None:
            # Queued before anything else: the bookie reads nothing else first.
            self._authenticate(self._credential)
        context = ssl_context() if ssl_context is not None else None
        self._connect_task = loop.create_task(self._connect(connect_timeout_ms, context))

    async def _connect(self, timeout_ms: int, context: ssl.SSLContext | None) -> None:
        host, _, port = self.address.rpartition(":")
        try:
            await asyncio.wait_for(
                self._loop.create_connection(
                    lambda: self,
                    host,
                    int(port),
                    ssl=context,
                    server_hostname=host if context is not None else None,
                ),
                timeout_ms / 1000,
            )
        except ssl.SSLError as exc:
            self._shut(AuthenticationError(f"bookie {self.address}: {_tls_failure(exc)}"))
        except (TimeoutError, OSError, ValueError) as exc:
            reason = "timed out" if isinstance(exc, asyncio.TimeoutError) else str(exc)
            self._shut(BookieUnavailableError(f"bookie {self.address}: cannot connect: {reason}"))

    # ------------------------------------------------------------ protocol callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self._transport = cast(asyncio.Transport, transport)
        if self.closed:
            transport.close()
            return
        if self._out:
            self._flush()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._out:
            self._flush()

    def data_received(self, data: bytes) -> None:
        first = self._received_bytes == 0
        self._received_bytes += len(data)
        try:
            messages = self._decoder.feed(data)
        except ProtocolError as exc:
            if first and not self._tls and data[:2] in _TLS_RECORD_PREFIXES:
                self._shut(
                    AuthenticationError(
                        f"bookie {self.address} answers with TLS: turn the client's tls setting on"
                    )
                )
                return
            self._shut(BookieUnavailableError(f"bookie {self.address}: bad answer: {exc}"))
            return
        pending = self._pending
        for message in messages:
            waiting = pending.pop(message.request_id, None)
            if waiting is None:
                if type(message) is AuthResponse and message.status != 0:
                    # Unasked (request id 0): the bookie says why it closes the connection.
                    self._shut(AuthenticationError(f"bookie {self.address}: {message.reason}"))
                    return
                continue  # answer to a request that already timed out
            callback, timer, request = waiting
            if timer is not None:
                timer.cancel()
            problem = answer_problem(request, message)  # type: ignore[arg-type]
            if problem is None:
                callback(message)  # type: ignore[arg-type]
            else:
                # Only this request fails: the frame decoded, the stream is still in step.
                name = _ANSWERS[type(request)][1].name
                callback(
                    ProtocolError(
                        f"bookie {self.address}: bad answer to {name} request "
                        f"{message.request_id}: {problem}"
                    )
                )

    def connection_lost(self, exc: Exception | None) -> None:
        why = f": {exc}" if exc else ""
        if isinstance(exc, ssl.SSLError):
            why = f": {_tls_failure(exc)}"
        elif not self._tls and self._received_bytes == 0 and self._pending:
            # A bookie serving TLS closes a plain connection without a byte (its handshake
            # fails); so does one that stops, but then the hint costs nothing.
            why = (
                " before any answer (a bookie that serves TLS closes plain connections so: "
                "is the client's tls setting on?)"
            )
        self._shut(BookieUnavailableError(f"bookie {self.address}: connection lost{why}"))
        if not self._lost.done():
            self._lost.set_result(None)

    def _authenticate(self, credential: str) -> None:
        def answered(answer: Response | BKError) -> None:
            if isinstance(answer, AuthResponse) and answer.status != 0:
                self._shut(
                    AuthenticationError(f"bookie {self.address} refused the token: {answer.reason}")
                )
            elif isinstance(answer, AuthResponse):
                self._schedule_renewal(credential)

        self.send(AuthRequest(0, credential.encode("ascii", "replace")), answered, None)

    def _schedule_renewal(self, credential: str) -> None:
        """A bookie ends a connection when its token expires: present the token source's
        newer token before that, on this connection (the bookie takes a second AUTH)."""
        expires_at_s = unverified_expiry_s(credential)
        if expires_at_s is None or self.closed:
            return
        if self._renewal is not None:
            self._renewal.cancel()
        delay_s = renewal_delay_s(expires_at_s, time.time())
        self._renewal = self._loop.call_later(delay_s, self._renew, expires_at_s)

    def _renew(self, expires_at_s: float) -> None:
        self._renewal = None
        if self.closed or self._token_source is None:
            return
        fresh = self._token_source()
        if fresh is not None and fresh != self._credential:
            self._credential = fresh
            self._authenticate(fresh)
            return
        remaining_s = expires_at_s - time.time()
        if remaining_s > 0:  # not renewed yet: look again, until the old one expires
            retry_s = max(0.2, min(5.0, remaining_s / 4))
            self._renewal = self._loop.call_later(retry_s, self._renew, expires_at_s)

    # ------------------------------------------------------------ sending

    def send(self, request: Request, callback: ResponseCallback, timeout_ms: float | None) -> None:
        """Queue ``request`` (its request id is assigned here); ``callback`` gets the answer,
        or TooManyRequestsError at once if the bookie has not taken what is queued (R16)."""
        if self.closed:
            error = BookieUnavailableError(f"bookie {self.address}: connection is closed")
            self._loop.call_soon(callback, error)
            return
        request_id = self._next_request_id
        request.request_id = request_id
        parts = encode_parts(request)
        # The frame's size from its length prefix: one look per frame, not per entry.
        size = _LENGTH.unpack_from(parts[0])[0] + _LENGTH.size
        queued = self.queued_bytes
        if queued and queued + size > self._max_queued_bytes:
            refused = TooManyRequestsError(
                f"bookie {self.address}: {queued} bytes are queued that it has not taken; "
                f"a frame of {size} more would pass max_queued_bytes_per_connection "
                f"({self._max_queued_bytes})"
            )
            self._loop.call_soon(callback, refused)
            return
        self._next_request_id = request_id + 1
        self._out.extend(parts)
        self._out_bytes += size
        timer = (
            self._loop.call_later(timeout_ms / 1000, self._on_timeout, request_id)
            if timeout_ms
            else None
        )
        self._pending[request_id] = (callback, timer, request)
        if not self._flush_scheduled and self._transport is not None:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        # While paused, frames stay here (resume_writing flushes): the transport would
        # buffer them all the same, and here queued_bytes counts them without a call.
        out = self._out
        if out and self._transport is not None and not self.closed and not self._paused:
            if self._out_bytes >= _GATHER_MIN_PART_BYTES * len(out):
                # Large entries: handed over as they are (uvloop writes them with one
                # writev), not copied into one string first; each entry goes to Qw
                # connections, so a copy here costs Qw copies of it.
                self._out = []
                self._transport.writelines(out)
            else:
                data = b"".join(out)
                out.clear()
                self._transport.write(data)
            self._out_bytes = 0

    @property
    def queued_bytes(self) -> int:
        """Bytes sent on this connection that the bookie has not taken yet."""
        transport = self._transport
        buffered = transport.get_write_buffer_size() if transport is not None else 0
        return self._out_bytes + buffered

    def _on_timeout(self, request_id: int) -> None:
        waiting = self._pending.pop(request_id, None)
        if waiting is not None:
            waiting[0](TimeoutError_(f"bookie {self.address}: request timed out"))

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    # ------------------------------------------------------------ closing

    def _shut(self, error: BKError) -> None:
        if self.closed:
            return
        self.closed = True
        if self._renewal is not None:
            self._renewal.cancel()
        self._out.clear()
        self._out_bytes = 0
        if self._transport is not None:
            self._transport.close()
        pending, self._pending = self._pending, {}
        for callback, timer, _ in pending.values():
            if timer is not None:
                timer.cancel()
            callback(error)
        if self._on_closed is not None:
            self._on_closed(self)

    def close(self) -> None:
        self._connect_task.cancel()
        self._shut(BookieUnavailableError(f"bookie {self.address}: connection closed by client"))

    async def wait_closed(self, timeout_s: float) -> None:
        """After :meth:`close`, wait (at most ``timeout_s``) until the socket is closed.

        Closing a TLS connection is a close_notify exchange with the bookie that needs the
        event loop a moment more: a client ending its loop at once (``asyncio.run``)
        would leave the socket to the garbage collector."""
        if self._transport is None:
            # Not connected: a cancelled connect attempt closes its own socket.
            await asyncio.wait({self._connect_task}, timeout=timeout_s)
            if self._transport is None:
                return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._lost), timeout_s)


def _tls_failure(exc: ssl.SSLError) -> str:
    """A TLS failure in words an operator can act on (never key material: none is here)."""
    reason = exc.reason or str(exc)
    if reason in ("TLSV1_ALERT_PROTOCOL_VERSION", "WRONG_VERSION_NUMBER"):
        return f"TLS handshake refused ({reason}): the bookie does not serve TLS"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS: the bookie's certificate does not verify: {exc.verify_message}"
    return f"TLS handshake failed: {reason}"


def _mark_retrieved(future: asyncio.Future[Response]) -> None:
    if not future.cancelled():
        future.exception()


class Sender(Protocol):
    def send(
        self, request: Request, callback: ResponseCallback, timeout_ms: float | None
    ) -> None: ...


def request_future(
    loop: asyncio.AbstractEventLoop,
    connection: Sender,
    request: Request,
    timeout_ms: float | None,
) -> asyncio.Future[Response]:
    """Send ``request`` on ``connection``; the future gets the answer or the error."""
    future: asyncio.Future[Response] = loop.create_future()

    def done(result: Response | BKError) -> None:
        if future.done():
            return
        if isinstance(result, BKError):
            future.set_exception(result)
        else:
            future.set_result(result)

    connection.send(request, done, timeout_ms)
    # Speculative and fan-out requests are often left unawaited once another answer
    # won; marking the outcome as seen keeps asyncio from logging it as lost.
    future.add_done_callback(_mark_retrieved)
    return future


class ConnectionPool:
    """One live connection per bookie, reopened on demand after a failure."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        connect_timeout_ms: int,
        max_frame_size_bytes: int = MAX_FRAME_SIZE_BYTES_DEFAULT,
        max_queued_bytes: int = MAX_QUEUED_BYTES_DEFAULT,
        ssl_context: SslContextSource | None = None,
        token: TokenSource | None = None,
    ) -> None:
        self._loop = loop
        self._ssl_context = ssl_context
        self._token = token
        self._connect_timeout_ms = connect_timeout_ms
        self._max_frame_size_bytes = max_frame_size_bytes
        self._max_queued_bytes = max_queued_bytes
        self._connections: dict[str, BookieConnection] = {}
        self._closed = False
        self._closing: list[BookieConnection] = []  # closed by close(), for wait_closed

    def get(self, address: str) -> BookieConnection:
        conn = self._connections.get(address)
        if conn is None or conn.closed:
            conn = BookieConnection(
                address,
                self._loop,
                connect_timeout_ms=self._connect_timeout_ms,
                max_frame_size_bytes=self._max_frame_size_bytes,
                max_queued_bytes=self._max_queued_bytes,
                on_closed=self._forget,
                ssl_context=self._ssl_context,
                token=self._token,
            )
            if self._closed:
                # Closed before its connect task first runs: no socket is opened. What
                # reacts to the close (a handle failing over, an explicit LAC timer) gets
                # its requests failed, not a connection nobody would close.
                conn.close()
                return conn
            self._connections[address] = conn
        return conn

    def _forget(self, conn: BookieConnection) -> None:
        if self._connections.get(conn.address) is conn:
            del self._connections[conn.address]

    def request(
        self, address: str, request: Request, timeout_ms: float | None
    ) -> asyncio.Future[Response]:
        """Send ``request`` and get a future of the answer (errors set as exceptions)."""
        return request_future(self._loop, self.get(address), request, timeout_ms)

    def close(self) -> None:
        """Close every connection; from now on the pool hands out only closed ones."""
        self._closed = True
        for conn in list(self._connections.values()):
            conn.close()
            self._closing.append(conn)
        self._connections.clear()

    async def wait_closed(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """After :meth:`close`, wait until the sockets are closed, at most ``timeout_s``
        (a bookie that does not answer a TLS close_notify, a paused one, costs that)."""
        closing, self._closing = self._closing, []
        if closing:
            await asyncio.gather(*(conn.wait_closed(timeout_s) for conn in closing))
