"""Where ledgers live in the metadata store, and the operations on them.

Layout (see docs/METADATA.md and :mod:`quorumlog.meta.layout`)::

    /ledgers/LAYOUT                        which layout new ledgers go to (JSON)
    /ledgers/000/000/000/000/000/000/L001  ledger 1 in the hierarchical layout (default)
    /ledgers/<ledger id>                   a ledger in the flat layout (older clusters)
    next_id("ledgers")                     ledger ids, unique across every client, from 1

Every change is a compare-and-set on the node version (R5, R6, R7 rely on it), and
every read-modify-write goes through :meth:`LedgerManager.update`, the one conflict
policy: on a version conflict, read again and decide again.

A cluster moving from the flat to the hierarchical layout holds ledgers in both places
(``quorumlog shell migratelayout`` moves each with one atomic multi-operation: create
the hierarchical node, delete the flat one at the version read). Ledgers only ever move
that way, so a lookup tries the hierarchical place, then the flat one, then the
hierarchical one again: a ledger that moved between the first two reads is found by the
third. The version a caller gets says where it was read: a flat node's version is
offset by :data:`FLAT_VERSION_BASE`, so a compare-and-set against a copy read before a
move never matches the moved node's version (which starts again at 0): it fails with
MetadataVersionError and the caller reads again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
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
from quorumlog.meta.layout import (
    DEFAULT_LAYOUT,
    LAYOUT_PATH,
    LEDGERS_PATH,
    Layout,
    ReadPacer,
    check_ledger_id,
    flat_ledger_id,
    flat_path,
)
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.meta.paths import parent_of
from quorumlog.meta.store import CreateOp, MetadataStore, Versioned, Watch, WatchEvent

log = logging.getLogger(__name__)

__all__ = [
    "FLAT_VERSION_BASE",
    "LEDGERS_PATH",
    "LEDGER_ID_COUNTER",
    "LedgerManager",
]

LEDGER_ID_COUNTER = "ledgers"
# Versions of flat nodes are reported offset by this much (a store's versions are
# 32-bit): never equal to a version of the same ledger's hierarchical node.
FLAT_VERSION_BASE = 1 << 32

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


class LedgerManager:
    """Ledger metadata in a :class:`MetadataStore`.

    Example::

        ledgers = LedgerManager(store)
        ledger_id = await ledgers.new_ledger_id()
        version = await ledgers.create(new_ledger_metadata(ledger_id, ensemble, 2, 2, ...))
        metadata, version = await ledgers.read(ledger_id)
        version = await ledgers.write(closed_metadata, version)   # CAS
        async for ledger_id in ledgers.ledger_ids(reads_per_s=1000):
            ...

    ``new_layout`` is the layout a store without ledgers gets with its first ledger
    (tests pass a small ``level_digits`` to see levels fill without 1,000 ledgers).
    """

    def __init__(self, store: MetadataStore, *, new_layout: Layout = DEFAULT_LAYOUT) -> None:
        self.store = store
        self.new_layout = new_layout
        self._layout: Layout | None = None  # kept once hierarchical: it never goes back
        # A leaf's parent being created, shared by every create waiting for it.
        self._parents_in_flight: dict[str, asyncio.Future[None]] = {}

    async def new_ledger_id(self) -> int:
        """A ledger id no client ever got before (starts at 1)."""
        return await self.store.next_id(LEDGER_ID_COUNTER)

    async def reserve_ledger_ids(self, count: int) -> int:
        """Reserve ``count`` consecutive ledger ids no client will get from
        :meth:`new_ledger_id`; returns the first of them."""
        return await self.store.next_id(LEDGER_ID_COUNTER, count) - count + 1

    # ------------------------------------------------------------------ layout

    async def layout(self) -> Layout | None:
        """The cluster's layout: its ``/ledgers/LAYOUT`` marker; an unmarked flat layout
        when ``/ledgers`` exists without one (a cluster from before layouts); None when
        there is no ``/ledgers`` (no ledger was ever created)."""
        if self._layout is not None and self._layout.is_hierarchical:
            return self._layout
        layout = await self._read_marker()
        if layout is None and self._layout is not None:
            return self._layout  # flat, /ledgers seen: only a marker can change that
        if layout is None:
            if await self.store.exists(LEDGERS_PATH) is None:
                return None
            # /ledgers and the marker of a new cluster are created together: a marker
            # still missing now is a flat cluster's.
            layout = await self._read_marker() or Layout.flat(marked=False)
        self._layout = layout
        return layout

    async def _read_marker(self) -> Layout | None:
        try:
            found = await self.store.get(LAYOUT_PATH)
        except NoNodeError:
            return None
        return Layout.from_bytes(found.data)

    async def _layout_for_create(self) -> Layout:
        layout = await self.layout()
        if layout is None:
            marker = self.new_layout.born_with_ledgers_path().to_bytes()
            # NodeExistsError: another client made the cluster's first ledger.
            with contextlib.suppress(NodeExistsError):
                await self.store.multi([CreateOp(LEDGERS_PATH), CreateOp(LAYOUT_PATH, marker)])
            layout = await self.layout()
            if layout is None:
                raise MetadataError(f"{LEDGERS_PATH} vanished while it was being created")
        return layout

    async def _hierarchical(self) -> Layout | None:
        layout = await self.layout()
        return layout if layout is not None and layout.is_hierarchical else None

    async def path_of(self, ledger_id: int) -> str | None:
        """Where the ledger's metadata is now (None: nowhere)."""
        found = await self._find(ledger_id)
        return None if found is None else found[0]

    async def _get(self, path: str) -> Versioned | None:
        try:
            return await self.store.get(path)
        except NoNodeError:
            return None

    async def _find(self, ledger_id: int) -> tuple[str, Versioned, int] | None:
        """(path, node, version as reported) of a ledger, wherever it is, or None.

        Moves go from flat to hierarchical only: hierarchical, flat, hierarchical again
        finds a ledger that moved between the first two reads."""
        check_ledger_id(ledger_id)
        known = self._layout if self._layout is not None and self._layout.is_hierarchical else None
        if known is not None:
            path = known.hierarchical_path(ledger_id)
            found = await self._get(path)
            if found is not None:
                return path, found, found.version
        flat = flat_path(ledger_id)
        found = await self._get(flat)
        if found is not None:
            return flat, found, found.version + FLAT_VERSION_BASE
        hierarchical = await self._hierarchical()
        if hierarchical is not None:
            path = hierarchical.hierarchical_path(ledger_id)
            found = await self._get(path)
            if found is not None:
                return path, found, found.version
        return None

    # ------------------------------------------------------------------ one ledger

    async def create(self, metadata: LedgerMetadata) -> int:
        """Store the metadata of a new ledger; returns its version (0 in the
        hierarchical layout).

        NodeExistsError if the ledger already exists.
        """
        ledger_id = check_ledger_id(metadata.ledger_id)
        layout = await self._layout_for_create()
        path = layout.path(ledger_id)
        # A ledger created by an explicit id may already be flat, unless none ever was.
        other = flat_path(ledger_id) if layout.is_hierarchical and layout.flat_ledgers else None
        if other is not None and await self.store.exists(other) is not None:
            raise NodeExistsError(f"ledger {ledger_id} already exists ({other})")
        try:
            if layout.is_hierarchical:
                await self._create_in_leaf(path, metadata.to_bytes())
            else:
                await self.store.create(path, metadata.to_bytes())
        except NodeExistsError:
            raise NodeExistsError(f"ledger {ledger_id} already exists ({path})") from None
        return 0 if layout.is_hierarchical else FLAT_VERSION_BASE

    async def _create_in_leaf(self, path: str, data: bytes) -> None:
        """Create a ledger's node; its leaf's parent, when missing, once for all.

        Ids are handed out in order, so the creates in flight land in the same new leaf
        together: each making the parents itself (as ZooKeeper's ``makepath`` does) costs
        a failed create and a path's worth of creates per ledger in flight, in one burst.
        Here one create makes them, the others wait for it, then each creates its node."""
        try:
            await self.store.create(path, data, make_parents=False)
            return
        except NoNodeError:
            pass
        parent = parent_of(path)
        making = self._parents_in_flight.get(parent)
        if making is None:
            making = asyncio.ensure_future(self._make_parents(parent))
            self._parents_in_flight[parent] = making
            making.add_done_callback(lambda _: self._parents_in_flight.pop(parent, None))
        await asyncio.shield(making)
        await self.store.create(path, data)  # parents again: a deletion may race it

    async def _make_parents(self, parent: str) -> None:
        with contextlib.suppress(NodeExistsError):
            await self.store.create(parent)

    async def read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        """The metadata of a ledger and its version; NoSuchLedgerError if absent."""
        found = await self._find(ledger_id)
        if found is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        _, node, version = found
        return _decode(ledger_id, node.data), version

    async def _where(self, ledger_id: int, version: int) -> tuple[str, int]:
        """The path a compare-and-set at ``version`` goes to, and the store's version."""
        if version == -1:
            found = await self._find(ledger_id)
            if found is None:
                raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
            return found[0], -1
        if version >= FLAT_VERSION_BASE:
            return flat_path(ledger_id), version - FLAT_VERSION_BASE
        hierarchical = await self._hierarchical()
        if hierarchical is None:
            return flat_path(ledger_id), -2  # no such version there: a conflict or absence
        return hierarchical.hierarchical_path(ledger_id), version

    async def _missing(self, ledger_id: int, version: int) -> BKError:
        """The error of a compare-and-set whose node is gone: the ledger moved (its copy
        is stale) or was deleted."""
        if await self._find(ledger_id) is not None:
            return MetadataVersionError(
                f"ledger {ledger_id}: metadata moved or changed since version {version}"
            )
        return NoSuchLedgerError(f"ledger {ledger_id} does not exist")

    async def write(self, metadata: LedgerMetadata, version: int) -> int:
        """Compare-and-set the metadata; returns the new version.

        MetadataVersionError if someone else changed (or moved) it since ``version``;
        NoSuchLedgerError if the ledger was deleted.
        """
        ledger_id = metadata.ledger_id
        path, stored = await self._where(ledger_id, version)
        if stored == -2:
            raise await self._missing(ledger_id, version)
        try:
            new_version = await self.store.set(path, metadata.to_bytes(), stored)
        except NoNodeError:
            raise await self._missing(ledger_id, version) from None
        except MetadataVersionError:
            raise MetadataVersionError(
                f"ledger {ledger_id}: metadata changed since version {version}"
            ) from None
        return new_version + (FLAT_VERSION_BASE if path == flat_path(ledger_id) else 0)

    async def delete(self, ledger_id: int, version: int = -1) -> None:
        """Delete a ledger's metadata; NoSuchLedgerError if absent."""
        path, stored = await self._where(ledger_id, version)
        if stored == -2:
            raise await self._missing(ledger_id, version)
        try:
            await self.store.delete(path, stored)
        except NoNodeError:
            if version == -1:  # moved between the lookup and the delete: once more
                path, _ = await self._where(ledger_id, -1)
                try:
                    await self.store.delete(path, -1)
                except NoNodeError:
                    raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
                return
            raise await self._missing(ledger_id, version) from None
        except MetadataVersionError:
            raise MetadataVersionError(
                f"ledger {ledger_id}: metadata changed since version {version}"
            ) from None

    # ------------------------------------------------------------------ listing

    async def ledger_ids(
        self,
        *,
        reads_per_s: float | None = None,
        missing_ok: bool = True,
        pacer: ReadPacer | None = None,
    ) -> AsyncIterator[int]:
        """Every ledger id, in increasing order, walking the layout level by level.

        At most one listing per level is held at a time (1,000 names by default),
        never the whole cluster's, except the flat ledgers of a flat cluster (that
        layout has but one level). Listings are spaced to ``reads_per_s`` (None: no
        limit). A ledger created or deleted during the walk may or may not be listed;
        one that moves from the flat to the hierarchical layout meanwhile is listed
        once. Without ``/ledgers`` there are no ledgers, or NoNodeError when
        ``missing_ok`` is false (a wiped store is not an empty one, R15). A ``pacer``
        given spaces these listings with the caller's other reads, in place of
        ``reads_per_s``.
        """
        pacer = pacer or ReadPacer(reads_per_s)
        await pacer.wait()
        try:
            names = await self.store.children(LEDGERS_PATH)
        except NoNodeError:
            if missing_ok:
                return
            raise
        pacer.listed(len(names))
        flat_ids = sorted(i for i in map(flat_ledger_id, names) if i is not None)
        layout = await self._hierarchical() if len(flat_ids) < len(names) else None
        tops = [] if layout is None else [n for n in names if layout.is_level_name(n, 0)]
        del names
        position = 0
        if layout is not None:
            async for ledger_id in self._walk(layout, LEDGERS_PATH, tops, 0, "", pacer):
                while position < len(flat_ids) and flat_ids[position] < ledger_id:
                    yield flat_ids[position]
                    position += 1
                if position < len(flat_ids) and flat_ids[position] == ledger_id:
                    position += 1  # moved during the walk: listed once
                yield ledger_id
        for ledger_id in flat_ids[position:]:
            yield ledger_id

    async def _walk(
        self, layout: Layout, path: str, names: list[str], depth: int, digits: str, pacer: ReadPacer
    ) -> AsyncIterator[int]:
        last = layout.levels - 1
        for name in names:
            if depth == last:
                leaf = layout.leaf_digits(name)
                if leaf is not None:
                    yield int(digits + leaf)
                continue
            if not layout.is_level_name(name, depth):
                continue
            below = f"{path}/{name}"
            await pacer.wait()
            try:
                children = await self.store.children(below)
            except NoNodeError:
                continue  # removed meanwhile: nothing below it
            pacer.listed(len(children))
            async for ledger_id in self._walk(
                layout, below, children, depth + 1, digits + name, pacer
            ):
                yield ledger_id

    async def ledgers(
        self, *, reads_per_s: float | None = None, pacer: ReadPacer | None = None
    ) -> AsyncIterator[tuple[int, LedgerMetadata, int]]:
        """(id, metadata, version) of every ledger, in id order, as :meth:`ledger_ids`
        walks them; each read (and listing) spaced to ``reads_per_s``, or, with a
        ``pacer``, listings and reads together by it. Ledgers deleted during the walk
        are skipped."""
        listings = pacer
        pacer = pacer or ReadPacer(reads_per_s)
        async for ledger_id in self.ledger_ids(reads_per_s=reads_per_s, pacer=listings):
            await pacer.wait()
            try:
                metadata, version = await self.read(ledger_id)
            except NoSuchLedgerError:
                continue
            yield ledger_id, metadata, version

    async def list_ledger_ids(self) -> list[int]:
        """Every ledger id, in increasing order, in one list (small clusters, tests;
        scans of a whole cluster walk :meth:`ledger_ids` instead)."""
        return [ledger_id async for ledger_id in self.ledger_ids()]

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
    """Turns store events into re-reads of the metadata, one read at a time.

    It watches the ledger's flat node and, once the layout is known to be
    hierarchical, its hierarchical node too: a ledger moved by a migration is
    followed to its new place (the move deletes the flat node, an event)."""

    def __init__(self, manager: LedgerManager, ledger_id: int, callback: LedgerCallback) -> None:
        self.manager = manager
        self.ledger_id = ledger_id
        self.callback = callback
        self.active = True
        self.dirty = False
        self.reader: asyncio.Task[None] | None = None
        self.last_version: int | None = None  # last version reported; -1 after deletion
        self.store_watches = [manager.store.watch(flat_path(ledger_id), self._on_event)]
        self.hierarchical_watched: set[str] = set()
        # Before the layout is read, the new clusters' one is the likely one: watched at
        # once, so a change made right after this call is seen (a cluster with another
        # level width gets its watch after the first read, which reads once more).
        layout = manager._layout
        self._watch_hierarchical(
            layout if layout is not None and layout.is_hierarchical else manager.new_layout
        )

    def _watch_hierarchical(self, layout: Layout) -> bool:
        """Watch the ledger's node in ``layout``; False when it is watched already."""
        if not layout.is_hierarchical:
            return False
        path = layout.hierarchical_path(self.ledger_id)
        if path in self.hierarchical_watched:
            return False
        self.store_watches.append(self.manager.store.watch(path, self._on_event))
        self.hierarchical_watched.add(path)
        return True

    def cancel(self) -> None:
        self.active = False
        for store_watch in self.store_watches:
            store_watch.cancel()
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
            if not self.active:
                return
            layout = self.manager._layout
            if layout is not None and self._watch_hierarchical(layout):
                # Watching the ledger's place only now: read once more, so a change made
                # there before this watch existed is seen.
                self.dirty = True
            if version == self.last_version:
                continue
            self.last_version = version
            try:
                self.callback(metadata)
            except Exception:
                log.exception("ledger %d watch callback failed", self.ledger_id)
