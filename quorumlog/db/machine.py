"""The replicated state machine: log records in, a SQLite file changed, results out.

No network and no event loop: the replica (``replica.py``) feeds records in log order
and this module applies each one in a single SQLite transaction that also stores the
record's position in ``_quorumlog_applied``. A replica killed at any moment therefore
has either all of a record (and its position) or none of it, and resumes at the
record after the stored position: nothing applied twice, nothing skipped.

Applying is deterministic: the same file and the same record give the same changes
and the same per-statement errors on every replica (the leader already replaced the
non-deterministic calls, ``sql.py``). A failure that is not the statement's (disk
full, I/O error, a corrupt file) would not repeat elsewhere, so it is never reported
as a statement error: it raises :class:`ReplicaStorageError` and the replica stops.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from quorumlog.db.sql import (
    APPLIED_TABLE,
    BadRequestError,
    Params,
    Statement,
    batchable,
    inserts_rows,
)
from quorumlog.errors import BKError
from quorumlog.log.position import Position

__all__ = [
    "BARRIER",
    "EXECUTE",
    "DbRecord",
    "ReplicaStorageError",
    "StateMachine",
    "StatementResult",
]

RECORD_FORMAT = 1
EXECUTE = "execute"
BARRIER = "barrier"

# SQLite primary result codes that come from the machine, not from the statement.
_ENVIRONMENT_CODES = frozenset({3, 5, 6, 7, 8, 10, 11, 13, 14, 26})


class ReplicaStorageError(BKError):
    """The local SQLite file failed (not the statement): this replica must stop."""


class _TransactionEnded(Exception):
    """A statement's conflict clause (``OR ROLLBACK``, ``RAISE(ROLLBACK)``) ended the
    whole SQLite transaction, undoing the records applied before it in the same group."""


@dataclass(frozen=True, slots=True)
class DbRecord:
    """One log record: a write request (statements, whether they form one transaction)
    or a barrier (nothing to change: a strong read proves leadership with it)."""

    kind: str
    statements: tuple[Statement, ...] = ()
    transaction: bool = False

    def encode(self) -> bytes:
        """The record as JSON (the change stream's format, read by Spark as it is)."""
        body: dict[str, object] = {"v": RECORD_FORMAT, "kind": self.kind}
        if self.kind == EXECUTE:
            body["tx"] = self.transaction
            body["stmts"] = [[s.sql, s.params] for s in self.statements]
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
        return cls(EXECUTE, stmts, bool(raw.get("tx", False)))


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


def _is_environment_error(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and (code & 0xFF) in _ENVIRONMENT_CODES


class StateMachine:
    """One replica's SQLite file (``path``) and the position applied into it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode: every transaction is begun and ended here explicitly.
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
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
        self._reader = sqlite3.connect(
            f"file:{self.path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
        )
        # One cursor for every write statement: conn.execute made one per statement.
        self._writes = self._conn.cursor()

    @property
    def applied(self) -> Position | None:
        """The position of the last record applied (None before the first)."""
        return self._applied

    def close(self) -> None:
        self._writes.close()
        self._reader.close()
        self._conn.close()

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
            for _position, record in fresh:
                if record.kind != EXECUTE:
                    results.append([])
                elif quick:
                    self._run_quietly(record, grouped=grouped)
                    results.append([])
                else:
                    results.append(self._run_writes(record, grouped=grouped))
            last = fresh[-1][0]
            conn.execute(
                f"INSERT OR REPLACE INTO {APPLIED_TABLE} (id, ledger_id, entry_id) "
                "VALUES (1, ?, ?)",
                last,
            )
            conn.execute("COMMIT")
        except _TransactionEnded:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            # The earlier records of the group (or of the record) were undone with it:
            # apply each record in a transaction of its own instead, statement by
            # statement, as the record itself asks.
            alone = [self._apply_group([(p, r)], quick=False)[0] for p, r in fresh]
            return out + ([[] for _ in alone] if quick else alone)
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise ReplicaStorageError(
                f"database {self.path}: cannot apply the records at {fresh[0][0]}"
                f"..{fresh[-1][0]}: {exc}"
            ) from exc
        self._applied = last
        return out + results

    # The leader runs its records while their appends are in flight (execute_ahead),
    # so applying them no longer waits for the log's round trip; the transaction is
    # committed with its position once every one of them is confirmed (commit_ahead),
    # or rolled back (abandon_ahead) if any is not.

    def execute_ahead(self, records: Sequence[DbRecord]) -> list[list[StatementResult]] | None:
        """Run ``records`` (the next ones in log order, positions not known yet) in a
        SQLite transaction left open: each one's results, or None when a statement's
        conflict clause ended the transaction (nothing of them is left: apply them with
        :meth:`apply_group` once their positions are known). Nothing is committed
        until :meth:`commit_ahead`; readers see none of it before."""
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            return [
                self._run_writes(record, grouped=True) if record.kind == EXECUTE else []
                for record in records
            ]
        except _TransactionEnded:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return None
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise ReplicaStorageError(f"database {self.path}: cannot apply: {exc}") from exc

    def commit_ahead(self, last: Position) -> None:
        """Commit what :meth:`execute_ahead` ran, its last record at ``last``."""
        if self._applied is not None and last <= self._applied:
            self.abandon_ahead()
            raise ReplicaStorageError(f"database {self.path}: {last} is applied already")
        conn = self._conn
        try:
            conn.execute(
                f"INSERT OR REPLACE INTO {APPLIED_TABLE} (id, ledger_id, entry_id) "
                "VALUES (1, ?, ?)",
                last,
            )
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise ReplicaStorageError(
                f"database {self.path}: cannot commit the records up to {last}: {exc}"
            ) from exc
        self._applied = last

    def abandon_ahead(self) -> None:
        """Roll back what :meth:`execute_ahead` ran (some append was not confirmed)."""
        try:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            raise ReplicaStorageError(f"database {self.path}: cannot roll back: {exc}") from exc

    def _run_quietly(self, record: DbRecord, *, grouped: bool) -> None:
        """Apply ``record`` without results: runs of one batchable statement text (an
        INSERT of many rows) in one ``executemany``, the whole record in one savepoint.
        If every statement succeeds, the file is what running them one by one gives;
        if any fails, the savepoint is rolled back and the record run statement by
        statement instead (:meth:`_run_writes`), so failures behave exactly as alone."""
        conn = self._conn
        statements = record.statements
        conn.execute("SAVEPOINT quick")
        try:
            start = 0
            while start < len(statements):
                sql = statements[start].sql
                end = start + 1
                if batchable(sql):
                    while end < len(statements) and statements[end].sql == sql:
                        end += 1
                if end - start > 1:
                    conn.executemany(sql, [s.params for s in statements[start:end]])
                else:
                    self._run_one(self._writes, statements[start])
                start = end
        except (sqlite3.Error, OverflowError, ValueError) as exc:
            if isinstance(exc, sqlite3.Error) and _is_environment_error(exc):
                raise
            if not conn.in_transaction:
                # A conflict clause ended the transaction (and this savepoint): the
                # group is applied again record by record, each statement by statement.
                raise _TransactionEnded from exc
            conn.execute("ROLLBACK TO quick")
            conn.execute("RELEASE quick")
            self._run_writes(record, grouped=grouped)
            return
        conn.execute("RELEASE quick")

    def _run_writes(self, record: DbRecord, *, grouped: bool) -> list[StatementResult]:
        conn = self._conn
        cursor = self._writes
        results: list[StatementResult] = []
        if record.transaction:
            conn.execute("SAVEPOINT request")
        for statement in record.statements:
            if not record.transaction:
                conn.execute("SAVEPOINT statement")
            started = time.perf_counter()
            try:
                result = self._run_one(cursor, statement)
            except (sqlite3.Error, OverflowError, ValueError) as exc:
                if isinstance(exc, sqlite3.Error) and _is_environment_error(exc):
                    raise
                error = StatementResult(error=str(exc))
                error.time_s = time.perf_counter() - started
                results.append(error)
                if not conn.in_transaction:
                    # An OR ROLLBACK conflict ended the whole transaction: that happens
                    # the same way on every replica; go on in a new one (unless other
                    # records of a group went with it: then they are applied again alone).
                    if grouped:
                        raise _TransactionEnded from exc
                    conn.execute("BEGIN IMMEDIATE")
                    if record.transaction:
                        break
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

    @staticmethod
    def _run_one(on: sqlite3.Connection | sqlite3.Cursor, statement: Statement) -> StatementResult:
        cursor = on.execute(statement.sql, statement.params)
        result = StatementResult()
        if cursor.description is not None:
            rows = [list(r) for r in cursor.fetchall()]
            result.columns = [d[0] for d in cursor.description]
            result.types = _types(rows, len(result.columns))
            result.values = rows
        result.rows_affected = max(cursor.rowcount, 0)
        if cursor.lastrowid and result.rows_affected and inserts_rows(statement.sql):
            result.last_insert_id = cursor.lastrowid
        return result

    # ------------------------------------------------------------ reads

    def query(self, statements: list[Statement]) -> list[StatementResult]:
        """Run read-only statements on one snapshot of the committed data. A statement
        that tries to write fails with SQLite's read-only error."""
        conn = self._reader
        results: list[StatementResult] = []
        conn.execute("BEGIN")
        try:
            for statement in statements:
                started = time.perf_counter()
                try:
                    result = self._run_one(conn, statement)
                    result.rows_affected = None
                    result.last_insert_id = None
                except (sqlite3.Error, OverflowError, ValueError) as exc:
                    result = StatementResult(error=str(exc))
                result.time_s = time.perf_counter() - started
                results.append(result)
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")
        return results

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
