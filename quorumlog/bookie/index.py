"""The durable index and ledger state, in LMDB.

Four named databases in ``<data_dir>/index``:

- ``entries``: key (ledger id, entry id) as two big-endian uint64 (so one
  ledger's entries are contiguous and ordered), value (entry log id, record
  offset, blob size) as uint32, uint64, uint32;
- ``ledgers``: key ledger id, value :meth:`LedgerState.to_bytes`;
- ``logs``: key entry log id, value the ledger ids it holds (for garbage collection);
- ``meta``: ``last_mark`` = the journal position (file id, offset) up to which
  everything is in ledger storage;
- ``usage``: key entry log id, value (ledger id, record bytes) pairs as two uint64:
  the bytes each ledger's records take in that log, for compaction's choice of logs.
  An estimate that errs only high (an entry written twice counts twice); what is
  copied is always decided from ``entries``.

Only the checkpoint writes, in one transaction that LMDB syncs on commit, so the
index, the states and the mark always move together. Reads run on the event
loop in short read transactions and never wait for a writer (MVCC).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import lmdb

from quorumlog.bookie.ledger_state import LedgerState, Location
from quorumlog.errors import BookieIOError

log = logging.getLogger(__name__)

_ENTRY_KEY = struct.Struct(">QQ")
_LEDGER_KEY = struct.Struct(">Q")
_LOG_KEY = struct.Struct(">I")
_LOCATION = struct.Struct(">IQI")
_MARK = struct.Struct(">QQ")
_MARK_KEY = b"last_mark"
# What lmdb hands out: bytes in the index's read transactions (opened with buffers=False).
_Buffer = bytes | memoryview


@dataclass(slots=True)
class IndexUpdate:
    """One checkpoint's worth of changes, applied in one transaction."""

    mark: tuple[int, int]
    purge_ledgers: list[int] = field(default_factory=list)  # drop every entry of these first
    entries: list[tuple[int, dict[int, Location]]] = field(default_factory=list)
    states: list[tuple[int, bytes]] = field(default_factory=list)
    dropped_states: list[int] = field(default_factory=list)
    logs: list[tuple[int, list[int]]] = field(default_factory=list)
    dropped_logs: list[int] = field(default_factory=list)
    usage: list[tuple[int, dict[int, int]]] = field(default_factory=list)


# At most this many doublings of a full map in one commit at start (2**8 times the size).
_MAP_DOUBLINGS = 8


class LedgerIndex:
    """LMDB environment of one bookie.

    A full map (``lmdb.MapFullError``) is an I/O error that names the setting to raise,
    except while the bookie starts (``grow_when_full``): then no other transaction is
    open in the process, and the map is doubled and the commit tried again, so that a
    bookie whose index filled while serving starts again by itself."""

    grow_when_full = False

    def __init__(self, directory: Path, map_size_bytes: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        try:
            self._env = lmdb.open(
                str(directory),
                map_size=map_size_bytes,
                max_dbs=8,
                sync=True,
                metasync=True,
                readahead=False,
                max_readers=64,
            )
        except lmdb.Error as exc:
            raise BookieIOError(f"index {directory}: cannot open LMDB: {exc}") from exc
        self.directory = directory
        self._entries = self._env.open_db(b"entries")
        self._ledgers = self._env.open_db(b"ledgers")
        self._logs = self._env.open_db(b"logs")
        self._meta = self._env.open_db(b"meta")
        self._usage = self._env.open_db(b"usage")

    # ------------------------------------------------------------ loading

    def load_states(self) -> dict[int, LedgerState]:
        states: dict[int, LedgerState] = {}
        with self._env.begin(db=self._ledgers) as txn:
            for key, value in txn.cursor():
                (ledger_id,) = _LEDGER_KEY.unpack(key)
                states[ledger_id] = LedgerState.from_bytes(ledger_id, value)
        return states

    def load_logs(self) -> dict[int, set[int]]:
        logs: dict[int, set[int]] = {}
        with self._env.begin(db=self._logs) as txn:
            for key, value in txn.cursor():
                (log_id,) = _LOG_KEY.unpack(key)
                count = len(value) // 8
                logs[log_id] = set(struct.unpack(f">{count}Q", value))
        return logs

    def load_usage(self) -> dict[int, dict[int, int]] | None:
        """Bytes per ledger per entry log; None for an index written before the table
        existed while it holds entries (then :meth:`scan_usage` rebuilds it)."""
        usage: dict[int, dict[int, int]] = {}
        with self._env.begin(db=self._usage) as txn:
            for key, value in txn.cursor():
                (log_id,) = _LOG_KEY.unpack(key)
                pairs = struct.unpack(f">{len(value) // 8}Q", value)
                usage[log_id] = dict(zip(pairs[::2], pairs[1::2], strict=True))
        if not usage:
            with self._env.begin(db=self._entries) as txn:
                if txn.cursor().first():
                    return None
        return usage

    def scan_usage(self) -> dict[int, dict[int, int]]:
        """Bytes per ledger per entry log, counted from every entry (one pass)."""
        usage: dict[int, dict[int, int]] = {}
        unpack_key, unpack_loc = _ENTRY_KEY.unpack, _LOCATION.unpack
        with self._env.begin(db=self._entries) as txn:
            for key, value in txn.cursor():
                ledger_id = unpack_key(key)[0]
                log_id, _, size = unpack_loc(value)
                per_ledger = usage.setdefault(log_id, {})
                per_ledger[ledger_id] = per_ledger.get(ledger_id, 0) + size + 8
        return usage

    def entries_in_log(
        self, ledger_id: int, log_id: int, after: int, limit: int
    ) -> tuple[list[int], int | None]:
        """Ids of ``ledger_id``'s entries above ``after`` that the index places in log
        ``log_id``, looking at most at ``limit`` entries; and the entry id to go on
        after (None when the ledger's entries are all seen)."""
        prefix = _LEDGER_KEY.pack(ledger_id)
        found: list[int] = []
        unpack_key, unpack_loc = _ENTRY_KEY.unpack, _LOCATION.unpack
        with self._env.begin(db=self._entries) as txn:
            cursor = txn.cursor()
            start = _ENTRY_KEY.pack(ledger_id, after + 1) if after >= 0 else prefix + bytes(8)
            ok = cursor.set_range(start)
            seen = 0
            last = after
            while ok and cursor.key()[:8] == prefix:
                if seen >= limit:
                    return found, last
                last = unpack_key(cursor.key())[1]
                if unpack_loc(cursor.value())[0] == log_id:
                    found.append(last)
                seen += 1
                ok = cursor.next()
        return found, None

    def load_mark(self) -> tuple[int, int] | None:
        with self._env.begin(db=self._meta) as txn:
            value = txn.get(_MARK_KEY)
        if value is None:
            return None
        file_id, offset = _MARK.unpack(value)
        return file_id, offset

    # ------------------------------------------------------------ reading

    def get(self, ledger_id: int, entry_id: int) -> Location | None:
        with self._env.begin(db=self._entries, buffers=False) as txn:
            value = txn.get(_ENTRY_KEY.pack(ledger_id, entry_id))
        if value is None:
            return None
        log_id, offset, size = _LOCATION.unpack(value)
        return log_id, offset, size

    def reader(self) -> IndexReader:
        """A read transaction for several lookups (close it, or use ``with``)."""
        return IndexReader(self._env.begin(db=self._entries, buffers=False))

    def count_entries(self, ledger_id: int) -> int:
        prefix = _LEDGER_KEY.pack(ledger_id)
        count = 0
        with self._env.begin(db=self._entries) as txn:
            cursor = txn.cursor()
            found = cursor.set_range(prefix + bytes(8))
            while found and cursor.key()[:8] == prefix:
                count += 1
                found = cursor.next()
        return count

    # ------------------------------------------------------------ writing

    def apply(self, update: IndexUpdate) -> None:
        """Write one checkpoint's changes and the mark; durable when this returns."""
        for _ in range(_MAP_DOUBLINGS):
            try:
                self._apply(update)
                return
            except lmdb.MapFullError as exc:
                size = self._env.info()["map_size"]
                if not self.grow_when_full:
                    raise BookieIOError(
                        f"index {self.directory}: the LMDB map of {size} bytes is full; "
                        "raise index_map_size_bytes and restart the bookie (at start "
                        "the map grows by itself)"
                    ) from exc
                log.warning(
                    "index %s: map of %d bytes full, growing it to %d",
                    self.directory,
                    size,
                    2 * size,
                )
                self._env.set_mapsize(2 * size)
        raise BookieIOError(f"index {self.directory}: the LMDB map is still full after growing it")

    def _apply(self, update: IndexUpdate) -> None:
        pack_key = _ENTRY_KEY.pack
        pack_loc = _LOCATION.pack
        with self._env.begin(write=True) as txn:
            for ledger_id in update.purge_ledgers:
                self._purge(txn, ledger_id)
            for ledger_id, locations in update.entries:
                items = [
                    (pack_key(ledger_id, entry_id), pack_loc(*loc))
                    for entry_id, loc in locations.items()
                ]
                txn.cursor(db=self._entries).putmulti(items)
            for ledger_id in update.dropped_states:
                txn.delete(_LEDGER_KEY.pack(ledger_id), db=self._ledgers)
            for ledger_id, state_bytes in update.states:
                txn.put(_LEDGER_KEY.pack(ledger_id), state_bytes, db=self._ledgers)
            for log_id in update.dropped_logs:
                txn.delete(_LOG_KEY.pack(log_id), db=self._logs)
                txn.delete(_LOG_KEY.pack(log_id), db=self._usage)
            for log_id, per_ledger in update.usage:
                flat = [n for pair in sorted(per_ledger.items()) for n in pair]
                txn.put(_LOG_KEY.pack(log_id), struct.pack(f">{len(flat)}Q", *flat), db=self._usage)
            for log_id, ledger_ids in update.logs:
                value = struct.pack(f">{len(ledger_ids)}Q", *ledger_ids)
                txn.put(_LOG_KEY.pack(log_id), value, db=self._logs)
            txn.put(_MARK_KEY, _MARK.pack(*update.mark), db=self._meta)

    def _purge(self, txn: lmdb.Transaction, ledger_id: int) -> None:
        prefix = _LEDGER_KEY.pack(ledger_id)
        cursor = txn.cursor(db=self._entries)
        if not cursor.set_range(prefix + bytes(8)):
            return
        while cursor.key()[:8] == prefix:
            if not cursor.delete():  # deletes and moves to the next record
                break

    def close(self) -> None:
        self._env.close()


class IndexReader:
    """Several lookups in one read transaction.

    A batch read asks for consecutive entries of one ledger, whose keys are adjacent
    in ``entries``: after a hit, the next lookup first tries the cursor's next record
    (no search from the root), and searches only if that is not the key asked for."""

    __slots__ = ("_cursor", "_following", "_txn")

    def __init__(self, txn: lmdb.Transaction) -> None:
        self._txn = txn
        self._cursor = txn.cursor()
        # The records after the last one found, in key order (none before a first hit).
        self._following: Iterator[tuple[_Buffer, _Buffer]] = iter(())

    def get(self, ledger_id: int, entry_id: int) -> Location | None:
        key = _ENTRY_KEY.pack(ledger_id, entry_id)
        item = next(self._following, None)
        value: _Buffer
        if item is not None and item[0] == key:
            value = item[1]
        else:
            cursor = self._cursor
            if not cursor.set_key(key):
                self._following = iter(())
                return None
            value = cursor.value()
            self._following = cursor.iternext()
            next(self._following)  # it yields the record the cursor is on first
        log_id, offset, size = _LOCATION.unpack(value)
        return log_id, offset, size

    def run(self, ledger_id: int, first_entry_id: int, count: int) -> list[Location]:
        """The locations of entries ``first_entry_id`` to ``first_entry_id + count - 1``
        if the index holds every one of them, else an empty list (ask :meth:`get`).

        One search, then the records are taken and unpacked in C: keys are unique and
        ordered, so ``count`` records from the first key to the last one asked for are
        exactly the entries asked for."""
        if count <= 0:
            return []
        cursor = self._cursor
        self._following = iter(())
        if not cursor.set_key(_ENTRY_KEY.pack(ledger_id, first_entry_id)):
            return []
        values = list(islice(cursor.iternext(keys=False, values=True), count))
        if len(values) != count or cursor.key() != _ENTRY_KEY.pack(
            ledger_id, first_entry_id + count - 1
        ):
            return []
        return list(_LOCATION.iter_unpack(b"".join(values)))

    def close(self) -> None:
        self._txn.abort()

    def __enter__(self) -> IndexReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
