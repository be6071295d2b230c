"""The durable index and ledger state, in LMDB.

Six named databases in ``<data_dir>/index``:

- ``entries``: key (ledger id, entry id) as two big-endian uint64 (so one
  ledger's entries are contiguous and ordered), value (entry log id, record
  offset, blob size) as uint32, uint64, uint32;
- ``ledgers``: key ledger id, value :meth:`LedgerState.to_bytes`;
- ``counts``: key ledger id, value how many records ``entries`` holds for it (uint64),
  so that an entry missing below a ledger's last one can be proven absent (R17);
- ``logs``: key entry log id, value the ledger ids it holds (for garbage collection);
- ``usage``: key entry log id, value (ledger id, record bytes) pairs as two uint64:
  the bytes each ledger's records take in that log, for compaction's choice of logs.
  An estimate that errs only high (an entry written twice counts twice); what is
  copied is always decided from ``entries``;
- ``meta``: ``format`` (:data:`FORMAT_VERSION`), ``last_mark`` = the journal position
  (file id, offset) up to which everything is in ledger storage, and ``log_end`` = the
  entry log that was current at that checkpoint and its end then (what lies past it
  was written after the checkpoint, and the journal holds it).

Every value ends with a CRC32C of its key and the rest of the value (4 bytes,
little-endian), checked whenever it is read (R9, R17): a flipped bit is an I/O error,
never an absent entry, an unfenced ledger or another master key. A CRC appended
little-endian to the bytes it covers leaves the CRC of the whole at one constant (its
residue), whatever the bytes: one ``crc32c`` call checks a record, and one call over
many entry records checks them all (:func:`_run_check`).

Only the checkpoint writes, in one transaction that LMDB syncs on commit, so the
index, the states and the mark always move together. Reads run on the event
loop in short read transactions and never wait for a writer (MVCC).
"""

from __future__ import annotations

import functools
import logging
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain, islice, repeat, starmap, takewhile
from operator import add
from pathlib import Path

import lmdb
from crc32c import crc32c

from quorumlog.bookie.ledger_state import STATE_SIZE, LedgerState, Location
from quorumlog.errors import BookieIOError

log = logging.getLogger(__name__)

# 1: values without checksums (refused: see IndexFormatError); 2: each value checksummed,
# the counts table and the log end.
FORMAT_VERSION = 2

_ENTRY_KEY = struct.Struct(">QQ")
_LEDGER_KEY = struct.Struct(">Q")
_LOG_KEY = struct.Struct(">I")
_LOCATION = struct.Struct(">IQI")
_MARK = struct.Struct(">QQ")
_LOG_END = struct.Struct(">IQ")
_COUNT = struct.Struct(">Q")
_FORMAT = struct.Struct(">I")
_MARK_KEY = b"last_mark"
_LOG_END_KEY = b"log_end"
_FORMAT_KEY = b"format"
# Every value ends with crc32c(key + payload), little-endian; crc32c(key + value) of a
# sound record is then this constant (the residue of CRC-32C).
_CHECK = struct.Struct("<I")
CHECK_SIZE = _CHECK.size
_RESIDUE = 0x48674BC7
_SEALED_LOCATION = struct.Struct(">IQI4x")  # a location and its check, as stored
_SEALED_LOCATION_SIZE = _SEALED_LOCATION.size
_ENTRY_RECORD_SIZE = _ENTRY_KEY.size + _SEALED_LOCATION_SIZE  # a key and its value
# What lmdb hands out: bytes in the index's read transactions (opened with buffers=False).
_Buffer = bytes | memoryview


class IndexDamageError(BookieIOError):
    """A value of the index fails its checksum (or has an impossible size)."""


class IndexFormatError(BookieIOError):
    """The index was written in a format this version does not read."""


def seal(key: bytes, payload: bytes) -> bytes:
    """``payload`` as stored under ``key``: followed by the CRC32C of both."""
    return payload + _CHECK.pack(crc32c(key + payload))


def _sound(key: bytes, value: bytes) -> bool:
    return len(value) >= CHECK_SIZE and crc32c(key + value) == _RESIDUE


def _unseal(key: bytes, value: bytes, size: int | None, what: str) -> bytes:
    """The payload of a stored value; IndexDamageError if it is not sound."""
    if not _sound(key, value) or (size is not None and len(value) != size + CHECK_SIZE):
        raise IndexDamageError(f"{what} fails its checksum")
    return value[:-CHECK_SIZE]


def _sound_location(key: bytes, value: bytes) -> bool:
    return len(value) == _SEALED_LOCATION_SIZE and crc32c(key + value) == _RESIDUE


def _sample_entry_record() -> bytes:
    key = _ENTRY_KEY.pack(0, 0)
    return key + seal(key, _LOCATION.pack(0, 0, 0))


_SAMPLE_ENTRY_RECORD = _sample_entry_record()


@functools.lru_cache(maxsize=8)
def _run_check(count: int) -> int:
    """crc32c of ``count`` sound entry records (key and value) one after the other.

    Each sound record leaves the CRC in the same state (the residue), and a CRC is
    affine in its input, so the CRC of a run of sound records of one size depends on
    their number only: one call over a run checks every record in it, and any damage to
    one record (a flipped bit, as any error a CRC-32C detects) changes it."""
    return crc32c(_SAMPLE_ENTRY_RECORD * count)


def flipped_bit(record: bytes) -> int | None:
    """The one bit whose flip makes ``record`` (key and value) sound again, or None.

    CRC-32C has a Hamming distance of 6 at these lengths: a record with one bit flipped
    (or up to four) is never one flip away from another sound record, so a single bit
    found is where the damage is."""
    data = bytearray(record)
    for bit in range(len(data) * 8):
        data[bit >> 3] ^= 0x80 >> (bit & 7)
        if crc32c(bytes(data)) == _RESIDUE:
            return bit
        data[bit >> 3] ^= 0x80 >> (bit & 7)
    return None


def _lmdb_failed(directory: Path, what: str, exc: lmdb.Error) -> BookieIOError:
    return BookieIOError(f"index {directory}: {what} failed: {exc!r}")


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
    # The current entry log and its end as of this checkpoint (see ``log_end``).
    log_end: tuple[int, int] | None = None
    # The logs and usage tables are written whole (rebuilt after damage): drop them first.
    replace_log_tables: bool = False


# At most this many doublings of a full map in one commit at start (2**8 times the size).
_MAP_DOUBLINGS = 8
# Entry records checked per crc32c call when a ledger's records are all checked.
_CHECK_CHUNK_RECORDS = 4096


class LedgerIndex:
    """LMDB environment of one bookie.

    A full map (``lmdb.MapFullError``) is an I/O error that names the setting to raise,
    except while the bookie starts (``grow_when_full``): then no other transaction is
    open in the process, and the map is doubled and the commit tried again, so that a
    bookie whose index filled while serving starts again by itself."""

    grow_when_full = False

    def __init__(self, directory: Path, map_size_bytes: int, *, read_only: bool = False) -> None:
        """``read_only``: for tools that read a stopped bookie's index (the shell's
        ``lastmark``, ``bookieinfo``): nothing is created or written, LMDB's lock file
        included, so the caller must make sure no bookie runs on the directory."""
        if read_only:
            if not (directory / "data.mdb").is_file():
                raise BookieIOError(f"index {directory}: no index here (no data.mdb)")
        else:
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
                readonly=read_only,
                lock=not read_only,
            )
        except lmdb.Error as exc:
            raise BookieIOError(f"index {directory}: cannot open LMDB: {exc}") from exc
        self.directory = directory
        create = not read_only
        try:
            self._entries = self._env.open_db(b"entries", create=create)
            self._ledgers = self._env.open_db(b"ledgers", create=create)
            self._counts = self._env.open_db(b"counts", create=create)
            self._logs = self._env.open_db(b"logs", create=create)
            self._meta = self._env.open_db(b"meta", create=create)
            self._usage = self._env.open_db(b"usage", create=create)
            self._check_format()
        except lmdb.Error as exc:
            self._env.close()
            raise _lmdb_failed(directory, "opening its tables", exc) from exc
        except BaseException:
            self._env.close()
            raise

    def _check_format(self) -> None:
        """Refuse an index written in another format (one written before checksums has
        a mark and no format record); a new one gets its format at the first commit."""
        with self._env.begin(db=self._meta) as txn:
            value = txn.get(_FORMAT_KEY)
            old = value is None and txn.get(_MARK_KEY) is not None
        if old:
            raise IndexFormatError(
                f"index {self.directory} was written by a version of quorumlog from before "
                f"checksummed index values (format 1, values without checksums); this "
                f"version reads format {FORMAT_VERSION} only and does not convert it. Start "
                f"this bookie with the version that wrote it, or retire it: stop it, wipe "
                f"its data and journal directories and let autorecovery re-replicate its "
                f"ledgers (docs/OPERATIONS.md)"
            )
        if value is None:
            return
        (version,) = _FORMAT.unpack(
            _unseal(_FORMAT_KEY, value, _FORMAT.size, f"index {self.directory}: the format record")
        )
        if version != FORMAT_VERSION:
            raise IndexFormatError(
                f"index {self.directory} is in format {version}; this version of quorumlog "
                f"reads format {FORMAT_VERSION} only"
            )

    def _damage(self, what: str) -> IndexDamageError:
        return IndexDamageError(f"index {self.directory}: {what} fails its checksum")

    # ------------------------------------------------------------ loading

    def load_states(self) -> dict[int, LedgerState]:
        """Every ledger's state. A state whose value fails its checksum while its key is
        sound (the damage located in the value) is returned with ``damaged`` set: that
        ledger's state is unknown. Damage that leaves the ledger in doubt (in the key,
        or not one bit) raises IndexDamageError naming the record."""
        states: dict[int, LedgerState] = {}
        with self._env.begin(db=self._ledgers) as txn:
            for key, value in txn.cursor():
                sized = len(key) == _LEDGER_KEY.size and len(value) >= STATE_SIZE + CHECK_SIZE
                if sized and _sound(key, value):
                    (ledger_id,) = _LEDGER_KEY.unpack(key)
                    try:
                        state = LedgerState.from_bytes(ledger_id, value[:-CHECK_SIZE])
                    except struct.error as exc:  # sound, so written so: not a flipped bit
                        raise IndexDamageError(
                            f"index {self.directory}: the state of ledger {ledger_id} does "
                            f"not decode: {exc}"
                        ) from exc
                    states[ledger_id] = state
                    continue
                state = self._damaged_state(key, value, sized)
                states[state.ledger_id] = state
        return states

    def _damaged_state(self, key: bytes, value: bytes, sized: bool) -> LedgerState:
        bit = flipped_bit(key + value) if sized else None
        ledger_id = _LEDGER_KEY.unpack(key)[0] if len(key) == _LEDGER_KEY.size else None
        record = f"the state record stored under ledger {ledger_id} (key {key.hex()})"
        if bit is None:
            raise IndexDamageError(
                f"index {self.directory}: {record} fails its checksum and the damage is "
                f"more than one bit: which ledger it belongs to is unknown, and with it "
                f"that ledger's fence, master key and LAC; refusing to start. The bookie "
                f"cannot be repaired in place: retire it (stop it, wipe its directories and "
                f"let autorecovery re-replicate its ledgers)"
            )
        if bit < 8 * len(key) or ledger_id is None:
            fixed = bytearray(key)
            fixed[bit >> 3] ^= 0x80 >> (bit & 7)
            owner = _LEDGER_KEY.unpack(bytes(fixed))[0]
            raise IndexDamageError(
                f"index {self.directory}: {record} fails its checksum, and the flipped bit "
                f"is in its key: the record is ledger {owner}'s, whose state (fence, master "
                f"key, LAC) this bookie could otherwise take for absent; refusing to start. "
                f"The bookie cannot be repaired in place: retire it (stop it, wipe its "
                f"directories and let autorecovery re-replicate its ledgers)"
            )
        why = (
            f"index {self.directory}: the state of ledger {ledger_id} fails its checksum "
            f"(bit {bit - 8 * len(key)} of the value flipped): its fence, master key and LAC "
            f"are unknown"
        )
        log.error(
            "%s; every request of that ledger but a delete answers an I/O error until it "
            "is deleted or garbage-collected",
            why,
        )
        state = LedgerState(ledger_id)
        state.damaged = why
        return state

    def load_logs(self) -> dict[int, set[int]]:
        """The ledgers of each entry log; IndexDamageError if a value is damaged (the
        caller rebuilds the table from the entries, :meth:`scan_logs`)."""
        logs: dict[int, set[int]] = {}
        with self._env.begin(db=self._logs) as txn:
            for key, value in txn.cursor():
                what = f"index {self.directory}: the ledger list of entry log {key.hex()}"
                payload = _unseal(key, value, None, what)
                if len(key) != _LOG_KEY.size or len(payload) % 8:
                    raise IndexDamageError(f"{what} fails its checksum")
                (log_id,) = _LOG_KEY.unpack(key)
                logs[log_id] = set(struct.unpack(f">{len(payload) // 8}Q", payload))
        return logs

    def load_usage(self) -> dict[int, dict[int, int]] | None:
        """Bytes per ledger per entry log; None for an index without the table while it
        holds entries (then :meth:`scan_logs` rebuilds it). IndexDamageError if a value
        is damaged."""
        usage: dict[int, dict[int, int]] = {}
        with self._env.begin(db=self._usage) as txn:
            for key, value in txn.cursor():
                what = f"index {self.directory}: the usage of entry log {key.hex()}"
                payload = _unseal(key, value, None, what)
                if len(key) != _LOG_KEY.size or len(payload) % 16:
                    raise IndexDamageError(f"{what} fails its checksum")
                (log_id,) = _LOG_KEY.unpack(key)
                pairs = struct.unpack(f">{len(payload) // 8}Q", payload)
                usage[log_id] = dict(zip(pairs[::2], pairs[1::2], strict=True))
        if not usage:
            with self._env.begin(db=self._entries) as txn:
                if txn.cursor().first():
                    return None
        return usage

    def scan_logs(self) -> tuple[dict[int, set[int]], dict[int, dict[int, int]]]:
        """The ledgers of each entry log and the bytes each takes there, counted from
        every entry (one pass; the tables' contents when they cannot be read).
        IndexDamageError if an entry record is damaged: its log is then unknown."""
        logs: dict[int, set[int]] = {}
        usage: dict[int, dict[int, int]] = {}
        unpack_key, unpack_loc = _ENTRY_KEY.unpack, _LOCATION.unpack_from
        with self._env.begin(db=self._entries) as txn:
            for key, value in txn.cursor():
                if not _sound_location(key, value):
                    raise self._damage(f"the entry record under key {key.hex()}")
                ledger_id = unpack_key(key)[0]
                log_id, _, size = unpack_loc(value)
                logs.setdefault(log_id, set()).add(ledger_id)
                per_ledger = usage.setdefault(log_id, {})
                per_ledger[ledger_id] = per_ledger.get(ledger_id, 0) + size + 8
        return logs, usage

    def scan_usage(self) -> dict[int, dict[int, int]]:
        """Bytes per ledger per entry log, counted from every entry (one pass)."""
        return self.scan_logs()[1]

    def entries_in_log(
        self, ledger_id: int, log_id: int, after: int, limit: int
    ) -> tuple[list[int], int | None]:
        """Ids of ``ledger_id``'s entries above ``after`` that the index places in log
        ``log_id``, looking at most at ``limit`` entries; and the entry id to go on
        after (None when the ledger's entries are all seen). IndexDamageError at a
        damaged record."""
        prefix = _LEDGER_KEY.pack(ledger_id)
        found: list[int] = []
        unpack_key, unpack_loc = _ENTRY_KEY.unpack, _LOCATION.unpack_from
        try:
            with self._env.begin(db=self._entries) as txn:
                cursor = txn.cursor()
                start = _ENTRY_KEY.pack(ledger_id, after + 1) if after >= 0 else prefix + bytes(8)
                ok = cursor.set_range(start)
                seen = 0
                last = after
                while ok and cursor.key()[:8] == prefix:
                    if seen >= limit:
                        return found, last
                    key, value = cursor.item()
                    if not _sound_location(key, value):
                        raise self._damage(f"the entry record under key {key.hex()}")
                    last = unpack_key(key)[1]
                    if unpack_loc(value)[0] == log_id:
                        found.append(last)
                    seen += 1
                    ok = cursor.next()
        except lmdb.Error as exc:
            raise _lmdb_failed(self.directory, f"a scan of ledger {ledger_id}", exc) from exc
        return found, None

    def load_mark(self) -> tuple[int, int] | None:
        with self._env.begin(db=self._meta) as txn:
            value = txn.get(_MARK_KEY)
        if value is None:
            return None
        payload = _unseal(
            _MARK_KEY, value, _MARK.size, f"index {self.directory}: the checkpoint mark"
        )
        file_id, offset = _MARK.unpack(payload)
        return file_id, offset

    def load_log_end(self) -> tuple[int, int] | None:
        """The entry log that was current at the last checkpoint and its end then (None
        if unknown); IndexDamageError if the record is damaged."""
        with self._env.begin(db=self._meta) as txn:
            value = txn.get(_LOG_END_KEY)
        if value is None:
            return None
        payload = _unseal(
            _LOG_END_KEY, value, _LOG_END.size, f"index {self.directory}: the log end record"
        )
        log_id, end = _LOG_END.unpack(payload)
        return log_id, end

    # ------------------------------------------------------------ reading

    def get(self, ledger_id: int, entry_id: int) -> Location | None:
        key = _ENTRY_KEY.pack(ledger_id, entry_id)
        try:
            with self._env.begin(db=self._entries, buffers=False) as txn:
                value = txn.get(key)
        except lmdb.Error as exc:
            raise _lmdb_failed(self.directory, f"a lookup of ledger {ledger_id}", exc) from exc
        if value is None:
            return None
        if not _sound_location(key, value):
            raise _entry_damage(ledger_id, entry_id)
        log_id, offset, size = _LOCATION.unpack_from(value)
        return log_id, offset, size

    def reader(self) -> IndexReader:
        """A read transaction for several lookups (close it, or use ``with``)."""
        try:
            return IndexReader(self._env.begin(db=self._entries, buffers=False))
        except lmdb.Error as exc:
            raise _lmdb_failed(self.directory, "a read transaction", exc) from exc

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

    def prove_complete(self, ledger_id: int) -> None:
        """Check that the index holds every entry record it committed for ``ledger_id``:
        each of its records sound, and as many as its count says (a record whose key
        lost a bit is elsewhere, and only the count misses it). IndexDamageError if not:
        then an entry the index does not hold may have been lost from it, not never
        written (R17). One pass over the ledger's records."""
        prefix = _LEDGER_KEY.pack(ledger_id)
        try:
            with self._env.begin(db=self._entries) as txn:
                raw = txn.get(prefix, db=self._counts)
                expected = 0
                if raw is not None:
                    what = f"index {self.directory}: the entry count of ledger {ledger_id}"
                    (expected,) = _COUNT.unpack(_unseal(prefix, raw, _COUNT.size, what))
                cursor = txn.cursor()
                found = 0
                if cursor.set_range(prefix + bytes(8)):
                    items = takewhile(lambda item: item[0][:8] == prefix, cursor.iternext())
                    while chunk := list(islice(items, _CHECK_CHUNK_RECORDS)):
                        joined = b"".join(chain.from_iterable(chunk))
                        whole = len(joined) == len(chunk) * _ENTRY_RECORD_SIZE
                        if not whole or crc32c(joined) != _run_check(len(chunk)):
                            raise IndexDamageError(
                                f"index {self.directory}: a record of ledger {ledger_id}'s "
                                f"entries fails its checksum"
                            )
                        found += len(chunk)
        except lmdb.Error as exc:
            raise _lmdb_failed(self.directory, f"a check of ledger {ledger_id}", exc) from exc
        if found != expected:
            raise IndexDamageError(
                f"index {self.directory}: ledger {ledger_id} has {found} entry records where "
                f"{expected} were committed: records were lost from the index"
            )

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
        pack_check = _CHECK.pack
        with self._env.begin(write=True) as txn:
            for ledger_id in update.purge_ledgers:
                self._purge(txn, ledger_id)
            entries_db = self._entries
            for ledger_id, locations in update.entries:
                keys = list(map(pack_key, repeat(ledger_id), locations))
                payloads = list(starmap(pack_loc, locations.values()))
                checks = map(pack_check, map(crc32c, map(add, keys, payloads)))
                values = map(add, payloads, checks)
                before = txn.stat(entries_db)["entries"]
                txn.cursor(db=entries_db).putmulti(zip(keys, values, strict=True))
                self._count(txn, ledger_id, txn.stat(entries_db)["entries"] - before)
            for ledger_id in update.dropped_states:
                txn.delete(_LEDGER_KEY.pack(ledger_id), db=self._ledgers)
            for ledger_id, state_bytes in update.states:
                key = _LEDGER_KEY.pack(ledger_id)
                txn.put(key, seal(key, state_bytes), db=self._ledgers)
            if update.replace_log_tables:
                txn.drop(self._logs, delete=False)
                txn.drop(self._usage, delete=False)
            for log_id in update.dropped_logs:
                txn.delete(_LOG_KEY.pack(log_id), db=self._logs)
                txn.delete(_LOG_KEY.pack(log_id), db=self._usage)
            for log_id, per_ledger in update.usage:
                flat = [n for pair in sorted(per_ledger.items()) for n in pair]
                key = _LOG_KEY.pack(log_id)
                txn.put(key, seal(key, struct.pack(f">{len(flat)}Q", *flat)), db=self._usage)
            for log_id, ledger_ids in update.logs:
                key = _LOG_KEY.pack(log_id)
                value = struct.pack(f">{len(ledger_ids)}Q", *ledger_ids)
                txn.put(key, seal(key, value), db=self._logs)
            meta = self._meta
            txn.put(_FORMAT_KEY, seal(_FORMAT_KEY, _FORMAT.pack(FORMAT_VERSION)), db=meta)
            txn.put(_MARK_KEY, seal(_MARK_KEY, _MARK.pack(*update.mark)), db=meta)
            if update.log_end is not None:
                txn.put(_LOG_END_KEY, seal(_LOG_END_KEY, _LOG_END.pack(*update.log_end)), db=meta)

    def _count(self, txn: lmdb.Transaction, ledger_id: int, added: int) -> None:
        """Add ``added`` new entry records to the ledger's count. A damaged count stays as
        it is: that ledger's absent entries stay unproven (I/O errors), and a checkpoint
        never fails for it."""
        if not added:
            return
        key = _LEDGER_KEY.pack(ledger_id)
        raw = txn.get(key, db=self._counts)
        count = 0
        if raw is not None:
            if len(raw) != _COUNT.size + CHECK_SIZE or not _sound(key, bytes(raw)):
                return
            (count,) = _COUNT.unpack_from(raw)
        txn.put(key, seal(key, _COUNT.pack(count + added)), db=self._counts)

    def _purge(self, txn: lmdb.Transaction, ledger_id: int) -> None:
        prefix = _LEDGER_KEY.pack(ledger_id)
        txn.delete(prefix, db=self._counts)
        cursor = txn.cursor(db=self._entries)
        if not cursor.set_range(prefix + bytes(8)):
            return
        while cursor.key()[:8] == prefix:
            if not cursor.delete():  # deletes and moves to the next record
                break

    def close(self) -> None:
        self._env.close()


def _entry_damage(ledger_id: int, entry_id: int) -> IndexDamageError:
    return IndexDamageError(
        f"the index record of ledger {ledger_id} entry {entry_id} fails its checksum"
    )


class IndexReader:
    """Several lookups in one read transaction.

    A batch read asks for consecutive entries of one ledger, whose keys are adjacent
    in ``entries``: after a hit, the next lookup first tries the cursor's next record
    (no search from the root), and searches only if that is not the key asked for.
    Every value is checked (IndexDamageError); an LMDB failure is a BookieIOError."""

    __slots__ = ("_cursor", "_following", "_txn")

    def __init__(self, txn: lmdb.Transaction) -> None:
        self._txn = txn
        self._cursor = txn.cursor()
        # The records after the last one found, in key order (none before a first hit).
        self._following: Iterator[tuple[_Buffer, _Buffer]] = iter(())

    def get(self, ledger_id: int, entry_id: int) -> Location | None:
        key = _ENTRY_KEY.pack(ledger_id, entry_id)
        try:
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
        except lmdb.Error as exc:
            self._following = iter(())
            raise BookieIOError(f"index lookup of ledger {ledger_id} failed: {exc!r}") from exc
        if len(value) != _SEALED_LOCATION_SIZE or crc32c(key + value) != _RESIDUE:
            raise _entry_damage(ledger_id, entry_id)
        log_id, offset, size = _LOCATION.unpack_from(value)
        return log_id, offset, size

    def run(self, ledger_id: int, first_entry_id: int, count: int) -> list[Location]:
        """The locations of entries ``first_entry_id`` to ``first_entry_id + count - 1``
        if the index holds every one of them, else an empty list (ask :meth:`get`).

        One search, then the values are taken and unpacked in C: keys are unique and
        ordered, so ``count`` records from the first key to the last one asked for are
        exactly the entries asked for. The values' checksums are not checked here, on the
        batch read's hot path (taking the keys to check them costs about a tenth of a
        read): a location is only ever used to read a record that carries its own CRC and
        its ledger and entry ids, which the read checks, so a damaged location is an I/O
        error there (R9), never another entry's bytes and never absence."""
        if count <= 0:
            return []
        cursor = self._cursor
        self._following = iter(())
        try:
            if not cursor.set_key(_ENTRY_KEY.pack(ledger_id, first_entry_id)):
                return []
            values = list(islice(cursor.iternext(keys=False, values=True), count))
            last_key = cursor.key()
        except lmdb.Error as exc:
            raise BookieIOError(f"index lookup of ledger {ledger_id} failed: {exc!r}") from exc
        joined = b"".join(values)
        if (
            len(values) != count
            or last_key != _ENTRY_KEY.pack(ledger_id, first_entry_id + count - 1)
            or len(joined) != count * _SEALED_LOCATION_SIZE
        ):
            return []  # a gap, the ledger's end, or a damaged record: get() says which
        return list(_SEALED_LOCATION.iter_unpack(joined))

    def close(self) -> None:
        self._txn.abort()

    def __enter__(self) -> IndexReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
