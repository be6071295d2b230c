"""The ZooKeeper metadata driver, on kazoo.

``zk://host:port[,host:port...][/root][?digest_file=/path]``: the root (a chroot)
is created if missing, and every path of the store lives under it.

- Credentials: with ``digest_file`` (a file holding ``user:password``, readable by
  its owner only), the session authenticates with ZooKeeper's ``digest`` scheme and
  every node it creates carries the ACL "this user may do everything" and nothing for
  anyone else (BookKeeper's ``zkEnableSecurity``), so another ZooKeeper user can
  neither change nor read quorumlog's nodes. Every process of the cluster uses the
  same URI, hence the same user. The secret never appears in the URI, which is
  printed and logged. Nodes created before the credentials keep their open ACL.

- Operations use kazoo's ``*_async`` calls; their results are handed to the
  asyncio loop with ``rawlink`` + ``loop.call_soon_threadsafe``, and kazoo's
  exceptions become :mod:`quorumlog.errors` ones.
- Sessions are ZooKeeper sessions. kazoo's SUSPENDED / LOST / CONNECTED become
  :class:`SessionState`. LOST is final for a store: kazoo goes on with a fresh
  session (persistent operations and watches keep working), but ephemeral
  nodes belong to the session that was lost, so creating or touching one
  after that raises SessionExpiredError. Open a new store to register again.
- Watches: ZooKeeper's watches fire once and kazoo drops them when the
  connection drops. Each :class:`Watch` re-arms itself after every event and
  after every reconnection, and compares what it finds with what it knew
  (existence, creation and modification zxids, or the children list), so a
  change that happened while it was not armed still gives an event.
- ``next_id(counter)``: a counter znode ``/counters/<counter>`` whose data is the
  last id handed out, advanced with compare-and-set on its version (retried on
  conflict). Ids are 64-bit and never repeat, since every id is the result of a
  successful compare-and-set from the previous one.

All bookkeeping of watches happens on the event loop; kazoo's threads only
forward results and events to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import selectors
import stat
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kazoo import exceptions as kz  # type: ignore[import-untyped]
from kazoo.client import KazooClient  # type: ignore[import-untyped]
from kazoo.handlers.threading import (  # type: ignore[import-untyped]
    AsyncResult,
    SequentialThreadingHandler,
)
from kazoo.handlers.utils import selector_select  # type: ignore[import-untyped]
from kazoo.protocol.states import EventType as KzEventType  # type: ignore[import-untyped]
from kazoo.protocol.states import KazooState, WatchedEvent, ZnodeStat
from kazoo.retry import KazooRetry  # type: ignore[import-untyped]
from kazoo.security import ACL, make_digest_acl  # type: ignore[import-untyped]

from quorumlog.errors import (
    InvalidArgumentError,
    MetadataError,
    MetadataVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
)
from quorumlog.meta.paths import (
    ROOT,
    check_counter_name,
    check_id_count,
    check_path,
    parent_of,
)
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

log = logging.getLogger(__name__)

COUNTERS_PATH = "/counters"
NEXT_ID_MAX_ATTEMPTS = 1_000
REARM_RETRY_DELAY_S = 0.2
CONNECT_TIMEOUT_MS = 15_000


DIGEST_FILE_PARAMETER = "digest_file"


def parse_zk_uri(uri: str) -> tuple[str, str]:
    """``zk://h1:p1,h2:p2/root`` -> (``"h1:p1,h2:p2"``, ``"/root"``); root ``""`` if none.

    The query (``?digest_file=...``, see :func:`zk_credentials`) is not part of either."""
    prefix = "zk://"
    if not uri.startswith(prefix):
        raise InvalidArgumentError(f"metadata URI {uri!r}: expected zk://host:port[/root]")
    rest = uri[len(prefix) :].partition("?")[0]
    hosts, slash, root = rest.partition("/")
    if not hosts or any(not h.strip() for h in hosts.split(",")):
        raise InvalidArgumentError(f"metadata URI {uri!r}: no ZooKeeper host:port")
    root = ("/" + root).rstrip("/") if slash else ""
    if root:
        try:
            check_path(root)
        except MetadataError as exc:
            raise InvalidArgumentError(f"metadata URI {uri!r}: bad root {root!r}") from exc
    return hosts, root


class _PollSelectors:
    """The ``selectors`` module as kazoo's ``selector_select`` uses it, with
    ``PollSelector`` for the default: see :class:`PollingHandler`."""

    EVENT_READ = selectors.EVENT_READ
    EVENT_WRITE = selectors.EVENT_WRITE
    DefaultSelector = selectors.PollSelector


class PollingHandler(SequentialThreadingHandler):  # type: ignore[misc]
    """kazoo's threading handler, waiting with ``poll`` instead of a new ``epoll``.

    kazoo's connection thread waits on its socket before every request it sends and
    every reply it reads, each time through a new ``DefaultSelector``: on Linux an
    ``epoll`` descriptor created, registered and closed, four system calls around the
    wait, about half of that thread's time under load (and that thread bounds how
    many operations a second one client gets). ``poll`` needs no descriptor of its
    own: the same wait, with kazoo's own selection code and semantics, in one call.

    It also bounds a wait on the socket alone (kazoo reading a frame, or the answer to
    its connection request) to ``socket_wait_s``, a third of the session timeout. kazoo
    waits for that answer as long as the whole session timeout (divided by the number of
    servers): a server that accepts the connection and never answers, as a ZooKeeper
    3.8 server starting up may do (ZOOKEEPER-5051), would hold a client with one server
    in its connect string until the session expired. Bounded, the client gives up on
    that connection and connects again with time to spare. The wait of the connection
    loop (socket and wake-up pipe together) is kazoo's: it follows the ping schedule."""

    def __init__(self, socket_wait_s: float) -> None:
        super().__init__()
        self.socket_wait_s = socket_wait_s

    @classmethod
    def for_session(cls, session_timeout_ms: float) -> PollingHandler:
        """The handler of a client whose session times out after ``session_timeout_ms``."""
        return cls(socket_wait_s=session_timeout_ms / 1000 / 3)

    def select(
        self, rlist: list[Any], wlist: list[Any], xlist: list[Any], timeout: float | None = None
    ) -> Any:
        if len(rlist) + len(wlist) == 1 and (timeout is None or timeout > self.socket_wait_s):
            timeout = self.socket_wait_s
        return selector_select(rlist, wlist, xlist, timeout, selectors_module=_PollSelectors)


@dataclass(frozen=True, slots=True)
class ZkCredentials:
    """A ZooKeeper ``digest`` user: what a session authenticates as, and the ACL of the
    nodes it creates (everything for this user, nothing for anyone else)."""

    user: str
    password: str
    source: str  # the file they were read from, for messages

    def auth_data(self) -> list[tuple[str, str]]:
        return [("digest", f"{self.user}:{self.password}")]

    def acl(self) -> list[ACL]:
        return [make_digest_acl(self.user, self.password, all=True)]

    def __repr__(self) -> str:  # never the password
        return f"ZkCredentials(user={self.user!r}, source={self.source!r})"


def zk_credentials(uri: str) -> ZkCredentials | None:
    """The credentials a ``zk://`` URI names with ``?digest_file=PATH``, or None.

    InvalidArgumentError for another parameter, a file others may read (like ssh,
    a secret that leaked is refused rather than used), or one that is not
    ``user:password``."""
    query = uri.partition("?")[2]
    if not query:
        return None
    params = urllib.parse.parse_qs(query, keep_blank_values=True, strict_parsing=False)
    unknown = sorted(set(params) - {DIGEST_FILE_PARAMETER})
    if unknown:
        raise InvalidArgumentError(
            f"metadata URI {uri!r}: unknown parameter {unknown[0]!r} "
            f"(known: {DIGEST_FILE_PARAMETER})"
        )
    path = params[DIGEST_FILE_PARAMETER][-1]
    try:
        mode = os.stat(path).st_mode
        with open(path, encoding="utf-8") as secret:
            text = secret.read().strip()
    except OSError as exc:
        raise InvalidArgumentError(
            f"ZooKeeper credentials {path}: cannot read: {exc.strerror or exc}"
        ) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InvalidArgumentError(
            f"ZooKeeper credentials {path}: readable by others (mode {stat.S_IMODE(mode):o}); "
            "chmod 600 it"
        )
    user, colon, password = text.partition(":")
    if not colon or not user or not password or "\n" in text:
        raise InvalidArgumentError(f"ZooKeeper credentials {path}: expected one line user:password")
    return ZkCredentials(user, password, path)


class ZkStore(MetadataStore):
    """A :class:`MetadataStore` on ZooKeeper.

    Example::

        store = await ZkStore.open("zk://127.0.0.1:2181/quorumlog", session_timeout_ms=6000)
        await store.create("/ledgers/1", b"{}")
        await store.close()
    """

    def __init__(
        self,
        uri: str,
        hosts: str,
        root: str,
        session_timeout_ms: int,
        credentials: ZkCredentials | None = None,
    ) -> None:
        self.uri = uri
        self.hosts = hosts
        self.root = root
        self.session_timeout_ms = session_timeout_ms
        self.operation_timeout_ms = max(2 * session_timeout_ms, 5_000)
        self.credentials = credentials
        self._loop = asyncio.get_running_loop()
        self._client = KazooClient(
            hosts=hosts,
            handler=PollingHandler.for_session(session_timeout_ms),
            timeout=session_timeout_ms / 1000,
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0),
            command_retry=None,
            auth_data=credentials.auth_data() if credentials else None,
            default_acl=credentials.acl() if credentials else None,
        )
        self._state = SessionState.CONNECTED
        self._listeners: list[SessionCallback] = []
        self._watches: set[_ZkWatch] = set()
        self._own_ephemerals: set[str] = set()
        self._closed = False
        self._closing = False
        # Set when the connection was lost (an operation's outcome may be unknown): the
        # next read syncs first (_sync_if_connection_was_lost).
        self._sync_before_read = False

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    async def open(
        cls,
        uri: str,
        *,
        session_timeout_ms: int = 10_000,
        connect_timeout_ms: int = CONNECT_TIMEOUT_MS,
        create: bool = True,
    ) -> ZkStore:
        """Connect, create the root if missing (else, without ``create``, MetadataError),
        and start a session."""
        hosts, root = parse_zk_uri(uri)
        store = cls(uri, hosts, root, session_timeout_ms, zk_credentials(uri))
        try:
            await asyncio.to_thread(store._connect, connect_timeout_ms, create)
        except BaseException:
            await asyncio.to_thread(store._shutdown_client)
            raise
        store._client.add_listener(store._on_kazoo_state)
        return store

    def _connect(self, connect_timeout_ms: int, create: bool = True) -> None:
        root_missing = False
        try:
            self._client.start(timeout=connect_timeout_ms / 1000)
            if self.root and create:
                self._client.ensure_path(self.root)
            elif self.root:
                root_missing = self._client.exists(self.root) is None
        except kz.NoAuthError as exc:
            raise self._translate(exc, "create", self.root) from exc
        except (kz.KazooException, OSError) as exc:
            raise MetadataError(
                f"cannot reach ZooKeeper at {self.hosts} within {connect_timeout_ms} ms: "
                f"{type(exc).__name__} {exc}"
            ) from exc
        except Exception as exc:  # kazoo raises its handler's timeout type on start()
            raise MetadataError(
                f"cannot reach ZooKeeper at {self.hosts} within {connect_timeout_ms} ms: "
                f"{type(exc).__name__} {exc}"
            ) from exc
        if root_missing:
            raise MetadataError(
                f"no metadata store at {self.uri}: ZooKeeper has no node {self.root} (only "
                "`quorumlog bookie` creates it; check the URI)"
            )
        # From here on every path is relative to the root (kazoo's chroot).
        self._client.chroot = self.root

    @property
    def session_id(self) -> int:
        """The ZooKeeper session id (0 when not connected)."""
        client_id = self._client.client_id
        return int(client_id[0]) if client_id else 0

    async def close(self) -> None:
        """Close the session (ZooKeeper deletes its ephemeral nodes) and the connection."""
        if self._closed:
            return
        self._closing = True
        for watch in list(self._watches):
            watch.cancel()
        try:
            await asyncio.to_thread(self._shutdown_client)
        finally:
            self._closed = True

    def _shutdown_client(self) -> None:
        try:
            self._client.stop()
        except Exception:
            log.exception("stopping the ZooKeeper client of %s", self.uri)
        finally:
            self._client.close()

    # ------------------------------------------------------------------ plumbing

    async def _call(self, what: str, path: str, start: Callable[[], AsyncResult]) -> Any:
        """Run one kazoo async call; return its value or raise a quorumlog error."""
        if self._closed or self._closing:
            raise MetadataError(f"metadata store {self.uri} is closed")
        future: asyncio.Future[Any] = self._loop.create_future()
        try:
            result = start()
        except Exception as exc:
            raise self._translate(exc, what, path) from exc
        result.rawlink(lambda done: self._hand_over(future, done))
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel that
            # lands in the turn the future is settled (kazoo fails every pending call as
            # it reports a session lost), and a cancelled caller would go on as if not.
            async with asyncio.timeout(self.operation_timeout_ms / 1000):
                return await future
        except TimeoutError:
            self._sync_before_read = True
            raise MetadataError(
                f"ZooKeeper {what} {path} at {self.hosts}: no answer within "
                f"{self.operation_timeout_ms} ms (outcome unknown)"
            ) from None
        except kz.KazooException as exc:
            raise self._translate(exc, what, path) from exc
        except (ValueError, TypeError) as exc:
            raise MetadataError(f"ZooKeeper {what} {path}: {exc}") from exc

    def _hand_over(self, future: asyncio.Future[Any], done: AsyncResult) -> None:
        """On a kazoo thread: move the outcome of ``done`` to ``future`` on the loop."""
        if done.successful():
            outcome: tuple[bool, Any] = (True, done.value)
        else:
            outcome = (False, done.exception)
        with contextlib.suppress(RuntimeError):  # loop already closed
            self._loop.call_soon_threadsafe(_settle, future, outcome)

    def _translate(self, exc: BaseException, what: str, path: str) -> BaseException:
        if isinstance(exc, kz.NoNodeError):
            return NoNodeError(f"metadata path {path} does not exist ({what})")
        if isinstance(exc, kz.NodeExistsError):
            return NodeExistsError(f"metadata path {path} already exists")
        if isinstance(exc, kz.BadVersionError):
            return MetadataVersionError(f"metadata path {path}: version moved on ({what})")
        if isinstance(exc, kz.NotEmptyError):
            return NotEmptyError(f"metadata path {path} has children")
        if isinstance(exc, kz.SessionExpiredError):
            return SessionExpiredError(f"ZooKeeper session expired during {what} {path}")
        if isinstance(exc, kz.NoAuthError):
            who = (
                f"user {self.credentials.user!r} ({self.credentials.source})"
                if self.credentials
                else "a session without credentials (add ?digest_file= to the URI)"
            )
            return MetadataError(f"ZooKeeper {what} {path}: not allowed for {who}")
        if isinstance(exc, kz.NoChildrenForEphemeralsError):
            return MetadataError(f"metadata path {path}: the parent is ephemeral")
        if isinstance(exc, kz.ConnectionClosedError):
            return MetadataError(f"metadata store {self.uri} is closed ({what} {path})")
        if isinstance(exc, kz.ConnectionLoss | kz.OperationTimeoutError):
            self._sync_before_read = True
            return MetadataError(
                f"connection to ZooKeeper at {self.hosts} lost during {what} {path} "
                "(outcome unknown)"
            )
        if isinstance(exc, ValueError | TypeError):
            return MetadataError(f"ZooKeeper {what} {path}: {exc}")
        return MetadataError(f"ZooKeeper {what} {path}: {type(exc).__name__} {exc}")

    def _check_alive_for(self, path: str) -> None:
        if self._state is SessionState.LOST and path in self._own_ephemerals:
            raise SessionExpiredError(f"ZooKeeper session expired: ephemeral {path} is gone")

    async def _sync_if_connection_was_lost(self, path: str) -> None:
        """After a lost connection, a read may reach a server that has not yet applied a
        write whose reply was lost (a reconnection can land on another server, behind the
        leader). ZooKeeper's sync() makes the server catch up first, so the re-read that
        resolves an unknown outcome (R13) sees the write if it happened."""
        if self._sync_before_read:
            await self._call("sync", path, lambda: self._client.sync_async(path))
            self._sync_before_read = False

    # ------------------------------------------------------------------ operations

    async def get(self, path: str) -> Versioned:
        check_path(path)
        self._check_alive_for(path)
        await self._sync_if_connection_was_lost(path)
        data, stat = await self._call("get", path, lambda: self._client.get_async(path))
        return Versioned(bytes(data or b""), int(stat.version))

    async def exists(self, path: str) -> int | None:
        check_path(path)
        await self._sync_if_connection_was_lost(path)
        stat = await self._call("exists", path, lambda: self._client.exists_async(path))
        return None if stat is None else int(stat.version)

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
        if path == ROOT:
            raise NodeExistsError("metadata path / already exists")
        if ephemeral and self._state is SessionState.LOST:
            raise SessionExpiredError(f"ZooKeeper session expired: cannot create ephemeral {path}")
        try:
            created = await self._call(
                "create",
                path,
                lambda: self._client.create_async(
                    path,
                    bytes(data),
                    ephemeral=ephemeral,
                    sequence=sequential,
                    makepath=make_parents,
                ),
            )
        except NoNodeError:
            raise NoNodeError(f"metadata path {path}: its parent does not exist") from None
        if ephemeral:
            self._own_ephemerals.add(created)
        return str(created)

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        check_path(path)
        self._check_alive_for(path)
        try:
            stat = await self._call(
                "set", path, lambda: self._client.set_async(path, bytes(data), version)
            )
        except MetadataVersionError:
            raise MetadataVersionError(
                f"metadata path {path}: version is not {version} any more"
            ) from None
        return int(stat.version)

    async def delete(self, path: str, version: int = -1) -> None:
        check_path(path)
        if path == ROOT:
            raise MetadataError("metadata path / cannot be deleted")
        self._check_alive_for(path)
        try:
            await self._call("delete", path, lambda: self._client.delete_async(path, version))
        except MetadataVersionError:
            raise MetadataVersionError(
                f"metadata path {path}: version is not {version} any more"
            ) from None
        self._own_ephemerals.discard(path)

    async def multi(self, ops: Sequence[Op]) -> None:
        ops = list(ops)
        for op in ops:
            check_path(op.path)
            if op.path == ROOT and not isinstance(op, CheckOp):
                raise MetadataError("metadata path / cannot be created, set or deleted")
            self._check_alive_for(op.path)
        created = {op.path for op in ops if isinstance(op, CreateOp)}
        parents = set()
        for path in created:
            parent = parent_of(path)
            while parent in created:  # made by the transaction itself: its parent then
                parent = parent_of(parent)
            parents.add(parent)
        for parent in sorted(parents - {ROOT}):
            await self._ensure_path(parent)

        def start() -> AsyncResult:
            transaction = self._client.transaction()
            for op in ops:
                if isinstance(op, CreateOp):
                    transaction.create(op.path, bytes(op.data))
                elif isinstance(op, SetOp):
                    transaction.set_data(op.path, bytes(op.data), op.version)
                elif isinstance(op, DeleteOp):
                    transaction.delete(op.path, op.version)
                else:
                    transaction.check(op.path, op.version)
            return transaction.commit_async()

        what = ops[0].path if ops else ROOT
        results = await self._call("multi", what, start)
        for op, result in zip(ops, results or [], strict=False):
            if isinstance(result, kz.RolledBackError) or not isinstance(result, Exception):
                continue
            raise self._translate(result, "multi", op.path)
        for op in ops:
            if isinstance(op, DeleteOp):
                self._own_ephemerals.discard(op.path)

    async def _ensure_path(self, path: str) -> None:
        await self._call("create", path, lambda: self._client.ensure_path_async(path))

    async def children(self, path: str) -> list[str]:
        check_path(path)
        await self._sync_if_connection_was_lost(path)
        names = await self._call("children", path, lambda: self._client.get_children_async(path))
        return sorted(names)

    async def sync(self, path: str = "/") -> None:
        """ZooKeeper's sync(): the server of this session catches up with the leader
        before it answers, so the reads sent after it see every write completed
        before it (R18)."""
        check_path(path)
        await self._call("sync", path, lambda: self._client.sync_async(path))
        self._sync_before_read = False

    async def next_id(self, counter: str, count: int = 1) -> int:
        check_counter_name(counter)
        check_id_count(counter, count)
        path = f"{COUNTERS_PATH}/{counter}"
        for attempt in range(NEXT_ID_MAX_ATTEMPTS):
            try:
                current = await self.get(path)
            except NoNodeError:
                try:
                    await self.create(path, str(count).encode("ascii"))
                except NodeExistsError:
                    continue
                return count
            try:
                value = int(current.data or b"0") + count
            except ValueError:
                raise MetadataError(
                    f"next_id({counter!r}): {path} holds {current.data[:40]!r}, not a number"
                ) from None
            try:
                await self.set(path, str(value).encode("ascii"), current.version)
            except MetadataVersionError:
                if attempt >= 3:  # heavy contention: spread the retries out a little
                    await asyncio.sleep(random.uniform(0, 0.002 * min(attempt, 50)))
                continue
            return value
        raise MetadataError(
            f"next_id({counter!r}): {NEXT_ID_MAX_ATTEMPTS} compare-and-set conflicts on {path}"
        )

    # ------------------------------------------------------------------ watches

    def watch(self, path: str, callback: WatchCallback, *, children: bool = False) -> Watch:
        check_path(path)
        if self._closed or self._closing:
            raise MetadataError(f"metadata store {self.uri} is closed")
        watch = _ZkWatch(self, path, callback, children)
        self._watches.add(watch)
        watch.arm()
        return watch

    # ------------------------------------------------------------------ session

    def add_session_listener(self, callback: SessionCallback) -> None:
        self._listeners.append(callback)

    @property
    def session_state(self) -> SessionState:
        return self._state

    def _on_kazoo_state(self, state: KazooState) -> None:
        """On a kazoo thread (must not block): forward to the loop."""
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._on_state, state)

    def _on_state(self, state: KazooState) -> None:
        if self._closed or self._closing:
            return
        if state == KazooState.CONNECTED:
            for watch in list(self._watches):
                watch.rearm_after_reconnect()
            new = SessionState.CONNECTED
        elif state == KazooState.SUSPENDED:
            self._sync_before_read = True
            for watch in list(self._watches):
                watch.disarm()
            new = SessionState.SUSPENDED
        else:
            for watch in list(self._watches):
                watch.disarm()
            new = SessionState.LOST
        if self._state is SessionState.LOST or new is self._state:
            return  # LOST is final for this store's session
        self._state = new
        log.info("ZooKeeper session of %s: %s", self.uri, new.value)
        for listener in list(self._listeners):
            try:
                listener(new)
            except Exception:
                log.exception("session listener failed on %s", new.value)


def _settle(future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if future.done():
        return
    ok, value = outcome
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class _Known:
    """What a watch last knew about its node: existence, creation zxid, data version and
    children version (None where not known)."""

    __slots__ = ("cversion", "czxid", "exists", "version")

    def __init__(
        self,
        exists: bool,
        czxid: int | None = None,
        version: int | None = None,
        cversion: int | None = None,
    ) -> None:
        self.exists = exists
        self.czxid = czxid
        self.version = version
        self.cversion = cversion

    @classmethod
    def of(cls, stat: ZnodeStat | None) -> _Known:
        if stat is None:
            return cls(False)
        return cls(True, stat.czxid, stat.version, stat.cversion)


ABSENT = _Known(False)

_KZ_TO_EVENT = {
    KzEventType.CREATED: EventType.CREATED,
    KzEventType.CHANGED: EventType.CHANGED,
    KzEventType.DELETED: EventType.DELETED,
}


class _ZkWatch(Watch):
    """One persistent watch made of ZooKeeper's one-shot watches.

    A one-shot watch fires on the first change after the request that armed it,
    and that request also returned the node's stat. So after a CHANGED event the
    node is at exactly the armed version + 1, after a CHILD event at exactly the
    armed children version + 1. The watch re-arms at once and compares the new
    stat with that expectation: whatever else changed in between (or while the
    connection was down) is reported too, so no change goes unreported.

    ``generation`` numbers each arming; events and results of an older arming
    are ignored, so at most one arming is live at a time. Everything here runs
    on the event loop.
    """

    def __init__(self, store: ZkStore, path: str, callback: WatchCallback, children: bool) -> None:
        self.store = store
        self.path = path
        self.callback = callback
        self.children = children
        self.active = True
        self.generation = 0
        self.armed = False
        self.known: _Known | None = None  # None until the first arming answered

    def cancel(self) -> None:
        self.active = False
        self.armed = False
        self.generation += 1
        self.store._watches.discard(self)

    def disarm(self) -> None:
        self.armed = False
        self.generation += 1

    def rearm_after_reconnect(self) -> None:
        if self.active and not self.armed:
            self.arm()

    # -- arming

    def arm(self) -> None:
        if not self.active:
            return
        self.generation += 1
        self.armed = True
        generation = self.generation
        client = self.store._client

        def on_event(event: WatchedEvent) -> None:  # kazoo thread
            self._to_loop(self._on_event, generation, event)

        try:
            if self.children:
                result = client.get_children_async(self.path, watch=on_event, include_data=True)
            else:
                result = client.exists_async(self.path, watch=on_event)
        except Exception as exc:
            self._on_arm_failed(generation, exc)
            return
        result.rawlink(lambda done: self._to_loop(self._on_armed, generation, done, on_event))

    def _to_loop(self, fn: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):
            self.store._loop.call_soon_threadsafe(fn, *args)

    def _on_armed(self, generation: int, done: AsyncResult, on_event: Any) -> None:
        if generation != self.generation or not self.active:
            return
        if done.successful():
            stat = done.value[1] if self.children else done.value
            self._compare_and_report(_Known.of(stat))
            return
        exc = done.exception
        if self.children and isinstance(exc, kz.NoNodeError):
            # No node: watch for its creation instead.
            self._compare_and_report(ABSENT)
            self._arm_children_fallback(generation, on_event)
            return
        self._on_arm_failed(generation, exc)

    def _arm_children_fallback(self, generation: int, on_event: Any) -> None:
        try:
            result = self.store._client.exists_async(self.path, watch=on_event)
        except Exception as exc:
            self._on_arm_failed(generation, exc)
            return

        def on_exists(done: AsyncResult) -> None:
            if generation != self.generation or not self.active:
                return
            if not done.successful():
                self._on_arm_failed(generation, done.exception)
            elif done.value is not None:  # created meanwhile: list its children
                self.arm()

        result.rawlink(lambda done: self._to_loop(on_exists, done))

    def _on_arm_failed(self, generation: int, exc: BaseException | None) -> None:
        if generation != self.generation or not self.active:
            return
        self.armed = False
        if self.store._closed or self.store._closing:
            return
        log.debug("re-arming watch on %s after %r", self.path, exc)
        if self.store._client.connected:
            # A transient failure while connected: try again shortly. Otherwise
            # the CONNECTED state change re-arms every watch.
            self.store._loop.call_later(REARM_RETRY_DELAY_S, self.rearm_after_reconnect)

    def _compare_and_report(self, now: _Known) -> None:
        before = self.known
        self.known = now
        if before is None:
            return  # first arming: nothing to compare with
        if self.children:
            self._report_children(before, now)
        else:
            self._report_data(before, now)

    def _report_data(self, before: _Known, now: _Known) -> None:
        if before.exists and not now.exists:
            self._deliver(EventType.DELETED)
            return
        if not now.exists:
            return
        recreated = before.exists and before.czxid is not None and before.czxid != now.czxid
        if recreated:
            self._deliver(EventType.DELETED)
        if recreated or not before.exists:
            self._deliver(EventType.CREATED)
            if now.version:
                self._deliver(EventType.CHANGED)
        elif before.version is None or before.version != now.version:
            self._deliver(EventType.CHANGED)

    def _report_children(self, before: _Known, now: _Known) -> None:
        if not now.exists:
            return  # a node can only go once it has no children
        if not before.exists or (before.czxid is not None and before.czxid != now.czxid):
            changed = bool(now.cversion)  # a new node: any child change since its creation
        else:
            changed = before.cversion is None or before.cversion != now.cversion
        if changed:
            self._deliver(EventType.CHILDREN)

    # -- events

    def _on_event(self, generation: int, event: WatchedEvent) -> None:
        if generation != self.generation or not self.active:
            return
        if event.type == KzEventType.NONE:
            return  # connection state: the session listener disarms and re-arms
        before = self.known or ABSENT
        delivered: EventType | None = None
        if self.children:
            if event.type == KzEventType.CHILD:
                self.known = _Known(True, before.czxid, None, _plus_one(before.cversion))
                delivered = EventType.CHILDREN
            elif event.type == KzEventType.CREATED:
                self.known = _Known(True, None, None, 0)
            elif event.type == KzEventType.DELETED:
                self.known = ABSENT
        else:
            delivered = _KZ_TO_EVENT.get(event.type)
            if delivered is EventType.CREATED:
                self.known = _Known(True, None, 0)
            elif delivered is EventType.CHANGED:
                self.known = _Known(True, before.czxid, _plus_one(before.version))
            elif delivered is EventType.DELETED:
                self.known = ABSENT
        # Re-arm before telling the callback, so that any read the callback makes
        # is queued after the new watch.
        self.arm()
        if delivered is not None:
            self._deliver(delivered)

    def _deliver(self, kind: EventType) -> None:
        if not self.active:
            return
        try:
            self.callback(WatchEvent(kind, self.path))
        except Exception:
            log.exception("watch callback on %s failed", self.path)


def _plus_one(value: int | None) -> int | None:
    return None if value is None else value + 1
