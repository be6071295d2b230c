"""The journal's files, records and manifests, as they lie on disk.

Files ``<journal dir>/<file id as 16 hex digits>.jnl``::

    header   8 bytes magic b"QLJRNL02", uint64 file id, 8 random bytes (the file's salt)
    records  uint32 length L (type + payload), uint8 type, payload, uint32 CRC32C
             of the L + 4 bytes before it                          (big-endian)

Record types: ADD (ledger id + entry-log records, one per entry, so an add
request is one record), MASTER_KEY, FENCE, LAC (explicit), DELETE, BATCH, whose
payload is the file's salt: the writer puts one in front of every batch, MANIFEST
(the salt, then per ledger of the batch: lowest and highest entry id added, fence,
explicit LAC, master key, delete), right after the BATCH record and again as the
batch's last record, and PAD (zeros up to a block boundary, written by direct
writes; replay passes over it).
"""

from __future__ import annotations

import errno
import functools
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crc32c import crc32c

from quorumlog.bookie.fileops import REAL_FILES, FileOps

# The magic is a name and two format digits. Format 2 added batch markers; a file in any
# other format is refused by name (JournalFormatError), never replayed or skipped as damage.
JOURNAL_FORMAT = 2
_MAGIC_NAME = b"QLJRNL"
JOURNAL_MAGIC = _MAGIC_NAME + b"%02d" % JOURNAL_FORMAT
FILE_HEADER = struct.Struct(">8sQ8s")  # magic, file id, salt
FILE_HEADER_SIZE = FILE_HEADER.size
SALT_SIZE = 8

RECORD_ADD = 1
RECORD_MASTER_KEY = 2
RECORD_FENCE = 3
RECORD_LAC = 4
RECORD_DELETE = 5
RECORD_BATCH = 6
RECORD_PAD = 7
RECORD_MANIFEST = 8
# Not stored: what :func:`~.replay.scan` yields for the leading manifest of a damaged last batch
# whose closing manifest is not whole (see there).
RECORD_UNCLOSED_MANIFEST = 0x100 | RECORD_MANIFEST
RECORD_TYPES = frozenset(
    (
        RECORD_ADD,
        RECORD_MASTER_KEY,
        RECORD_FENCE,
        RECORD_LAC,
        RECORD_DELETE,
        RECORD_BATCH,
        RECORD_PAD,
        RECORD_MANIFEST,
    )
)

_LEN = struct.Struct(">I")
_CRC = _LEN
_HEAD = struct.Struct(">IB")
_HEAD_LEDGER = struct.Struct(">IBQ")
_LEDGER = struct.Struct(">Q")
_LEDGER_LAC = struct.Struct(">Qq")
RECORD_OVERHEAD = _HEAD.size + _CRC.size  # bytes around a payload
_NAME = re.compile(r"^([0-9a-f]{16})\.jnl$")
NONZERO = re.compile(rb"[^\x00]")
BATCH_MARKER_SIZE = _HEAD.size + SALT_SIZE + _CRC.size
# A manifest: the salt, then per ledger of the batch its facts (ledger id, lowest and
# highest entry id added or -1, flags), the explicit LAC (flag LAC) and the master key
# (flag KEY: its length, then the key).
LEDGER_FACTS = struct.Struct(">QqqB")
_LAC = struct.Struct(">q")
_KEY_LENGTH = struct.Struct(">B")
MANIFEST_FENCED = 1
MANIFEST_LAC = 2
MANIFEST_KEY = 4
MANIFEST_DELETED = 8
MANIFEST_OVERHEAD = RECORD_OVERHEAD + SALT_SIZE
# The most one record adds to its batch's two manifests (a new ledger with a key).
FACTS_MAX_BYTES = 2 * (LEDGER_FACTS.size + _LAC.size + _KEY_LENGTH.size + 255)
NO_ENTRY = 1 << 63  # "no entry added" while a batch's lowest entry id is gathered

PAGE_BYTES = 4096  # also the block size direct writes are aligned to
# A failed open for want of descriptors: nothing was created, try again later.
OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


# ---------------------------------------------------------------- records

# What a record tells its batch's manifest, worked out on the loop when it is queued (the
# writer thread never parses records): ledger id, record type, the lowest entry id (ADD)
# or the LAC (LAC), the highest entry id (ADD), the master key (MASTER_KEY).
Fact = tuple[int, int, int, int, bytes]
# Byte strings to write in order, their total size, and the record's fact.
Record = tuple[list[bytes], int, Fact]

_ENTRY_IDS = struct.Struct(">II8xq")  # entry-log record: size, CRC; blob: ledger id, entry id


def add_record(
    ledger_id: int, data: bytes, first_entry_id: int = -1, last_entry_id: int = -1
) -> Record:
    """One add request: ledger id and its entries as entry-log records (``format_records``),
    the lowest and highest entry id among them (read from ``data`` when not given)."""
    if last_entry_id < 0:
        first_entry_id, last_entry_id = _entry_id_range(data)
    head = _HEAD_LEDGER.pack(1 + 8 + len(data), RECORD_ADD, ledger_id)
    crc = crc32c(data, crc32c(head))
    fact = (ledger_id, RECORD_ADD, first_entry_id, last_entry_id, b"")
    return [head, data, _CRC.pack(crc)], len(head) + len(data) + 4, fact


def _entry_id_range(data: bytes) -> tuple[int, int]:
    ids = []
    pos = 0
    while pos + _ENTRY_IDS.size <= len(data):
        size, _, entry_id = _ENTRY_IDS.unpack_from(data, pos)
        ids.append(entry_id)
        pos += 8 + size
    return (min(ids), max(ids)) if ids else (-1, -1)


def _small_record(kind: int, payload: bytes, fact: Fact) -> Record:
    body = _HEAD.pack(1 + len(payload), kind) + payload
    return [body + _CRC.pack(crc32c(body))], len(body) + 4, fact


_NO_FACT: Fact = (0, 0, 0, 0, b"")


@functools.lru_cache(maxsize=64)  # a journal pads with a few sizes over and over
def pad_record(total_bytes: int) -> bytes:
    """A PAD record of ``total_bytes`` in all (at least RECORD_OVERHEAD): zeros."""
    payload = bytes(total_bytes - RECORD_OVERHEAD)
    return b"".join(_small_record(RECORD_PAD, payload, _NO_FACT)[0])


def master_key_record(ledger_id: int, master_key: bytes) -> Record:
    fact = (ledger_id, RECORD_MASTER_KEY, 0, 0, master_key)
    return _small_record(RECORD_MASTER_KEY, _LEDGER.pack(ledger_id) + master_key, fact)


def fence_record(ledger_id: int) -> Record:
    fact = (ledger_id, RECORD_FENCE, 0, 0, b"")
    return _small_record(RECORD_FENCE, _LEDGER.pack(ledger_id), fact)


def lac_record(ledger_id: int, lac: int) -> Record:
    fact = (ledger_id, RECORD_LAC, lac, 0, b"")
    return _small_record(RECORD_LAC, _LEDGER_LAC.pack(ledger_id, lac), fact)


def delete_record(ledger_id: int) -> Record:
    fact = (ledger_id, RECORD_DELETE, 0, 0, b"")
    return _small_record(RECORD_DELETE, _LEDGER.pack(ledger_id), fact)


# ---------------------------------------------------------------- manifests

# Per ledger while a batch is gathered: lowest and highest entry id added (NO_ENTRY and
# -1 when none), MANIFEST_* flags, explicit LAC, master key.
Summary = dict[int, list[Any]]


def note_state(facts: list[Any], kind: int, value: int, key: bytes) -> int:
    """Add a record other than ADD to a ledger's facts; returns the bytes its manifest grew."""
    flags = facts[2]
    if kind == RECORD_FENCE:
        facts[2] = flags | MANIFEST_FENCED
    elif kind == RECORD_LAC:
        facts[2] = flags | MANIFEST_LAC
        if not flags & MANIFEST_LAC or value > facts[3]:
            facts[3] = value
        return 0 if flags & MANIFEST_LAC else _LAC.size
    elif kind == RECORD_MASTER_KEY:
        if not flags & MANIFEST_KEY:  # the first key journaled is the one kept
            facts[2] = flags | MANIFEST_KEY
            facts[4] = key
            return _KEY_LENGTH.size + len(key)
    elif kind == RECORD_DELETE:
        facts[2] = flags | MANIFEST_DELETED
    return 0


def summarize(records: list[Record]) -> Summary:
    """The facts of ``records``, per ledger, as the writer gathers them for a manifest."""
    summary: Summary = {}
    for _, _, (ledger_id, kind, a, b, key) in records:
        facts = summary.setdefault(ledger_id, [NO_ENTRY, -1, 0, -1, b""])
        if kind == RECORD_ADD:
            facts[0] = min(facts[0], a)
            facts[1] = max(facts[1], b)
        else:
            note_state(facts, kind, a, key)
    return summary


def manifest_record(salt: bytes, summary: Summary) -> bytes:
    """The MANIFEST record of a batch: what it holds, per ledger, behind the file's salt."""
    out = [salt]
    for ledger_id, (lo, hi, flags, lac, key) in summary.items():
        if hi < 0:
            lo = -1
        out.append(LEDGER_FACTS.pack(ledger_id, lo, hi, flags))
        if flags & MANIFEST_LAC:
            out.append(_LAC.pack(lac))
        if flags & MANIFEST_KEY:
            out.append(_KEY_LENGTH.pack(len(key)) + key)
    return b"".join(_small_record(RECORD_MANIFEST, b"".join(out), _NO_FACT)[0])


@dataclass(frozen=True, slots=True)
class LedgerFacts:
    """What a batch's manifest says about one ledger."""

    ledger_id: int
    first_entry_id: int  # -1: the batch added no entry of it
    last_entry_id: int
    fenced: bool = False
    deleted: bool = False
    explicit_lac: int | None = None
    master_key: bytes | None = None


def decode_manifest(payload: bytes | memoryview) -> list[LedgerFacts]:
    """A manifest's facts (``payload`` after the salt, as :func:`~.replay.scan` yields it)."""
    out = []
    pos = 0
    while pos < len(payload):
        ledger_id, lo, hi, flags = LEDGER_FACTS.unpack_from(payload, pos)
        pos += LEDGER_FACTS.size
        lac = key = None
        if flags & MANIFEST_LAC:
            (lac,) = _LAC.unpack_from(payload, pos)
            pos += _LAC.size
        if flags & MANIFEST_KEY:
            (length,) = _KEY_LENGTH.unpack_from(payload, pos)
            key = bytes(payload[pos + 1 : pos + 1 + length])
            pos += 1 + length
        fenced, deleted = bool(flags & MANIFEST_FENCED), bool(flags & MANIFEST_DELETED)
        out.append(LedgerFacts(ledger_id, lo, hi, fenced, deleted, lac, key))
    return out


def decode_ledger(payload: memoryview) -> int:
    return int(_LEDGER.unpack_from(payload)[0])


def decode_ledger_lac(payload: memoryview) -> tuple[int, int]:
    ledger_id, lac = _LEDGER_LAC.unpack_from(payload)
    return ledger_id, lac


# ---------------------------------------------------------------- files


def journal_file_name(file_id: int) -> str:
    return f"{file_id:016x}.jnl"


def list_journal_ids(directory: Path, ops: FileOps = REAL_FILES) -> list[int]:
    ids = []
    for name in ops.listdir(directory):
        match = _NAME.match(name)
        if match:
            ids.append(int(match.group(1), 16))
    return sorted(ids)


def create_journal_file(
    directory: Path,
    file_id: int,
    salt: bytes | None = None,
    ops: FileOps = REAL_FILES,
    block_bytes: int = 0,
    directory_fd: int | None = None,
) -> int:
    """Create a new journal file with its header, durable (file and directory entry).

    With ``block_bytes`` (direct writes), a PAD record fills the header's block, so that
    the first batch starts on a block of its own and never writes over the header. With
    ``directory_fd`` (the directory, held open) the directory is synced through it, so
    the file's own descriptor is the only one this needs."""
    if salt is None:
        salt = os.urandom(SALT_SIZE)
    path = directory / journal_file_name(file_id)
    fd = ops.create_append(path)
    try:
        header = FILE_HEADER.pack(JOURNAL_MAGIC, file_id, salt)
        if block_bytes:
            header += pad_record(block_bytes - FILE_HEADER_SIZE)
        written = 0
        while written < len(header):
            written += ops.write(fd, header[written:])
        ops.fsync(fd)
        if directory_fd is None:
            ops.fsync_directory(directory)
        else:
            ops.fsync(directory_fd)
    except BaseException:
        ops.close(fd)
        raise
    return fd


def batch_marker(salt: bytes) -> bytes:
    """The BATCH record that starts every batch of the file with this salt.

    The salt is random and never leaves the bookie, so no entry can carry a copy of
    a file's marker: replay can look for the next batch after damage without ever
    mistaking an entry's bytes for records.
    """
    return b"".join(_small_record(RECORD_BATCH, salt, _NO_FACT)[0])


def delete_journal_files_before(
    directory: Path, file_id: int, ops: FileOps = REAL_FILES
) -> list[int]:
    """Remove journal files wholly before the mark's file; returns their ids."""
    removed = []
    for old in list_journal_ids(directory, ops):
        if old >= file_id:
            break
        try:
            ops.unlink(directory / journal_file_name(old))
        except FileNotFoundError:
            continue
        removed.append(old)
    return removed


def record_at(buf: bytes, view: memoryview, pos: int, end: int) -> tuple[int, str]:
    """(total size, "") for a valid record at ``pos``, else (0, why it is not)."""
    if end - pos < RECORD_OVERHEAD:
        return 0, "short record"
    (length,) = _LEN.unpack_from(buf, pos)
    if length < 1 or pos + 4 + length + 4 > end:
        return 0, f"impossible length {length}"
    (stored,) = _CRC.unpack_from(buf, pos + 4 + length)
    if crc32c(view[pos : pos + 4 + length]) != stored:
        return 0, "checksum mismatch"
    if buf[pos + 4] not in RECORD_TYPES:
        return 0, f"unknown record type {buf[pos + 4]}"
    return length + 8, ""


# ---------------------------------------------------------------- inspection

RECORD_NAMES = {
    RECORD_ADD: "ADD",
    RECORD_MASTER_KEY: "MASTER_KEY",
    RECORD_FENCE: "FENCE",
    RECORD_LAC: "LAC",
    RECORD_DELETE: "DELETE",
    RECORD_BATCH: "BATCH",
    RECORD_PAD: "PAD",
    RECORD_MANIFEST: "MANIFEST",
}


@dataclass(frozen=True, slots=True)
class FileRecord:
    """One record of a journal file as it lies there (:func:`file_records`): its offset,
    type (``RECORD_*``) and payload; or, with ``damage`` set (type 0), the bytes from a
    damaged record to the next batch marker (or the file's end), and why."""

    offset: int
    kind: int
    payload: memoryview
    damage: str = ""


def other_format(magic: bytes) -> int | None:
    """The format a journal header's magic names, when it is not :data:`JOURNAL_FORMAT`
    (None for the current format and for bytes that are no journal magic)."""
    digits = magic[len(_MAGIC_NAME) : len(_MAGIC_NAME) + 2]
    if not magic.startswith(_MAGIC_NAME) or len(digits) != 2 or not digits.isdigit():
        return None
    version = int(digits)
    return None if version == JOURNAL_FORMAT else version


def file_header(buf: bytes, file_id: int) -> tuple[bytes | None, str]:
    """The salt of a journal file's header, or None and why the header is not whole."""
    version = other_format(bytes(buf[:8])) if len(buf) >= FILE_HEADER_SIZE else None
    if version is not None:
        return None, f"journal format {version}; this version reads format {JOURNAL_FORMAT}"
    if len(buf) < FILE_HEADER_SIZE:
        return None, f"shorter ({len(buf)} bytes) than its header"
    magic, header_id, salt = FILE_HEADER.unpack_from(buf)
    if magic != JOURNAL_MAGIC:
        return None, f"bad magic {bytes(magic)!r}"
    if header_id != file_id:
        return None, f"its header names file id {header_id}"
    return bytes(salt), ""


def file_records(buf: bytes, salt: bytes) -> Iterator[FileRecord]:
    """Every record of one journal file's bytes (its header whole, see :func:`file_header`),
    in order, batch markers, manifests and padding included, for tools that show a
    journal: replay is :func:`~.replay.scan`. Damage is reported as one :class:`FileRecord`
    reaching to the next batch marker, where reading goes on (never inside the damaged
    bytes, as in replay); zeros to the end of the file end it (the writer writes zeros
    ahead of its batches); nothing is written."""
    view = memoryview(buf)
    end = len(buf)
    marker = batch_marker(salt)
    pos = FILE_HEADER_SIZE
    while pos < end:
        size, why = record_at(buf, view, pos, end)
        if size:
            yield FileRecord(pos, buf[pos + 4], view[pos + 5 : pos + size - 4])
            pos += size
            continue
        if NONZERO.search(buf, pos) is None:
            return
        found = buf.find(marker, pos + 1)
        resume = found if found >= 0 else end
        yield FileRecord(pos, 0, view[pos:resume], why)
        pos = resume
