"""quorumlog: Apache BookKeeper's replicated log in Python.

The synchronous client is :class:`BookKeeper` (log streams: :class:`LogNamespace`);
the asyncio client with the same names is :mod:`quorumlog.aio`. Every error is a
:class:`BKError`.
"""

from typing import TYPE_CHECKING, Any

from quorumlog.errors import (
    AuthenticationError,
    BKError,
    BookieUnavailableError,
    DigestMismatchError,
    InvalidArgumentError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerRecoveryError,
    MetadataError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    ProtocolError,
    Status,
    TooManyRequestsError,
    UnauthorizedError,
)
from quorumlog.meta.ledger_metadata import LedgerMetadata, LedgerState
from quorumlog.proto.entry import DigestType, Entry

__version__ = "0.1.0"

if TYPE_CHECKING:
    from quorumlog.client.config import ClientConfig
    from quorumlog.client.sync import BookKeeper, LedgerHandle, ReadHandle
    from quorumlog.log import LogConfig, LogFencedError, Position, Record
    from quorumlog.log.sync import LogNamespace

# The client is imported on first use, so that a bookie process (which imports
# quorumlog.proto and quorumlog.bookie) does not load it. Log streams are a namespace
# over the client, in quorumlog.log above the client package.
_LAZY = {
    "BookKeeper": "quorumlog.client.sync",
    "LogNamespace": "quorumlog.log.sync",
    "LedgerHandle": "quorumlog.client.sync",
    "ReadHandle": "quorumlog.client.sync",
    "ClientConfig": "quorumlog.client.config",
    "LogConfig": "quorumlog.log",
    "LogFencedError": "quorumlog.log",
    "Position": "quorumlog.log",
    "Record": "quorumlog.log",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'quorumlog' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


__all__ = [
    "AuthenticationError",
    "BKError",
    "BookKeeper",
    "BookieUnavailableError",
    "ClientConfig",
    "DigestMismatchError",
    "DigestType",
    "Entry",
    "InvalidArgumentError",
    "LedgerClosedError",
    "LedgerFencedError",
    "LedgerHandle",
    "LedgerMetadata",
    "LedgerRecoveryError",
    "LedgerState",
    "LogConfig",
    "LogFencedError",
    "LogNamespace",
    "MetadataError",
    "NoSuchEntryError",
    "NoSuchLedgerError",
    "NotEnoughBookiesError",
    "Position",
    "ProtocolError",
    "ReadHandle",
    "Record",
    "Status",
    "TooManyRequestsError",
    "UnauthorizedError",
]
