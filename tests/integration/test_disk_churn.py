"""Disk use under churn, briefly: bench/disk_churn.py's soak on four real bookie processes
(short- and long-lived ledgers mixed, a kill -9 of a bookie in the middle of a
compaction, one bookie near its disk usage threshold), then a final garbage collection
and major compaction on every bookie. Each bookie's entry logs and index must then
hold at most 1.2 x the live ledgers' bytes it keeps plus one entry log, and every live
entry must read back."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench" / "disk_churn.py"


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_disk_churn", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_disk_churn"] = module
    spec.loader.exec_module(module)
    return module


def test_disk_use_under_churn_and_a_kill_9_during_compaction_stays_bounded(
    tmp_path: Path,
) -> None:
    bench = load_bench()
    args = bench.parser().parse_args(
        [
            *("--duration-s", "14", "--kill-after-s", "3", "--down-s", "0.5"),
            *("--entries", "50", "--write-bytes-per-s", str(1 << 20)),
            *("--short-life-s", "4", "--long-life-s", "4"),
            *("--entry-log-max-bytes", str(512 * 1024), "--journal-file-max-bytes", str(4 << 20)),
            *("--gc-interval-ms", "1000", "--checkpoint-interval-ms", "1000"),
            *("--minor-compaction-interval-ms", "1000", "--major-compaction-interval-ms", "2000"),
            *("--compaction-rate-bytes-per-s", str(1 << 20), "--sample-interval-s", "2"),
            *("--full-headroom-bytes", str(16 << 20)),
        ]
    )
    summary = bench.run_soak(args, tmp_path)
    assert len(summary["kills"]) == 1, "no compaction was seen on bookie 0 to kill it in"
    assert summary["ledgers_deleted"] > 0 and summary["ledgers_live"] > 0
    final = summary["final"]["bookies"]
    assert sum(b["live_bytes"] for b in final) > 0
    for b in final:
        bound = bench.BOUND_FACTOR * b["live_bytes"] + args.entry_log_max_bytes
        assert b["disk_bytes"] <= bound, (b, bound)
    confirmed = sum(ledger["confirmed"] for ledger in summary["live_ledgers"])
    assert summary["entries_read_back"] == confirmed > 0
