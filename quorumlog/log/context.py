"""What a log's writer and readers use: its name and settings, and the client's ledgers.

They refer to a :class:`LogContext`, not to the :class:`~quorumlog.log.log.Log` that
opened them nor to the whole client: the ledger operations they call are named by
:class:`LedgerClient`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

# The owner tags of ledgers (re-exported for the layers above log streams).
from quorumlog.core.orphans import DB_SNAPSHOT as DB_SNAPSHOT
from quorumlog.core.orphans import LOG
from quorumlog.core.orphans import ownership_tags as ownership_tags
from quorumlog.log.config import LogConfig

if TYPE_CHECKING:
    from quorumlog.client.config import ClientConfig
    from quorumlog.client.reading import ReadHandle
    from quorumlog.client.writing import LedgerHandle
    from quorumlog.meta.ledger_metadata import LedgerMetadata
    from quorumlog.meta.ledgers import LedgerManager
    from quorumlog.meta.store import MetadataStore
    from quorumlog.proto.entry import DigestType


class LedgerClient(Protocol):
    """The ledger operations log streams use (:class:`quorumlog.client.bookkeeper.BookKeeper`)."""

    @property
    def config(self) -> ClientConfig: ...

    @property
    def store(self) -> MetadataStore: ...

    @property
    def ledgers(self) -> LedgerManager: ...

    async def create_ledger(
        self,
        ensemble: int,
        write_quorum: int,
        ack_quorum: int,
        digest_type: DigestType,
        password: bytes,
        custom_metadata: Mapping[str, bytes] | None,
    ) -> LedgerHandle: ...

    async def open_ledger(self, ledger_id: int, password: bytes) -> ReadHandle: ...

    async def open_ledger_no_recovery(self, ledger_id: int, password: bytes) -> ReadHandle: ...

    async def delete_ledger(self, ledger_id: int, password: bytes) -> None: ...

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata: ...


@dataclass(frozen=True, eq=False)
class LogContext:
    """One named log on one client."""

    bk: LedgerClient
    name: str
    config: LogConfig

    @property
    def store(self) -> MetadataStore:
        return self.bk.store

    async def create_ledger(self) -> LedgerHandle:
        """A new ledger with this log's settings (tagged with the log's name)."""
        config = self.config
        return await self.bk.create_ledger(
            config.ensemble,
            config.write_quorum,
            config.ack_quorum,
            config.digest_type,
            config.password,
            ownership_tags(LOG, self.name),
        )
