"""Under-replication marks in the metadata store: what autorecovery has to repair.

The auditor marks a ledger under-replicated, naming the bookies whose copies are
lost; a replication worker claims the mark with an ephemeral lock, repairs the
ledger and clears the mark. The layout (see docs/METADATA.md)::

    /underreplication/ledgers/<ledger id>     persistent, JSON: {"bookies": [...],
                                              "marked_ms": first mark, wall clock}
    /underreplication/locks/<ledger id>       ephemeral: a worker is repairing it
                                              (JSON: {"owner": ..., "token": ...})
    /underreplication/enabled                 "false" pauses autorecovery (absent: on)
    /underreplication/lostBookieRecoveryDelay seconds, decimal (absent: the default)
    /underreplication/auditor                 ephemeral: the auditor's identifier
    /underreplication/auditrequest            present: run a full audit now
    /underreplication/lastaudit               JSON summary of the last periodic audit

Marks are merged, never overwritten: marking a ledger already marked adds the new
bookies with a compare-and-set, and writes nothing when they are all there, so a
worker that read a mark at version v clears it only if nothing was added since
(``clear`` deletes at version v). A lock is an ephemeral node, so the claim of a
worker that dies goes with its session.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from quorumlog.errors import (
    InvalidArgumentError,
    MetadataError,
    MetadataVersionError,
    NodeExistsError,
    NoNodeError,
)
from quorumlog.meta.store import MetadataStore

ROOT = "/underreplication"
LEDGERS_PATH = f"{ROOT}/ledgers"
LOCKS_PATH = f"{ROOT}/locks"
ENABLED_PATH = f"{ROOT}/enabled"
DELAY_PATH = f"{ROOT}/lostBookieRecoveryDelay"
AUDITOR_PATH = f"{ROOT}/auditor"
AUDIT_REQUEST_PATH = f"{ROOT}/auditrequest"
LAST_AUDIT_PATH = f"{ROOT}/lastaudit"
# Ledgers with entries of which no copy is left (one node each, JSON): reported once
# and never retried, until the ledger is deleted or its bookies come back.
LOST_PATH = f"{ROOT}/lost"
# The leader election group of the auditor candidates (/election/<group>).
AUDITOR_ELECTION_GROUP = "autorecovery-auditor"

# BookKeeper's default lostBookieRecoveryDelay is 0: a bookie that goes is
# re-replicated at once. Operators set it to ride out restarts.
LOST_BOOKIE_RECOVERY_DELAY_DEFAULT_S = 0
# A mark is merged with a compare-and-set; conflicts mean other auditors' writes.
_CAS_ATTEMPTS = 50


@dataclass(frozen=True, slots=True)
class Mark:
    """One under-replicated ledger: the bookies whose copies are lost, when it was
    first marked (wall-clock ms) and the version of its node."""

    ledger_id: int
    bookies: tuple[str, ...]
    marked_ms: int
    version: int

    def to_dict(self) -> dict[str, object]:
        return {
            "ledger_id": self.ledger_id,
            "bookies": list(self.bookies),
            "marked_ms": self.marked_ms,
        }


def _mark_path(ledger_id: int) -> str:
    if ledger_id < 0:
        raise InvalidArgumentError(f"bad ledger id {ledger_id}")
    return f"{LEDGERS_PATH}/{ledger_id}"


def _lock_path(ledger_id: int) -> str:
    return f"{LOCKS_PATH}/{ledger_id}"


def _encode(bookies: set[str] | tuple[str, ...], marked_ms: int) -> bytes:
    return json.dumps({"bookies": sorted(bookies), "marked_ms": marked_ms}).encode()


def _decode(ledger_id: int, data: bytes, version: int) -> Mark:
    try:
        obj = json.loads(data)
        bookies = tuple(sorted(str(b) for b in obj["bookies"]))
        marked_ms = int(obj["marked_ms"])
    except (ValueError, KeyError, TypeError) as exc:
        raise MetadataError(
            f"under-replication mark of ledger {ledger_id}: bad data ({exc})"
        ) from None
    return Mark(ledger_id, bookies, marked_ms, version)


@dataclass(frozen=True, slots=True)
class LostLedger:
    """A ledger some of whose entries have no copy left on any bookie."""

    ledger_id: int
    bookies: tuple[str, ...]  # the lost bookies whose copies cannot be replaced
    reason: str
    lost_ms: int
    version: int = -1  # of its node, for a compare-and-set

    def to_dict(self) -> dict[str, object]:
        return {
            "ledger_id": self.ledger_id,
            "bookies": list(self.bookies),
            "reason": self.reason,
            "lost_ms": self.lost_ms,
        }


class UnderReplicationManager:
    """The marks, locks and switches of autorecovery on one metadata store.

    ``clock`` gives the wall-clock seconds that marks record (``marked_ms``); the
    simulator passes its virtual clock."""

    def __init__(self, store: MetadataStore, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

    # ------------------------------------------------------------ marks

    async def mark(self, ledger_id: int, bookies: set[str] | list[str]) -> bool:
        """Mark ``ledger_id`` under-replicated with ``bookies`` lost; True if the
        store changed (a new mark, or new bookies added to one)."""
        wanted = set(bookies)
        if not wanted:
            raise InvalidArgumentError(f"ledger {ledger_id}: a mark names at least one bookie")
        path = _mark_path(ledger_id)
        for _ in range(_CAS_ATTEMPTS):
            try:
                current = await self.get(ledger_id)
            except NoNodeError:
                try:
                    await self.store.create(path, _encode(wanted, int(self.clock() * 1000)))
                    return True
                except NodeExistsError:
                    continue  # marked meanwhile: merge into it
            if wanted <= set(current.bookies):
                return False
            merged = wanted | set(current.bookies)
            try:
                await self.store.set(path, _encode(merged, current.marked_ms), current.version)
                return True
            except (MetadataVersionError, NoNodeError):
                continue
        raise MetadataError(f"ledger {ledger_id}: marking it kept conflicting; try again")

    async def get(self, ledger_id: int) -> Mark:
        """The mark of ``ledger_id``; NoNodeError if it is not marked."""
        node = await self.store.get(_mark_path(ledger_id))
        return _decode(ledger_id, node.data, node.version)

    async def marked_ledgers(self) -> list[int]:
        """Ids of the marked ledgers, in increasing order."""
        try:
            names = await self.store.children(LEDGERS_PATH)
        except NoNodeError:
            return []
        return sorted(int(n) for n in names if n.isdigit())

    async def list_marks(self) -> list[Mark]:
        """Every mark (a mark cleared while listing is left out)."""
        marks = []
        for ledger_id in await self.marked_ledgers():
            try:
                marks.append(await self.get(ledger_id))
            except NoNodeError:
                continue
        return marks

    async def clear(self, ledger_id: int, version: int) -> bool:
        """Delete the mark if it is still at ``version``: False when bookies were added
        since (the mark stays for another repair); True when it is gone."""
        try:
            await self.store.delete(_mark_path(ledger_id), version)
        except NoNodeError:
            return True
        except MetadataVersionError:
            return False
        return True

    # ------------------------------------------------------------ lost ledgers

    async def record_lost(self, ledger_id: int, bookies: Iterable[str], reason: str) -> bool:
        """Record ``ledger_id`` as lost with ``bookies`` (merged into a record there is:
        its mark is the caller's to clear); True when it was not recorded before."""
        path = f"{LOST_PATH}/{ledger_id}"
        wanted = set(bookies)
        for _ in range(_CAS_ATTEMPTS):
            current = await self.lost_ledger(ledger_id)
            body: dict[str, object] = {
                "bookies": sorted(wanted | set(current.bookies if current else ())),
                "reason": (current.reason if current else reason)[:4000],
                "lost_ms": current.lost_ms if current else int(self.clock() * 1000),
            }
            data = json.dumps(body, sort_keys=True).encode()
            if current is None:
                try:
                    await self.store.create(path, data)
                    return True
                except NodeExistsError:
                    continue
            if wanted <= set(current.bookies):
                return False
            try:
                await self.store.set(path, data, current.version)
                return False
            except (MetadataVersionError, NoNodeError):
                continue
        raise MetadataError(f"ledger {ledger_id}: recording it lost kept conflicting; try again")

    async def lost_ledger(self, ledger_id: int) -> LostLedger | None:
        try:
            node = await self.store.get(f"{LOST_PATH}/{ledger_id}")
        except NoNodeError:
            return None
        try:
            body = json.loads(node.data)
            return LostLedger(
                ledger_id,
                tuple(body["bookies"]),
                str(body["reason"]),
                int(body["lost_ms"]),
                node.version,
            )
        except (ValueError, KeyError, TypeError):
            raise MetadataError(f"{LOST_PATH}/{ledger_id}: not a lost-ledger record") from None

    async def lost_ledgers(self) -> list[LostLedger]:
        """Every ledger recorded lost, by id."""
        try:
            names = await self.store.children(LOST_PATH)
        except NoNodeError:
            return []
        found = []
        for ledger_id in sorted(int(n) for n in names if n.isdigit()):
            lost = await self.lost_ledger(ledger_id)
            if lost is not None:
                found.append(lost)
        return found

    async def forget_lost(self, ledger_id: int) -> None:
        """Drop the record (the ledger was deleted, or its bookies came back)."""
        with contextlib.suppress(NoNodeError):
            await self.store.delete(f"{LOST_PATH}/{ledger_id}")

    # ------------------------------------------------------------ locks

    async def claim(self, ledger_id: int, owner: str) -> str | None:
        """Take the lock of ``ledger_id`` (an ephemeral node of this store's session);
        a token for :meth:`release`, or None if another worker holds it."""
        token = uuid.uuid4().hex
        data = json.dumps({"owner": owner, "token": token}).encode()
        path = _lock_path(ledger_id)
        try:
            await self.store.create(path, data, ephemeral=True)
        except NodeExistsError:
            return None
        except MetadataError:
            # R13: the create may have happened. Only our token proves it did.
            try:
                node = await self.store.get(path)
            except NoNodeError:
                return None
            return token if node.data == data else None
        return token

    async def lock_owner(self, ledger_id: int) -> str | None:
        try:
            node = await self.store.get(_lock_path(ledger_id))
        except NoNodeError:
            return None
        try:
            return str(json.loads(node.data)["owner"])
        except (ValueError, KeyError, TypeError):
            return "?"

    async def release(self, ledger_id: int, token: str) -> None:
        """Delete our lock of ``ledger_id`` (nothing if it is gone or another's)."""
        path = _lock_path(ledger_id)
        try:
            node = await self.store.get(path)
            if json.loads(node.data).get("token") != token:
                return
            await self.store.delete(path, node.version)
        except (NoNodeError, MetadataVersionError):
            return

    # ------------------------------------------------------------ switches

    async def is_enabled(self) -> bool:
        try:
            node = await self.store.get(ENABLED_PATH)
        except NoNodeError:
            return True
        return node.data.strip().lower() != b"false"

    async def set_enabled(self, enabled: bool) -> None:
        await self._put(ENABLED_PATH, b"true" if enabled else b"false")

    async def lost_bookie_recovery_delay_s(self) -> int:
        try:
            node = await self.store.get(DELAY_PATH)
        except NoNodeError:
            return LOST_BOOKIE_RECOVERY_DELAY_DEFAULT_S
        try:
            return max(0, int(node.data))
        except ValueError:
            raise MetadataError(f"{DELAY_PATH}: not a number of seconds: {node.data!r}") from None

    async def set_lost_bookie_recovery_delay_s(self, seconds: int) -> None:
        if seconds < 0:
            raise InvalidArgumentError(f"lost bookie recovery delay must be >= 0, got {seconds}")
        await self._put(DELAY_PATH, str(int(seconds)).encode())

    async def auditor(self) -> str | None:
        """The identifier the auditor published, None if there is none."""
        try:
            return (await self.store.get(AUDITOR_PATH)).data.decode()
        except NoNodeError:
            return None

    async def request_audit(self) -> None:
        await self._put(AUDIT_REQUEST_PATH, str(int(self.clock() * 1000)).encode())

    async def last_audit(self) -> dict[str, object] | None:
        try:
            return dict(json.loads((await self.store.get(LAST_AUDIT_PATH)).data))
        except NoNodeError:
            return None
        except (ValueError, TypeError):
            return None

    async def put_last_audit(self, summary: dict[str, object]) -> None:
        await self._put(LAST_AUDIT_PATH, json.dumps(summary, sort_keys=True).encode())

    async def _put(self, path: str, data: bytes) -> None:
        """Create or overwrite a persistent switch node."""
        for _ in range(_CAS_ATTEMPTS):
            try:
                await self.store.set(path, data)
                return
            except NoNodeError:
                try:
                    await self.store.create(path, data)
                    return
                except NodeExistsError:
                    continue
        raise MetadataError(f"{path}: could not write it; try again")
