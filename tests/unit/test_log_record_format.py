"""The record header of log streams (quorumlog/log/record_format.py): pure, no cluster."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorumlog.errors import InvalidArgumentError
from quorumlog.log import LogRecordFormatError  # where docs/LOGS.md says it is
from quorumlog.log.position import Position, Record
from quorumlog.log.record_format import (
    HEADER_BYTES,
    VERSION,
    check_timestamp,
    decode,
    decode_many,
    encode,
    header,
    record_of,
    timestamp_of,
)


@given(st.binary(max_size=200), st.integers(-(1 << 63), (1 << 63) - 1))
def test_round_trip(payload: bytes, timestamp_ms: int) -> None:
    entry = encode(payload, timestamp_ms)
    assert len(entry) == HEADER_BYTES + len(payload)
    assert decode(entry, 1, 2) == (timestamp_ms, payload)
    assert decode(memoryview(entry), 1, 2) == (timestamp_ms, payload)
    assert timestamp_of(entry, 1, 2) == timestamp_ms
    assert record_of(1, 2, entry) == Record(Position(1, 2), payload, timestamp_ms)
    assert header(timestamp_ms) + payload == entry


def test_layout_is_a_version_byte_then_big_endian_milliseconds() -> None:
    assert VERSION == 1 and HEADER_BYTES == 9
    assert encode(b"hi", 0x0102030405060708) == b"\x01\x01\x02\x03\x04\x05\x06\x07\x08hi"


def test_decode_many_gives_times_and_payloads_in_order() -> None:
    entries = [encode(b"a", 5), encode(b"", 6), encode(b"ccc", 6)]
    assert decode_many(entries, 7, 10) == ([5, 6, 6], [b"a", b"", b"ccc"])


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        (b"", "0 bytes, shorter than the 9-byte record header"),
        (b"\x01\x00\x00", "3 bytes, shorter than the 9-byte record header"),
        (b"\x02" + bytes(8) + b"x", "record format version 2"),
        (b"hello world", "record format version 104"),
    ],
)
def test_a_bad_entry_names_its_ledger_and_entry(entry: bytes, why: str) -> None:
    for call in (
        lambda: decode(entry, 12, 34),
        lambda: timestamp_of(entry, 12, 34),
        lambda: record_of(12, 34, entry),
    ):
        with pytest.raises(LogRecordFormatError, match="ledger 12 entry 34: not a log record") as e:
            call()
        assert why in e.value.message
    with pytest.raises(LogRecordFormatError, match="ledger 12 entry 35"):
        decode_many([encode(b"ok", 1), entry], 12, 34)


def test_a_time_outside_64_bits_is_refused() -> None:
    assert check_timestamp(0) == 0
    with pytest.raises(InvalidArgumentError, match="64-bit"):
        check_timestamp(1 << 63)


def test_decode_arrow_matches_decode_many_and_names_a_bad_entry() -> None:
    pytest.importorskip("pyarrow")
    from quorumlog.log.record_format import decode_arrow

    entries = [encode(b"x" * (i % 5), i * 7 - 3) for i in range(20)]
    times, payloads = decode_arrow(entries, 1, 0)
    assert (times.to_pylist(), payloads.to_pylist()) == decode_many(entries, 1, 0)
    assert [len(a) for a in decode_arrow([], 1, 0)] == [0, 0]
    for bad in (b"zz", b"\x02" + bytes(8)):
        with pytest.raises(LogRecordFormatError, match="ledger 4 entry 13: not a log record"):
            decode_arrow([*entries[:3], bad], 4, 10)
