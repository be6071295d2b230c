"""Where ledgers live in the metadata store, and the operations on them.

Layout (see docs/METADATA.md)::

    /ledgers/<ledger id>     ledger metadata JSON (LedgerMetadata.to_bytes), decimal id
    next_id("ledgers")       ledger ids, unique across every client, from 1

Every change is a compare-and-set on the node version (R5, R6, R7 rely on it), and
every read-modify-write goes through :meth:`LedgerManager.update`, the one conflict
policy: on a version conflict, read again and decide again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from quorumlog.errors import (
    BKError,
    MetadataError,
    MetadataVersionError,
    NodeExistsError,
    NoNodeError,
    NoSuchLedgerError,
)
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.meta.store import MetadataStore, Watch, WatchEvent

log = logging.getLogger(__name__)

LEDGERS_PATH = "/ledgers"
LEDGER_ID_COUNTER = "ledgers"

LedgerCallback = Callable[[LedgerMetadata | None], None]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Done(Generic[T]):
    """A decision of :meth:`LedgerManager.update`: write nothing, the metadata as read
    settles it; ``value`` is handed back to the caller."""

    value: T


@dataclass(frozen=True, slots=True)
class GiveUp:
    """A decision of :meth:`LedgerManager.update`: write nothing and raise ``error``."""

    error: BKError


@dataclass(frozen=True, slots=True)
class MetadataUpdate(Generic[T]):
    """How :meth:`LedgerManager.update` ended: the metadata and version now stored
    (``written``: by this update; else as read, with the ``value`` of :class:`Done`)."""

    metadata: LedgerMetadata
    version: int
    written: bool
    value: T | None = None


# What an update decides from the metadata as read: the metadata to write, or a stop.
Decide = Callable[[LedgerMetadata], LedgerMetadata | Done[T] | GiveUp]
# Runs one metadata read or write, e.g. under a deadline: ``guard(operation, what)``.
Guard = Callable[[Awaitable[Any], str], Awaitable[Any]]


class MetadataConflictsError(MetadataError):
    """Every compare-and-set of an update met a concurrent change of the ledger."""


def ledger_path(ledger_id: int) -> str:
    """The metadata path of one ledger."""
    if ledger_id < 0:
        raise NoSuchLedgerError(f"ledger {ledger_id}: ledger ids are not negative")
    return f"{LEDGERS_PATH}/{ledger_id}"


class LedgerManager:
    """Ledger metadata in a :class:`MetadataStore`.

    Example::

        ledgers = LedgerManager(store)
        ledger_id = await ledgers.new_ledger_id()
        version = await ledgers.create(new_ledger_metadata(ledger_id, ensemble, 2, 2, ...))
        metadata, version = await ledgers.read(ledger_id)
        version = await ledgers.write(closed_metadata, version)   # CAS
    """

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    async def new_ledger_id(self) -> int:
        """A ledger id no client ever got before (starts at 1)."""
        return await self.store.next_id(LEDGER_ID_COUNTER)

    async def reserve_ledger_ids(self, count: int) -> int:
        """Reserve ``count`` consecutive ledger ids no client will get from
        :meth:`new_ledger_id`; returns the first of them."""
        return await self.store.next_id(LEDGER_ID_COUNTER, count) - count + 1

    async def create(self, metadata: LedgerMetadata) -> int:
        """Store the metadata of a new ledger; returns its version (0).

        NodeExistsError if the ledger already exists.
        """
        path = ledger_path(metadata.ledger_id)
        try:
            await self.store.create(path, metadata.to_bytes())
        except NodeExistsError:
            raise NodeExistsError(f"ledger {metadata.ledger_id} already exists ({path})") from None
        return 0

    async def read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        """The metadata of a ledger and its version; NoSuchLedgerError if absent."""
        path = ledger_path(ledger_id)
        try:
            found = await self.store.get(path)
        except NoNodeError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist ({path})") from None
        return _decode(ledger_id, found.data), found.version

    async def write(self, metadata: LedgerMetadata, version: int) -> int:
        """Compare-and-set the metadata; returns the new version.

        MetadataVersionError if someone else changed it since ``version``;
        NoSuchLedgerError if the ledger was deleted.
        """
        ledger_id = metadata.ledger_id
        path = ledger_path(ledger_id)
        try:
            return await self.store.set(path, metadata.to_bytes(), version)
        except NoNodeError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist ({path})") from None
        except MetadataVersionError:
            raise MetadataVersionError(
                f"ledger {ledger_id}: metadata changed since version {version}"
            ) from None

    async def delete(self, ledger_id: int, version: int = -1) -> None:
        """Delete a ledger's metadata; NoSuchLedgerError if absent."""
        path = ledger_path(ledger_id)
        try:
            await self.store.delete(path, version)
        except NoNodeError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist ({path})") from None
        except MetadataVersionError:
            raise MetadataVersionError(
                f"ledger {ledger_id}: metadata changed since version {version}"
            ) from None

    async def list_ledger_ids(self) -> list[int]:
        """Every ledger id, in increasing order."""
        try:
            names = await self.store.children(LEDGERS_PATH)
        except NoNodeError:
            return []
        return sorted(int(name) for name in names if name.isdigit())

    async def update(
        self,
        ledger_id: int,
        decide: Decide[T],
        *,
        attempts: int,
        known: tuple[LedgerMetadata, int] | None = None,
        guard: Guard | None = None,
    ) -> MetadataUpdate[T]:
        """Read, decide, compare-and-set; on a version conflict read again and decide again.

        ``decide`` is a pure function of the metadata as read: it returns the metadata
        to write, :class:`Done` (nothing to write: what is stored settles it) or
        :class:`GiveUp` (its error is raised). It sees every version read, including
        the one read after the last conflict, so an outcome someone else already
        reached is never lost. ``known`` is a (metadata, version) the caller holds: the
        first decision is made on it without a read. At most ``attempts`` writes are
        tried; when the next decision still wants to write, MetadataConflictsError.

        Any other error of a read or write (NoSuchLedgerError, a lost connection, a
        timeout) is raised as is: such a write may or may not have happened (R13), and
        only the caller knows how to find out. ``guard`` runs each read and write
        (``guard(operation, "ledger <id>")``), e.g. to put a deadline on it.
        """
        what = f"ledger {ledger_id}"

        async def run(operation: Awaitable[Any]) -> Any:
            return await (operation if guard is None else guard(operation, what))

        if known is None:
            known = await run(self.read(ledger_id))
        metadata, version = known
        writes = 0
        while True:
            decision = decide(metadata)
            if isinstance(decision, Done):
                return MetadataUpdate(metadata, version, False, decision.value)
            if isinstance(decision, GiveUp):
                raise decision.error
            if writes >= attempts:
                raise MetadataConflictsError(f"{what}: too many conflicting metadata updates")
            writes += 1
            try:
                new_version: int = await run(self.write(decision, version))
            except MetadataVersionError:
                metadata, version = await run(self.read(ledger_id))
                continue
            return MetadataUpdate(decision, new_version, True)

    def watch(self, ledger_id: int, callback: LedgerCallback) -> Watch:
        """Call ``callback(metadata)`` after each change of the ledger, ``callback(None)``
        once it is deleted. Calls are in order and skip versions already reported."""
        return _LedgerWatch(self, ledger_id, callback)


def _decode(ledger_id: int, data: bytes) -> LedgerMetadata:
    try:
        metadata = LedgerMetadata.from_bytes(data)
    except MetadataError as exc:
        raise MetadataError(f"ledger {ledger_id}: {exc.message}") from exc
    if metadata.ledger_id != ledger_id:
        raise MetadataError(
            f"ledger {ledger_id}: stored metadata names ledger {metadata.ledger_id}"
        )
    return metadata


class _LedgerWatch(Watch):
    """Turns store events into re-reads of the metadata, one read at a time."""

    def __init__(self, manager: LedgerManager, ledger_id: int, callback: LedgerCallback) -> None:
        self.manager = manager
        self.ledger_id = ledger_id
        self.callback = callback
        self.active = True
        self.dirty = False
        self.reader: asyncio.Task[None] | None = None
        self.last_version: int | None = None  # last version reported; -1 after deletion
        self.store_watch = manager.store.watch(ledger_path(ledger_id), self._on_event)

    def cancel(self) -> None:
        self.active = False
        self.store_watch.cancel()
        if self.reader is not None and not self.reader.done():
            self.reader.cancel()

    def _on_event(self, _event: WatchEvent) -> None:
        if not self.active:
            return
        self.dirty = True
        if self.reader is None or self.reader.done():
            self.reader = asyncio.get_running_loop().create_task(self._read_until_clean())

    async def _read_until_clean(self) -> None:
        for _ in range(1_000):  # bounded: each pass needs a fresh event to be dirty again
            if not (self.dirty and self.active):
                return
            self.dirty = False
            try:
                metadata, version = await self.manager.read(self.ledger_id)
            except NoSuchLedgerError:
                metadata, version = None, -1
            except MetadataError as exc:
                log.warning("ledger %d watch: cannot read metadata: %s", self.ledger_id, exc)
                continue
            if not self.active or version == self.last_version:
                continue
            self.last_version = version
            try:
                self.callback(metadata)
            except Exception:
                log.exception("ledger %d watch callback failed", self.ledger_id)
