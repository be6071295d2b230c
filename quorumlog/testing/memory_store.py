"""An in-process metadata store with ZooKeeper's semantics, for tests and the simulator.

Several :class:`MemoryStore` sessions can share one :class:`MemoryTree`, which
is how the simulator gives each simulated client its own session over the
same metadata. Watches fire through ``loop.call_soon``, so they are ordered
and deterministic under the simulator's virtual-time loop.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from quorumlog.errors import (
    MetadataError,
    MetadataVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
)
from quorumlog.meta.store import (
    EventType,
    MetadataStore,
    SessionCallback,
    SessionState,
    Versioned,
    Watch,
    WatchCallback,
    WatchEvent,
)


@dataclass
class _Node:
    data: bytes
    version: int = 0
    owner: int | None = None  # session id of an ephemeral node
    sequence: int = 0  # next number for sequential children


@dataclass
class MemoryTree:
    """The shared data behind one or more sessions."""

    nodes: dict[str, _Node] = field(default_factory=lambda: {"/": _Node(b"")})
    counters: dict[str, int] = field(default_factory=dict)
    watches: list[_MemoryWatch] = field(default_factory=list)
    session_ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))


class _MemoryWatch(Watch):
    def __init__(
        self,
        tree: MemoryTree,
        path: str,
        callback: WatchCallback,
        children: bool,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.tree = tree
        self.path = path
        self.callback = callback
        self.children = children
        self.loop = loop
        self.active = True

    def cancel(self) -> None:
        self.active = False
        if self in self.tree.watches:
            self.tree.watches.remove(self)


def _parent(path: str) -> str:
    head = path.rsplit("/", 1)[0]
    return head or "/"


def _check_path(path: str) -> None:
    if not path.startswith("/") or (path != "/" and path.endswith("/")) or "//" in path:
        raise MetadataError(f"bad metadata path {path!r}")


class MemoryStore(MetadataStore):
    """One session on a :class:`MemoryTree`."""

    def __init__(self, tree: MemoryTree | None = None, uri: str = "memory://") -> None:
        self.tree = tree if tree is not None else MemoryTree()
        self.uri = uri
        self.session_id = next(self.tree.session_ids)
        self._state = SessionState.CONNECTED
        self._listeners: list[SessionCallback] = []
        self._loop = asyncio.get_running_loop()

    def _alive(self) -> None:
        if self._state is SessionState.LOST:
            raise SessionExpiredError(f"metadata session {self.session_id} expired")

    def _fire(self, path: str, kind: EventType) -> None:
        parent = _parent(path)
        for watch in list(self.tree.watches):
            if not watch.active:
                continue
            if not watch.children and watch.path == path:
                watch.loop.call_soon(_deliver, watch, WatchEvent(kind, path))
            elif watch.children and watch.path == parent and kind is not EventType.CHANGED:
                watch.loop.call_soon(_deliver, watch, WatchEvent(EventType.CHILDREN, parent))

    async def get(self, path: str) -> Versioned:
        self._alive()
        node = self.tree.nodes.get(path)
        if node is None:
            raise NoNodeError(f"metadata path {path} does not exist")
        return Versioned(node.data, node.version)

    async def exists(self, path: str) -> int | None:
        self._alive()
        node = self.tree.nodes.get(path)
        return None if node is None else node.version

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = True,
    ) -> str:
        self._alive()
        _check_path(path)
        nodes = self.tree.nodes
        parent = _parent(path)
        if parent not in nodes:
            if not make_parents:
                raise NoNodeError(f"metadata path {parent} does not exist")
            await self.create(parent, b"", make_parents=True)
        if sequential:
            parent_node = nodes[parent]
            path = f"{path}{parent_node.sequence:010d}"
            parent_node.sequence += 1
        if path in nodes:
            raise NodeExistsError(f"metadata path {path} already exists")
        nodes[path] = _Node(bytes(data), 0, self.session_id if ephemeral else None)
        self._fire(path, EventType.CREATED)
        return path

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        self._alive()
        node = self.tree.nodes.get(path)
        if node is None:
            raise NoNodeError(f"metadata path {path} does not exist")
        if version != -1 and node.version != version:
            raise MetadataVersionError(
                f"metadata path {path}: version {node.version}, expected {version}"
            )
        node.data = bytes(data)
        node.version += 1
        self._fire(path, EventType.CHANGED)
        return node.version

    async def delete(self, path: str, version: int = -1) -> None:
        self._alive()
        nodes = self.tree.nodes
        node = nodes.get(path)
        if node is None:
            raise NoNodeError(f"metadata path {path} does not exist")
        if version != -1 and node.version != version:
            raise MetadataVersionError(
                f"metadata path {path}: version {node.version}, expected {version}"
            )
        prefix = path.rstrip("/") + "/"
        if any(p.startswith(prefix) for p in nodes):
            raise NotEmptyError(f"metadata path {path} has children")
        del nodes[path]
        self._fire(path, EventType.DELETED)

    async def children(self, path: str) -> list[str]:
        self._alive()
        if path not in self.tree.nodes:
            raise NoNodeError(f"metadata path {path} does not exist")
        prefix = "/" if path == "/" else path + "/"
        return sorted(
            p[len(prefix) :]
            for p in self.tree.nodes
            if p != "/" and p.startswith(prefix) and "/" not in p[len(prefix) :]
        )

    async def next_id(self, counter: str, count: int = 1) -> int:
        self._alive()
        value = self.tree.counters.get(counter, 0) + count
        self.tree.counters[counter] = value
        return value

    def watch(self, path: str, callback: WatchCallback, *, children: bool = False) -> Watch:
        watch = _MemoryWatch(self.tree, path, callback, children, self._loop)
        self.tree.watches.append(watch)
        return watch

    def add_session_listener(self, callback: SessionCallback) -> None:
        self._listeners.append(callback)

    @property
    def session_state(self) -> SessionState:
        return self._state

    def expire(self) -> None:
        """End the session as if its heartbeats had stopped (its ephemerals go)."""
        if self._state is SessionState.LOST:
            return
        self._drop_ephemerals()
        self._state = SessionState.LOST
        for listener in self._listeners:
            self._loop.call_soon(listener, SessionState.LOST)

    def _drop_ephemerals(self) -> None:
        owned = [p for p, n in self.tree.nodes.items() if n.owner == self.session_id]
        for path in owned:
            del self.tree.nodes[path]
            self._fire(path, EventType.DELETED)

    async def close(self) -> None:
        if self._state is not SessionState.LOST:
            self._drop_ephemerals()
            self._state = SessionState.LOST


def _deliver(watch: _MemoryWatch, event: WatchEvent) -> None:
    if watch.active:
        watch.callback(event)


MemoryStoreFactory = Callable[[], MemoryStore]
