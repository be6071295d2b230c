"""EntryCodec.decode_payloads: a read's whole answer checked at once, as decode checks each
blob (R9: a damaged or misplaced blob is a digest mismatch, never data)."""

from __future__ import annotations

import pytest

from quorumlog.errors import DigestMismatchError
from quorumlog.proto.entry import DigestType, EntryCodec

LEDGER_ID = 7


def blobs(codec: EntryCodec, first: int, count: int) -> list[bytes]:
    return [
        codec.encode(LEDGER_ID, entry_id, entry_id - 1, 10 * (entry_id + 1), b"p%d" % entry_id)
        for entry_id in range(first, first + count)
    ]


@pytest.mark.parametrize("digest_type", list(DigestType))
def test_sound_blobs_give_their_payloads_and_largest_lac(digest_type: DigestType) -> None:
    codec = EntryCodec(digest_type, b"secret")
    run = blobs(codec, 5, 4)
    payloads, largest_lac, error = codec.decode_payloads(run, LEDGER_ID, 5)
    assert error is None
    assert payloads == [codec.decode(b, LEDGER_ID, 5 + i).data for i, b in enumerate(run)]
    assert payloads == [b"p5", b"p6", b"p7", b"p8"]
    assert largest_lac == 7


@pytest.mark.parametrize("digest_type", [DigestType.CRC32, DigestType.CRC32C, DigestType.MAC])
def test_r9_a_flipped_byte_ends_the_run_with_decodes_error(digest_type: DigestType) -> None:
    codec = EntryCodec(digest_type, b"secret")
    run = blobs(codec, 0, 4)
    damaged = bytearray(run[2])
    damaged[-1] ^= 0x01
    run[2] = bytes(damaged)
    payloads, largest_lac, error = codec.decode_payloads(run, LEDGER_ID, 0)
    assert payloads == [b"p0", b"p1"]
    assert largest_lac == 0
    assert isinstance(error, DigestMismatchError)
    with pytest.raises(DigestMismatchError) as raised:
        codec.decode(run[2], LEDGER_ID, 2)
    assert error.message == raised.value.message


def test_r9_a_blob_of_another_entry_or_ledger_is_refused() -> None:
    codec = EntryCodec(DigestType.CRC32C)
    run = blobs(codec, 0, 3)
    payloads, _, error = codec.decode_payloads([run[0], run[2]], LEDGER_ID, 0)
    assert payloads == [b"p0"]
    assert error is not None and "entry 2" in error.message
    payloads, _, error = codec.decode_payloads(run, LEDGER_ID + 1, 0)
    assert payloads == []
    assert error is not None and f"ledger {LEDGER_ID}" in error.message


def test_a_short_blob_and_a_wrong_password_are_refused() -> None:
    codec = EntryCodec(DigestType.MAC, b"right")
    other = EntryCodec(DigestType.MAC, b"wrong")
    payloads, largest_lac, error = codec.decode_payloads(blobs(other, 0, 2), LEDGER_ID, 0)
    assert (payloads, largest_lac) == ([], -1)
    assert isinstance(error, DigestMismatchError)
    payloads, _, error = codec.decode_payloads([b"short"], LEDGER_ID, 0)
    assert payloads == [] and error is not None and "too short" in error.message
