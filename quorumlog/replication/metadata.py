"""Ledger metadata for replication: bounded reads, the password check (or the master
key from the bookies when the password is not known), and the compare-and-set that puts
a replacement bookie into a fragment's ensemble.

The swap runs only once the replacement holds every entry of the fragment, and on
the metadata as re-read: a concurrent close, ensemble change or other recovery is
kept, and a version conflict is retried from a fresh read.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from quorumlog.client.bookkeeper import key_digest, password_fits
from quorumlog.errors import BKError, MetadataError, Status, UnauthorizedError
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.meta.ledgers import Done, MetadataConflictsError
from quorumlog.proto.codec import LedgerKeyRequest, LedgerKeyResponse
from quorumlog.proto.entry import EntryCodec, master_key
from quorumlog.replication.plan import Fragment
from quorumlog.replication.report import FragmentStatus, status_name

if TYPE_CHECKING:
    from quorumlog.client.bookkeeper import BookKeeper


T = TypeVar("T")


async def metadata_call(bk: BookKeeper, operation: Awaitable[T], what: str) -> T:
    """A metadata call with the client's metadata timeout (MetadataError past it)."""
    timeout_s = bk.config.metadata_session_timeout_ms / 1000
    try:
        return await asyncio.wait_for(operation, timeout_s)
    except TimeoutError:
        raise MetadataError(
            f"{what}: no answer from the metadata store within {timeout_s:.1f} s"
        ) from None


async def read_ledger_metadata(bk: BookKeeper, ledger_id: int) -> tuple[LedgerMetadata, int]:
    """The ledger's metadata and its version (NoSuchLedgerError if it is gone)."""
    return await metadata_call(bk, bk.ledgers.read(ledger_id), f"ledger {ledger_id}")


@dataclasses.dataclass(frozen=True)
class LedgerAccess:
    """What a repair needs to write a ledger's copies: its master key (R10) and a codec
    to check what it reads. ``password`` is None when the key came from a bookie: then
    a MAC digest cannot be checked (only each blob's header and size), and the blobs
    go on byte for byte, their digests intact for every reader that has the password."""

    key: bytes
    codec: EntryCodec
    password: bytes | None


class LedgerKeyUnavailableError(UnauthorizedError):
    """No bookie gave a ledger's master key. ``absent``: the bookies that answered they
    hold no such ledger (R17: never one they acknowledged an entry of); the others
    asked failed to answer or refused."""

    def __init__(self, message: str, absent: frozenset[str]) -> None:
        super().__init__(message)
        self.absent = absent


async def ledger_access(
    bk: BookKeeper, md: LedgerMetadata, password: bytes, skip: frozenset[str] = frozenset()
) -> LedgerAccess:
    """How to write ``md``'s ledger: with ``password`` when it is the ledger's, else with
    the master key a bookie of its ensembles holds (LEDGER_KEY; docs/SECURITY.md), asked
    of each bookie in turn but those in ``skip`` (lost ones), and believed only when it
    hashes to the digest the metadata keeps: a bookie cannot hand out a wrong key.
    UnauthorizedError when no bookie gives it (none holds the ledger, or its token does
    not allow the request: a ``bookie`` or ``admin`` role is needed)."""
    if password_fits(md, password):
        return LedgerAccess(master_key(password), EntryCodec(md.digest_type, password), password)
    asked: list[str] = []
    reasons: list[str] = []
    absent: set[str] = set()
    for _, ensemble in md.ensembles:
        for address in ensemble:
            if address in skip or address in asked:
                continue
            asked.append(address)
            try:
                answer = await bk.pool.request(
                    address, LedgerKeyRequest(0, md.ledger_id), bk.config.read_timeout_ms
                )
            except BKError as exc:
                reasons.append(f"{address}: {exc.message}")
                continue
            if not isinstance(answer, LedgerKeyResponse) or answer.status != Status.OK:
                status = getattr(answer, "status", None)
                what = status_name(status) if isinstance(status, int) else type(answer).__name__
                reasons.append(f"{address}: {what}")
                if status == Status.NO_SUCH_LEDGER:
                    absent.add(address)
                continue
            if key_digest(answer.master_key) != md.password_digest:
                reasons.append(f"{address}: a key that is not the ledger's")
                continue
            codec = EntryCodec(md.digest_type, mac_unchecked=True)
            return LedgerAccess(answer.master_key, codec, None)
    given = "the password given is not the ledger's" if password else "no password was given"
    raise LedgerKeyUnavailableError(
        f"ledger {md.ledger_id}: {given}, and no bookie gave its master key "
        f"({'; '.join(reasons) or 'no bookie of its ensembles left to ask'})",
        frozenset(absent),
    )


async def swap_replacement(
    bk: BookKeeper, ledger_id: int, fragment: Fragment, lost: str, target: str
) -> tuple[FragmentStatus, str]:
    """Compare-and-set: ``target`` instead of ``lost`` in ``fragment``, on the
    metadata as it is now. Returns the status and an error (empty if none), or for
    REPLACED_CONCURRENTLY the bookie that holds the index now."""

    def decide(md: LedgerMetadata) -> LedgerMetadata | Done[tuple[FragmentStatus, str]]:
        bounds = {first: (last, ens) for first, last, ens in md.fragment_bounds()}
        if fragment.first not in bounds:
            return Done(
                (
                    FragmentStatus.FAILED,
                    f"ledger {ledger_id}: the fragment from entry {fragment.first} changed "
                    "concurrently; run again",
                )
            )
        last, ensemble = bounds[fragment.first]
        if ensemble[fragment.index] != lost:
            return Done((FragmentStatus.REPLACED_CONCURRENTLY, ensemble[fragment.index]))
        if last != fragment.last or target in ensemble:
            return Done(
                (
                    FragmentStatus.FAILED,
                    f"ledger {ledger_id}: the fragment from entry {fragment.first} changed "
                    f"concurrently (now {ensemble}, last entry {last}); run again",
                )
            )
        replaced = tuple(target if i == fragment.index else b for i, b in enumerate(ensemble))
        return dataclasses.replace(
            md,
            ensembles=tuple(
                (first, replaced if first == fragment.first else bookies)
                for first, bookies in md.ensembles
            ),
        )

    async def guard(operation: Awaitable[Any], what: str) -> Any:
        return await metadata_call(bk, operation, what)

    try:
        result = await bk.ledgers.update(
            ledger_id, decide, attempts=bk.config.metadata_cas_retries, guard=guard
        )
    except MetadataConflictsError as exc:
        return FragmentStatus.FAILED, f"{exc.message}; run again"
    if result.written:
        return FragmentStatus.COPIED, ""
    assert result.value is not None
    return result.value
