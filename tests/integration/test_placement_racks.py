"""Rack-aware placement with real bookie processes, on both metadata drivers: bookies
record ``--rack`` in their registration, a rack-aware client spreads every write set
over two racks, for new ledgers and for the replacements of an ensemble change, and a
rack-aware autorecovery daemon moves closed ledgers' copies until every write set
spans two racks."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import poll_until
from test_autorecovery import Daemon, assert_fully_replicated, daemon_log, daemons, marks, payload
from test_metrics import scrape

from quorumlog import BookKeeper
from quorumlog.core.placement import DEFAULT_LOCATION, PlacementPolicy, violations
from quorumlog.server.local_cluster import LocalCluster, running_cluster

__all__ = ["daemons"]  # the fixture, shared with test_autorecovery

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


def test_shell_recoverbookie_places_copies_by_the_policy_it_is_given(
    racked: LocalCluster,
) -> None:
    """3/2/2 ledgers over racks a, b, c lose their bookie in rack a: only the other
    bookie of rack a keeps every write set over two racks. The shell chose at random
    (no way to say the policy); with --placement rack-aware every copy lands there."""
    with BookKeeper(racked.metadata_uri, placement="rack-aware") as bk:
        places = where(bk)
        by_rack: dict[str, list[str]] = {}
        for bookie, rack in sorted(places.items()):
            by_rack.setdefault(rack, []).append(bookie)
        lost, kept_in_rack = by_rack["/east/a"]
        ensemble = (lost, by_rack["/east/b"][0], by_rack["/east/c"][0])
        ledgers = []
        for _ in range(6):
            handle = bk.create_ledger(3, 2, 2, ensemble_bookies=ensemble)
            for i in range(10):
                handle.add_entry(payload(handle.ledger_id, i))
            handle.close()
            ledgers.append(handle.ledger_id)
        racked.kill(next(b.index for b in racked.bookies if b.address == lost))
        command = ["shell", "--metadata", racked.metadata_uri, "recoverbookie", lost]
        done = subprocess.run(
            [sys.executable, "-m", "quorumlog", *command, "--placement", "rack-aware"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        for ledger_id in ledgers:
            (_, last), *_ = reversed(bk.ledger_metadata(ledger_id).ensembles)
            assert list(last) == [kept_in_rack, *ensemble[1:]], (ledger_id, last)
            assert_fully_replicated(bk, ledger_id)


def test_a_bookie_with_a_bad_rack_refuses_to_start_naming_it(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "quorumlog.server", "--data-dir", str(tmp_path), "--rack", "rack1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "--rack" in done.stderr and "/REGION/RACK" in done.stderr, done.stderr


def test_a_rack_aware_autorecovery_moves_copies_until_every_write_set_spans_two_racks(
    racked: LocalCluster, daemons: list[Daemon], tmp_path: Path
) -> None:
    uri = racked.metadata_uri
    rack_aware = PlacementPolicy("rack-aware")
    with BookKeeper(uri) as bk:  # the random policy: some write sets in one rack
        places = where(bk)
        by_rack: dict[str, list[str]] = {}
        for bookie, rack in sorted(places.items()):
            by_rack.setdefault(rack, []).append(bookie)
        (a1, a2), (b1, b2), (c1, c2) = (by_rack[r] for r in sorted(by_rack))
        shapes = [
            ((3, 2, 2), (a1, a2, b1)),  # one write set in rack a
            ((4, 2, 2), (a1, a2, b1, b2)),  # one in rack a, one in rack b
            ((2, 2, 2), (c1, c2)),  # every write set in rack c
            ((3, 3, 2), (b1, b2, c1)),  # two racks: meets the policy already
            ((3, 2, 2), (a1, b1, c1)),  # meets it
        ]
        ledgers: list[int] = []
        for (size, quorum, ack), ensemble in shapes:

            async def write(
                size: int = size, quorum: int = quorum, ack: int = ack, on: Any = ensemble
            ) -> int:
                lh = await bk.aio.create_ledger(size, quorum, ack, ensemble_bookies=on)
                for i in range(60):
                    await lh.append(payload(lh.ledger_id, i))
                await lh.close()
                return lh.ledger_id

            ledgers.append(bk.run(write()))
        quorums = {i: bk.ledger_metadata(i).write_quorum for i in ledgers}

        def broken() -> dict[int, list[str]]:
            found = {}
            for i in ledgers:
                md = bk.ledger_metadata(i)
                q = quorums[i]
                bad = [v for _, e in md.ensembles for v in violations(rack_aware, e, places, q)]
                if bad:
                    found[i] = bad
            return found

        misplaced = sorted(broken())
        assert misplaced == ledgers[:3]
        daemon = Daemon(
            uri,
            tmp_path / "ar",
            "--placement",
            "rack-aware",
            "--audit-interval-s",
            "2",
            "--http-port",
            "0",
        )
        daemons.append(daemon)
        poll_until(
            lambda: not broken() and not marks(bk),
            timeout_s=120,
            interval_s=0.5,
            what="every write set across two racks",
        )
        for ledger_id in ledgers:
            assert_fully_replicated(bk, ledger_id)
            data = [e.data for e in bk.open_ledger(ledger_id).read_entries(0, 59)]
            assert data == [payload(ledger_id, i) for i in range(60)]
        _, metrics = scrape(daemon.admin_port)
        assert metrics["quorumlog_autorecovery_placement_violations_total"] >= len(misplaced)
        assert metrics["quorumlog_autorecovery_ledger_repair_failures_total"] == 0
        text = daemon_log(daemon)
        for ledger_id in misplaced:
            assert f"ledger {ledger_id} breaks the rack-aware placement: write set" in text
