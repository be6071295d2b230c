"""The journal: every change a bookie acknowledges is first appended here and synced (R2).

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

Group commit: the event loop appends records to a queue; one writer thread takes
everything queued (up to ``journal_max_batch_records`` / ``_bytes``, and for no
longer than ``journal_max_group_wait_ms``), writes it with one system call,
fdatasyncs once, and hands the whole batch's completions back to the loop with
one ``call_soon_threadsafe``. When the queue is empty it syncs at once: an idle
journal never waits for company. A batch is written only after the one before
it was synced, in this file or an earlier one. Given an executor instead (a
simulation's deterministic scheduler), each batch is one job on it, timed by the
loop's clock; files go through a :class:`~quorumlog.bookie.fileops.FileOps`.

With direct I/O (the default where the filesystem allows it) batches are written
around the page cache (``O_DIRECT``): a write must cover whole blocks, so each batch
is copied into an aligned staging buffer, followed by a PAD record up to its last
block's end, and written from the block after the previous batch's (the header's
block is filled by a PAD when the file is created). No write covers a block of an
earlier batch, so a write cut by a power loss cannot damage synced data, even on a
device whose sector writes are not atomic. A file therefore always ends in whole
records: a crash or a rollover leaves a PAD last, never zeros that replay would
take for a torn tail or for damage.

The mark (:attr:`Journal.mark`) is the position after the last batch written:
every record before it was queued, hence applied to ledger storage, before the
loop reads it, so a checkpoint may record it.

Replay (:func:`scan`) reads from the last checkpoint mark, record after record.
At a damaged record it never looks for a record inside the damaged bytes (an
entry's payload may hold anything, a well-formed record included); it only
looks for the next BATCH marker, or a MANIFEST record, which carry the file's
salt and so cannot be forged by an entry. Damage with no later batch in the last
file lies in the last batch: torn by a crash before its sync (its pages may have
reached the disk in any order), or synced, acknowledged and then damaged (a
flipped bit); the file cannot tell which. So the batch's manifests decide, on the
rule of one fault per batch: one bit cannot damage both, and a bit that damages a
record leaves the closing manifest whole. If neither is whole, or only the leading
one while records after it are damaged, the batch was torn before its sync and held
nothing acknowledged; replay yields the leading one (as RECORD_UNCLOSED_MANIFEST)
for the facts it proves (fences, keys, explicit LACs, deletes: safe to apply even
if never acknowledged). If the closing one is whole, replay yields every whole one,
and the caller keeps what they prove and answers the entries they name that were
not read back as unknown, never as absent (R17).
Either way the file is cut at the damage, its tail's bytes kept beside it.
Damage followed by a later batch, or in a file followed by another file, is
damage to synced, acknowledged data: replay refuses
(:class:`JournalCorruptionError`) unless told to skip it.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import errno
import functools
import logging
import mmap
import os
import queue
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crc32c import crc32c

from quorumlog.bookie.fileops import REAL_FILES, FileOps
from quorumlog.bookie.metrics import BookieCounters
from quorumlog.errors import BookieIOError

log = logging.getLogger(__name__)

# The magic is a name and two format digits. Format 2 added batch markers; a file in any
# other format is refused by name (JournalFormatError), never replayed or skipped as damage.
JOURNAL_FORMAT = 2
_MAGIC_NAME = b"QLJRNL"
JOURNAL_MAGIC = _MAGIC_NAME + b"%02d" % JOURNAL_FORMAT
_FILE_HEADER = struct.Struct(">8sQ8s")  # magic, file id, salt
FILE_HEADER_SIZE = _FILE_HEADER.size
SALT_SIZE = 8

RECORD_ADD = 1
RECORD_MASTER_KEY = 2
RECORD_FENCE = 3
RECORD_LAC = 4
RECORD_DELETE = 5
RECORD_BATCH = 6
RECORD_PAD = 7
RECORD_MANIFEST = 8
# Not stored: what :func:`scan` yields for the leading manifest of a damaged last batch
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
_NONZERO = re.compile(rb"[^\x00]")
# A failed open for want of descriptors: nothing was created, try again later.
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)
BATCH_MARKER_SIZE = _HEAD.size + SALT_SIZE + _CRC.size
# A manifest: the salt, then per ledger of the batch its facts (ledger id, lowest and
# highest entry id added or -1, flags), the explicit LAC (flag LAC) and the master key
# (flag KEY: its length, then the key).
_LEDGER_FACTS = struct.Struct(">QqqB")
_LAC = struct.Struct(">q")
_KEY_LENGTH = struct.Struct(">B")
MANIFEST_FENCED = 1
MANIFEST_LAC = 2
MANIFEST_KEY = 4
MANIFEST_DELETED = 8
_MANIFEST_OVERHEAD = RECORD_OVERHEAD + SALT_SIZE
# The most one record adds to its batch's two manifests (a new ledger with a key).
_FACTS_MAX_BYTES = 2 * (_LEDGER_FACTS.size + _LAC.size + _KEY_LENGTH.size + 255)
_NO_ENTRY = 1 << 63  # "no entry added" while a batch's lowest entry id is gathered

# Looked up at call time so that tests can slow it down or count it.
fdatasync = os.fdatasync

# Synced journal bytes are dropped from the page cache once this many have gathered:
# one fadvise call per MiB, not per batch, on the small-entry path.
DROP_CACHE_STEP_BYTES = 1024 * 1024
_PAGE_BYTES = 4096  # also the block size direct writes are aligned to
_STAGE_MIN_BYTES = 4 * 1024 * 1024
# A batch whose parts average this much or more is written as a list (writev), not
# joined first; at most this many parts (Linux's IOV_MAX is 1024).
_WRITEV_MIN_PART_BYTES = 4096
_WRITEV_MAX_PARTS = 1024


class JournalCorruptionError(BookieIOError):
    """A damaged journal record with valid records after it."""

    def __init__(self, message: str, path: Path, offset: int) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset


class JournalFormatError(JournalCorruptionError):
    """A journal file written in a format this version does not read (its header names
    another format). Not damage: ``journal_skip_corruption`` does not pass over it."""


def _other_format(magic: bytes) -> int | None:
    """The format a journal header's magic names, when it is not :data:`JOURNAL_FORMAT`
    (None for the current format and for bytes that are no journal magic)."""
    digits = magic[len(_MAGIC_NAME) : len(_MAGIC_NAME) + 2]
    if not magic.startswith(_MAGIC_NAME) or len(digits) != 2 or not digits.isdigit():
        return None
    version = int(digits)
    return None if version == JOURNAL_FORMAT else version


def _format_message(path: Path, version: int) -> str:
    return (
        f"journal {path}: written in journal format {version}; this version of quorumlog "
        f"reads format {JOURNAL_FORMAT} only and does not convert it. Start this bookie "
        f"with the version that wrote it until its journal is checkpointed, or retire it: "
        f"stop it, wipe its data and journal directories and let autorecovery "
        f"re-replicate its ledgers (docs/OPERATIONS.md)"
    )


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

# Per ledger while a batch is gathered: lowest and highest entry id added (_NO_ENTRY and
# -1 when none), MANIFEST_* flags, explicit LAC, master key.
Summary = dict[int, list[Any]]


def _note_state(facts: list[Any], kind: int, value: int, key: bytes) -> int:
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
        facts = summary.setdefault(ledger_id, [_NO_ENTRY, -1, 0, -1, b""])
        if kind == RECORD_ADD:
            facts[0] = min(facts[0], a)
            facts[1] = max(facts[1], b)
        else:
            _note_state(facts, kind, a, key)
    return summary


def manifest_record(salt: bytes, summary: Summary) -> bytes:
    """The MANIFEST record of a batch: what it holds, per ledger, behind the file's salt."""
    out = [salt]
    for ledger_id, (lo, hi, flags, lac, key) in summary.items():
        if hi < 0:
            lo = -1
        out.append(_LEDGER_FACTS.pack(ledger_id, lo, hi, flags))
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
    """A manifest's facts (``payload`` after the salt, as :func:`scan` yields it)."""
    out = []
    pos = 0
    while pos < len(payload):
        ledger_id, lo, hi, flags = _LEDGER_FACTS.unpack_from(payload, pos)
        pos += _LEDGER_FACTS.size
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
        header = _FILE_HEADER.pack(JOURNAL_MAGIC, file_id, salt)
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


# ---------------------------------------------------------------- replay


@dataclass(slots=True)
class ScanReport:
    """What a replay found besides records."""

    records: int = 0
    truncated: list[tuple[Path, int]] | None = None  # torn tails cut off (path, offset)
    skipped: list[tuple[Path, int, int]] | None = None  # damaged ranges skipped (path, from, to)
    last_file_id: int = 0
    first_file_id: int = 0
    # Torn tails whose batch's manifest was intact (path, offset of the damage): what the
    # manifest proves was applied, and the entries it names are unknown (``suspect``).
    manifests: list[tuple[Path, int]] | None = None
    # Entries the damaged batch held and replay could not read: (ledger id, first, last)
    # (filled by the caller that applies the manifests, :func:`~.opening.replay`).
    suspect: list[tuple[int, int, int]] | None = None
    # Torn tails found but not cut yet (scan with ``defer_cuts``): :func:`cut_torn_tails`.
    pending_cuts: list[tuple[Path, int]] | None = None


def _record_at(buf: bytes, view: memoryview, pos: int, end: int) -> tuple[int, str]:
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


def _past_pad_covering(buf: bytes, view: memoryview, mark: int, end: int) -> int:
    """Where replay from ``mark`` starts when no record starts there: after the PAD
    record that covers it, if one does. A checkpoint may record the mark after a batch
    whose sync failed or never came; after a power loss the file holds the PAD written
    before that batch in its place. Otherwise the mark stands (and is read as damage)."""
    pos = FILE_HEADER_SIZE
    while pos < mark:
        size, _ = _record_at(buf, view, pos, end)
        if not size:
            return mark
        if pos + size > mark:
            return pos + size if buf[pos + 4] == RECORD_PAD else mark
        pos += size
    return mark


def torn_tail_path(path: Path, offset: int) -> Path:
    """Where the bytes cut off ``path`` at ``offset`` are kept."""
    return path.with_name(f"{path.name}.torn-{offset}")


def _cut(path: Path, offset: int, ops: FileOps) -> None:
    """Cut a torn tail off, keeping its bytes (synced) beside the file unless they are
    all zeros: replay never destroys what it cannot read."""
    buf = ops.read_file(path)
    if _NONZERO.search(buf, offset) is not None:
        aside = torn_tail_path(path, offset)
        with contextlib.suppress(FileNotFoundError):
            ops.unlink(aside)  # a copy left by a start that stopped before the cut
        fd = ops.create(aside)
        try:
            view = memoryview(buf)[offset:]
            written = 0
            while written < len(view):
                written += ops.write(fd, view[written:])
            ops.fsync(fd)
        finally:
            ops.close(fd)
        ops.fsync_directory(path.parent)
        log.error("journal %s: bytes %d..%d moved to %s", path, offset, len(buf), aside.name)
    ops.truncate(path, offset)
    fd = ops.open_read(path)
    try:
        ops.fsync(fd)
    finally:
        ops.close(fd)


def cut_torn_tails(report: ScanReport, ops: FileOps = REAL_FILES) -> None:
    """Cut the torn tails a scan with ``defer_cuts`` found (their bytes are kept aside)."""
    for path, offset in report.pending_cuts or []:
        _cut(path, offset, ops)
    report.pending_cuts = None


def _manifests_after(buf: bytes, view: memoryview, pos: int, end: int, salt: bytes) -> list[int]:
    """Offsets of the intact MANIFEST records of this file after ``pos``. The record
    type and the file's salt, which no entry can hold, lead the search; the length and
    checksum prove the record."""
    needle = bytes((RECORD_MANIFEST,)) + salt
    found = []
    at = buf.find(needle, pos + 5)
    while at >= 0:
        start = at - 4
        size, _ = _record_at(buf, view, start, end)
        if size >= _MANIFEST_OVERHEAD:
            found.append(start)
        at = buf.find(needle, at + 1)
    return found


def _check_start(directory: Path, ids: list[int], mark: tuple[int, int] | None) -> None:
    """R15: a journal that does not begin where the index says proves nothing; stop."""
    if mark is None:
        # Journal files go only after a checkpoint recorded a mark past them, and the
        # first file a bookie ever writes is file 1.
        if ids and ids[0] > 1:
            path = directory / journal_file_name(ids[0])
            raise JournalCorruptionError(
                f"journal {directory} begins at {path.name}, so checkpoints removed the "
                f"files before it, but the index has no checkpoint mark: the index was "
                f"lost or replaced (an unmounted directory? a removed data.mdb?) and what "
                f"it held is not in the journal; refusing to start. Restore the index",
                path,
                0,
            )
        return
    if mark[0] not in ids:
        path = directory / journal_file_name(mark[0])
        raise JournalCorruptionError(
            f"journal {directory}: {path.name}, where the index's checkpoint mark points, "
            f"is missing: records acknowledged after the last checkpoint may be lost "
            f"(journal directory wiped, replaced or not mounted?); refusing to start. "
            f"Restore the journal directory",
            path,
            mark[1],
        )


def scan(
    directory: Path,
    mark: tuple[int, int] | None,
    skip_corruption: bool,
    report: ScanReport,
    ops: FileOps = REAL_FILES,
    defer_cuts: bool = False,
) -> Iterator[tuple[int, memoryview]]:
    """Yield (record type, payload) of every record from ``mark`` on, in order.

    Batch markers, manifests and PAD records are read, not yielded, except that damage
    in the last batch of the last file yields the payload of every intact manifest of
    that batch (type RECORD_MANIFEST, the payload after the salt, for
    :func:`decode_manifest`) before its tail is cut: what the batch held, which may have
    been acknowledged; or, when its closing manifest is not whole, its leading one as
    RECORD_UNCLOSED_MANIFEST: a batch torn before its sync. Cuts torn tails off (their
    bytes are moved aside; with ``defer_cuts`` they are only listed in ``report.pending_cuts``, for
    :func:`cut_torn_tails`); raises JournalCorruptionError for damage to synced data,
    unless ``skip_corruption``.
    """
    ids = list_journal_ids(directory, ops)
    _check_start(directory, ids, mark)
    start_id, start_offset = mark if mark is not None else (0, FILE_HEADER_SIZE)
    ids = [i for i in ids if i >= start_id]
    report.last_file_id = ids[-1] if ids else start_id
    report.first_file_id = ids[0] if ids else start_id
    for n, file_id in enumerate(ids):
        path = directory / journal_file_name(file_id)
        # The writer creates a file only after the last batch of the file before it was
        # synced: all but the last file hold nothing torn.
        last_file = n == len(ids) - 1
        buf = ops.read_file(path)
        end = len(buf)
        view = memoryview(buf)
        salt = _file_salt(path, file_id, buf, last_file, skip_corruption, report, ops)
        if salt is None:
            continue
        marker = batch_marker(salt)
        salt_view = memoryview(salt)
        pos = start_offset if file_id == start_id else FILE_HEADER_SIZE
        if FILE_HEADER_SIZE < pos < end and not _record_at(buf, view, pos, end)[0]:
            pos = _past_pad_covering(buf, view, pos, end)
        batch_at = -1  # where the current batch's marker is
        lead = -1  # where its leading manifest is, until its closing one is read
        while pos < end:
            size, why = _record_at(buf, view, pos, end)
            if size:
                kind = buf[pos + 4]
                if kind == RECORD_PAD:
                    pos += size
                    continue
                if kind != RECORD_BATCH and kind != RECORD_MANIFEST:
                    report.records += 1
                    yield kind, view[pos + 5 : pos + size - 4]
                    pos += size
                    continue
                if kind == RECORD_BATCH and view[pos + 5 : pos + size - 4] == salt_view:
                    batch_at, lead = pos, -1
                    pos += size
                    continue
                if kind == RECORD_MANIFEST and view[pos + 5 : pos + 5 + SALT_SIZE] == salt_view:
                    # The first record of a batch, or its last one (then the batch is whole).
                    lead = pos if pos == batch_at + BATCH_MARKER_SIZE else -1
                    pos += size
                    continue
                why = f"{'batch marker' if kind == RECORD_BATCH else 'manifest'} of another file"
            # Damage at ``pos``. Never look for a record inside it: only the writer's
            # next batch marker (which no entry can forge) says where synced data goes on.
            found = buf.find(marker, pos + 1)
            resume = found if found >= 0 else None
            if resume is None and last_file:
                # Damage in the last batch: torn by a crash before its sync, or a synced
                # batch whose bits changed since; the file cannot tell. The batch's
                # manifests (one leads it, one closes it: one flipped bit leaves one of
                # them whole) say what it held. With neither, it was torn before its sync.
                # One fault per batch: if the damage is in a record, the closing manifest
                # is whole; if it is the closing manifest, every record before it was
                # read. So a batch whose closing manifest is not whole, while records of
                # it could not be read, was torn before its sync: its leading manifest
                # proves its facts (safe to apply), but none of its entries was
                # acknowledged, so none is suspect.
                closing = _manifests_after(buf, view, pos, end, salt)
                proofs = ([lead] if lead >= 0 else []) + closing
                kind = RECORD_MANIFEST if closing else RECORD_UNCLOSED_MANIFEST
                for at in proofs:
                    manifest_size = _record_at(buf, view, at, end)[0]
                    yield kind, view[at + 5 + SALT_SIZE : at + manifest_size - 4]
                if proofs:
                    report.manifests = [*(report.manifests or []), (path, pos)]
                log.error(
                    "journal %s: damaged record at offset %d (%s) in the last batch, with "
                    "no batch after it: %s; cutting the file there",
                    path,
                    pos,
                    why,
                    f"the batch's manifest at offset {proofs[0]} says what it held, which "
                    f"may have been acknowledged: what it proves is kept, and the entries "
                    f"it names that replay could not read are answered as unknown"
                    if closing
                    else f"only the batch's leading manifest (offset {lead}) is whole, so it "
                    f"was torn by a crash before its sync: what the manifest proves is "
                    f"kept, and nothing in it was acknowledged"
                    if proofs
                    else "no manifest of the batch is whole, so it was torn by a crash "
                    "before its sync and nothing in it was acknowledged",
                )
                if defer_cuts:
                    report.pending_cuts = [*(report.pending_cuts or []), (path, pos)]
                else:
                    _cut(path, pos, ops)
                report.truncated = [*(report.truncated or []), (path, pos)]
                break
            where = (
                f"the next batch at offset {resume}"
                if resume is not None
                else f"the later file {journal_file_name(ids[n + 1])}"
            )
            message = (
                f"journal {path}: damaged record at offset {pos} ({why}) followed by valid "
                f"records ({where}): acknowledged data may be lost; refusing to start. "
                f"Restore the file, or start with journal_skip_corruption to skip the "
                f"damaged bytes"
            )
            if not skip_corruption:
                raise JournalCorruptionError(message, path, pos)
            skip_to = resume if resume is not None else end
            log.error("%s; skipping bytes %d..%d as asked", message.split(";")[0], pos, skip_to)
            report.skipped = [*(report.skipped or []), (path, pos, skip_to)]
            pos = skip_to


def _file_salt(
    path: Path,
    file_id: int,
    buf: bytes,
    last_file: bool,
    skip_corruption: bool,
    report: ScanReport,
    ops: FileOps,
) -> bytes | None:
    """The salt of journal file ``file_id`` (its batch markers' key) when its header is
    whole; None for a file to pass over: a creation cut short (removed when it is the
    last file), or a damaged header skipped as asked. Raises JournalCorruptionError for
    a damaged header otherwise, and JournalFormatError for a file of another format."""
    end = len(buf)
    version = _other_format(bytes(buf[:8])) if end >= FILE_HEADER_SIZE else None
    if version is not None:
        raise JournalFormatError(_format_message(path, version), path, 0)
    magic, header_id, salt = (
        _FILE_HEADER.unpack_from(buf) if end >= FILE_HEADER_SIZE else (b"", -1, b"")
    )
    if magic == JOURNAL_MAGIC and header_id == file_id:
        return bytes(salt)
    # The header is synced before any record is written: a bad one with nothing after it
    # (but the PAD that fills its block, for direct writes) is a creation cut short (a
    # start or a rollover whose header sync failed, or a power loss before it), which
    # never held a record, wherever the file stands; anything else is damage.
    header_only = _NONZERO.search(buf, FILE_HEADER_SIZE) is None or (
        end == _PAGE_BYTES
        and _record_at(buf, memoryview(buf), FILE_HEADER_SIZE, end)[0] == end - FILE_HEADER_SIZE
        and buf[FILE_HEADER_SIZE + 4] == RECORD_PAD
    )
    if header_only:
        if last_file:
            log.warning("journal %s: incomplete file header; removing the file", path)
            ops.unlink(path)
            report.truncated = [*(report.truncated or []), (path, 0)]
        else:
            # Kept: the files after it must stay in order, and the next start finds it
            # as empty as now.
            log.warning("journal %s: incomplete file header and no records; skipping it", path)
        return None
    message = (
        f"journal {path}: bad file header with records after it: acknowledged "
        f"data may be lost; refusing to start. Restore the file, or start with "
        f"journal_skip_corruption to skip the file"
    )
    if not skip_corruption:
        raise JournalCorruptionError(message, path, 0)
    log.error("%s; skipping the file as asked", message.split(";")[0])
    report.skipped = [*(report.skipped or []), (path, 0, end)]
    return None


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


def file_header(buf: bytes, file_id: int) -> tuple[bytes | None, str]:
    """The salt of a journal file's header, or None and why the header is not whole."""
    version = _other_format(bytes(buf[:8])) if len(buf) >= FILE_HEADER_SIZE else None
    if version is not None:
        return None, f"journal format {version}; this version reads format {JOURNAL_FORMAT}"
    if len(buf) < FILE_HEADER_SIZE:
        return None, f"shorter ({len(buf)} bytes) than its header"
    magic, header_id, salt = _FILE_HEADER.unpack_from(buf)
    if magic != JOURNAL_MAGIC:
        return None, f"bad magic {bytes(magic)!r}"
    if header_id != file_id:
        return None, f"its header names file id {header_id}"
    return bytes(salt), ""


def file_records(buf: bytes, salt: bytes) -> Iterator[FileRecord]:
    """Every record of one journal file's bytes (its header whole, see :func:`file_header`),
    in order, batch markers, manifests and padding included, for tools that show a
    journal: replay is :func:`scan`. Damage is reported as one :class:`FileRecord`
    reaching to the next batch marker, where reading goes on (never inside the damaged
    bytes, as in replay); nothing is written."""
    view = memoryview(buf)
    end = len(buf)
    marker = batch_marker(salt)
    pos = FILE_HEADER_SIZE
    while pos < end:
        size, why = _record_at(buf, view, pos, end)
        if size:
            yield FileRecord(pos, buf[pos + 4], view[pos + 5 : pos + size - 4])
            pos += size
            continue
        found = buf.find(marker, pos + 1)
        resume = found if found >= 0 else end
        yield FileRecord(pos, 0, view[pos:resume], why)
        pos = resume


# ---------------------------------------------------------------- writer

Done = tuple[Callable[[Any], None], Any]  # called as done[0](done[1]) on the loop
BatchCallback = Callable[[list[Done], int, BaseException | None], None]


class Journal:
    """The journal writer: records queued on the loop, written and synced on its own thread."""

    def __init__(
        self,
        directory: Path,
        first_file_id: int,
        *,
        sync: bool,
        max_group_wait_ms: float,
        max_batch_bytes: int,
        max_batch_records: int,
        file_max_bytes: int,
        remove_pages_from_cache: bool = True,
        direct_io: bool = False,
        ops: FileOps = REAL_FILES,
    ) -> None:
        """``direct_io``: write around the page cache where the filesystem allows it
        (where it does not, a warning says so and writes go through the cache)."""
        self.directory = directory
        self._ops = ops
        self._clock: Callable[[], float] = time.monotonic
        self.sync_enabled = sync
        self.max_group_wait_s = max_group_wait_ms / 1000
        self.max_batch_bytes = max_batch_bytes
        self.max_batch_records = max_batch_records
        self.file_max_bytes = file_max_bytes
        # The journal is read only at replay, so its synced pages are dropped from the
        # page cache (BookKeeper's journalRemovePagesFromCache): kept, they would make
        # the cache grow by every byte journaled and take a fresh page for each 4 KiB
        # written, which costs far more than reusing pages the kernel just freed.
        self.remove_pages_from_cache = remove_pages_from_cache
        self._cache_kept_from = 0  # offset in the current file of pages not yet dropped
        self.direct_io = direct_io
        self._direct_fd: int | None = None  # the current file's, for direct writes
        self._stage: mmap.mmap | None = None  # page-aligned staging buffer (direct writes)
        self._salt = b""  # the current file's
        self._records_from = FILE_HEADER_SIZE  # where the current file's first batch goes
        # Held for the journal's life: a new file needs no descriptor but its own, and
        # one that cannot be had (EMFILE) leaves the journal in its current file.
        self._dir_fd = ops.open_directory(directory)
        self._file_refused = 0  # the file id a rollover last found no descriptor for
        # The first file exists (header durable) before any record is queued, so a
        # checkpoint mark can always name an existing file.
        try:
            self._open_file(first_file_id)
        except BaseException:
            ops.close(self._dir_fd)
            raise
        self._unsynced = False
        # Writer side: where the next batch goes. Read on the loop as the mark (a tuple
        # is replaced whole, so the loop never sees half of one).
        self._mark = (first_file_id, self._records_from)
        self._queue: collections.deque[tuple[list[bytes], int, Done | None, Fact]] = (
            collections.deque()
        )
        self.queued_bytes = 0  # loop side: queued and not yet completed
        self._wake: _Wakeup | _Jobs = _Wakeup()
        self._idle = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._jobs: _Jobs | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_batch: BatchCallback | None = None
        self._failure: BaseException | None = None
        self._stopped: asyncio.Future[None] | None = None
        # Counters, written by the writer thread only.
        self.counters = BookieCounters()  # the bookie's, once it is opened
        # When the oldest record still queued was queued (a lower bound after a batch
        # left records behind): what an add's latency counts from.
        self._oldest_queued_at = 0.0
        self.sync_count = 0
        self.batch_count = 0
        self.records_written = 0

    @property
    def mark(self) -> tuple[int, int]:
        """The position after the last batch written.

        Every record before it was queued (so applied to ledger storage) before the
        caller reads it: what a checkpoint records. Records queued and not yet written
        come after it and are replayed again after a crash (replay is idempotent).
        """
        return self._mark

    @property
    def failed(self) -> BaseException | None:
        return self._failure

    def start(
        self,
        loop: asyncio.AbstractEventLoop,
        on_batch: BatchCallback,
        executor: concurrent.futures.Executor | None = None,
    ) -> None:
        """Start the writer thread; ``on_batch(dones, nbytes, error)`` runs on ``loop``.

        With ``executor`` (a deterministic scheduler that runs jobs on the loop's
        thread, as a simulation's), each batch is a job on it instead, timed by the
        loop's clock.
        """
        self._loop = loop
        self._on_batch = on_batch
        self._stopped = loop.create_future()
        if executor is not None:
            self._clock = loop.time
            self._jobs = jobs = _Jobs(self, executor)
            self._wake = jobs  # append()'s set() submits a job
            self._idle = True
            return
        self._thread = threading.Thread(target=self._run, name="bookie-journal", daemon=True)
        self._thread.start()

    def append(self, record: Record, done: Done | None) -> None:
        """Queue one record (loop thread). ``done`` is completed once it is durable."""
        parts, size, fact = record
        self.queued_bytes += size
        if not self._queue:
            self._oldest_queued_at = self._clock()
        self._queue.append((parts, size, done, fact))
        if self._idle:
            self._wake.set()

    def abandon(self) -> None:
        """Close the file of a journal that was never started."""
        if self._thread is None and self._jobs is None:
            with contextlib.suppress(OSError):
                self._close_files()

    async def close(self) -> None:
        """Write and sync what is queued, deliver its completions, stop the thread."""
        if self._thread is None and self._jobs is None:
            self._close_files()
            return
        self._stopping = True
        self._wake.set()
        assert self._stopped is not None
        await self._stopped
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # ------------------------------------------------------------ writer thread

    def _run(self) -> None:
        queue = self._queue
        loop = self._loop
        wake = self._wake
        assert loop is not None and isinstance(wake, _Wakeup)
        try:
            while True:
                if not queue:
                    self._idle = True
                    if not queue and not self._stopping:
                        wake.wait(0.1)
                    wake.clear()
                    self._idle = False
                    if not queue:
                        if self._stopping:
                            break
                        continue
                self._write_batch(queue, loop)
        finally:
            self._stop_writing(loop)

    def _stop_writing(self, loop: asyncio.AbstractEventLoop) -> None:
        with contextlib.suppress(OSError):
            self._close_files()
        with contextlib.suppress(RuntimeError):  # the loop was closed under us
            loop.call_soon_threadsafe(self._finish)

    def _finish(self) -> None:
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)

    def _write_batch(
        self,
        queue: collections.deque[tuple[list[bytes], int, Done | None, Fact]],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        max_records = self.max_batch_records
        max_bytes = self.max_batch_bytes
        clock = self._clock
        cut_at = clock()
        queued_at = min(self._oldest_queued_at, cut_at)
        deadline = cut_at + self.max_group_wait_s
        dones: list[Done] = []
        # Pieces of the batch, each for one file: that file's batch marker, a manifest of
        # the piece (what it holds, per ledger), its records, the manifest again. Only
        # the first piece goes to the current file.
        max_file = self.file_max_bytes
        piece_overhead = BATCH_MARKER_SIZE + 2 * _MANIFEST_OVERHEAD
        file_used = self._mark[1] + piece_overhead
        has_records = self._mark[1] > self._records_from
        pieces: list[tuple[list[bytes], Summary]] = []
        parts: list[bytes] = [b"", b""]  # the marker and the manifest, written last
        summary: Summary = {}
        total = 0
        count = 0
        popleft = queue.popleft
        while queue and count < max_records and total < max_bytes:
            rec_parts, size, done, fact = popleft()
            if has_records and file_used + size + _FACTS_MAX_BYTES > max_file:
                # The file is full: what follows goes to a new file, after a sync.
                pieces.append((parts, summary))
                parts = [b"", b""]
                summary = {}
                file_used = self._records_from + piece_overhead
            parts += rec_parts
            file_used += size
            ledger_id, kind, a, b, key = fact
            facts = summary.get(ledger_id)
            if facts is None:
                facts = summary[ledger_id] = [_NO_ENTRY, -1, 0, -1, b""]
                file_used += 2 * _LEDGER_FACTS.size  # in both manifests
            if kind == RECORD_ADD:
                if a < facts[0]:
                    facts[0] = a
                if b > facts[1]:
                    facts[1] = b
            else:
                file_used += 2 * _note_state(facts, kind, a, key)
            has_records = True
            total += size
            count += 1
            if done is not None:
                dones.append(done)
            if count & 63 == 0 and clock() >= deadline:
                break
        # Whatever is left was queued before this cut.
        self._oldest_queued_at = cut_at
        pieces.append((parts, summary))
        error: BaseException | None = self._failure
        if error is None:
            try:
                for n, (piece, piece_summary) in enumerate(pieces):
                    if not piece_summary:
                        continue  # the current file was full before the first record
                    if n:
                        self._sync_current()
                        self._next_file(self._mark[0] + 1)
                    manifest = manifest_record(self._salt, piece_summary)
                    piece[0] = self._marker
                    piece[1] = manifest
                    piece.append(manifest)
                    written = self._write_piece(piece)
                    self._mark = (self._mark[0], self._mark[1] + written)
                self._sync_current()
                self.records_written += count
                counters = self.counters
                counters.journal_batch_records.observe(count)
                counters.journal_batch_bytes += total
            except BaseException as exc:  # reported to every waiter
                log.error("journal %s: write failed: %s", self.directory, exc)
                self._failure = error = exc
        self.batch_count += 1
        loop.call_soon_threadsafe(self._deliver, dones, total, error, queued_at)

    def _deliver(
        self, dones: list[Done], size: int, error: BaseException | None, queued_at: float = 0.0
    ) -> None:
        self.queued_bytes -= size
        if dones and error is None:
            # One observation per batch, standing for each request it answers.
            self.counters.add_latency.observe(self._clock() - queued_at, len(dones))
        assert self._on_batch is not None
        self._on_batch(dones, size, error)

    def _write_piece(self, parts: list[bytes]) -> int:
        """Write a batch's parts (all of them, or it raises); returns how far the file's
        end moved (their size, and the PAD after them when written directly)."""
        if self._direct_fd is not None:
            return self._write_direct(self._direct_fd, parts)
        size = sum(map(len, parts))
        if len(parts) > _WRITEV_MAX_PARTS or size < len(parts) * _WRITEV_MIN_PART_BYTES:
            # Small records: one join is cheaper than the kernel walking many small parts.
            self._write_all(b"".join(parts))
            return size
        # Large records (big entries) go as they are: joining would copy each once more.
        written = self._ops.write_parts(self._fd, parts)
        if written < size:  # a short write (a full disk, a signal): the rest in one piece
            self._write_all(b"".join(parts)[written:])
        self._unsynced = True
        return size

    def _write_direct(self, fd: int, parts: list[bytes]) -> int:
        """Write the parts around the page cache, from the block after the last batch's,
        with a PAD record to the end of their last block; returns the bytes written.

        A batch never writes over a block of the batch before it: on a device whose
        sector writes are not atomic, a write cut by a power loss damages only blocks of
        a batch that was never synced, so never acknowledged."""
        size = sum(map(len, parts))
        pad = -size % _PAGE_BYTES
        if pad < RECORD_OVERHEAD:
            pad += _PAGE_BYTES
        padded = size + pad
        if self._stage is None or len(self._stage) < padded:
            if self._stage is not None:
                self._stage.close()
            # Sized for a full batch at once, so it is allocated (and faulted in) rarely.
            self._stage = mmap.mmap(-1, max(padded, _STAGE_MIN_BYTES))
        start = self._mark[1]
        with memoryview(self._stage) as view:
            position = 0
            for part in parts:
                view[position : position + len(part)] = part
                position += len(part)
            view[size:padded] = pad_record(pad)
            written = 0
            while written < padded:
                written += self._ops.pwrite(fd, view[written:padded], start + written)
        self._unsynced = True
        return padded

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        written = 0
        while written < len(view):
            written += self._ops.write(self._fd, view[written:])
        self._unsynced = True

    def _sync_current(self) -> None:
        if self.sync_enabled and self._unsynced:
            started = self._clock()
            if self._ops is REAL_FILES:
                fdatasync(self._fd)  # the module's, which tests may replace
            else:
                self._ops.fdatasync(self._fd)
            self.counters.journal_sync_latency.observe(self._clock() - started)
            self.sync_count += 1
            if self.remove_pages_from_cache and self._direct_fd is None:
                self._drop_synced_pages(DROP_CACHE_STEP_BYTES)
        self._unsynced = False

    def _drop_synced_pages(self, at_least_bytes: int) -> None:
        """Drop the current file's synced pages, once ``at_least_bytes`` have gathered."""
        end = self._mark[1]
        kept_from = self._cache_kept_from
        if end - kept_from < at_least_bytes:
            return
        try:
            self._ops.drop_cached(self._fd, kept_from, end - kept_from)
        except OSError as exc:  # only a hint to the kernel: the data is synced either way
            log.warning("journal %s: dropping cached pages failed: %s", self.directory, exc)
            self.remove_pages_from_cache = False
            return
        # A partly written last page stays cached; it is dropped with the next range.
        self._cache_kept_from = end - end % _PAGE_BYTES

    def _open_file(self, file_id: int) -> None:
        salt = os.urandom(SALT_SIZE)
        # Direct writes start each batch on a block of its own, the first one after the
        # header's block (which a PAD record fills).
        block = _PAGE_BYTES if self.direct_io else 0
        self._fd = create_journal_file(
            self.directory, file_id, salt, self._ops, block, self._dir_fd
        )
        self._salt = salt
        self._marker = batch_marker(salt)
        self._records_from = block or FILE_HEADER_SIZE
        if self.direct_io:
            path = self.directory / journal_file_name(file_id)
            try:
                self._direct_fd = self._ops.open_direct_write(path)
            except OSError as exc:
                if exc.errno in _OUT_OF_DESCRIPTORS:
                    # Not the filesystem's doing: this file is written through the page
                    # cache (appended after its header's block), the next ones directly.
                    log.warning(
                        "journal %s: no descriptor for direct writes of file %d (%s); "
                        "writing it through the page cache",
                        self.directory,
                        file_id,
                        exc,
                    )
                    return
                # tmpfs and some other filesystems refuse O_DIRECT: correct either way.
                log.warning(
                    "journal %s: direct I/O is not available here (%s); writing through "
                    "the page cache",
                    self.directory,
                    exc,
                )
                self.direct_io = False

    def _close_file(self) -> None:
        try:
            if self._direct_fd is not None:
                self._ops.close(self._direct_fd)
                self._direct_fd = None
        finally:
            self._ops.close(self._fd)

    def _close_files(self) -> None:
        """The current file's descriptors and the directory's (the journal is done)."""
        try:
            self._close_file()
        finally:
            if self._dir_fd >= 0:
                self._ops.close(self._dir_fd)
                self._dir_fd = -1

    def _next_file(self, file_id: int) -> None:
        """Go on in file ``file_id``, created now; or, when no descriptor can be had for
        it (EMFILE), in the current file, past ``file_max_bytes``: the next batch that
        finds the file full tries again. Out of descriptors is no failure of the disk,
        and nothing is created then (the open fails before it creates the file)."""
        current = (self._fd, self._direct_fd, self._salt, self._marker, self._records_from)
        self._direct_fd = None
        try:
            self._open_file(file_id)
        except BaseException as exc:
            self._fd, self._direct_fd, self._salt, self._marker, self._records_from = current
            if not isinstance(exc, OSError) or exc.errno not in _OUT_OF_DESCRIPTORS:
                raise
            if self._file_refused != file_id:  # once, not at every batch meanwhile
                self._file_refused = file_id
                log.warning(
                    "journal %s: cannot create file %d (%s); file %d goes on past %d "
                    "bytes until it can",
                    self.directory,
                    file_id,
                    exc,
                    self._mark[0],
                    self.file_max_bytes,
                )
            return
        new = (self._fd, self._direct_fd)
        self._fd, self._direct_fd = current[0], current[1]
        try:
            if self.remove_pages_from_cache and self.sync_enabled and self._direct_fd is None:
                self._drop_synced_pages(1)  # the whole file is synced before it is left
            self._close_file()
        finally:
            self._fd, self._direct_fd = new
        self._mark = (file_id, self._records_from)
        self._cache_kept_from = 0


class _Wakeup:
    """The writer thread's wake-up, as ``threading.Event`` is used here (set, wait with a
    timeout, clear) but cheaper on the one-add-at-a-time path: a ``SimpleQueue`` (C, one
    semaphore) instead of a Condition that allocates a lock and runs Python code on each
    wait and set. ``set`` puts one token unless one is pending; the thread always looks
    at the record queue again after ``clear``, so no wake-up is lost.
    """

    __slots__ = ("_pending", "_tokens")

    def __init__(self) -> None:
        self._tokens: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._pending = False

    def set(self) -> None:
        if not self._pending:
            self._pending = True
            self._tokens.put(None)

    def wait(self, timeout_s: float) -> None:
        with contextlib.suppress(queue.Empty):
            self._tokens.get(timeout=timeout_s)

    def clear(self) -> None:
        self._pending = False


class _Jobs:
    """The writer as jobs of an executor instead of a thread.

    Stands in for the thread's wake-up event: ``set()`` (what :meth:`Journal.append`
    calls on an idle journal, and :meth:`Journal.close`) submits one job; a job
    writes one batch and submits the next while records wait. Meant for executors
    that run jobs one at a time on the loop's thread (a simulation's scheduler).
    """

    def __init__(self, journal: Journal, executor: concurrent.futures.Executor) -> None:
        self._journal = journal
        self._executor = executor
        self._submitted = False

    def set(self) -> None:
        if not self._submitted:
            self._submitted = True
            self._journal._idle = False
            self._executor.submit(self._run)

    def _run(self) -> None:
        journal = self._journal
        loop = journal._loop
        assert loop is not None
        self._submitted = False
        if journal._queue:
            journal._write_batch(journal._queue, loop)
        if journal._queue:
            self.set()
        elif journal._stopping:
            journal._stop_writing(loop)
        else:
            journal._idle = True


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
