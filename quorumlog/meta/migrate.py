"""Move a flat cluster's ledgers to the hierarchical layout, while it runs.

``quorumlog shell migratelayout`` runs :func:`migrate_to_hierarchical`:

1. the marker ``/ledgers/LAYOUT`` is set to hierarchical: from then on every client
   creates its ledgers there (a client reads the marker before each create while its
   cluster is flat);
2. each flat ledger ``/ledgers/<id>`` is moved with one atomic multi-operation: create
   its hierarchical node with the data read, delete the flat node *at the version
   read*. A writer that changed the ledger in between makes the delete, so the whole
   move, fail: the move reads again. A writer that read the flat node before the move
   holds a flat version (offset by ``FLAT_VERSION_BASE``), which never matches the
   moved node: its compare-and-set fails with MetadataVersionError, it reads again and
   finds the ledger at its new place (:class:`~quorumlog.meta.ledgers.LedgerManager`
   looks in both places);
3. ``/ledgers`` is listed again until no flat ledger is left (a client that created
   one before it saw the marker).

Each move is all or nothing, so the migration may stop at any point (a crash, a lost
session, ``max_moves``) and be run again: it picks up what is still flat.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from quorumlog.errors import MetadataError, MetadataVersionError, NodeExistsError, NoNodeError
from quorumlog.meta.layout import (
    LAYOUT_PATH,
    LEDGERS_PATH,
    LEVEL_DIGITS_DEFAULT,
    Layout,
    ReadPacer,
    flat_ledger_id,
    flat_path,
)
from quorumlog.meta.store import CreateOp, DeleteOp, MetadataStore

log = logging.getLogger(__name__)

# A flat listing is read again while it still shows ledgers; each pass moves what it
# saw, so only clients that had not seen the marker yet can add work. Bounded.
_PASSES_MAX = 10
# Compare-and-set conflicts with writers on one ledger before the move gives up.
_MOVE_ATTEMPTS = 100


@dataclass
class MigrationReport:
    """What one run did: ledgers ``moved``, listing ``passes``, flat ledgers ``left``
    (0: the cluster is fully hierarchical) and the ``layout`` now marked."""

    layout: Layout
    moved: int = 0
    passes: int = 0
    left: int = 0


async def mark_hierarchical(store: MetadataStore, level_digits: int) -> Layout:
    """Set the layout marker to hierarchical (kept as is when it already is)."""
    wanted = Layout.hierarchical(level_digits)
    for _ in range(_MOVE_ATTEMPTS):
        try:
            found = await store.get(LAYOUT_PATH)
        except NoNodeError:
            marker = wanted
            try:
                if await store.exists(LEDGERS_PATH) is None:
                    marker = wanted.born_with_ledgers_path()
                    await store.multi(
                        [CreateOp(LEDGERS_PATH), CreateOp(LAYOUT_PATH, marker.to_bytes())]
                    )
                else:
                    await store.create(LAYOUT_PATH, wanted.to_bytes(), make_parents=False)
            except NodeExistsError:
                continue
            return marker
        current = Layout.from_bytes(found.data)
        if current.is_hierarchical:
            return current
        try:
            await store.set(LAYOUT_PATH, wanted.to_bytes(), found.version)
        except MetadataVersionError:
            continue
        return wanted
    raise MetadataError(f"{LAYOUT_PATH}: too many concurrent changes")


async def move_ledger(store: MetadataStore, layout: Layout, ledger_id: int) -> bool:
    """Move one flat ledger to ``layout``'s place; False when it was not flat (any more)."""
    source = flat_path(ledger_id)
    target = layout.hierarchical_path(ledger_id)
    for _ in range(_MOVE_ATTEMPTS):
        try:
            found = await store.get(source)
        except NoNodeError:
            return False  # deleted, or moved by another run
        try:
            await store.multi([CreateOp(target, found.data), DeleteOp(source, found.version)])
        except MetadataVersionError:
            continue  # a writer changed it since the read: move what it wrote
        except NoNodeError:
            return False
        except NodeExistsError:
            raise MetadataError(
                f"ledger {ledger_id} is both at {source} and at {target}: "
                f"left as is, an operator must decide which is right"
            ) from None
        return True
    raise MetadataError(f"ledger {ledger_id}: too many concurrent changes to move it")


async def migrate_to_hierarchical(
    store: MetadataStore,
    *,
    level_digits: int = LEVEL_DIGITS_DEFAULT,
    reads_per_s: float | None = None,
    max_moves: int | None = None,
    on_move: Callable[[int], None] | None = None,
) -> MigrationReport:
    """Mark the cluster hierarchical and move every flat ledger (see the module doc).

    ``level_digits`` is used only when the cluster is not marked hierarchical yet.
    ``reads_per_s`` spaces the store reads (None: no limit); ``max_moves`` stops after
    that many moves (what is left is reported in ``left``); ``on_move(ledger_id)`` is
    called after each move.

    Example::

        report = await migrate_to_hierarchical(store, reads_per_s=500)
        assert report.left == 0
    """
    layout = await mark_hierarchical(store, level_digits)
    report = MigrationReport(layout)
    pacer = ReadPacer(reads_per_s)
    for _ in range(_PASSES_MAX):
        await pacer.wait()
        try:
            names = await store.children(LEDGERS_PATH)
        except NoNodeError:
            return report
        pacer.listed(len(names))
        flat_ids = sorted(i for i in map(flat_ledger_id, names) if i is not None)
        del names
        report.passes += 1
        report.left = len(flat_ids)
        if not flat_ids:
            return report
        for ledger_id in flat_ids:
            if max_moves is not None and report.moved >= max_moves:
                return report
            await pacer.wait()
            if await move_ledger(store, layout, ledger_id):
                report.moved += 1
                if on_move is not None:
                    on_move(ledger_id)
            report.left -= 1
    return report
