"""The bytes of one log record in its ledger entry: a header, then the payload.

As DistributedLog's LogRecord, every record of a log stream carries a small header
in front of what the application appended::

    offset  size  field
    0       1     version (1)
    1       8     append time, milliseconds since the Unix epoch, signed big-endian
    9       ...   the payload, as appended

The writer sets the append time (its wall clock, never below the time of the
record it appended before, or a value the caller gives: a replay, a test); readers
return the payload and the time. Every place that writes or reads a log's ledgers as
entries goes through this module. There are no headerless records: an entry too
short for a header, or with another version, is :class:`LogRecordFormatError`,
naming the ledger and the entry.

Pure: no I/O, no clock.

    >>> entry = encode(b"hello", 1_700_000_000_000)
    >>> decode(entry, 3, 0)
    (1700000000000, b'hello')
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from quorumlog.errors import InvalidArgumentError
from quorumlog.log.errors import LogRecordFormatError
from quorumlog.log.position import Position, Record

VERSION = 1
_HEADER = struct.Struct(">Bq")
HEADER_BYTES = _HEADER.size  # 9
# The first byte of every record of this version, for a cheap check on the read path.
_VERSION_BYTE = VERSION
# pack_header(VERSION, timestamp_ms): the header, for a hot path that saves a call.
pack_header = _HEADER.pack
_unpack_from = _HEADER.unpack_from
# The append time's range: what a signed 64-bit field holds.
TIMESTAMP_MS_MIN = -(1 << 63)
TIMESTAMP_MS_MAX = (1 << 63) - 1


def encode(data: bytes, timestamp_ms: int) -> bytes:
    """The entry for a record of ``data`` appended at ``timestamp_ms``."""
    return pack_header(VERSION, timestamp_ms) + data


def header(timestamp_ms: int) -> bytes:
    """The header alone (for a caller that sends header and payload as one buffer)."""
    return pack_header(VERSION, timestamp_ms)


def _error(entry: bytes | memoryview, ledger_id: int, entry_id: int) -> LogRecordFormatError:
    if len(entry) < HEADER_BYTES:
        why = f"{len(entry)} bytes, shorter than the {HEADER_BYTES}-byte record header"
    else:
        why = f"record format version {entry[0]}, this reader knows version {VERSION}"
    return LogRecordFormatError(
        f"ledger {ledger_id} entry {entry_id}: not a log record ({why}); a log's "
        "ledgers hold records written by a log writer or the Spark sink"
    )


def decode(entry: bytes | memoryview, ledger_id: int, entry_id: int) -> tuple[int, bytes]:
    """``(timestamp_ms, payload)`` of a record's entry; LogRecordFormatError names
    ``ledger_id`` and ``entry_id`` when the entry is not a record of this version."""
    if len(entry) < HEADER_BYTES or entry[0] != _VERSION_BYTE:
        raise _error(entry, ledger_id, entry_id)
    return _unpack_from(entry)[1], bytes(entry[HEADER_BYTES:])


def record_of(ledger_id: int, entry_id: int, entry: bytes | memoryview) -> Record:
    """The :class:`Record` stored in entry ``entry_id`` of ledger ``ledger_id``."""
    if len(entry) < HEADER_BYTES or entry[0] != _VERSION_BYTE:
        raise _error(entry, ledger_id, entry_id)
    return _new_record(
        Record,
        (
            _new_position(Position, (ledger_id, entry_id)),
            bytes(entry[HEADER_BYTES:]),
            _unpack_from(entry)[1],
        ),
    )


# tuple.__new__ skips the Python-level __new__ of a NamedTuple (the same tuples).
_new_record = _new_position = tuple.__new__


def timestamp_of(entry: bytes | memoryview, ledger_id: int, entry_id: int) -> int:
    """The append time of a record's entry (its payload is not copied)."""
    if len(entry) < HEADER_BYTES or entry[0] != _VERSION_BYTE:
        raise _error(entry, ledger_id, entry_id)
    timestamp_ms: int = _unpack_from(entry)[1]
    return timestamp_ms


def decode_many(
    entries: Sequence[bytes], ledger_id: int, first_entry_id: int
) -> tuple[list[int], list[bytes]]:
    """The times and payloads of consecutive entries from ``first_entry_id``."""
    times: list[int] = []
    payloads: list[bytes] = []
    add_time, add_payload = times.append, payloads.append
    size = HEADER_BYTES
    for index, entry in enumerate(entries):
        if len(entry) < size or entry[0] != _VERSION_BYTE:
            raise _error(entry, ledger_id, first_entry_id + index)
        add_time(_unpack_from(entry)[1])
        add_payload(entry[size:])
    return times, payloads


def decode_arrow(entries: Sequence[bytes], ledger_id: int, first_entry_id: int) -> tuple[Any, Any]:
    """:func:`decode_many` as Arrow arrays, without a Python object per record: the
    append times (int64 milliseconds) and the payloads (binary), for the Spark source.
    numpy and pyarrow are imported here only: the rest of this module needs neither."""
    import numpy as np
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    whole = pa.array(entries, pa.binary())
    count = len(whole)
    if count == 0:
        return pa.array([], pa.int64()), whole
    offsets = np.frombuffer(whole.buffers()[1], dtype=np.int32)[: count + 1]
    body = np.frombuffer(whole.buffers()[2], dtype=np.uint8)
    starts = offsets[:-1]
    if bool(np.any(np.diff(offsets) < HEADER_BYTES)) or bool(np.any(body[starts] != VERSION)):
        decode_many(entries, ledger_id, first_entry_id)  # raises, naming the entry
    stamps = body[starts[:, None] + np.arange(1, HEADER_BYTES, dtype=np.int32)]
    millis = np.ascontiguousarray(stamps).view(">i8").reshape(count).astype(np.int64)
    # An explicit stop: pyarrow 26 fails on the default one ("Negative buffer resize").
    return pa.array(millis, pa.int64()), pc.binary_slice(whole, HEADER_BYTES, 2**31 - 1)


def check_timestamp(timestamp_ms: int) -> int:
    """``timestamp_ms`` if it fits the header's field, else InvalidArgumentError."""
    if not TIMESTAMP_MS_MIN <= timestamp_ms <= TIMESTAMP_MS_MAX:
        raise InvalidArgumentError(
            f"append time {timestamp_ms} ms does not fit the record header's 64-bit field"
        )
    return timestamp_ms


__all__ = [
    "HEADER_BYTES",
    "VERSION",
    "LogRecordFormatError",
    "check_timestamp",
    "decode",
    "decode_arrow",
    "decode_many",
    "encode",
    "header",
    "pack_header",
    "record_of",
    "timestamp_of",
]
