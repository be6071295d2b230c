"""The metadata layer: a ZooKeeper-like store and what quorumlog keeps in it.

- :class:`MetadataStore` (``store.py``): the interface.
- :func:`open_store` (``factory.py``): picks a driver from the URI
  (``sqlite:///path.db`` or ``zk://host:port/root``).
- :class:`LedgerManager` (``ledgers.py``): ledger metadata under ``/ledgers``.
- :class:`BookieRegistry` (``bookies.py``): bookie registration and cookies under ``/bookies``.

The drivers (``SqliteStore``, ``ZkStore``) are imported on first use, so that
importing this package does not load kazoo.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quorumlog.meta.bookies import BookieRegistry
from quorumlog.meta.factory import (
    ENV_METADATA_URI,
    default_metadata_uri,
    open_store,
    resolve_metadata_uri,
)
from quorumlog.meta.ledger_metadata import LedgerMetadata, LedgerState, new_ledger_metadata
from quorumlog.meta.ledgers import LedgerManager
from quorumlog.meta.store import (
    EventType,
    MetadataStore,
    SessionState,
    Versioned,
    Watch,
    WatchEvent,
)

if TYPE_CHECKING:
    from quorumlog.meta.sqlite_store import SqliteStore
    from quorumlog.meta.zk_store import ZkStore

__all__ = [
    "ENV_METADATA_URI",
    "BookieRegistry",
    "EventType",
    "LedgerManager",
    "LedgerMetadata",
    "LedgerState",
    "MetadataStore",
    "SessionState",
    "SqliteStore",
    "Versioned",
    "Watch",
    "WatchEvent",
    "ZkStore",
    "default_metadata_uri",
    "new_ledger_metadata",
    "open_store",
    "resolve_metadata_uri",
]


def __getattr__(name: str) -> Any:
    if name == "SqliteStore":
        from quorumlog.meta.sqlite_store import SqliteStore

        return SqliteStore
    if name == "ZkStore":
        from quorumlog.meta.zk_store import ZkStore

        return ZkStore
    raise AttributeError(f"module 'quorumlog.meta' has no attribute {name!r}")
