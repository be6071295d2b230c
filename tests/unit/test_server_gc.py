"""Garbage collection's decisions (``quorumlog.server.gc``) on a stand-in bookie and a
stand-in metadata store: R15, absence is not permission; R13, unknown is not absent."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from support import run

from quorumlog.errors import BKError
from quorumlog.server.gc import GcSkipped, collect_once


class Bookie:
    def __init__(self, ledger_ids: set[int]) -> None:
        self.held = set(ledger_ids)
        self.dropped: set[int] = set()
        self.broken: list[str] = []

    def ledger_ids(self) -> set[int]:
        return set(self.held)

    def garbage_collect(self, live_ledger_ids: Iterable[int], snapshot: set[int]) -> int:
        gone = snapshot - set(live_ledger_ids)
        self.held -= gone
        self.dropped |= gone
        return len(gone)

    def halt(self, where: str, exc: BaseException) -> None:
        self.broken.append(f"{where}: {exc}")


class Metadata:
    """A listing, the ledgers that exist when read one by one, and the cookie."""

    def __init__(
        self, listed: set[int], existing: set[int], unknown: frozenset[int] = frozenset()
    ) -> None:
        self.listed = listed
        self.existing = existing
        self.unknown = unknown
        self.cookie_reads: list[bool] = []
        self.cookie = [True, True]  # what the first and the second cookie read find

    async def cookie_exists(self) -> bool:
        found = self.cookie[min(len(self.cookie_reads), len(self.cookie) - 1)]
        self.cookie_reads.append(found)
        return found

    async def list_ledgers(self) -> set[int]:
        return set(self.listed)

    async def ledger_exists(self, ledger_id: int) -> bool:
        if ledger_id in self.unknown:
            raise BKError(f"ledger {ledger_id}: the read timed out")
        return ledger_id in self.existing


def test_r15_only_ledgers_confirmed_absent_one_by_one_are_dropped():
    # 1 and 2 are listed; 3 is missing from a stale listing but exists; 4 is gone.
    bookie = Bookie({1, 2, 3, 4})
    metadata = Metadata(listed={1, 2}, existing={1, 2, 3})
    assert run(collect_once(bookie, metadata)) == 1
    assert bookie.dropped == {4} and bookie.held == {1, 2, 3}
    assert metadata.cookie_reads == [True, True]  # before the listing and before dropping


def test_r13_r15_a_failed_read_of_one_candidate_drops_nothing():
    bookie = Bookie({1, 4, 5})
    metadata = Metadata(listed={1}, existing={1}, unknown={5})
    with pytest.raises(BKError, match="timed out"):
        run(collect_once(bookie, metadata))
    assert bookie.dropped == set()


def test_r15_no_cookie_for_this_bookie_skips_the_round():
    bookie = Bookie({1, 2})
    metadata = Metadata(listed=set(), existing=set())
    metadata.cookie = [False]
    with pytest.raises(GcSkipped, match="no cookie for this bookie"):
        run(collect_once(bookie, metadata))
    assert bookie.dropped == set()


def test_r15_a_store_wiped_while_candidates_are_read_drops_nothing():
    bookie = Bookie({1, 2})
    metadata = Metadata(listed={1}, existing={1})
    metadata.cookie = [True, False]  # the cookie was there at the start of the round only
    with pytest.raises(GcSkipped):
        run(collect_once(bookie, metadata))
    assert bookie.dropped == set()


def test_a_failure_inside_the_bookies_collection_is_a_broken_invariant():
    bookie = Bookie({1, 2})

    def impossible(live: Iterable[int], snapshot: set[int]) -> int:
        raise KeyError(2)

    bookie.garbage_collect = impossible  # type: ignore[method-assign]
    assert run(collect_once(bookie, Metadata(listed={1}, existing={1}))) == 0
    assert bookie.broken == ["garbage collection: 2"]
