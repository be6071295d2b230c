"""Leader election on the metadata store: ephemeral sequential nodes, lowest wins.

Each contender creates an ephemeral sequential node under ``/election/<group>``;
the contender whose node has the lowest sequence number leads. Every other one
watches only the node just before its own (no herd effect when the leader goes)
and looks again when that node is deleted. This is the algorithm of kazoo's
``Election``/``Lock`` recipes and of Curator's ``LeaderSelector``; it is written
against :class:`~quorumlog.meta.store.MetadataStore` so that it runs the same way
on ZooKeeper and on the embedded SQLite store (whose ephemeral nodes go when their
session's heartbeats stop).

Sessions decide everything:

- ``SUSPENDED``: this process cannot tell whether its node still exists, so a
  leader stops being leader at once (its ``on_loss`` runs). ``CONNECTED`` again
  means the session survived: the contender looks at the nodes again, and leads
  again if its node is still the lowest.
- ``LOST``: the node is gone. The contender stops leading, opens a new session and
  queues again at the end (as Curator's ``autoRequeue``).

An election only says who *should* lead. Between a leader freezing and noticing
it lost, another contender may already lead: the log's fencing (R7, R11), not the
election, is what keeps the stale leader's writes out.

Node names carry a random token (``c_<token>_<sequence>``) so that a contender
whose create timed out can recognise its own node instead of leaving an orphan
that would lead forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING

from quorumlog.errors import BKError, InvalidArgumentError, MetadataError, NoNodeError
from quorumlog.meta.store import MetadataStore, SessionState, open_store

if TYPE_CHECKING:
    from quorumlog.client.bookkeeper import BookKeeper
    from quorumlog.meta.store import Watch, WatchEvent

log = logging.getLogger(__name__)

ELECTION_PATH = "/election"
StoreFactory = Callable[[], Awaitable[MetadataStore]]
Callback = Callable[[], None]


def _sequence_of(name: str) -> int:
    try:
        return int(name[-10:])
    except ValueError:
        return -1  # not a contender node: sorts first, and is never ours


def check_group_name(group: str) -> str:
    if not group or "/" in group or group in (".", "..") or "\x00" in group:
        raise InvalidArgumentError(f"bad election group {group!r}: must be one path component")
    return group


class LeaderElection:
    """Join the election of ``group`` and follow who leads.

    ``source`` is an asyncio :class:`BookKeeper` client or a metadata URI (the
    election opens a session of its own there, with ``session_timeout_ms``: the time
    a frozen or cut-off leader keeps its place), or a coroutine function returning a
    new store (for tests). ``on_gain`` and ``on_loss`` are called on the event loop.

    Example::

        election = LeaderElection(bk, "dice", on_gain=..., on_loss=...)
        await election.start()
        if await election.wait_for_leadership(timeout_s=10):
            ...   # lead, while election.is_leader
        await election.close()    # gives leadership up
    """

    def __init__(
        self,
        source: BookKeeper | str | StoreFactory,
        group: str,
        *,
        identifier: str | None = None,
        session_timeout_ms: int = 2_000,
        on_gain: Callback | None = None,
        on_loss: Callback | None = None,
    ) -> None:
        self.group = check_group_name(group)
        self.path = f"{ELECTION_PATH}/{group}"
        self.identifier = identifier or f"{socket.gethostname()}:{os.getpid()}"
        self.session_timeout_ms = session_timeout_ms
        self.on_gain = on_gain
        self.on_loss = on_loss
        self._factory = self._store_factory(source)
        self._store: MetadataStore | None = None
        self._node: str | None = None  # our node's name (not path)
        self._token = ""
        self._leader = False
        self._leader_event = asyncio.Event()
        self._wake = asyncio.Event()
        self._watch: Watch | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.terms = 0  # how many times this contender became leader

    def _store_factory(self, source: BookKeeper | str | StoreFactory) -> StoreFactory:
        if isinstance(source, str):
            uri = source
        elif callable(source):
            return source
        else:
            uri = source.metadata_uri

        async def open_own() -> MetadataStore:
            return await open_store(uri, session_timeout_ms=self.session_timeout_ms)

        return open_own

    # ------------------------------------------------------------ public

    @property
    def is_leader(self) -> bool:
        """Whether this contender leads now (False from the moment its session is
        suspended or lost)."""
        return self._leader

    @property
    def node(self) -> str | None:
        """This contender's node name in the election (None while it has none)."""
        return self._node

    async def start(self) -> None:
        """Join the election (opens the session and creates the node) and return."""
        if self._task is not None:
            return
        await self._join()
        await self._evaluate()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def wait_for_leadership(self, timeout_s: float | None = None) -> bool:
        """Wait until this contender leads; False if ``timeout_s`` passed first."""
        if self._leader:
            return True
        try:
            await asyncio.wait_for(self._leader_event.wait(), timeout_s)
        except TimeoutError:
            return self._leader
        return self._leader

    async def contenders(self) -> list[tuple[str, str]]:
        """``(node name, identifier)`` of every contender, the leader first."""
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
        """Give leadership up and leave the election (the node is deleted)."""
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

    async def __aenter__(self) -> LeaderElection:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

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

    def _set_leader(self, leading: bool) -> None:
        if leading == self._leader:
            return
        self._leader = leading
        if leading:
            self.terms += 1
            self._leader_event.set()
            log.info("election %s: %s leads (%s)", self.group, self.identifier, self._node)
            callback = self.on_gain
        else:
            self._leader_event.clear()
            log.info("election %s: %s no longer leads", self.group, self.identifier)
            callback = self.on_loss
        if callback is not None:
            try:
                callback()
            except Exception:
                log.exception("election %s: callback failed", self.group)

    def __repr__(self) -> str:
        role = "leader" if self._leader else "contender"
        return f"<LeaderElection {self.group} {self.identifier} {role} node={self._node}>"
