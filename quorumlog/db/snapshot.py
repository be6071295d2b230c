"""Snapshots of a replica's SQLite file, stored in ledgers, and the log truncated behind them.

A snapshot is a consistent copy of the file (SQLite's online backup) taken between
two records, so it holds the applied position of the last record in it. Its bytes go
into a new ledger of their own (replicated like the log, same shape and password),
in 1 MiB entries, and the ledger is closed. Only then is the snapshot recorded, with
a compare-and-set, in the metadata node ``/dbsnapshots/<log name>`` (its '/' escaped as
in ``/logs``: ``/dbsnapshots/db%2Fshop``):

    {"snapshots": [{"ledger": 31, "position": "27:1040", "size_bytes": 81920,
                    "created_ms": 1760000000000}, ...],   # oldest first
     "dropped": [24]}                                     # (optional)

The newest ``keep`` snapshots are kept; older ones move from the list to ``dropped``
(in the same compare-and-set), then their ledgers are deleted. The next snapshot
deletes whatever ``dropped`` still names (a crash before the deletion) before it
writes the list without them, so a crash at any step leaves no ledger that nothing
names: ``quorumlog shell orphans`` deletes the ledgers ``dropped`` names at once. The
log is then truncated before the position right after the oldest snapshot kept: every
record a replica may still need is either in a kept snapshot or still in the log.

A replica whose file is missing, or whose applied position lies before the log's
truncation point, restores the newest snapshot (replacing its file) and tails the
log from the snapshot's position.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quorumlog.errors import (
    BKError,
    MetadataVersionError,
    NodeExistsError,
    NoNodeError,
    NoSuchLedgerError,
)
from quorumlog.log.context import DB_SNAPSHOT, ownership_tags
from quorumlog.log.metadata import log_node_name
from quorumlog.log.position import Position

if TYPE_CHECKING:
    from collections.abc import Sequence

    from quorumlog.log.log import Log

__all__ = [
    "SNAPSHOTS_PATH",
    "Snapshot",
    "copy_file",
    "dump_sql",
    "list_snapshots",
    "read_snapshot",
    "take_snapshot",
]

log = logging.getLogger(__name__)

SNAPSHOTS_PATH = "/dbsnapshots"
CHUNK_BYTES = 1 << 20
_CAS_ATTEMPTS = 50


@dataclass(frozen=True, slots=True)
class Snapshot:
    ledger_id: int
    position: Position
    size_bytes: int
    created_ms: int

    def to_json(self) -> dict[str, object]:
        return {
            "ledger": self.ledger_id,
            "position": str(self.position),
            "size_bytes": self.size_bytes,
            "created_ms": self.created_ms,
        }

    @classmethod
    def from_json(cls, raw: dict[str, object]) -> Snapshot:
        return cls(
            int(str(raw["ledger"])),
            Position.parse(str(raw["position"])),
            int(str(raw["size_bytes"])),
            int(str(raw["created_ms"])),
        )


def _path(the_log: Log) -> str:
    return f"{SNAPSHOTS_PATH}/{log_node_name(the_log.name)}"


async def _read_list(the_log: Log) -> tuple[list[Snapshot], int | None]:
    snapshots, _, version = await _read_node(the_log)
    return snapshots, version


async def _read_node(the_log: Log) -> tuple[list[Snapshot], list[int], int | None]:
    """The recorded snapshots, the ledgers dropped but maybe not deleted yet, the
    node's version (None: no node)."""
    try:
        node = await the_log.store.get(_path(the_log))
    except NoNodeError:
        return [], [], None
    raw = json.loads(node.data or b"{}")
    dropped = [int(x) for x in raw.get("dropped", [])]
    return [Snapshot.from_json(s) for s in raw.get("snapshots", [])], dropped, node.version


async def list_snapshots(the_log: Log) -> list[Snapshot]:
    """The recorded snapshots, oldest first."""
    return (await _read_list(the_log))[0]


def copy_file(source: Path) -> tuple[bytes, Position | None]:
    """A consistent copy of the SQLite file at ``source`` and the position it holds."""
    with tempfile.TemporaryDirectory() as scratch:
        target = Path(scratch) / "snapshot.sqlite"
        src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
        dst = sqlite3.connect(target)
        try:
            src.backup(dst)
            row = dst.execute("SELECT ledger_id, entry_id FROM _quorumlog_applied").fetchone()
        finally:
            dst.close()
            src.close()
        position = None if row is None else Position(row[0], row[1])
        return target.read_bytes(), position


def vacuumed(data: bytes) -> bytes:
    """A SQLite file's bytes rebuilt by ``VACUUM INTO``: the same contents, without free
    pages (rqlite's backup ``vacuum``)."""
    with tempfile.TemporaryDirectory() as scratch:
        path, target = Path(scratch) / "copy.sqlite", Path(scratch) / "vacuumed.sqlite"
        path.write_bytes(data)
        conn = sqlite3.connect(path)
        try:
            conn.execute("VACUUM INTO ?", (str(target),))
        finally:
            conn.close()
        return target.read_bytes()


def dump_sql(data: bytes, tables: Sequence[str] | None = None) -> list[str]:
    """The SQL text of a SQLite file's bytes, without the replica's own table: what
    ``quorumlog db restore`` replays through the leader. ``tables``: only these tables
    (with their indexes and triggers; no views); ValueError naming one that is not
    there."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "dump.sqlite"
        path.write_bytes(data)
        conn = sqlite3.connect(path)
        try:
            if tables is not None:
                _keep_only(conn, tables)
            return [
                line
                for line in conn.iterdump()
                if "_quorumlog_applied" not in line
                and line not in ("BEGIN TRANSACTION;", "COMMIT;")
            ]
        finally:
            conn.close()


def _keep_only(conn: sqlite3.Connection, tables: Sequence[str]) -> None:
    """Drop, from a scratch copy, every view and every table not in ``tables``."""
    schema = conn.execute("SELECT type, name FROM sqlite_schema").fetchall()
    present = {name for kind, name in schema if kind == "table"}
    missing = [t for t in tables if t not in present or t == "_quorumlog_applied"]
    if missing:
        raise ValueError(f"no table {missing[0]!r} in the database")
    for kind, name in schema:
        quoted = '"' + name.replace('"', '""') + '"'
        if kind == "view":
            conn.execute(f"DROP VIEW {quoted}")
        elif kind == "table" and name not in tables and not name.startswith("sqlite_"):
            conn.execute(f"DROP TABLE {quoted}")
    conn.commit()


async def take_snapshot(the_log: Log, source: Path, *, keep: int = 2) -> Snapshot | None:
    """Snapshot the file at ``source`` into a ledger, record it, drop older snapshots,
    truncate the log; the snapshot (None when the file holds no position yet)."""
    # The copy reads the whole file: on a thread, so the leader's loop goes on meanwhile.
    data, position = await asyncio.to_thread(copy_file, source)
    if position is None:
        return None
    config = the_log.config
    handle = await the_log.bk.create_ledger(
        config.ensemble,
        config.write_quorum,
        config.ack_quorum,
        config.digest_type,
        config.password,
        ownership_tags(DB_SNAPSHOT, the_log.name),
    )
    try:
        for offset in range(0, max(len(data), 1), CHUNK_BYTES):
            await handle.append(data[offset : offset + CHUNK_BYTES])
    finally:
        await handle.close()
    snapshot = Snapshot(handle.ledger_id, position, len(data), int(time.time() * 1000))
    dropped: list[Snapshot] = []
    for _ in range(_CAS_ATTEMPTS):
        snapshots, pending, version = await _read_node(the_log)
        if any(s.position == position for s in snapshots):
            # Another leader recorded this very position: ours is a spare copy.
            kept, dropped = snapshots, [snapshot]
            break
        # Ledgers an earlier snapshot dropped and may not have deleted (it crashed):
        # deleted before the list stops naming them.
        undeleted = await _delete_snapshot_ledgers(the_log, pending)
        # By position, whoever took them: a deposed leader whose copy is older than
        # snapshots the new leader recorded meanwhile must not push those out (their
        # ledgers deleted, the log truncated past what its own snapshot continues).
        updated = sorted([*snapshots, snapshot], key=lambda s: s.position)
        kept, dropped = updated[-keep:], updated[:-keep]
        doc: dict[str, object] = {"snapshots": [s.to_json() for s in kept]}
        if dropped or undeleted:
            doc["dropped"] = sorted({*undeleted, *(s.ledger_id for s in dropped)})
        body = json.dumps(doc).encode()
        try:
            if version is None:
                await the_log.store.create(_path(the_log), body)
            else:
                await the_log.store.set(_path(the_log), body, version)
            break
        except (MetadataVersionError, NodeExistsError):
            continue
    else:
        raise BKError(f"database log {the_log.name}: snapshot list kept changing")
    await _delete_snapshot_ledgers(the_log, [old.ledger_id for old in dropped])
    oldest = kept[0].position.next()
    try:
        await the_log.truncate(before=oldest)
    except BKError as exc:
        log.info("log %s not truncated before %s: %s", the_log.name, oldest, exc)
    return snapshot


async def _delete_snapshot_ledgers(the_log: Log, ledger_ids: Sequence[int]) -> list[int]:
    """Delete dropped snapshots' ledgers; those that could not be (still named in
    ``dropped`` by the next list written, for a later try)."""
    kept: list[int] = []
    for ledger_id in ledger_ids:
        try:
            await the_log.bk.delete_ledger(ledger_id, the_log.config.password)
        except NoSuchLedgerError:
            continue
        except BKError as exc:
            log.warning("snapshot ledger %d not deleted: %s", ledger_id, exc)
            kept.append(ledger_id)
    return kept


async def read_snapshot(the_log: Log, snapshot: Snapshot, target: Path) -> None:
    """Write the snapshot's bytes to ``target`` (replaced atomically)."""
    handle = await the_log.bk.open_ledger(snapshot.ledger_id, the_log.config.password)
    try:
        last = handle.last_add_confirmed
        chunks: list[bytes] = []
        for first in range(0, last + 1, 64):
            entries = await handle.read_entries(first, min(first + 63, last))
            chunks.extend(bytes(e.data) for e in entries)
    finally:
        await handle.close()
    data = b"".join(chunks)
    if len(data) != snapshot.size_bytes:
        raise BKError(
            f"snapshot in ledger {snapshot.ledger_id}: {len(data)} bytes, "
            f"expected {snapshot.size_bytes}"
        )
    scratch = target.with_suffix(".restore")
    await asyncio.to_thread(scratch.write_bytes, data)
    for suffix in ("-wal", "-shm"):
        Path(f"{target}{suffix}").unlink(missing_ok=True)
    os.replace(scratch, target)
