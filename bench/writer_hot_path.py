"""The writer's hot path without I/O: what the state machine costs per entry.

Adds N entries in loop turns of BATCH, takes each bookie's batch, has every bookie
acknowledge it, and counts confirmations, two ways, alternating:

- tracker: AddTracker with the per-bookie queues kept beside it (what the ledger
  handle did before core/writer.py; the floor);
- writer: LedgerWriter.add / take_sends / ack (what the ledger handle does).

    python bench/writer_hot_path.py                  # 3/3/2, 200,000 entries, 4 rounds
    python bench/writer_hot_path.py --entries 1000000 --rounds 6
"""

from __future__ import annotations

import argparse
import time

from quorumlog.core.adds import AddTracker, PendingAdd
from quorumlog.core.metadata import OPEN, LedgerView
from quorumlog.core.writer import LedgerWriter
from quorumlog.proto.entry import ENTRY_HEADER


def tracker_path(blobs: list[bytes], shape: tuple[int, int, int], batch: int) -> int:
    tracker = AddTracker(*shape)
    outbox: list[list[PendingAdd]] = [[] for _ in range(shape[0])]
    confirmed = 0
    for start in range(0, len(blobs), batch):
        for blob in blobs[start : start + batch]:
            pending = tracker.add(blob, None)
            for slot in pending.write_set:
                outbox[slot].append(pending)
        sends = []
        for slot, queue in enumerate(outbox):
            if queue:
                outbox[slot] = []
                sends.append((slot, [p.entry_id for p in queue]))
        for slot, ids in sends:
            if tracker.ack(ids, slot):
                confirmed += len(tracker.confirm())
    return confirmed


def writer_path(blobs: list[bytes], shape: tuple[int, int, int], batch: int) -> int:
    ensemble = tuple(f"10.0.0.{i}:3181" for i in range(shape[0]))
    writer = LedgerWriter(1, *shape, LedgerView(OPEN, -1, ((0, ensemble),)))
    confirmed = 0
    for start in range(0, len(blobs), batch):
        for blob in blobs[start : start + batch]:
            writer.add(blob, None)
        sends = [(slot, gen, [p.entry_id for p in q]) for slot, gen, q in writer.take_sends()]
        for slot, gen, ids in sends:
            confirmed += len(writer.ack(slot, gen, ids))
    return confirmed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--shape", default="3,3,2", help="ensemble,write quorum,ack quorum")
    args = parser.parse_args()
    e, wq, aq = (int(x) for x in args.shape.split(","))
    blobs = [ENTRY_HEADER.pack(1, i, -1, 100 * (i + 1)) + b"x" * 100 for i in range(args.entries)]
    results: dict[str, list[float]] = {"tracker": [], "writer": []}
    for _ in range(args.rounds):
        for name, path in (("tracker", tracker_path), ("writer", writer_path)):
            started = time.perf_counter()
            assert path(blobs, (e, wq, aq), args.batch) == args.entries
            results[name].append((time.perf_counter() - started) / args.entries * 1e6)
    for name, runs in results.items():
        runs.sort()
        print(
            f"{name:8} {e}/{wq}/{aq}: median {runs[len(runs) // 2]:.3f} us per entry "
            f"(runs {', '.join(f'{r:.3f}' for r in runs)})"
        )


if __name__ == "__main__":
    main()
