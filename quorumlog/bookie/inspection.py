"""Read-only views of a stopped bookie's directories, for the shell's storage commands.

BookKeeper's operators reach for ``readjournal``, ``readlog``, ``listfilesondisc``,
``lastmark``, ``bookieinfo`` and ``cookie_get`` when a bookie misbehaves; ``quorumlog
shell`` offers the same names over quorumlog's files (docs/OPERATIONS.md). Everything
here reads and decodes with the storage's own functions (:mod:`.journal`,
:mod:`.entry_log`, :mod:`.index`, :mod:`.cookie`, :mod:`.suspicion`) and never writes:
files are opened for reading, the index is opened read-only without LMDB's lock file,
and no file or directory is created.

A running bookie changes these files under a reader, and a bookie that starts while
they are read replays and cuts its journal: :func:`stopped_bookie` holds each
directory's ``LOCK`` (an flock of the existing file, opened for reading) while the
files are read, and refuses with :class:`DirectoryInUseError` if a bookie holds it. A
bookie started meanwhile refuses to start, as it does beside another bookie.

Example::

    with stopped_bookie(data_dir, journal_dir):
        print(last_mark(data_dir))
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quorumlog.bookie import suspicion
from quorumlog.bookie.cookie import Cookie, check_directories, read_cookie
from quorumlog.bookie.disk_checker import RESERVE_FILE_NAME, disk_usage
from quorumlog.bookie.entry_log import (
    LOG_HEADER_SIZE,
    log_file_name,
    log_header,
    log_records,
    parse_records,
)
from quorumlog.bookie.fileops import REAL_FILES
from quorumlog.bookie.index import LedgerIndex
from quorumlog.bookie.journal.format import (
    RECORD_ADD,
    RECORD_BATCH,
    RECORD_DELETE,
    RECORD_FENCE,
    RECORD_LAC,
    RECORD_MANIFEST,
    RECORD_MASTER_KEY,
    RECORD_NAMES,
    RECORD_PAD,
    SALT_SIZE,
    FileRecord,
    decode_ledger,
    decode_ledger_lac,
    decode_manifest,
    file_header,
    file_records,
    journal_file_name,
    list_journal_ids,
)
from quorumlog.errors import BKError
from quorumlog.proto.entry import ENTRY_HEADER, ENTRY_HEADER_SIZE

LOCK_FILE_NAME = "LOCK"  # the bookie's directory lock (see opening.DirectoryLocks)
ENTRY_LOGS_DIR = "entrylogs"
INDEX_DIR = "index"
# LMDB's map size when read-only: the file's own is used when larger.
_READ_ONLY_MAP_BYTES = 1 << 20


class DirectoryInUseError(BKError):
    """A bookie runs on a directory a tool was asked to read."""


def default_journal_dir(data_dir: Path, journal_dir: Path | None) -> Path:
    return journal_dir if journal_dir is not None else data_dir / "journal"


@contextlib.contextmanager
def stopped_bookie(*directories: Path) -> Iterator[None]:
    """Hold the bookie lock of each directory while its files are read.

    A directory without a ``LOCK`` file never had a bookie (nothing is created then);
    DirectoryInUseError when a bookie holds one; FileNotFoundError for a directory
    that does not exist."""
    fds: list[int] = []
    try:
        seen: set[Path] = set()
        for directory in directories:
            if not directory.is_dir():
                raise FileNotFoundError(f"no such directory: {directory}")
            if directory.resolve() in seen:
                continue
            seen.add(directory.resolve())
            lock = directory / LOCK_FILE_NAME
            try:
                fd = os.open(lock, os.O_RDONLY)
            except FileNotFoundError:
                continue
            fds.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise DirectoryInUseError(
                    f"directory {directory} is in use by a running bookie (its lock {lock} "
                    f"is held): stop the bookie first; these commands read a stopped "
                    f"bookie's files only"
                ) from None
        yield
    finally:
        for fd in fds:
            os.close(fd)


# ---------------------------------------------------------------- the journal


def journal_files(journal_dir: Path) -> list[int]:
    """The ids of the journal files, oldest first."""
    return list_journal_ids(journal_dir)


def resolve_journal_file(journal_dir: Path, name: str) -> tuple[int, Path]:
    """A journal file given as its id (decimal, or 0x hex) or its file name."""
    base = Path(name).name
    file_id = int(base[: -len(".jnl")], 16) if base.endswith(".jnl") else int(name, 0)
    path = journal_dir / journal_file_name(file_id)
    if not path.is_file():
        raise FileNotFoundError(f"no journal file {path}")
    return file_id, path


def _entry_headers(blobs: list[bytes]) -> list[dict[str, Any]]:
    out = []
    for blob in blobs:
        if len(blob) < ENTRY_HEADER_SIZE:
            out.append({"size": len(blob), "error": "shorter than an entry header"})
            continue
        ledger_id, entry_id, lac, length = ENTRY_HEADER.unpack_from(blob)
        out.append(
            {
                "ledger_id": ledger_id,
                "entry_id": entry_id,
                "lac": lac,
                "length": length,
                "size": len(blob),
            }
        )
    return out


def describe_journal_record(record: FileRecord, where: str) -> dict[str, Any]:
    """A journal record as plain values (what its type says it holds)."""
    payload = record.payload
    out: dict[str, Any] = {"offset": record.offset}
    if record.damage:
        out.update(type="DAMAGED", error=record.damage, bytes=len(payload))
        return out
    kind = record.kind
    out["type"] = RECORD_NAMES.get(kind, str(kind))
    if kind == RECORD_ADD:
        out["ledger_id"] = decode_ledger(payload)
        blobs, _ = parse_records(payload[8:], f"{where} at offset {record.offset}")
        out["entries"] = _entry_headers(blobs)
    elif kind in (RECORD_FENCE, RECORD_DELETE):
        out["ledger_id"] = decode_ledger(payload)
    elif kind == RECORD_MASTER_KEY:
        out["ledger_id"] = decode_ledger(payload)
        out["master_key"] = bytes(payload[8:]).hex()
    elif kind == RECORD_LAC:
        out["ledger_id"], out["lac"] = decode_ledger_lac(payload)
    elif kind == RECORD_BATCH:
        out["salt"] = bytes(payload).hex()
    elif kind == RECORD_MANIFEST:
        out["salt"] = bytes(payload[:SALT_SIZE]).hex()
        out["ledgers"] = [
            {
                "ledger_id": facts.ledger_id,
                "first_entry_id": facts.first_entry_id,
                "last_entry_id": facts.last_entry_id,
                "fenced": facts.fenced,
                "deleted": facts.deleted,
                "explicit_lac": facts.explicit_lac,
                "master_key": facts.master_key is not None,
            }
            for facts in decode_manifest(payload[SALT_SIZE:])
        ]
    elif kind == RECORD_PAD:
        out["bytes"] = len(payload)
    return out


def journal_records(path: Path, file_id: int) -> Iterator[dict[str, Any]]:
    """Every record of one journal file, described (:func:`describe_journal_record`);
    a first item ``{"type": "HEADER", ...}`` says whether the header is whole."""
    buf = REAL_FILES.read_file(path)
    salt, why = file_header(buf, file_id)
    yield {"offset": 0, "type": "HEADER", "file_id": file_id, "error": why or None}
    if salt is None:
        return
    for record in file_records(buf, salt):
        try:
            yield describe_journal_record(record, str(path))
        except BKError as exc:  # an ADD whose entry records do not parse (after its CRC)
            yield {"offset": record.offset, "type": "DAMAGED", "error": exc.message}


# ---------------------------------------------------------------- entry logs


def resolve_entry_log(data_dir: Path, name: str) -> tuple[int, Path]:
    """An entry log given as its id (decimal, or 0x hex) or its file name."""
    base = Path(name).name
    log_id = int(base[: -len(".log")], 16) if base.endswith(".log") else int(name, 0)
    path = data_dir / ENTRY_LOGS_DIR / log_file_name(log_id)
    if not path.is_file():
        raise FileNotFoundError(f"no entry log {path}")
    return log_id, path


def entry_log_records(path: Path, log_id: int) -> Iterator[dict[str, Any]]:
    """Every record of an entry log, described: the entry's header fields (ledger id,
    entry id, the writer's LAC, the ledger's length) and its blob's size; padding and
    damage as such. A first item ``{"type": "HEADER", ...}`` checks the header."""
    found, why = log_header(path)
    if found is not None and found != log_id:
        why = f"its header names log id {found}"
    yield {"offset": 0, "type": "HEADER", "log_id": log_id, "error": why or None}
    if why:
        return
    for record in log_records(path, REAL_FILES, LOG_HEADER_SIZE):
        if record.damage:
            yield {"offset": record.offset, "type": "DAMAGED", "error": record.damage}
        elif record.padding:
            yield {"offset": record.offset, "type": "PADDING", "size": len(record.blob)}
        else:
            entry = _entry_headers([record.blob])[0]
            yield {"offset": record.offset, "type": "ENTRY", **entry}


# ---------------------------------------------------------------- files, mark, info


@dataclass(frozen=True, slots=True)
class FileOnDisk:
    kind: str  # journal, entrylog, index, other
    path: Path
    size_bytes: int
    note: str = ""


def _file_note(kind: str, name: str) -> str:
    if kind == "journal" and ".torn-" in name:
        return "bytes replay cut off a journal file, kept for a post-mortem"
    if kind == "journal" and name.endswith(".jnl"):
        return f"journal file id {int(name[:-4], 16)}"
    if kind == "entrylog" and name.endswith(".log"):
        return f"entry log id {int(name[:-4], 16)}"
    if name == RESERVE_FILE_NAME:
        return "space set aside for a start after a full disk"
    if name.startswith("suspect-"):
        return "entries a damaged journal batch held"
    return ""


def files_on_disk(data_dir: Path, journal_dir: Path) -> list[FileOnDisk]:
    """Every file of the bookie's directories, by kind (``listfilesondisc``)."""
    groups: list[tuple[str, Path, bool]] = [
        ("journal", journal_dir, True),
        ("entrylog", data_dir / ENTRY_LOGS_DIR, True),
        ("index", data_dir / INDEX_DIR, True),
        ("other", data_dir, False),
    ]
    if journal_dir.resolve() != data_dir.resolve():
        groups.append(("other", journal_dir, False))
    out: list[FileOnDisk] = []
    for kind, directory, whole in groups:
        if not directory.is_dir():
            continue
        for name in sorted(os.listdir(directory)):
            path = directory / name
            if not path.is_file():
                continue
            is_journal = name.endswith(".jnl") or ".jnl.torn-" in name
            if not whole and is_journal and directory.resolve() == journal_dir.resolve():
                continue
            if whole and kind == "journal" and not is_journal:
                continue  # the journal directory's COOKIE and LOCK: "other"
            out.append(FileOnDisk(kind, path, path.stat().st_size, _file_note(kind, name)))
    return out


def open_index(data_dir: Path) -> LedgerIndex:
    return LedgerIndex(data_dir / INDEX_DIR, _READ_ONLY_MAP_BYTES, read_only=True)


def last_mark(data_dir: Path, journal_dir: Path) -> dict[str, Any]:
    """The index's checkpoint mark (where replay starts) and the entry log that was
    current at that checkpoint, with its end then (``lastmark``)."""
    index = open_index(data_dir)
    try:
        mark = index.load_mark()
        log_end = index.load_log_end()
    finally:
        index.close()
    out: dict[str, Any] = {"mark": None, "log_end": None}
    if mark is not None:
        name = journal_file_name(mark[0])
        out["mark"] = {
            "journal_file_id": mark[0],
            "journal_file": name,
            "offset": mark[1],
            "file_present": (journal_dir / name).is_file(),
        }
    if log_end is not None:
        out["log_end"] = {"log_id": log_end[0], "offset": log_end[1]}
    return out


def cookie_dict(cookie: Cookie | None) -> dict[str, Any] | None:
    if cookie is None:
        return None
    return {
        "address": cookie.address,
        "instance_id": cookie.instance_id,
        "data_dir": cookie.data_dir,
        "journal_dir": cookie.journal_dir,
        "layout_version": cookie.layout_version,
    }


def local_cookies(
    data_dir: Path, journal_dir: Path, expected: Cookie | None = None
) -> dict[str, Any]:
    """The cookies of the data and journal directories and whether they agree (with each
    other, with the directories they sit in, and with ``expected``: a copy from the
    metadata store), as a bookie's start checks them (``cookie_get``)."""
    return {
        "data": cookie_dict(read_cookie(data_dir)),
        "journal": cookie_dict(read_cookie(journal_dir)),
        "problem": check_directories(data_dir, journal_dir, expected),
    }


def bookie_info(data_dir: Path, journal_dir: Path) -> dict[str, Any]:
    """What a stopped bookie holds: its identity (cookie), space, files, checkpoint mark,
    and each ledger's state in its index (``bookieinfo``)."""
    cookie = read_cookie(data_dir)
    files = files_on_disk(data_dir, journal_dir)
    sizes: dict[str, int] = {}
    counts: dict[str, int] = {}
    for f in files:
        sizes[f.kind] = sizes.get(f.kind, 0) + f.size_bytes
        counts[f.kind] = counts.get(f.kind, 0) + 1
    space = {}
    for name, directory in (("data", data_dir), ("journal", journal_dir)):
        usage = disk_usage(directory)
        space[name] = {"free_bytes": usage.free_bytes, "total_bytes": usage.total_bytes}
    index = open_index(data_dir)
    try:
        states = index.load_states()
        entries = {lid: index.count_entries(lid) for lid in states}
    finally:
        index.close()
    suspect, _ = suspicion.load(data_dir, REAL_FILES)
    ledgers = [
        {
            "ledger_id": lid,
            "entries": entries[lid],
            "last_entry_id": st.last_entry_id,
            "lac": st.lac,
            "explicit_lac": st.explicit_lac,
            "fenced": st.fenced,
            "deleted": st.deleted,
            "has_master_key": st.master_key is not None,
            "damaged": st.damaged,
            "suspect": [list(r) for r in suspect.get(lid, [])],
        }
        for lid, st in sorted(states.items())
    ]
    return {
        "address": cookie.address if cookie is not None else None,
        "instance_id": cookie.instance_id if cookie is not None else None,
        "data_dir": str(data_dir),
        "journal_dir": str(journal_dir),
        "space": space,
        "files": {kind: {"count": counts[kind], "bytes": sizes[kind]} for kind in sorted(sizes)},
        **last_mark(data_dir, journal_dir),
        "ledgers": ledgers,
    }
