"""Ledger metadata for replication: bounded reads, the password check, and the
compare-and-set that puts a replacement bookie into a fragment's ensemble.

The swap runs only once the replacement holds every entry of the fragment, and on
the metadata as re-read: a concurrent close, ensemble change or other recovery is
kept, and a version conflict is retried from a fresh read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from quorumlog.errors import MetadataError, UnauthorizedError
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.meta.ledgers import Done, MetadataConflictsError
from quorumlog.proto.entry import master_key
from quorumlog.replication.plan import Fragment
from quorumlog.replication.report import FragmentStatus

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


def check_password(md: LedgerMetadata, password: bytes) -> None:
    """UnauthorizedError unless ``password`` is the ledger's (R10); the metadata keeps
    a hash of the master key, not the password."""
    expected = hashlib.sha256(master_key(password)).hexdigest()
    if md.password_digest and md.password_digest != expected:
        raise UnauthorizedError(f"ledger {md.ledger_id}: wrong password")


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
