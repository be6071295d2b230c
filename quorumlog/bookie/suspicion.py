"""Entries a bookie may have acknowledged and cannot read back: unknown, never absent (R17).

A damaged record in the journal's last batch may be a write torn before its sync
(never acknowledged) or a synced batch whose bits changed since (acknowledged); the
file cannot tell. The batch's manifest says which entries of which ledgers it held
(:mod:`.journal`), and replay records each such range that it could not read back
whole on the ledger's state (``LedgerState.suspect``).

While a range is recorded:

- a read (plain or fencing) of an entry in it that the bookie does not hold answers
  ``IO_ERROR``: unknown, so recovery waits for other bookies or stops (R8), and a
  reader tries another replica (R9); entries it does hold are served as usual;
- a read of the LAC answers ``IO_ERROR`` until the range's last entry is held again
  (a lost entry may have carried a LAC above the one the bookie knows; the LAC an
  entry carries never falls as entry ids grow, so the last one carries the largest);
- an add of its entries (a recovery writing them again) settles them: the range
  shrinks from its first entry while the bookie holds it, and goes once it is empty;
- a delete of the ledger or its garbage collection drops the state, range and all.

Ranges cover every id from the batch's lowest entry of the ledger to its highest, so
with striping (E > Qw) they hold ids the bookie was never sent: those stay unknown
(an I/O error) until the ledger is deleted or collected. That errs on the side of
unknown, as R17 asks.

**Kept across restarts** in ``<data_dir>/suspect-<generation>.a`` and ``.b``: the same
bytes twice (magic, count, then ledger id, first and last entry id per range, and a
CRC32C), each copy written and synced before the next, so one flipped bit leaves one
copy whole and a crash leaves the previous generation whole. Replay writes a new
generation before it cuts the journal tail whose manifest proved a range, and
removes the older ones once it is durable; a start loads the newest generation with a
whole copy, drops the ranges of ledgers gone and the entries held again, and writes a
new generation if that changed anything. Adds that settle a range change it in memory;
the next start finds those entries held and settles them again.
"""

from __future__ import annotations

import contextlib
import logging
import re
import struct
from pathlib import Path

from crc32c import crc32c

from quorumlog.bookie.fileops import FileOps
from quorumlog.bookie.ledger_state import LedgerState
from quorumlog.bookie.storage import LedgerStorage

__all__ = ["entry_unknown", "lac_unknown", "load", "note", "ranges", "restore", "save", "settle"]

log = logging.getLogger(__name__)

_MAGIC = b"QLSUSP01"
_HEAD = struct.Struct(">8sI")  # magic, count
_RANGE = struct.Struct(">Qqq")  # ledger id, first, last
_CRC = struct.Struct(">I")
_NAME = re.compile(r"^suspect-([0-9a-f]{16})\.([ab])$")

Ranges = dict[int, list[tuple[int, int]]]


# ---------------------------------------------------------------- the rules


def note(storage: LedgerStorage, st: LedgerState, first: int, last: int) -> tuple[int, int] | None:
    """Record ``first..last`` of ``st``'s ledger as possibly acknowledged and not held,
    less the entries at its start that the bookie holds; returns the range recorded."""
    while first <= last and storage.has_entry(st, first):
        first += 1
    if first > last:
        return None
    kept = st.suspect or []
    if (first, last) not in kept:
        st.suspect = [*kept, (first, last)]
    return first, last


def entry_unknown(st: LedgerState, entry_id: int) -> bool:
    """Whether a missing entry may have been acknowledged (answer IO_ERROR, not absent)."""
    return any(first <= entry_id <= last for first, last in st.suspect or ())


def lac_unknown(storage: LedgerStorage, st: LedgerState) -> bool:
    """Whether the LAC the bookie knows may be below one it lost."""
    return any(not storage.has_entry(st, last) for _, last in st.suspect or ())


def settle(storage: LedgerStorage, st: LedgerState, first: int, last: int) -> None:
    """Entries ``first..last`` (some of them) were just added: shrink the ranges they
    reach from the front, dropping each that the bookie now holds whole."""
    kept = []
    for low, high in st.suspect or ():
        if first <= low <= last:
            while low <= high and storage.has_entry(st, low):
                low += 1
        if low <= high:
            kept.append((low, high))
    st.suspect = kept or None


def ranges(storage: LedgerStorage) -> Ranges:
    """The ranges recorded on the ledgers that are still here (not deleted)."""
    return {
        ledger_id: list(st.suspect)
        for ledger_id, st in sorted(storage.states.items())
        if st.suspect and not st.deleted
    }


# ---------------------------------------------------------------- the file


def _encode(found: Ranges) -> bytes:
    rows = [(lid, first, last) for lid, kept in found.items() for first, last in kept]
    body = _HEAD.pack(_MAGIC, len(rows)) + b"".join(_RANGE.pack(*row) for row in rows)
    return body + _CRC.pack(crc32c(body))


def _decode(data: bytes) -> Ranges | None:
    """The ranges of a whole copy; None for a damaged or cut one."""
    if len(data) < _HEAD.size + _CRC.size:
        return None
    (stored,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    magic, count = _HEAD.unpack_from(data)
    if (
        crc32c(memoryview(data)[: -_CRC.size]) != stored
        or magic != _MAGIC
        or len(data) != _HEAD.size + count * _RANGE.size + _CRC.size
    ):
        return None
    found: Ranges = {}
    for lid, first, last in _RANGE.iter_unpack(data[_HEAD.size : -_CRC.size]):
        found.setdefault(lid, []).append((first, last))
    return found


def _generations(data_dir: Path, ops: FileOps) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for name in ops.listdir(data_dir):
        match = _NAME.match(name)
        if match:
            out.setdefault(int(match.group(1), 16), []).append(name)
    return out


def load(data_dir: Path, ops: FileOps) -> tuple[Ranges, int]:
    """The newest generation with a whole copy, and that generation (0: none)."""
    for generation, names in sorted(_generations(data_dir, ops).items(), reverse=True):
        for name in sorted(names):
            found = _decode(ops.read_file(data_dir / name))
            if found is not None:
                return found, generation
        # Neither copy is whole: a crash cut this generation short before the journal
        # tail that proved it was cut (one flipped bit spares one copy).
        log.warning("%s: generation %d of the suspect entries is incomplete", data_dir, generation)
    return {}, 0


def save(data_dir: Path, found: Ranges, generation: int, ops: FileOps) -> int:
    """Write ``found`` as generation ``generation + 1`` (both copies durable), then remove
    the older generations; returns the new generation. Nothing to keep: no file."""
    generation = generation + 1 if found else 0
    data = _encode(found)
    for copy in ("a", "b") if found else ():
        path = data_dir / f"suspect-{generation:016x}.{copy}"
        with contextlib.suppress(FileNotFoundError):
            ops.unlink(path)  # left by a start that stopped before it was whole
        fd = ops.create(path)
        try:
            view = memoryview(data)
            written = 0
            while written < len(view):
                written += ops.write(fd, view[written:])
            ops.fsync(fd)
        finally:
            ops.close(fd)
        ops.fsync_directory(data_dir)
    for older, names in _generations(data_dir, ops).items():
        if older != generation:
            for name in names:
                ops.unlink(data_dir / name)
    ops.fsync_directory(data_dir)
    return generation


def restore(storage: LedgerStorage, found: Ranges) -> None:
    """Put loaded ranges back on their ledgers' states, less what is settled: ledgers
    gone (deleted or collected) and entries held again from the start of a range."""
    for ledger_id, kept in found.items():
        st = storage.states.get(ledger_id)
        if st is None or st.deleted:
            continue
        for first, last in kept:
            note(storage, st, first, last)
