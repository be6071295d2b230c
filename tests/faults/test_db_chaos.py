"""Chaos for quorumlog db: three ``quorumlog db serve`` replicas over four real bookies.

Clients write through every replica while the harness kill -9s the leader (and later
restarts it on the same data directory), freezes (SIGSTOP) the next leader past its
session timeout and resumes it, and kill -9s a bookie. Strong reads run throughout.
At the end:

- every write that got a success answer is on every replica exactly once;
- no write is on any replica twice (each has a unique (client, seq), never retried);
- the replicas' dumps are identical;
- a strong read never missed a write acknowledged before it began;
- whatever the frozen leader acknowledged after it was resumed is in the log (it is
  on every replica), so it acknowledged nothing after it was fenced.

Runs on both metadata drivers; the summary line prints the figures.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from quorumlog.server.local_cluster import LocalCluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from test_db import DbProcess, dump, http, wait_ready

SESSION_MS = 1500
SESSION_TIMEOUT_S = SESSION_MS / 1000
CLIENTS = 3


class Clients:
    """Writer threads, each through a random replica, recording answers."""

    def __init__(self, replicas: list[DbProcess]) -> None:
        self.replicas = replicas
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.acked: dict[tuple[int, int], tuple[str, str, float]] = {}  # -> (node, pos, t)
        self.failed = 0
        self.strong_reads = 0
        self.stale_reads: list[Any] = []
        self.threads = [
            threading.Thread(target=self._write, args=(c,), daemon=True) for c in range(CLIENTS)
        ]
        self.threads.append(threading.Thread(target=self._read, daemon=True))

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)

    def _write(self, client: int) -> None:
        rng = random.Random(client)
        for seq in range(1_000_000):
            if self.stop.is_set():
                return
            replica = rng.choice(self.replicas)
            if replica.process.poll() is not None:
                time.sleep(0.05)
                continue
            try:
                status, answer = http(
                    replica.addr,
                    "/db/execute",
                    [["INSERT INTO acks(client, seq) VALUES (?, ?)", client, seq]],
                    timeout_s=5,
                )
            except OSError:
                status, answer = 0, None
            ok = status == 200 and isinstance(answer, dict) and "error" not in answer["results"][0]
            with self.lock:
                if ok:
                    self.acked[(client, seq)] = (answer["node"], answer["position"], time.time())
                else:
                    self.failed += 1
            if not ok:
                time.sleep(0.05)

    def _read(self) -> None:
        rng = random.Random(99)
        while not self.stop.is_set():
            with self.lock:
                before = set(self.acked)
            replica = rng.choice(self.replicas)
            try:
                status, answer = http(
                    replica.addr,
                    "/db/query?level=strong&q=SELECT+client,seq+FROM+acks",
                    timeout_s=5,
                )
            except OSError:
                continue
            if status != 200 or not isinstance(answer, dict):
                continue
            seen = {tuple(v) for v in answer["results"][0].get("values", [])}
            self.strong_reads += 1
            missing = before - seen
            if missing:
                self.stale_reads.append(sorted(missing)[:5])
            time.sleep(0.1)


def _leader(replicas: list[DbProcess]) -> DbProcess:
    return wait_ready([r for r in replicas if r.process.poll() is None], timeout_s=60)


def test_db_chaos_kill_freeze_bookie_loss(cluster4: LocalCluster, tmp_path: Path) -> None:
    base = tmp_path / "db"
    replicas = [
        DbProcess(cluster4.metadata_uri, f"r{i}", base, session_timeout_ms=SESSION_MS)
        for i in range(3)
    ]
    started = time.monotonic()
    clients: Clients | None = None
    try:
        leader = _leader(replicas)
        status, answer = http(
            leader.addr, "/db/execute", ["CREATE TABLE acks (client INTEGER, seq INTEGER)"]
        )
        assert status == 200, answer
        clients = Clients(replicas)
        clients.start()
        time.sleep(3)

        # 1. kill -9 of the leader while clients write
        first = leader
        first.kill()
        second = _leader(replicas)
        time.sleep(2)
        # the killed replica comes back on its data directory (exactly once across kill -9)
        index = replicas.index(first)
        replicas[index] = DbProcess(
            cluster4.metadata_uri,
            first.node_id,
            base,
            port=first.port,
            session_timeout_ms=SESSION_MS,
        )
        clients.replicas = replicas

        # 2. the new leader frozen past its session, then resumed
        os.kill(second.process.pid, signal.SIGSTOP)
        frozen_at = time.time()
        time.sleep(SESSION_TIMEOUT_S * 3)
        third = _leader([r for r in replicas if r is not second])
        os.kill(second.process.pid, signal.SIGCONT)
        resumed_at = time.time()
        time.sleep(2)

        # 3. a bookie killed
        cluster4.kill(0)
        time.sleep(3)
        clients.finish()

        # a last write through the leader: every replica must apply up to it
        final_leader = _leader(replicas)
        status, answer = http(final_leader.addr, "/db/execute", ["SELECT 1"])
        assert status == 200, answer
        end = answer["position"]
        for replica in replicas:
            status, answer = http(
                replica.addr, f"/db/query?min_position={end}&q=SELECT+1", timeout_s=60
            )
            assert status == 200, (replica.node_id, answer)
    finally:
        if clients is not None:
            clients.finish()
        for replica in replicas:
            if replica.process.poll() is None:
                os.kill(replica.process.pid, signal.SIGCONT)
            replica.stop()

    dumps = [dump(r.sqlite_path) for r in replicas]
    assert dumps[0] == dumps[1] == dumps[2], "replica dumps differ"
    rows: dict[tuple[int, int], int] = {}
    for line in dumps[0]:
        if line.startswith('INSERT INTO "acks"'):
            values = line[line.index("(") + 1 : line.rindex(")")]
            key = tuple(int(v) for v in values.split(","))
            rows[key] = rows.get(key, 0) + 1  # type: ignore[index]
    duplicated = [k for k, n in rows.items() if n > 1]
    missing = [k for k in clients.acked if k not in rows]
    # Answers the frozen leader itself gave after it resumed (not ones it relayed).
    after_resume = [
        k
        for k, (node, _pos, at) in clients.acked.items()
        if node == second.node_id and at > resumed_at
    ]
    # It may answer appends confirmed before the fence (their acks waited in its socket
    # while it was frozen); any answer it gave must be in the log, checked below.
    assert all(k in rows for k in after_resume)
    print(
        f"\ndb chaos: {len(clients.acked)} writes acknowledged, {clients.failed} failed or "
        f"unknown, {len(rows)} rows on each of {len(replicas)} replicas (dumps equal), "
        f"{len(missing)} acknowledged missing, {len(duplicated)} duplicated; "
        f"{clients.strong_reads} strong reads, {len(clients.stale_reads)} stale; "
        f"frozen leader {second.node_id} answered {len(after_resume)} writes itself after "
        "resuming "
        f"(frozen {resumed_at - frozen_at:.1f} s), leaders {first.node_id} -> "
        f"{second.node_id} -> {third.node_id}; {time.monotonic() - started:.1f} s"
    )
    assert not missing, f"acknowledged writes missing: {missing[:10]}"
    assert not duplicated, f"writes applied twice: {duplicated[:10]}"
    assert not clients.stale_reads, (
        f"strong reads missed acknowledged writes: {clients.stale_reads[:3]}"
    )
    assert len(clients.acked) > 50
