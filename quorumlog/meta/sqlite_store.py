"""The embedded metadata store: one SQLite file shared by the processes of one machine.

``sqlite:///absolute/path.db`` gives ZooKeeper's semantics without a server:

- Nodes live in the ``nodes`` table (path, data, version, owning session).
  Every write runs in ``BEGIN IMMEDIATE`` (one writer at a time, waits on
  ``busy_timeout`` instead of failing) with ``synchronous=FULL`` in WAL mode, so
  a commit that returned is on disk.
- Sessions: each open store inserts a row in ``sessions`` with an expiry time on
  the machine's boot clock (``CLOCK_BOOTTIME``, comparable between processes),
  which a heartbeat thread pushes forward every ``session_timeout / 3``. The
  same heartbeat expires every *other* session whose time has passed (or that
  belongs to an earlier boot) and deletes its ephemeral nodes, so a process
  killed with ``kill -9`` loses its ephemerals within about one session timeout
  as long as any other process has the store open. A store that finds its own
  row gone reports ``LOST``; one that could not refresh for two thirds of the
  timeout reports ``SUSPENDED``.
- Watches: every write appends (path, kind) rows to ``changes`` (an
  ``AUTOINCREMENT`` sequence, contiguous in commit order). A poller thread checks
  ``PRAGMA data_version`` every 25 ms and reads the new rows; callbacks run on
  the store's event loop. Rows older than a few minutes are pruned; a poller
  that fell behind the pruning (a process stopped for minutes) cannot know
  what it missed, so it gives every watch one conservative event.

SQLite work never runs on the event loop: operations go to one dedicated
thread, the heartbeat and the poller have their own threads, each with its own
connection.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import enum
import logging
import os
import socket
import sqlite3
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

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
    ancestors_of,
    check_counter_name,
    check_id_count,
    check_path,
    name_of,
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

T = TypeVar("T")

SCHEMA_VERSION = 1
POLL_INTERVAL_S = 0.025
MIN_SESSION_TIMEOUT_MS = 200
BUSY_TIMEOUT_MS = 10_000
# Change rows are kept while younger than this, and at least the newest KEEP_CHANGES.
CHANGES_RETENTION_MS = 5 * 60 * 1000
KEEP_CHANGES = 10_000
PRUNE_EVERY_HEARTBEATS = 30
POLL_BATCH_ROWS = 1000
# Writes queued while the store's thread is busy commit together in one transaction
# (one fsync), each in a savepoint of its own: at most this many per commit, so
# that one commit's wait stays short.
GROUP_COMMIT_MAX_OPS = 256

_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    path TEXT PRIMARY KEY,
    parent TEXT NOT NULL,
    name TEXT NOT NULL,
    data BLOB NOT NULL,
    version INTEGER NOT NULL,
    owner INTEGER,
    next_seq INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS nodes_by_parent ON nodes(parent, name);
CREATE INDEX IF NOT EXISTS nodes_by_owner ON nodes(owner) WHERE owner IS NOT NULL;
CREATE TABLE IF NOT EXISTS sessions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    boot_id TEXT NOT NULL,
    expires_ms INTEGER NOT NULL,
    timeout_ms INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    host TEXT NOT NULL,
    opened_wall_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    path TEXT NOT NULL,
    kind TEXT NOT NULL,
    wall_ms INTEGER NOT NULL
);
INSERT OR IGNORE INTO nodes (path, parent, name, data, version, owner, next_seq)
    VALUES ('/', '', '', x'', 0, NULL, 0);
"""


def _read_boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


BOOT_ID = _read_boot_id()
_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def clock_ms() -> int:
    """Milliseconds on the machine-wide boot clock that session expiry times use."""
    return time.clock_gettime_ns(_CLOCK) // 1_000_000


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def db_path_from_uri(uri: str) -> str:
    """``sqlite:///abs/path.db`` -> ``/abs/path.db``."""
    prefix = "sqlite://"
    if not uri.startswith(prefix + "/"):
        raise InvalidArgumentError(f"metadata URI {uri!r}: expected sqlite:///absolute/path.db")
    path = uri[len(prefix) :].split("?", 1)[0]
    if not os.path.isabs(path) or path.endswith("/"):
        raise InvalidArgumentError(f"metadata URI {uri!r}: expected sqlite:///absolute/path.db")
    # sqlite:////abs/path.db (SQLAlchemy's spelling) names the same file: one leading
    # slash, so that a bookie and a client given either spelling open one store.
    return "/" + path.lstrip("/")


def _connect(
    db_path: str, *, busy_timeout_ms: int, synchronous: str, create: bool = True
) -> sqlite3.Connection:
    if create:
        conn = sqlite3.connect(db_path, isolation_level=None, timeout=busy_timeout_ms / 1000)
    else:
        # mode=rw: SQLite opens an existing file only, atomically, instead of making one.
        conn = sqlite3.connect(
            f"file:{urllib.request.pathname2url(db_path)}?mode=rw",
            uri=True,
            isolation_level=None,
            timeout=busy_timeout_ms / 1000,
        )
    conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    return conn


def _busy(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite refused for now because another connection holds a lock."""
    return "locked" in str(exc) or "busy" in str(exc)


_Call = tuple[Callable[..., Any], tuple[Any, ...]]


class _Batch(enum.Enum):
    """How an operation may share its trip to the store's thread (see _in_thread)."""

    WRITES = "writes"  # with the writes queued beside it, in one commit
    READS = "reads"  # with the reads queued beside it
    ALONE = "alone"  # a trip of its own


class _Queued(NamedTuple):
    kind: _Batch
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    future: asyncio.Future[Any]


class _Txn:
    """``with _Txn(conn):`` runs the block in BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error).

    Inside a group commit's transaction the block is a savepoint instead: released
    when it ends, rolled back alone when it raises, committed with the group."""

    def __init__(self, conn: sqlite3.Connection, mode: str = "IMMEDIATE") -> None:
        self.conn = conn
        self.mode = mode
        self.nested = False

    def __enter__(self) -> sqlite3.Connection:
        self.nested = self.conn.in_transaction
        self.conn.execute("SAVEPOINT op" if self.nested else f"BEGIN {self.mode}")
        return self.conn

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if not self.nested:
            if exc_type is None:
                self.conn.execute("COMMIT")
            elif self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            return
        if not self.conn.in_transaction:
            return  # SQLite rolled the whole group back (a full disk, an I/O error)
        if exc_type is not None:
            self.conn.execute("ROLLBACK TO op")
        self.conn.execute("RELEASE op")


def _log_change(conn: sqlite3.Connection, path: str, kind: EventType) -> None:
    conn.execute(
        "INSERT INTO changes (path, kind, wall_ms) VALUES (?, ?, ?)",
        (path, kind.value, _wall_ms()),
    )


def _delete_session(conn: sqlite3.Connection, session_id: int) -> list[str]:
    """Delete a session and its ephemeral nodes (inside a write transaction)."""
    paths = [p for (p,) in conn.execute("SELECT path FROM nodes WHERE owner = ?", (session_id,))]
    for path in paths:
        conn.execute("DELETE FROM nodes WHERE path = ?", (path,))
        _log_change(conn, path, EventType.DELETED)
    conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
    return paths


class _SqliteWatch(Watch):
    __slots__ = ("active", "callback", "children", "path", "store")

    def __init__(
        self, store: SqliteStore, path: str, callback: WatchCallback, children: bool
    ) -> None:
        self.store = store
        self.path = path
        self.callback = callback
        self.children = children
        self.active = True

    def cancel(self) -> None:
        if self.active:
            self.active = False
            self.store._remove_watch(self)


class SqliteStore(MetadataStore):
    """A :class:`MetadataStore` on one SQLite file, safe to share between processes.

    Example::

        store = await SqliteStore.open("sqlite:///tmp/q/metadata.db", session_timeout_ms=3000)
        await store.create("/bookies/available/127.0.0.1:3181", b"", ephemeral=True)
        await store.close()
    """

    def __init__(
        self, uri: str, db_path: str, session_timeout_ms: int, create: bool = True
    ) -> None:
        self.uri = uri
        self.db_path = db_path
        self.session_timeout_ms = session_timeout_ms
        self._may_create = create
        self.session_id = 0
        self._loop = asyncio.get_running_loop()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="quorumlog-sqlite-ops"
        )
        self._conn: sqlite3.Connection | None = None  # used only on the executor thread
        self._state = SessionState.CONNECTED
        self._state_lock = threading.Lock()
        self._listeners: list[SessionCallback] = []
        self._data_watches: dict[str, list[_SqliteWatch]] = {}
        self._child_watches: dict[str, list[_SqliteWatch]] = {}
        self._watch_count = 0
        self._own_ephemerals: set[str] = set()
        self._closed = False
        self._closing = False  # set first in close(): no state reports while closing
        self._stop = threading.Event()
        self._poke = threading.Event()
        self._last_refresh_ms = clock_ms()
        self._start_seq = 0
        self._threads: list[threading.Thread] = []
        # Operations wait here in the order they were called; one task hands them to
        # the store's thread, consecutive writes as one group commit (see _drain).
        self._queue: collections.deque[_Queued] = collections.deque()
        self._drainer: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    async def open(
        cls, uri: str, *, session_timeout_ms: int = 10_000, create: bool = True
    ) -> SqliteStore:
        """Open and start a session. With ``create``, a missing file (and directory) is
        made; without, a missing file or one that is no store is a MetadataError (a
        client given a mistyped path must not start an empty cluster of its own)."""
        if session_timeout_ms < MIN_SESSION_TIMEOUT_MS:
            raise InvalidArgumentError(
                f"session_timeout_ms={session_timeout_ms}: must be >= {MIN_SESSION_TIMEOUT_MS}"
            )
        store = cls(uri, db_path_from_uri(uri), session_timeout_ms, create)
        try:
            await store._in_thread(store._start_session_retrying)
        except BaseException:
            store._executor.shutdown(wait=False)
            raise
        store._start_threads()
        return store

    def _start_session_retrying(self) -> None:
        # Turning a new database to WAL needs an exclusive lock, and SQLite answers
        # "database is locked" at once (no busy handler) when several processes open a
        # fresh store together, as a local cluster's bookies do. Retry for a while.
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        delay_s = 0.01
        while True:
            try:
                self._start_session()
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                if self._conn is not None:
                    with contextlib.suppress(sqlite3.Error):
                        self._conn.close()
                    self._conn = None
                if time.monotonic() + delay_s > deadline:
                    raise
                time.sleep(delay_s)
                delay_s = min(delay_s * 2, 0.2)

    def _connect_existing(self) -> sqlite3.Connection:
        """A connection to a store some bookie created; MetadataError if there is none."""
        missing = MetadataError(
            f"no metadata store at {self.db_path}: the file does not exist (only "
            "`quorumlog bookie` and `quorumlog localbookie` create one; check the URI)"
        )
        try:
            conn = _connect(
                self.db_path, busy_timeout_ms=BUSY_TIMEOUT_MS, synchronous="FULL", create=False
            )
        except sqlite3.OperationalError as exc:
            if not os.path.exists(self.db_path):
                raise missing from None
            if _busy(exc):
                raise  # a bookie is creating it: _start_session_retrying tries again
            raise MetadataError(f"cannot open metadata store {self.db_path}: {exc}") from exc
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            conn.close()
            if isinstance(exc, sqlite3.OperationalError) and _busy(exc):
                raise
            raise MetadataError(f"cannot open metadata store {self.db_path}: {exc}") from exc
        if version == 0:  # checked before any change: another program's file stays as it is
            conn.close()
            raise MetadataError(
                f"no metadata store at {self.db_path}: the file is not a quorumlog store "
                "(empty, or another program's database; check the URI)"
            )
        return conn

    def _start_session(self) -> None:
        if self._may_create:
            directory = os.path.dirname(self.db_path)
            try:
                # Owner-only: the store says which bookies to trust and holds every
                # ledger's metadata, so no other local user may read or change it.
                os.makedirs(directory, mode=0o700, exist_ok=True)
                # Made before SQLite opens it: SQLite gives its -wal and -shm files the
                # database file's permissions.
                os.close(os.open(self.db_path, os.O_CREAT | os.O_RDWR, 0o600))
                conn = _connect(self.db_path, busy_timeout_ms=BUSY_TIMEOUT_MS, synchronous="FULL")
            except OSError as exc:
                raise MetadataError(f"cannot create metadata store {self.db_path}: {exc}") from exc
        else:
            conn = self._connect_existing()
        self._conn = conn
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise MetadataError(
                f"metadata store {self.db_path}: WAL mode unavailable (got {mode!r}); "
                "use a local file system"
            )
        with _Txn(conn):
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            elif version != SCHEMA_VERSION:
                raise MetadataError(
                    f"metadata store {self.db_path}: schema version {version}, "
                    f"this code reads {SCHEMA_VERSION}"
                )
            now = clock_ms()
            cursor = conn.execute(
                "INSERT INTO sessions (boot_id, expires_ms, timeout_ms, pid, host, opened_wall_ms)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (
                    BOOT_ID,
                    now + self.session_timeout_ms,
                    self.session_timeout_ms,
                    os.getpid(),
                    socket.gethostname(),
                    _wall_ms(),
                ),
            )
            assert cursor.lastrowid is not None
            self.session_id = cursor.lastrowid
            # Leftovers of sessions that died while nobody had the store open go now,
            # not at the first heartbeat.
            self._expire_sessions(conn, now)
            self._start_seq = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[
                0
            ]
        self._last_refresh_ms = clock_ms()

    def _expire_sessions(self, conn: sqlite3.Connection, now_ms: int) -> int:
        """Inside a write transaction: end every other session past its expiry time or
        from an earlier boot, with its ephemeral nodes. Returns how many."""
        expired = conn.execute(
            "SELECT id FROM sessions WHERE id != ? AND (expires_ms < ? OR boot_id != ?)",
            (self.session_id, now_ms, BOOT_ID),
        ).fetchall()
        for (session_id,) in expired:
            gone = _delete_session(conn, session_id)
            log.info(
                "metadata store %s: expired session %d (%d ephemeral nodes)",
                self.db_path,
                session_id,
                len(gone),
            )
        return len(expired)

    def _start_threads(self) -> None:
        for name, target in (("heartbeat", self._heartbeat_loop), ("poller", self._poll_loop)):
            thread = threading.Thread(
                target=target, name=f"quorumlog-sqlite-{name}-{self.session_id}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    async def close(self) -> None:
        """Delete this session and its ephemeral nodes, then stop the threads."""
        if self._closed or self._closing:
            return
        self._closing = True
        try:
            await self._in_thread(self._end_session)
        finally:
            self._closed = True
            self._stop.set()
            self._poke.set()
            await asyncio.to_thread(self._join_threads)
            self._executor.shutdown(wait=False)
            self._data_watches.clear()
            self._child_watches.clear()

    def _end_session(self) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            with _Txn(conn):
                _delete_session(conn, self.session_id)
        finally:
            conn.close()
            self._conn = None

    def _join_threads(self) -> None:
        for thread in self._threads:
            thread.join(timeout=max(5.0, BUSY_TIMEOUT_MS / 1000 + 1))

    # ------------------------------------------------------------------ plumbing

    async def _in_thread(self, fn: Callable[..., T], *args: Any, kind: _Batch = _Batch.ALONE) -> T:
        """Run ``fn(*args)`` on the store's thread, after every operation called before
        it (the order ZooKeeper gives one session's requests). ``kind``: whether it may
        share one commit with the writes queued beside it, one trip to the thread with
        the reads beside it, or take a trip of its own."""
        if self._closed:
            raise MetadataError(f"metadata store {self.uri} is closed")
        future: asyncio.Future[T] = self._loop.create_future()
        self._queue.append(_Queued(kind, fn, args, future))
        if self._drainer is None:
            self._drainer = self._loop.create_task(self._drain())
        # A caller cancelled leaves its future cancelled; the operation may still run,
        # as one handed to a thread always could.
        return await future

    async def _drain(self) -> None:
        try:
            while self._queue:
                group = [self._queue.popleft()]
                while (
                    self._queue
                    and group[0].kind is not _Batch.ALONE
                    and self._queue[0].kind is group[0].kind
                    and len(group) < GROUP_COMMIT_MAX_OPS
                ):
                    group.append(self._queue.popleft())
                calls = [(item.fn, item.args) for item in group]
                try:
                    if group[0].kind is _Batch.WRITES and len(group) > 1:
                        outcomes = await self._loop.run_in_executor(
                            self._executor, self._group_commit, calls
                        )
                    else:
                        outcomes = await self._loop.run_in_executor(
                            self._executor, self._run_each, calls
                        )
                except BaseException as exc:  # the executor is gone (closed) or cancelled
                    error = MetadataError(f"metadata store {self.uri}: {exc!r}")
                    for item in [*group, *self._queue]:
                        if not item.future.done():
                            item.future.set_exception(error)
                    self._queue.clear()
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    return
                for item, (ok, value) in zip(group, outcomes, strict=True):
                    if item.future.done():
                        continue
                    if ok:
                        item.future.set_result(value)
                    else:
                        item.future.set_exception(value)
        finally:
            self._drainer = None

    def _outcome(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any]:
        try:
            return True, self._guarded(fn, args)
        except Exception as exc:
            return False, exc

    def _run_each(self, calls: list[_Call]) -> list[tuple[bool, Any]]:
        return [self._outcome(fn, args) for fn, args in calls]

    def _group_commit(self, calls: list[_Call]) -> list[tuple[bool, Any]]:
        """Writes in one BEGIN IMMEDIATE ... COMMIT, each in its own savepoint (see
        _Txn): one fsync for all. A write that raised was rolled back alone and
        reports its error; if the commit fails, every write it held fails with it."""
        conn = self._db()
        outcomes: list[tuple[bool, Any]] = []
        pending: list[int] = []  # indexes of writes that succeeded but are not committed
        for fn, args in calls:
            if not conn.in_transaction:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                except sqlite3.Error as exc:
                    outcomes.append((False, self._commit_error(exc)))
                    continue
            ok, value = self._outcome(fn, args)
            if conn.in_transaction:
                outcomes.append((ok, value))
                if ok:
                    pending.append(len(outcomes) - 1)
                continue
            # SQLite rolled the whole transaction back: this write and the pending ones
            # are gone.
            error = value if not ok else self._commit_error(sqlite3.Error("rolled back"))
            outcomes.append((False, error))
            for index in pending:
                outcomes[index] = (False, error)
            pending.clear()
        if conn.in_transaction:
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                for index in pending:
                    outcomes[index] = (False, self._commit_error(exc))
        self._committed()
        return outcomes

    def _commit_error(self, exc: sqlite3.Error) -> MetadataError:
        return MetadataError(f"metadata store {self.db_path}: {exc}")

    def _guarded(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        try:
            return fn(*args)
        except sqlite3.Error as exc:
            raise MetadataError(f"metadata store {self.db_path}: {exc}") from exc

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise MetadataError(f"metadata store {self.uri} is closed")
        return self._conn

    def _committed(self) -> None:
        # Let the poller pick our own change up now instead of at its next tick.
        self._poke.set()

    def _check_alive_for(self, path: str) -> None:
        if self._state is SessionState.LOST and path in self._own_ephemerals:
            raise SessionExpiredError(
                f"metadata session {self.session_id} expired: ephemeral {path} is gone"
            )

    # ------------------------------------------------------------------ operations

    async def get(self, path: str) -> Versioned:
        check_path(path)
        self._check_alive_for(path)
        row = await self._in_thread(self._get, path, kind=_Batch.READS)
        if row is None:
            raise NoNodeError(f"metadata path {path} does not exist")
        return Versioned(bytes(row[0]), row[1])

    def _get(self, path: str) -> tuple[bytes, int] | None:
        cursor = self._db().execute("SELECT data, version FROM nodes WHERE path = ?", (path,))
        found = cursor.fetchone()
        return None if found is None else (bytes(found[0]), int(found[1]))

    async def exists(self, path: str) -> int | None:
        check_path(path)
        row = await self._in_thread(self._get, path, kind=_Batch.READS)
        return None if row is None else int(row[1])

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
            raise SessionExpiredError(
                f"metadata session {self.session_id} expired: cannot create ephemeral {path}"
            )
        created = await self._in_thread(
            self._create, path, bytes(data), ephemeral, sequential, make_parents, kind=_Batch.WRITES
        )
        if ephemeral:
            self._own_ephemerals.add(created)
        return created

    def _create(
        self, path: str, data: bytes, ephemeral: bool, sequential: bool, make_parents: bool
    ) -> str:
        conn = self._db()
        with _Txn(conn):
            if ephemeral:
                alive = conn.execute(
                    "SELECT 1 FROM sessions WHERE id = ?", (self.session_id,)
                ).fetchone()
                if alive is None:
                    self._set_state(SessionState.LOST)
                    raise SessionExpiredError(
                        f"metadata session {self.session_id} expired: "
                        f"cannot create ephemeral {path}"
                    )
            parent = parent_of(path)
            row = conn.execute("SELECT owner FROM nodes WHERE path = ?", (parent,)).fetchone()
            if row is None:
                if not make_parents:
                    raise NoNodeError(f"metadata path {parent} (parent of {path}) does not exist")
                self._create_ancestors(conn, path)
            elif row[0] is not None:
                raise MetadataError(f"metadata path {parent} is ephemeral: it cannot have children")
            if sequential:
                (number,) = conn.execute(
                    "SELECT next_seq FROM nodes WHERE path = ?", (parent,)
                ).fetchone()
                conn.execute("UPDATE nodes SET next_seq = next_seq + 1 WHERE path = ?", (parent,))
                path = f"{path}{number:010d}"
            try:
                conn.execute(
                    "INSERT INTO nodes (path, parent, name, data, version, owner)"
                    " VALUES (?, ?, ?, ?, 0, ?)",
                    (path, parent, name_of(path), data, self.session_id if ephemeral else None),
                )
            except sqlite3.IntegrityError:
                raise NodeExistsError(f"metadata path {path} already exists") from None
            _log_change(conn, path, EventType.CREATED)
        self._committed()
        return path

    def _create_ancestors(self, conn: sqlite3.Connection, path: str) -> None:
        for ancestor in ancestors_of(path):
            row = conn.execute("SELECT owner FROM nodes WHERE path = ?", (ancestor,)).fetchone()
            if row is not None:
                if row[0] is not None:
                    raise MetadataError(
                        f"metadata path {ancestor} is ephemeral: it cannot have children"
                    )
                continue
            conn.execute(
                "INSERT INTO nodes (path, parent, name, data, version, owner)"
                " VALUES (?, ?, ?, x'', 0, NULL)",
                (ancestor, parent_of(ancestor), name_of(ancestor)),
            )
            _log_change(conn, ancestor, EventType.CREATED)

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        check_path(path)
        self._check_alive_for(path)
        return await self._in_thread(self._set, path, bytes(data), version, kind=_Batch.WRITES)

    def _set(self, path: str, data: bytes, version: int) -> int:
        conn = self._db()
        with _Txn(conn):
            row = conn.execute("SELECT version FROM nodes WHERE path = ?", (path,)).fetchone()
            if row is None:
                raise NoNodeError(f"metadata path {path} does not exist")
            if version != -1 and row[0] != version:
                raise MetadataVersionError(
                    f"metadata path {path}: version is {row[0]}, expected {version}"
                )
            conn.execute(
                "UPDATE nodes SET data = ?, version = version + 1 WHERE path = ?", (data, path)
            )
            _log_change(conn, path, EventType.CHANGED)
        self._committed()
        return int(row[0]) + 1

    async def delete(self, path: str, version: int = -1) -> None:
        check_path(path)
        if path == ROOT:
            raise MetadataError("metadata path / cannot be deleted")
        self._check_alive_for(path)
        await self._in_thread(self._delete, path, version, kind=_Batch.WRITES)
        self._own_ephemerals.discard(path)

    def _delete(self, path: str, version: int) -> None:
        conn = self._db()
        with _Txn(conn):
            row = conn.execute("SELECT version FROM nodes WHERE path = ?", (path,)).fetchone()
            if row is None:
                raise NoNodeError(f"metadata path {path} does not exist")
            if version != -1 and row[0] != version:
                raise MetadataVersionError(
                    f"metadata path {path}: version is {row[0]}, expected {version}"
                )
            child = conn.execute("SELECT 1 FROM nodes WHERE parent = ? LIMIT 1", (path,)).fetchone()
            if child is not None:
                raise NotEmptyError(f"metadata path {path} has children")
            conn.execute("DELETE FROM nodes WHERE path = ?", (path,))
            _log_change(conn, path, EventType.DELETED)
        self._committed()

    async def multi(self, ops: Sequence[Op]) -> None:
        for op in ops:
            check_path(op.path)
            if op.path == ROOT and not isinstance(op, CheckOp):
                raise MetadataError("metadata path / cannot be created, set or deleted")
        await self._in_thread(self._multi, list(ops), kind=_Batch.WRITES)
        for op in ops:
            if isinstance(op, DeleteOp):
                self._own_ephemerals.discard(op.path)

    def _multi(self, ops: list[Op]) -> None:
        """One write transaction: every op or, on the first error, a rollback."""
        conn = self._db()
        with _Txn(conn):
            for op in ops:
                row = conn.execute(
                    "SELECT version, owner FROM nodes WHERE path = ?", (op.path,)
                ).fetchone()
                if isinstance(op, CreateOp):
                    if row is not None:
                        raise NodeExistsError(f"metadata path {op.path} already exists")
                    self._create_ancestors(conn, op.path)
                    conn.execute(
                        "INSERT INTO nodes (path, parent, name, data, version, owner)"
                        " VALUES (?, ?, ?, ?, 0, NULL)",
                        (op.path, parent_of(op.path), name_of(op.path), bytes(op.data)),
                    )
                    _log_change(conn, op.path, EventType.CREATED)
                    continue
                if row is None:
                    raise NoNodeError(f"metadata path {op.path} does not exist")
                if op.version != -1 and row[0] != op.version:
                    raise MetadataVersionError(
                        f"metadata path {op.path}: version is {row[0]}, expected {op.version}"
                    )
                if isinstance(op, SetOp):
                    conn.execute(
                        "UPDATE nodes SET data = ?, version = version + 1 WHERE path = ?",
                        (bytes(op.data), op.path),
                    )
                    _log_change(conn, op.path, EventType.CHANGED)
                elif isinstance(op, DeleteOp):
                    child = conn.execute(
                        "SELECT 1 FROM nodes WHERE parent = ? LIMIT 1", (op.path,)
                    ).fetchone()
                    if child is not None:
                        raise NotEmptyError(f"metadata path {op.path} has children")
                    conn.execute("DELETE FROM nodes WHERE path = ?", (op.path,))
                    _log_change(conn, op.path, EventType.DELETED)
        self._committed()

    async def children(self, path: str) -> list[str]:
        check_path(path)
        found = await self._in_thread(self._children, path, kind=_Batch.READS)
        if found is None:
            raise NoNodeError(f"metadata path {path} does not exist")
        return found

    def _children(self, path: str) -> list[str] | None:
        conn = self._db()
        with _Txn(conn, "DEFERRED"):
            if conn.execute("SELECT 1 FROM nodes WHERE path = ?", (path,)).fetchone() is None:
                return None
            rows = conn.execute(
                "SELECT name FROM nodes WHERE parent = ? ORDER BY name", (path,)
            ).fetchall()
        return [name for (name,) in rows]

    async def sync(self, path: str = "/") -> None:
        """Nothing to wait for: every read is its own SQLite transaction on the one
        database file, which sees every transaction committed before it began (there
        is no replica that could lag), so reads here are linearizable already."""
        check_path(path)
        if self._closed:
            raise MetadataError(f"metadata store {self.uri} is closed")

    async def next_id(self, counter: str, count: int = 1) -> int:
        check_counter_name(counter)
        check_id_count(counter, count)
        return await self._in_thread(self._next_id, counter, count, kind=_Batch.WRITES)

    def _next_id(self, counter: str, count: int) -> int:
        conn = self._db()
        with _Txn(conn):
            (value,) = conn.execute(
                "INSERT INTO counters (name, value) VALUES (?, ?)"
                " ON CONFLICT(name) DO UPDATE SET value = value + ? RETURNING value",
                (counter, count, count),
            ).fetchone()
        return int(value)

    # ------------------------------------------------------------------ watches

    def watch(self, path: str, callback: WatchCallback, *, children: bool = False) -> Watch:
        check_path(path)
        if self._closed:
            raise MetadataError(f"metadata store {self.uri} is closed")
        watch = _SqliteWatch(self, path, callback, children)
        table = self._child_watches if children else self._data_watches
        table.setdefault(path, []).append(watch)
        self._watch_count += 1
        return watch

    def _remove_watch(self, watch: _SqliteWatch) -> None:
        table = self._child_watches if watch.children else self._data_watches
        watches = table.get(watch.path)
        if watches and watch in watches:
            watches.remove(watch)
            self._watch_count -= 1
            if not watches:
                del table[watch.path]

    def _dispatch(self, changes: list[tuple[str, str]], resync: bool) -> None:
        """On the loop: turn change rows into watch events."""
        if self._closed:
            return
        if resync:
            for table, kind in (
                (self._data_watches, EventType.CHANGED),
                (self._child_watches, EventType.CHILDREN),
            ):
                for path, watches in list(table.items()):
                    for watch in list(watches):
                        _deliver(watch, WatchEvent(kind, path))
        for path, kind_name in changes:
            kind = EventType(kind_name)
            for watch in list(self._data_watches.get(path, ())):
                _deliver(watch, WatchEvent(kind, path))
            if kind is not EventType.CHANGED and path != ROOT:
                parent = parent_of(path)
                for watch in list(self._child_watches.get(parent, ())):
                    _deliver(watch, WatchEvent(EventType.CHILDREN, parent))

    def _poll_loop(self) -> None:
        try:
            conn = _connect(self.db_path, busy_timeout_ms=BUSY_TIMEOUT_MS, synchronous="NORMAL")
        except sqlite3.Error:
            log.exception("metadata store %s: watch poller cannot open the database", self.db_path)
            return
        last_seq = self._start_seq
        last_data_version = -1
        suspend_after_ms = self.session_timeout_ms * 2 // 3
        try:
            while not self._stop.is_set():
                self._poke.wait(POLL_INTERVAL_S)
                self._poke.clear()
                if self._stop.is_set():
                    break
                if clock_ms() - self._last_refresh_ms > suspend_after_ms:
                    self._set_state(SessionState.SUSPENDED)
                try:
                    (data_version,) = conn.execute("PRAGMA data_version").fetchone()
                    if data_version == last_data_version:
                        continue
                    last_data_version = data_version
                    last_seq = self._read_changes(conn, last_seq)
                except sqlite3.Error as exc:
                    log.warning("metadata store %s: watch poll failed: %s", self.db_path, exc)
                    last_data_version = -1
        finally:
            conn.close()

    def _read_changes(self, conn: sqlite3.Connection, last_seq: int) -> int:
        for _ in range(1_000):  # bounded: at most 1M rows per tick, then the next tick goes on
            rows = conn.execute(
                "SELECT seq, path, kind FROM changes WHERE seq > ? ORDER BY seq LIMIT ?",
                (last_seq, POLL_BATCH_ROWS),
            ).fetchall()
            if not rows:
                return last_seq
            resync = rows[0][0] != last_seq + 1
            if resync:
                log.warning(
                    "metadata store %s: change log pruned past %d; resynchronising watches",
                    self.db_path,
                    last_seq,
                )
            last_seq = rows[-1][0]
            if self._watch_count or resync:
                self._call_on_loop(self._dispatch, [(p, k) for _, p, k in rows], resync)
            if len(rows) < POLL_BATCH_ROWS:
                return last_seq
        return last_seq

    # ------------------------------------------------------------------ session

    def add_session_listener(self, callback: SessionCallback) -> None:
        self._listeners.append(callback)

    @property
    def session_state(self) -> SessionState:
        return self._state

    def _set_state(self, state: SessionState) -> None:
        """From any thread: record a session state change and tell listeners on the loop."""
        with self._state_lock:
            if self._state is state or self._state is SessionState.LOST or self._closing:
                return
            self._state = state
        log.info("metadata store %s session %d: %s", self.db_path, self.session_id, state.value)
        self._call_on_loop(self._notify, state)

    def _notify(self, state: SessionState) -> None:
        for listener in list(self._listeners):
            try:
                listener(state)
            except Exception:
                log.exception("session listener failed on %s", state.value)

    def _call_on_loop(self, fn: Callable[..., None], *args: Any) -> None:
        # The loop may already be closed when a late thread tick fires.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(fn, *args)

    def _heartbeat_loop(self) -> None:
        interval_s = self.session_timeout_ms / 3000
        try:
            conn = _connect(
                self.db_path,
                busy_timeout_ms=max(100, self.session_timeout_ms // 3),
                synchronous="NORMAL",  # a lost heartbeat costs nothing; no fsync per beat
            )
        except sqlite3.Error:
            log.exception("metadata store %s: heartbeat cannot open the database", self.db_path)
            return
        beats = 0
        try:
            while not self._stop.wait(interval_s):
                beats += 1
                try:
                    self._beat(conn, prune=beats % PRUNE_EVERY_HEARTBEATS == 0)
                except sqlite3.Error as exc:
                    log.warning("metadata store %s: heartbeat failed: %s", self.db_path, exc)
        finally:
            conn.close()

    def _beat(self, conn: sqlite3.Connection, *, prune: bool) -> None:
        refreshed = False
        with _Txn(conn):
            now = clock_ms()
            if self._state is not SessionState.LOST and not self._closing:
                refreshed = (
                    conn.execute(
                        "UPDATE sessions SET expires_ms = ? WHERE id = ?",
                        (now + self.session_timeout_ms, self.session_id),
                    ).rowcount
                    == 1
                )
                if not refreshed:
                    self._set_state(SessionState.LOST)
            expired = self._expire_sessions(conn, now)
            if prune:
                conn.execute(
                    "DELETE FROM changes WHERE seq <= (SELECT MAX(seq) FROM changes) - ?"
                    " AND wall_ms < ?",
                    (KEEP_CHANGES, _wall_ms() - CHANGES_RETENTION_MS),
                )
        if refreshed:
            # Counted from the start of the transaction: the row said "now + timeout".
            self._last_refresh_ms = now
            self._set_state(SessionState.CONNECTED)
        if expired:
            self._poke.set()


def _deliver(watch: _SqliteWatch, event: WatchEvent) -> None:
    if not watch.active:
        return
    try:
        watch.callback(event)
    except Exception:
        log.exception("watch callback on %s failed", watch.path)
