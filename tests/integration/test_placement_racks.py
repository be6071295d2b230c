"""Rack-aware placement with real bookie processes, on both metadata drivers: bookies
record ``--rack`` in their registration, a rack-aware client spreads every write set
over two racks, for new ledgers and for the replacements of an ensemble change."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog import BookKeeper
from quorumlog.core.placement import DEFAULT_LOCATION, PlacementPolicy, violations
from quorumlog.server.local_cluster import LocalCluster, running_cluster

RACKS = {0: "/east/a", 1: "/east/a", 2: "/east/b", 3: "/east/b", 4: "/east/c", 5: "/east/c"}


@pytest.fixture
def racked(metadata_uri: str, tmp_path: Path) -> Iterator[LocalCluster]:
    for cluster in running_cluster(metadata_uri, tmp_path / "cluster", 0):
        for i in range(6):
            cluster.start_new_bookie(["--rack", RACKS[i]])
        yield cluster


def where(bk: BookKeeper) -> dict[str, str]:
    locations = bk.run(bk.aio.registry.writable_locations())
    return {b: w or DEFAULT_LOCATION for b, w in locations.items()}


def test_bookies_record_their_rack_and_rack_aware_ensembles_span_two_racks(
    racked: LocalCluster,
) -> None:
    with BookKeeper(racked.metadata_uri, placement="rack-aware") as bk:
        places = where(bk)
        assert sorted(places.values()) == sorted(RACKS.values())
        policy = PlacementPolicy("rack-aware")
        for shape in ((3, 2, 2), (3, 3, 2), (4, 2, 2), (5, 3, 2)):
            for _ in range(5):
                handle = bk.create_ledger(*shape)
                ensemble = list(bk.ledger_metadata(handle.ledger_id).ensembles[0][1])
                assert violations(policy, ensemble, places, shape[1]) == [], (shape, ensemble)
                handle.close()


def test_a_rack_aware_writer_replaces_a_dead_bookie_within_the_racks_rule(
    racked: LocalCluster,
) -> None:
    with BookKeeper(racked.metadata_uri, placement="rack-aware") as bk:
        places = where(bk)
        handle = bk.create_ledger(3, 2, 2)
        for i in range(20):
            handle.add_entry(b"before %d" % i)
        first = list(bk.ledger_metadata(handle.ledger_id).ensembles[0][1])
        victim = next(b for b in racked.bookies if b.address == first[1])
        racked.kill(victim.index)
        for i in range(20):
            handle.add_entry(b"after %d" % i)
        handle.close()
        ensembles = bk.ledger_metadata(handle.ledger_id).ensembles
        assert len(ensembles) >= 2 and first[1] not in ensembles[-1][1]
        for _, ensemble in ensembles[1:]:
            assert violations(PlacementPolicy("rack-aware"), list(ensemble), places, 2) == []
        reader = bk.open_ledger(handle.ledger_id)
        data = [e.data for e in reader.read_entries(0, 39)]
        assert data == [b"before %d" % i for i in range(20)] + [b"after %d" % i for i in range(20)]


def test_a_bookie_with_a_bad_rack_refuses_to_start_naming_it(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "quorumlog.server", "--data-dir", str(tmp_path), "--rack", "rack1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "--rack" in done.stderr and "/REGION/RACK" in done.stderr, done.stderr
