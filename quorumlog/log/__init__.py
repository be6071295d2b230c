"""Named log streams (DistributedLog-style): a log is an ordered list of ledgers.

The asyncio API (:class:`Log`, :class:`LogWriter`, :class:`LogReader`) is reached
through ``await LogNamespace(bk).open_log(name)`` on a :class:`quorumlog.aio.BookKeeper`;
the synchronous one, with the same names, through ``LogNamespace(bk).open_log(name)``
with :class:`quorumlog.BookKeeper` and :class:`quorumlog.LogNamespace` (see
:mod:`quorumlog.log.sync`). docs/LOGS.md describes the layout in the metadata store
and rule R11.
"""

from quorumlog.log.config import LogConfig
from quorumlog.log.errors import (
    InvalidLogNameError,
    LogClosedError,
    LogError,
    LogFencedError,
    LogOutcomeUnknownError,
    LogRecordFormatError,
    LogTruncatedError,
    NoSuchLogError,
)
from quorumlog.log.log import Log, delete_log, list_logs, open_log
from quorumlog.log.metadata import LogMetadata
from quorumlog.log.namespace import LogNamespace
from quorumlog.log.position import LogPositions, Position, Record
from quorumlog.log.reader import LogReader
from quorumlog.log.writer import LogWriter

__all__ = [
    "InvalidLogNameError",
    "Log",
    "LogClosedError",
    "LogConfig",
    "LogError",
    "LogFencedError",
    "LogMetadata",
    "LogNamespace",
    "LogOutcomeUnknownError",
    "LogPositions",
    "LogReader",
    "LogRecordFormatError",
    "LogTruncatedError",
    "LogWriter",
    "NoSuchLogError",
    "Position",
    "Record",
    "delete_log",
    "list_logs",
    "open_log",
]
