"""What ledger handles and recovery use of their client, and nothing more.

A :class:`~quorumlog.client.bookkeeper.BookKeeper` builds one :class:`ClientContext`
and hands it to every handle it opens: the handles refer to the connections, the
metadata, the placement, the metrics and the configuration, never to the client.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quorumlog.client.config import ClientConfig
from quorumlog.client.connection import ConnectionPool
from quorumlog.client.placement import BookiePlacement
from quorumlog.meta.bookies import BookieRegistry
from quorumlog.meta.ledgers import LedgerManager
from quorumlog.meta.store import MetadataStore

if TYPE_CHECKING:
    from quorumlog.client.metrics import ClientMetrics


@dataclass(eq=False)
class ClientContext:
    """One client's shared parts, bound to its event loop."""

    loop: asyncio.AbstractEventLoop
    config: ClientConfig
    store: MetadataStore
    pool: ConnectionPool
    placement: BookiePlacement
    ledgers: LedgerManager = field(init=False)
    registry: BookieRegistry = field(init=False)
    # None until the client enables metrics: every hook is then one `is None` test.
    metrics: ClientMetrics | None = None

    def __post_init__(self) -> None:
        self.ledgers = LedgerManager(self.store)
        self.registry = BookieRegistry(self.store)
