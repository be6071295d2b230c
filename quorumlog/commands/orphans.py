"""``quorumlog shell orphans``: ledgers nothing refers to, and bookie data of ledgers gone.

Two kinds of leftovers, after a crash in the middle of a deletion (every deletion path
changes the referring node first and deletes the ledgers after, so a crash leaves at
worst these, never a reference to a ledger that is gone):

(a) *Orphan ledgers*: ledgers tagged with an owner (:mod:`quorumlog.core.orphans`: a
    log stream, a database's snapshots, a Spark sink's write) that the owner no longer
    refers to: the log's node is gone, or its list does not hold the ledger; the
    database's snapshot list does not; the sink's write ended without appending it.
    A ledger without quorumlog's tags is a user's and is never listed. With
    ``--delete`` each is deleted, after its owner's node is read again (with a
    ``sync``, R18) and the decision made again: one that its owner refers to by then
    is kept.
(b) *Bookie data of ledgers whose metadata is gone* (a deletion that stopped after the
    metadata, before a bookie was told, or a bookie that was down): each bookie is
    asked what it holds through its admin API (``GET /api/v1/bookie/ledgers``, at the
    address it publishes in its registration or one given with ``--http``), and every
    ledger it names that has no metadata is listed. Only the bookie's garbage
    collection removes it (``quorumlog shell gc``): it deletes data only once the
    metadata store says, for that ledger, that it no longer exists (R15).

Exit status 0 when nothing is left over (or everything found was deleted, for (a)),
every registered bookie was asked and every tagged ledger's owner could be read; 1
otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from quorumlog.commands import gc_trigger, positive_float
from quorumlog.core.orphans import (
    DB_SNAPSHOT,
    SPARK_SINK,
    Owner,
    OwnerView,
    Verdict,
    decide,
    owner_of,
)
from quorumlog.db.snapshot import SNAPSHOTS_PATH
from quorumlog.errors import BKError, NoNodeError, NoSuchLedgerError
from quorumlog.log.errors import NoSuchLogError
from quorumlog.log.metadata import log_node_name, read_log
from quorumlog.meta.layout import ReadPacer
from quorumlog.spark.commit import STAGING_PATH, staging_abandoned

if TYPE_CHECKING:
    from quorumlog.client.bookkeeper import BookKeeper
    from quorumlog.meta.ledger_metadata import LedgerMetadata

# A ledger its owner may still be about to refer to (a log writer's new ledger, a
# snapshot being written) is an orphan only once it is this old.
DEFAULT_MIN_AGE_S = 3600.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--delete",
        action="store_true",
        help="delete the orphan ledgers found, each after its owner is read again",
    )
    p.add_argument("--json", action="store_true", help="one JSON object with everything found")
    p.add_argument(
        "--password", default="", help="the ledgers' password (text), needed to delete them"
    )
    p.add_argument(
        "--min-age-s",
        type=float,
        default=DEFAULT_MIN_AGE_S,
        help="a ledger its owner may still add (a log writer's newest, a snapshot being "
        "written) counts as an orphan only once this old",
    )
    p.add_argument(
        "--reads-per-s",
        type=positive_float,
        default=None,
        help="at most this many metadata reads a second (listings, ledgers and their "
        "owners' nodes), to spare the store's other clients (default: no limit)",
    )
    gc_trigger.add_http_argument(p)


@dataclass
class OrphanLedger:
    ledger_id: int
    owner: str
    why: str
    deleted: bool = False
    error: str | None = None


@dataclass
class BookieLeftover:
    bookie: str
    ledger_id: int


@dataclass
class OrphanReport:
    ledgers: list[OrphanLedger] = field(default_factory=list)
    bookie_data: list[BookieLeftover] = field(default_factory=list)
    # (bookie, why) of registered bookies that could not be asked.
    unreached: list[tuple[str, str]] = field(default_factory=list)
    # (ledger, why) of tagged ledgers whose owner could not be read: neither kind.
    undecided: list[tuple[int, str]] = field(default_factory=list)
    checked_ledgers: int = 0

    @property
    def left(self) -> int:
        """Leftovers still there: orphans not deleted, and bookie data."""
        return sum(not o.deleted for o in self.ledgers) + len(self.bookie_data)

    def to_json(self) -> dict[str, Any]:
        return {
            "checked_ledgers": self.checked_ledgers,
            "ledgers": [asdict(o) for o in self.ledgers],
            "bookie_data": [asdict(b) for b in self.bookie_data],
            "unreached": [{"bookie": b, "why": why} for b, why in self.unreached],
            "undecided": [{"ledger_id": x, "why": why} for x, why in self.undecided],
            "left": self.left,
        }


# ---------------------------------------------------------------- (a) orphan ledgers


async def owner_view(bk: BookKeeper, ledger_id: int, owner: Owner) -> OwnerView:
    """What ``owner``'s node says of ``ledger_id`` now, each node read after a ``sync``
    (R18: a decision that treats something as absent must not read a lagging server)."""
    store = bk.store
    if owner.component == DB_SNAPSHOT:
        path = f"{SNAPSHOTS_PATH}/{log_node_name(owner.name)}"
        await store.sync(path)
        try:
            node = await store.get(path)
        except NoNodeError:
            return OwnerView(exists=True)  # no snapshot recorded yet: an empty list
        raw = json.loads(node.data or b"{}")
        listed = frozenset(int(s["ledger"]) for s in raw.get("snapshots", []))
        dropped = frozenset(int(x) for x in raw.get("dropped", []))
        return OwnerView(exists=True, listed=listed, dropped=dropped)
    registered = abandoned = False
    if owner.component == SPARK_SINK:
        # The registration first, the log after: a commit appends the ledger before its
        # clean-up deletes the registration, so a registration seen gone means the log
        # read next shows the commit's outcome.
        registration = f"{STAGING_PATH}/{owner.write}/l{ledger_id}"
        await store.sync(registration)
        registered = await store.exists(registration) is not None
        abandoned = registered and await staging_abandoned(bk, owner.write or "")
    try:
        metadata, _ = await read_log(store, owner.name, sync=True)
    except NoSuchLogError:
        return OwnerView(exists=False, registered=registered, abandoned=abandoned)
    listed = frozenset(metadata.ledgers)
    return OwnerView(exists=True, listed=listed, registered=registered, abandoned=abandoned)


def _verdict(
    metadata: LedgerMetadata, owner: Owner, view: OwnerView, min_age_ms: int, now_ms: int
) -> Verdict:
    age_ms = max(0, now_ms - metadata.creation_time_ms)
    return decide(
        metadata.ledger_id,
        owner,
        view,
        closed=metadata.is_closed,
        age_ms=age_ms,
        min_age_ms=min_age_ms,
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


async def find_orphan_ledgers(
    bk: BookKeeper,
    *,
    min_age_ms: int = int(DEFAULT_MIN_AGE_S * 1000),
    undecided: list[tuple[int, str]] | None = None,
    reads_per_s: float | None = None,
) -> tuple[list[OrphanLedger], int]:
    """The tagged ledgers their owners no longer refer to, and how many ledgers were
    looked at. Metadata reads (listings, ledgers and owners' nodes) are spaced to
    ``reads_per_s`` (None: no limit). A ledger whose owner cannot be read (a damaged
    node, a store error) is neither: it goes to ``undecided`` with why.

    A log's or a database's node is read once per scan and kept for its other ledgers;
    a ledger that kept view calls an orphan is judged again on its owner's node read
    after its own metadata (a ledger committed to a list after the kept read must not
    be called an orphan). A kept view that is older than a change can only hide an
    orphan until the next scan, never invent one."""
    found: list[OrphanLedger] = []
    checked = 0
    pacer = ReadPacer(reads_per_s)
    kept: dict[tuple[str, str], OwnerView] = {}

    async def view_of(ledger_id: int, owner: Owner, fresh: bool) -> OwnerView:
        key = (owner.component, owner.name)
        if owner.component == SPARK_SINK:  # a sink's view is per ledger (its registration)
            await pacer.wait()
            return await owner_view(bk, ledger_id, owner)
        if fresh or key not in kept:
            await pacer.wait()
            kept[key] = await owner_view(bk, ledger_id, owner)
        return kept[key]

    await bk.store.sync("/")
    async for ledger_id, metadata, _version in bk.ledgers.ledgers(pacer=pacer):
        checked += 1
        owner = owner_of(metadata.custom_metadata)
        if owner is None:
            continue  # a user's ledger
        try:
            view = await view_of(ledger_id, owner, fresh=False)
            verdict = _verdict(metadata, owner, view, min_age_ms, _now_ms())
            if verdict.orphan and owner.component != SPARK_SINK:
                view = await view_of(ledger_id, owner, fresh=True)
                verdict = _verdict(metadata, owner, view, min_age_ms, _now_ms())
        except (BKError, ValueError, KeyError, TypeError) as exc:
            if undecided is not None:
                undecided.append((ledger_id, f"{owner} could not be read: {exc}"))
            continue
        if verdict.orphan:
            found.append(OrphanLedger(ledger_id, str(owner), verdict.why))
    return found, checked


async def delete_orphan(
    bk: BookKeeper, orphan: OrphanLedger, *, password: bytes, min_age_ms: int
) -> None:
    """Delete ``orphan`` if it still is one: its metadata and its owner's node are read
    again first, and the decision made again (its owner may refer to it by now)."""
    try:
        metadata, _ = await bk.ledgers.read(orphan.ledger_id)
    except NoSuchLedgerError:
        orphan.deleted = True  # deleted meanwhile (its owner's own clean-up)
        return
    owner = owner_of(metadata.custom_metadata)
    if owner is None:
        orphan.error = "its tags changed: kept"
        return
    try:
        view = await owner_view(bk, orphan.ledger_id, owner)
    except (BKError, ValueError, KeyError, TypeError) as exc:
        orphan.error = f"kept: {owner} could not be read again: {exc}"
        return
    verdict = _verdict(metadata, owner, view, min_age_ms, _now_ms())
    if not verdict.orphan:
        orphan.error = f"kept: {verdict.why}"
        return
    try:
        await bk.delete_ledger(orphan.ledger_id, password)
    except NoSuchLedgerError:
        pass
    except BKError as exc:
        orphan.error = f"not deleted: {exc.message}"
        return
    orphan.deleted = True


# ---------------------------------------------------------------- (b) bookie data


async def find_bookie_leftovers(
    bk: BookKeeper, args: argparse.Namespace
) -> tuple[list[BookieLeftover], list[tuple[str, str]]]:
    """Ledgers bookies hold whose metadata is gone, and the registered bookies that could
    not be asked (with why)."""
    registered = set(await bk.registry.writable_bookies())
    registered |= set(await bk.registry.readonly_bookies())
    credentials = gc_trigger._Credentials.from_args(args)
    if args.http:
        targets = list(args.http)
        unreached_why = "registered, but no --http reached it"
    else:
        published = await gc_trigger._published_admin_addresses(bk.registry, registered)
        targets = list(published.values())
        unreached_why = "registered without an admin API (start it with --http-port)"
    answers = await asyncio.gather(
        *(_held_ledgers(http, credentials) for http in targets), return_exceptions=True
    )
    unreached: list[tuple[str, str]] = []
    reached: set[str] = set()
    held: list[tuple[str, int]] = []
    for http, answer in zip(targets, answers, strict=True):
        if isinstance(answer, BaseException):
            unreached.append((http, str(answer)))
            continue
        bookie, ids = answer
        reached.add(bookie)
        held += [(bookie, ledger_id) for ledger_id in ids]
    for bookie in sorted(registered - reached):
        if not any(b == bookie for b, _ in unreached):
            unreached.append((bookie, unreached_why))
    # R18: a lagging server could still show metadata deleted a moment ago (harmless
    # here: that only hides a leftover), or miss a ledger created since (which would
    # show data as a leftover): read after a sync.
    await bk.store.sync("/")
    leftovers: list[BookieLeftover] = []
    gone: dict[int, bool] = {}
    for bookie, ledger_id in sorted(held):
        if ledger_id not in gone:
            try:
                await bk.ledgers.read(ledger_id)
                gone[ledger_id] = False
            except NoSuchLedgerError:
                gone[ledger_id] = True
        if gone[ledger_id]:
            leftovers.append(BookieLeftover(bookie, ledger_id))
    return leftovers, unreached


async def _held_ledgers(http: str, credentials: gc_trigger._Credentials) -> tuple[str, list[int]]:
    base = http if http.startswith("http") else f"http://{http}"
    answer = await asyncio.to_thread(
        gc_trigger._call, "GET", f"{base}/api/v1/bookie/ledgers", None, 30, credentials
    )
    return str(answer.get("bookieId", http)), [int(x) for x in answer.get("ledgers", [])]


# ---------------------------------------------------------------- the command


async def find(bk: BookKeeper, args: argparse.Namespace) -> OrphanReport:
    min_age_ms = int(args.min_age_s * 1000)
    report = OrphanReport()
    report.ledgers, report.checked_ledgers = await find_orphan_ledgers(
        bk, min_age_ms=min_age_ms, undecided=report.undecided, reads_per_s=args.reads_per_s
    )
    if args.delete:
        for orphan in report.ledgers:
            await delete_orphan(bk, orphan, password=args.password.encode(), min_age_ms=min_age_ms)
    report.bookie_data, report.unreached = await find_bookie_leftovers(bk, args)
    return report


async def run_orphans(bk: BookKeeper, args: argparse.Namespace) -> int:
    report = await find(bk, args)
    if args.json:
        print(json.dumps(report.to_json(), sort_keys=True))
    else:
        for orphan in report.ledgers:
            state = " [deleted]" if orphan.deleted else ""
            if orphan.error:
                state = f" [{orphan.error}]"
            print(f"ledger {orphan.ledger_id}: orphan of {orphan.owner}: {orphan.why}{state}")
        for leftover in report.bookie_data:
            print(
                f"bookie {leftover.bookie} holds ledger {leftover.ledger_id}, whose metadata "
                "is gone (its garbage collection removes it: quorumlog shell gc)"
            )
        deleted = sum(o.deleted for o in report.ledgers)
        print(
            f"{report.checked_ledgers} ledger(s) checked: {len(report.ledgers)} orphan(s)"
            f"{f', {deleted} deleted' if args.delete else ''}; "
            f"{len(report.bookie_data)} ledger(s) of bookie data without metadata"
        )
    for bookie, why in report.unreached:
        print(f"{bookie}: {why}", file=sys.stderr)
    for ledger_id, why in report.undecided:
        print(f"ledger {ledger_id}: not decided: {why}", file=sys.stderr)
    clean = report.left == 0 and not report.unreached and not report.undecided
    return 0 if clean else 1
