"""An in-process metadata store with ZooKeeper's semantics, for tests and the simulator.

Several :class:`MemoryStore` sessions can share one :class:`MemoryTree`, which
is how the simulator gives each simulated client its own session over the
same metadata. Watches fire through ``loop.call_soon``, so they are ordered
and deterministic under the simulator's virtual-time loop.

It keeps the metadata contract the real drivers keep (tests/integration/
test_meta_contract.py runs it as a third driver), and can misbehave the way a
real store does, when given :class:`MetadataFaults` (``store.faults``):

- an operation fails before it reaches the store (MetadataError, nothing changed);
- a write is applied but its reply is lost (MetadataError after the change: the
  outcome is unknown to the caller, R13) -- ZooKeeper's connection loss or
  operation timeout;
- replies are slow (the change is visible to others before the caller hears);
- a partition from the store: every operation fails after a timeout, unapplied;
- stale reads (:class:`StaleReads`, ``store.stale``): the session's server lags, as a
  ZooKeeper follower may, and its reads show the tree as it was when the server last
  caught up, until ``sync()`` or a write of the session's own whose answer it got (a
  write whose reply was lost may be missing from its next reads: a client that lost
  its connection may reconnect to a server that has not applied it yet, which
  ZooKeeper allows, since the client never saw it); its watch events may
  come late too (``watch_delay_ms``), always in order and before the session reads
  the change they report, as ZooKeeper promises.

Without stale reads every session reads the one tree, which is linearizable already:
``sync()`` then changes nothing.

:meth:`MemoryStore.expire` ends the session as a server would after missed
heartbeats: its ephemeral nodes go and its listeners hear LOST. A lost session
refuses ephemeral nodes and operations on the ephemerals it had; other
operations go on (a driver's next request runs on a new connection).
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from quorumlog.errors import (
    MetadataError,
    MetadataVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
)
from quorumlog.meta.paths import check_counter_name, check_id_count, check_path
from quorumlog.meta.store import (
    CheckOp,
    CreateOp,
    DeleteOp,
    EventType,
    MetadataStore,
    Op,
    SessionCallback,
    SessionState,
    SetOp,
    Versioned,
    Watch,
    WatchCallback,
    WatchEvent,
)

_T = TypeVar("_T")

__all__ = ["MemoryStore", "MemoryStoreFactory", "MemoryTree", "MetadataFaults", "StaleReads"]


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
    changes: int = 0  # every change of a node counts one (stale views compare it)


@dataclass
class MetadataFaults:
    """How one session misbehaves; every choice comes from ``rng`` (the seed)."""

    rng: random.Random
    fail_probability: float = 0.0  # an operation fails unapplied
    unknown_probability: float = 0.0  # a write is applied and its reply lost
    slow_probability: float = 0.0  # a reply comes late ...
    slow_ms_max: float = 50.0  # ... by up to this much
    partitioned: bool = False  # every operation fails unapplied after timeout_ms
    timeout_ms: float = 200.0
    # What happened, for the trace and the checkers.
    failed: int = 0
    unknown: list[str] = field(default_factory=list)  # "op path" of writes applied, reply lost
    on_event: Callable[[str], None] | None = None

    def _note(self, what: str) -> None:
        if self.on_event is not None:
            self.on_event(what)


@dataclass
class StaleReads:
    """A session whose server lags the others (a ZooKeeper follower behind the quorum):
    its reads see the tree as it was when that server last caught up. It catches up at
    ``sync()``, at a write of the session's own that is answered (a server applies every
    write before it, in order, before it answers; a write whose reply is lost leaves the
    view as it was), at a watch event it delivers, at a read of a view older than
    ``max_lag_s``, and, at each read, with ``catch_up_probability``: drawn from ``rng``,
    a generator of its own.

    With ``watch_delay_ms``, the server is late with watch events too: the first event
    after it last caught up comes up to that many milliseconds late, and the server
    then catches up and sends every event held so far, in order. Whenever it catches
    up (a read, a sync, a write), it sends the events it held before it answers, so
    that the session sees an event before it can read the change (ZooKeeper's order).
    """

    rng: random.Random
    catch_up_probability: float = 0.2
    watch_delay_ms: float = 0.0
    # A server at most this far behind: a read on a view older than this catches up
    # first (None: no bound, a server that may lag for as long as chance says).
    max_lag_s: float | None = None
    stale_reads: int = 0  # reads answered from a view older than the tree
    late_events: int = 0  # watch events held back by the lagging server


class _MemoryWatch(Watch):
    def __init__(
        self,
        tree: MemoryTree,
        path: str,
        callback: WatchCallback,
        children: bool,
        loop: asyncio.AbstractEventLoop,
        session: MemoryStore,
    ) -> None:
        self.tree = tree
        self.path = path
        self.callback = callback
        self.children = children
        self.loop = loop
        self.session = session  # whose server delivers the events
        self.active = True

    def cancel(self) -> None:
        self.active = False
        if self in self.tree.watches:
            self.tree.watches.remove(self)


def _parent(path: str) -> str:
    head = path.rsplit("/", 1)[0]
    return head or "/"


class MemoryStore(MetadataStore):
    """One session on a :class:`MemoryTree`."""

    def __init__(
        self,
        tree: MemoryTree | None = None,
        uri: str = "memory://",
        faults: MetadataFaults | None = None,
    ) -> None:
        self.tree = tree if tree is not None else MemoryTree()
        self.uri = uri
        self.faults = faults
        self.session_id = next(self.tree.session_ids)
        self._state = SessionState.CONNECTED
        self._listeners: list[SessionCallback] = []
        self._own_ephemerals: set[str] = set()
        self._loop = asyncio.get_running_loop()
        self.stale: StaleReads | None = None
        self._view: dict[str, _Node] | None = None  # what a lagging server shows
        self._view_at = 0  # the tree's change count when the view was taken
        self._view_time = 0.0  # and the loop's time then
        # Watch events a lagging server holds back (StaleReads.watch_delay_ms), in order.
        self._held_events: list[tuple[_MemoryWatch, WatchEvent]] = []
        self._held_timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ faults

    async def _gate(self, op: str, path: str) -> None:
        """Before an operation reaches the store: a partition, or a plain failure."""
        faults = self.faults
        if faults is None:
            return
        if faults.partitioned:
            await asyncio.sleep(faults.timeout_ms / 1000)
            faults.failed += 1
            raise MetadataError(f"metadata store unreachable: {op} {path} timed out")
        if faults.fail_probability and faults.rng.random() < faults.fail_probability:
            faults.failed += 1
            faults._note(f"{op} {path} failed (not applied)")
            raise MetadataError(f"metadata store connection lost: {op} {path} not sent")

    async def _reply(self, op: str, path: str, write: bool) -> None:
        """After an operation was applied: a slow reply, or a lost one."""
        faults = self.faults
        if faults is None:
            return
        rng = faults.rng
        if faults.slow_probability and rng.random() < faults.slow_probability:
            await asyncio.sleep(rng.uniform(0, faults.slow_ms_max) / 1000)
        if faults.partitioned or (
            write and faults.unknown_probability and rng.random() < faults.unknown_probability
        ):
            faults.unknown.append(f"{op} {path}")
            faults._note(f"{op} {path} APPLIED, reply lost")
            raise MetadataError(
                f"metadata store connection lost: the outcome of {op} {path} is unknown"
            )

    # ------------------------------------------------------------ stale reads

    def _read_nodes(self) -> dict[str, _Node]:
        """The nodes a read of this session sees: the tree, or a lagging server's view."""
        stale = self.stale
        if stale is None:
            return self.tree.nodes
        view = self._view
        if (
            view is None
            or stale.rng.random() < stale.catch_up_probability
            or (
                stale.max_lag_s is not None
                and self._loop.time() - self._view_time > stale.max_lag_s
            )
        ):
            return self._catch_up()
        if self._view_at != self.tree.changes:
            stale.stale_reads += 1
        return view

    def _catch_up(self) -> dict[str, _Node]:
        """This session's server applies every write so far (a copy: later writes to
        the tree do not reach the view), and sends the watch events it held first."""
        if self._held_events:
            self._send_held_events()
        self._view = {
            path: _Node(node.data, node.version, node.owner, node.sequence)
            for path, node in self.tree.nodes.items()
        }
        self._view_at = self.tree.changes
        self._view_time = self._loop.time()
        return self._view

    def _event(self, watch: _MemoryWatch, event: WatchEvent) -> None:
        """A watch of this session fired: its server sends the event now, or, lagging,
        holds it until it catches up."""
        stale = self.stale
        if stale is None or not stale.watch_delay_ms:
            watch.loop.call_soon(_deliver, watch, event)
            return
        stale.late_events += 1
        self._held_events.append((watch, event))
        if self._held_timer is None:
            delay_s = stale.rng.uniform(0, stale.watch_delay_ms) / 1000
            self._held_timer = self._loop.call_later(delay_s, self._catch_up)

    def _send_held_events(self) -> None:
        held, self._held_events = self._held_events, []
        if self._held_timer is not None:
            self._held_timer.cancel()
            self._held_timer = None
        for watch, event in held:
            if watch.active:
                watch.callback(event)

    def _caught_up(self) -> None:
        if self.stale is not None:
            self._catch_up()

    # ------------------------------------------------------------ sessions

    def _check_alive_for(self, path: str) -> None:
        if self._state is SessionState.LOST and path in self._own_ephemerals:
            raise SessionExpiredError(
                f"metadata session {self.session_id} expired: ephemeral {path} is gone"
            )

    def _fire(self, path: str, kind: EventType) -> None:
        self.tree.changes += 1
        parent = _parent(path)
        for watch in list(self.tree.watches):
            if not watch.active:
                continue
            if not watch.children and watch.path == path:
                watch.session._event(watch, WatchEvent(kind, path))
            elif watch.children and watch.path == parent and kind is not EventType.CHANGED:
                watch.session._event(watch, WatchEvent(EventType.CHILDREN, parent))

    # ------------------------------------------------------------ operations

    async def get(self, path: str) -> Versioned:
        check_path(path)
        self._check_alive_for(path)
        await self._gate("get", path)
        node = self._read_nodes().get(path)
        await self._reply("get", path, False)
        if node is None:
            raise NoNodeError(f"metadata path {path} does not exist")
        return Versioned(node.data, node.version)

    async def exists(self, path: str) -> int | None:
        check_path(path)
        await self._gate("exists", path)
        node = self._read_nodes().get(path)
        version = None if node is None else node.version
        await self._reply("exists", path, False)
        return version

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = True,
    ) -> str:
        check_path(path)
        if path == "/":
            raise NodeExistsError("metadata path / already exists")
        if ephemeral and self._state is SessionState.LOST:
            raise SessionExpiredError(
                f"metadata session {self.session_id} expired: cannot create ephemeral {path}"
            )
        return await self._write(
            "create",
            path,
            lambda: self._create(path, bytes(data), ephemeral, sequential, make_parents),
        )

    async def _write(self, op: str, path: str, apply: Callable[[], _T]) -> _T:
        """A write through the faults: its reply names what it applied (a created path)."""
        await self._gate(op, path)
        try:
            result = apply()
        except MetadataError:
            self._caught_up()  # a server applies the writes before its answer
            raise
        await self._reply(op, result if isinstance(result, str) else path, True)
        self._caught_up()
        return result

    def _create(
        self, path: str, data: bytes, ephemeral: bool, sequential: bool, make_parents: bool
    ) -> str:
        nodes = self.tree.nodes
        parent = _parent(path)
        parent_node = nodes.get(parent)
        if parent_node is None:
            if not make_parents:
                raise NoNodeError(f"metadata path {parent} (parent of {path}) does not exist")
            self._create(parent, b"", False, False, True)
            parent_node = nodes[parent]
        elif parent_node.owner is not None:
            raise MetadataError(f"metadata path {parent} is ephemeral: it cannot have children")
        if sequential:
            path = f"{path}{parent_node.sequence:010d}"
            parent_node.sequence += 1
        if path in nodes:
            raise NodeExistsError(f"metadata path {path} already exists")
        nodes[path] = _Node(data, 0, self.session_id if ephemeral else None)
        if ephemeral:
            self._own_ephemerals.add(path)
        self._fire(path, EventType.CREATED)
        return path

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        check_path(path)
        self._check_alive_for(path)
        return await self._write("set", path, lambda: self._set(path, bytes(data), version))

    def _set(self, path: str, data: bytes, version: int) -> int:
        node = self.tree.nodes.get(path)
        if node is None:
            raise NoNodeError(f"metadata path {path} does not exist")
        if version != -1 and node.version != version:
            raise MetadataVersionError(
                f"metadata path {path}: version {node.version}, expected {version}"
            )
        node.data = data
        node.version += 1
        self._fire(path, EventType.CHANGED)
        return node.version

    async def delete(self, path: str, version: int = -1) -> None:
        check_path(path)
        self._check_alive_for(path)
        await self._write("delete", path, lambda: self._delete(path, version))

    def _delete(self, path: str, version: int) -> None:
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
        self._own_ephemerals.discard(path)
        self._fire(path, EventType.DELETED)

    async def multi(self, ops: Sequence[Op]) -> None:
        ops = list(ops)
        for op in ops:
            check_path(op.path)
            if op.path == "/" and not isinstance(op, CheckOp):
                raise MetadataError("metadata path / cannot be created, set or deleted")
            self._check_alive_for(op.path)
        await self._write("multi", ops[0].path if ops else "/", lambda: self._apply_multi(ops))

    def _apply_multi(self, ops: list[Op]) -> None:
        self._check_multi(ops)
        for op in ops:  # every op checked: none of these can fail now
            if isinstance(op, CreateOp):
                self._create(op.path, bytes(op.data), False, False, True)
            elif isinstance(op, SetOp):
                self._set(op.path, bytes(op.data), op.version)
            elif isinstance(op, DeleteOp):
                self._delete(op.path, op.version)

    def _check_multi(self, ops: list[Op]) -> None:
        """Raise the error the first failing op would meet, after the ops before it."""
        nodes = self.tree.nodes
        versions: dict[str, int | None] = {}  # the ops' effects so far (None: deleted)

        def version_of(path: str) -> int | None:
            if path in versions:
                return versions[path]
            node = nodes.get(path)
            return None if node is None else node.version

        for op in ops:
            current = version_of(op.path)
            if isinstance(op, CreateOp):
                if current is not None:
                    raise NodeExistsError(f"metadata path {op.path} already exists")
                parent = _parent(op.path)
                parent_node = nodes.get(parent)
                if parent_node is not None and parent_node.owner is not None:
                    raise MetadataError(f"metadata path {parent} is ephemeral")
                versions[op.path] = 0
                continue
            if current is None:
                raise NoNodeError(f"metadata path {op.path} does not exist")
            if op.version != -1 and current != op.version:
                raise MetadataVersionError(
                    f"metadata path {op.path}: version {current}, expected {op.version}"
                )
            if isinstance(op, SetOp):
                versions[op.path] = current + 1
            elif isinstance(op, DeleteOp):
                prefix = op.path + "/"
                live = {p for p in nodes if p.startswith(prefix)}
                live |= {p for p, v in versions.items() if v is not None and p.startswith(prefix)}
                if any(version_of(p) is not None for p in live):
                    raise NotEmptyError(f"metadata path {op.path} has children")
                versions[op.path] = None

    async def children(self, path: str) -> list[str]:
        check_path(path)
        await self._gate("children", path)
        nodes = self._read_nodes()
        if path not in nodes:
            raise NoNodeError(f"metadata path {path} does not exist")
        prefix = "/" if path == "/" else path + "/"
        names = sorted(
            p[len(prefix) :]
            for p in nodes
            if p != "/" and p.startswith(prefix) and "/" not in p[len(prefix) :]
        )
        await self._reply("children", path, False)
        return names

    async def sync(self, path: str = "/") -> None:
        """ZooKeeper's sync. The tree is one dict that every session reads, linearizable
        already: this only matters to a session given :class:`StaleReads`, whose
        server then catches up.

        It takes no fault of its own (no draw from ``faults.rng``, no partition delay):
        a session that cannot reach the store fails at the read that follows, as it
        would have before, and every seeded run draws what it drew before syncs were
        made (tests/sim/test_simulation.py pins that)."""
        check_path(path)
        self._caught_up()

    async def next_id(self, counter: str, count: int = 1) -> int:
        check_counter_name(counter)
        check_id_count(counter, count)
        await self._gate("next_id", counter)
        value = self.tree.counters.get(counter, 0) + count
        self.tree.counters[counter] = value
        await self._reply("next_id", counter, True)
        return value

    def watch(self, path: str, callback: WatchCallback, *, children: bool = False) -> Watch:
        watch = _MemoryWatch(self.tree, path, callback, children, self._loop, self)
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
        watch.session._caught_up()  # its server has applied the change it reports
        watch.callback(event)


MemoryStoreFactory = Callable[[], MemoryStore]
