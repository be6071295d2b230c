"""Real bookie processes over real sockets: registration, adds and reads, pipelining,
graceful stop, the cookie check, read-only mode, and ``quorumlog localbookie``."""

from __future__ import annotations

import asyncio
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from support import port_for_a_child, run, shell

from quorumlog.errors import Status
from quorumlog.meta.factory import open_store
from quorumlog.proto.codec import (
    AddRequest,
    AddResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
)
from quorumlog.server.local_cluster import LocalCluster
from quorumlog.testing.raw_client import RawClient, make_entry, master_key

KEY = master_key(b"password")


async def _listed(metadata_uri: str) -> tuple[set[str], set[str]]:
    from quorumlog.meta.bookies import BookieRegistry

    store = await open_store(metadata_uri)
    try:
        registry = BookieRegistry(store)
        return set(await registry.writable_bookies()), set(await registry.readonly_bookies())
    finally:
        await store.close()


def wait_listed(
    metadata_uri: str, writable: set[str], read_only: set[str] = frozenset(), timeout_s: float = 20
) -> tuple[set[str], set[str]]:
    """Poll the registry until it lists exactly these bookies (bounded); returns the last view."""
    deadline = time.monotonic() + timeout_s
    seen = run(_listed(metadata_uri))
    while seen != (writable, set(read_only)) and time.monotonic() < deadline:
        time.sleep(0.2)
        seen = run(_listed(metadata_uri))
    return seen


def test_bookies_register_and_are_listed(cluster3: LocalCluster, metadata_uri: str) -> None:
    addresses = set(cluster3.addresses)
    assert len(addresses) == 3
    assert all(re.fullmatch(r"127\.0\.0\.1:\d+", a) for a in addresses)
    assert run(_listed(metadata_uri)) == (addresses, set())


def test_r2_add_with_journal_sync_then_read_back(cluster3: LocalCluster) -> None:
    ledger_id = 101
    payloads = [os.urandom(random.randint(0, 3000)) for _ in range(50)]
    blobs = [make_entry(ledger_id, i, p, lac=i - 1) for i, p in enumerate(payloads)]

    async def scenario() -> None:
        for address in cluster3.addresses:
            client = await RawClient.connect(address)
            try:
                # One entry per frame for the first half, a batch frame for the rest.
                for blob in blobs[:25]:
                    answer = await client.add(ledger_id, KEY, [blob])
                    assert (answer.status, answer.ledger_id) == (Status.OK, ledger_id)
                answer = await client.add(ledger_id, KEY, blobs[25:])
                assert (answer.status, answer.entry_count) == (Status.OK, 25)
                read = await client.read(ledger_id, 0, count=len(blobs))
                assert read.status == Status.OK
                assert read.entries == blobs
                lac = await client.request(ReadLacRequest(0, ledger_id))
                assert isinstance(lac, ReadLacResponse)
                assert (lac.status, lac.last_entry_id, lac.lac) == (Status.OK, 49, 48)
                missing = await client.read(ledger_id, 50)
                assert missing.status == Status.NO_SUCH_ENTRY
            finally:
                await client.close()

    run(scenario())


def test_many_requests_in_flight_are_answered_by_request_id(cluster3: LocalCluster) -> None:
    """Thousands of adds and reads pipelined on one connection, with ids chosen out of order:
    each answer carries its request's id and is that request's answer."""
    rng = random.Random(7)
    num_ledgers = 20
    per_ledger = 100

    async def scenario() -> None:
        client = await RawClient.connect(cluster3.addresses[0])
        try:
            ids = rng.sample(range(1, 10**12), num_ledgers * per_ledger * 2)
            adds: dict[int, tuple[int, int, bytes]] = {}
            futures = []
            for n in range(num_ledgers * per_ledger):
                ledger_id, entry_id = 1000 + n % num_ledgers, n // num_ledgers
                blob = make_entry(ledger_id, entry_id, b"%d/%d" % (ledger_id, entry_id))
                request = AddRequest(ids[n], ledger_id, KEY, [blob])
                adds[ids[n]] = (ledger_id, entry_id, blob)
                futures.append(client.send(request, assign_id=False))
            answers = await asyncio.gather(*futures)
            for answer in answers:
                assert isinstance(answer, AddResponse)
                assert answer.status == Status.OK
                assert answer.ledger_id == adds[answer.request_id][0]
            read_futures = []
            for k, (request_id, (ledger_id, entry_id, _)) in enumerate(adds.items()):
                read_id = ids[len(adds) + k]
                future = client.send(ReadRequest(read_id, ledger_id, entry_id), assign_id=False)
                read_futures.append((read_id, request_id, future))
            for read_id, request_id, future in read_futures:
                answer = await asyncio.wait_for(future, 30)
                assert isinstance(answer, ReadResponse)
                assert answer.request_id == read_id
                assert answer.status == Status.OK
                assert answer.entries == [adds[request_id][2]]
            assert client.unmatched == []
        finally:
            await client.close()

    run(scenario(), timeout_s=120)


def test_sigterm_stop_deregisters_and_exits_0(cluster3: LocalCluster, metadata_uri: str) -> None:
    stopped = cluster3.bookies[1].address
    assert cluster3.stop(1) == 0
    assert "Traceback" not in cluster3.bookies[1].stderr_text()
    remaining = set(cluster3.addresses)
    assert stopped not in remaining
    assert wait_listed(metadata_uri, remaining) == (remaining, set())


def test_restart_without_port_keeps_identity_from_cookie(
    cluster3: LocalCluster, metadata_uri: str
) -> None:
    address = cluster3.bookies[0].address
    assert cluster3.stop(0) == 0
    # port=0: no --port on the command line; the cookie's recorded port is reused.
    assert cluster3.restart(0, port=0) == address
    assert wait_listed(metadata_uri, set(cluster3.addresses))[0] == set(cluster3.addresses)


@pytest.mark.parametrize("wiped", ["journal", "data"])
def test_cookie_refuses_start_after_a_directory_is_wiped(
    cluster3: LocalCluster, metadata_uri: str, wiped: str
) -> None:
    bookie = cluster3.bookies[2]

    async def put_entry() -> None:
        client = await RawClient.connect(bookie.address)
        try:
            assert (await client.add(5, KEY, [make_entry(5, 0, b"acked")])).status == Status.OK
        finally:
            await client.close()

    run(put_entry())
    assert cluster3.stop(2) == 0
    directory = bookie.journal_dir if wiped == "journal" else bookie.data_dir
    shutil.rmtree(directory)
    directory.mkdir()
    cluster3.restart(2, wait=False)
    assert cluster3.wait_exit(2, timeout_s=60) == 2
    stderr = cluster3.bookies[2].stderr_text()
    assert f"{wiped} directory" in stderr
    assert str(directory) in stderr
    assert "cookie" in stderr
    assert "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1
    assert bookie.address not in run(_listed(metadata_uri))[0]


def test_cookie_refuses_swapped_journal_directory(cluster3: LocalCluster) -> None:
    a, b = cluster3.bookies[0], cluster3.bookies[1]
    assert cluster3.stop(0) == 0
    assert cluster3.stop(1) == 0
    # Bookie 0 starts with bookie 1's journal.
    a.journal_dir, b.journal_dir = b.journal_dir, a.journal_dir
    cluster3.restart(0, wait=False)
    assert cluster3.wait_exit(0, timeout_s=60) == 2
    stderr = a.stderr_text()
    assert "journal directory" in stderr and "instance_id" in stderr
    a.journal_dir, b.journal_dir = b.journal_dir, a.journal_dir
    cluster3.restart(0)
    cluster3.restart(1)


def test_read_only_bookie_refuses_adds_and_serves_reads(
    cluster3: LocalCluster, metadata_uri: str
) -> None:
    bookie = cluster3.bookies[0]
    blobs = [make_entry(9, i, b"before read-only %d" % i) for i in range(5)]

    async def write() -> None:
        client = await RawClient.connect(bookie.address)
        try:
            assert (await client.add(9, KEY, blobs)).status == Status.OK
        finally:
            await client.close()

    run(write())
    assert cluster3.stop(0) == 0
    cluster3.restart(0, extra_args=["--disk-usage-threshold", "0.0"])
    assert "ready read-only" in bookie.stdout_text()
    others = {b.address for b in cluster3.bookies[1:]}
    assert wait_listed(metadata_uri, others, {bookie.address}) == (others, {bookie.address})

    async def check() -> None:
        client = await RawClient.connect(bookie.address)
        try:
            refused = await client.add(9, KEY, [make_entry(9, 5, b"after")])
            assert refused.status == Status.READ_ONLY
            read = await client.read(9, 0, count=10)
            assert (read.status, read.entries) == (Status.OK, blobs)
        finally:
            await client.close()

    run(check())


def test_localbookie_3_prints_metadata_and_ready_then_stops_on_sigint(tmp_path: Path) -> None:
    data_dir = tmp_path / "local"
    process = subprocess.Popen(
        [sys.executable, "-m", "quorumlog", "localbookie", "3", "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = process.stdout.readline().decode()
            if not line:
                break
            lines.append(line.rstrip("\n"))
            if "ready" in line:
                break
        assert lines and lines[0] == f"metadata: sqlite://{data_dir.absolute() / 'metadata.db'}"
        assert "ready" in lines[-1], lines
        pids = [int(m.group(1)) for line in lines if (m := re.search(r" pid (\d+) ", line))]
        addresses = [line.split()[1] for line in lines if line.startswith("bookie ")]
        assert len(pids) == 3 and len(set(addresses)) == 3
        assert run(_listed(lines[0].split(" ", 1)[1]))[0] == set(addresses)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        _, stderr = process.communicate(timeout=10)
        assert b"Traceback" not in stderr


def _two_free_ports() -> int:
    """A port P of 127.0.0.1 such that P and P + 1 are free now."""
    for _ in range(100):
        base = port_for_a_child()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", base + 1))
            except OSError:
                continue
        return base
    raise AssertionError("no two consecutive free ports")


def test_localbookie_http_port_gives_each_bookie_an_admin_api(tmp_path: Path) -> None:
    """--http-port BASE: bookie K serves /metrics and the admin API on BASE + K, printed,
    and published where quorumlog shell gc finds it."""
    base = _two_free_ports()
    data_dir = tmp_path / "local"
    command = [sys.executable, "-m", "quorumlog", "localbookie", "2", "--data-dir"]
    command += [str(data_dir), "--http-port", str(base), "--no-autorecovery"]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        assert process.stdout is not None
        for _ in range(20):
            line = process.stdout.readline().decode()
            if not line:
                break
            lines.append(line.rstrip("\n"))
            if "ready" in line:
                break
        assert lines and "ready" in lines[-1], (lines, process.stderr and process.stderr.peek())
        admin = [m.group(1) for line in lines if (m := re.search(r" admin (http://\S+)$", line))]
        assert [int(url.rpartition(":")[2]) for url in admin] == [base, base + 1], lines
        for url in admin:
            with urllib.request.urlopen(f"{url}/metrics", timeout=30) as answer:
                assert b"quorumlog_bookie_" in answer.read()
        gc = shell(lines[0].split(" ", 1)[1], "gc", "--json")
        assert gc.returncode == 0, gc.stdout + gc.stderr
        assert len(gc.stdout.splitlines()) == 2, gc.stdout
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        _, stderr = process.communicate(timeout=10)
        assert b"Traceback" not in stderr


def test_lost_metadata_session_registers_again(tmp_path: Path) -> None:
    """The bookie's session is expired behind its back (as a long pause would): its
    registration vanishes; it opens a new session and registers again, still serving."""
    import sqlite3

    from quorumlog.meta.sqlite_store import _delete_session

    db_path = tmp_path / "metadata.db"
    uri = f"sqlite://{db_path}"
    with LocalCluster(uri, tmp_path / "cluster", 1) as cluster:
        address, pid = cluster.addresses[0], cluster.bookies[0].pid
        conn = sqlite3.connect(db_path, isolation_level=None, timeout=10)
        try:
            conn.execute("BEGIN IMMEDIATE")
            old_sessions = [
                r[0] for r in conn.execute("SELECT id FROM sessions WHERE pid = ?", (pid,))
            ]
            assert old_sessions
            for session_id in old_sessions:
                _delete_session(conn, session_id)
            conn.execute("COMMIT")
            assert run(_listed(uri)) == (set(), set())
            assert wait_listed(uri, {address}) == ({address}, set())
            new_sessions = [
                r[0] for r in conn.execute("SELECT id FROM sessions WHERE pid = ?", (pid,))
            ]
            assert new_sessions and not set(new_sessions) & set(old_sessions)
        finally:
            conn.close()

        async def still_serving() -> None:
            client = await RawClient.connect(address)
            try:
                assert (await client.add(3, KEY, [make_entry(3, 0, b"after")])).status == Status.OK
            finally:
                await client.close()

        run(still_serving())
        assert cluster.bookies[0].alive()


def test_garbage_collection_drops_ledgers_without_metadata(
    metadata_uri: str, tmp_path: Path
) -> None:
    """Entries of a ledger with metadata stay; those of a ledger the metadata store does
    not know (deleted) are dropped by the periodic collection."""
    from quorumlog.meta.ledger_metadata import new_ledger_metadata
    from quorumlog.meta.ledgers import LedgerManager
    from quorumlog.proto.entry import DigestType

    with LocalCluster(
        metadata_uri, tmp_path / "cluster", 1, extra_args=["--gc-interval-ms", "200"]
    ) as cluster:
        address = cluster.addresses[0]

        async def scenario() -> None:
            store = await open_store(metadata_uri)
            client = await RawClient.connect(address)
            try:
                ledgers = LedgerManager(store)
                live_id = await ledgers.new_ledger_id()
                await ledgers.create(
                    new_ledger_metadata(live_id, (address,), 1, 1, DigestType.CRC32C, "")
                )
                dead_id = live_id + 1000
                for ledger_id in (live_id, dead_id):
                    blobs = [make_entry(ledger_id, i, b"gc %d" % i) for i in range(10)]
                    assert (await client.add(ledger_id, KEY, blobs)).status == Status.OK
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    dead = await client.read(dead_id, 0)
                    if dead.status != Status.OK:
                        break
                    await asyncio.sleep(0.1)
                assert dead.status in (Status.NO_SUCH_LEDGER, Status.NO_SUCH_ENTRY)
                live = await client.read(live_id, 0, count=10)
                assert (live.status, len(live.entries)) == (Status.OK, 10)
            finally:
                await client.close()
                await store.close()

        run(scenario())
