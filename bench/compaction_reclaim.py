"""Compaction's reclaim rate: the disk space a forced compaction gives back, and how fast.

Starts one local bookie (journal sync on, entry logs of ``--entry-log-max-bytes``, no
periodic garbage collection or compaction), writes ``--ledgers`` ledgers interleaved
(so that every entry log holds all of them) with a real client, deletes all but
``--live`` of them, then asks the bookie for a major compaction through its admin API
(``PUT /api/v1/bookie/gc``, what ``quorumlog shell gc`` does) and waits for its result.
Prints the entry-log bytes on disk before and after, the compaction's own figures
(entry logs rewritten, live bytes copied, bytes freed, its duration) and the rates;
then reads every live entry back. Each run starts afresh::

    python bench/compaction_reclaim.py --runs 3
    python bench/compaction_reclaim.py --rate-bytes-per-s 16777216   # the default pace

The duration is the compaction's: the garbage-collection round against the metadata
store that a forced run starts with is timed apart (``gc round``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

import quorumlog.aio as aio
from quorumlog.server.local_cluster import LocalCluster, embedded_metadata_uri

_HOUR_MS = "3600000"


def entry_log_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in (data_dir / "entrylogs").glob("*.log"))


def payload(ledger_id: int, entry_id: int, size: int) -> bytes:
    return (b"%d/%d:" % (ledger_id, entry_id)).ljust(size, b"x")


async def write(uri: str, ledgers: int, live: int, entries: int, size: int) -> list[int]:
    """Every ledger gets ``entries`` entries, a batch of 100 each in turn; all but ``live``
    are deleted afterwards (metadata first, then the bookie drops them). Live ids."""
    async with await aio.BookKeeper.connect(uri) as bk:
        handles = [await bk.create_ledger(1, 1, 1) for _ in range(ledgers)]
        for first in range(0, entries, 100):
            for handle in handles:
                last = min(entries, first + 100)
                await asyncio.gather(
                    *(handle.append(payload(handle.ledger_id, e, size)) for e in range(first, last))
                )
        for handle in handles:
            await handle.close()
        for handle in handles[live:]:
            await bk.delete_ledger(handle.ledger_id)
        return [handle.ledger_id for handle in handles[:live]]


async def read_back(uri: str, live: list[int], entries: int, size: int) -> None:
    async with await aio.BookKeeper.connect(uri) as bk:
        for ledger_id in live:
            reader = await bk.open_ledger(ledger_id)
            for first in range(0, entries, 1000):
                got = await reader.read_entries(first, min(entries, first + 1000) - 1)
                for entry in got:
                    if entry.data != payload(ledger_id, entry.entry_id, size):
                        raise SystemExit(f"ledger {ledger_id} entry {entry.entry_id} differs")


def call(method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def checkpoints(admin: str) -> float:
    with urllib.request.urlopen(f"{admin}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "quorumlog_bookie_checkpoints":  # the parser drops "_total"
            return float(family.samples[0].value)
    raise SystemExit("the bookie's /metrics has no checkpoints_total")


def wait_for_checkpoint(admin: str, timeout_s: float) -> None:
    """Until a checkpoint completes after this call (the bookie runs one every 10 s)."""
    seen = checkpoints(admin)
    deadline = time.monotonic() + timeout_s
    while checkpoints(admin) < seen + 2:  # the one under way may have begun before
        if time.monotonic() > deadline:
            raise SystemExit(f"no checkpoint within {timeout_s:.0f} s")
        time.sleep(0.2)


def compact(admin: str, timeout_s: float) -> dict[str, Any]:
    """A forced major gc through the admin API; its ``last`` outcome."""
    started = call("PUT", f"{admin}/api/v1/bookie/gc", {"major": True})
    if not started.get("started"):
        raise SystemExit(f"compaction did not start: {started}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = call("GET", f"{admin}/api/v1/bookie/gc")
        if not state["is_in_force_gc"] and state["last"]:
            last: dict[str, Any] = state["last"]
            if "error" in last:
                raise SystemExit(f"compaction failed: {last['error']}")
            return last
        time.sleep(0.05)
    raise SystemExit(f"compaction still running after {timeout_s:.0f} s")


def one_run(args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="compaction-reclaim-") as tmp:
        uri = embedded_metadata_uri(tmp)
        extra = [
            *("--http-port", "0", "--gc-interval-ms", _HOUR_MS),
            *("--entry-log-max-bytes", str(args.entry_log_max_bytes)),
            *(
                "--minor-compaction-interval-ms",
                _HOUR_MS,
                "--major-compaction-interval-ms",
                _HOUR_MS,
            ),
            *("--compaction-rate-bytes-per-s", str(args.rate_bytes_per_s)),
        ]
        with LocalCluster(uri, Path(tmp) / "bookies", 1, extra_args=extra) as cluster:
            bookie = cluster.bookies[0]
            admin = next(
                line.split(" admin ", 1)[1].strip()
                for line in bookie.stdout_text().splitlines()
                if " admin http" in line
            )
            written = time.perf_counter()
            live = asyncio.run(write(uri, args.ledgers, args.live, args.entries, args.entry_size))
            write_s = time.perf_counter() - written
            # Entry logs are written from a buffer and synced at checkpoints: "before" is
            # what is on disk once a checkpoint has run after the last write.
            wait_for_checkpoint(admin, timeout_s=60)
            before = entry_log_bytes(bookie.data_dir)
            outcome = compact(admin, args.timeout_s)
            after = entry_log_bytes(bookie.data_dir)
            result = outcome["result"]
            duration_s = float(result.get("duration_s") or outcome["duration_s"])
            asyncio.run(read_back(uri, live, args.entries, args.entry_size))
    figures = {
        "before_bytes": before,
        "after_bytes": after,
        "freed_bytes": float(result["bytes_freed"]),
        "copied_bytes": float(result["bytes_copied"]),
        "logs_compacted": float(len(result["logs_compacted"])),
        "compaction_s": duration_s,
        "forced_gc_s": float(outcome["duration_s"]),
        "write_s": write_s,
    }
    print(
        f"entry logs {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB "
        f"(written in {write_s:.1f} s); compaction rewrote {len(result['logs_compacted'])} "
        f"logs, copied {figures['copied_bytes'] / 1e6:.1f} MB live, freed "
        f"{figures['freed_bytes'] / 1e6:.1f} MB in {duration_s:.2f} s: "
        f"{figures['freed_bytes'] / 1e6 / duration_s:.1f} MB/s freed, "
        f"{(before - after) / 1e6 / duration_s:.1f} MB/s net "
        f"(forced gc with its gc round: {figures['forced_gc_s']:.2f} s); live entries read back",
        flush=True,
    )
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--ledgers", type=int, default=16)
    parser.add_argument("--live", type=int, default=4, help="ledgers kept; the others deleted")
    parser.add_argument("--entries", type=int, default=2000, help="entries per ledger")
    parser.add_argument("--entry-size", type=int, default=4000, help="bytes per entry")
    parser.add_argument("--entry-log-max-bytes", type=int, default=8 * 1024 * 1024)
    parser.add_argument(
        "--rate-bytes-per-s", type=int, default=0, help="compaction's pace; 0: unpaced"
    )
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=600)
    args = parser.parse_args()
    if not 0 < args.live < args.ledgers:
        parser.error("--live must be between 1 and --ledgers - 1")
    print(
        f"{args.ledgers} ledgers x {args.entries} entries x {args.entry_size} B, "
        f"{args.live} kept; entry logs of {args.entry_log_max_bytes / 2**20:.0f} MiB; "
        f"compaction pace {args.rate_bytes_per_s or 'unlimited'} B/s; "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    runs = [one_run(args) for _ in range(args.runs)]
    if len(runs) > 1:
        freed = statistics.median(r["freed_bytes"] / r["compaction_s"] for r in runs)
        net = statistics.median(
            (r["before_bytes"] - r["after_bytes"]) / r["compaction_s"] for r in runs
        )
        print(f"median of {len(runs)}: {freed / 1e6:.1f} MB/s freed, {net / 1e6:.1f} MB/s net")
    return 0


if __name__ == "__main__":
    sys.exit(main())
