"""Replaying the journal at start: every record from the last checkpoint mark on.

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
Zeros from the end of a whole batch to the end of a file are no damage: the writer
writes zeros ahead of its batches (pre-allocation), and a batch none of whose bytes
reached the disk held nothing acknowledged; they are cut off quietly. Other damage
followed by a later batch, or in a file followed by another file, is
damage to synced, acknowledged data: replay refuses
(:class:`JournalCorruptionError`) unless told to skip it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from quorumlog.bookie.fileops import REAL_FILES, FileOps
from quorumlog.bookie.journal.format import (
    BATCH_MARKER_SIZE,
    FILE_HEADER,
    FILE_HEADER_SIZE,
    JOURNAL_FORMAT,
    JOURNAL_MAGIC,
    MANIFEST_OVERHEAD,
    NONZERO,
    PAGE_BYTES,
    RECORD_BATCH,
    RECORD_MANIFEST,
    RECORD_PAD,
    RECORD_UNCLOSED_MANIFEST,
    SALT_SIZE,
    batch_marker,
    journal_file_name,
    list_journal_ids,
    other_format,
    record_at,
)
from quorumlog.errors import BookieIOError

log = logging.getLogger(__name__)


class JournalCorruptionError(BookieIOError):
    """A damaged journal record with valid records after it."""

    def __init__(self, message: str, path: Path, offset: int) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset


class JournalFormatError(JournalCorruptionError):
    """A journal file written in a format this version does not read (its header names
    another format). Not damage: ``journal_skip_corruption`` does not pass over it."""


def _format_message(path: Path, version: int) -> str:
    return (
        f"journal {path}: written in journal format {version}; this version of quorumlog "
        f"reads format {JOURNAL_FORMAT} only and does not convert it. Start this bookie "
        f"with the version that wrote it until its journal is checkpointed, or retire it: "
        f"stop it, wipe its data and journal directories and let autorecovery "
        f"re-replicate its ledgers (docs/OPERATIONS.md)"
    )


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
    # (filled by the caller that applies the manifests, :func:`quorumlog.bookie.opening.replay`).
    suspect: list[tuple[int, int, int]] | None = None
    # Torn tails found but not cut yet (scan with ``defer_cuts``): :func:`cut_torn_tails`.
    pending_cuts: list[tuple[Path, int]] | None = None


def _past_pad_covering(buf: bytes, view: memoryview, mark: int, end: int) -> int:
    """Where replay from ``mark`` starts when no record starts there: after the PAD
    record that covers it, if one does. A checkpoint may record the mark after a batch
    whose sync failed or never came; after a power loss the file holds the PAD written
    before that batch in its place. Otherwise the mark stands (and is read as damage)."""
    pos = FILE_HEADER_SIZE
    while pos < mark:
        size, _ = record_at(buf, view, pos, end)
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
    if NONZERO.search(buf, offset) is not None:
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
        size, _ = record_at(buf, view, start, end)
        if size >= MANIFEST_OVERHEAD:
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
    :func:`~.format.decode_manifest`) before its tail is cut: what the batch held, which may have
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
    options = _ScanOptions(skip_corruption, report, ops, defer_cuts)
    for n, file_id in enumerate(ids):
        path = directory / journal_file_name(file_id)
        # The writer creates a file only after the last batch of the file before it was
        # synced: all but the last file hold nothing torn.
        next_file = journal_file_name(ids[n + 1]) if n + 1 < len(ids) else None
        buf = ops.read_file(path)
        salt = _file_salt(path, file_id, buf, next_file is None, skip_corruption, report, ops)
        if salt is None:
            continue
        start = start_offset if file_id == start_id else FILE_HEADER_SIZE
        yield from _scan_file(path, buf, salt, start, next_file, options)


@dataclass(frozen=True, slots=True)
class _ScanOptions:
    """What one :func:`scan` was asked for, passed to its steps."""

    skip_corruption: bool
    report: ScanReport
    ops: FileOps
    defer_cuts: bool


def _scan_file(
    path: Path,
    buf: bytes,
    salt: bytes,
    pos: int,
    next_file: str | None,
    options: _ScanOptions,
) -> Iterator[tuple[int, memoryview]]:
    """Yield the records of one journal file (``buf``, whose header holds ``salt``) from
    ``pos`` on. At damage, only where it lies decides: in the last batch of the last file
    (``next_file`` None, no batch marker after it) it is a torn tail
    (:func:`_torn_last_batch`), anywhere else damage to synced data
    (:func:`_damage_before_valid_records`)."""
    end = len(buf)
    view = memoryview(buf)
    marker = batch_marker(salt)
    salt_view = memoryview(salt)
    if FILE_HEADER_SIZE < pos < end and not record_at(buf, view, pos, end)[0]:
        pos = _past_pad_covering(buf, view, pos, end)
    batch_at = -1  # where the current batch's marker is
    lead = -1  # where its leading manifest is, until its closing one is read
    in_batch = False  # a batch marker read, its closing manifest not yet
    while pos < end:
        size, why = record_at(buf, view, pos, end)
        if size:
            kind = buf[pos + 4]
            if kind == RECORD_PAD:
                pos += size
                continue
            if kind != RECORD_BATCH and kind != RECORD_MANIFEST:
                options.report.records += 1
                yield kind, view[pos + 5 : pos + size - 4]
                pos += size
                continue
            if kind == RECORD_BATCH and view[pos + 5 : pos + size - 4] == salt_view:
                batch_at, lead, in_batch = pos, -1, True
                pos += size
                continue
            if kind == RECORD_MANIFEST and view[pos + 5 : pos + 5 + SALT_SIZE] == salt_view:
                # The first record of a batch, or its last one (then the batch is whole).
                lead = pos if pos == batch_at + BATCH_MARKER_SIZE else -1
                in_batch = lead >= 0
                pos += size
                continue
            why = f"{'batch marker' if kind == RECORD_BATCH else 'manifest'} of another file"
        elif not in_batch and NONZERO.search(buf, pos) is None:
            _zeros_at_the_end(path, pos, options)
            return
        # Damage at ``pos``. Never look for a record inside it: only the writer's
        # next batch marker (which no entry can forge) says where synced data goes on.
        found = buf.find(marker, pos + 1)
        if found < 0 and next_file is None:
            yield from _torn_last_batch(path, buf, salt, pos, why, lead, options)
            return
        pos = _damage_before_valid_records(
            path, pos, why, found if found >= 0 else None, next_file, end, options
        )


def _torn_last_batch(
    path: Path, buf: bytes, salt: bytes, pos: int, why: str, lead: int, options: _ScanOptions
) -> Iterator[tuple[int, memoryview]]:
    """Damage at ``pos`` in the last batch of the last file (its leading manifest at
    ``lead``, or -1): yield what the batch's whole manifests prove, then cut the file at
    ``pos``, keeping the tail's bytes aside.

    Torn by a crash before its sync, or a synced batch whose bits changed since; the file
    cannot tell. The batch's manifests (one leads it, one closes it: one flipped bit
    leaves one of them whole) say what it held. With neither, it was torn before its sync.
    One fault per batch: if the damage is in a record, the closing manifest is whole; if
    it is the closing manifest, every record before it was read. So a batch whose closing
    manifest is not whole, while records of it could not be read, was torn before its
    sync: its leading manifest proves its facts (safe to apply), but none of its entries
    was acknowledged, so none is suspect."""
    view = memoryview(buf)
    end = len(buf)
    report = options.report
    closing = _manifests_after(buf, view, pos, end, salt)
    proofs = ([lead] if lead >= 0 else []) + closing
    kind = RECORD_MANIFEST if closing else RECORD_UNCLOSED_MANIFEST
    for at in proofs:
        manifest_size = record_at(buf, view, at, end)[0]
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
    if options.defer_cuts:
        report.pending_cuts = [*(report.pending_cuts or []), (path, pos)]
    else:
        _cut(path, pos, options.ops)
    report.truncated = [*(report.truncated or []), (path, pos)]


def _zeros_at_the_end(path: Path, pos: int, options: _ScanOptions) -> None:
    """Only zeros from ``pos``, the end of a whole batch (or the file's first record),
    to the end of the file: written ahead by the writer (in a file before the last,
    when a failed sync lost the writer's cut), or a batch none of whose bytes reached
    the disk (so never synced, never acknowledged). Cut off without a copy (zeros hold
    nothing), so that the file ends in whole records."""
    log.info("journal %s: zeros from offset %d to the end, cut off", path, pos)
    if options.defer_cuts:
        options.report.pending_cuts = [*(options.report.pending_cuts or []), (path, pos)]
    else:
        _cut(path, pos, options.ops)
    options.report.truncated = [*(options.report.truncated or []), (path, pos)]


def _damage_before_valid_records(
    path: Path,
    pos: int,
    why: str,
    resume: int | None,
    next_file: str | None,
    end: int,
    options: _ScanOptions,
) -> int:
    """Damage at ``pos`` with valid records after it (the next batch at ``resume``, or
    the later file ``next_file``): damage to synced, acknowledged data. Raises
    JournalCorruptionError unless told to skip it; returns where reading goes on."""
    where = (
        f"the next batch at offset {resume}"
        if resume is not None
        else f"the later file {next_file}"
    )
    message = (
        f"journal {path}: damaged record at offset {pos} ({why}) followed by valid "
        f"records ({where}): acknowledged data may be lost; refusing to start. "
        f"Restore the file, or start with journal_skip_corruption to skip the "
        f"damaged bytes"
    )
    if not options.skip_corruption:
        raise JournalCorruptionError(message, path, pos)
    skip_to = resume if resume is not None else end
    log.error("%s; skipping bytes %d..%d as asked", message.split(";")[0], pos, skip_to)
    report = options.report
    report.skipped = [*(report.skipped or []), (path, pos, skip_to)]
    return skip_to


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
    version = other_format(bytes(buf[:8])) if end >= FILE_HEADER_SIZE else None
    if version is not None:
        raise JournalFormatError(_format_message(path, version), path, 0)
    magic, header_id, salt = (
        FILE_HEADER.unpack_from(buf) if end >= FILE_HEADER_SIZE else (b"", -1, b"")
    )
    if magic == JOURNAL_MAGIC and header_id == file_id:
        return bytes(salt)
    # The header is synced before any record is written: a bad one with nothing after it
    # (but the PAD that fills its block, for direct writes) is a creation cut short (a
    # start or a rollover whose header sync failed, or a power loss before it), which
    # never held a record, wherever the file stands; anything else is damage.
    header_only = NONZERO.search(buf, FILE_HEADER_SIZE) is None or (
        end == PAGE_BYTES
        and record_at(buf, memoryview(buf), FILE_HEADER_SIZE, end)[0] == end - FILE_HEADER_SIZE
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
