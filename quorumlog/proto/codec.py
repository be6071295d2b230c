"""The bookie wire protocol: frames and messages, with no I/O.

Bytes in, messages out; messages in, bytes out. Sockets live in ``server/``
and ``client/``. Anything that is not a well-formed frame raises
:class:`~quorumlog.errors.ProtocolError` (R12), and the codec never buffers
more than one maximum-size frame, so a hostile peer cannot make it hold
unbounded memory.

Frame layout (all integers big-endian)::

    uint32  length of the rest of the frame (header + body)
    uint8   protocol version (1)
    uint8   operation; a response carries the request's operation | 0x80
    uint64  request id, chosen by the client, echoed in the response
    body    by operation, below

Many requests may be in flight on one connection; a bookie answers each, not
necessarily in order, and the client matches answers by request id. An ADD
carries several entries of one ledger so that a pipelined writer sends one
frame per bookie per event-loop turn, not one per entry.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from quorumlog.errors import LocalProtocolError, ProtocolError, Status
from quorumlog.proto.entry import MASTER_KEY_SIZE

PROTOCOL_VERSION = 1
MAX_FRAME_SIZE_BYTES_DEFAULT = 8 * 1024 * 1024
RESPONSE_BIT = 0x80

_LENGTH = struct.Struct(">I")
_HEADER = struct.Struct(">IBBQ")  # length, version, op, request id
_HEADER_AFTER_LENGTH = 10  # version + op + request id
_U32 = struct.Struct(">I")
_NO_KEY = bytes(MASTER_KEY_SIZE)


class Op(enum.IntEnum):
    ADD = 1
    READ = 2
    READ_LAC = 3
    FENCE = 4
    WRITE_LAC = 5
    DELETE_LEDGER = 6
    BOOKIE_INFO = 7
    AUTH = 8
    LEDGER_KEY = 9


class AddFlag(enum.IntFlag):
    NONE = 0
    RECOVERY = 1  # accepted even when the ledger is fenced (R7)


class AuthMechanism(enum.IntEnum):
    TOKEN = 1  # a signed token (JWT) with a role claim


# The body layout of AUTH, numbered on its own so that it can change without a new frame
# version (a bookie refuses a version it does not know with BAD_REQUEST and a reason).
AUTH_VERSION = 1
# Roles on the wire (AuthResponse.roles): one bit each, as quorumlog.security.Role names them.
AUTH_ROLE_BITS = {"client": 1, "admin": 2, "bookie": 4}
MAX_AUTH_CREDENTIAL_BYTES = 16 * 1024
MAX_AUTH_REASON_BYTES = 1024


class ReadFlag(enum.IntFlag):
    NONE = 0
    FENCE = 1  # fence the ledger before reading; needs the master key (R7, R8)
    LONG_POLL = 2  # wait until the bookie's LAC passes previous_lac, or timeout_ms


# ---------------------------------------------------------------- requests


@dataclass(slots=True)
class AddRequest:
    request_id: int
    ledger_id: int
    master_key: bytes
    entries: list[bytes]
    flags: AddFlag = AddFlag.NONE
    # The entries as they go on the wire (encode_entries(entries)), when the sender made
    # them once for several bookies; never decoded, not part of the message's value.
    encoded_entries: bytes | None = field(default=None, compare=False, repr=False)


@dataclass(slots=True)
class ReadRequest:
    """Read ``count`` consecutive entries from ``first_entry_id`` (the bookie stops at a gap).

    With LONG_POLL the bookie waits (up to ``timeout_ms``) until its LAC is above
    ``previous_lac``, then answers its LAC and the entries it has from
    ``first_entry_id``.
    """

    request_id: int
    ledger_id: int
    first_entry_id: int
    count: int = 1
    flags: ReadFlag = ReadFlag.NONE
    master_key: bytes = _NO_KEY
    previous_lac: int = -1
    timeout_ms: int = 0
    max_bytes: int = 1 << 20


@dataclass(slots=True)
class ReadLacRequest:
    request_id: int
    ledger_id: int


@dataclass(slots=True)
class FenceRequest:
    request_id: int
    ledger_id: int
    master_key: bytes


@dataclass(slots=True)
class WriteLacRequest:
    request_id: int
    ledger_id: int
    master_key: bytes
    lac: int


@dataclass(slots=True)
class DeleteLedgerRequest:
    """Purge a ledger; ``master_key`` must be the ledger's (R10), else nothing changes."""

    request_id: int
    ledger_id: int
    master_key: bytes


@dataclass(slots=True)
class BookieInfoRequest:
    request_id: int


@dataclass(slots=True)
class LedgerKeyRequest:
    """Ask a bookie for a ledger's master key (R10), as it stored it at the ledger's
    first write: how re-replication copies a ledger whose password it was not given.
    Only the ``bookie`` and ``admin`` roles may send it (docs/SECURITY.md)."""

    request_id: int
    ledger_id: int


@dataclass(slots=True)
class AuthRequest:
    """The first request of a connection to a bookie that checks credentials: the bookie
    answers it before it reads anything else (docs/SECURITY.md)."""

    request_id: int
    credential: bytes
    mechanism: int = AuthMechanism.TOKEN
    version: int = AUTH_VERSION

    def __repr__(self) -> str:  # the credential is a secret: never in a log line
        return (
            f"AuthRequest(request_id={self.request_id}, mechanism={self.mechanism}, "
            f"credential=<{len(self.credential)} bytes>)"
        )


# ---------------------------------------------------------------- responses


@dataclass(slots=True)
class AddResponse:
    request_id: int
    status: int
    ledger_id: int
    entry_count: int


@dataclass(slots=True)
class ReadResponse:
    """Entries from ``first_entry_id`` on, and the LAC the bookie knows of."""

    request_id: int
    status: int
    ledger_id: int
    first_entry_id: int
    lac: int
    entries: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class ReadLacResponse:
    """``lac``: the largest LAC piggybacked on or written for this ledger; ``last_entry_id``:
    the largest entry id stored (-1 when none)."""

    request_id: int
    status: int
    ledger_id: int
    lac: int
    last_entry_id: int


@dataclass(slots=True)
class FenceResponse:
    request_id: int
    status: int
    ledger_id: int
    lac: int
    last_entry_id: int


@dataclass(slots=True)
class StatusResponse:
    """Answer of WRITE_LAC and DELETE_LEDGER."""

    request_id: int
    op: int
    status: int
    ledger_id: int


@dataclass(slots=True)
class BookieInfoResponse:
    request_id: int
    status: int
    read_only: bool
    free_bytes: int
    total_bytes: int


@dataclass(slots=True)
class LedgerKeyResponse:
    """``master_key``: the ledger's, when ``status`` is OK (else zeros)."""

    request_id: int
    status: int
    ledger_id: int
    master_key: bytes = _NO_KEY

    def __repr__(self) -> str:  # the key lets its holder write the ledger: never logged
        return (
            f"LedgerKeyResponse(request_id={self.request_id}, status={self.status}, "
            f"ledger_id={self.ledger_id})"
        )


@dataclass(slots=True)
class AuthResponse:
    """``roles``: the granted roles' bits (AUTH_ROLE_BITS), 0 when refused or when the
    bookie checks nothing; ``reason``: why it refused, for the operator (no secret)."""

    request_id: int
    status: int
    roles: int = 0
    reason: str = ""


Request = (
    AddRequest
    | ReadRequest
    | ReadLacRequest
    | FenceRequest
    | WriteLacRequest
    | DeleteLedgerRequest
    | BookieInfoRequest
    | AuthRequest
    | LedgerKeyRequest
)
Response = (
    AddResponse
    | ReadResponse
    | ReadLacResponse
    | FenceResponse
    | StatusResponse
    | BookieInfoResponse
    | AuthResponse
    | LedgerKeyResponse
)
Message = Request | Response

# Bodies with fixed layout.
_ADD_REQ = struct.Struct(f">QB{MASTER_KEY_SIZE}sI")  # ledger, flags, key, count
_ADD_RESP = struct.Struct(">hQI")  # status, ledger, count
_READ_REQ = struct.Struct(f">QqIB{MASTER_KEY_SIZE}sqII")
_READ_RESP = struct.Struct(">hQqqI")  # status, ledger, first, lac, count
_LEDGER = struct.Struct(">Q")
_READ_LAC_RESP = struct.Struct(">hQqq")
_FENCE_REQ = struct.Struct(f">Q{MASTER_KEY_SIZE}s")
_FENCE_RESP = struct.Struct(">hQqq")
_WRITE_LAC_REQ = struct.Struct(f">Q{MASTER_KEY_SIZE}sq")
_DELETE_REQ = struct.Struct(f">Q{MASTER_KEY_SIZE}s")  # ledger, key
_STATUS_RESP = struct.Struct(">hQ")
_INFO_RESP = struct.Struct(">hBqq")
_AUTH_REQ = struct.Struct(">BBH")  # auth version, mechanism, credential length
_AUTH_RESP = struct.Struct(">hBH")  # status, role bits, reason length
_LEDGER_KEY_RESP = struct.Struct(f">hQ{MASTER_KEY_SIZE}s")  # status, ledger, key

# What an ADD frame's length field counts besides its entry blobs, which must stay within
# the peer's max_frame_size_bytes: the header after the length prefix and the fixed body,
# then a 4-byte length before each blob.
ADD_FRAME_OVERHEAD_BYTES = _HEADER_AFTER_LENGTH + _ADD_REQ.size
ADD_ENTRY_OVERHEAD_BYTES = _U32.size

_MAX_ID = (1 << 63) - 1
_ADD_FLAGS_KNOWN = int(AddFlag.RECOVERY)
_READ_FLAGS_KNOWN = int(ReadFlag.FENCE | ReadFlag.LONG_POLL)


def _header(op: int, request_id: int, body_size: int) -> bytes:
    return _HEADER.pack(_HEADER_AFTER_LENGTH + body_size, PROTOCOL_VERSION, op, request_id)


def _entries_bytes(entries: list[bytes]) -> list[bytes]:
    parts: list[bytes] = []
    for blob in entries:
        parts.append(_U32.pack(len(blob)))
        parts.append(blob)
    return parts


def encode_entries(entries: list[bytes]) -> bytes:
    """The entries of an ADD request as they go on the wire (each with its length): made
    once, they can go to every bookie of a write set (``AddRequest.encoded_entries``)."""
    return b"".join(_entries_bytes(entries))


def _check_key(key: bytes) -> None:
    if len(key) != MASTER_KEY_SIZE:
        raise LocalProtocolError(f"master key must be {MASTER_KEY_SIZE} bytes, got {len(key)}")


def encode(message: Message) -> bytes:
    """One message as one frame."""
    return b"".join(encode_parts(message))


def encode_parts(message: Message) -> list[bytes]:
    """One message as a list of byte strings to be written in order (saves a join)."""
    encoder = _ENCODERS.get(type(message))
    if encoder is None:
        encoder = _subclass_encoder(message)
    try:
        return encoder(message)
    except struct.error as exc:
        raise LocalProtocolError(f"cannot encode {type(message).__name__}: {exc}") from exc


def _subclass_encoder(message: object) -> Callable[[Any], list[bytes]]:
    """The encoder of a subclass of a message: the first whose message it is."""
    for cls, encoder in _ENCODERS.items():
        if isinstance(message, cls):
            return encoder
    raise LocalProtocolError(f"not a protocol message: {type(message).__name__}")


# One encoder per message: the frame of a message as byte strings to write in order.


def _encode_add_request(m: AddRequest) -> list[bytes]:
    _check_key(m.master_key)
    fixed = _ADD_REQ.pack(m.ledger_id, int(m.flags), m.master_key, len(m.entries))
    encoded = m.encoded_entries
    if encoded is not None:
        return [_header(Op.ADD, m.request_id, len(fixed) + len(encoded)), fixed, encoded]
    body = [fixed]
    body += _entries_bytes(m.entries)
    size = sum(map(len, body))
    return [_header(Op.ADD, m.request_id, size), *body]


def _encode_add_response(m: AddResponse) -> list[bytes]:
    body = _ADD_RESP.pack(m.status, m.ledger_id, m.entry_count)
    return [_header(Op.ADD | RESPONSE_BIT, m.request_id, len(body)), body]


def _encode_read_request(m: ReadRequest) -> list[bytes]:
    _check_key(m.master_key)
    body = _READ_REQ.pack(
        m.ledger_id,
        m.first_entry_id,
        m.count,
        int(m.flags),
        m.master_key,
        m.previous_lac,
        m.timeout_ms,
        m.max_bytes,
    )
    return [_header(Op.READ, m.request_id, len(body)), body]


def _encode_read_response(m: ReadResponse) -> list[bytes]:
    body = [_READ_RESP.pack(m.status, m.ledger_id, m.first_entry_id, m.lac, len(m.entries))]
    body += _entries_bytes(m.entries)
    size = sum(map(len, body))
    return [_header(Op.READ | RESPONSE_BIT, m.request_id, size), *body]


def _encode_read_lac_request(m: ReadLacRequest) -> list[bytes]:
    body = _LEDGER.pack(m.ledger_id)
    return [_header(Op.READ_LAC, m.request_id, len(body)), body]


def _encode_read_lac_response(m: ReadLacResponse) -> list[bytes]:
    body = _READ_LAC_RESP.pack(m.status, m.ledger_id, m.lac, m.last_entry_id)
    return [_header(Op.READ_LAC | RESPONSE_BIT, m.request_id, len(body)), body]


def _encode_fence_request(m: FenceRequest) -> list[bytes]:
    _check_key(m.master_key)
    body = _FENCE_REQ.pack(m.ledger_id, m.master_key)
    return [_header(Op.FENCE, m.request_id, len(body)), body]


def _encode_fence_response(m: FenceResponse) -> list[bytes]:
    body = _FENCE_RESP.pack(m.status, m.ledger_id, m.lac, m.last_entry_id)
    return [_header(Op.FENCE | RESPONSE_BIT, m.request_id, len(body)), body]


def _encode_write_lac_request(m: WriteLacRequest) -> list[bytes]:
    _check_key(m.master_key)
    body = _WRITE_LAC_REQ.pack(m.ledger_id, m.master_key, m.lac)
    return [_header(Op.WRITE_LAC, m.request_id, len(body)), body]


def _encode_delete_request(m: DeleteLedgerRequest) -> list[bytes]:
    _check_key(m.master_key)
    body = _DELETE_REQ.pack(m.ledger_id, m.master_key)
    return [_header(Op.DELETE_LEDGER, m.request_id, len(body)), body]


def _encode_status_response(m: StatusResponse) -> list[bytes]:
    if m.op not in (Op.WRITE_LAC, Op.DELETE_LEDGER):
        raise LocalProtocolError(f"StatusResponse cannot answer operation {m.op}")
    body = _STATUS_RESP.pack(m.status, m.ledger_id)
    return [_header(m.op | RESPONSE_BIT, m.request_id, len(body)), body]


def _encode_info_request(m: BookieInfoRequest) -> list[bytes]:
    return [_header(Op.BOOKIE_INFO, m.request_id, 0)]


def _encode_info_response(m: BookieInfoResponse) -> list[bytes]:
    body = _INFO_RESP.pack(m.status, int(m.read_only), m.free_bytes, m.total_bytes)
    return [_header(Op.BOOKIE_INFO | RESPONSE_BIT, m.request_id, len(body)), body]


def _encode_auth_request(m: AuthRequest) -> list[bytes]:
    if len(m.credential) > MAX_AUTH_CREDENTIAL_BYTES:
        raise LocalProtocolError(
            f"credential of {len(m.credential)} bytes (over {MAX_AUTH_CREDENTIAL_BYTES})"
        )
    body = _AUTH_REQ.pack(m.version, int(m.mechanism), len(m.credential)) + m.credential
    return [_header(Op.AUTH, m.request_id, len(body)), body]


def _encode_auth_response(m: AuthResponse) -> list[bytes]:
    reason = m.reason.encode("utf-8")[:MAX_AUTH_REASON_BYTES]
    body = _AUTH_RESP.pack(m.status, m.roles, len(reason)) + reason
    return [_header(Op.AUTH | RESPONSE_BIT, m.request_id, len(body)), body]


def _encode_ledger_key_request(m: LedgerKeyRequest) -> list[bytes]:
    body = _LEDGER.pack(m.ledger_id)
    return [_header(Op.LEDGER_KEY, m.request_id, len(body)), body]


def _encode_ledger_key_response(m: LedgerKeyResponse) -> list[bytes]:
    body = _LEDGER_KEY_RESP.pack(m.status, m.ledger_id, m.master_key)
    return [_header(Op.LEDGER_KEY | RESPONSE_BIT, m.request_id, len(body)), body]


def error_response(request: Request, status: Status) -> Response:
    """The answer a bookie gives to ``request`` when it fails with ``status``."""
    rid = request.request_id
    if isinstance(request, AddRequest):
        return AddResponse(rid, status, request.ledger_id, len(request.entries))
    if isinstance(request, ReadRequest):
        return ReadResponse(rid, status, request.ledger_id, request.first_entry_id, -1, [])
    if isinstance(request, ReadLacRequest):
        return ReadLacResponse(rid, status, request.ledger_id, -1, -1)
    if isinstance(request, FenceRequest):
        return FenceResponse(rid, status, request.ledger_id, -1, -1)
    if isinstance(request, WriteLacRequest):
        return StatusResponse(rid, Op.WRITE_LAC, status, request.ledger_id)
    if isinstance(request, DeleteLedgerRequest):
        return StatusResponse(rid, Op.DELETE_LEDGER, status, request.ledger_id)
    if isinstance(request, AuthRequest):
        return AuthResponse(rid, status)
    if isinstance(request, LedgerKeyRequest):
        return LedgerKeyResponse(rid, status, request.ledger_id)
    return BookieInfoResponse(rid, status, False, 0, 0)


# ---------------------------------------------------------------- decoding


def _read_entries(body: memoryview, offset: int, count: int, op_name: str) -> list[bytes]:
    end = len(body)
    # Each entry takes at least its 4-byte length, so a count larger than that
    # bound is a lie: refuse before allocating anything for it.
    if count > (end - offset) // 4:
        raise ProtocolError(f"{op_name}: entry count {count} exceeds the frame's body")
    # Small entries: copy the body once, then each entry is one slice of bytes (one
    # allocation) instead of a memoryview slice and its copy (two). Large ones: copy each
    # entry once, not the body first.
    data: bytes | memoryview = bytes(body) if end - offset <= 2048 * count else body
    small = type(data) is bytes
    unpack = _U32.unpack_from
    entries: list[bytes] = []
    append = entries.append
    for _ in range(count):
        start = offset + 4
        if start > end:
            raise ProtocolError(f"{op_name}: truncated entry length")
        (size,) = unpack(data, offset)
        offset = start + size
        if offset > end:
            raise ProtocolError(f"{op_name}: entry of {size} bytes runs past the frame")
        append(data[start:offset] if small else bytes(data[start:offset]))  # type: ignore[arg-type]
    if offset != end:
        raise ProtocolError(f"{op_name}: {end - offset} trailing bytes after entries")
    return entries


def _fixed(s: struct.Struct, body: memoryview, op_name: str) -> tuple:  # type: ignore[type-arg]
    if len(body) != s.size:
        raise ProtocolError(f"{op_name}: body of {len(body)} bytes, expected {s.size}")
    return s.unpack(body)


def _check_ids(*ids: int, op_name: str) -> None:
    for value in ids:
        if value > _MAX_ID:
            raise ProtocolError(f"{op_name}: id {value} is out of range")


def decode_message(op: int, request_id: int, body: memoryview) -> Message:
    """Decode one frame's body. Raises ProtocolError for anything malformed."""
    coder = _CODERS.get(op)
    if coder is None:
        raise ProtocolError(f"unknown operation {op}")
    return coder.decode(request_id, body, coder.name)


# One decoder per operation code: ``decode(request id, body, name)``, where the name
# ("ADD request") leads every error message.


def _decode_add_request(request_id: int, body: memoryview, name: str) -> AddRequest:
    if len(body) < _ADD_REQ.size:
        raise ProtocolError(f"{name}: body of {len(body)} bytes is too short")
    ledger_id, flags, key, count = _ADD_REQ.unpack_from(body, 0)
    _check_ids(ledger_id, op_name=name)
    entries = _read_entries(body, _ADD_REQ.size, count, name)
    if flags & ~_ADD_FLAGS_KNOWN:
        raise ProtocolError(f"{name}: unknown flags {flags}")
    return AddRequest(request_id, ledger_id, key, entries, AddFlag(flags))


def _decode_read_request(request_id: int, body: memoryview, name: str) -> ReadRequest:
    ledger_id, first, count, flags, key, prev, timeout_ms, max_bytes = _fixed(_READ_REQ, body, name)
    _check_ids(ledger_id, op_name=name)
    if flags & ~_READ_FLAGS_KNOWN:
        raise ProtocolError(f"{name}: unknown flags {flags}")
    return ReadRequest(
        request_id, ledger_id, first, count, ReadFlag(flags), key, prev, timeout_ms, max_bytes
    )


def _decode_read_lac_request(request_id: int, body: memoryview, name: str) -> ReadLacRequest:
    (ledger_id,) = _fixed(_LEDGER, body, name)
    _check_ids(ledger_id, op_name=name)
    return ReadLacRequest(request_id, ledger_id)


def _decode_fence_request(request_id: int, body: memoryview, name: str) -> FenceRequest:
    ledger_id, key = _fixed(_FENCE_REQ, body, name)
    _check_ids(ledger_id, op_name=name)
    return FenceRequest(request_id, ledger_id, key)


def _decode_write_lac_request(request_id: int, body: memoryview, name: str) -> WriteLacRequest:
    ledger_id, key, lac = _fixed(_WRITE_LAC_REQ, body, name)
    _check_ids(ledger_id, op_name=name)
    return WriteLacRequest(request_id, ledger_id, key, lac)


def _decode_delete_request(request_id: int, body: memoryview, name: str) -> DeleteLedgerRequest:
    ledger_id, key = _fixed(_DELETE_REQ, body, name)
    _check_ids(ledger_id, op_name=name)
    return DeleteLedgerRequest(request_id, ledger_id, key)


def _decode_info_request(request_id: int, body: memoryview, name: str) -> BookieInfoRequest:
    if len(body) != 0:
        raise ProtocolError(f"{name}: unexpected body of {len(body)} bytes")
    return BookieInfoRequest(request_id)


def _decode_auth_request(request_id: int, body: memoryview, name: str) -> AuthRequest:
    if len(body) < _AUTH_REQ.size:
        raise ProtocolError(f"{name}: body of {len(body)} bytes is too short")
    # Version and mechanism decode whatever they are: the bookie answers one it does not
    # know with BAD_REQUEST and a reason, which a newer client can act on.
    version, mechanism, size = _AUTH_REQ.unpack_from(body, 0)
    if size > MAX_AUTH_CREDENTIAL_BYTES:
        raise ProtocolError(f"{name}: credential of {size} bytes")
    if len(body) != _AUTH_REQ.size + size:
        raise ProtocolError(f"{name}: credential length {size} does not match the body")
    return AuthRequest(request_id, bytes(body[_AUTH_REQ.size :]), mechanism, version)


def _decode_ledger_key_request(request_id: int, body: memoryview, name: str) -> LedgerKeyRequest:
    (ledger_id,) = _fixed(_LEDGER, body, name)
    _check_ids(ledger_id, op_name=name)
    return LedgerKeyRequest(request_id, ledger_id)


def _decode_add_response(request_id: int, body: memoryview, name: str) -> AddResponse:
    status, ledger_id, count = _fixed(_ADD_RESP, body, name)
    return AddResponse(request_id, status, ledger_id, count)


def _decode_read_response(request_id: int, body: memoryview, name: str) -> ReadResponse:
    if len(body) < _READ_RESP.size:
        raise ProtocolError(f"{name}: body of {len(body)} bytes is too short")
    status, ledger_id, first, lac, count = _READ_RESP.unpack_from(body, 0)
    entries = _read_entries(body, _READ_RESP.size, count, name)
    return ReadResponse(request_id, status, ledger_id, first, lac, entries)


def _decode_read_lac_response(request_id: int, body: memoryview, name: str) -> ReadLacResponse:
    status, ledger_id, lac, last = _fixed(_READ_LAC_RESP, body, name)
    return ReadLacResponse(request_id, status, ledger_id, lac, last)


def _decode_fence_response(request_id: int, body: memoryview, name: str) -> FenceResponse:
    status, ledger_id, lac, last = _fixed(_FENCE_RESP, body, name)
    return FenceResponse(request_id, status, ledger_id, lac, last)


def _decode_write_lac_response(request_id: int, body: memoryview, name: str) -> StatusResponse:
    status, ledger_id = _fixed(_STATUS_RESP, body, name)
    return StatusResponse(request_id, Op.WRITE_LAC, status, ledger_id)


def _decode_delete_response(request_id: int, body: memoryview, name: str) -> StatusResponse:
    status, ledger_id = _fixed(_STATUS_RESP, body, name)
    return StatusResponse(request_id, Op.DELETE_LEDGER, status, ledger_id)


def _decode_info_response(request_id: int, body: memoryview, name: str) -> BookieInfoResponse:
    status, read_only, free, total = _fixed(_INFO_RESP, body, name)
    return BookieInfoResponse(request_id, status, bool(read_only), free, total)


def _decode_auth_response(request_id: int, body: memoryview, name: str) -> AuthResponse:
    if len(body) < _AUTH_RESP.size:
        raise ProtocolError(f"{name}: body of {len(body)} bytes is too short")
    status, roles, size = _AUTH_RESP.unpack_from(body, 0)
    if size > MAX_AUTH_REASON_BYTES or len(body) != _AUTH_RESP.size + size:
        raise ProtocolError(f"{name}: reason length {size} does not match the body")
    reason = bytes(body[_AUTH_RESP.size :]).decode("utf-8", "replace")
    return AuthResponse(request_id, status, roles, reason)


def _decode_ledger_key_response(request_id: int, body: memoryview, name: str) -> LedgerKeyResponse:
    status, ledger_id, key = _fixed(_LEDGER_KEY_RESP, body, name)
    return LedgerKeyResponse(request_id, status, ledger_id, key)


# ---------------------------------------------------------------- the coders' table


@dataclass(frozen=True, slots=True)
class _Coder:
    """What the codec does for one operation code (a request's, or a response's with
    RESPONSE_BIT): the message it carries, its encoder and its decoder."""

    name: str  # "ADD request": what error messages start with
    message: type
    encode: Callable[[Any], list[bytes]]
    decode: Callable[[int, memoryview, str], Message]


# A side of an operation: its message's type, encoder and decoder.
_Side = tuple[type, Callable[..., list[bytes]], Callable[..., Message]]
# Per operation: its request's side, then its response's.
_OP_CODERS: tuple[tuple[Op, _Side, _Side], ...] = (
    (
        Op.ADD,
        (AddRequest, _encode_add_request, _decode_add_request),
        (AddResponse, _encode_add_response, _decode_add_response),
    ),
    (
        Op.READ,
        (ReadRequest, _encode_read_request, _decode_read_request),
        (ReadResponse, _encode_read_response, _decode_read_response),
    ),
    (
        Op.READ_LAC,
        (ReadLacRequest, _encode_read_lac_request, _decode_read_lac_request),
        (ReadLacResponse, _encode_read_lac_response, _decode_read_lac_response),
    ),
    (
        Op.FENCE,
        (FenceRequest, _encode_fence_request, _decode_fence_request),
        (FenceResponse, _encode_fence_response, _decode_fence_response),
    ),
    (
        Op.WRITE_LAC,
        (WriteLacRequest, _encode_write_lac_request, _decode_write_lac_request),
        (StatusResponse, _encode_status_response, _decode_write_lac_response),
    ),
    (
        Op.DELETE_LEDGER,
        (DeleteLedgerRequest, _encode_delete_request, _decode_delete_request),
        (StatusResponse, _encode_status_response, _decode_delete_response),
    ),
    (
        Op.BOOKIE_INFO,
        (BookieInfoRequest, _encode_info_request, _decode_info_request),
        (BookieInfoResponse, _encode_info_response, _decode_info_response),
    ),
    (
        Op.AUTH,
        (AuthRequest, _encode_auth_request, _decode_auth_request),
        (AuthResponse, _encode_auth_response, _decode_auth_response),
    ),
    (
        Op.LEDGER_KEY,
        (LedgerKeyRequest, _encode_ledger_key_request, _decode_ledger_key_request),
        (LedgerKeyResponse, _encode_ledger_key_response, _decode_ledger_key_response),
    ),
)
# The operation code on the wire -> its coder.
_CODERS: dict[int, _Coder] = {
    code: _Coder(f"{op.name} {side}", message, encode, decode)
    for op, request, response in _OP_CODERS
    for code, side, (message, encode, decode) in (
        (int(op), "request", request),
        (op | RESPONSE_BIT, "response", response),
    )
}
# The message's type -> its encoder.
_ENCODERS: dict[type, Callable[[Any], list[bytes]]] = {
    coder.message: coder.encode for coder in _CODERS.values()
}
assert len(_CODERS) == 2 * len(Op), "every operation has a request and a response coder"


class FrameDecoder:
    """Incremental decoder: feed bytes as they arrive, get whole messages back.

    Holds at most one partial frame (bounded by ``max_frame_size_bytes``). After
    a ProtocolError the stream is unusable: the caller closes the connection.
    """

    __slots__ = ("_buffer", "_failed", "max_frame_size_bytes")

    def __init__(self, max_frame_size_bytes: int = MAX_FRAME_SIZE_BYTES_DEFAULT) -> None:
        self.max_frame_size_bytes = max_frame_size_bytes
        self._buffer = bytearray()
        self._failed = False

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)

    def feed(
        self, data: bytes | bytearray | memoryview, sizes: list[int] | None = None
    ) -> list[Message]:
        """The whole messages completed by ``data``, in order; with ``sizes``, each one's
        frame length is appended to it (a server counts the bytes a request holds).

        Frames whole within ``data`` are decoded from it where they lie: only a frame
        begun earlier (its missing part) and the partial frame at the end are copied into
        the decoder's buffer, not every byte received (a copy of each large entry less).
        """
        if self._failed:
            raise ProtocolError("decoder already failed on an earlier frame")
        buf = self._buffer
        messages: list[Message] = []
        try:
            with memoryview(data) as incoming:
                taken = 0
                if buf:
                    taken = len(incoming)
                    if len(buf) >= 4:  # take only the rest of the frame begun earlier
                        (length,) = _LENGTH.unpack_from(buf, 0)
                        taken = min(taken, max(0, 4 + length - len(buf)))
                    buf += incoming[:taken]
                    with memoryview(buf) as view:
                        done = self._decode_frames(view, messages, sizes)
                    if done:
                        del buf[:done]
                # Here either every byte was taken or the buffer is empty.
                if taken < len(incoming):
                    with incoming[taken:] as rest:
                        done = self._decode_frames(rest, messages, sizes)
                        if done < len(rest):
                            buf += rest[done:]
        except ProtocolError:
            self._failed = True
            raise
        except (struct.error, ValueError) as exc:
            self._failed = True
            raise ProtocolError(f"malformed frame: {exc}") from exc
        return messages

    def _decode_frames(
        self, view: memoryview, messages: list[Message], sizes: list[int] | None
    ) -> int:
        """Decode the whole frames at the start of ``view`` into ``messages``; returns
        the bytes they took. Decoded messages hold copies, never views of ``view``."""
        offset = 0
        total = len(view)
        while total - offset >= 4:
            (length,) = _LENGTH.unpack_from(view, offset)
            if length < _HEADER_AFTER_LENGTH:
                raise ProtocolError(f"frame length {length} is shorter than a header")
            if length > self.max_frame_size_bytes:
                raise ProtocolError(
                    f"frame length {length} exceeds the maximum {self.max_frame_size_bytes} bytes"
                )
            if total - offset - 4 < length:
                break
            _, version, op, request_id = _HEADER.unpack_from(view, offset)
            if version != PROTOCOL_VERSION:
                raise ProtocolError(f"unsupported protocol version {version}")
            start = offset + 4 + _HEADER_AFTER_LENGTH
            end = offset + 4 + length
            messages.append(decode_message(op, request_id, view[start:end]))
            if sizes is not None:
                sizes.append(length + 4)
            offset = end
        return offset
