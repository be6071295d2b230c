"""The wire codec: round trips, frame limits, and R12 (bytes decode or raise ProtocolError)."""

import contextlib
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumlog.errors import DigestMismatchError, ProtocolError
from quorumlog.proto import (
    AddFlag,
    AddRequest,
    AddResponse,
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
    StatusResponse,
    WriteLacRequest,
    encode,
    master_key,
)

KEY = master_key(b"secret")


def sample_messages():
    codec = EntryCodec(DigestType.CRC32C, b"secret")
    blob = codec.encode(7, 3, 2, 300, b"payload")
    return [
        AddRequest(1, 7, KEY, [blob, blob], AddFlag.RECOVERY),
        AddResponse(1, 0, 7, 2),
        ReadRequest(2, 7, 3, 10, ReadFlag.FENCE | ReadFlag.LONG_POLL, KEY, 2, 500, 4096),
        ReadResponse(2, 0, 7, 3, 2, [blob]),
        ReadLacRequest(3, 7),
        ReadLacResponse(3, 0, 7, 2, 3),
        FenceRequest(4, 7, KEY),
        FenceResponse(4, 6, 7, -1, -1),
        WriteLacRequest(5, 7, KEY, 9),
        StatusResponse(5, Op.WRITE_LAC, 0, 7),
        DeleteLedgerRequest(6, 7, KEY),
        StatusResponse(6, Op.DELETE_LEDGER, 1, 7),
        BookieInfoRequest(8),
        BookieInfoResponse(8, 0, True, 10, 20),
        LedgerKeyRequest(9, 7),
        LedgerKeyResponse(9, 0, 7, KEY),
        LedgerKeyResponse(10, 2, 7),
    ]


def test_every_message_round_trips_even_byte_by_byte():
    messages = sample_messages()
    data = b"".join(encode(m) for m in messages)
    decoder = FrameDecoder()
    out = []
    for i in range(len(data)):
        out += decoder.feed(data[i : i + 1])
    assert out == messages
    assert decoder.buffered_bytes == 0
    assert FrameDecoder().feed(data) == messages


def test_any_split_of_the_stream_decodes_the_same_messages_with_their_sizes():
    # Frames whole within a chunk are decoded from it, a frame begun in an earlier chunk
    # is completed in the buffer: every way of cutting the stream must give the same.
    codec = EntryCodec(DigestType.CRC32C, b"secret")
    large = codec.encode(7, 4, 3, 70_000, bytes(range(256)) * 256)
    messages = [
        *sample_messages(),
        AddRequest(9, 7, KEY, [large]),
        ReadResponse(10, 0, 7, 4, 3, [large]),
    ]
    frames = [encode(m) for m in messages]
    data = b"".join(frames)
    rng = random.Random(5)
    for _ in range(200):
        decoder = FrameDecoder()
        out: list[object] = []
        sizes: list[int] = []
        position = 0
        while position < len(data):
            step = rng.choice([1, 3, 4, 5, 17, 100, 5_000, 70_000, 200_000])
            chunk = data[position : position + step]
            out += decoder.feed(chunk if rng.random() < 0.5 else bytearray(chunk), sizes)
            position += step
        assert out == messages
        assert sizes == [len(frame) for frame in frames]
        assert decoder.buffered_bytes == 0


@pytest.mark.parametrize("digest_type", list(DigestType))
def test_entry_digests_round_trip_and_detect_a_flipped_byte(digest_type):
    codec = EntryCodec(digest_type, b"pw")
    blob = codec.encode(1, 2, 1, 5, b"hello")
    decoded = codec.decode(blob, 1, 2)
    assert (decoded.data, decoded.lac, decoded.length) == (b"hello", 1, 5)
    if digest_type is DigestType.DUMMY:
        return
    damaged = bytearray(blob)
    damaged[-1] ^= 0x01
    with pytest.raises(DigestMismatchError, match="ledger 1 entry 2"):
        codec.decode(bytes(damaged), 1, 2)


def test_r10_mac_digest_depends_on_the_password():
    blob = EntryCodec(DigestType.MAC, b"right").encode(1, 0, -1, 1, b"x")
    with pytest.raises(DigestMismatchError):
        EntryCodec(DigestType.MAC, b"wrong").decode(blob, 1, 0)


def test_r9_blob_for_another_entry_is_refused():
    codec = EntryCodec(DigestType.CRC32C)
    blob = codec.encode(1, 5, 4, 1, b"x")
    with pytest.raises(DigestMismatchError, match="entry 5"):
        codec.decode(blob, 1, 6)


def test_r12_huge_length_prefix_is_refused_without_buffering():
    decoder = FrameDecoder(max_frame_size_bytes=1 << 20)
    with pytest.raises(ProtocolError, match="exceeds the maximum"):
        decoder.feed(struct.pack(">I", 0xFFFFFFF0) + b"xx")
    with pytest.raises(ProtocolError):
        decoder.feed(b"more")  # a failed stream stays failed


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack(">IBBQ", 10, 9, Op.ADD, 1),  # bad version
        struct.pack(">IBBQ", 10, 1, 99, 1),  # unknown operation
        struct.pack(">IBBQ", 10, 1, Op.ADD, 1),  # empty add body
        struct.pack(">I", 3) + b"abc",  # shorter than a header
        struct.pack(">IBBQ", 10 + 33, 1, Op.ADD, 1)
        + struct.pack(">QB20sI", 1, 0, KEY, 1_000_000),  # entry count lies
        struct.pack(">IBBQ", 11, 1, Op.BOOKIE_INFO, 1) + b"x",  # trailing byte
        struct.pack(">IBBQ", 10 + 33, 1, Op.ADD, 1) + struct.pack(">QB20sI", 1, 77, KEY, 0),
    ],
)
def test_r12_malformed_frames_raise_protocol_error(frame):
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(frame)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_r12_any_bytes_decode_or_raise_protocol_error(data):
    decoder = FrameDecoder(max_frame_size_bytes=4096)
    try:
        decoder.feed(data)
    except ProtocolError:
        return
    assert decoder.buffered_bytes <= 4096 + 4


def test_r12_mutated_valid_frames_decode_or_raise_protocol_error():
    rng = random.Random(1234)
    frames = [encode(m) for m in sample_messages()]
    for _ in range(3000):
        frame = bytearray(rng.choice(frames))
        for _ in range(rng.randint(1, 4)):
            frame[rng.randrange(len(frame))] = rng.randrange(256)
        with contextlib.suppress(ProtocolError):
            FrameDecoder().feed(bytes(frame))
