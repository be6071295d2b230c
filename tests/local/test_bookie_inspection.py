"""The record readers behind the shell's readjournal and readlog: every record as it
lies in the file, damage reported where it is and never read into (as replay does)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from quorumlog.bookie.entry_log import (
    LOG_HEADER_SIZE,
    LOG_MAGIC,
    format_records,
    log_header,
    log_records,
)
from quorumlog.bookie.inspection import (
    DirectoryInUseError,
    describe_journal_record,
    stopped_bookie,
)
from quorumlog.bookie.journal import format as journal_format
from quorumlog.testing.raw_client import make_entry

SALT = b"12345678"


def record_bytes(record: journal_format.Record) -> bytes:
    return b"".join(record[0])


def journal_file(*batches: list[journal_format.Record]) -> tuple[bytes, list[int]]:
    """A journal file's bytes (file id 1) and where each record starts."""
    out = bytearray(journal_format.FILE_HEADER.pack(journal_format.JOURNAL_MAGIC, 1, SALT))
    starts = []
    for batch in batches:
        starts.append(len(out))
        out += journal_format.batch_marker(SALT)
        for record in batch:
            starts.append(len(out))
            out += record_bytes(record)
    return bytes(out), starts


def test_file_records_reads_every_record_with_its_offset() -> None:
    blobs = [make_entry(7, i, b"payload %d" % i, lac=i - 1) for i in range(2)]
    data, starts = journal_file(
        [
            journal_format.master_key_record(7, b"k" * 20),
            journal_format.add_record(7, format_records(blobs, [len(b) for b in blobs])),
        ],
        [journal_format.fence_record(7), journal_format.lac_record(7, 1)],
    )
    salt, why = journal_format.file_header(data, 1)
    assert salt == SALT and why == ""
    records = [describe_journal_record(r, "j") for r in journal_format.file_records(data, SALT)]
    assert [(r["offset"], r["type"]) for r in records] == list(
        zip(starts, ["BATCH", "MASTER_KEY", "ADD", "BATCH", "FENCE", "LAC"], strict=True)
    )
    add = records[2]
    assert [(e["ledger_id"], e["entry_id"], e["lac"]) for e in add["entries"]] == [
        (7, 0, -1),
        (7, 1, 0),
    ]
    assert records[5]["ledger_id"] == 7 and records[5]["lac"] == 1
    assert journal_format.file_header(data, 2) == (None, "its header names file id 1")


def test_damage_is_reported_up_to_the_next_batch_and_never_read_into() -> None:
    # An entry whose payload is a well-formed DELETE record of another ledger: once its
    # ADD record is damaged, its bytes must not be shown as a DELETE.
    forged = record_bytes(journal_format.delete_record(99))
    blob = make_entry(7, 0, forged)
    data, starts = journal_file(
        [journal_format.add_record(7, format_records([blob], [len(blob)]))],
        [journal_format.fence_record(7)],
    )
    damaged = bytearray(data)
    damaged[starts[1] + 5 + 8 + 8 + 40] ^= 0x40  # a byte of the entry's payload
    records = list(journal_format.file_records(bytes(damaged), SALT))
    kinds = [(r.offset, r.kind, r.damage) for r in records]
    assert kinds == [
        (starts[0], journal_format.RECORD_BATCH, ""),
        (starts[1], 0, "checksum mismatch"),
        (starts[2], journal_format.RECORD_BATCH, ""),
        (starts[3], journal_format.RECORD_FENCE, ""),
    ]
    assert len(records[1].payload) == starts[2] - starts[1]
    assert journal_format.RECORD_DELETE not in [r.kind for r in records]


def test_log_records_checks_each_record_and_stops_at_damage(tmp_path: Path) -> None:
    blobs = [make_entry(3, i, b"x" * i) for i in range(3)]
    body = format_records(blobs, [len(b) for b in blobs])
    padding = bytes(8)  # a padding record of an empty blob: size 0, CRC32C 0
    path = tmp_path / "00000005.log"
    header = LOG_MAGIC + (5).to_bytes(8, "big")
    path.write_bytes(header + body + padding)
    assert log_header(path) == (5, "")
    records = list(log_records(path))
    assert [r.blob for r in records[:3]] == blobs and records[3].padding
    assert records[0].offset == LOG_HEADER_SIZE
    damaged = bytearray(path.read_bytes())
    damaged[records[1].offset + 8 + 33] ^= 1
    path.write_bytes(damaged)
    records = list(log_records(path))
    assert [r.damage for r in records] == ["", "checksum mismatch"]
    assert records[1].offset == LOG_HEADER_SIZE + 8 + len(blobs[0])


def test_stopped_bookie_refuses_a_held_lock_and_creates_none(tmp_path: Path) -> None:
    with stopped_bookie(tmp_path):
        pass
    assert not (tmp_path / "LOCK").exists()  # no lock file made where none was
    lock = tmp_path / "LOCK"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running bookie holds it
        with (
            pytest.raises(DirectoryInUseError, match="in use by a running bookie"),
            stopped_bookie(tmp_path),
        ):
            pass
    finally:
        os.close(fd)
    with pytest.raises(FileNotFoundError), stopped_bookie(tmp_path / "missing"):
        pass
