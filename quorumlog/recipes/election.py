"""Leader election: one leader per group among the processes that join it.

Each contender has a node under ``/election/<group>`` in a session of its own; the
node with the lowest sequence number leads, every other one waits for the node just
before its own to go (no herd effect when the leader goes). The way the nodes are
kept depends on the metadata store:

- ZooKeeper (``zk://``): kazoo's ``Lock`` recipe
  (:mod:`quorumlog.recipes.zk_election`). Holding the lock is leading; the nodes are
  kazoo's, so kazoo programs see and join the same line.
- The embedded store (``sqlite://``, or a store factory given by tests): the same
  algorithm over the store's ephemeral sequential entries and sessions
  (:mod:`quorumlog.recipes.store_election`), since there is no kazoo there.

Sessions decide everything, on both:

- ``SUSPENDED``: this process cannot tell whether its node still exists, so a
  leader stops being leader at once (its ``on_loss`` runs). ``CONNECTED`` again
  means the session survived: the contender leads again if its node is still the
  lowest.
- ``LOST``: the node is gone. The contender stops leading and queues again at the
  end with a new node in a new session (as Curator's ``autoRequeue``).

An election only says who *should* lead. Between a leader freezing and noticing
it lost, another contender may already lead: the log's fencing (R7, R11), not the
election, is what keeps the stale leader's writes out.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from quorumlog.errors import InvalidArgumentError, MetadataError
from quorumlog.meta.factory import default_metadata_uri, open_store
from quorumlog.recipes.contender import Contender
from quorumlog.recipes.store_election import StoreContender, StoreFactory

if TYPE_CHECKING:
    from quorumlog.client.bookkeeper import BookKeeper
    from quorumlog.meta.store import MetadataStore

__all__ = ["ELECTION_PATH", "Callback", "LeaderElection", "StoreFactory", "check_group_name"]

log = logging.getLogger(__name__)

ELECTION_PATH = "/election"
Callback = Callable[[], None]


def check_group_name(group: str) -> str:
    if not group or "/" in group or group in (".", "..") or "\x00" in group:
        raise InvalidArgumentError(f"bad election group {group!r}: must be one path component")
    return group


class LeaderElection:
    """Join the election of ``group`` and follow who leads.

    ``source`` is an asyncio :class:`BookKeeper` client or a metadata URI (the
    election opens a session of its own there, with ``session_timeout_ms``: the time
    a frozen or cut-off leader keeps its place), or a coroutine function returning a
    new store (for tests). On a ``zk://`` URI the election is kazoo's ``Lock`` recipe;
    otherwise it runs on the store's ephemeral entries. ``on_gain`` and ``on_loss``
    are called on the event loop.

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
        self._leader = False
        self._leader_event = asyncio.Event()
        self._closed = False
        self.terms = 0  # how many times this contender became leader
        self._contender = self._contender_for(source)

    def _contender_for(self, source: BookKeeper | str | StoreFactory) -> Contender:
        """kazoo's lock on ZooKeeper; the store's ephemeral entries everywhere else."""
        if isinstance(source, str):
            uri = source or default_metadata_uri()
        elif callable(source):
            return self._store_contender(source)
        else:
            uri = source.metadata_uri
        if uri.startswith("zk://"):
            from quorumlog.recipes.zk_election import KazooContender

            return KazooContender(
                uri,
                group=self.group,
                path=self.path,
                identifier=self.identifier,
                session_timeout_ms=self.session_timeout_ms,
                set_leader=self._set_leader,
            )

        async def open_own() -> MetadataStore:
            # A contender is a client: it never makes a store of its own (a mistyped
            # path would elect it alone in an empty one).
            return await open_store(uri, session_timeout_ms=self.session_timeout_ms, create=False)

        return self._store_contender(open_own)

    def _store_contender(self, factory: StoreFactory) -> Contender:
        return StoreContender(
            factory,
            group=self.group,
            path=self.path,
            identifier=self.identifier,
            session_timeout_ms=self.session_timeout_ms,
            set_leader=self._set_leader,
        )

    # ------------------------------------------------------------ public

    @property
    def is_leader(self) -> bool:
        """Whether this contender leads now (False from the moment its session is
        suspended or lost)."""
        return self._leader

    @property
    def node(self) -> str | None:
        """This contender's node name in the election (None while it has none)."""
        return self._contender.node

    async def start(self) -> None:
        """Join the election (opens the session and creates the node) and return."""
        if self._closed:
            raise MetadataError(f"election {self.group}: closed; a new election rejoins")
        await self._contender.start()

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
        return await self._contender.contenders()

    async def close(self) -> None:
        """Give leadership up and leave the election (the node is deleted)."""
        if self._closed:
            return
        self._closed = True
        self._set_leader(False)
        await self._contender.close()

    async def __aenter__(self) -> LeaderElection:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------ leadership

    def _set_leader(self, leading: bool) -> None:
        """Called by the contender, on the loop, whenever it knows whether it leads."""
        if leading == self._leader or (leading and self._closed):
            return
        self._leader = leading
        if leading:
            self.terms += 1
            self._leader_event.set()
            log.info("election %s: %s leads (%s)", self.group, self.identifier, self.node)
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
        return f"<LeaderElection {self.group} {self.identifier} {role} node={self.node}>"
