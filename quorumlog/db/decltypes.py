"""The declared types of a query's result columns, which rqlite answers as ``types``.

SQLite knows them (``sqlite3_column_decltype``: ``INTEGER`` for a column declared so,
nothing for an expression); Python's ``sqlite3`` does not pass them on. They are read
here through the very SQLite library Python's module is linked to, on a read-only
connection of their own, by compiling the statement (nothing runs). Only that same
library is used: a second copy of SQLite in one process would break SQLite's POSIX
locks (closing a file in one copy drops the locks the other holds), so where the
library cannot be found among the process's mapped files, or reports another version,
:func:`available` is False and callers keep the values' storage classes.
"""

from __future__ import annotations

import ctypes
import sqlite3
from functools import cache
from pathlib import Path

__all__ = ["DeclaredTypes", "available"]

_SQLITE_OK = 0
_OPEN_READONLY = 0x00000001
_OPEN_URI = 0x00000040
# Statement texts up to this length are remembered, this many of them per connection.
_KNOWN_SQL_CHARS = 4096
_KNOWN_STATEMENTS = 512


@cache
def _library() -> ctypes.CDLL | None:
    """The SQLite library already loaded by Python's ``sqlite3``, or None."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = set()
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and "libsqlite3" in Path(fields[5].strip()).name:
            paths.add(fields[5].strip())
    if len(paths) != 1:
        return None  # linked in statically, or more than one: do not guess
    try:
        lib = ctypes.CDLL(paths.pop())  # already mapped: the same copy, not a second one
    except OSError:
        return None
    lib.sqlite3_libversion.restype = ctypes.c_char_p
    if lib.sqlite3_libversion().decode() != sqlite3.sqlite_version:
        return None
    lib.sqlite3_open_v2.argtypes = [
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_int,
        ctypes.c_char_p,
    ]
    lib.sqlite3_close_v2.argtypes = [ctypes.c_void_p]
    lib.sqlite3_prepare_v2.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_char_p),
    ]
    lib.sqlite3_column_count.argtypes = [ctypes.c_void_p]
    lib.sqlite3_column_decltype.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.sqlite3_column_decltype.restype = ctypes.c_char_p
    lib.sqlite3_finalize.argtypes = [ctypes.c_void_p]
    if hasattr(lib, "sqlite3_column_table_name"):  # SQLITE_ENABLE_COLUMN_METADATA
        lib.sqlite3_column_table_name.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.sqlite3_column_table_name.restype = ctypes.c_char_p
    return lib


def available() -> bool:
    """Whether declared types can be read in this process (see the module's note)."""
    return _library() is not None


def tables_available() -> bool:
    """Whether the table each result column comes from can be told (SQLite built with
    column metadata, as Debian's is)."""
    lib = _library()
    return lib is not None and hasattr(lib, "sqlite3_column_table_name")


class DeclaredTypes:
    """A read-only connection to one database file that tells the declared types of a
    statement's result columns. Not thread-safe: one per reader thread."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._db: ctypes.c_void_p | None = None
        self._schema_version: int | None = None
        # What each statement text gave, under the schema compiled against.
        self._known: dict[str, tuple[list[str], list[str]]] = {}

    def _open(self) -> ctypes.c_void_p | None:
        lib = _library()
        if lib is None:
            return None
        db = ctypes.c_void_p()
        uri = f"file:{self._path}?mode=ro".encode()
        if lib.sqlite3_open_v2(uri, ctypes.byref(db), _OPEN_READONLY | _OPEN_URI, None) != 0:
            lib.sqlite3_close_v2(db)
            return None
        return db

    def of(self, sql: str, schema_version: int) -> list[str] | None:
        """The declared type of each result column of ``sql`` (lower case; "" for a
        column that is an expression), compiled against the schema of
        ``schema_version`` (the reader's ``PRAGMA schema_version``: a connection that
        saw an older schema is opened again). None when it cannot be told."""
        described = self.describe(sql, schema_version)
        return None if described is None else described[0]

    def describe(self, sql: str, schema_version: int) -> tuple[list[str], list[str]] | None:
        """The declared types (as :meth:`of`) and the tables (the table a column is
        read from, "" for an expression; all "" without column metadata) of the
        result columns of ``sql``; None when they cannot be told."""
        lib = _library()
        if lib is None:
            return None
        if self._db is not None and self._schema_version != schema_version:
            self.close()
        known = self._known.get(sql)
        if known is not None:
            return known
        if self._db is None:
            self._db = self._open()
            self._schema_version = schema_version
            if self._db is None:
                return None
        statement = ctypes.c_void_p()
        tail = ctypes.c_char_p()
        text = sql.encode("utf-8", "surrogatepass")
        if lib.sqlite3_prepare_v2(self._db, text, len(text), ctypes.byref(statement), tail) != 0:
            lib.sqlite3_finalize(statement)
            return None
        try:
            if not statement:
                return None
            types, tables = [], []
            named = hasattr(lib, "sqlite3_column_table_name")
            for index in range(lib.sqlite3_column_count(statement)):
                declared = lib.sqlite3_column_decltype(statement, index)
                types.append(declared.decode("utf-8", "replace").lower() if declared else "")
                table = lib.sqlite3_column_table_name(statement, index) if named else None
                tables.append(table.decode("utf-8", "replace") if table else "")
            if len(sql) <= _KNOWN_SQL_CHARS:
                if len(self._known) >= _KNOWN_STATEMENTS:
                    self._known.clear()
                self._known[sql] = (types, tables)
            return types, tables
        finally:
            lib.sqlite3_finalize(statement)

    def close(self) -> None:
        lib = _library()
        if self._db is not None and lib is not None:
            lib.sqlite3_close_v2(self._db)
        self._db = None
        self._schema_version = None
        self._known.clear()
