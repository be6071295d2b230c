"""Entries as bytes: the header a bookie interprets, the digest it never checks.

An entry travels and is stored as one self-verifying blob, built by the writer:

    offset 0   int64  ledger id
    offset 8   int64  entry id
    offset 16  int64  last add confirmed (LAC) of the writer when it sent the entry
    offset 24  int64  ledger length in bytes up to and including this entry
    offset 32  digest (0, 4 or 20 bytes, by digest type)
    then       payload

The digest covers the 32-byte header and the payload. Bookies read only the
first three fields; readers check the digest, and a mismatch makes them try
another replica (R9). Because a recovering client rewrites the blob exactly as
it read it, a recovered entry is byte-identical to the one first written.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
import zlib
from typing import NamedTuple

import crc32c as _crc32c

from quorumlog.errors import DigestMismatchError, ProtocolError

ENTRY_HEADER = struct.Struct(">qqqq")
ENTRY_HEADER_SIZE = ENTRY_HEADER.size
_ENTRY_ID_AND_LAC = struct.Struct(">qq")
_U32 = struct.Struct(">I")
MASTER_KEY_SIZE = 20
_pack_header = ENTRY_HEADER.pack
_pack_u32 = _U32.pack
_crc = _crc32c.crc32c


class DigestType(enum.IntEnum):
    """How entries are protected. CRC32C uses the CPU's CRC instruction where present."""

    DUMMY = 0
    CRC32 = 1
    CRC32C = 2
    MAC = 3

    @property
    def digest_size(self) -> int:
        return _DIGEST_SIZE[self]


_DIGEST_SIZE = {DigestType.DUMMY: 0, DigestType.CRC32: 4, DigestType.CRC32C: 4, DigestType.MAC: 20}


def master_key(password: bytes) -> bytes:
    """The key a bookie stores for a ledger on first write (R10), derived from its password."""
    return hashlib.sha1(b"ledger" + password).digest()


def mac_key(password: bytes) -> bytes:
    """The HMAC-SHA1 key for MAC digests; distinct from the master key bookies see."""
    return hashlib.sha1(b"mac" + password).digest()


class Entry(NamedTuple):
    """One entry as a reader sees it."""

    ledger_id: int
    entry_id: int
    data: bytes


class DecodedEntry(NamedTuple):
    ledger_id: int
    entry_id: int
    lac: int
    length: int
    data: bytes


class EntryCodec:
    """Builds and verifies entry blobs for one ledger's digest type and password."""

    __slots__ = ("_crc32c", "_digest", "_digest_size", "_hmac_key", "_unchecked", "digest_type")

    def __init__(
        self, digest_type: DigestType, password: bytes = b"", *, mac_unchecked: bool = False
    ) -> None:
        """``mac_unchecked``: the password is not known (re-replication given only the
        ledger's master key): MAC digests are not checked, only each blob's header and
        size, and such a codec cannot build blobs. CRC digests need no password."""
        self.digest_type = DigestType(digest_type)
        self._unchecked = mac_unchecked and self.digest_type is DigestType.MAC
        self._digest_size = self.digest_type.digest_size
        self._hmac_key = mac_key(password)
        if self.digest_type is DigestType.DUMMY:
            self._digest = _dummy_digest
        elif self.digest_type is DigestType.CRC32:
            self._digest = _crc32_digest
        elif self.digest_type is DigestType.CRC32C:
            self._digest = _crc32c_digest
        else:
            self._digest = self._mac_digest
        # The default digest, computed inline on the add path (a call less per entry).
        self._crc32c = self.digest_type is DigestType.CRC32C

    def _mac_digest(self, header: bytes, payload: bytes | memoryview) -> bytes:
        mac = hmac.new(self._hmac_key, header, hashlib.sha1)
        mac.update(payload)
        return mac.digest()

    def encode(self, ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes) -> bytes:
        """The blob for one entry: header, digest, payload."""
        if self._unchecked:
            raise ValueError("no MAC digest can be computed without the ledger's password")
        header = _pack_header(ledger_id, entry_id, lac, length)
        if self._crc32c:
            digest = _pack_u32(_crc(payload, _crc(header)))
        else:
            digest = self._digest(header, payload)
        return b"".join((header, digest, payload))

    def decode(self, blob: bytes, ledger_id: int, entry_id: int) -> DecodedEntry:
        """Check a blob read from a bookie; raise DigestMismatchError if it was damaged."""
        size = self._digest_size
        if len(blob) < ENTRY_HEADER_SIZE + size:
            raise DigestMismatchError(
                f"ledger {ledger_id} entry {entry_id}: blob of {len(blob)} bytes is too short"
            )
        header = blob[:ENTRY_HEADER_SIZE]
        got_ledger, got_entry, lac, length = ENTRY_HEADER.unpack(header)
        mv = memoryview(blob)
        payload = mv[ENTRY_HEADER_SIZE + size :]
        if (
            not self._unchecked
            and self._digest(header, payload) != blob[ENTRY_HEADER_SIZE : ENTRY_HEADER_SIZE + size]
        ):
            raise DigestMismatchError(
                f"ledger {ledger_id} entry {entry_id}: digest mismatch ({self.digest_type.name})"
            )
        if got_ledger != ledger_id or got_entry != entry_id:
            raise DigestMismatchError(
                f"ledger {ledger_id} entry {entry_id}: blob is for ledger {got_ledger} "
                f"entry {got_entry}"
            )
        return DecodedEntry(got_ledger, got_entry, lac, length, bytes(payload))

    def decode_payloads(
        self, blobs: list[bytes], ledger_id: int, first_entry_id: int
    ) -> tuple[list[bytes], int, DigestMismatchError | None]:
        """Check consecutive blobs (entry ids from ``first_entry_id``) as :meth:`decode`
        does, for a read's whole answer at once.

        Returns the payloads of the sound prefix, the largest LAC they carry (-1 if none)
        and the error of the first blob that failed (None if all passed). No object per
        entry beyond its payload: a sequential read pays this per entry, so it costs half
        of calling :meth:`decode` for each.
        """
        start = ENTRY_HEADER_SIZE + self._digest_size
        unpack_header = ENTRY_HEADER.unpack_from
        crc32c = _crc32c.crc32c if self.digest_type is DigestType.CRC32C else None
        digest = self._digest
        payloads: list[bytes] = []
        largest_lac = -1
        entry_id = first_entry_id
        for blob in blobs:
            if len(blob) < start:
                return payloads, largest_lac, self._mismatch(blob, ledger_id, entry_id)
            got_ledger, got_entry, lac, _ = unpack_header(blob)
            # The payload is what the reader keeps; the digest runs over it, so it is
            # copied out of the blob once and never again.
            payload = blob[start:]
            if crc32c is not None:
                sound = (
                    crc32c(payload, crc32c(blob[:ENTRY_HEADER_SIZE]))
                    == _U32.unpack_from(blob, ENTRY_HEADER_SIZE)[0]
                )
            else:
                sound = (
                    self._unchecked
                    or digest(blob[:ENTRY_HEADER_SIZE], payload) == blob[ENTRY_HEADER_SIZE:start]
                )
            if not sound or got_ledger != ledger_id or got_entry != entry_id:
                return payloads, largest_lac, self._mismatch(blob, ledger_id, entry_id)
            if lac > largest_lac:
                largest_lac = lac
            payloads.append(payload)
            entry_id += 1
        return payloads, largest_lac, None

    def _mismatch(self, blob: bytes, ledger_id: int, entry_id: int) -> DigestMismatchError:
        """The error :meth:`decode` raises for ``blob``."""
        try:
            self.decode(blob, ledger_id, entry_id)
        except DigestMismatchError as exc:
            return exc
        raise AssertionError("decode accepted a blob decode_payloads refused")


def _dummy_digest(header: bytes, payload: bytes | memoryview) -> bytes:
    return b""


def _crc32_digest(header: bytes, payload: bytes | memoryview) -> bytes:
    return _U32.pack(zlib.crc32(payload, zlib.crc32(header)))


def _crc32c_digest(header: bytes, payload: bytes | memoryview) -> bytes:
    return _U32.pack(_crc32c.crc32c(payload, _crc32c.crc32c(header)))


def entry_id_and_lac(blob: bytes | memoryview) -> tuple[int, int]:
    """What a bookie reads of a blob: (entry id, LAC). Raises ProtocolError if too short."""
    if len(blob) < ENTRY_HEADER_SIZE:
        raise ProtocolError(f"entry blob of {len(blob)} bytes is shorter than its header")
    return _ENTRY_ID_AND_LAC.unpack_from(blob, 8)


def blob_ledger_id(blob: bytes | memoryview) -> int:
    if len(blob) < ENTRY_HEADER_SIZE:
        raise ProtocolError(f"entry blob of {len(blob)} bytes is shorter than its header")
    return int(struct.unpack_from(">q", blob, 0)[0])
