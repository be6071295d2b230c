"""Time from a bookie's loss to full replication by autorecovery, and the copy rate.

Starts five local bookies (2 s metadata sessions) on an embedded store (or, with
``--zookeeper``, a local ZooKeeper), writes
``--ledgers`` closed 3/3/2 ledgers of ``--entries`` entries of ``--entry-size`` bytes,
starts one ``quorumlog autorecovery`` process, sets the lost-bookie recovery delay to 0,
kills (SIGKILL) the bookie that holds the most data, and times until no ledger names
it and no mark is left. Prints the bytes the lost bookie held (the bytes that had to be
copied), the time from the kill, and their ratio::

    python bench/autorecovery_heal.py --ledgers 20 --entries 10737 --entry-size 5000

With ``--writer-rate N``, a writer appends 100 B entries at N a second (pipelined) to
a ledger of its own on bookies the kill spares, for ``--idle-s`` seconds before the
kill, through the repair, and ``--idle-s`` seconds after it; its add latency p50/p99
while idle (both windows, each after a ``sync`` so that the page cache's writeback of
what came before does not count as idle) and while the repair copies are printed side
by side (repair must not starve writers). The writer runs in a process of its own, so
that this process's polling of the repair's progress does not count as repair; the
cores each process used in each window are printed beside, and first the disk's own
floor: a small fdatasync's p99 alone and beside bulk writes at twice the copy rate (a
copy writes its bytes to the target's journal and entry log), with no bookie at all.
``--rate-bytes-per-s`` is the daemon's copy rate bound (its default when not given)::

    python bench/autorecovery_heal.py --ledgers 30 --entries 12000 --entry-size 5000 \
        --writer-rate 2000 --idle-s 20

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
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

import quorumlog.aio as aio
from quorumlog.bench.workloads import processes_cpu_s
from quorumlog.client.sync import new_event_loop
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.replication.throttle import RATE_BYTES_PER_S_DEFAULT
from quorumlog.server.local_cluster import LocalCluster

sys.path.insert(0, str(Path(__file__).resolve().parent))  # ``peers``
from peers import disk


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


class PacedWriter(threading.Thread):
    """Appends 100 B entries at ``rate`` a second on its own loop and connection, each
    add's latency filed under the phase current when it was sent. Runs in the writer's
    process (:func:`writer_child`)."""

    def __init__(self, uri: str, rate: int, avoid: str) -> None:
        super().__init__(daemon=True)
        self.uri, self.rate, self.avoid = uri, rate, avoid
        self.phase = "warm-up"
        self.latencies_ms: dict[str, list[float]] = {}
        self.sent_at_s: dict[str, list[float]] = {}  # time.monotonic(), as the bench's
        self.ensemble: list[str] = []
        self.ready = threading.Event()
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        loop = new_event_loop()
        try:
            loop.run_until_complete(self._write())
        except BaseException as exc:  # reported by the main thread
            self.error = exc
            self.ready.set()
        finally:
            loop.close()

    async def _write(self) -> None:
        async with await aio.BookKeeper.connect(self.uri) as bk:
            for _ in range(50):  # a ledger the kill leaves alone
                handle = await bk.create_ledger(3, 3, 2)
                if self.avoid not in handle.ensemble:
                    break
                await handle.close()
            else:
                raise RuntimeError(f"no ensemble without {self.avoid} in 50 tries")
            self.ensemble = list(handle.ensemble)
            self.ready.set()
            payload = b"w" * 100
            interval_s = 1.0 / self.rate
            loop = asyncio.get_running_loop()
            next_at = loop.time()
            pending: set[asyncio.Future[None]] = set()

            async def add(phase: str) -> None:
                sent_at_s = time.monotonic()
                sent = time.perf_counter()
                await handle.append(payload)
                # Filed together, so that the two lists pair up whatever the order of
                # completions.
                self.latencies_ms.setdefault(phase, []).append((time.perf_counter() - sent) * 1000)
                self.sent_at_s.setdefault(phase, []).append(sent_at_s)

            while not self.stop_event.is_set():
                now = loop.time()
                while next_at <= now:  # a late tick sends what it owes at once
                    task = asyncio.ensure_future(add(self.phase))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                    next_at += interval_s
                # A tick of at least 1 ms: uvloop's timers count whole ms, and a shorter
                # sleep returns at once, so a writer at 2000/s would spin a core.
                await asyncio.sleep(max(0.001, next_at - loop.time()))
            if pending:
                await asyncio.gather(*pending)
            await handle.close()


def writer_child(uri: str, rate: int, avoid: str) -> int:
    """The writer's process: prints ``ready <ensemble>``, takes phase names from stdin
    (``stop`` ends the run), then prints each phase's latencies as one JSON line."""
    writer = PacedWriter(uri, rate, avoid)
    writer.start()
    writer.ready.wait(60)
    if writer.error is not None:
        raise writer.error
    print("ready " + ",".join(writer.ensemble), flush=True)
    for line in sys.stdin:
        if line.strip() == "stop":
            break
        writer.phase = line.strip()
    writer.stop_event.set()
    writer.join(timeout=120)
    if writer.error is not None:
        raise writer.error
    print(json.dumps({"latencies_ms": writer.latencies_ms, "sent_at_s": writer.sent_at_s}))
    return 0


class WriterProcess:
    """:class:`PacedWriter` in a child process, steered through its stdin."""

    def __init__(self, uri: str, rate: int, avoid: str) -> None:
        self.child = subprocess.Popen(
            [sys.executable, __file__, "--writer-child", uri, str(rate), avoid],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.child.stdin is not None and self.child.stdout is not None
        self.stdin, self.stdout = self.child.stdin, self.child.stdout
        ready = self.stdout.readline()
        if not ready.startswith("ready "):
            self.child.kill()
            raise RuntimeError(f"the writer process did not start: {ready!r}")
        self.ensemble = ready.split()[1].split(",")

    def set_phase(self, name: str) -> None:
        self.stdin.write(name + "\n")
        self.stdin.flush()

    def stop(self) -> dict[str, dict[str, list[float]]]:
        """Stops the writer; each phase's add latencies (``latencies_ms``) and the
        times they were sent (``sent_at_s``, ``time.monotonic()``)."""
        self.set_phase("stop")
        out = self.stdout.readline()
        self.child.wait(timeout=120)
        if self.child.returncode != 0 or not out:
            raise RuntimeError(f"the writer process exited with status {self.child.returncode}")
        adds: dict[str, dict[str, list[float]]] = json.loads(out)
        return adds


class CpuWindows:
    """The cores each role used in each window: CPU seconds (/proc) over wall seconds.
    On a machine with few cores, the CPU a repair takes is one way it costs writers; the
    disk it shares with them is the other (:class:`DeviceSampler`)."""

    def __init__(self, roles: dict[str, list[int]]) -> None:
        self.roles = roles
        self.cores: dict[str, dict[str, float]] = {}
        self._open: tuple[str, float, dict[str, float]] | None = None

    def _read(self) -> dict[str, float]:
        return {role: processes_cpu_s(pids) for role, pids in self.roles.items()}

    def begin(self, window: str) -> None:
        self._open = (window, time.monotonic(), self._read())

    def end(self) -> None:
        assert self._open is not None, "end() without begin()"
        window, started, before = self._open
        wall_s = time.monotonic() - started
        after = self._read()
        used = {role: round((after[role] - before[role]) / wall_s, 2) for role in after}
        self.cores[window] = used
        self.cores[window]["all"] = round(sum(self.cores[window].values()), 2)
        self._open = None


class DeviceSampler(threading.Thread):
    """Write requests the block device under ``directory`` completes, sampled every
    10 ms (/sys/dev/block), to tell the writer's slow adds that the disk stalled
    from the ones the repair caused."""

    BUCKET_S = 0.1

    def __init__(self, directory: str) -> None:
        super().__init__(daemon=True)
        device = os.stat(directory).st_dev
        self.path = f"/sys/dev/block/{os.major(device)}:{os.minor(device)}/stat"
        self.samples: list[tuple[float, int]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        if not os.path.exists(self.path):  # no block device under it (tmpfs): no samples
            return
        while not self._stop_event.is_set():
            with open(self.path) as stat:
                writes = int(stat.read().split()[4])  # write I/Os completed
            self.samples.append((time.monotonic(), writes))
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)

    def completions(self) -> dict[int, int]:
        """Write completions per 100 ms bucket (``int(monotonic / BUCKET_S)``)."""
        buckets: dict[int, int] = {}
        for (_, before), (at, after) in itertools.pairwise(self.samples):
            bucket = int(at / self.BUCKET_S)
            buckets[bucket] = buckets.get(bucket, 0) + after - before
        return buckets


def disk_stalls(
    device: DeviceSampler, adds: dict[str, dict[str, list[float]]], phases: Sequence[str]
) -> dict[str, object]:
    """The share of each phase's 100 ms spans in which the disk completed under a
    quarter of its median writes (stalled), and the share of the slowest 1% of adds
    (all phases) whose time in flight met a stalled span."""
    completions = device.completions()
    spans: dict[str, range] = {}
    for phase in phases:
        sent = adds["sent_at_s"].get(phase, [])
        if sent:
            spans[phase] = range(int(min(sent) / device.BUCKET_S), int(max(sent) / device.BUCKET_S))
    counted = [completions.get(b, 0) for span in spans.values() for b in span]
    if not counted:
        return {}
    median = sorted(counted)[len(counted) // 2]
    stalled = {b for span in spans.values() for b in span if completions.get(b, 0) < median / 4}
    out: dict[str, object] = {"median_writes_per_100ms": median}
    for phase, span in spans.items():
        out[f"stalled_share_{phase}"] = round(
            sum(b in stalled for b in span) / max(1, len(span)), 3
        )
    flights = [
        (sent, sent + latency_ms / 1000)
        for phase in spans
        for sent, latency_ms in zip(
            adds["sent_at_s"][phase], adds["latencies_ms"][phase], strict=True
        )
    ]
    flights.sort(key=lambda f: f[1] - f[0])
    slowest = flights[-max(1, len(flights) // 100) :]
    met = sum(
        any(b in stalled for b in range(int(a / device.BUCKET_S), int(z / device.BUCKET_S) + 1))
        for a, z in slowest
    )
    out["slowest_1pct_meeting_a_stall"] = round(met / len(slowest), 3)
    return out


def percentile_ms(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


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
    if sys.argv[1:2] == ["--writer-child"]:
        uri, rate, avoid = sys.argv[2:5]
        return writer_child(uri, int(rate), avoid)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--ledgers", type=int, default=20)
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--entry-size", type=int, default=5_000)
    parser.add_argument("--timeout-s", type=float, default=1800)
    parser.add_argument(
        "--rate-bytes-per-s",
        type=int,
        default=None,
        help="the daemon's --replication-rate-bytes-per-s (default: the daemon's default)",
    )
    parser.add_argument(
        "--writer-rate", type=int, default=0, help="100 B appends a second during the run"
    )
    parser.add_argument("--idle-s", type=float, default=20.0, help="writer time before the kill")
    parser.add_argument(
        "--bookie-option",
        action="append",
        default=[],
        metavar="OPTION",
        help="pass OPTION to each bookie, e.g. --bookie-option=--journal-prealloc-bytes=0",
    )
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
            from quorumlog.server.local_zookeeper import ZooKeeperServer

            zk = ZooKeeperServer().start()
            stack.callback(zk.stop)
            uri = zk.uri("/heal")
        else:
            uri = "sqlite://" + os.path.join(tmp, "metadata.db")
        print(f"metadata: {uri}", flush=True)
        rate = RATE_BYTES_PER_S_DEFAULT if args.rate_bytes_per_s is None else args.rate_bytes_per_s
        floor = None
        if args.writer_rate and rate:
            # A copy writes each byte twice on its target (journal, entry log): what
            # that much bulk writing costs a small fdatasync on this disk, with no
            # bookie at all, is the floor under the writer's ratio below.
            floor = disk.fdatasync_beside_bulk(tmp, 2 * rate)
            print(
                f"disk floor: fdatasync p99 {floor['alone']['p99_ms']} ms alone, "
                f"{floor['beside']['p99_ms']} ms beside {floor['bulk_mb_per_s']} MB/s of "
                f"bulk writes ({floor['p99_ratio']}x)",
                flush=True,
            )
        with LocalCluster(
            uri, tmp, 5, extra_args=["--metadata-session-timeout-ms", "2000", *args.bookie_option]
        ) as cluster:
            started = time.perf_counter()
            held = loop.run_until_complete(write(uri, args.ledgers, args.entries, args.entry_size))
            write_s = time.perf_counter() - started
            total = args.ledgers * args.entries * args.entry_size
            print(f"wrote {total / 1e6:.0f} MB of ledger data in {write_s:.1f} s", flush=True)
            lost = max(held, key=lambda b: held[b])
            index = next(b.index for b in cluster.bookies if b.address == lost)
            out = Path(tmp) / "autorecovery.out"
            rate_args = []
            if args.rate_bytes_per_s is not None:
                rate_args = ["--replication-rate-bytes-per-s", str(args.rate_bytes_per_s)]
            with open(out, "wb") as stdout:
                daemon = subprocess.Popen(
                    [
                        *(sys.executable, "-m", "quorumlog", "autorecovery"),
                        *("--metadata", uri, "--http-port", "0", *rate_args),
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
                writer = None
                if args.writer_rate:
                    writer = WriterProcess(uri, args.writer_rate, lost)
                    stack.callback(writer.child.kill)  # a failed run leaves no writer
                    ours = writer.ensemble
                    theirs = [b.process.pid for b in cluster.bookies if b.address in ours]
                    others = [
                        b.process.pid
                        for b in cluster.bookies
                        if b.address not in ours and b.address != lost
                    ]
                    cpu = CpuWindows(
                        {
                            "writer_bookies": theirs,
                            "other_bookies": others,
                            "daemon": [daemon.pid],
                            "writer": [writer.child.pid],
                            "bench": [os.getpid()],
                        }
                    )
                    device = DeviceSampler(tmp)
                    device.start()
                    os.sync()  # the 1 GiB just written reaches the disk before idle
                    time.sleep(2.0)  # connections and the first batches settle
                    writer.set_phase("idle")
                    cpu.begin("idle")
                    time.sleep(args.idle_s)
                    cpu.end()
                    writer.set_phase("detection")
                cluster.kill(index)
                killed = time.perf_counter()
                detected_s = None
                deadline = time.monotonic() + args.timeout_s
                while True:
                    marked, named = loop.run_until_complete(state(uri, lost))
                    if detected_s is None and marked:
                        detected_s = time.perf_counter() - killed
                        if writer is not None:
                            writer.set_phase("repair")
                            cpu.begin("repair")
                    if not marked and not named:
                        break
                    if time.monotonic() > deadline:
                        print("not healed in time", file=sys.stderr)
                        return 1
                    time.sleep(0.2)
                heal_s = time.perf_counter() - killed
                adds: dict[str, dict[str, list[float]]] = {"latencies_ms": {}, "sent_at_s": {}}
                if writer is not None:
                    if detected_s is not None:  # a heal faster than one poll has no repair window
                        cpu.end()
                    writer.set_phase("settling")
                    os.sync()  # what the repair wrote reaches the disk before idle again
                    writer.set_phase("idle_after")
                    cpu.begin("idle_after")
                    time.sleep(args.idle_s)
                    cpu.end()
                    adds = writer.stop()
                    device.stop()
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
            figures: dict[str, object] = {
                "held_bytes": copied,
                "heal_s": round(heal_s, 2),
                "detected_s": round(detected_s or 0.0, 2),
                "copied_bytes": copied_bytes,
                "rate_bytes_per_s": args.rate_bytes_per_s,
                "throttled_s": counts.get("quorumlog_autorecovery_copy_throttled_seconds"),
            }
            if writer is not None:
                windows = dict(adds["latencies_ms"])
                windows["idle_both"] = windows.get("idle", []) + windows.get("idle_after", [])
                p99: dict[str, float] = {}
                for phase in ("idle", "idle_after", "idle_both", "repair"):
                    values = windows.get(phase, [])
                    p99[phase] = percentile_ms(values, 0.99)
                    figures[f"writer_{phase}"] = {
                        "adds": len(values),
                        "p50_ms": round(percentile_ms(values, 0.50), 3),
                        "p99_ms": round(p99[phase], 3),
                    }
                idle_p99, repair_p99 = p99["idle_both"], p99["repair"]
                print(
                    f"writer at {args.writer_rate}/s on {','.join(writer.ensemble)}: p99 "
                    f"{idle_p99:.2f} ms idle ({p99['idle']:.2f} before the kill, "
                    f"{p99['idle_after']:.2f} after the repair), {repair_p99:.2f} ms "
                    f"during the repair "
                    f"({repair_p99 / idle_p99 if idle_p99 else float('nan'):.2f}x)",
                    flush=True,
                )
                figures["cores_used"] = cpu.cores
                figures["disk_floor"] = floor
                stalls = disk_stalls(device, adds, ("idle", "repair", "idle_after"))
                figures["disk_stalls"] = stalls
                print(
                    "disk stalled (100 ms spans under a quarter of the median "
                    f"{stalls.get('median_writes_per_100ms')} write completions): "
                    + ", ".join(
                        f"{phase} {stalls.get(f'stalled_share_{phase}', 0.0):.1%}"
                        for phase in ("idle", "repair", "idle_after")
                    )
                    + f" of the time; the slowest 1% of adds met a stall in "
                    f"{stalls.get('slowest_1pct_meeting_a_stall', 0.0):.0%} of cases",
                    flush=True,
                )
                for window, cores in cpu.cores.items():
                    print(f"cores used, {window}: {json.dumps(cores)}", flush=True)
            print(json.dumps(figures), flush=True)
    loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
