"""Contending on a :class:`~quorumlog.meta.store.MetadataStore`: ephemeral sequential
nodes, lowest wins.

This is how the election runs on the embedded SQLite store (and on any store given
by a factory, such as the in-memory store of the tests). Each contender creates an
ephemeral sequential node ``/election/<group>/c_<token>_<sequence>`` in a session of
its own; the lowest sequence leads. Every other one watches only the node just
before its own (no herd effect when the leader goes) and looks again when that node
is deleted. It is the algorithm of kazoo's ``Lock`` recipe, written against the store
interface because the embedded store has no kazoo: its ephemeral nodes go when their
session's heartbeats stop.

Sessions decide everything:

- ``SUSPENDED``: this process cannot tell whether its node still exists, so a
  leader stops being leader at once. ``CONNECTED`` again means the session
  survived: the contender looks at the nodes again, and leads again if its node is
  still the lowest.
- ``LOST``: the node is gone. The contender stops leading, opens a new session and
  queues again at the end (as Curator's ``autoRequeue``).

Node names carry a random token (``c_<token>_<sequence>``) so that a contender
whose create timed out can recognise its own node instead of leaving an orphan
that would lead forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING

from quorumlog.errors import BKError, MetadataError, NoNodeError
from quorumlog.meta.store import MetadataStore, SessionState
from quorumlog.recipes.contender import Contender, SetLeader

if TYPE_CHECKING:
    from quorumlog.meta.store import Watch, WatchEvent

log = logging.getLogger(__name__)

StoreFactory = Callable[[], Awaitable[MetadataStore]]


def _sequence_of(name: str) -> int:
    try:
        return int(name[-10:])
    except ValueError:
        return -1  # not a contender node: sorts first, and is never ours


class StoreContender(Contender):
    """A contender whose sessions come from ``factory`` (one new store per session)."""

    def __init__(
        self,
        factory: StoreFactory,
        *,
        group: str,
        path: str,
        identifier: str,
        session_timeout_ms: int,
        set_leader: SetLeader,
    ) -> None:
        self.group = group
        self.path = path
        self.identifier = identifier
        self.session_timeout_ms = session_timeout_ms
        self._factory = factory
        self._set_leader = set_leader
        self._store: MetadataStore | None = None
        self._node: str | None = None  # our node's name (not path)
        self._token = ""
        self._wake = asyncio.Event()
        self._watch: Watch | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def node(self) -> str | None:
        return self._node

    async def start(self) -> None:
        if self._task is not None:
            return
        await self._join()
        await self._evaluate()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def contenders(self) -> list[tuple[str, str]]:
        store = self._require_store()
        out: list[tuple[str, str]] = []
        for name in await self._sorted_children(store):
            try:
                data = (await store.get(f"{self.path}/{name}")).data
            except NoNodeError:
                continue
            out.append((name, data.decode(errors="replace")))
        return out

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._set_leader(False)
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, BKError):
                await self._task
            self._task = None
        await self._leave()

    # ------------------------------------------------------------ the loop

    async def _run(self) -> None:
        # Re-checks on every wake-up (a watch, a session change) and at least every
        # half session timeout, so a missed event costs at most that long.
        recheck_s = max(0.05, self.session_timeout_ms / 2000)
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), recheck_s)
            self._wake.clear()
            if self._closed:
                return
            try:
                store = self._store
                if store is None or store.session_state is SessionState.LOST:
                    await self._leave()
                    await self._join()
                await self._evaluate()
            except BKError as exc:
                self._set_leader(False)
                log.warning("election %s: %s", self.group, exc.message)
                await asyncio.sleep(min(recheck_s, 0.5))

    async def _join(self) -> None:
        """Open a session and create this contender's node in it."""
        store = await self._factory()
        self._store = store
        store.add_session_listener(partial(self._on_session, store))
        self._token = uuid.uuid4().hex[:12]
        prefix = f"{self.path}/c_{self._token}_"
        data = self.identifier.encode()
        try:
            created = await store.create(prefix, data, ephemeral=True, sequential=True)
        except MetadataError as exc:
            if type(exc) is not MetadataError:
                raise
            # The outcome is unknown (connection lost): find the node if it was made.
            created = ""
            for name in await self._sorted_children(store):
                if f"_{self._token}_" in name:
                    created = f"{self.path}/{name}"
            if not created:
                raise
        self._node = created.rsplit("/", 1)[1]
        log.info("election %s: joined as %s (%s)", self.group, self._node, self.identifier)

    async def _leave(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        store, node = self._store, self._node
        self._store, self._node = None, None
        if store is None:
            return
        if node is not None and store.session_state is not SessionState.LOST:
            with contextlib.suppress(BKError):
                await store.delete(f"{self.path}/{node}")
        with contextlib.suppress(BKError):
            await store.close()

    async def _sorted_children(self, store: MetadataStore) -> list[str]:
        try:
            names = await store.children(self.path)
        except NoNodeError:
            return []
        return sorted(names, key=_sequence_of)

    async def _evaluate(self) -> None:
        """Lead if our node is the lowest, else watch the node just before ours."""
        store = self._require_store()
        if store.session_state is not SessionState.CONNECTED:
            self._set_leader(False)
            return
        names = await self._sorted_children(store)
        if self._node not in names:
            # Our node is gone while the session lives (deleted by hand?): queue again.
            self._set_leader(False)
            await self._leave()
            await self._join()
            names = await self._sorted_children(self._require_store())
            store = self._require_store()
        index = names.index(self._node) if self._node in names else -1
        if index == 0:
            if store.session_state is SessionState.CONNECTED:
                self._set_leader(True)
            return
        self._set_leader(False)
        if index < 0:
            return
        predecessor = f"{self.path}/{names[index - 1]}"
        if self._watch is not None:
            self._watch.cancel()
        self._watch = store.watch(predecessor, self._on_predecessor)
        # After watch(): a round trip makes the watch certain to be in force (ZooKeeper),
        # and tells whether the predecessor went before it was armed.
        if await store.exists(predecessor) is None:
            self._wake.set()

    def _require_store(self) -> MetadataStore:
        if self._store is None:
            raise MetadataError(f"election {self.group}: no metadata session")
        return self._store

    # ------------------------------------------------------------ events

    def _on_predecessor(self, event: WatchEvent) -> None:
        self._wake.set()

    def _on_session(self, store: MetadataStore, state: SessionState) -> None:
        if store is not self._store:
            return  # an old session of this contender
        if state is not SessionState.CONNECTED:
            self._set_leader(False)  # at once: the node may already be gone
        self._wake.set()
