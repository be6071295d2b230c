"""Time from a bookie's loss to full replication by autorecovery, and the copy rate.

Starts five local bookies (2 s metadata sessions) on an embedded store (or, with
``--zookeeper``, a local ZooKeeper), writes
``--ledgers`` closed 3/3/2 ledgers of ``--entries`` entries of ``--entry-size`` bytes,
starts one ``quorumlog autorecovery`` process, sets the lost-bookie recovery delay to 0,
kills (SIGKILL) the bookie that holds the most data, and times until no ledger names
it and no mark is left. Prints the bytes the lost bookie held (the bytes that had to be
copied), the time from the kill, and their ratio::

    python bench/autorecovery_heal.py --ledgers 20 --entries 10737 --entry-size 5000

The time includes detection: the killed bookie's session expiry (up to about 1.3
session timeouts on SQLite) and the auditor's reaction; it is also split into
detection (the kill to the first under-replication mark) and repair (that mark to the
last one cleared), and the daemon's own ``/metrics`` give the bytes it copied (entry
blobs: payload, header and digest) and the fragments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

import quorumlog.aio as aio
from quorumlog.client.sync import new_event_loop
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.server.local_cluster import LocalCluster


async def write(uri: str, ledgers: int, entries: int, size: int) -> dict[str, int]:
    """Write the ledgers; bytes held per bookie (E = Qw: every bookie of a ledger holds it all)."""
    held: dict[str, int] = {}
    async with await aio.BookKeeper.connect(uri) as bk:
        for _ in range(ledgers):
            handle = await bk.create_ledger(3, 3, 2)
            payload = os.urandom(size)
            futures: list[asyncio.Future[int]] = []
            for _ in range(entries):
                if len(futures) >= 1000:
                    await futures[-1000]
                futures.append(handle.append(payload))
            await asyncio.gather(*futures)
            await handle.close()
            for bookie in handle.ensemble:
                held[bookie] = held.get(bookie, 0) + entries * size
    return held


async def state(uri: str, lost: str) -> tuple[int, bool]:
    """(ledgers marked now, whether some ledger still names ``lost``)."""
    async with await aio.BookKeeper.connect(uri) as bk:
        marked = len(await UnderReplicationManager(bk.store).marked_ledgers())
        for ledger_id in await bk.list_ledgers():
            if lost in (await bk.ledger_metadata(ledger_id)).all_bookies():
                return marked, True
    return marked, False


def daemon_metrics(admin_port: int) -> dict[str, float]:
    """The autorecovery daemon's counters (the parser drops ``_total``)."""
    url = f"http://127.0.0.1:{admin_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as answer:
        text = answer.read().decode()
    return {
        family.name: family.samples[0].value
        for family in text_string_to_metric_families(text)
        if family.samples
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--ledgers", type=int, default=20)
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--entry-size", type=int, default=5_000)
    parser.add_argument("--timeout-s", type=float, default=1800)
    parser.add_argument(
        "--zookeeper",
        action="store_true",
        help="metadata on a local ZooKeeper (Debian's zookeeper package) instead of SQLite",
    )
    args = parser.parse_args()
    loop = new_event_loop()
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="quorumlog-heal-"))
        if args.zookeeper:
            from quorumlog.testing.zookeeper import ZooKeeperServer

            zk = ZooKeeperServer().start()
            stack.callback(zk.stop)
            uri = zk.uri("/heal")
        else:
            uri = "sqlite://" + os.path.join(tmp, "metadata.db")
        print(f"metadata: {uri}", flush=True)
        with LocalCluster(
            uri, tmp, 5, extra_args=["--metadata-session-timeout-ms", "2000"]
        ) as cluster:
            started = time.perf_counter()
            held = loop.run_until_complete(write(uri, args.ledgers, args.entries, args.entry_size))
            write_s = time.perf_counter() - started
            total = args.ledgers * args.entries * args.entry_size
            print(f"wrote {total / 1e6:.0f} MB of ledger data in {write_s:.1f} s", flush=True)
            lost = max(held, key=lambda b: held[b])
            index = next(b.index for b in cluster.bookies if b.address == lost)
            out = Path(tmp) / "autorecovery.out"
            with open(out, "wb") as stdout:
                daemon = subprocess.Popen(
                    [
                        *(sys.executable, "-m", "quorumlog", "autorecovery"),
                        *("--metadata", uri, "--http-port", "0"),
                    ],
                    stdout=stdout,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            try:
                deadline = time.monotonic() + 60
                while "running" not in out.read_text() and time.monotonic() < deadline:
                    time.sleep(0.1)
                admin_port = next(
                    int(line.rsplit(":", 1)[1])
                    for line in out.read_text().splitlines()
                    if " admin http://" in line
                )

                async def no_delay() -> None:
                    async with await aio.BookKeeper.connect(uri) as bk:
                        await UnderReplicationManager(bk.store).set_lost_bookie_recovery_delay_s(0)

                loop.run_until_complete(no_delay())
                cluster.kill(index)
                killed = time.perf_counter()
                detected_s = None
                deadline = time.monotonic() + args.timeout_s
                while True:
                    marked, named = loop.run_until_complete(state(uri, lost))
                    if detected_s is None and marked:
                        detected_s = time.perf_counter() - killed
                    if not marked and not named:
                        break
                    if time.monotonic() > deadline:
                        print("not healed in time", file=sys.stderr)
                        return 1
                    time.sleep(0.2)
                heal_s = time.perf_counter() - killed
                counts = daemon_metrics(admin_port)
            finally:
                os.kill(daemon.pid, signal.SIGTERM)
                daemon.wait(timeout=60)
            copied = held[lost]
            repair_s = heal_s - (detected_s or 0.0)
            copied_bytes = counts["quorumlog_autorecovery_copied_bytes"]
            print(
                f"bookie {lost} held {copied / 1e6:.0f} MB; healed {heal_s:.1f} s after its kill "
                f"(detection included): {copied / 1e6 / heal_s:.1f} MB/s",
                flush=True,
            )
            print(
                f"detected (first mark) {detected_s or 0.0:.1f} s after the kill, repaired "
                f"{repair_s:.1f} s later: {copied / 1e6 / repair_s:.1f} MB/s of payload; the "
                f"daemon copied {copied_bytes / 1e6:.0f} MB of entries in "
                f"{counts['quorumlog_autorecovery_copied_fragments']:.0f} fragments "
                f"({counts['quorumlog_autorecovery_ledgers_repaired']:.0f} ledgers); "
                f"load average {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            print(
                json.dumps(
                    {
                        "held_bytes": copied,
                        "heal_s": round(heal_s, 2),
                        "detected_s": round(detected_s or 0.0, 2),
                        "copied_bytes": copied_bytes,
                    }
                ),
                flush=True,
            )
    loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
