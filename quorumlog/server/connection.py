"""One client connection of a bookie: frames in, requests to the bookie, answers out.

Hot path: bytes arrive, the :class:`~quorumlog.proto.codec.FrameDecoder` turns
them into requests, each goes to :meth:`Bookie.submit` with this connection's
``respond`` as callback. Answers are encoded into a list and written with one
write per event-loop turn (the flush is scheduled once per turn), so
a pipelined client costs one send system call per turn, not one per entry.

Memory stays bounded in bytes (R12, R16): the decoder holds at most one maximum-size
frame, and every request holds its frame's bytes (a read also the largest answer it may
get, its ``max_bytes``) until it is answered, whether it waits in the bookie's deferred
adds, its journal queue or for a fence. All connections share ``max_in_flight_bytes``
(:class:`RequestBudget`): each may hold an equal share, never less than one maximum
frame. A connection over its share, over ``max_in_flight_requests``, with
``max_queued_response_bytes`` of answers queued, or with a full transport write buffer
(its peer is not reading) stops reading from its socket until it drains; the others read
on. The server caps the number of connections (``max_connections``). Any bytes that do
not decode close this connection only; other connections and the stored state are
untouched. What cannot be — a request answered twice, an answer that cannot be encoded, an
exception escaping the bookie's own guards — is a broken invariant: the connection hands
it to the bookie's halt (:mod:`quorumlog.bookie.invariants`), which stops the bookie.

Long polls never stop a connection's reading (a tailing reader and its writer may share
one connection): a parked poll holds only its small request, so it counts against its
own bound, ``max_long_polls_per_connection`` (beyond it a poll is answered
TOO_MANY_REQUESTS at once), not against the budgets above. A poll that wakes while its
connection already has ``max_queued_response_bytes`` of answers waiting, or its peer is
not reading, is answered with the LAC and no entries (the reader then reads them with a
plain, back-pressured READ), so that a burst of woken polls cannot queue their entries
without bound.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol, cast

from quorumlog.bookie.invariants import BrokenInvariant
from quorumlog.errors import AuthenticationError, LocalProtocolError, ProtocolError, Status
from quorumlog.proto.codec import (
    AUTH_ROLE_BITS,
    AUTH_VERSION,
    MAX_AUTH_CREDENTIAL_BYTES,
    AddResponse,
    AuthMechanism,
    AuthRequest,
    AuthResponse,
    BookieInfoResponse,
    FenceResponse,
    FrameDecoder,
    LedgerKeyResponse,
    Message,
    ReadFlag,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    StatusResponse,
    encode_parts,
    error_response,
)
from quorumlog.security.roles import permitted, required_roles
from quorumlog.security.tokens import Identity
from quorumlog.server.config import ServerConfig

log = logging.getLogger(__name__)

_CLOSE_GRACE_S = 5.0
# Queued answer parts averaging this size or more leave as they are (_flush).
_GATHER_MIN_PART_BYTES = 4096

_RESPONSE_TYPES = (
    AddResponse,
    ReadResponse,
    ReadLacResponse,
    FenceResponse,
    StatusResponse,
    BookieInfoResponse,
    AuthResponse,
    LedgerKeyResponse,
)
# A TLS ClientHello record starts so; a frame's length prefix never does.
_TLS_HANDSHAKE_PREFIX = b"\x16\x03"
# A TLS fatal alert "protocol_version" in a plain record: the client's TLS library then
# reports a refused handshake instead of a bare reset.
_TLS_PROTOCOL_VERSION_ALERT = bytes.fromhex("15030300020246")
# The largest AUTH frame: length prefix, header, AUTH's fixed body, the credential.
_MAX_AUTH_FRAME_BYTES = 4 + 10 + 4 + MAX_AUTH_CREDENTIAL_BYTES
_AUTH_REQUIRED = (
    "authentication required: this bookie accepts only connections that present a token "
    "(set the client's token file or QUORUMLOG_TOKEN)"
)


class RequestHandler(Protocol):
    """What a connection needs from a bookie (``Bookie.submit``)."""

    def submit(self, request: Request, respond: Callable[[Response], None]) -> None: ...


BrokenInvariantHandler = Callable[[str, BaseException], None]


def _raise(where: str, exc: BaseException) -> None:
    """Without a bookie's halt (tests of the connection alone): let the failure be seen."""
    raise exc


class RequestBudget:
    """The request bytes that all connections of a server may hold together, shared out
    equally: a connection over its share stops reading, the others go on (R16)."""

    def __init__(self, total_bytes: int, *, floor_bytes: int) -> None:
        self.total_bytes = total_bytes
        # A connection must always be able to hold one frame of the largest size, or a
        # large request could never be read.
        self.floor_bytes = floor_bytes
        self.connections = 0
        self.share_bytes = max(total_bytes, floor_bytes)

    def join(self) -> None:
        self.connections += 1
        self._share()

    def leave(self) -> None:
        self.connections = max(0, self.connections - 1)
        self._share()

    def _share(self) -> None:
        self.share_bytes = max(self.total_bytes // max(self.connections, 1), self.floor_bytes)


class _Answer:
    """The ``respond`` callback of one request: hands the answer to its connection with what
    the request held there (its bytes; whether it is a long poll)."""

    __slots__ = ("answered", "connection", "held_bytes", "poll")

    def __init__(self, connection: BookieProtocol, held_bytes: int, poll: bool) -> None:
        self.connection = connection
        self.held_bytes = held_bytes
        self.poll = poll
        self.answered = False

    def __call__(self, response: Response) -> None:
        if self.answered:
            self.connection._broken(
                "answering a request", BrokenInvariant(f"a second answer: {response!r:.200}")
            )
            return
        self.answered = True
        self.connection._answered(self, response)


class BookieProtocol(asyncio.Protocol):
    """asyncio protocol of one accepted connection."""

    def __init__(
        self,
        handler: RequestHandler,
        config: ServerConfig,
        loop: asyncio.AbstractEventLoop,
        on_closed: Callable[[BookieProtocol], None],
        budget: RequestBudget | None = None,
        on_broken_invariant: BrokenInvariantHandler = _raise,
    ) -> None:
        """``budget`` is shared by the server's connections (default: one of its own);
        ``on_broken_invariant(where, exc)`` is the bookie's halt."""
        self._handler = handler
        self._on_broken_invariant = on_broken_invariant
        self._config = config
        self._budget = budget or RequestBudget(
            config.max_in_flight_bytes, floor_bytes=config.max_frame_size_bytes
        )
        self._joined = False
        self._loop = loop
        self._on_closed = on_closed
        self._decoder = FrameDecoder(config.max_frame_size_bytes)
        self._transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_scheduled = False
        self.in_flight = 0  # requests not answered yet, parked long polls included
        self.polls = 0  # parked long polls among them
        self.held_bytes = 0  # what the requests in flight hold (see _Answer)
        self._writing_paused = False
        self._reading_paused = False
        self._draining = False  # server stopping: read nothing more
        self.closed = False
        self.made = False  # connection_made came (after the TLS handshake, with TLS)
        self.peer = "?"
        self.requests_total = 0
        # Authentication (docs/SECURITY.md): with a verifier, nothing but AUTH is served
        # until a token was verified, and every request after is checked against its roles.
        self._verifier = config.token_verifier
        self.identity: Identity | None = None
        self.refused_requests = 0  # requests its token's roles did not allow
        self._expiry: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self._transport = transport = cast(asyncio.Transport, transport)
        self.made = True
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        transport.set_write_buffer_limits(
            high=self._config.write_buffer_high_bytes, low=self._config.write_buffer_low_bytes
        )
        self._joined = True
        self._budget.join()
        if self._verifier is not None:
            # Until a token verifies, the connection's deadline is the AUTH deadline.
            self._expiry = self._loop.call_later(
                self._config.auth_timeout_ms / 1000, self._auth_timed_out
            )
        if self._draining:
            self._update_reading()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        sizes: list[int] = []
        try:
            messages = self._decoder.feed(data, sizes)
        except ProtocolError as exc:
            if self.requests_total == 0 and data[:2] == _TLS_HANDSHAKE_PREFIX:
                self._tls_on_plain_port()
                return
            self._protocol_violation(str(exc))
            return
        submit = self._handler.submit
        for message, frame_bytes in zip(messages, sizes, strict=True):
            admitted = self._admit(message, frame_bytes)
            if admitted is None:
                if self.closed:
                    return
                continue
            request, held, poll = admitted
            self.held_bytes += held
            self.in_flight += 1
            self.requests_total += 1
            respond = _Answer(self, held, poll)
            try:
                submit(request, respond)
            except Exception as exc:
                # The bookie answers bad input and disk failures itself: what escapes it
                # is a state that cannot be.
                self._broken(f"submitting {type(request).__name__}", exc)
                return
        if self._first_frame_too_large():
            return
        if (
            self.held_bytes >= self._budget.share_bytes
            or self.in_flight - self.polls >= self._config.max_in_flight_requests
        ):
            self._update_reading()

    # ------------------------------------------------------------ admission

    def _admit(self, message: Message, frame_bytes: int) -> tuple[Request, int, bool] | None:
        """Whether the bookie is to serve ``message``, a frame of ``frame_bytes``: the
        request, the bytes it holds against the connection until answered, and whether it
        is a long poll. None when the connection answered it itself (an AUTH, a refusal)
        or closed (a response sent to a bookie, a request before a token)."""
        if isinstance(message, _RESPONSE_TYPES):
            self._protocol_violation(f"a {type(message).__name__} sent to a bookie")
            return None
        if type(message) is AuthRequest:
            self._authenticate(message)
            return None
        if self._verifier is not None and not self._authorized(message):
            return None
        if type(message) is ReadRequest:
            return self._admit_read(message, frame_bytes)
        return message, frame_bytes, False

    def _admit_read(
        self, request: ReadRequest, frame_bytes: int
    ) -> tuple[Request, int, bool] | None:
        """A read holds what its answer may take; a long poll holds a place among the
        connection's polls (over their limit it is answered TOO_MANY_REQUESTS)."""
        config = self._config
        if request.flags & ReadFlag.LONG_POLL:
            if self.polls >= config.max_long_polls_per_connection:
                self._answer_now(error_response(request, Status.TOO_MANY_REQUESTS))
                return None
            # A parked poll holds only its request: bounded by the count above.
            self.polls += 1
            return request, 0, True
        # A read's answer may be as large as its max_bytes: count that against the
        # connection before the bookie answers, or a peer could ask for many large
        # answers and never read them.
        return request, frame_bytes + min(request.max_bytes, config.max_frame_size_bytes), False

    def _first_frame_too_large(self) -> bool:
        """A first frame larger than any AUTH: a peer without a token must not make the
        bookie hold up to a maximum frame (for every connection) until it ends. Refuses
        it (and closes) if so."""
        if (
            self.identity is None
            and self._verifier is not None
            and self._decoder.buffered_bytes > _MAX_AUTH_FRAME_BYTES
        ):
            reason = (
                f"a frame of over {_MAX_AUTH_FRAME_BYTES} bytes before a token; {_AUTH_REQUIRED}"
            )
            self._refuse(AuthResponse(0, Status.UNAUTHORIZED, 0, reason))
            return True
        return False

    def eof_received(self) -> bool | None:
        # The peer will send nothing more; answers still in flight are written, then the
        # transport closes once the last one is out (see _answered).
        if self.in_flight == 0 and not self._out:
            return None  # nothing left to say: close now
        self._draining = True
        return True  # keep the write side open until the last answer is out

    def connection_lost(self, exc: Exception | None) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        if self._joined:
            self._joined = False
            self._budget.leave()
        self.closed = True
        self._out.clear()
        self._out_bytes = 0
        self._transport = None
        self._on_closed(self)

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._update_reading()

    # ------------------------------------------------------------ authentication

    def _answer_now(self, response: Response) -> None:
        """An answer the connection gives itself (the bookie never saw the request)."""
        self.requests_total += 1
        self.in_flight += 1
        self._answered(_Answer(self, 0, False), response)

    def _authenticate(self, request: AuthRequest) -> None:
        verifier = self._verifier
        rid = request.request_id
        if request.version != AUTH_VERSION or request.mechanism != AuthMechanism.TOKEN:
            reason = (
                f"auth version {request.version} mechanism {request.mechanism} not supported "
                f"(version {AUTH_VERSION}, TOKEN)"
            )
            self._refuse(AuthResponse(rid, Status.BAD_REQUEST, 0, reason))
            return
        if verifier is None:
            # An open bookie (no key configured) lets every connection in, as before.
            self._answer_now(AuthResponse(rid, Status.OK, 0, "this bookie checks no tokens"))
            return
        try:
            identity = verifier.verify(request.credential)
        except AuthenticationError as exc:
            self._refuse(AuthResponse(rid, Status.UNAUTHORIZED, 0, exc.message))
            return
        self.identity = identity
        bits = sum(AUTH_ROLE_BITS[role.value] for role in identity.roles)
        self._answer_now(AuthResponse(rid, Status.OK, bits, ""))
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if identity.expires_at_s is not None:
            # A token is checked when it is presented; the connection ends when it
            # expires, unless another AUTH came first (clients renew before that).
            delay_s = max(0.0, identity.expires_at_s - time.time())
            self._expiry = self._loop.call_later(delay_s, self._token_expired)

    def _token_expired(self) -> None:
        self._expiry = None
        if not self.closed:
            self._refuse(AuthResponse(0, Status.UNAUTHORIZED, 0, "token expired"))

    def _auth_timed_out(self) -> None:
        self._expiry = None
        if not self.closed and self.identity is None:
            reason = f"no token presented within {self._config.auth_timeout_ms} ms"
            self._refuse(AuthResponse(0, Status.UNAUTHORIZED, 0, reason))

    def _authorized(self, request: Request) -> bool:
        """Whether ``request`` may be served; if not, it is answered (and, before any
        token, the connection closed)."""
        identity = self.identity
        if identity is None:
            # Request id 0 answers no request: it tells the client why before the close.
            self._answer_now(AuthResponse(0, Status.UNAUTHORIZED, 0, _AUTH_REQUIRED))
            self._refuse(error_response(request, Status.UNAUTHORIZED))
            return False
        if permitted(request, identity.roles):
            return True
        self.refused_requests += 1
        if self.refused_requests == 1:  # once per connection: a loop must not flood the log
            log.warning(
                "refused %s from %s (%s): it needs the role %s (later refusals on this "
                "connection are not logged)",
                type(request).__name__,
                self.peer,
                identity.describe(),
                " or ".join(sorted(required_roles(request))),
            )
        self._answer_now(error_response(request, Status.UNAUTHORIZED))
        return False

    def _tls_on_plain_port(self) -> None:
        log.warning(
            "closing connection from %s: a TLS handshake, and this bookie serves no TLS "
            "(no --tls-cert); the client's tls setting is on",
            self.peer,
        )
        if self._transport is not None:
            self._transport.write(_TLS_PROTOCOL_VERSION_ALERT)
        self._close()

    def _refuse(self, response: Response) -> None:
        """Answer ``response``, then close the connection."""
        if isinstance(response, AuthResponse) and response.reason:
            log.warning("closing connection from %s: %s", self.peer, response.reason)
        self._answer_now(response)
        self._close()

    # ------------------------------------------------------------ answers

    def _answered(self, answer: _Answer, response: Response) -> None:
        """A request's answer (through its :class:`_Answer`, exactly once, on the loop)."""
        self.in_flight -= 1
        if answer.poll:
            self.polls -= 1
            if type(response) is ReadResponse and response.entries and self._answers_backed_up():
                # Woken polls must not queue entries without bound: the LAC tells the
                # reader what to read next with a plain (back-pressured) READ.
                response = ReadResponse(
                    response.request_id,
                    response.status,
                    response.ledger_id,
                    response.first_entry_id,
                    response.lac,
                    [],
                )
        else:
            self.held_bytes -= answer.held_bytes
        if self.closed:
            return
        try:
            parts = encode_parts(response)
        except LocalProtocolError as exc:  # the bookie made an answer that cannot be
            self._broken("encoding an answer", exc)
            return
        self._out.extend(parts)
        self._out_bytes += sum(map(len, parts))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        if self._out_bytes >= self._config.max_queued_response_bytes:
            self._update_reading()

    def _flush(self) -> None:
        self._flush_scheduled = False
        transport = self._transport
        if transport is None or self.closed:
            return
        if self._out:
            out = self._out
            self._out = []
            if self._out_bytes >= _GATHER_MIN_PART_BYTES * len(out):
                transport.writelines(out)  # large entries: gathered by the kernel, no copy
            else:
                # Small parts (a read answer is two per entry): one copy costs less than
                # a gathered write of thousands of buffers (about half, for 1,000
                # entries of 140 B).
                transport.writelines([b"".join(out)])
            self._out_bytes = 0
        if self._draining and self.in_flight == 0:
            if transport.can_write_eof():
                transport.write_eof()
            transport.close()
            return
        self._update_reading()

    # ------------------------------------------------------------ flow control

    def _answers_backed_up(self) -> bool:
        return self._writing_paused or self._out_bytes >= self._config.max_queued_response_bytes

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None or self.closed or transport.is_closing():
            return
        config = self._config
        should_pause = (
            self._draining
            or self._writing_paused
            or self.held_bytes >= self._budget.share_bytes
            or self.in_flight - self.polls >= config.max_in_flight_requests
            or self._out_bytes >= config.max_queued_response_bytes
        )
        if should_pause and not self._reading_paused:
            self._reading_paused = True
            transport.pause_reading()
        elif not should_pause and self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()

    # ------------------------------------------------------------ closing

    def _broken(self, where: str, exc: BaseException) -> None:
        """A broken invariant: the bookie stops; if its halt returns, so does this connection."""
        self._on_broken_invariant(f"connection from {self.peer}: {where}", exc)
        self._close()

    def _protocol_violation(self, reason: str) -> None:
        log.warning("closing connection from %s: %s", self.peer, reason)
        self._close()

    def _close(self) -> None:
        """Close now: answers already queued are written first, later ones are dropped."""
        if self.closed:
            return
        self.closed = True
        transport = self._transport
        if transport is not None:
            if self._out:
                transport.writelines(self._out)
            transport.close()
            # close() waits for the write buffer to drain; a peer that never reads must
            # not keep the socket (and its buffer) forever.
            self._loop.call_later(_CLOSE_GRACE_S, transport.abort)
        self._out = []
        self._out_bytes = 0

    def drain(self) -> None:
        """Server stopping: read no more requests; close once in-flight ones are answered."""
        self._draining = True
        self._update_reading()
        if self.in_flight == 0 and not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def abort(self) -> None:
        """Close at once (the server's stop deadline passed)."""
        self._close()
