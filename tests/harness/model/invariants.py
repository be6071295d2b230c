"""The rules the model checker checks in every state of the world (and, for the few
that are about ends, in every state where nothing can happen any more).

Each check is named after the rule of the design guide it holds the core to. They
read the world only: what bookies store, what the metadata store records, what the
writer's owner was told (its Confirm, FailAdds, HandleFailed, Closed effects), and
the writer's LAC. The write set is computed here again from R1, apart from
``core/quorum.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from quorumlog.core.metadata import CLOSED, LedgerView
from tests.harness.model.world import World


@dataclass(frozen=True)
class Violation:
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.detail}"


def write_set(view: LedgerView, entry_id: int, write_quorum: int) -> list[str]:
    """R1: the Qw bookies of the ensemble of the last fragment that starts at or before
    ``entry_id``, from index ``entry_id`` mod E."""
    ensemble = [bookies for first, bookies in view.ensembles if first <= entry_id][-1]
    return [ensemble[(entry_id + i) % len(ensemble)] for i in range(write_quorum)]


def holders(world: World, entry_id: int) -> list[str]:
    """The bookies of the entry's recorded write set that store it (crashed or not:
    a crashed bookie keeps its disk). The value is the one the writer sent."""
    cfg = world.cfg
    blob = world.blobs[entry_id] if entry_id < len(world.blobs) else None
    return [
        name
        for name in write_set(world.view, entry_id, cfg.write_quorum)
        if blob is not None and world.bookie(name).blob(entry_id) == blob
    ]


def reader_lac(world: World) -> int:
    """The largest LAC a tailing reader can learn: piggybacked on the entries bookies
    store, or the writer's confirmed LAC (sent as an explicit LAC, R4)."""
    piggybacked = max((b.lac for b in world.bookies), default=-1)
    confirmed = world.confirmed[-1] if world.confirmed else -1
    return max(piggybacked, confirmed)


def check(world: World) -> list[Violation]:
    """Every rule that must hold in every state."""
    found: list[Violation] = []
    cfg = world.cfg
    view = world.view
    confirmed = world.confirmed
    closed = view.state == CLOSED
    last = view.last_entry_id

    if world.errors:
        found.append(Violation("core-effects", "; ".join(world.errors)))

    # R3: confirmations fire in entry-id order, each entry once, never one that failed.
    if confirmed != tuple(range(len(confirmed))):
        found.append(Violation("R3-order", f"confirmed in the order {list(confirmed)}"))
    both = world.failed & set(confirmed)
    if both:
        found.append(Violation("R3-order", f"entries {sorted(both)} both confirmed and failed"))

    # R4: the writer's LAC never decreases, and is its last confirmation.
    lac = world.writer.lac
    if lac < world.lac_max:
        found.append(Violation("R4-lac-monotonic", f"LAC {lac} after {world.lac_max}"))
    if lac != (confirmed[-1] if confirmed else -1):
        found.append(
            Violation("R4-lac", f"LAC {lac}, but the owner was confirmed {list(confirmed)}")
        )

    # R8 (and R3, R5): everything confirmed is on Qa bookies of the write set the
    # metadata records for it now, whatever happened to replies, fragments and closes.
    for entry_id in confirmed:
        on = holders(world, entry_id)
        if len(on) < cfg.ack_quorum:
            ws = write_set(view, entry_id, cfg.write_quorum)
            found.append(
                Violation(
                    "R8-durability",
                    f"entry {entry_id} confirmed, but of its recorded write set "
                    f"{','.join(ws)} only {','.join(on) or 'none'} store it (Qa={cfg.ack_quorum})",
                )
            )

    if closed:
        # R6, R8: a closed ledger ends at or after everything confirmed...
        past = [e for e in confirmed if e > last]
        if past:
            found.append(
                Violation(
                    "R6-nothing-past-close",
                    f"closed at {last}, but entries {past} were confirmed",
                )
            )
        # ... every entry up to its end is on Qa bookies of its recorded write set ...
        for entry_id in range(last + 1):
            on = holders(world, entry_id)
            if len(on) < cfg.ack_quorum:
                ws = write_set(view, entry_id, cfg.write_quorum)
                found.append(
                    Violation(
                        "R8-closed-entries",
                        f"closed at {last}, but of entry {entry_id}'s recorded write set "
                        f"{','.join(ws)} only {','.join(on) or 'none'} store it "
                        f"(Qa={cfg.ack_quorum})",
                    )
                )
        # ... and no reader learns a LAC past its end (R4).
        seen = reader_lac(world)
        if seen > last:
            found.append(
                Violation("R4-reader", f"closed at {last}, but a reader can learn LAC {seen}")
            )

    # R7: a handle that failed (FENCED, no bookies, a refused change) or closed confirms
    # nothing more.
    if world.finished_at >= 0 and len(confirmed) > world.finished_at:
        found.append(
            Violation(
                "R7-nothing-after-failure",
                f"entries {list(confirmed[world.finished_at :])} confirmed after the handle "
                "failed or closed",
            )
        )

    # Single value: no bookie was ever sent two values for one position.
    for name, bookie in zip(cfg.bookie_names, world.bookies, strict=True):
        if bookie.conflicts:
            found.append(
                Violation(
                    "single-value",
                    f"bookie {name} was sent two values for entries {list(bookie.conflicts)}",
                )
            )
    return found


def check_end(world: World) -> list[Violation]:
    """Rules about ends, checked where nothing can happen any more (every message
    delivered, every reply in): no add hangs, a close and a recovery finish."""
    found: list[Violation] = []
    added = set(range(len(world.blobs)))
    settled = set(world.confirmed) | world.failed
    hanging = sorted(added - settled - world.cancelled)
    if hanging:
        found.append(Violation("R3-no-hang", f"adds {hanging} neither confirmed nor failed"))
    if world.close_phase == 2 and not world.close_outcome:
        found.append(Violation("R6-close-ends", "the close was asked for and never answered"))
    if world.recovery_started and not world.r_outcome:
        found.append(Violation("R8-recovery-ends", "the recovery neither closed nor failed"))
    return found
