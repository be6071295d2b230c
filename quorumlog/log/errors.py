"""Errors of named log streams. All are :class:`~quorumlog.errors.BKError` subclasses."""

from __future__ import annotations

from quorumlog.errors import BKError, InvalidArgumentError, MetadataError, Status


class LogError(BKError):
    """Base of the log stream errors."""


class LogFencedError(LogError):
    """This writer lost the log: a newer writer fenced its ledger, or appended to the
    ledger list before it (its compare-and-set failed). Appends that got this error may
    or may not be in the log; nothing appended through this writer afterwards is."""

    status = Status.FENCED


class LogOutcomeUnknownError(LogError, MetadataError):
    """A change of the log's ledger list may or may not have been applied: its
    compare-and-set had no answer (a lost connection, a timeout), and reading the list
    again did not tell (it could not be read, or what it shows no longer proves either).
    Act as if either were true: a ledger it would have added may be in the log (R13)."""


class NoSuchLogError(LogError):
    """The log does not exist (it was never opened, or it was deleted)."""

    status = Status.NO_SUCH_LEDGER


class LogTruncatedError(LogError):
    """A reader asked for records that :meth:`Log.truncate` removed."""

    status = Status.NO_SUCH_ENTRY


class LogClosedError(LogError):
    """The writer or reader was closed by its owner."""

    status = Status.BAD_REQUEST


class LogRecordFormatError(LogError):
    """A ledger entry of a log that is not a log record: shorter than the record
    header, or of a record format version this reader does not know. The message
    names the ledger and the entry. Retrying cannot help."""

    status = Status.BAD_REQUEST


class InvalidLogNameError(LogError, InvalidArgumentError):
    """A log name that cannot be one metadata path component."""

    status = Status.BAD_REQUEST


__all__ = [
    "InvalidLogNameError",
    "LogClosedError",
    "LogError",
    "LogFencedError",
    "LogOutcomeUnknownError",
    "LogRecordFormatError",
    "LogTruncatedError",
    "NoSuchLogError",
]
