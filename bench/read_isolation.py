"""Do catch-up reads slow writers? A paced writer's add latency alone and beside a
reader catching up a backlog, in one run.

Starts three local bookies on an embedded store, writes a closed backlog ledger of
``--backlog`` entries, measures how fast one pipelined writer appends (``--max-s``
seconds), then runs a writer process appending ``--entry-size`` entries at half that
rate (or ``--rate``) to a ledger of its own. After ``--alone-s`` seconds a reader
process (another client) reads the whole backlog with batch reads; the writer keeps
going ``--after-s`` seconds past the reader's end. Prints the writer's p50/p99 while
alone and while the reader ran, their ratio, and the reader's entries/s::

    python bench/read_isolation.py --backlog 2000000

Targets (the performance issue): the writer's p99 beside the reader within 1.5x of
alone, and the reader at >= 500,000 entries/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import quorumlog.aio as aio
from quorumlog.bench.workloads import processes_cpu_s
from quorumlog.errors import TooManyRequestsError
from quorumlog.server.local_cluster import LocalCluster

QUORUM = (3, 3, 2)
READS_AHEAD = 8


async def write_backlog(uri: str, entries: int, size: int) -> int:
    async with await aio.BookKeeper.connect(uri) as bk:
        handle = await bk.create_ledger(*QUORUM)
        payload = os.urandom(size)
        futures: list[asyncio.Future[int]] = []
        for _ in range(entries):
            if len(futures) >= 1000:
                await futures[-1000]
                del futures[:-1000]
            futures.append(handle.append(payload))
        await asyncio.gather(*futures)
        await handle.close()
        return handle.ledger_id


async def max_rate(uri: str, seconds: float, size: int) -> float:
    """Entries a second one pipelined writer (1,000 in flight) appends."""
    async with await aio.BookKeeper.connect(uri) as bk:
        handle = await bk.create_ledger(*QUORUM)
        payload = b"m" * size
        futures: list[asyncio.Future[int]] = []
        count = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            if len(futures) >= 1000:
                await futures[-1000]
                del futures[:-1000]
            futures.append(handle.append(payload))
            count += 1
        await asyncio.gather(*futures)
        elapsed = time.perf_counter() - started
        await handle.close()
        await bk.delete_ledger(handle.ledger_id)
        return count / elapsed


async def paced_writer(uri: str, rate: float, seconds: float, size: int, out: Path) -> None:
    """Appends at ``rate`` a second for ``seconds``; writes [[sent, latency_ms], ...]."""
    samples: list[tuple[float, float]] = []
    async with await aio.BookKeeper.connect(uri) as bk:
        handle = await bk.create_ledger(*QUORUM)
        payload = b"w" * size
        loop = asyncio.get_running_loop()
        interval = 1.0 / rate

        wall_minus_loop = time.time() - loop.time()
        last: asyncio.Future[int] | None = None

        def done(future: asyncio.Future[int], due: float) -> None:
            # Latency from when the add was due, not when it went: a writer that falls
            # behind its rate counts the delay (no coordinated omission).
            if not future.cancelled() and future.exception() is None:
                samples.append((due + wall_minus_loop, (loop.time() - due) * 1000))

        end = loop.time() + seconds
        next_at = loop.time()
        while loop.time() < end:
            now = loop.time()
            while next_at <= now:
                try:
                    last = handle.append(payload)
                except TooManyRequestsError:  # behind by far: wait, keeping the due time
                    await handle.wait_for_capacity()
                    continue
                last.add_done_callback(lambda f, due=next_at: done(f, due))
                next_at += interval
            # A tick of at least 1 ms: the adds due in it go together (one frame).
            await asyncio.sleep(max(0.001, next_at - loop.time()))
        if last is not None:
            await last
        await handle.close()
    out.write_text(json.dumps(samples))


async def catch_up(uri: str, ledger_id: int, out: Path) -> None:
    """Reads the whole ledger in batch reads, a few steps ahead; writes its span."""
    async with await aio.BookKeeper.connect(uri) as bk:
        reader = await bk.open_ledger(ledger_id)
        last = reader.last_add_confirmed
        step = max(1, bk.config.read_batch_entries * bk.config.reads_in_flight)
        steps = [(first, min(last, first + step - 1)) for first in range(0, last + 1, step)]
        started = time.time()
        t0, cpu0 = time.perf_counter(), time.process_time()
        count = 0
        ahead: list[asyncio.Future[list[bytes]]] = []
        index = 0
        while index < len(steps) or ahead:
            while index < len(steps) and len(ahead) < READS_AHEAD:
                ahead.append(asyncio.ensure_future(reader.read_payloads(*steps[index])))
                index += 1
            count += len(await ahead.pop(0))
        elapsed = time.perf_counter() - t0
        cpu_s = time.process_time() - cpu0
        out.write_text(
            json.dumps(
                {"start": started, "end": started + elapsed, "entries": count, "cpu_s": cpu_s}
            )
        )


def cores_busy(usage: list[tuple[float, float, float]], start: float, end: float) -> dict:
    """The bookies' and the writer's CPU seconds per second between the samples
    nearest ``start`` and ``end`` (wall-clock times)."""
    a = min(usage, key=lambda u: abs(u[0] - start))
    b = min(usage, key=lambda u: abs(u[0] - end))
    span_s = max(1e-9, b[0] - a[0])
    return {"bookies": (b[1] - a[1]) / span_s, "writer": (b[2] - a[2]) / span_s}


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def child(argv: list[str]) -> None:
    role, uri, *rest = argv
    if role == "writer":
        rate, seconds, size, out = float(rest[0]), float(rest[1]), int(rest[2]), Path(rest[3])
        asyncio.run(paced_writer(uri, rate, seconds, size, out))
    else:
        asyncio.run(catch_up(uri, int(rest[0]), Path(rest[1])))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--backlog", type=int, default=2_000_000)
    parser.add_argument("--entry-size", type=int, default=100)
    parser.add_argument("--max-s", type=float, default=5.0, help="the max-rate measurement")
    parser.add_argument("--rate", type=float, default=0.0, help="writer rate (default: max / 2)")
    parser.add_argument("--alone-s", type=float, default=10.0)
    parser.add_argument("--after-s", type=float, default=2.0)
    parser.add_argument("--json-out", default="")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="quorumlog-isolation-") as tmp:
        uri = "sqlite://" + os.path.join(tmp, "metadata.db")
        with LocalCluster(uri, tmp, 3) as cluster:
            started = time.perf_counter()
            backlog = asyncio.run(write_backlog(uri, args.backlog, args.entry_size))
            print(
                f"backlog: {args.backlog:,} entries of {args.entry_size} B in "
                f"{time.perf_counter() - started:.1f} s",
                flush=True,
            )
            measured = asyncio.run(max_rate(uri, args.max_s, args.entry_size))
            rate = args.rate or measured / 2
            print(f"one pipelined writer: {measured:,.0f}/s; paced writer at {rate:,.0f}/s")
            writer_out, reader_out = Path(tmp) / "writer.json", Path(tmp) / "reader.json"
            me = [sys.executable, __file__, "--child"]
            # The writer runs alone, then beside the reader, then a little after; its
            # duration is long enough for a reader at 200k/s.
            seconds = args.alone_s + args.backlog / 200_000 + args.after_s + 5
            load_before = os.getloadavg()
            writer = subprocess.Popen(
                [*me, "writer", uri, str(rate), str(seconds), str(args.entry_size), str(writer_out)]
            )
            # Cores busy (CPU seconds per second) of the bookies and the writer, alone
            # and beside the reader: on a small machine their sum with the reader's
            # own says whether the machine, not the bookie, bounds the writer's latency.
            pids = ([b.process.pid for b in cluster.bookies], [writer.pid])
            usage: list[tuple[float, float, float]] = []
            sampling = threading.Event()

            def sample() -> None:
                while not sampling.wait(0.25):
                    usage.append((time.time(), processes_cpu_s(pids[0]), processes_cpu_s(pids[1])))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            time.sleep(args.alone_s + 1.0)  # its start-up, then alone
            subprocess.run([*me, "reader", uri, str(backlog), str(reader_out)], check=True)
            sampling.set()
            sampler.join()
            writer.wait(timeout=seconds + 120)
            if writer.returncode != 0:
                print("the writer failed", file=sys.stderr)
                return 1
            samples = json.loads(writer_out.read_text())
            span = json.loads(reader_out.read_text())
    first = samples[0][0]
    alone = [lat for sent, lat in samples if first + 1.0 <= sent < span["start"] - 0.5]
    beside = [lat for sent, lat in samples if span["start"] <= sent <= span["end"]]
    read_s = span["end"] - span["start"]
    figures = {
        "rate": round(rate),
        "max_rate": round(measured),
        "alone": {
            "adds": len(alone),
            "p50_ms": percentile(alone, 0.5),
            "p99_ms": percentile(alone, 0.99),
        },
        "beside_reader": {
            "adds": len(beside),
            "p50_ms": percentile(beside, 0.5),
            "p99_ms": percentile(beside, 0.99),
        },
        "cores_busy": {
            "alone": cores_busy(usage, first + 1.0, span["start"] - 0.5),
            "beside_reader": {
                **cores_busy(usage, span["start"], span["end"]),
                "reader": span["cpu_s"] / read_s,
            },
            "cores": len(os.sched_getaffinity(0)),
        },
        "reader_entries_per_s": span["entries"] / read_s,
        "reader_entries": span["entries"],
        "load_before": load_before,
        "load_after": os.getloadavg(),
    }
    ratio = figures["beside_reader"]["p99_ms"] / max(1e-9, figures["alone"]["p99_ms"])
    figures["p99_ratio"] = ratio
    print(
        f"writer at {rate:,.0f}/s: p50/p99 {figures['alone']['p50_ms']:.2f}/"
        f"{figures['alone']['p99_ms']:.2f} ms alone ({len(alone)} adds), "
        f"{figures['beside_reader']['p50_ms']:.2f}/{figures['beside_reader']['p99_ms']:.2f} ms "
        f"beside the reader ({len(beside)} adds): p99 x{ratio:.2f} (target <= 1.5)"
    )
    print(
        f"reader: {span['entries']:,} entries in {read_s:.2f} s = "
        f"{figures['reader_entries_per_s']:,.0f}/s (target >= 500,000); load "
        f"{load_before[0]:.1f} -> {figures['load_after'][0]:.1f}"
    )
    busy = figures["cores_busy"]
    print(
        "cores busy: alone {:.2f} (bookies {:.2f}, writer {:.2f}); beside the reader {:.2f} "
        "(bookies {:.2f}, writer {:.2f}, reader {:.2f}) of {} cores".format(
            sum(busy["alone"].values()),
            busy["alone"]["bookies"],
            busy["alone"]["writer"],
            sum(busy["beside_reader"].values()),
            busy["beside_reader"]["bookies"],
            busy["beside_reader"]["writer"],
            busy["beside_reader"]["reader"],
            busy["cores"],
        )
    )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
