"""Prometheus metrics of real bookie processes and of the client, on both metadata
drivers: ``/metrics`` parsed with prometheus-client's own parser after a known
number of adds and reads (the counts match), and the client's registry showing the
ensemble change a killed bookie causes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import urllib.request
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support import poll_until_async, run
from test_admin_http import admin_ports

from quorumlog.client.bookkeeper import BookKeeper
from quorumlog.errors import Status
from quorumlog.proto.codec import ReadFlag, ReadRequest
from quorumlog.server.local_cluster import LocalCluster
from quorumlog.testing.raw_client import RawClient, make_entry, master_key

KEY = master_key(b"password")


def parse(text: str) -> dict[str, float]:
    """Every sample as ``name{label=value,...}`` (labels sorted) -> value."""
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "quorumlog.json"


def dashboard_names(prefix: str) -> set[str]:
    """The sample names with ``prefix`` that the Grafana dashboard's queries read."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [target["expr"] for panel in panels for target in panel["targets"]]
    return {name for expr in exprs for name in re.findall(prefix + r"\w+", expr)}


def assert_dashboard_names_exported(prefix: str, samples: dict[str, float]) -> None:
    exported = {key.split("{")[0] for key in samples}
    wanted = dashboard_names(prefix)
    assert wanted, prefix
    assert wanted <= exported, sorted(wanted - exported)


def scrape(port: int) -> tuple[str, dict[str, float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20) as response:
        assert response.status == 200
        ctype = response.headers["Content-Type"]
        text = response.read().decode()
    assert ctype.startswith("text/plain"), ctype
    return text, parse(text)


def test_bookie_metrics_count_what_was_done(metadata_uri: str, tmp_path: Path) -> None:
    cluster = LocalCluster(metadata_uri, tmp_path / "bookies", 1, extra_args=["--http-port", "0"])
    with cluster:
        ports = admin_ports(cluster)
        assert len(ports) == 1, ports
        ((address, port),) = ports.items()
        ledger_id = 7
        blobs = [make_entry(ledger_id, i, os.urandom(100), lac=i - 1) for i in range(50)]

        async def scenario() -> dict[str, float]:
            client = await RawClient.connect(address)
            try:
                for blob in blobs[:25]:  # 25 requests of one entry, then one of 25
                    assert (await client.add(ledger_id, KEY, [blob])).status == Status.OK
                assert (await client.add(ledger_id, KEY, blobs[25:])).status == Status.OK
                for i in range(10):  # 10 reads of one entry, one of ten
                    assert (await client.read(ledger_id, i)).status == Status.OK
                answer = await client.read(ledger_id, 10, count=10)
                assert len(answer.entries) == 10
                # A long poll parks (the LAC will not move), seen while it waits.
                poll = client.send(
                    ReadRequest(
                        0,
                        ledger_id,
                        49,
                        flags=ReadFlag.LONG_POLL,
                        previous_lac=48,
                        timeout_ms=20_000,
                    )
                )
                # Scraped until the bookie holds it: the request may take a while to
                # arrive on a loaded machine, and nothing else changes the counts.
                scraped: list[dict[str, float]] = []

                async def parked() -> bool:
                    _, samples = await asyncio.to_thread(scrape, port)
                    scraped.append(samples)
                    return samples.get("quorumlog_bookie_parked_long_polls") == 1

                await poll_until_async(
                    parked, timeout_s=30, interval_s=0.05, what="the long poll is parked"
                )
                poll.cancel()
                return scraped[-1]
            finally:
                await client.close()

        m = run(scenario())
        p = "quorumlog_bookie_"
        assert m[p + "add_requests_total"] == 26
        assert m[p + "add_entries_total"] == 50
        assert m[p + "add_latency_seconds_count"] == 26
        assert m[p + "add_latency_seconds_bucket{le=+Inf}"] == 26
        assert 0 < m[p + "add_latency_seconds_sum"] < 26 * 5
        assert m[p + "read_requests_total"] == 11
        assert m[p + "read_entries_total"] == 20
        assert m[p + "read_latency_seconds_count"] == 11
        assert m[p + "journal_syncs_total"] >= 1
        assert m[p + "journal_sync_latency_seconds_count"] == m[p + "journal_syncs_total"]
        # Each of the 26 adds (and the ledger's master key record) went through a batch.
        assert m[p + "journal_batch_records_sum"] >= 27
        assert m[p + "journal_written_bytes_total"] >= 50 * 100
        assert m[p + "parked_long_polls"] == 1
        assert m[p + "connections"] >= 1
        assert m[p + "read_only"] == 0
        assert m[p + "ledgers"] == 1
        assert m[p + "read_cache_hits_total"] + m[p + "read_cache_misses_total"] >= 20
        assert m[p + "index_size_bytes"] > 0
        assert m[p + "entry_log_size_bytes"] >= 0
        assert m[p + "journal_size_bytes"] >= 50 * 100
        assert 0 < m[p + "disk_free_bytes"] <= m[p + "disk_total_bytes"]
        assert 0 <= m[p + "disk_usage_ratio"] <= 1
        # Cumulative buckets never decrease.
        buckets = sorted(
            (float(k.split("le=")[1].rstrip("}")), v)
            for k, v in m.items()
            if k.startswith(p + "add_latency_seconds_bucket")
        )
        assert [v for _, v in buckets] == sorted(v for _, v in buckets)
        assert_dashboard_names_exported(p, m)


def test_client_registry_shows_an_ensemble_change_after_a_bookie_is_killed(
    cluster4: LocalCluster, metadata_uri: str
) -> None:
    async def scenario() -> dict[str, float]:
        bk = await BookKeeper.connect(metadata_uri)
        try:
            metrics = bk.enable_metrics()
            assert bk.enable_metrics() is metrics
            handle = await bk.create_ledger(3, 3, 2, password=b"pw")
            for i in range(20):
                await handle.add_entry(b"before %d" % i)
            victim = handle.ensemble[0]
            cluster4.kill(cluster4.addresses.index(victim))
            for i in range(20):
                await handle.add_entry(b"after %d" % i)
            assert victim not in handle.ensemble
            await handle.close()
            # A second client recovers an open ledger: counted as a recovery.
            other = await bk.create_ledger(3, 3, 2, password=b"pw")
            await other.add_entry(b"x")
            reader = await bk.open_ledger(other.ledger_id, password=b"pw")
            assert reader.last_add_confirmed == 0
            return parse(generate_latest(metrics.registry).decode())
        finally:
            await bk.close()

    m = run(scenario())
    p = "quorumlog_client_"
    assert m[p + "ensemble_changes_total"] >= 1
    assert m[p + "add_confirmed_entries_total"] == 41
    assert m[p + "add_requests_total"] >= 41 * 2  # at least an ack quorum per entry
    assert m[p + "add_latency_seconds_count"] == m[p + "add_requests_total"]
    assert m[p + "add_request_entries_total"] >= 41 * 2
    assert m[p + "recoveries_total"] == 1
    assert m[p + "recoveries_completed_total"] == 1
    assert m[p + "speculative_reads_total"] >= 0
    assert_dashboard_names_exported(p, m)


def test_client_keeps_no_metrics_unless_asked(cluster4: LocalCluster, metadata_uri: str) -> None:
    async def scenario() -> None:
        bk = await BookKeeper.connect(metadata_uri)
        try:
            handle = await bk.create_ledger(3, 3, 2)
            await handle.add_entry(b"x")
            await handle.close()
            assert bk.metrics is None
        finally:
            await bk.close()

    run(scenario())
