"""Bookie storage benchmark: batched adds through ``Bookie.submit`` with no sockets.

Measures what one bookie's journal, entry logs and index sustain on this machine:
entries/s acknowledged (journal sync on unless --no-sync), fdatasyncs/s, and the
mean entries per sync (group commit). The entry blobs are built before the clock
starts, so only the bookie's work is timed.

    python bench/bookie_storage_bench.py                       # 200,000 x 100 B in batches of 100
    python bench/bookie_storage_bench.py --batch 10 --ledgers 8 --in-flight 256
    python bench/bookie_storage_bench.py --read                # then read everything back
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from quorumlog.bookie.bookie import Bookie
from quorumlog.bookie.config import BookieConfig
from quorumlog.errors import Status
from quorumlog.proto.codec import AddRequest, ReadRequest, Response
from quorumlog.proto.entry import DigestType, EntryCodec, master_key

KEY = master_key(b"bench")


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def build_requests(entries: int, batch: int, ledgers: int, payload_bytes: int) -> list[AddRequest]:
    codec = EntryCodec(DigestType.CRC32C)
    payload = bytes(range(256)) * (payload_bytes // 256 + 1)
    payload = payload[:payload_bytes]
    next_entry = [0] * ledgers
    requests: list[AddRequest] = []
    for n in range(0, entries, batch):
        ledger_index = (n // batch) % ledgers
        ledger_id = 1000 + ledger_index
        first = next_entry[ledger_index]
        count = min(batch, entries - n)
        blobs = [codec.encode(ledger_id, e, e - 1, 0, payload) for e in range(first, first + count)]
        next_entry[ledger_index] = first + count
        requests.append(AddRequest(len(requests), ledger_id, KEY, blobs))
    return requests


async def run_adds(bookie: Bookie, requests: list[AddRequest], in_flight_max: int) -> float:
    loop = asyncio.get_running_loop()
    in_flight = 0
    failures: list[Response] = []
    wake = asyncio.Event()

    def respond(response: Response) -> None:
        nonlocal in_flight
        in_flight -= 1
        if response.status != Status.OK:
            failures.append(response)
        if in_flight < in_flight_max // 2 or in_flight == 0:
            wake.set()

    started = loop.time()
    submit = bookie.submit
    for request in requests:
        while in_flight >= in_flight_max:
            wake.clear()
            await asyncio.wait_for(wake.wait(), 30)
        in_flight += 1
        submit(request, respond)
    while in_flight:
        wake.clear()
        await asyncio.wait_for(wake.wait(), 30)
    elapsed = loop.time() - started
    if failures:
        raise SystemExit(f"{len(failures)} adds failed, first: {failures[0]}")
    return elapsed


def run_reads(bookie: Bookie, ledgers: int, per_ledger: int, batch: int) -> tuple[int, float]:
    got = 0
    answers: list[Response] = []
    started = time.perf_counter()
    for index in range(ledgers):
        for first in range(0, per_ledger, batch):
            bookie.submit(ReadRequest(0, 1000 + index, first, batch), answers.append)
            answer = answers.pop()
            assert answer.status == Status.OK, answer
            got += len(answer.entries)  # type: ignore[union-attr]
    return got, time.perf_counter() - started


async def main_async(args: argparse.Namespace, data_dir: Path) -> None:
    config = BookieConfig(
        data_dir=data_dir,
        journal_sync=not args.no_sync,
        checkpoint_interval_ms=args.checkpoint_interval_ms,
    )
    requests = build_requests(args.entries, args.batch, args.ledgers, args.payload_bytes)
    bookie = Bookie.open(config)
    await bookie.start(asyncio.get_running_loop())
    try:
        before = bookie.stats()
        cpu_before = _cpu_s()
        elapsed = await run_adds(bookie, requests, args.in_flight)
        cpu = _cpu_s() - cpu_before
        after = bookie.stats()
        syncs = after["journal_syncs"] - before["journal_syncs"]
        batches = after["journal_batches"] - before["journal_batches"]
        print(
            f"adds: {args.entries} entries of {args.payload_bytes} B in batches of {args.batch} "
            f"over {args.ledgers} ledger(s), {args.in_flight} requests in flight, "
            f"journal sync {'OFF' if args.no_sync else 'on'}"
        )
        print(f"  {args.entries / elapsed:,.0f} entries/s  ({elapsed:.2f} s, CPU {cpu:.2f} s)")
        print(
            f"  {syncs / elapsed:,.0f} fdatasyncs/s, {syncs} syncs in {batches} journal batches, "
            f"{args.entries / max(syncs, 1):,.1f} entries per sync"
        )
        print(f"  CPU per entry: {cpu / args.entries * 1e6:.2f} us")
        if args.read:
            await bookie.checkpoint()
            per_ledger = args.entries // args.ledgers
            got, read_s = run_reads(bookie, args.ledgers, per_ledger, args.read_batch)
            print(f"reads: {got} entries in batches of {args.read_batch}: {got / read_s:,.0f}/s")
    finally:
        await bookie.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--ledgers", type=int, default=1)
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--in-flight", type=int, default=64, help="requests submitted, unanswered")
    parser.add_argument("--no-sync", action="store_true", help="journal sync off (not R2-safe)")
    parser.add_argument("--checkpoint-interval-ms", type=int, default=10_000)
    parser.add_argument("--read", action="store_true", help="read everything back afterwards")
    parser.add_argument("--read-batch", type=int, default=100)
    parser.add_argument("--data-dir", type=Path, help="default: a temporary directory")
    parser.add_argument("--uvloop", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    temp = None
    data_dir = args.data_dir
    if data_dir is None:
        temp = tempfile.mkdtemp(prefix="bookie-bench-")
        data_dir = Path(temp)
    try:
        if args.uvloop:
            import uvloop

            uvloop.run(main_async(args, data_dir))
        else:
            asyncio.run(main_async(args, data_dir))
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
