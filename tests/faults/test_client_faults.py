"""Fault scenarios with real processes: crashed writers, zombies, dead and hung bookies,
damaged replicas, concurrent recoveries. Each runs on both metadata drivers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support import plant_forged_entry
from writer_process import payload  # what the killed writer writes, used here too

from quorumlog import BookKeeper, ClientConfig, LedgerFencedError
from quorumlog.aio import BookKeeper as AsyncBookKeeper
from quorumlog.errors import Status
from quorumlog.replication import audit_ledger
from quorumlog.testing.raw_client import RawClient

WRITER_SCRIPT = Path(__file__).with_name("writer_process.py")


def test_r8_writer_killed_mid_stream_recovery_keeps_every_confirmed_entry(cluster3):
    proc = subprocess.Popen(
        [sys.executable, str(WRITER_SCRIPT), cluster3.metadata_uri],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    confirmed: list[int] = []
    ledger_id = None
    try:
        deadline = time.monotonic() + 60
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            kind, value = line.split()
            if kind == "ledger":
                ledger_id = int(value)
            elif kind == "confirmed":
                confirmed.append(int(value))
                if len(confirmed) >= 3000:
                    break
    finally:
        proc.kill()  # kill -9 while adds are in flight
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    assert ledger_id is not None and len(confirmed) >= 3000
    assert confirmed == list(range(len(confirmed)))  # R3 as seen by the writer
    with BookKeeper(cluster3.metadata_uri) as bk:
        assert not bk.is_closed(ledger_id)
        rh = bk.open_ledger(ledger_id)
        last = rh.metadata.last_entry_id
        assert last >= confirmed[-1]
        entries = rh.read_entries(0, last)
        assert [e.data for e in entries] == [payload(i) for i in range(last + 1)]


def test_r5_bookie_killed_under_load_ensemble_changes_and_nothing_is_lost(cluster4):
    with BookKeeper(cluster4.metadata_uri) as bk:
        lh = bk.create_ledger(3, 3, 2)
        ensemble = lh.ensemble
        victim = next(b for b in cluster4.bookies if b.address == ensemble[1])
        futures = []
        killed = threading.Event()
        under_load = threading.Event()  # adds are in flight

        def kill_soon():
            under_load.wait(60)
            cluster4.kill(victim.index)
            killed.set()

        killer = threading.Thread(target=kill_soon)
        killer.start()
        count = 0
        deadline = time.monotonic() + 60
        while (not killed.is_set() or count < 20_000) and time.monotonic() < deadline:
            futures.append(lh.add_entry_async(payload(count)))
            count += 1
            if count == 1_000:
                under_load.set()
            if count % 500 == 0:
                futures[-1].result(timeout=30)
        killer.join()
        assert [f.result(timeout=60) for f in futures] == list(range(count))
        lh.close()
        md = bk.ledger_metadata(lh.ledger_id)
        assert len(md.ensembles) == 2, md.ensembles
        assert victim.address not in md.ensembles[1][1]
        assert md.last_entry_id == count - 1
        rh = bk.open_ledger(lh.ledger_id)
        entries = rh.read_entries(0, count - 1)
        assert [e.entry_id for e in entries] == list(range(count))
        assert all(e.data == payload(e.entry_id) for e in entries)
        # Every entry of the new fragment is on all three of its bookies, including
        # the entries an ack quorum held while the ensemble was being changed; only
        # the dead bookie's copies in the first fragment are missing.
        audit = bk.run(audit_ledger(bk.aio, lh.ledger_id, request_timeout_ms=2_000))
        new_fragment_first = md.ensembles[1][0]
        assert audit.damaged == []
        assert {bookie for _, bookie in audit.missing} <= {victim.address}
        assert all(entry_id < new_fragment_first for entry_id, _ in audit.missing)


def test_r7_bookie_restarted_keeps_confirmed_data_and_fence_state(cluster3):
    with BookKeeper(cluster3.metadata_uri) as bk:
        lh = bk.create_ledger(3, 3, 3, password=b"pw")
        for i in range(200):
            lh.add_entry(payload(i))
        with BookKeeper(cluster3.metadata_uri) as other:
            other.open_ledger(lh.ledger_id, b"pw")  # fences all three bookies
        cluster3.kill(0)
        address = cluster3.restart(0)
        # Only the restarted bookie serves: every entry must come from it.
        cluster3.stop(1)
        cluster3.stop(2)
        rh = bk.open_ledger(lh.ledger_id, b"pw")
        assert [e.data for e in rh.read_entries(0, 199)] == [payload(i) for i in range(200)]
        answer = asyncio.run(_raw_add(address, lh.ledger_id, b"pw"))
        assert answer == Status.FENCED


async def _raw_add(address: str, ledger_id: int, password: bytes) -> int:
    from quorumlog.proto.entry import DigestType, EntryCodec, master_key

    raw = await RawClient.connect(address)
    try:
        blob = EntryCodec(DigestType.CRC32C, password).encode(ledger_id, 200, 199, 0, b"late")
        return (await raw.add(ledger_id, master_key(password), [blob])).status
    finally:
        await raw.close()


async def _raw_read_status(address: str, ledger_id: int, entry_id: int) -> int:
    raw = await RawClient.connect(address)
    try:
        return (await raw.read(ledger_id, entry_id)).status
    finally:
        await raw.close()


def _flip_payload_byte(root: Path, needle: bytes, skip: Path) -> int:
    """Flip one byte of ``needle`` wherever it is stored under ``root`` (but not in ``skip``)."""
    flipped = 0
    for path in root.rglob("*"):
        if not path.is_file() or skip in path.parents:
            continue
        data = bytearray(path.read_bytes())
        at = data.find(needle)
        while at != -1:
            data[at + len(needle) // 2] ^= 0x20
            flipped += 1
            at = data.find(needle, at + 1)
        if flipped:
            path.write_bytes(bytes(data))
    return flipped


def test_r9_flipped_bytes_in_one_replica_are_served_from_another(cluster3):
    marker = b"precious-entry-payload-0123456789"
    with BookKeeper(cluster3.metadata_uri) as bk:
        lh = bk.create_ledger(3, 3, 3)
        lh.add_entry(b"first")
        lh.add_entry(marker)
        lh.add_entry(b"third")
        lh.close()
        damaged = cluster3.bookies[0]
        cluster3.stop(0)  # a clean stop checkpoints: the entry is in the entry log
        assert _flip_payload_byte(damaged.data_dir, marker, damaged.journal_dir) >= 1
        address = cluster3.restart(0)
        # R9: the damaged bookie reports an I/O error, never "no such entry".
        assert asyncio.run(_raw_read_status(address, lh.ledger_id, 1)) == Status.IO_ERROR
        rh = bk.open_ledger(lh.ledger_id)
        for _ in range(6):  # reads rotate over the replicas, so the damaged one is tried
            assert [e.data for e in rh.read_entries(0, 2)] == [b"first", marker, b"third"]


def test_r8_five_concurrent_recoveries_agree_on_the_last_entry(cluster3):
    with BookKeeper(cluster3.metadata_uri) as bk:
        lh = bk.create_ledger(3, 3, 2, password=b"pw")
        futures = [lh.add_entry_async(payload(i)) for i in range(500)]
        confirmed = [f.result(timeout=30) for f in futures]
        ledger_id = lh.ledger_id

    async def recover_all() -> list[int]:
        clients = [await AsyncBookKeeper.connect(cluster3.metadata_uri) for _ in range(5)]
        try:
            handles = await asyncio.gather(*(c.open_ledger(ledger_id, b"pw") for c in clients))
            return [h.metadata.last_entry_id for h in handles]
        finally:
            for c in clients:
                await c.close()

    lasts = asyncio.run(recover_all())
    assert len(set(lasts)) == 1, lasts
    assert lasts[0] >= confirmed[-1]


def test_r7_a_hung_bookie_does_not_stall_fencing(cluster3):
    with BookKeeper(cluster3.metadata_uri) as bk:
        lh = bk.create_ledger(3, 3, 2)
        for i in range(20):
            lh.add_entry(payload(i))
        hung = next(b for b in cluster3.bookies if b.address == lh.ensemble[2])
        cluster3.pause(hung.index)
        try:
            # Requests to the hung bookie would time out only after 120 s: recovery that
            # waited for it is told from one that did not with a bound generous for a
            # shared machine.
            patient = ClientConfig(fence_timeout_ms=120_000, read_timeout_ms=120_000)
            with BookKeeper(cluster3.metadata_uri, config=patient) as other:
                started = time.monotonic()
                rh = other.open_ledger(lh.ledger_id)
                assert rh.metadata.last_entry_id == 19
                assert time.monotonic() - started < 60, "recovery waited for the hung bookie"
            with pytest.raises(LedgerFencedError):
                lh.add_entry(b"zombie")
        finally:
            cluster3.resume(hung.index)


def test_speculative_read_goes_around_a_hung_replica(cluster3):
    # The read timeout (120 s) is far from the bound below: a read that went around the
    # hung replica is told from one that waited for it, on a shared machine too.
    config = ClientConfig(speculative_read_timeout_ms=100, read_timeout_ms=120_000)
    with BookKeeper(cluster3.metadata_uri, config=config) as bk:
        lh = bk.create_ledger(3, 3, 3)
        for i in range(30):
            lh.add_entry(payload(i))
        lh.close()
        cluster3.pause(0)  # answers nothing, keeps its sockets: only speculation helps
        try:
            rh = bk.open_ledger(lh.ledger_id)
            for first in range(0, 30, 3):  # reads rotate, so some start at the hung bookie
                started = time.monotonic()
                entries = rh.read_entries(first, first + 2)
                assert [e.data for e in entries] == [payload(i) for i in range(first, first + 3)]
                assert time.monotonic() - started < 30, "waited for the hung replica"
        finally:
            cluster3.resume(0)


def test_r9_digest_mismatch_on_one_replica_is_read_from_another(cluster3):
    with BookKeeper(cluster3.metadata_uri) as bk:
        lh = bk.create_ledger(3, 3, 3, password=b"pw")
        for data in (b"zeroth", b"original", b"second"):
            lh.add_entry(data)
        lh.close()
        liar = lh.ensemble[0]
        assert asyncio.run(plant_forged_entry(liar, lh.ledger_id, 1, b"pw")) == Status.OK
        rh = bk.open_ledger(lh.ledger_id, b"pw")
        for _ in range(6):  # every replica gets to be first
            assert [e.data for e in rh.read_entries(0, 2)] == [b"zeroth", b"original", b"second"]
