"""Autorecovery against bookies that check tokens, on both metadata drivers: the daemon
presents a ``bookie`` token (reads, fences, recovery adds, ledger keys; never a writer's
add) and re-replicates a killed bookie's ledger made with a password it was not given;
the ledger reads back whole with a client token, which may not ask for ledger keys.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from support import poll_until, poll_until_async, run
from tls_certs import HMAC_SECRET, write_hmac_key

from quorumlog.aio import BookKeeper
from quorumlog.client.config import ClientConfig
from quorumlog.errors import Status
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.proto.codec import LedgerKeyRequest, LedgerKeyResponse
from quorumlog.replication.autorecovery import AutoRecovery, AutoRecoveryConfig
from quorumlog.security import Role, issue_token
from quorumlog.server.local_cluster import LocalCluster

SESSION_MS = 2_000
ENTRIES = 20


def _token_file(path: Path, role: Role) -> Path:
    path.write_text(
        issue_token(HMAC_SECRET, [role], subject=role.value, expires_at_s=time.time() + 3600)
    )
    return path


def test_auth_autorecovery_with_a_bookie_token_re_replicates_a_killed_bookies_ledger(
    metadata_uri: str, tmp_path: Path
):
    key_file = write_hmac_key(tmp_path)
    client_token = _token_file(tmp_path / "client.token", Role.CLIENT)
    bookie_token = _token_file(tmp_path / "bookie.token", Role.BOOKIE)
    args = ["--token-key-file", str(key_file), "--metadata-session-timeout-ms", str(SESSION_MS)]
    with LocalCluster(metadata_uri, tmp_path / "cluster", 3, extra_args=args) as cluster:

        async def scenario() -> list[bytes]:
            bk = await BookKeeper.connect(
                metadata_uri, config=ClientConfig(token_file=str(client_token))
            )
            try:
                await UnderReplicationManager(bk.store).set_lost_bookie_recovery_delay_s(0)
                lh = await bk.create_ledger(2, 2, 2, password=b"pw")
                for i in range(ENTRIES):
                    await lh.add_entry(b"entry-%d" % i)
                await lh.close()
                lost = (await bk.ledger_metadata(lh.ledger_id)).ensembles[0][1][0]
                # A client token may not ask a bookie for a ledger's master key (H1).
                asked = await bk.pool.request(lost, LedgerKeyRequest(0, lh.ledger_id), 5_000)
                assert isinstance(asked, LedgerKeyResponse), asked
                assert asked.status == Status.UNAUTHORIZED and asked.master_key == bytes(20)
                cluster.kill([b.address for b in cluster.bookies].index(lost))

                config = AutoRecoveryConfig(
                    election_session_timeout_ms=SESSION_MS,
                    metadata_session_timeout_ms=SESSION_MS,
                    token_file=str(bookie_token),
                )
                config.auditor.bookie_check_interval_s = 1.0
                # No password: the bookie token fetches the ledger's key from a bookie.
                daemon = AutoRecovery(metadata_uri, config)
                task = asyncio.get_running_loop().create_task(daemon.run())
                try:

                    async def repaired() -> bool:
                        md = await bk.ledger_metadata(lh.ledger_id)
                        return lost not in md.all_bookies()

                    await poll_until_async(
                        repaired,
                        timeout_s=90,
                        interval_s=0.5,
                        what="the ledger off the lost bookie",
                    )
                finally:
                    daemon.stop()
                    await asyncio.wait_for(task, 30)
                assert daemon.worker_stats.ledgers_repaired >= 1
                rh = await bk.open_ledger(lh.ledger_id, b"pw")
                return [e.data for e in await rh.read_entries(0, ENTRIES - 1)]
            finally:
                await bk.close()

        assert run(scenario(), timeout_s=150) == [b"entry-%d" % i for i in range(ENTRIES)]

        # The daemon's own admin API takes the same tokens.
        statuses = _admin_statuses(metadata_uri, tmp_path, key_file, client_token)
        assert statuses == {"/heartbeat": 200, "/metrics no token": 401, "/metrics": 200}


def _admin_statuses(
    metadata_uri: str, tmp_path: Path, key_file: Path, token_file: Path
) -> dict[str, int]:
    out = tmp_path / "autorecovery.out"
    command = [
        sys.executable, "-m", "quorumlog", "autorecovery", "--metadata", metadata_uri,
        "--http-port", "0", "--token-key-file", str(key_file),
    ]  # fmt: skip
    with out.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    try:
        poll_until(
            lambda: b" admin http" in out.read_bytes() or process.poll() is not None,
            timeout_s=60,
            what="the autorecovery admin API serves",
        )
        found = re.search(rb" admin (http://\S+)", out.read_bytes())
        assert found is not None, out.read_text()
        url = found.group(1).decode()
        token = token_file.read_text()

        async def ask() -> dict[str, int]:
            asks = {
                "/heartbeat": ("/heartbeat", {}),
                "/metrics no token": ("/metrics", {}),
                "/metrics": ("/metrics", {"Authorization": f"Bearer {token}"}),
            }
            statuses = {}
            async with aiohttp.ClientSession() as session:
                for name, (path, headers) in asks.items():
                    async with session.get(url + path, headers=headers) as answer:
                        statuses[name] = answer.status
            return statuses

        return run(ask())
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
