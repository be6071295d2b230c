"""Who owns a ledger, and when it is an orphan (quorumlog.core.orphans): pure decisions."""

from __future__ import annotations

import pytest

from quorumlog.core.orphans import (
    DB_SNAPSHOT,
    LOG,
    SPARK_SINK,
    Owner,
    OwnerView,
    decide,
    owner_of,
    ownership_tags,
)

HOUR_MS = 3_600_000


def verdict(
    ledger_id: int,
    owner: Owner,
    view: OwnerView,
    age_ms: int = 2 * HOUR_MS,
    *,
    closed: bool = False,
) -> bool:
    return decide(ledger_id, owner, view, closed=closed, age_ms=age_ms, min_age_ms=HOUR_MS).orphan


def test_tags_name_their_owner_and_untagged_ledgers_are_the_users() -> None:
    assert owner_of(ownership_tags(LOG, "db/shop")) == Owner(LOG, "db/shop")
    assert owner_of(ownership_tags(DB_SNAPSHOT, "db/shop")) == Owner(DB_SNAPSHOT, "db/shop")
    sink = {**ownership_tags(SPARK_SINK, "orders"), "spark.write": b"abc"}
    assert owner_of(sink) == Owner(SPARK_SINK, "orders", "abc")
    # A user's ledger, even one tagged like a log's before owners were tagged, is left alone.
    assert owner_of({}) is None
    assert owner_of({"log": b"orders"}) is None
    assert owner_of({"application": b"pulsar", "component": b"log", "log": b"x"}) is None
    assert owner_of({**ownership_tags(SPARK_SINK, "orders")}) is None  # no write: damaged
    assert owner_of({**ownership_tags(SPARK_SINK, "orders"), "spark.write": b"../x"}) is None
    with pytest.raises(ValueError):
        ownership_tags("cache", "x")


def test_a_log_ledger_is_an_orphan_once_its_log_cannot_refer_to_it() -> None:
    owner = Owner(LOG, "orders")
    live = OwnerView(exists=True, listed=frozenset({10, 12}))
    assert not verdict(10, owner, live)
    assert not verdict(12, owner, live, age_ms=10 * HOUR_MS)
    # Truncated (below the newest listed, never appended again): an orphan at any age.
    assert verdict(9, owner, live, age_ms=0)
    assert verdict(11, owner, live, age_ms=0)
    # Above the newest: a writer may be adding it (R11), until it is old.
    assert not verdict(13, owner, live, age_ms=1000)
    assert verdict(13, owner, live)
    # Closed and not listed: a writer appends only the open ledger it just created.
    assert verdict(13, owner, live, age_ms=0, closed=True)
    # The log's node is gone: a deleted log, or one that may be created again soon.
    gone = OwnerView(exists=False)
    assert not verdict(10, owner, gone, age_ms=1000)
    assert verdict(10, owner, gone)
    assert verdict(10, owner, gone, age_ms=0, closed=True)


def test_a_snapshot_ledger_is_an_orphan_once_old_and_not_recorded() -> None:
    owner = Owner(DB_SNAPSHOT, "db/shop")
    recorded = OwnerView(exists=True, listed=frozenset({31}))
    assert not verdict(31, owner, recorded)
    # Being written (closed before it is recorded), or just dropped.
    assert not verdict(30, owner, recorded, age_ms=1000, closed=True)
    assert verdict(30, owner, recorded)
    # Dropped from the list (named as dropped in the same write): at any age.
    dropping = OwnerView(exists=True, listed=frozenset({31}), dropped=frozenset({30}))
    assert verdict(30, owner, dropping, age_ms=0, closed=True)


def test_a_sink_ledger_is_an_orphan_once_its_write_forgot_it() -> None:
    owner = Owner(SPARK_SINK, "orders", "w1")
    assert not verdict(5, owner, OwnerView(exists=True, listed=frozenset({5})), age_ms=0)
    assert not verdict(5, owner, OwnerView(exists=True, registered=True))
    # Registered in a staging silent for as long as the sink's sweep waits: abandoned.
    abandoned = OwnerView(exists=True, registered=True, abandoned=True)
    assert verdict(5, owner, abandoned, age_ms=0)
    # Registration gone and not appended: the write ended without it.
    assert verdict(5, owner, OwnerView(exists=True), age_ms=0)
    assert verdict(5, owner, OwnerView(exists=False), age_ms=0)
