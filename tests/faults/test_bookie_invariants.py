"""A broken invariant inside a real bookie process stops that process at once, with a clear
message on stderr and a non-zero exit status, instead of becoming an IO_ERROR answer while
it serves on; what it acknowledged before is there after a restart (the journal).

The broken invariant is planted: a ``sitecustomize`` module on the bookie's PYTHONPATH makes
the bookie's read-LAC handler fail an assertion for one ledger id."""

from __future__ import annotations

from pathlib import Path

from support import run

from quorumlog.errors import Status
from quorumlog.proto.codec import ReadLacRequest
from quorumlog.server.local_cluster import LocalCluster
from quorumlog.testing.raw_client import RawClient, make_entry, master_key

KEY = master_key(b"invariants-test")
PLANTED_LEDGER = 4242
EXIT_BROKEN_INVARIANT = 70  # EX_SOFTWARE

_PLANT = f"""
import os

if os.environ.get("PLANT_BROKEN_INVARIANT"):
    from quorumlog.bookie import reads

    _read_lac = reads.Reads.read_lac

    def read_lac(self, request, respond):
        assert request.ledger_id != {PLANTED_LEDGER}, "planted: a state that cannot be"
        _read_lac(self, request, respond)

    reads.Reads.read_lac = read_lac
"""


def test_broken_invariant_stops_the_bookie_process_with_a_clear_message(tmp_path: Path) -> None:
    plant_dir = tmp_path / "plant"
    plant_dir.mkdir()
    (plant_dir / "sitecustomize.py").write_text(_PLANT)
    cluster = LocalCluster(f"sqlite://{tmp_path / 'metadata.db'}", tmp_path / "cluster", 1)
    cluster.env["PYTHONPATH"] += f":{plant_dir}"
    cluster.env["PLANT_BROKEN_INVARIANT"] = "1"
    blobs = [make_entry(1, i, b"acknowledged %d" % i) for i in range(10)]
    with cluster:
        address = cluster.addresses[0]

        async def trip() -> None:
            client = await RawClient.connect(address)
            try:
                assert (await client.add(1, KEY, blobs)).status == Status.OK
                other = await client.request(ReadLacRequest(0, 1))
                assert other.status == Status.OK  # the plant touches one ledger only
                answer = client.send(ReadLacRequest(0, PLANTED_LEDGER))
                assert await client.wait_closed(10), "the bookie serves on"
                assert answer.done() and answer.exception() is not None, answer
            finally:
                await client.close()

        run(trip())
        assert cluster.wait_exit(0, timeout_s=10) == EXIT_BROKEN_INVARIANT
        stderr = cluster.bookies[0].stderr_text()
        assert "broken invariant" in stderr and "planted: a state that cannot be" in stderr
        assert "ReadLacRequest" in stderr, stderr

        del cluster.env["PLANT_BROKEN_INVARIANT"]
        address = cluster.restart(0)

        async def read_back() -> None:
            client = await RawClient.connect(address)
            try:
                read = await client.read(1, 0, count=len(blobs))
                assert (read.status, read.entries) == (Status.OK, blobs)
                lac = await client.request(ReadLacRequest(0, PLANTED_LEDGER))
                assert lac.status == Status.NO_SUCH_LEDGER
            finally:
                await client.close()

        run(read_back())
