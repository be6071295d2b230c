"""The replicated state machine: log records in, a SQLite file changed, results out.

No network and no event loop: the replica (``replica.py``) feeds records in log order
and this module applies each one in a single SQLite transaction that also stores the
record's position in ``_quorumlog_applied``. A replica killed at any moment therefore
has either all of a record (and its position) or none of it, and resumes at the
record after the stored position: nothing applied twice, nothing skipped.

Applying is deterministic (R19): the same file and the same record give the same
changes and the same per-statement errors on every replica, whatever its history.

- What would live in one replica's connection rather than in its file (temporary
  objects, connection pragmas), what would write the schema under the data
  (``writable_schema``), and functions of the connection's history are refused by
  SQLite's authorizer, so they fail the same everywhere (:func:`refusal_in_writes`).
- ``random()``, ``randomblob()`` and the date and time functions are replaced on the
  write connection by functions computed from the record: the leader's clock and
  seed it carries (:class:`DbRecord`), so every replica computes the leader's values
  whatever the statement's spelling.
- Every statement runs within a budget of SQLite VM steps, counted by the progress
  handler on a freshly prepared statement (SQLite's count of a cached statement
  carries over from its earlier runs): the same verdict on every replica.
- A statement's error is its result. Only a failure of this replica's own
  environment (its disk full or failing, a corrupt file, no memory) stops it,
  raising :class:`ReplicaStorageError`: after a SQLITE_FULL the disk is probed, since
  a statement also gets one when its AUTOINCREMENT counter is used up.
- Replicas are compared, not trusted to agree: each keeps the outcome of every
  record it applies (:func:`outcome_digest`: each statement's error, the rows
  changed); the leader logs a VERIFY record with its own at intervals, and a replica
  whose outcome of a record differs raises :class:`ReplicaDivergedError` naming it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from quorumlog.db import prng
from quorumlog.db.decltypes import DeclaredTypes
from quorumlog.db.decltypes import available as decltypes_available
from quorumlog.db.sql import (
    APPLIED_TABLE,
    BadRequestError,
    Params,
    Statement,
    batchable,
    explained,
    inserts_rows,
    split_sql,
    sqlite_params,
)
from quorumlog.errors import BKError
from quorumlog.log.position import Position

__all__ = [
    "BARRIER",
    "DEFAULT_READERS",
    "DEFAULT_READ_STEPS",
    "DEFAULT_STATEMENT_STEPS",
    "EXECUTE",
    "VERIFY",
    "DbRecord",
    "ReplicaDivergedError",
    "ReplicaStorageError",
    "StateMachine",
    "StatementResult",
    "refusal_in_reads",
    "refusal_in_writes",
]

RECORD_FORMAT = 1
EXECUTE = "execute"
BARRIER = "barrier"
VERIFY = "verify"
# Outcomes kept for records not verified yet: past this many, the oldest are given up
# (left unverified) rather than held without bound while no VERIFY comes.
MAX_UNVERIFIED = 100_000

# The budget of one statement in SQLite VM steps when its record names none (about 2
# to 3 s of one core). Part of the record format: every replica applies a record with
# the same budget, so a leader configured otherwise writes its own into each record.
DEFAULT_STATEMENT_STEPS = 200_000_000
# SQLite calls the progress handler every this many VM steps (at its next jump, the
# same on every replica); budgets are counted in these calls.
PROGRESS_STEPS = 10_000
DEFAULT_READ_STEPS = 200_000_000
DEFAULT_READERS = 4
_UNLIMITED = 1 << 62

# SQLite primary result codes that a fault of the machine gives (the disk, memory, the
# file): permission, busy, no memory, read-only, I/O, corrupt, full, cannot open, not a
# database. Statements get some of them too: SQLITE_FULL from an AUTOINCREMENT counter
# used up, so the disk is probed before one is blamed on it; SQLITE_CORRUPT_VTAB from a
# virtual table's own tables (replicated data); SQLITE_LOCKED (not listed) only from
# this replica's single connection, that is from the statement.
_ENVIRONMENT_CODES = frozenset({3, 5, 7, 8, 10, 11, 13, 14, 26})
_SQLITE_FULL = 13
# A SQLITE_FULL is the disk's when less than this is free in the database's directory
# (or, in SQLite's temporary directory, this plus the database's size: what a sort or
# a statement journal may take), or when a probe cannot be written and synced there.
_MIN_FREE_BYTES = 64 << 20
_PROBE_BYTES = 64 << 10
_EPOCH_STAMP = "1970-01-01 00:00:00.000"


class ReplicaStorageError(BKError):
    """The local SQLite file failed (not the statement): this replica must stop."""


class ReplicaDivergedError(ReplicaStorageError):
    """This replica's outcome of a record differs from the leader's: its file no longer
    holds what the others hold. It must stop serving (restore it from a snapshot)."""


class _TransactionEnded(Exception):
    """A statement's failure ended the whole SQLite transaction (a conflict clause, ``OR
    ROLLBACK`` or ``RAISE(ROLLBACK)``, a budget's stop, an AUTOINCREMENT counter used
    up), undoing the records applied before it in the same group."""


class _NeedsStatementKeys(Exception):
    """random() or randomblob() called inside ``executemany``, where the statement it
    belongs to, whose index keys the values drawn, is not known."""


@dataclass(frozen=True, slots=True)
class DbRecord:
    """One log record: a write request (statements, whether they form one transaction),
    a barrier (nothing to change: a strong read proves leadership with it), or a
    verification (``checks``: the leader's outcome of earlier records, by position).

    A write request also carries the leader's choices, so that every replica computes
    what the leader computed: ``now_ms``, its clock (ms since the Unix epoch), is
    'now' for the date and time functions; ``seed`` keys the values of random() and
    randomblob(); ``steps`` is the budget of each statement in SQLite VM steps, when
    not :data:`DEFAULT_STATEMENT_STEPS`. A record logged before they were carried has
    none (``now_ms`` None): it is applied with the Unix epoch as 'now', an empty seed
    and no budget, as it was applied then. ``split``: a statement string holding
    several statements runs them all (rqlite's); a record logged before that was
    offered has no mark, and such a string fails as it did then.
    """

    kind: str
    statements: tuple[Statement, ...] = ()
    transaction: bool = False
    now_ms: int | None = None
    seed: int | None = None
    steps: int | None = None
    checks: tuple[tuple[Position, str], ...] = ()
    split: bool = False

    def encode(self) -> bytes:
        """The record as JSON (the change stream's format, read by Spark as it is)."""
        body: dict[str, object] = {"v": RECORD_FORMAT, "kind": self.kind}
        if self.kind == VERIFY:
            body["checks"] = [[p.ledger_id, p.entry_id, d] for p, d in self.checks]
        if self.kind == EXECUTE:
            body["tx"] = self.transaction
            body["stmts"] = [[s.sql, s.params] for s in self.statements]
            if self.now_ms is not None:
                body["now"] = self.now_ms
                body["seed"] = self.seed or 0
            if self.steps is not None:
                body["steps"] = self.steps
            if self.split:
                body["split"] = True
            if not all(_orjson_keeps(s.params) for s in self.statements):
                return json.dumps(body, separators=(",", ":")).encode()
        try:
            return orjson.dumps(body)
        except TypeError:  # a string orjson refuses (a lone surrogate): json escapes it
            return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> DbRecord:
        try:
            # json's reach: records logged before orjson, or by the fallback in encode.
            raw = loads_json(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadRequestError(f"not a database record: {exc}") from None
        if not isinstance(raw, dict) or raw.get("v") != RECORD_FORMAT:
            raise BadRequestError("not a database record of a known format")
        kind = raw.get("kind")
        if kind == BARRIER:
            return cls(BARRIER)
        if kind == VERIFY:
            try:
                checks = tuple(
                    (Position(int(ledger_id), int(entry_id)), str(digest))
                    for ledger_id, entry_id, digest in raw.get("checks", [])
                )
            except (ValueError, TypeError) as exc:
                raise BadRequestError(f"not a verification record: {exc}") from None
            return cls(VERIFY, checks=checks)
        if kind != EXECUTE:
            raise BadRequestError(f"unknown record kind {kind!r}")
        raw_statements = raw.get("stmts", [])
        try:
            # The shape every record has (checked in one pass; from_json names what is
            # wrong otherwise): it was 40% of a follower's decoding of 100 statements.
            stmts = tuple(
                [Statement(sql, params) for sql, params in raw_statements]
                if all(
                    type(s) is list and type(s[0]) is str and type(s[1]) in (list, dict)
                    for s in raw_statements
                )
                else [Statement.from_json(s) for s in raw_statements]
            )
        except (ValueError, IndexError, TypeError):
            stmts = tuple(Statement.from_json(s) for s in raw_statements)
        now_ms, seed, steps = (_int_field(raw, name) for name in ("now", "seed", "steps"))
        if steps is not None and steps < 1:
            raise BadRequestError(f"not a budget of steps: {steps}")
        return cls(
            EXECUTE,
            stmts,
            bool(raw.get("tx", False)),
            now_ms,
            seed,
            steps,
            split=raw.get("split") is True,
        )


def _int_field(raw: dict[str, Any], name: str) -> int | None:
    value = raw.get(name)
    if value is None or (type(value) is int and -(1 << 63) <= value < (1 << 63)):
        return value
    raise BadRequestError(f"record field {name!r} is not an integer: {value!r}")


def loads_json(data: bytes) -> Any:
    """JSON text as Python values: by orjson, and by json what orjson does not read
    (NaN, Infinity, integers past 64 bits, an escaped lone surrogate), so that anything
    json reads is read. ValueError or UnicodeDecodeError (json's) if neither reads it."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def _orjson_keeps(params: Params) -> bool:
    """Whether orjson writes these parameters as json does: it writes a float that is
    not finite as null, json as NaN/Infinity (which SQLite binds as a value, not NULL)."""
    values: Iterable[object] = params.values() if isinstance(params, dict) else params
    for value in values:  # noqa: SIM110 - a loop costs a third of any() with a generator
        if type(value) is float and not math.isfinite(value):
            return False
    return True


@dataclass(slots=True)
class StatementResult:
    """What one statement did: rows (columns/values) and/or changes, or an error."""

    columns: list[str] | None = None
    types: list[str] | None = None
    values: list[list[object]] | None = None
    last_insert_id: int | None = None
    rows_affected: int | None = None
    error: str | None = None
    time_s: float = 0.0


def _type_of(value: object) -> str:
    if isinstance(value, bool | int):
        return "integer"
    if isinstance(value, float):
        return "real"
    if isinstance(value, str):
        return "text"
    if isinstance(value, bytes):
        return "blob"
    return ""


def _types(rows: list[list[object]], width: int) -> list[str]:
    """Each column's type from its first non-null value (SQLite types values, not columns)."""
    types = [""] * width
    for row in rows:
        for i, value in enumerate(row):
            if not types[i] and value is not None:
                types[i] = _type_of(value)
        if all(types):
            break
    return types


# ---------------------------------------------------------------- what SQL may do

# Pragmas whose argument names an object (or a count of errors): reads of the schema and
# of the data, the same on every replica.
_PRAGMAS_OF_OBJECTS = frozenset(
    {
        "foreign_key_check",
        "foreign_key_list",
        "index_info",
        "index_list",
        "index_xinfo",
        "integrity_check",
        "quick_check",
        "table_info",
        "table_list",
        "table_xinfo",
    }
)
# Settable in writes: kept in the file's header, inside the transaction, replicated.
_PRAGMAS_SETTABLE = frozenset({"application_id", "user_version"})
# Readable without a value: what they report is the same on every replica (the file's
# format, the schema, or settings every replica's connection has and none may change).
_PRAGMAS_READABLE = frozenset(
    {
        "application_id",
        "auto_vacuum",
        "automatic_index",
        "busy_timeout",
        "cache_size",
        "cache_spill",
        "cell_size_check",
        "checkpoint_fullfsync",
        "collation_list",
        "compile_options",
        "data_version",  # SQLite's FTS5 reads it; it changes only when others commit
        "defer_foreign_keys",
        "encoding",
        "foreign_keys",
        "fullfsync",
        "function_list",
        "hard_heap_limit",
        "ignore_check_constraints",
        "journal_mode",
        "journal_size_limit",
        "legacy_alter_table",
        "locking_mode",
        "max_page_count",
        "mmap_size",
        "module_list",
        "page_size",
        "pragma_list",
        "query_only",
        "read_uncommitted",
        "recursive_triggers",
        "reverse_unordered_selects",
        "secure_delete",
        "soft_heap_limit",
        "synchronous",
        "temp_store",
        "threads",
        "trusted_schema",
        "user_version",
        "wal_autocheckpoint",
    }
)
# Readable in reads only: this replica's file as it lies on its disk (schema_version,
# the schema's change counter, is another number in a file rebuilt from a snapshot).
_PRAGMAS_OF_THE_FILE = frozenset(
    {"database_list", "freelist_count", "page_count", "schema_version"}
)
_TEMP_ACTIONS = frozenset(
    {
        sqlite3.SQLITE_CREATE_TEMP_INDEX,
        sqlite3.SQLITE_CREATE_TEMP_TABLE,
        sqlite3.SQLITE_CREATE_TEMP_TRIGGER,
        sqlite3.SQLITE_CREATE_TEMP_VIEW,
        sqlite3.SQLITE_DROP_TEMP_INDEX,
        sqlite3.SQLITE_DROP_TEMP_TABLE,
        sqlite3.SQLITE_DROP_TEMP_TRIGGER,
        sqlite3.SQLITE_DROP_TEMP_VIEW,
    }
)
# What may look at the temporary schema (always empty, since nothing may be created in
# it): SQLAlchemy's dialect asks ``PRAGMA temp.table_info(t)`` before creating t.
_LOOKING_ACTIONS = frozenset({sqlite3.SQLITE_READ, sqlite3.SQLITE_PRAGMA})
_CHANGING_ACTIONS = frozenset(
    {
        sqlite3.SQLITE_INSERT,
        sqlite3.SQLITE_UPDATE,
        sqlite3.SQLITE_DELETE,
        sqlite3.SQLITE_DROP_TABLE,
        sqlite3.SQLITE_ALTER_TABLE,
        sqlite3.SQLITE_CREATE_INDEX,
        sqlite3.SQLITE_CREATE_TRIGGER,
    }
)
# Functions of the connection's history (a replica that restarted has another one), of
# where rows lie in this replica's file, or loading code.
_CONNECTION_FUNCTIONS = frozenset(
    {"changes", "last_insert_rowid", "load_extension", "sqlite_offset", "total_changes"}
)
# Eponymous virtual tables describing this replica's file or connection.
_CONNECTION_TABLES = frozenset({"dbstat", "sqlite_stmt"})
# Virtual table modules whose tables are made of ordinary (replicated) tables.
_REPLICATED_MODULES = frozenset(
    {"fts3", "fts4", "fts4aux", "fts5", "fts5vocab", "geopoly", "rtree", "rtree_i32"}
)
_TEMP_REASON = (
    "temporary tables, views, triggers and indexes live in one replica's SQLite "
    "connection, not in its file (a restart loses them)"
)
_TRANSACTION_REASON = "each request is a transaction of its own (use ?transaction)"
_ATTACH_REASON = "ATTACH and DETACH reach files outside the replica"


def _pragma_refusal(name: str | None, value: str | None, db: str | None, *, writes: bool) -> str:
    """Why ``PRAGMA name[=value]`` is refused ("" when it is not)."""
    pragma = (name or "").lower()
    if value is None:
        if pragma in _PRAGMAS_READABLE or pragma in _PRAGMAS_OF_OBJECTS:
            return ""
        if not writes and pragma in _PRAGMAS_OF_THE_FILE:
            return ""
    elif pragma in _PRAGMAS_OF_OBJECTS or (
        writes and pragma in _PRAGMAS_SETTABLE and db in (None, "main")
    ):
        return ""
    shown = pragma if value is None else f"{pragma}={value}"
    if writes:
        return (
            f"PRAGMA {shown} is refused in writes: it sets or reports one replica's "
            "connection or file, or rewrites SQLite's own structures, not replicated data"
        )
    return f"PRAGMA {shown} is refused in reads: reads share their connections"


def refusal_in_writes(action: int, arg1: str | None, arg2: str | None, db: str | None) -> str:
    """Why SQLite's authorizer refuses this action of a statement in a write record
    ("" when it allows it): the same verdict on every replica, since it depends only
    on the statement and the schema."""
    if action in _TEMP_ACTIONS or (db == "temp" and action not in _LOOKING_ACTIONS):
        return _TEMP_REASON
    if action == sqlite3.SQLITE_READ or action in _CHANGING_ACTIONS:
        table = (arg1 or "").lower()
        if table == APPLIED_TABLE:
            return f"{APPLIED_TABLE} is the replica's own table"
        if action == sqlite3.SQLITE_READ and table in _CONNECTION_TABLES:
            return f"{table} describes one replica's file or connection, not replicated data"
        return ""
    if action == sqlite3.SQLITE_FUNCTION:
        function = (arg2 or "").lower()
        if function in _CONNECTION_FUNCTIONS:
            return (
                f"{function}() depends on one replica's connection or file, not on the "
                "replicated data (use RETURNING)"
            )
        return ""
    if action == sqlite3.SQLITE_PRAGMA:
        return _pragma_refusal(arg1, arg2, db, writes=True)
    if action in (sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT):
        return _TRANSACTION_REASON
    if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
        return _ATTACH_REASON
    if action == sqlite3.SQLITE_CREATE_VTABLE and (arg2 or "").lower() not in _REPLICATED_MODULES:
        return f"virtual tables of module {arg2} are not made of replicated tables"
    return ""


def refusal_in_reads(action: int, arg1: str | None, arg2: str | None, db: str | None) -> str:
    """Why the authorizer refuses this action of a read ("" when it allows it): nothing
    may change the pooled read connections for the reads after it."""
    if action in _TEMP_ACTIONS or (db == "temp" and action not in _LOOKING_ACTIONS):
        return _TEMP_REASON
    if action == sqlite3.SQLITE_PRAGMA:
        return _pragma_refusal(arg1, arg2, db, writes=False)
    if action in (sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT):
        return "each read runs in a transaction of its own"
    if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
        return _ATTACH_REASON
    return ""


def _refused_message(exc: BaseException, refusal: str) -> str:
    """The error of a statement, with why the authorizer refused it (SQLite says only
    'not authorized', or 'access to T.C is prohibited' for a column)."""
    message = str(exc)
    if refusal and ("not authorized" in message or "prohibited" in message):
        return f"not authorized: {refusal}"
    return message


def _budget_message(steps: int) -> str:
    return (
        f"stopped after {steps} steps of SQLite's virtual machine: over the budget of a statement"
    )


# ---------------------------------------------------------------- the record's clock

# name: (indexes of its time values, where a missing time value means now (None:
# never), index of its first modifier)
_CLOCK_FUNCTIONS: dict[str, tuple[tuple[int, ...], int | None, int]] = {
    "date": ((0,), 0, 1),
    "time": ((0,), 0, 1),
    "datetime": ((0,), 0, 1),
    "julianday": ((0,), 0, 1),
    "unixepoch": ((0,), 0, 1),
    "strftime": ((1,), 1, 2),
    "timediff": ((0, 1), None, 2),
}
_SqlValue = str | bytes | int | float | None
_CURRENT_FUNCTIONS = {
    "current_timestamp": "datetime",
    "current_date": "date",
    "current_time": "time",
}


def _is_text(value: object, *words: str) -> bool:
    """Whether ``value`` is one of ``words`` as SQLite compares them (ASCII, any case),
    as text or as a blob read as text."""
    if type(value) is bytes:
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return False
    return type(value) is str and value.isascii() and value.lower() in words


def outcome_digest(statements: int, errors: Iterable[str], rows_changed: int) -> str:
    """What applying a record did, in 8 hex digits: how many statements ran, each
    failure's message (in order), and the rows the statements that succeeded changed.
    A follower applies records with ``executemany`` and builds no per-statement
    results, so only what both ways know goes in: the same file and record give the
    same digest on every replica (R19); a replica whose file differs gives another as
    soon as a record changes, or fails on, a row that differs."""
    h = hashlib.blake2b(b"%d/%d" % (statements, rows_changed), digest_size=4)
    for error in errors:
        h.update(b"\x00")
        h.update(error.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _outcome_of(results: Sequence[StatementResult]) -> str:
    return outcome_digest(
        len(results),
        [r.error for r in results if r.error is not None],
        sum(r.rows_affected or 0 for r in results if r.error is None),
    )


def _stamp(now_ms: int) -> str:
    """``now_ms`` as SQLite reads a time: ``YYYY-MM-DD HH:MM:SS.SSS``, UTC (a text time
    keeps the milliseconds of 'now' exactly)."""
    seconds, millis = divmod(now_ms, 1000)
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(seconds))}.{millis:03d}"


def _sqlite_temp_dir() -> Path:
    """Where SQLite's unix VFS puts temporary files (sorts, statement journals)."""
    for candidate in (
        os.environ.get("SQLITE_TMPDIR"),
        os.environ.get("TMPDIR"),
        "/var/tmp",
        "/usr/tmp",
        "/tmp",
    ):
        if candidate and os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK):
            return Path(candidate)
    return Path(".")


class StateMachine:
    """One replica's SQLite file (``path``) and the position applied into it.

    Writes go through one connection, used by one thread at a time (the replica's
    SQLite thread); reads through a pool of up to ``readers`` read-only connections,
    each read statement within ``read_steps`` steps of SQLite's virtual machine.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        readers: int = DEFAULT_READERS,
        read_steps: int = DEFAULT_READ_STEPS,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode: every transaction is begun and ended here explicitly. No
        # statement cache: SQLite counts a cached statement's VM steps over all its
        # runs, so the progress handler would reach a statement's budget at a point
        # that depends on what this replica ran before (a fresh one: the same point on
        # every replica). It also has the authorizer see every statement as it runs.
        self._conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, cached_statements=0
        )
        self._conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL: a commit may be lost at a power loss (never at a process kill); the
        # position goes with it, so the replica re-applies those records from the log.
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute(
            f"CREATE TABLE IF NOT EXISTS {APPLIED_TABLE} ("
            "id INTEGER PRIMARY KEY CHECK (id = 1), ledger_id INTEGER NOT NULL, "
            "entry_id INTEGER NOT NULL)"
        )
        row = self._conn.execute(f"SELECT ledger_id, entry_id FROM {APPLIED_TABLE}").fetchone()
        self._applied: Position | None = None if row is None else Position(row[0], row[1])
        # One cursor for every write statement: conn.execute made one per statement.
        self._writes = self._conn.cursor()
        # The statement being run for a record (None: the machine's own statements,
        # which the authorizer and the budget leave alone).
        self._user = False
        self._refusal = ""
        self._ticks = 0
        self._tick_limit = _UNLIMITED
        self._stopped = False
        # The record being applied: its clock, seed and budget.
        self._now_ms = 0
        self._stamp_of: tuple[int, str] = (0, _EPOCH_STAMP)
        self._seed = b""
        self._record_ticks = _UNLIMITED
        self._statement_index = 0
        self._calls = 0
        self._keyless = False
        self._split = False  # the record's: several statements in a string all run
        # SQLite's own date and time functions, fed the record's time for 'now'.
        self._clock = sqlite3.connect(":memory:", check_same_thread=False)
        self._max_blob_bytes = self._conn.getlimit(sqlite3.SQLITE_LIMIT_LENGTH)
        self._install_functions()
        self._conn.set_authorizer(self._authorize)
        self._conn.set_progress_handler(self._progress, PROGRESS_STEPS)
        self._readers = _ReaderPool(self.path, readers, read_steps)
        # The outcome of each record applied since the last VERIFY (in log order), and
        # of the records run ahead, whose positions are not known yet.
        self._outcomes: dict[Position, str] = {}
        self._outcomes_ahead: list[str] = []
        # The last record whose outcome a VERIFY confirmed (None: none since start).
        self.verified: Position | None = None

    @property
    def applied(self) -> Position | None:
        """The position of the last record applied (None before the first)."""
        return self._applied

    def unverified(self, after: Position | None, limit: int) -> list[tuple[Position, str]]:
        """Up to ``limit`` outcomes of records past ``after`` not verified yet, in log
        order: what the leader's next VERIFY record carries."""
        out: list[tuple[Position, str]] = []
        for position, digest in self._outcomes.items():
            if after is None or position > after:
                out.append((position, digest))
                if len(out) >= limit:
                    break
        return out

    def _note_outcome(self, position: Position, digest: str) -> None:
        outcomes = self._outcomes
        outcomes[position] = digest
        if len(outcomes) > MAX_UNVERIFIED:
            del outcomes[next(iter(outcomes))]

    def _verify(self, position: Position, record: DbRecord) -> None:
        """Compare the leader's outcomes in VERIFY ``record`` (at ``position``) with this
        replica's; raises ReplicaDivergedError at the first that differs. Records this
        replica did not apply since it started (before a restart, or restored from a
        snapshot) are passed over."""
        outcomes = self._outcomes
        for checked, theirs in record.checks:
            ours = outcomes.get(checked)
            if ours is None:
                continue
            if ours != theirs:
                raise ReplicaDivergedError(
                    f"database {self.path}: the record at {checked} had another outcome "
                    f"here than on the leader (outcome {ours}, the leader's {theirs}; "
                    f"verified by the record at {position}): this replica's file has "
                    f"diverged from the others since the record verified before it "
                    f"({self.verified}); it stops serving. Restore it from a snapshot "
                    f"(remove its file and restart it)"
                )
            self.verified = checked
        if record.checks:
            last = record.checks[-1][0]
            for applied in [p for p in outcomes if p <= last]:
                del outcomes[applied]

    def close(self) -> None:
        """Close the file; waits for the reads running (each within its budget)."""
        self._readers.close()
        self._writes.close()
        self._conn.close()
        self._clock.close()

    # ------------------------------------------------------------ writes

    def apply(
        self, position: Position, record: DbRecord, *, results_wanted: bool = True
    ) -> list[StatementResult] | None:
        """Apply ``record`` found at ``position``; its results, or None when the position
        was applied already (a record is never applied twice)."""
        return self.apply_group([(position, record)], results_wanted=results_wanted)[0]

    def apply_group(
        self, records: Sequence[tuple[Position, DbRecord]], *, results_wanted: bool = True
    ) -> list[list[StatementResult] | None]:
        """Apply consecutive records (in log order) in one SQLite transaction that ends
        by storing the last one's position: group commit. A replica killed meanwhile has
        all of the group or none of it and resumes after the stored position, so the
        group's bounds, which differ between replicas, change nothing in the file.

        Each record keeps its own savepoints, so its statements fail and roll back
        exactly as when applied alone. The results, one list per record (None for a
        position applied already), are what applying each alone would give; with
        ``results_wanted`` False (a follower: nobody reads them) they are empty lists,
        and runs of one INSERT/UPDATE/DELETE text go to SQLite's ``executemany``.
        """
        return self._apply_group(records, quick=not results_wanted)

    def _apply_group(
        self, records: Sequence[tuple[Position, DbRecord]], *, quick: bool
    ) -> list[list[StatementResult] | None]:
        applied = self._applied
        fresh = [(p, r) for p, r in records if applied is None or p > applied]
        out: list[list[StatementResult] | None] = [None] * (len(records) - len(fresh))
        if not fresh:
            return out
        conn = self._conn
        results: list[list[StatementResult] | None] = []
        grouped = len(fresh) > 1
        try:
            conn.execute("BEGIN IMMEDIATE")
            # Outcomes are noted as records run: a VERIFY later in the group checks them.
            # Should the group be undone, each record is applied again and noted again.
            for position, record in fresh:
                if record.kind == VERIFY:
                    self._verify(position, record)
                if record.kind != EXECUTE:
                    results.append([])
                elif quick:
                    self._note_outcome(position, self._run_quietly(record, grouped=grouped))
                    results.append([])
                else:
                    done = self._run_writes(record, grouped=grouped)
                    self._note_outcome(position, _outcome_of(done))
                    results.append(done)
            last = fresh[-1][0]
            conn.execute(
                f"INSERT OR REPLACE INTO {APPLIED_TABLE} (id, ledger_id, entry_id) "
                "VALUES (1, ?, ?)",
                last,
            )
            conn.execute("COMMIT")
        except _TransactionEnded:
            self._roll_back()
            # The earlier records of the group (or of the record) were undone with it:
            # apply each record in a transaction of its own instead, statement by
            # statement, as the record itself asks.
            alone = [self._apply_group([(p, r)], quick=False)[0] for p, r in fresh]
            return out + ([[] for _ in alone] if quick else alone)
        except (sqlite3.Error, ReplicaStorageError) as exc:
            self._roll_back()
            if isinstance(exc, ReplicaStorageError):
                raise
            raise ReplicaStorageError(
                f"database {self.path}: cannot apply the records at {fresh[0][0]}"
                f"..{fresh[-1][0]}: {exc}"
            ) from exc
        self._applied = last
        return out + results

    def _roll_back(self) -> None:
        """End the transaction open, if any, after a failure (reported by the caller)."""
        if self._conn.in_transaction:
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                raise ReplicaStorageError(f"database {self.path}: cannot roll back: {exc}") from exc

    # The leader runs its records while their appends are in flight (execute_ahead),
    # so applying them no longer waits for the log's round trip; the transaction is
    # committed with its position once every one of them is confirmed (commit_ahead),
    # or rolled back (abandon_ahead) if any is not.

    def execute_ahead(self, records: Sequence[DbRecord]) -> list[list[StatementResult]] | None:
        """Run ``records`` (the next ones in log order, positions not known yet) in a
        SQLite transaction left open: each one's results, or None when a statement's
        failure ended the transaction (nothing of them is left: apply them with
        :meth:`apply_group` once their positions are known). Nothing is committed
        until :meth:`commit_ahead`; readers see none of it before."""
        conn = self._conn
        self._outcomes_ahead = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            out: list[list[StatementResult]] = []
            for record in records:
                if record.kind == EXECUTE:
                    done = self._run_writes(record, grouped=True)
                    self._outcomes_ahead.append(_outcome_of(done))
                    out.append(done)
                else:
                    # A VERIFY is checked when applied with its position (commit_ahead).
                    self._outcomes_ahead.append("")
                    out.append([])
            return out
        except _TransactionEnded:
            self._roll_back()
            return None
        except (sqlite3.Error, ReplicaStorageError) as exc:
            self._roll_back()
            if isinstance(exc, ReplicaStorageError):
                raise
            raise ReplicaStorageError(f"database {self.path}: cannot apply: {exc}") from exc

    def commit_ahead(self, positions: Sequence[Position], records: Sequence[DbRecord]) -> None:
        """Commit what :meth:`execute_ahead` ran (``records``, found at ``positions``)."""
        last = positions[-1]
        if self._applied is not None and last <= self._applied:
            self.abandon_ahead()
            raise ReplicaStorageError(f"database {self.path}: {last} is applied already")
        conn = self._conn
        try:
            for position, record, digest in zip(
                positions, records, self._outcomes_ahead, strict=False
            ):
                if record.kind == VERIFY:
                    self._verify(position, record)
                elif digest:
                    self._note_outcome(position, digest)
        except ReplicaDivergedError:
            self._roll_back()
            raise
        try:
            conn.execute(
                f"INSERT OR REPLACE INTO {APPLIED_TABLE} (id, ledger_id, entry_id) "
                "VALUES (1, ?, ?)",
                last,
            )
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._roll_back()
            raise ReplicaStorageError(
                f"database {self.path}: cannot commit the records up to {last}: {exc}"
            ) from exc
        self._applied = last
        self._outcomes_ahead = []

    def abandon_ahead(self) -> None:
        """Roll back what :meth:`execute_ahead` ran (some append was not confirmed)."""
        self._roll_back()

    def _run_quietly(self, record: DbRecord, *, grouped: bool) -> str:
        """Apply ``record`` without results: runs of one batchable statement text (an
        INSERT of many rows) in one ``executemany``, the whole record in one savepoint.
        If every statement succeeds, the file is what running them one by one gives;
        if any fails, the savepoint is rolled back and the record run statement by
        statement instead (:meth:`_run_writes`), so failures behave exactly as alone.

        The budget of a run's statements is counted over the whole run (its steps
        are at least any one statement's): a run that reaches it is run statement by
        statement, each against the budget alone. random() and randomblob() cannot
        tell which statement of a run calls them: such a run goes that way too.

        Returns the record's outcome (:func:`outcome_digest`).
        """
        conn = self._conn
        statements = record.statements
        self._enter_record(record)
        conn.execute("SAVEPOINT quick")
        rows_changed = 0
        try:
            start = 0
            while start < len(statements):
                sql = statements[start].sql
                end = start + 1
                if batchable(sql):
                    while end < len(statements) and statements[end].sql == sql:
                        end += 1
                self._begin_statement(start, keyless=end - start > 1)
                try:
                    if end - start > 1:
                        writes = self._writes
                        writes.executemany(
                            sql, [sqlite_params(s.params) for s in statements[start:end]]
                        )
                        # The sum over the run: each statement's own, as alone.
                        rows_changed += max(writes.rowcount, 0)
                    else:
                        alone = self._run_one(
                            self._writes, statements[start], self._changes, split=self._split
                        )
                        rows_changed += alone.rows_affected or 0
                finally:
                    self._end_statement()
                start = end
        except (sqlite3.Error, OverflowError, ValueError) as exc:
            # Whatever failed (the statement, or this replica's disk) is found out by
            # running the record the ordinary way, which tells the two apart.
            if not conn.in_transaction:
                # The failure ended the transaction (and this savepoint): the group is
                # applied again record by record, each statement by statement.
                raise _TransactionEnded from exc
            conn.execute("ROLLBACK TO quick")
            conn.execute("RELEASE quick")
            return _outcome_of(self._run_writes(record, grouped=grouped))
        conn.execute("RELEASE quick")
        return outcome_digest(len(statements), (), rows_changed)

    def _run_writes(self, record: DbRecord, *, grouped: bool) -> list[StatementResult]:
        conn = self._conn
        statements = record.statements
        results: list[StatementResult] = []
        self._enter_record(record)
        if record.transaction:
            conn.execute("SAVEPOINT request")
        for index, statement in enumerate(statements):
            if not record.transaction:
                conn.execute("SAVEPOINT statement")
            started = time.perf_counter()
            try:
                result = self._run_statement(statement, index)
            except (sqlite3.Error, OverflowError, ValueError) as exc:
                error = StatementResult(error=self._failure_of(exc))
                error.time_s = time.perf_counter() - started
                results.append(error)
                if not conn.in_transaction:
                    # The failure ended the whole transaction (an OR ROLLBACK conflict,
                    # a budget's stop, SQLITE_FULL): that happens the same way on every
                    # replica. Go on in a new one (unless other records of a group went
                    # with it: then they are applied again alone).
                    if grouped:
                        raise _TransactionEnded from exc
                    conn.execute("BEGIN IMMEDIATE")
                    if record.transaction:
                        break
                    # The statements before it were undone too: run again those that
                    # succeeded, as each statement alone (rqlite's) would have kept them.
                    for again, done in enumerate(results[:-1]):
                        if done.error is None:
                            self._run_statement(statements[again], again)
                    continue
                if record.transaction:
                    conn.execute("ROLLBACK TO request")
                    conn.execute("RELEASE request")
                    break
                conn.execute("ROLLBACK TO statement")
                conn.execute("RELEASE statement")
                continue
            result.time_s = time.perf_counter() - started
            results.append(result)
            if not record.transaction:
                conn.execute("RELEASE statement")
        else:
            if record.transaction:
                conn.execute("RELEASE request")
        return results

    def _run_statement(self, statement: Statement, index: int) -> StatementResult:
        """Run the record's statement number ``index`` under the authorizer's rules and
        the record's budget."""
        self._begin_statement(index, keyless=False)
        try:
            return self._run_one(self._writes, statement, self._changes, split=self._split)
        finally:
            self._end_statement()

    def _failure_of(self, exc: Exception) -> str:
        """The error result of a statement that raised ``exc``; raises
        ReplicaStorageError when the fault is this replica's own environment."""
        if isinstance(exc, sqlite3.Error):
            fault = self._environment_fault(exc)
            if fault is not None:
                raise ReplicaStorageError(f"database {self.path}: {fault}") from exc
            if self._stopped:
                return _budget_message(self._record_ticks * PROGRESS_STEPS)
        return _refused_message(exc, self._refusal)

    def _environment_fault(self, exc: sqlite3.Error) -> str | None:
        """Why ``exc`` is a fault of this replica's environment (None: the statement's,
        which every replica meets the same way)."""
        code = getattr(exc, "sqlite_errorcode", None)
        if code is None or code == sqlite3.SQLITE_CORRUPT_VTAB:
            return None
        primary = code & 0xFF
        if primary not in _ENVIRONMENT_CODES:
            return None
        if primary == _SQLITE_FULL:
            fault = self._disk_fault()
            return None if fault is None else f"{exc}: {fault}"
        return str(exc)

    def _disk_fault(self) -> str | None:
        """Why this replica's disk cannot take a statement's writes (None: it can):
        free space, and a probe written and synced, in the database's directory and
        in SQLite's temporary one."""
        try:
            size = sum(
                Path(f"{self.path}{suffix}").stat().st_size
                for suffix in ("", "-wal")
                if Path(f"{self.path}{suffix}").exists()
            )
            for directory, wanted in (
                (self.path.parent, _MIN_FREE_BYTES),
                (_sqlite_temp_dir(), _MIN_FREE_BYTES + size),
            ):
                usage = os.statvfs(directory)
                free = usage.f_bavail * usage.f_frsize
                if free < wanted:
                    return f"{directory}: {free} bytes free, fewer than {wanted}"
                fd, probe = tempfile.mkstemp(prefix=".quorumlog-probe-", dir=directory)
                try:
                    os.write(fd, bytes(_PROBE_BYTES))
                    os.fsync(fd)
                finally:
                    os.close(fd)
                    os.unlink(probe)
        except OSError as exc:
            return f"the disk fails: {exc}"
        return None

    @staticmethod
    def _run_one(
        on: sqlite3.Connection | sqlite3.Cursor,
        statement: Statement,
        changes: Callable[[], int] | None = None,
        *,
        split: bool = True,
    ) -> StatementResult:
        """Run one statement. ``changes`` (on the write connection) gives SQLite's count
        of the rows the last statement changed, for those Python does not count. With
        ``split``, a string of several statements runs them all, in order; its result
        is its last statement's (a failure of any fails the string)."""
        connection = on if isinstance(on, sqlite3.Connection) else on.connection
        sql = statement.sql
        params = sqlite_params(statement.params)
        if split and ";" in sql:
            *before_last, sql = split_sql(sql)
            for piece in before_last:
                earlier = on.execute(piece, params)
                if earlier.description is not None:
                    earlier.fetchall()
        before = connection.total_changes
        cursor = on.execute(sql, params)
        result = StatementResult()
        if cursor.description is not None:
            rows = [list(r) for r in cursor.fetchall()]
            result.columns = [d[0] for d in cursor.description]
            result.types = _types(rows, len(result.columns))
            result.values = rows
        counted = cursor.rowcount
        if counted < 0 and changes is not None and connection.total_changes != before:
            # Python counts rows only after a first word INSERT, UPDATE, DELETE or
            # REPLACE; a WITH ... INSERT changed rows too, and SQLite knows how many.
            counted = changes()
        result.rows_affected = max(counted, 0)
        if cursor.lastrowid and result.rows_affected and inserts_rows(sql):
            result.last_insert_id = cursor.lastrowid
        return result

    # ------------------------------------------------------------ a record's context

    def _enter_record(self, record: DbRecord) -> None:
        self._split = record.split
        if record.now_ms is None:  # logged before records carried the leader's choices
            self._now_ms, self._seed, self._record_ticks = 0, b"", _UNLIMITED
            return
        self._now_ms = record.now_ms
        self._seed = b"%d" % (record.seed or 0)
        steps = record.steps or DEFAULT_STATEMENT_STEPS
        self._record_ticks = max(1, steps // PROGRESS_STEPS)

    def _begin_statement(self, index: int, *, keyless: bool) -> None:
        self._user = True
        self._refusal = ""
        self._ticks = 0
        self._stopped = False
        self._tick_limit = self._record_ticks
        self._statement_index = index
        self._calls = 0
        self._keyless = keyless
        # SQLite's own draws (a rowid chosen at random) repeat on every replica too.
        prng.seed_for_statement(self._seed, index)

    def _end_statement(self) -> None:
        self._user = False
        self._tick_limit = _UNLIMITED
        self._keyless = False

    def _changes(self) -> int:
        """SQLite's count of the rows the statement just run changed (the machine's own
        question: not one a statement may ask, so not checked)."""
        user, self._user = self._user, False
        try:
            return int(self._conn.execute("SELECT changes()").fetchone()[0])
        finally:
            self._user = user

    def _authorize(
        self, action: int, arg1: str | None, arg2: str | None, db: str | None, _trigger: str | None
    ) -> int:
        if not self._user:
            return sqlite3.SQLITE_OK
        refusal = refusal_in_writes(action, arg1, arg2, db)
        if not refusal:
            return sqlite3.SQLITE_OK
        if not self._refusal:
            self._refusal = refusal
        return sqlite3.SQLITE_DENY

    def _progress(self) -> int:
        self._ticks += 1
        if self._ticks < self._tick_limit:
            return 0
        self._stopped = True
        return 1  # SQLite stops the statement (SQLITE_INTERRUPT)

    def _install_functions(self) -> None:
        """random(), randomblob() and the date and time functions of the write
        connection, computed from the record (built-in ones may be overridden)."""
        conn = self._conn
        conn.create_function("random", 0, self._random)
        conn.create_function("randomblob", 1, self._randomblob)
        for name, (times, missing, modifiers) in _CLOCK_FUNCTIONS.items():
            try:
                self._clock.execute(f"SELECT {name}({', '.join(['0'] * max(len(times), 1))})")
            except sqlite3.Error:
                continue  # not in this SQLite (timediff came in 3.43)
            arity = 2 if name == "timediff" else -1
            conn.create_function(
                name,
                arity,
                self._clock_function(name, times, missing, modifiers),
                deterministic=True,
            )
        for name, builtin in _CURRENT_FUNCTIONS.items():
            conn.create_function(
                name, 0, self._clock_function(builtin, (0,), 0, 1), deterministic=True
            )

    def _draw(self, size: int) -> bytes:
        """``size`` bytes for call number n of statement number i of the record: keyed
        by (seed, i, n), so a statement run again (a group applied again record by
        record, a statement kept again after another ended the transaction) draws the
        same values, the same on every replica."""
        if self._keyless:
            raise _NeedsStatementKeys
        self._calls += 1
        key = b"%b:%d:%d" % (self._seed, self._statement_index, self._calls)
        return hashlib.shake_256(key).digest(size)

    def _random(self) -> int:
        return int.from_bytes(self._draw(8), "little", signed=True)

    def _randomblob(self, size: object) -> bytes:
        count = self._as_int64(size)
        if count > self._max_blob_bytes:
            raise OverflowError("string or blob too big")
        return self._draw(max(count, 1))

    def _as_int64(self, value: object) -> int:
        """``value`` as SQLite's sqlite3_value_int64 reads it."""
        if type(value) is int:
            return value
        if value is None:
            return 0
        row = self._clock.execute("SELECT CAST(? AS INTEGER)", (value,)).fetchone()
        return int(row[0] or 0)

    def _clock_function(
        self, name: str, times: tuple[int, ...], missing: int | None, modifiers: int
    ) -> Callable[..., _SqlValue]:
        """SQLite's ``name`` with the record's time for 'now' (and for a time value left
        out), and the modifiers 'localtime' and 'utc' read as if every replica's time
        zone were UTC (they read the zone of the replica that runs them)."""
        calls: dict[int, str] = {}

        def call(*args: _SqlValue) -> _SqlValue:
            values = list(args)
            if len(values) == missing:
                values.append("now")
            for i in times:
                if i < len(values) and _is_text(values[i], "now"):
                    values[i] = self._record_stamp()
            for i in range(modifiers, len(values)):
                if _is_text(values[i], "localtime", "utc"):
                    values[i] = "+0 seconds"
            sql = calls.get(len(values))
            if sql is None:
                sql = calls[len(values)] = f"SELECT {name}({', '.join(['?'] * len(values))})"
            value: _SqlValue = self._clock.execute(sql, values).fetchone()[0]
            return value

        return call

    def _record_stamp(self) -> str:
        now_ms, stamp = self._stamp_of
        if now_ms != self._now_ms:
            stamp = _stamp(self._now_ms)
            self._stamp_of = (self._now_ms, stamp)
        return stamp

    # ------------------------------------------------------------ reads

    def query(
        self,
        statements: list[Statement],
        *,
        qualify_columns: bool = False,
        timeout_s: float | None = None,
    ) -> list[StatementResult]:
        """Run read-only statements on one snapshot of the committed data, on one of the
        pool's connections. A statement that tries to write fails with SQLite's
        read-only error; one over the read budget (or ``timeout_s``) is stopped.
        ``qualify_columns``: a column read from a table is named ``table.column``."""
        reader = self._readers.acquire()
        try:
            return reader.run(statements, qualify_columns=qualify_columns, timeout_s=timeout_s)
        finally:
            self._readers.release(reader)

    def read_only(self, statements: list[Statement]) -> bool:
        """Whether every statement only reads, by SQLite's verdict (:meth:`_Reader.read_only`),
        on one of the pool's connections."""
        reader = self._readers.acquire()
        try:
            return all(reader.read_only(s) for s in statements)
        finally:
            self._readers.release(reader)

    def dump(self) -> list[str]:
        """The file's contents as SQL text (``iterdump``), for comparing replicas."""
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        try:
            return list(conn.iterdump())
        finally:
            conn.close()

    def size_bytes(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0


class _Reader:
    """One read-only connection of the pool, with its own refusals and budget."""

    def __init__(self, path: Path, steps: int) -> None:
        self.conn = sqlite3.connect(
            f"file:{path}?mode=ro",
            uri=True,
            isolation_level=None,
            check_same_thread=False,
            cached_statements=0,
        )
        self._limit = max(1, steps // PROGRESS_STEPS)
        self._user = False
        self._refusal = ""
        self._ticks = 0
        self._stopped = False
        self._deadline: float | None = None
        self._timed_out = False
        self.conn.set_authorizer(self._authorize)
        self.conn.set_progress_handler(self._progress, PROGRESS_STEPS)
        prng.install_read_functions(self.conn)  # reads leave SQLite's generator alone
        # rqlite's types are the columns' declared types (SQLite's), where it can tell.
        self._declared = DeclaredTypes(path) if decltypes_available() else None

    def _authorize(
        self, action: int, arg1: str | None, arg2: str | None, db: str | None, _trigger: str | None
    ) -> int:
        if not self._user:
            return sqlite3.SQLITE_OK
        refusal = refusal_in_reads(action, arg1, arg2, db)
        if not refusal:
            return sqlite3.SQLITE_OK
        if not self._refusal:
            self._refusal = refusal
        return sqlite3.SQLITE_DENY

    def _progress(self) -> int:
        if not self._user:
            return 0
        self._ticks += 1
        if self._deadline is not None and time.monotonic() >= self._deadline:
            self._timed_out = True
            return 1
        if self._ticks < self._limit:
            return 0
        self._stopped = True
        return 1

    def run(
        self,
        statements: list[Statement],
        *,
        qualify_columns: bool = False,
        timeout_s: float | None = None,
    ) -> list[StatementResult]:
        """Run the statements in one read transaction; each within the read budget of
        steps and, with ``timeout_s`` (rqlite's ``db_timeout``), that much time."""
        conn = self.conn
        results: list[StatementResult] = []
        conn.execute("BEGIN")
        try:
            schema_version = (
                None
                if self._declared is None
                else int(conn.execute("PRAGMA schema_version").fetchone()[0])
            )
            for statement in statements:
                started = time.perf_counter()
                self._user, self._refusal, self._ticks, self._stopped = True, "", 0, False
                self._timed_out = False
                self._deadline = None if timeout_s is None else time.monotonic() + timeout_s
                try:
                    result = StateMachine._run_one(conn, statement)
                    result.rows_affected = None
                    result.last_insert_id = None
                    if result.columns is not None and schema_version is not None:
                        self._declare_types(result, statement, schema_version, qualify_columns)
                except (sqlite3.Error, OverflowError, ValueError) as exc:
                    if self._timed_out:
                        message = f"query timed out: over the db_timeout of {timeout_s} s"
                    elif self._stopped:
                        message = _budget_message(self._limit * PROGRESS_STEPS)
                    else:
                        message = _refused_message(exc, self._refusal)
                    result = StatementResult(error=message)
                finally:
                    self._user = False
                    self._deadline = None
                result.time_s = time.perf_counter() - started
                results.append(result)
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")
        return results

    def _declare_types(
        self,
        result: StatementResult,
        statement: Statement,
        schema_version: int,
        qualify_columns: bool = False,
    ) -> None:
        """``result.types`` from the columns' declared types. A column without one (an
        expression, a column declared with no type) gets its values' storage class if
        they all have the same one, else "" (a client converting by type must not be
        told ``real`` for a column that also holds text)."""
        assert self._declared is not None and result.columns is not None
        described = self._declared.describe(split_sql(statement.sql)[-1], schema_version)
        if described is None or len(described[0]) != len(result.columns):
            return
        declared, tables = described
        if qualify_columns:  # rqlite's: "table.column" for a column read from a table
            result.columns = [
                f"{table}.{name}" if table else name
                for table, name in zip(tables, result.columns, strict=True)
            ]
        rows = result.values or []
        types = []
        for index, name in enumerate(declared):
            if not name:
                classes = {_type_of(row[index]) for row in rows if row[index] is not None}
                name = classes.pop() if len(classes) == 1 else ""
            types.append(name)
        result.types = types

    def read_only(self, statement: Statement) -> bool:
        """SQLite's own verdict on whether ``statement`` only reads, with
        ``sqlite3_stmt_readonly``'s rules: it is compiled (``EXPLAIN``, which runs
        nothing) against this replica's schema, and it writes if its program opens a
        write transaction or vacuums, checkpoints or changes the journal mode.
        False when it cannot be compiled here (a table this replica does not have yet):
        the leader then runs it, as a write."""
        for piece in split_sql(statement.sql):
            try:
                rows = self.conn.execute(
                    "EXPLAIN " + explained(piece), sqlite_params(statement.params)
                ).fetchall()
            except (sqlite3.Error, OverflowError, ValueError):
                return False
            for row in rows:
                opcode = row[1]
                if opcode == "Transaction" and row[3] != 0:
                    return False
                if opcode in _WRITING_OPCODES:
                    return False
        return True

    def close(self) -> None:
        self.conn.close()
        if self._declared is not None:
            self._declared.close()


# Opcodes that make a statement a writer in sqlite3_stmt_readonly's sense (besides a
# Transaction opcode that opens a write transaction).
_WRITING_OPCODES = frozenset({"Vacuum", "JournalMode", "Checkpoint"})


class _ReaderPool:
    """Up to ``size`` read-only connections, opened as reads need them; closing waits
    for the reads running."""

    def __init__(self, path: Path, size: int, steps: int) -> None:
        self._path = path
        self._size = max(1, size)
        self._steps = steps
        self._ready = threading.Condition()
        self._idle: list[_Reader] = []
        self._open = 0
        self._closed = False

    def acquire(self) -> _Reader:
        with self._ready:
            for _ in range(1 << 62):  # until one is free; reads end within their budget
                if self._closed:
                    raise ReplicaStorageError(f"database {self._path} is closed")
                if self._idle:
                    return self._idle.pop()
                if self._open < self._size:
                    self._open += 1
                    break
                self._ready.wait()
        try:
            return _Reader(self._path, self._steps)
        except sqlite3.Error as exc:
            with self._ready:
                self._open -= 1
                self._ready.notify_all()
            raise ReplicaStorageError(f"database {self._path}: cannot read: {exc}") from exc

    def release(self, reader: _Reader) -> None:
        with self._ready:
            if self._closed:
                reader.close()
                self._open -= 1
            else:
                self._idle.append(reader)
            self._ready.notify_all()

    def close(self) -> None:
        with self._ready:
            self._closed = True
            while self._open > len(self._idle):
                self._ready.wait()
            for reader in self._idle:
                reader.close()
            self._idle.clear()
            self._open = 0
            self._ready.notify_all()
