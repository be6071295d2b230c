"""The HTTP admin API of real bookie processes (``quorumlog bookie --http-port``), on
both metadata drivers: every endpoint answers, bad parameters are refused with a JSON
error naming them, unknown ledgers and endpoints are 404, other methods 405."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import BOOKIE_COMMAND, poll_until, run

from quorumlog.client.bookkeeper import BookKeeper
from quorumlog.server.local_cluster import LocalCluster

ADMIN_LINE = re.compile(r"^bookie (\S+) admin http://127\.0\.0\.1:(\d+)$", re.MULTILINE)


def admin_ports(cluster: LocalCluster) -> dict[str, int]:
    """Bookie address -> admin port, from each bookie's stdout (printed before ready)."""
    ports: dict[str, int] = {}
    for bookie in cluster.bookies:
        found = ADMIN_LINE.findall(bookie.stdout_text())
        assert found, f"bookie {bookie.index} printed no admin line: {bookie.stdout_text()!r}"
        address, port = found[-1]
        ports[address] = int(port)
    return ports


def http(
    port: int, path: str, method: str = "GET", body: object | None = None
) -> tuple[int, Any, str]:
    """(status, decoded JSON or None, content type) of one request."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            status, raw, ctype = response.status, response.read(), response.headers["Content-Type"]
    except urllib.error.HTTPError as exc:
        status, raw, ctype = exc.code, exc.read(), exc.headers["Content-Type"]
    try:
        decoded = json.loads(raw) if ctype.startswith("application/json") else raw.decode()
    except ValueError:
        decoded = None
    return status, decoded, ctype


@pytest.fixture
def admin_cluster(metadata_uri: str, tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(metadata_uri, tmp_path / "bookies", 3, extra_args=["--http-port", "0"])
    with cluster:
        yield cluster


def test_every_admin_endpoint_answers_and_bad_parameters_are_refused(
    admin_cluster: LocalCluster, metadata_uri: str
) -> None:
    ports = admin_ports(admin_cluster)
    address, port = sorted(ports.items())[0]

    async def write() -> int:
        bk = await BookKeeper.connect(metadata_uri)
        try:
            handle = await bk.create_ledger(3, 3, 2, password=b"pw")
            for i in range(20):
                await handle.add_entry(b"entry %d" % i)
            await handle.close()
            return handle.ledger_id
        finally:
            await bk.close()

    ledger_id = run(write())

    assert http(port, "/heartbeat")[:2] == (200, {"status": "OK"})

    status, info, _ = http(port, "/api/v1/bookie/info")
    assert status == 200
    assert info["bookieId"] == address
    assert 0 < info["freeSpace"] <= info["totalSpace"]
    assert info["readOnly"] is False

    status, state, _ = http(port, "/api/v1/bookie/state")
    assert status == 200
    assert state["running"] is True and state["readOnly"] is False

    # What the bookie itself holds (ensemble 3 of 3 bookies: this ledger, on each).
    status, held, _ = http(port, "/api/v1/bookie/ledgers")
    assert status == 200
    assert held == {"bookieId": address, "ledgers": [ledger_id]}

    status, listed, _ = http(port, "/api/v1/bookie/list_bookies?type=rw")
    assert status == 200 and set(listed) == set(ports)
    status, listed, _ = http(port, "/api/v1/bookie/list_bookies")
    assert status == 200 and set(listed) == set(ports)

    status, ledgers, _ = http(port, "/api/v1/ledger/list")
    assert status == 200 and str(ledger_id) in ledgers
    status, ledgers, _ = http(port, "/api/v1/ledger/list?print_metadata=true")
    assert status == 200 and ledgers[str(ledger_id)]["state"] == "CLOSED"

    status, metadata, _ = http(port, f"/api/v1/ledger/metadata?ledger_id={ledger_id}")
    assert status == 200
    assert metadata["state"] == "CLOSED" and metadata["last_entry_id"] == 19
    assert "password_digest" not in metadata

    status, gc, _ = http(port, "/api/v1/bookie/gc", method="PUT", body={})
    assert status == 202 and gc["started"] is True
    poll_until(
        lambda: not http(port, "/api/v1/bookie/gc")[1]["is_in_force_gc"],
        timeout_s=60,
        what="the forced GC finishing",
        interval_s=0.2,
    )
    status, gc, _ = http(port, "/api/v1/bookie/gc")
    assert status == 200
    assert gc["is_in_force_gc"] is False and gc["last"] is not None, gc
    assert "error" not in gc["last"], gc

    status, marked, _ = http(port, "/api/v1/autorecovery/list_under_replicated_ledger")
    assert (status, marked) == (200, [])
    status, marked, _ = http(
        port, "/api/v1/autorecovery/list_under_replicated_ledger?print_missing_replica=true"
    )
    assert (status, marked) == (200, {})
    status, auditor, _ = http(port, "/api/v1/autorecovery/who_is_auditor")
    assert status in (200, 404), auditor  # no autorecovery runs here: none elected
    assert "Auditor" in auditor if status == 200 else "error" in auditor

    # Read-only on, seen by the registry, then off again.
    status, state, _ = http(port, "/api/v1/bookie/state", method="PUT", body={"readOnly": True})
    assert status == 200 and state["readOnly"] is True and "operator" in state["readOnlyReason"]
    poll_until(
        lambda: http(port, "/api/v1/bookie/list_bookies?type=ro")[1] == {address: "ro"},
        timeout_s=20,
        what="the registry listing the bookie read-only",
        interval_s=0.2,
    )
    status, state, _ = http(
        port, "/api/v1/bookie/state/readonly", method="PUT", body={"readOnly": False}
    )
    assert status == 200 and state["readOnly"] is False

    # Refusals: JSON errors with the right status, naming the parameter.
    for path, name in [
        ("/api/v1/ledger/metadata", "ledger_id"),
        ("/api/v1/ledger/metadata?ledger_id=abc", "ledger_id"),
        ("/api/v1/ledger/metadata?ledger_id=-3", "ledger_id"),
        ("/api/v1/ledger/list?print_metadata=maybe", "print_metadata"),
        ("/api/v1/bookie/list_bookies?type=xx", "type"),
        ("/api/v1/autorecovery/list_under_replicated_ledger?print_missing_replica=2", "print"),
    ]:
        status, error, ctype = http(port, path)
        assert status == 400, (path, status, error)
        assert ctype.startswith("application/json") and name in error["error"], (path, error)
    for body in ({"readOnly": "yes"}, {}, [1]):
        status, error, _ = http(port, "/api/v1/bookie/state", method="PUT", body=body)
        assert status == 400, (body, error)
        assert "readOnly" in error["error"] or "JSON" in error["error"], (body, error)
    status, error, _ = http(port, "/api/v1/bookie/gc", method="PUT", body={"major": "x"})
    assert status == 400 and "major" in error["error"]

    status, error, _ = http(port, "/api/v1/ledger/metadata?ledger_id=987654321")
    assert status == 404 and "987654321" in error["error"]
    status, error, _ = http(port, "/api/v1/no/such/endpoint")
    assert status == 404 and "error" in error
    status, error, _ = http(port, "/api/v1/ledger/metadata?ledger_id=1", method="DELETE")
    assert status == 405 and "error" in error
    status, error, _ = http(port, "/heartbeat", method="POST", body={})
    assert status == 405 and "error" in error


def test_autorecovery_endpoints_name_the_auditor_and_the_marked_ledgers(
    metadata_uri: str, tmp_path: Path
) -> None:
    from quorumlog.meta.factory import open_store
    from quorumlog.meta.underreplication import UnderReplicationManager

    cluster = LocalCluster(
        metadata_uri,
        tmp_path / "bookies",
        2,
        extra_args=["--http-port", "0", "--autorecovery"],
        entry_point=BOOKIE_COMMAND,
    )
    with cluster:
        ports = admin_ports(cluster)
        port = next(iter(ports.values()))
        poll_until(
            lambda: http(port, "/api/v1/autorecovery/who_is_auditor")[0] == 200,
            timeout_s=30,
            what="an auditor elected",
        )
        status, auditor, _ = http(port, "/api/v1/autorecovery/who_is_auditor")
        assert status == 200, auditor
        assert auditor["Auditor"] in ports  # identified by its bookie's address

        async def mark() -> None:
            store = await open_store(metadata_uri)
            try:
                manager = UnderReplicationManager(store)
                # Paused first, so that no worker takes the marks away under the test.
                await manager.set_enabled(False)
                await manager.mark(4242, ["127.0.0.1:1"])
                await manager.mark(17, ["127.0.0.1:2", "127.0.0.1:3"])
            finally:
                await store.close()

        run(mark())
        status, marked, _ = http(port, "/api/v1/autorecovery/list_under_replicated_ledger")
        assert (status, marked) == (200, [17, 4242])
        status, marked, _ = http(
            port, "/api/v1/autorecovery/list_under_replicated_ledger?print_missing_replica=true"
        )
        assert status == 200
        assert marked == {"17": ["127.0.0.1:2", "127.0.0.1:3"], "4242": ["127.0.0.1:1"]}

        # Each bookie's /metrics carries its autorecovery's: one auditor among them, and
        # the store's count of marked ledgers.
        from test_metrics import scrape

        scraped = [scrape(p)[1] for p in ports.values()]
        assert sum(m["quorumlog_autorecovery_is_auditor"] for m in scraped) == 1
        assert [m["quorumlog_autorecovery_under_replicated_ledgers"] for m in scraped] == [2, 2]
        assert all("quorumlog_bookie_add_requests_total" in m for m in scraped)
