"""SQLite's own pseudo-random generator, seeded before each statement a replica applies.

SQLite draws from its generator where no SQL function is involved: a new row's rowid,
once a table holds the largest one (9223372036854775807), is chosen at random. Every
replica applies the same statements to the same data, but each process's generator was
seeded from its own entropy, so such an insert gave each replica another rowid, and
nothing compared them: the replicas differed silently. Seeded from the record before
each statement (the leader's seed, the statement's index), the generator makes the same
choices on every replica of one SQLite version.

The generator is the process's, shared by every connection; the write connection alone
may draw from it while replicas apply records (the read connections' random() and
randomblob() are Python functions, :func:`install_read_functions`). SQLite has no public
call to seed it: ``sqlite3_test_control(SQLITE_TESTCTRL_PRNG_SEED, x, NULL)`` is its
testing interface, reached with ctypes in the library the ``sqlite3`` module uses, and
checked once: :func:`available` is False where it does not seed that generator.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import sqlite3
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["available", "install_read_functions", "seed_for_statement"]

_SQLITE_TESTCTRL_PRNG_SEED = 28


def _library_paths() -> list[str]:
    """The files that may hold the sqlite3 module's SQLite: the shared library the
    process has mapped, then the module itself (SQLite linked into it)."""
    import _sqlite3

    paths: list[str] = []
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if "libsqlite3" in os.path.basename(path) and path not in paths:
                paths.append(path)
    except OSError:
        pass
    paths.append(str(_sqlite3.__file__))
    return paths


def _load() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    for path in _library_paths():
        try:
            control = ctypes.CDLL(path).sqlite3_test_control
        except (OSError, AttributeError):
            continue
        control.restype = ctypes.c_int
        if _seeds(control):
            return control
    return None


def _seeds(control: ctypes._CFuncPtr) -> bool:  # type: ignore[name-defined]
    """Whether seeding through ``control`` makes the sqlite3 module's random() repeat."""
    conn = sqlite3.connect(":memory:")
    try:
        drawn = []
        for _ in range(2):
            control(_SQLITE_TESTCTRL_PRNG_SEED, ctypes.c_int(0x5EED), ctypes.c_void_p(None))
            drawn.append(conn.execute("SELECT random(), random()").fetchone())
        return bool(drawn[0] == drawn[1])
    finally:
        conn.close()


_CONTROL = _load()
if _CONTROL is None:
    log.warning(
        "SQLite's random generator cannot be seeded in this Python's sqlite3 module: a "
        "table holding rowid 9223372036854775807 would make replicas choose other rowids"
    )


def available() -> bool:
    return _CONTROL is not None


def seed_for_statement(record_seed: bytes, index: int) -> None:
    """Seed the generator for statement ``index`` of the record seeded ``record_seed``:
    the same draws on every replica, and again when the statement is run again."""
    if _CONTROL is None:
        return
    digest = hashlib.shake_256(b"%b:%d:sqlite" % (record_seed, index)).digest(4)
    value = int.from_bytes(digest, "little", signed=True) or 1  # 0 would unseed it
    _CONTROL(_SQLITE_TESTCTRL_PRNG_SEED, ctypes.c_int(value), ctypes.c_void_p(None))


def install_read_functions(conn: sqlite3.Connection) -> None:
    """random() and randomblob() of a read connection from the OS's entropy, so that
    reads, running beside the replica's writes, never draw from SQLite's generator."""
    limit = conn.getlimit(sqlite3.SQLITE_LIMIT_LENGTH)

    def random() -> int:
        return int.from_bytes(os.urandom(8), "little", signed=True)

    def randomblob(size: object) -> bytes:
        try:  # as SQLite reads the argument: a whole number, else 0
            count = int(float(size)) if isinstance(size, int | float | str) else 0
        except ValueError:
            count = 0
        if count > limit:
            raise OverflowError("string or blob too big")
        return os.urandom(max(count, 1))

    conn.create_function("random", 0, random)
    conn.create_function("randomblob", 1, randomblob)
