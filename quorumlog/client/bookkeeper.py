"""The asyncio BookKeeper client: ledgers on bookies, metadata in the store.

Example::

    async with await BookKeeper.connect("sqlite:///tmp/ql/metadata.db") as bk:
        lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2)
        entry_id = await lh.add_entry(b"hello")
        await lh.close()
        rh = await bk.open_ledger(lh.ledger_id)
        [entry] = await rh.read_entries(0, 0)
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import random
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Self

from quorumlog.client.config import ClientConfig
from quorumlog.client.connection import ConnectionPool, SslContextSource
from quorumlog.client.context import ClientContext
from quorumlog.client.placement import BookiePlacement, placed
from quorumlog.client.reading import ReadHandle
from quorumlog.client.recovery import LedgerRecovery
from quorumlog.client.writing import LedgerHandle
from quorumlog.core.placement import PlacementPolicy
from quorumlog.core.quorum import check_quorum_shape
from quorumlog.errors import (
    BKError,
    ClientClosedError,
    InvalidArgumentError,
    NoSuchLedgerError,
    Status,
    UnauthorizedError,
)
from quorumlog.meta.bookies import BookieRegistry
from quorumlog.meta.factory import open_store, resolve_metadata_uri
from quorumlog.meta.ledger_metadata import LedgerMetadata, new_ledger_metadata
from quorumlog.meta.ledgers import LedgerManager
from quorumlog.meta.store import MetadataStore
from quorumlog.proto.codec import DeleteLedgerRequest
from quorumlog.proto.entry import DigestType, master_key
from quorumlog.security.tls import TlsFiles, TlsReloader
from quorumlog.security.tokens import TokenFile

if TYPE_CHECKING:
    from quorumlog.client.metrics import ClientMetrics


def password_digest(password: bytes) -> str:
    """What the metadata keeps to check passwords: a hash of the master key, not the password."""
    return key_digest(master_key(password))


def password_fits(md: LedgerMetadata, password: bytes) -> bool:
    """Whether ``password`` is the ledger's (R10), by the hash its metadata keeps."""
    return not md.password_digest or md.password_digest == password_digest(password)


def check_password(md: LedgerMetadata, password: bytes) -> None:
    """UnauthorizedError unless ``password`` is the ledger's (R10)."""
    if not password_fits(md, password):
        given = "" if password else " (none was given; the ledger has one)"
        raise UnauthorizedError(f"ledger {md.ledger_id}: wrong password{given}")


def key_digest(key: bytes) -> str:
    """The hash of a master key, as the metadata keeps it."""
    return hashlib.sha256(key).hexdigest()


def _tls_source(tls: TlsFiles | None) -> SslContextSource | None:
    """The TLS context of each new bookie connection (None: plain TCP)."""
    return None if tls is None else TlsReloader(tls, server_side=False).current


class BookKeeper:
    """A BookKeeper client bound to one metadata store and the running event loop."""

    def __init__(
        self,
        store: MetadataStore,
        config: ClientConfig | None = None,
        *,
        pool: ConnectionPool | None = None,
        rng: random.Random | None = None,
    ) -> None:
        """Use :meth:`connect` unless you bring your own store (or, in the simulator, pool)."""
        loop = asyncio.get_running_loop()
        config = config or ClientConfig()
        pool = pool or ConnectionPool(
            loop,
            connect_timeout_ms=config.connect_timeout_ms,
            max_frame_size_bytes=config.max_frame_size_bytes,
            max_queued_bytes=config.max_queued_bytes_per_connection,
            # Security (docs/SECURITY.md): both read per new connection.
            ssl_context=_tls_source(config.tls),
            token=TokenFile(config.token_file),
        )
        # Bookie placement draws from rng; the simulator passes a seeded one.
        self.rng = rng or random.Random()
        # What the handles this client opens use of it (they never see the client).
        policy = PlacementPolicy(
            config.placement, config.min_racks_per_write_quorum, config.enforce_placement
        )
        self.ctx = ClientContext(loop, config, store, pool, BookiePlacement(self.rng, policy))
        self._closed = False
        self._handles: weakref.WeakSet[ReadHandle] = weakref.WeakSet()

    @classmethod
    async def connect(
        cls,
        metadata: str | None = None,
        *,
        config: ClientConfig | None = None,
        create: bool = False,
        placement: str | None = None,
    ) -> Self:
        """Open the metadata store (explicit URI, else $QUORUMLOG_METADATA, else ./.quorumlog).

        A store that does not exist is a MetadataError naming it, unless ``create``:
        bookies make stores, a client with a mistyped URI must not. ``placement``
        (``random``, ``rack-aware``, ``region-aware``) overrides the config's policy.
        """
        config = config or ClientConfig()
        if placement is not None:
            config = dataclasses.replace(config, placement=placement)
        store = await open_store(
            resolve_metadata_uri(metadata),
            session_timeout_ms=config.metadata_session_timeout_ms,
            create=create,
        )
        return cls(store, config)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self.ctx.loop

    @property
    def config(self) -> ClientConfig:
        return self.ctx.config

    @property
    def store(self) -> MetadataStore:
        return self.ctx.store

    @property
    def pool(self) -> ConnectionPool:
        return self.ctx.pool

    @property
    def ledgers(self) -> LedgerManager:
        return self.ctx.ledgers

    @property
    def registry(self) -> BookieRegistry:
        return self.ctx.registry

    @property
    def placement(self) -> BookiePlacement:
        return self.ctx.placement

    @property
    def metrics(self) -> ClientMetrics | None:
        """None until :meth:`enable_metrics`."""
        return self.ctx.metrics

    @property
    def metadata_uri(self) -> str:
        return self.store.uri

    def check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("BookKeeper client is closed")

    def enable_metrics(self) -> ClientMetrics:
        """Start keeping Prometheus metrics (idempotent); expose ``.registry`` as you like."""
        if self.ctx.metrics is None:
            from quorumlog.client.metrics import ClientMetrics

            self.ctx.metrics = ClientMetrics()
        return self.ctx.metrics

    # ------------------------------------------------------------ bookies

    async def list_bookies(self) -> list[str]:
        """Addresses of the available, writable bookies."""
        self.check_open()
        return sorted(await self.registry.writable_bookies())

    # ------------------------------------------------------------ ledgers

    async def create_ledger(
        self,
        ensemble: int = 3,
        write_quorum: int = 3,
        ack_quorum: int = 2,
        digest_type: DigestType = DigestType.CRC32C,
        password: bytes = b"",
        custom_metadata: Mapping[str, bytes] | None = None,
        *,
        ensemble_bookies: Sequence[str] | None = None,
        ledger_id: int | None = None,
    ) -> LedgerHandle:
        """Create a ledger on ``ensemble`` bookies and return its writer handle (R1).

        Bookies are chosen at random among the writable ones, unless
        ``ensemble_bookies`` names them (placement for tools and tests).

        ``ledger_id`` asks for a given id (BookKeeper's ``createLedgerAdv`` with an
        id): for callers that reserved ids with ``LedgerManager.reserve_ledger_ids``
        so that their ledgers sort in an order they choose. NodeExistsError if taken.
        """
        self.check_open()
        check_quorum_shape(ensemble, write_quorum, ack_quorum)
        if ensemble_bookies is not None:
            if len(ensemble_bookies) != ensemble or len(set(ensemble_bookies)) != ensemble:
                raise InvalidArgumentError(
                    f"ensemble_bookies must name {ensemble} distinct bookies: {ensemble_bookies}"
                )
            bookies = tuple(ensemble_bookies)
        elif self.placement.needs_locations:
            writable_at = placed(await self.registry.writable_locations())
            bookies = self.placement.new_placed_ensemble(writable_at, ensemble, write_quorum)
        else:
            writable = await self.registry.writable_bookies()
            bookies = self.placement.new_ensemble(writable, ensemble)
        if ledger_id is None:
            ledger_id = await self.ledgers.new_ledger_id()
        elif not isinstance(ledger_id, int) or ledger_id < 1:
            raise InvalidArgumentError(f"bad ledger id {ledger_id!r}: must be a positive integer")
        metadata = new_ledger_metadata(
            ledger_id,
            bookies,
            write_quorum,
            ack_quorum,
            DigestType(digest_type),
            password_digest(password),
            custom_metadata,
        )
        version = await self.ledgers.create(metadata)
        handle = LedgerHandle(self.ctx, metadata, version, password)
        self._handles.add(handle)
        return handle

    async def _read_checked(self, ledger_id: int, password: bytes) -> tuple[LedgerMetadata, int]:
        metadata, version = await self.ledgers.read(ledger_id)
        check_password(metadata, password)
        return metadata, version

    async def open_ledger(self, ledger_id: int, password: bytes = b"") -> ReadHandle:
        """Open for reading; if the ledger is not closed, fence, recover and close it (R7, R8)."""
        self.check_open()
        metadata, version = await self._read_checked(ledger_id, password)
        if not metadata.is_closed:
            metadata, version = await LedgerRecovery(self.ctx, metadata, version, password).run()
        handle = ReadHandle(self.ctx, metadata, version, password)
        self._handles.add(handle)
        return handle

    async def recover_ledger_with_key(self, ledger_id: int, key: bytes) -> LedgerMetadata:
        """Fence, recover and close ``ledger_id`` (R7, R8) with its master key instead of
        its password: what re-replication does to an open ledger whose password it was
        not given, with the key a bookie of the ledger handed it (docs/SECURITY.md).
        MAC digests are not checked then; the entries go back byte for byte. The
        ledger's metadata as it ends (closed); UnauthorizedError for a wrong key."""
        self.check_open()
        metadata, version = await self.ledgers.read(ledger_id)
        if metadata.password_digest and metadata.password_digest != key_digest(key):
            raise UnauthorizedError(f"ledger {ledger_id}: wrong master key")
        if not metadata.is_closed:
            recovery = LedgerRecovery(self.ctx, metadata, version, b"", key=key)
            metadata, version = await recovery.run()
        return metadata

    async def open_ledger_no_recovery(self, ledger_id: int, password: bytes = b"") -> ReadHandle:
        """Open for reading without fencing: the writer carries on; reads stop at the LAC."""
        self.check_open()
        metadata, version = await self._read_checked(ledger_id, password)
        handle = ReadHandle(self.ctx, metadata, version, password)
        if not metadata.is_closed:
            handle._watch_metadata()
            await handle.read_last_add_confirmed()
        self._handles.add(handle)
        return handle

    async def delete_ledger(self, ledger_id: int, password: bytes = b"") -> None:
        """Delete a ledger: its metadata, then its bookies drop it (later adds to it fail).

        Needs the ledger's password (R10): bookies purge a ledger only for its master key,
        and a wrong password is refused here before anything changes.

        The metadata goes first (R15): when its delete fails or its outcome is unknown
        (R13), the error is raised before any bookie was told, so metadata never names
        data that is gone.
        """
        self.check_open()
        metadata, _ = await self._read_checked(ledger_id, password)
        await self.ledgers.delete(ledger_id)
        key = master_key(password)
        futures = [
            self.pool.request(
                bookie, DeleteLedgerRequest(0, ledger_id, key), self.config.add_timeout_ms
            )
            for bookie in sorted(metadata.all_bookies())
        ]
        # Best effort on the bookies: one that is down drops the ledger at its next
        # garbage collection, which finds the metadata gone.
        await asyncio.gather(*futures, return_exceptions=True)

    async def list_ledgers(self) -> list[int]:
        self.check_open()
        return await self.ledgers.list_ledger_ids()

    async def is_closed(self, ledger_id: int) -> bool:
        self.check_open()
        metadata, _ = await self.ledgers.read(ledger_id)
        return metadata.is_closed

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        self.check_open()
        metadata, _ = await self.ledgers.read(ledger_id)
        return metadata

    async def ledger_exists(self, ledger_id: int) -> bool:
        try:
            await self.ledgers.read(ledger_id)
        except NoSuchLedgerError:
            return False
        return True

    # ------------------------------------------------------------ lifecycle

    async def close(self) -> None:
        """Close the client: open read handles are released, connections and the store closed.

        Writer handles are not closed for you: a ledger left open is recovered by the
        next client that opens it, as after a crash.
        """
        if self._closed:
            return
        self._closed = True
        for handle in list(self._handles):
            if not isinstance(handle, LedgerHandle):
                await handle.close()
        self._handles.clear()
        self.pool.close()
        if isinstance(self.pool, ConnectionPool):  # not a simulator's stand-in: real sockets
            await self.pool.wait_closed()
        await self.store.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


__all__ = ["BKError", "BookKeeper", "LedgerHandle", "ReadHandle", "Status"]
