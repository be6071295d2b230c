"""Garbage collection: drop the ledgers that no longer exist in the metadata store.

Absence is not permission (R15). A round drops a ledger only when the metadata store
says, for that very ledger, that it does not exist (BookKeeper's ``verifyMetadataOnGc``),
and only while the store is still the one this bookie started on:

1. the bookie's own ledger ids are snapshotted *before* anything is read: a ledger
   created meanwhile has its metadata written before any of its entries reach a bookie,
   so it is either in the listing or absent from the snapshot; only ledgers in the
   snapshot are candidates;
2. the store is synced (R18): ZooKeeper's reads are sequentially consistent per
   session, not linearizable, and a follower that lags the quorum would list neither a
   ledger created moments ago nor find it when read alone, though this bookie already
   holds its entries. After ``sync()`` every read sees each write completed before it,
   so every ledger of the snapshot;
3. this bookie's cookie must be in the store: a store wiped or re-created empty has
   none, and there every ledger would look deleted;
4. the ledger layout is walked level by level (never one listing of the whole cluster,
   its reads paced to ``reads_per_s``), keeping only the ids of the snapshot; a missing
   ``/ledgers`` is a wiped store, not "no ledgers", and an empty listing while the
   bookie holds ledgers proves nothing either (a store being restored, a server that
   lost its data): the round stops there;
5. each candidate missing from the listing is read on its own, each batch of reads
   after a sync of its own; only "no such node" confirms it (a listing can be stale;
   an error or timeout is unknown, R13, and keeps the ledger);
6. the cookie is read again, after those reads: a store wiped while they ran is seen.

A round that cannot prove a deletion drops nothing and says why (:class:`GcSkipped`).
What the bookie then does in memory cannot fail on bad input: an exception there is a
broken invariant, and the bookie's halt stops it (:mod:`quorumlog.bookie.invariants`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from quorumlog.errors import BKError, NoNodeError, NoSuchLedgerError
from quorumlog.meta.bookies import BookieRegistry
from quorumlog.meta.ledgers import LEDGERS_PATH, LedgerManager
from quorumlog.meta.store import MetadataStore

log = logging.getLogger(__name__)

# Candidates read at once: enough to finish a large round quickly, few enough not to
# flood the store.
_READS_IN_FLIGHT = 16


class GcSkipped(BKError):
    """A round that could not prove any deletion; the message says why."""


class Collectable(Protocol):
    def ledger_ids(self) -> set[int]: ...

    def garbage_collect(self, live_ledger_ids: Iterable[int], snapshot: set[int]) -> int: ...

    def halt(self, where: str, exc: BaseException) -> None: ...


class GcMetadata(Protocol):
    """What a round reads from the metadata store."""

    async def sync(self) -> None:
        """Make the reads that follow see every write completed before this call (R18)."""
        ...

    async def cookie_exists(self) -> bool: ...

    async def list_ledgers(self, among: set[int]) -> tuple[set[int], int]:
        """The ledgers of ``among`` the store lists, and how many it lists in all."""
        ...

    async def ledger_exists(self, ledger_id: int) -> bool: ...


class StoreGcMetadata:
    """:class:`GcMetadata` on the server's current store (it changes after a lost session)."""

    def __init__(
        self,
        store: Callable[[], MetadataStore],
        address: str,
        *,
        reads_per_s: float | None = None,
    ) -> None:
        self._store = store
        self.address = address
        self.reads_per_s = reads_per_s
        self._synced: MetadataStore | None = None  # the store the last sync went to
        self._manager: LedgerManager | None = None

    def _ledgers(self, store: MetadataStore) -> LedgerManager:
        if self._manager is None or self._manager.store is not store:
            self._manager = LedgerManager(store)
        return self._manager

    async def sync(self) -> None:
        store = self._store()
        self._synced = None
        await store.sync(LEDGERS_PATH)
        self._synced = store

    async def _read_store(self) -> MetadataStore:
        """The current store, synced first if the last sync went to another one (the
        server opens a new store after a lost session: a new session may be served by
        a server further behind than the old one's)."""
        store = self._store()
        if store is not self._synced:
            await store.sync(LEDGERS_PATH)
            self._synced = store
        return store

    async def cookie_exists(self) -> bool:
        store = await self._read_store()
        return await BookieRegistry(store).read_cookie(self.address) is not None

    async def list_ledgers(self, among: set[int]) -> tuple[set[int], int]:
        store = await self._read_store()
        found: set[int] = set()
        count = 0
        walk = self._ledgers(store).ledger_ids(reads_per_s=self.reads_per_s, missing_ok=False)
        try:
            async for ledger_id in walk:
                count += 1
                if ledger_id in among:
                    found.add(ledger_id)
        except NoNodeError:
            raise GcSkipped(
                f"the metadata store has no {LEDGERS_PATH} node: a wiped or re-created "
                f"store, not a store without ledgers"
            ) from None
        return found, count

    async def ledger_exists(self, ledger_id: int) -> bool:
        store = await self._read_store()
        try:
            await self._ledgers(store).read(ledger_id)
        except NoSuchLedgerError:
            return False
        return True


async def collect_once(bookie: Collectable, metadata: GcMetadata) -> int:
    """One round; returns how many ledgers the bookie dropped. GcSkipped when the round
    proves nothing; BKError or OSError when the store failed (nothing dropped either)."""
    snapshot = set(bookie.ledger_ids())
    if not snapshot:
        return 0
    await metadata.sync()  # R18: what the store holds now, not what a lagging server has
    await _check_cookie(metadata)
    listed, listed_count = await metadata.list_ledgers(snapshot)
    if not listed_count:
        raise GcSkipped(
            f"the metadata store lists no ledgers while this bookie holds {len(snapshot)} "
            f"ledgers: an empty listing proves nothing (a store being restored, or one that "
            f"lost its data); nothing deleted, the next round looks again"
        )
    candidates = sorted(snapshot - listed)
    if not candidates:
        return 0
    gone: set[int] = set()
    for start in range(0, len(candidates), _READS_IN_FLIGHT):
        chunk = candidates[start : start + _READS_IN_FLIGHT]
        await metadata.sync()  # R18: each batch of reads that can lead to a drop
        exists = await asyncio.gather(*(metadata.ledger_exists(lid) for lid in chunk))
        gone.update(lid for lid, found in zip(chunk, exists, strict=True) if not found)
    if not gone:
        return 0
    await _check_cookie(metadata)
    try:
        dropped = bookie.garbage_collect((), gone)
    except Exception as exc:
        bookie.halt("garbage collection", exc)
        return 0
    if dropped:
        log.info("garbage collection dropped %d deleted ledgers", dropped)
    return dropped


async def _check_cookie(metadata: GcMetadata) -> None:
    if not await metadata.cookie_exists():
        raise GcSkipped(
            "the metadata store has no cookie for this bookie: a wiped or re-created "
            "store, or the wrong one; no ledger's absence there proves it was deleted"
        )


async def gc_loop(bookie: Collectable, metadata: GcMetadata, interval_ms: int) -> None:
    """Run :func:`collect_once` every ``interval_ms`` until cancelled."""
    interval_s = max(interval_ms, 1) / 1000
    while True:
        await asyncio.sleep(interval_s)
        try:
            await collect_once(bookie, metadata)
        except asyncio.CancelledError:
            raise
        except GcSkipped as exc:
            log.error("garbage collection skipped, nothing deleted: %s", exc)
        except (BKError, OSError) as exc:
            log.warning("garbage collection skipped this round: %s", exc)
        except Exception:
            # The metadata driver failed in a way it does not name: unknown, so nothing
            # was dropped; the next round tries again.
            log.exception("garbage collection failed this round")
