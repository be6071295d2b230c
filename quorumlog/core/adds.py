"""Add tracking for one ledger writer: which bookie acknowledged what, and the LAC.

Pure bookkeeping, no I/O and no clock. The ledger handle feeds it events
(an entry was sent, a bookie acknowledged entries, a bookie was replaced) and
acts on what it returns (entries newly confirmed, entries to resend).

R3 is enforced here: an entry is confirmed when Qa bookies of its write set
acknowledged it *and* every entry below it is confirmed; :meth:`confirm`
hands confirmed entries back strictly in entry-id order, so completions fire
in that order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from quorumlog.core.quorum import all_write_sets


class PendingAdd:
    """One entry sent but not yet confirmed."""

    __slots__ = ("ack_count", "acked_mask", "blob", "entry_id", "token", "write_set")

    def __init__(self, entry_id: int, blob: bytes, write_set: tuple[int, ...], token: Any) -> None:
        self.entry_id = entry_id
        self.blob = blob
        self.write_set = write_set
        self.token = token  # opaque to the core: the handle keeps its future here
        self.acked_mask = 0
        self.ack_count = 0


class AddTracker:
    """Pending adds of one writer, from LAC + 1 up to the last entry sent."""

    __slots__ = (
        "_pending",
        "_write_sets",
        "ack_quorum",
        "ensemble_size",
        "lac",
        "next_entry_id",
        "write_quorum",
    )

    def __init__(self, ensemble_size: int, write_quorum: int, ack_quorum: int, lac: int = -1):
        self.ensemble_size = ensemble_size
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum
        self.lac = lac
        self.next_entry_id = lac + 1
        self._pending: dict[int, PendingAdd] = {}
        # The E write sets of the ensemble, computed once: entry e uses write set e mod E.
        self._write_sets = all_write_sets(ensemble_size, write_quorum)

    def __len__(self) -> int:
        return len(self._pending)

    def add(
        self, blob: bytes, token: Any, queues: list[list[PendingAdd]] | None = None
    ) -> PendingAdd:
        """Register the next entry (its id is ``next_entry_id`` before the call); with
        ``queues`` (one list per bookie of the ensemble), also append it to the queue of
        each bookie of its write set (the writer's outbox: one call per add, not two)."""
        entry_id = self.next_entry_id
        self.next_entry_id = entry_id + 1
        write_set = self._write_sets[entry_id % self.ensemble_size]
        pending = PendingAdd(entry_id, blob, write_set, token)
        self._pending[entry_id] = pending
        if queues is not None:
            for slot in write_set:
                queues[slot].append(pending)
        return pending

    def ack(self, entry_ids: Iterable[int], bookie_index: int) -> bool:
        """Record that ``bookie_index`` acknowledged ``entry_ids``. True if LAC may move.

        Acks for entries already confirmed, or from a bookie outside the entry's
        write set (a late answer from a replaced bookie), are ignored.
        """
        bit = 1 << bookie_index
        pending = self._pending
        quorum = self.ack_quorum
        may_advance = False
        for entry_id in entry_ids:
            p = pending.get(entry_id)
            if p is None or p.acked_mask & bit or bookie_index not in p.write_set:
                continue
            p.acked_mask |= bit
            p.ack_count += 1
            if p.ack_count >= quorum:
                may_advance = True
        return may_advance

    def confirm(self) -> list[PendingAdd]:
        """Pop the entries that are now confirmed, in entry-id order, and raise the LAC."""
        pending = self._pending
        quorum = self.ack_quorum
        done: list[PendingAdd] = []
        next_id = self.lac + 1
        while True:
            p = pending.get(next_id)
            if p is None or p.ack_count < quorum:
                break
            del pending[next_id]
            done.append(p)
            next_id += 1
        if done:
            self.lac = next_id - 1
        return done

    def outstanding(self) -> list[PendingAdd]:
        """Every unconfirmed entry, in entry-id order."""
        return [self._pending[e] for e in sorted(self._pending)]

    def replace_bookie(self, bookie_index: int, from_entry_id: int) -> list[PendingAdd]:
        """R5: the bookie at ``bookie_index`` was replaced from ``from_entry_id`` on.

        Its acknowledgements of entries in the new fragment no longer count (readers
        will look for those entries on the new bookie), so they are forgotten; the
        entries returned must be sent to the new bookie, in order.
        """
        bit = 1 << bookie_index
        resend: list[PendingAdd] = []
        for entry_id in sorted(self._pending):
            p = self._pending[entry_id]
            if entry_id < from_entry_id or bookie_index not in p.write_set:
                continue
            if p.acked_mask & bit:
                p.acked_mask &= ~bit
                p.ack_count -= 1
            resend.append(p)
        return resend

    def fail_all(self) -> list[PendingAdd]:
        """Drop every pending entry (the ledger was fenced or closed under the writer)."""
        failed = self.outstanding()
        self._pending.clear()
        return failed
