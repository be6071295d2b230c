"""Status codes of the wire protocol and the public error hierarchy.

Every error a user can see is a :class:`BKError`. Each carries the status code
it maps to and a message that names the ledger, entry or bookie concerned, so
that an operator reading a log line knows where to look.

Status codes travel on the wire as signed 16-bit integers (see ``proto``).
"""

from __future__ import annotations

import enum


class Status(enum.IntEnum):
    """Outcome of one request, as a bookie reports it on the wire."""

    OK = 0
    NO_SUCH_LEDGER = 1
    NO_SUCH_ENTRY = 2
    BAD_REQUEST = 3
    IO_ERROR = 4
    UNAUTHORIZED = 5
    FENCED = 6
    READ_ONLY = 7
    TOO_MANY_REQUESTS = 8
    BAD_VERSION = 9
    SHUTTING_DOWN = 10


class BKError(Exception):
    """Base of every quorumlog error."""

    status: Status = Status.IO_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ProtocolError(BKError):
    """Bytes that do not decode as a valid frame or message.

    Raised by the codec for hostile or corrupted input; the peer that sent them
    is at fault, and its connection should be closed.
    """

    status = Status.BAD_REQUEST


class LocalProtocolError(ProtocolError):
    """This process tried to encode something the protocol cannot carry."""


class BadRequestError(BKError):
    status = Status.BAD_REQUEST


class NoSuchLedgerError(BKError):
    status = Status.NO_SUCH_LEDGER


class NoSuchEntryError(BKError):
    status = Status.NO_SUCH_ENTRY


class BookieIOError(BKError):
    """A bookie could not read or write its storage (or found a damaged record)."""

    status = Status.IO_ERROR


class UnauthorizedError(BKError):
    """Wrong password / master key for a ledger (R10)."""

    status = Status.UNAUTHORIZED


class LedgerFencedError(BKError):
    """The ledger was fenced by a recovery; an add that got this may or may not be stored."""

    status = Status.FENCED


class BookieReadOnlyError(BKError):
    status = Status.READ_ONLY


class TooManyRequestsError(BKError):
    status = Status.TOO_MANY_REQUESTS


class BookieShuttingDownError(BKError):
    status = Status.SHUTTING_DOWN


class LedgerClosedError(BKError):
    """A write to a ledger that is closed (or being recovered)."""

    status = Status.BAD_REQUEST


class DigestMismatchError(BKError):
    """An entry's digest does not match its content (R9: corruption is not absence)."""

    status = Status.IO_ERROR


class NotEnoughBookiesError(BKError):
    """Fewer writable bookies are available than an ensemble needs."""

    status = Status.IO_ERROR


class BookieUnavailableError(BKError):
    """A bookie could not be reached, or did not answer in time."""

    status = Status.IO_ERROR


class AuthenticationError(BookieUnavailableError):
    """A peer refused this process's credentials (a missing, bad or expired token, a role
    that may not send what was asked) or its transport (TLS at one end only). The message
    says which and never holds the credential itself (docs/SECURITY.md)."""

    status = Status.UNAUTHORIZED


class TimeoutError_(BookieUnavailableError):
    """A request to a bookie timed out (its outcome is unknown)."""


class LedgerRecoveryError(BKError):
    """Recovery could not decide the last entry; the ledger is left unclosed (R8)."""

    status = Status.IO_ERROR


class MetadataError(BKError):
    """The metadata store failed or is unreachable."""

    status = Status.IO_ERROR


class MetadataVersionError(MetadataError):
    """A compare-and-set on the metadata store lost: the version moved on."""

    status = Status.BAD_VERSION


class NoNodeError(MetadataError):
    """A metadata path that does not exist."""

    status = Status.NO_SUCH_LEDGER


class NodeExistsError(MetadataError):
    """A metadata path that already exists."""

    status = Status.BAD_VERSION


class NotEmptyError(MetadataError):
    """A metadata path that still has children cannot be deleted."""


class SessionExpiredError(MetadataError):
    """The metadata session ended: ephemeral entries are gone, leases are lost."""


class InvalidArgumentError(BKError, ValueError):
    """A caller passed an argument that can never work (bad quorum shape, bad option)."""

    status = Status.BAD_REQUEST


class ClientClosedError(BKError):
    """The client or handle was closed."""


_BY_STATUS: dict[Status, type[BKError]] = {
    Status.NO_SUCH_LEDGER: NoSuchLedgerError,
    Status.NO_SUCH_ENTRY: NoSuchEntryError,
    Status.BAD_REQUEST: BadRequestError,
    Status.IO_ERROR: BookieIOError,
    Status.UNAUTHORIZED: UnauthorizedError,
    Status.FENCED: LedgerFencedError,
    Status.READ_ONLY: BookieReadOnlyError,
    Status.TOO_MANY_REQUESTS: TooManyRequestsError,
    Status.BAD_VERSION: MetadataVersionError,
    Status.SHUTTING_DOWN: BookieShuttingDownError,
}


def error_for_status(status: int, message: str) -> BKError:
    """The exception that a non-OK wire status stands for."""
    try:
        cls = _BY_STATUS[Status(status)]
    except (ValueError, KeyError):
        return BookieIOError(f"{message}: unknown status {status}")
    return cls(message)
