"""Golden bytes for every frame and for the entry blob, as docs/PROTOCOL.md lays them out.

Each expected frame is written out by hand, field by field, from the layout in
docs/PROTOCOL.md (never by calling the encoder): a change to the wire format fails
here and must be a deliberate change of the document and of these bytes. Each golden
frame also decodes back to the message it pins.
"""

from __future__ import annotations

import hashlib
import hmac
import typing
import zlib

import crc32c
import pytest

from quorumlog.errors import Status
from quorumlog.proto import (
    AddFlag,
    AddRequest,
    AddResponse,
    AuthRequest,
    AuthResponse,
    BookieInfoRequest,
    BookieInfoResponse,
    DeleteLedgerRequest,
    DigestType,
    EntryCodec,
    FenceRequest,
    FenceResponse,
    FrameDecoder,
    LedgerKeyRequest,
    LedgerKeyResponse,
    Op,
    ReadFlag,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    StatusResponse,
    WriteLacRequest,
    encode,
    entry_id_and_lac,
    mac_key,
    master_key,
)
from quorumlog.proto.entry import blob_ledger_id


def h(*fields: str) -> bytes:
    """Hex fields (spaces allowed) joined into bytes."""
    return bytes.fromhex("".join(fields))


# Field values chosen so that byte order and widths show in the hex.
REQUEST_ID = 0x0102030405060708
LEDGER = 0x0A0B0C0D0E0F1011
KEY = bytes(range(0x20, 0x34))  # a 20-byte master key: 20 21 .. 33
KEY_HEX = "2021222324252627 28292a2b2c2d2e2f 30313233"

# The frame header after the length: version, operation, request id.
V1 = "01"  # uint8 protocol version 1
RID = "0102030405060708"  # uint64 request id
LEDGER_HEX = "0a0b0c0d0e0f1011"  # uint64 ledger id


CASES: list[tuple[str, object, bytes]] = [
    (
        "add request",
        AddRequest(REQUEST_ID, LEDGER, KEY, [b"ab", b"xyz"], AddFlag.RECOVERY),
        h(
            "00000038",  # uint32 length of the rest: 10 + 46
            V1,
            "01",  # uint8 op ADD
            RID,
            LEDGER_HEX,  # uint64 ledger
            "01",  # uint8 flags: RECOVERY
            KEY_HEX,  # 20 bytes master key
            "00000002",  # uint32 count of entries
            "00000002",  # uint32 length of entry 0
            "6162",  # entry 0: b"ab"
            "00000003",  # uint32 length of entry 1
            "78797a",  # entry 1: b"xyz"
        ),
    ),
    (
        "add response",
        AddResponse(REQUEST_ID, Status.FENCED, LEDGER, 2),
        h(
            "00000018",  # uint32 length of the rest: 10 + 14
            V1,
            "81",  # uint8 op ADD | 0x80
            RID,
            "0006",  # int16 status FENCED
            LEDGER_HEX,  # uint64 ledger
            "00000002",  # uint32 count
        ),
    ),
    (
        "read request",
        ReadRequest(
            REQUEST_ID,
            LEDGER,
            first_entry_id=5,
            count=3,
            flags=ReadFlag.FENCE | ReadFlag.LONG_POLL,
            master_key=KEY,
            previous_lac=-1,
            timeout_ms=500,
            max_bytes=4096,
        ),
        h(
            "00000043",  # uint32 length of the rest: 10 + 57
            V1,
            "02",  # uint8 op READ
            RID,
            LEDGER_HEX,  # uint64 ledger
            "0000000000000005",  # int64 first entry
            "00000003",  # uint32 count
            "03",  # uint8 flags: FENCE | LONG_POLL
            KEY_HEX,  # 20 bytes master key
            "ffffffffffffffff",  # int64 previous LAC: -1
            "000001f4",  # uint32 timeout ms: 500
            "00001000",  # uint32 max bytes: 4096
        ),
    ),
    (
        "read response",
        ReadResponse(REQUEST_ID, Status.OK, LEDGER, 5, 6, [b"hello"]),
        h(
            "00000031",  # uint32 length of the rest: 10 + 39
            V1,
            "82",  # uint8 op READ | 0x80
            RID,
            "0000",  # int16 status OK
            LEDGER_HEX,  # uint64 ledger
            "0000000000000005",  # int64 first entry
            "0000000000000006",  # int64 bookie's LAC
            "00000001",  # uint32 count of entries
            "00000005",  # uint32 length of entry 0
            "68656c6c6f",  # entry 0: b"hello"
        ),
    ),
    (
        "read response without entries",
        ReadResponse(REQUEST_ID, Status.NO_SUCH_ENTRY, LEDGER, 5, -1, []),
        h(
            "00000028",  # uint32 length of the rest: 10 + 30
            V1,
            "82",  # uint8 op READ | 0x80
            RID,
            "0002",  # int16 status NO_SUCH_ENTRY
            LEDGER_HEX,  # uint64 ledger
            "0000000000000005",  # int64 first entry
            "ffffffffffffffff",  # int64 bookie's LAC: -1
            "00000000",  # uint32 count of entries: none follow
        ),
    ),
    (
        "read_lac request",
        ReadLacRequest(REQUEST_ID, LEDGER),
        h(
            "00000012",  # uint32 length of the rest: 10 + 8
            V1,
            "03",  # uint8 op READ_LAC
            RID,
            LEDGER_HEX,  # uint64 ledger
        ),
    ),
    (
        "read_lac response",
        ReadLacResponse(REQUEST_ID, Status.OK, LEDGER, 9, -1),
        h(
            "00000024",  # uint32 length of the rest: 10 + 26
            V1,
            "83",  # uint8 op READ_LAC | 0x80
            RID,
            "0000",  # int16 status OK
            LEDGER_HEX,  # uint64 ledger
            "0000000000000009",  # int64 LAC
            "ffffffffffffffff",  # int64 last stored entry: -1 (none)
        ),
    ),
    (
        "fence request",
        FenceRequest(REQUEST_ID, LEDGER, KEY),
        h(
            "00000026",  # uint32 length of the rest: 10 + 28
            V1,
            "04",  # uint8 op FENCE
            RID,
            LEDGER_HEX,  # uint64 ledger
            KEY_HEX,  # 20 bytes master key
        ),
    ),
    (
        "fence response",
        FenceResponse(REQUEST_ID, Status.UNAUTHORIZED, LEDGER, 0x0123, 0x0456),
        h(
            "00000024",  # uint32 length of the rest: 10 + 26
            V1,
            "84",  # uint8 op FENCE | 0x80
            RID,
            "0005",  # int16 status UNAUTHORIZED
            LEDGER_HEX,  # uint64 ledger
            "0000000000000123",  # int64 LAC
            "0000000000000456",  # int64 last stored entry
        ),
    ),
    (
        "write_lac request",
        WriteLacRequest(REQUEST_ID, LEDGER, KEY, 0x0789),
        h(
            "0000002e",  # uint32 length of the rest: 10 + 36
            V1,
            "05",  # uint8 op WRITE_LAC
            RID,
            LEDGER_HEX,  # uint64 ledger
            KEY_HEX,  # 20 bytes master key
            "0000000000000789",  # int64 LAC
        ),
    ),
    (
        "write_lac response",
        StatusResponse(REQUEST_ID, Op.WRITE_LAC, Status.READ_ONLY, LEDGER),
        h(
            "00000014",  # uint32 length of the rest: 10 + 10
            V1,
            "85",  # uint8 op WRITE_LAC | 0x80
            RID,
            "0007",  # int16 status READ_ONLY
            LEDGER_HEX,  # uint64 ledger
        ),
    ),
    (
        "delete_ledger request",
        DeleteLedgerRequest(REQUEST_ID, LEDGER, KEY),
        h(
            "00000026",  # uint32 length of the rest: 10 + 28
            V1,
            "06",  # uint8 op DELETE_LEDGER
            RID,
            LEDGER_HEX,  # uint64 ledger
            KEY_HEX,  # 20 bytes master key
        ),
    ),
    (
        "delete_ledger response",
        StatusResponse(REQUEST_ID, Op.DELETE_LEDGER, Status.NO_SUCH_LEDGER, LEDGER),
        h(
            "00000014",  # uint32 length of the rest: 10 + 10
            V1,
            "86",  # uint8 op DELETE_LEDGER | 0x80
            RID,
            "0001",  # int16 status NO_SUCH_LEDGER
            LEDGER_HEX,  # uint64 ledger
        ),
    ),
    (
        "bookie_info request",
        BookieInfoRequest(REQUEST_ID),
        h(
            "0000000a",  # uint32 length of the rest: 10, no body
            V1,
            "07",  # uint8 op BOOKIE_INFO
            RID,
        ),
    ),
    (
        "bookie_info response",
        BookieInfoResponse(REQUEST_ID, Status.OK, True, 0x0102_0304_0506, 0x0A0B_0C0D_0E0F),
        h(
            "0000001d",  # uint32 length of the rest: 10 + 19
            V1,
            "87",  # uint8 op BOOKIE_INFO | 0x80
            RID,
            "0000",  # int16 status OK
            "01",  # uint8 read-only flag: true
            "0000010203040506",  # int64 free bytes
            "00000a0b0c0d0e0f",  # int64 total bytes
        ),
    ),
    (
        "auth request",
        AuthRequest(REQUEST_ID, b"eyJ.x.y"),
        h(
            "00000015",  # uint32 length of the rest: 10 + 11
            V1,
            "08",  # uint8 op AUTH
            RID,
            "01",  # uint8 auth version 1
            "01",  # uint8 mechanism TOKEN
            "0007",  # uint16 credential length
            "65794a2e782e79",  # the token's ASCII bytes
        ),
    ),
    (
        "auth response",
        AuthResponse(REQUEST_ID, Status.UNAUTHORIZED, 0b101, "expired"),
        h(
            "00000016",  # uint32 length of the rest: 10 + 12
            V1,
            "88",  # uint8 op AUTH | 0x80
            RID,
            "0005",  # int16 status UNAUTHORIZED
            "05",  # uint8 role bits: client (1) | bookie (4)
            "0007",  # uint16 reason length
            "65787069726564",  # the reason, UTF-8
        ),
    ),
    (
        "ledger key request",
        LedgerKeyRequest(REQUEST_ID, LEDGER),
        h(
            "00000012",  # uint32 length of the rest: 10 + 8
            V1,
            "09",  # uint8 op LEDGER_KEY
            RID,
            LEDGER_HEX,  # uint64 ledger
        ),
    ),
    (
        "ledger key response",
        LedgerKeyResponse(REQUEST_ID, Status.OK, LEDGER, KEY),
        h(
            "00000028",  # uint32 length of the rest: 10 + 30
            V1,
            "89",  # uint8 op LEDGER_KEY | 0x80
            RID,
            "0000",  # int16 status OK
            LEDGER_HEX,  # uint64 ledger
            KEY_HEX,  # 20 bytes master key
        ),
    ),
]


@pytest.mark.parametrize(("message", "golden"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_frame_encodes_to_its_golden_bytes_and_decodes_back(message, golden):
    assert encode(message).hex(" ", 4) == golden.hex(" ", 4)
    assert FrameDecoder().feed(golden) == [message]


def test_status_codes_are_numbered_as_documented():
    assert [(s.name, s.value) for s in Status] == [
        ("OK", 0),
        ("NO_SUCH_LEDGER", 1),
        ("NO_SUCH_ENTRY", 2),
        ("BAD_REQUEST", 3),
        ("IO_ERROR", 4),
        ("UNAUTHORIZED", 5),
        ("FENCED", 6),
        ("READ_ONLY", 7),
        ("TOO_MANY_REQUESTS", 8),
        ("BAD_VERSION", 9),
        ("SHUTTING_DOWN", 10),
    ]


def test_every_message_type_and_operation_has_a_golden_frame():
    messages = [c[1] for c in CASES]
    types = set(typing.get_args(Request)) | set(typing.get_args(Response))
    assert {type(m) for m in messages} == types
    ops = {c[2][5] for c in CASES}  # the operation byte after length and version
    assert ops == {op for op in Op} | {op | 0x80 for op in Op}


# ---------------------------------------------------------------- entries

ENTRY_HEADER_HEX = h(
    "0102030405060708",  # int64 ledger id
    "0000000000000003",  # int64 entry id
    "0000000000000002",  # int64 LAC of the writer
    "000000000000012c",  # int64 ledger length up to and including this entry: 300
)
PAYLOAD = b"payload"  # 70 61 79 6c 6f 61 64
PASSWORD = b"secret"

# The digest over header and payload, pinned once; each is checked against the
# definition in docs/PROTOCOL.md below.
ENTRY_DIGESTS = {
    DigestType.DUMMY: h(""),  # no digest
    DigestType.CRC32: h("2ab65bd2"),  # uint32 CRC32 (zlib)
    DigestType.CRC32C: h("5ebc567a"),  # uint32 CRC32C (Castagnoli)
    DigestType.MAC: h("a65c81afb2a64898281fd4c988c201fca1d99818"),  # HMAC-SHA1, 20 bytes
}


@pytest.mark.parametrize("digest_type", list(DigestType), ids=lambda d: d.name)
def test_entry_blob_encodes_to_its_golden_bytes_and_decodes_back(digest_type):
    golden = ENTRY_HEADER_HEX + ENTRY_DIGESTS[digest_type] + PAYLOAD
    codec = EntryCodec(digest_type, PASSWORD)
    blob = codec.encode(0x0102030405060708, 3, 2, 300, PAYLOAD)
    assert blob.hex(" ", 8) == golden.hex(" ", 8)
    decoded = codec.decode(golden, 0x0102030405060708, 3)
    assert decoded == (0x0102030405060708, 3, 2, 300, PAYLOAD)
    # What a bookie reads of a blob: ledger id at 0, entry id and LAC at 8 and 16.
    assert blob_ledger_id(golden) == 0x0102030405060708
    assert entry_id_and_lac(golden) == (3, 2)


def test_entry_digests_are_the_documented_functions_of_header_and_payload():
    covered = ENTRY_HEADER_HEX + PAYLOAD
    assert [DigestType(d).digest_size for d in DigestType] == [0, 4, 4, 20]
    # The check values of the standard CRCs pin which polynomial is meant.
    assert zlib.crc32(b"123456789") == 0xCBF43926
    assert crc32c.crc32c(b"123456789") == 0xE3069283
    assert ENTRY_DIGESTS[DigestType.CRC32] == zlib.crc32(covered).to_bytes(4, "big")
    assert ENTRY_DIGESTS[DigestType.CRC32C] == crc32c.crc32c(covered).to_bytes(4, "big")
    mac = hmac.new(hashlib.sha1(b"mac" + PASSWORD).digest(), covered, hashlib.sha1).digest()
    assert ENTRY_DIGESTS[DigestType.MAC] == mac


def test_r10_keys_derived_from_the_password_are_pinned():
    # master key = SHA1("ledger" + password): what bookies store and compare (R10).
    assert master_key(PASSWORD) == h("e793cbc379107648537183605cd361d3bb789a39")
    # MAC key = SHA1("mac" + password): never sent to a bookie.
    assert mac_key(PASSWORD) == h("190c685bae851574f5ab47c960a00c0466f96603")
