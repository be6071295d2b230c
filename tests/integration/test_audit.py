"""Ledger audits (quorumlog.replication) against real bookie processes, on both metadata drivers.

The ledgers here use ack quorum = write quorum so that every confirmed entry is on
its whole write set when the audit runs: with Qa < Qw the last copies may still be
on their way, and "healthy" would be a race.
"""

from __future__ import annotations

import asyncio
import json
import struct
import time
from pathlib import Path

import pytest
from support import holders, plant_forged_entry, poll_until, shell

from quorumlog import BookKeeper, ClientConfig, UnauthorizedError
from quorumlog.bookie.entry_log import LOG_HEADER_SIZE, RECORD_HEADER, list_log_ids
from quorumlog.errors import Status
from quorumlog.proto.entry import ENTRY_HEADER
from quorumlog.replication import LedgerAudit, audit_ledger

IO_ERROR_REASON = "bookie could not read it (I/O error)"


def payload(i: int) -> bytes:
    return b"audit-%06d-" % i + bytes([i % 251]) * 30


def audit(bk: BookKeeper, ledger_id: int, **options: object) -> LedgerAudit:
    return bk.run(audit_ledger(bk.aio, ledger_id, **options))  # type: ignore[arg-type]


def assert_healthy(result: LedgerAudit, entries: int, write_quorum: int) -> None:
    assert result.healthy, result.summary()
    assert (result.entries_checked, result.replicas_checked) == (entries, entries * write_quorum)
    assert result.good_replicas == entries * write_quorum
    assert (result.missing, result.damaged, result.unreachable_bookies) == ([], [], [])
    assert not result.under_replicated and result.unreadable_entries == []


def test_r5_healthy_ledger_after_an_ensemble_change_audits_every_fragment(cluster4):
    with BookKeeper(cluster4.metadata_uri) as bk:
        lh = bk.create_ledger(3, 3, 3)
        for i in range(50):
            lh.add_entry(payload(i))
        replaced = next(b for b in cluster4.bookies if b.address == lh.ensemble[1])
        cluster4.stop(replaced.index)  # the next add fails on it: the writer replaces it (R5)
        for i in range(50, 120):
            lh.add_entry(payload(i))
        lh.close()
        cluster4.restart(replaced.index)  # back, with its copies of the first fragment
        md = bk.ledger_metadata(lh.ledger_id)
        assert [first for first, _ in md.ensembles] == [0, 50]
        assert replaced.address in md.ensembles[0][1]
        assert replaced.address not in md.ensembles[1][1]

        result = audit(bk, lh.ledger_id)
        assert_healthy(result, 120, 3)
        assert (result.closed, result.state, result.last_entry_id) == (True, "CLOSED", 119)
        assert (result.fragments, result.ensemble_size, result.write_quorum) == (2, 3, 3)
        row = result.to_dict()
        assert json.loads(json.dumps(row)) == row
        assert row["healthy"] and row["replicas_checked"] == 360 and row["missing_count"] == 0


def test_r1_killed_bookie_is_unreachable_and_exactly_its_write_sets_are_missing(cluster4):
    with BookKeeper(cluster4.metadata_uri) as bk:
        lh = bk.create_ledger(4, 3, 3)  # striping: each bookie holds 3 entries of 4
        for i in range(401):
            lh.add_entry_async(payload(i))
        lh.close()
        assert_healthy(audit(bk, lh.ledger_id, entries_per_read=2), 401, 3)

        md = bk.ledger_metadata(lh.ledger_id)
        victim = lh.ensemble[2]
        cluster4.kill(next(b.index for b in cluster4.bookies if b.address == victim))
        result = audit(bk, lh.ledger_id)
        expected = [(e, victim) for e in range(401) if victim in holders(md, e)]
        assert len(expected) == 301
        assert result.unreachable_bookies == [victim]
        assert result.missing == expected
        assert result.damaged == []
        assert result.under_replicated and not result.healthy
        assert result.unreadable_entries == []  # two good copies of each are left
        assert result.under_replicated_entries == [e for e, _ in expected]
        assert result.good_replicas == 401 * 3 - 301

        row = result.to_dict()
        assert row["missing_count"] == 301 and len(row["missing"]) == 100  # bounded
        assert row["missing"][0] == {"entry_id": expected[0][0], "bookie": victim}
        assert row["unreachable_bookies"] == [victim] and not row["healthy"]
        assert row["under_replicated_entry_count"] == 301
        json.dumps(row)
        assert f"unreachable bookie {victim}" in result.summary()


def test_hung_bookie_counts_as_unreachable_within_the_request_timeout(cluster3):
    # The client's own read timeout is long, so that the audit's 500 ms is told apart
    # from it by a bound generous enough for a shared machine.
    config = ClientConfig(read_timeout_ms=120_000)
    with BookKeeper(cluster3.metadata_uri, config=config) as bk:
        lh = bk.create_ledger(3, 3, 3)
        for i in range(30):
            lh.add_entry_async(payload(i))
        lh.close()
        hung = next(b for b in cluster3.bookies if b.address == lh.ensemble[0])
        cluster3.pause(hung.index)  # keeps its socket, answers nothing
        try:
            started = time.monotonic()
            result = audit(bk, lh.ledger_id, request_timeout_ms=500)
            assert time.monotonic() - started < 60, "the audit waited for the client's timeout"
        finally:
            cluster3.resume(hung.index)
        assert result.unreachable_bookies == [hung.address]
        assert "timed out" in result.unreachable_reasons[hung.address]
        assert result.missing == [(e, hung.address) for e in range(30)]
        assert result.damaged == [] and result.unreadable_entries == []


def _flip_entry_payloads(data_dir: Path, ledger_id: int, entry_ids: set[int]) -> int:
    """Flip the last payload byte of the given entries in a stopped bookie's entry logs
    (layout in quorumlog/bookie/entry_log.py); returns how many records were changed."""
    logs_dir = data_dir / "entrylogs"
    flipped = 0
    for log_id in list_log_ids(logs_dir):
        path = logs_dir / f"{log_id:08x}.log"
        data = bytearray(path.read_bytes())
        pos = LOG_HEADER_SIZE
        for _ in range(len(data)):  # at most one record per byte
            if pos + RECORD_HEADER.size > len(data):
                break
            size, _crc = RECORD_HEADER.unpack_from(data, pos)
            blob_at = pos + RECORD_HEADER.size
            if size < ENTRY_HEADER.size or blob_at + size > len(data):
                break
            got_ledger, got_entry = struct.unpack_from(">qq", data, blob_at)
            if got_ledger == ledger_id and got_entry in entry_ids:
                data[blob_at + size - 1] ^= 0x5A
                flipped += 1
            pos = blob_at + size
        path.write_bytes(bytes(data))
    return flipped


def test_r9_damaged_copies_are_reported_on_their_bookie_and_read_from_others(cluster3):
    with BookKeeper(cluster3.metadata_uri) as bk:
        lh = bk.create_ledger(3, 3, 3, password=b"pw")
        for i in range(60):
            lh.add_entry_async(payload(i))
        lh.close()
        rotten, liar = lh.ensemble[0], lh.ensemble[1]
        rotten_bookie = next(b for b in cluster3.bookies if b.address == rotten)
        cluster3.stop(rotten_bookie.index)  # a clean stop checkpoints into the entry logs
        assert _flip_entry_payloads(rotten_bookie.data_dir, lh.ledger_id, {7, 31}) >= 2
        cluster3.restart(rotten_bookie.index)
        assert asyncio.run(plant_forged_entry(liar, lh.ledger_id, 12, b"pw")) == Status.OK

        result = audit(bk, lh.ledger_id, password=b"pw")
        assert result.damaged == [
            (7, rotten, IO_ERROR_REASON),
            (12, liar, "digest mismatch (CRC32C)"),
            (31, rotten, IO_ERROR_REASON),
        ]
        assert result.missing == [] and result.unreachable_bookies == []
        assert result.under_replicated and not result.healthy
        assert result.under_replicated_entries == [7, 12, 31]
        assert result.unreadable_entries == []
        assert result.good_replicas == 60 * 3 - 3
        assert result.to_dict()["damaged"][1] == {
            "entry_id": 12,
            "bookie": liar,
            "reason": "digest mismatch (CRC32C)",
        }
        with pytest.raises(UnauthorizedError, match=f"ledger {lh.ledger_id}"):
            audit(bk, lh.ledger_id, password=b"wrong")
        with pytest.raises(UnauthorizedError, match="none was given; the ledger has one"):
            audit(bk, lh.ledger_id)
        # The other replicas still serve every entry (R9).
        rh = bk.open_ledger(lh.ledger_id, b"pw")
        for _ in range(3):  # reads rotate over the replicas
            assert [e.data for e in rh.read_entries(0, 59)] == [payload(i) for i in range(60)]


def test_r7_open_ledger_is_audited_up_to_the_lac_without_fencing(cluster3):
    with BookKeeper(cluster3.metadata_uri) as bk:
        lh = bk.create_ledger(3, 3, 3)
        empty = audit(bk, lh.ledger_id)
        assert (empty.closed, empty.state, empty.last_entry_id) == (False, "OPEN", -1)
        assert_healthy(empty, 0, 3)

        for i in range(40):
            lh.add_entry(payload(i))
        # The bookies learn LAC 39 from the writer's explicit LAC, a moment after the add.
        reader = bk.open_ledger_no_recovery(lh.ledger_id)
        poll_until(
            lambda: reader.read_last_add_confirmed() >= 39,
            timeout_s=30,
            what="the bookies learn LAC 39 from the writer's explicit LAC",
        )
        result = audit(bk, lh.ledger_id)
        assert (result.closed, result.state, result.last_entry_id) == (False, "OPEN", 39)
        assert_healthy(result, 40, 3)
        assert "the ledger is open" in result.summary()

        # Nothing was fenced: the writer carries on and closes normally.
        assert lh.add_entry(b"after the audit") == 40
        assert not bk.is_closed(lh.ledger_id)
        lh.close()
        closed = audit(bk, lh.ledger_id)
        assert (closed.closed, closed.last_entry_id) == (True, 40)
        assert_healthy(closed, 41, 3)


@pytest.mark.parametrize("metadata_uri", ["sqlite"], indirect=True)
def test_shell_auditledger_exit_status_is_0_when_healthy_and_1_when_not(cluster3):
    uri = cluster3.metadata_uri
    with BookKeeper(uri) as bk:
        lh = bk.create_ledger(3, 3, 3)
        for i in range(20):
            lh.add_entry_async(payload(i))
        lh.close()
    ledger = str(lh.ledger_id)

    healthy = shell(uri, "auditledger", ledger)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "checked 20 entries, 60 replicas (60 good)" in healthy.stdout
    assert "HEALTHY" in healthy.stdout
    row = json.loads(shell(uri, "auditledger", ledger, "--json").stdout)
    assert row["healthy"] and row["entries_checked"] == 20 and row["closed"]

    victim = lh.ensemble[1]
    cluster3.kill(next(b.index for b in cluster3.bookies if b.address == victim))
    broken = shell(uri, "auditledger", ledger)
    assert broken.returncode == 1
    assert "UNDER-REPLICATED" in broken.stdout and f"unreachable bookie {victim}" in broken.stdout
    as_json = shell(uri, "auditledger", ledger, "--json")
    assert as_json.returncode == 1
    row = json.loads(as_json.stdout)
    assert row["missing_count"] == 20 and row["unreachable_bookies"] == [victim]

    unknown = shell(uri, "auditledger", "424242")
    assert unknown.returncode == 1 and "Traceback" not in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1 and "424242" in unknown.stderr
