"""What a bookie remembers about one ledger besides its entries.

Fence flag, master key (R10), explicit LAC, the LAC it has learnt, the largest
entry id it stores, and whether the ledger was deleted here (a tombstone, so
that a late add from the old writer is refused, BookKeeper #4462).

A state whose stored record was found damaged has ``damaged`` set: what the
ledger's fence, key and LACs were is unknown, so every request of it but a delete
answers an I/O error (R17) until a delete or garbage collection drops it.

Recent index updates live here too (``recent``: entry id -> location) until a
checkpoint writes them to the durable index; ``flushing`` holds the ones a
checkpoint is writing right now, so reads find them in either place.
"""

from __future__ import annotations

import struct

from quorumlog.proto.entry import MASTER_KEY_SIZE

# A location in ledger storage: (entry log id, record offset, blob size).
Location = tuple[int, int, int]

_FLAG_FENCED = 1
_FLAG_DELETED = 2
_FLAG_HAS_KEY = 4
_RECORD = struct.Struct(f">Bqqq{MASTER_KEY_SIZE}s")  # flags, explicit LAC, LAC, last entry, key
STATE_SIZE = _RECORD.size  # bytes of :meth:`LedgerState.to_bytes`
_NO_KEY = bytes(MASTER_KEY_SIZE)


class LedgerState:
    """Per-ledger state; mutated on the event loop only."""

    __slots__ = (
        "damaged",
        "deleted",
        "dirty",
        "explicit_lac",
        "fence_durable",
        "fenced",
        "flushing",
        "lac",
        "last_entry_id",
        "ledger_id",
        "master_key",
        "recent",
        "suspect",
    )

    def __init__(self, ledger_id: int) -> None:
        self.ledger_id = ledger_id
        self.master_key: bytes | None = None
        self.fenced = False
        self.fence_durable = False  # the fence record is known to be synced (in memory only)
        self.deleted = False
        self.explicit_lac = -1
        self.lac = -1  # max of the piggybacked LACs and the explicit LAC
        self.last_entry_id = -1
        self.recent: dict[int, Location] = {}
        self.flushing: dict[int, Location] | None = None
        self.dirty = False  # changed since the last checkpoint captured it
        # Entry id ranges (first, last) that a damaged journal batch held: a missing entry
        # in one is unknown, never absent (R17; in memory, kept by .suspicion's file).
        self.suspect: list[tuple[int, int]] | None = None
        # Why this ledger's durable state is unknown (its index record failed its
        # checksum), or None. Such a state is never written back; requests of the
        # ledger answer I/O errors (R17) until a delete or garbage collection drops it.
        self.damaged: str | None = None

    def to_bytes(self) -> bytes:
        """The durable part (index entries are stored apart)."""
        flags = (
            (_FLAG_FENCED if self.fenced else 0)
            | (_FLAG_DELETED if self.deleted else 0)
            | (_FLAG_HAS_KEY if self.master_key is not None else 0)
        )
        return _RECORD.pack(
            flags, self.explicit_lac, self.lac, self.last_entry_id, self.master_key or _NO_KEY
        )

    @classmethod
    def from_bytes(cls, ledger_id: int, data: bytes) -> LedgerState:
        flags, explicit_lac, lac, last_entry_id, key = _RECORD.unpack(data)
        state = cls(ledger_id)
        state.fenced = bool(flags & _FLAG_FENCED)
        state.deleted = bool(flags & _FLAG_DELETED)
        state.master_key = key if flags & _FLAG_HAS_KEY else None
        state.explicit_lac = explicit_lac
        state.lac = lac
        state.last_entry_id = last_entry_id
        return state

    def location(self, entry_id: int) -> Location | None:
        """Where the entry is, if a recent (not yet checkpointed) add put it there."""
        loc = self.recent.get(entry_id)
        if loc is None and self.flushing is not None:
            loc = self.flushing.get(entry_id)
        return loc

    def __repr__(self) -> str:
        return (
            f"LedgerState(ledger={self.ledger_id}, fenced={self.fenced}, deleted={self.deleted}, "
            f"lac={self.lac}, explicit_lac={self.explicit_lac}, last={self.last_entry_id})"
        )
