"""The metadata store interface: what ZooKeeper offers the rest of quorumlog.

Two drivers implement it: ``sqlite://`` (embedded, the default on one machine)
and ``zk://`` (ZooKeeper through kazoo). The same contract test suite runs
against both (``tests/integration/test_meta_contract.py``). This module knows
neither driver: :mod:`quorumlog.meta.factory` opens one from a URI.

Paths are absolute, ``/``-separated, without a trailing slash. Every node has
data (bytes) and a version that starts at 0 on create and grows by one on each
set; compare-and-set passes the version the caller read (``-1``: any).

All operations are coroutines, run on the event loop the store was opened on.
Watch callbacks are also called on that loop, never on a driver thread.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from quorumlog.errors import MetadataError


class SessionState(enum.Enum):
    CONNECTED = "CONNECTED"
    SUSPENDED = "SUSPENDED"  # connection lost, session may still be alive: stop trusting leases
    LOST = "LOST"  # session expired: ephemeral nodes are gone


class EventType(enum.Enum):
    CREATED = "CREATED"
    CHANGED = "CHANGED"
    DELETED = "DELETED"
    CHILDREN = "CHILDREN"  # the set of children of the watched path changed


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: EventType
    path: str


@dataclass(frozen=True, slots=True)
class Versioned:
    data: bytes
    version: int


class Watch(abc.ABC):
    """A persistent watch; ``cancel()`` stops it."""

    @abc.abstractmethod
    def cancel(self) -> None: ...


@dataclass(frozen=True, slots=True)
class CreateOp:
    """One operation of :meth:`MetadataStore.multi`: create ``path`` (persistent)."""

    path: str
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class SetOp:
    """One operation of :meth:`MetadataStore.multi`: compare-and-set ``path``."""

    path: str
    data: bytes
    version: int = -1


@dataclass(frozen=True, slots=True)
class DeleteOp:
    """One operation of :meth:`MetadataStore.multi`: delete ``path`` at ``version``."""

    path: str
    version: int = -1


@dataclass(frozen=True, slots=True)
class CheckOp:
    """One operation of :meth:`MetadataStore.multi`: ``path`` is at ``version``."""

    path: str
    version: int


Op = CreateOp | SetOp | DeleteOp | CheckOp

WatchCallback = Callable[[WatchEvent], None]
SessionCallback = Callable[[SessionState], None]


class MetadataStore(abc.ABC):
    """Versioned tree of nodes with CAS, ephemerals, sequential ids and watches."""

    uri: str

    @abc.abstractmethod
    async def get(self, path: str) -> Versioned:
        """Data and version of ``path``; NoNodeError if absent."""

    @abc.abstractmethod
    async def exists(self, path: str) -> int | None:
        """Version of ``path``, or None if absent."""

    @abc.abstractmethod
    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = True,
    ) -> str:
        """Create ``path`` (missing parents too unless ``make_parents`` is false).

        ``sequential`` appends a 10-digit, zero-padded, per-parent increasing
        number to the last path component. ``ephemeral`` ties the node to this
        store's session: it is deleted when the session closes or expires.
        Returns the path created. NodeExistsError if it exists.
        """

    @abc.abstractmethod
    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        """Replace the data if the version matches (``-1``: any). Returns the new version.

        MetadataVersionError if the version moved on, NoNodeError if absent.
        """

    @abc.abstractmethod
    async def delete(self, path: str, version: int = -1) -> None:
        """Delete a node without children. NoNodeError, MetadataVersionError, NotEmptyError."""

    @abc.abstractmethod
    async def children(self, path: str) -> list[str]:
        """Names (not paths) of the children of ``path``, sorted. NoNodeError if absent."""

    async def multi(self, ops: Sequence[Op]) -> None:
        """Apply ``ops`` in order, all or none (ZooKeeper's ``multi``).

        When one fails nothing is applied and its error is raised (NoNodeError,
        NodeExistsError, MetadataVersionError, NotEmptyError), naming its path. The
        missing parents of a CreateOp are created first, outside the transaction
        (empty persistent nodes, harmless if the transaction then fails). Watches fire
        after the whole transaction, as for single operations. A store that cannot do
        this raises MetadataError."""
        raise MetadataError(f"metadata store {self.uri} cannot apply operations atomically")

    @abc.abstractmethod
    async def sync(self, path: str = "/") -> None:
        """Bring this session's reads up to date: every read issued after ``sync``
        returns sees every write that completed, by any session, before ``sync`` was
        called (ZooKeeper's ``sync``: the server this session reads from catches up with
        the leader first).

        Reads are otherwise only sequentially consistent per session (a ZooKeeper
        follower may lag the quorum), so a decision that deletes, or that treats
        something as absent, calls this first (R18, with R15). ``path`` is the node
        about to be read (ZooKeeper brings the whole server up to date whatever it is;
        the node need not exist). MetadataError if the store cannot be reached: the
        caller then knows nothing new and deletes nothing."""

    @abc.abstractmethod
    async def next_id(self, counter: str, count: int = 1) -> int:
        """A number from ``counter`` never handed out before, by any client (starts at 1).

        With ``count`` > 1, reserves ``count`` consecutive numbers at once and returns
        the last of them (the first is ``result - count + 1``)."""

    @abc.abstractmethod
    def watch(self, path: str, callback: WatchCallback, *, children: bool = False) -> Watch:
        """Call ``callback`` on every change of ``path`` (data, create, delete) or, with
        ``children``, of its set of children. Persistent until cancelled. Events arrive
        within about 100 ms of the change."""

    @abc.abstractmethod
    def add_session_listener(self, callback: SessionCallback) -> None:
        """Be told when the session is suspended, lost or connected again."""

    @property
    @abc.abstractmethod
    def session_state(self) -> SessionState: ...

    @abc.abstractmethod
    async def close(self) -> None:
        """End the session (its ephemeral nodes go) and release resources."""

    async def __aenter__(self) -> MetadataStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
