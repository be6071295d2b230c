"""CPU time per entry of a bookie's ``read_entries`` alone, in process, no network.

Writes ``--entries`` entries of ``--entry-size`` bytes to one ledger of a fresh ledger
storage, checkpoints them (so every read finds its entries through the index, as a read
of older data does), then reads them back in batches of ``--batch`` entries (what one
client request asks for) ``--rounds`` times, each with an empty read cache. Prints the
process CPU time per entry of each round and the least of them: a figure steadier than
a whole cluster's, for comparing two versions of the read path::

    python bench/read_entries_cpu.py
    python bench/read_entries_cpu.py --entries 500000 --batch 8192
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ``quorumlog`` from a clone

from quorumlog.bookie.read_cache import ReadCache
from quorumlog.bookie.storage import LedgerStorage
from quorumlog.testing.raw_client import make_entry

LEDGER_ID = 7
READ_CACHE_MAX_BYTES = 64 << 20  # the bookie's default
READ_RESPONSE_MAX_BYTES = 4 << 20  # the bookie's default


def fill(storage: LedgerStorage, entries: int, entry_size: int, journal_dir: Path) -> None:
    st = storage.create_state(LEDGER_ID)
    payload = bytes(entry_size)
    for start in range(0, entries, 1000):
        ids = range(start, min(entries, start + 1000))
        blobs = [make_entry(LEDGER_ID, e, payload) for e in ids]
        storage.add_entries(st, blobs, [len(b) for b in blobs], ids, ids[-1])
    journal_dir.mkdir()
    work = storage.capture((1, 0), journal_dir)
    storage.commit(work)
    storage.finish(work, True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--entry-size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if min(args.entries, args.batch, args.rounds) < 1:
        parser.error("--entries, --batch and --rounds must be >= 1")
    with tempfile.TemporaryDirectory(prefix="quorumlog-read-entries-") as scratch:
        storage = LedgerStorage(
            Path(scratch) / "data",
            entry_log_max_bytes=1 << 30,
            entry_log_write_buffer_bytes=1 << 16,
            read_cache_max_bytes=READ_CACHE_MAX_BYTES,
            index_map_size_bytes=1 << 30,
        )
        try:
            fill(storage, args.entries, args.entry_size, Path(scratch) / "journal")
            st = storage.state(LEDGER_ID)
            assert st is not None and not st.recent and st.flushing is None
            per_entry_us = []
            for round_index in range(args.rounds):
                storage.read_cache = ReadCache(READ_CACHE_MAX_BYTES)
                read = 0
                cpu0 = time.process_time()
                for first in range(0, args.entries, args.batch):
                    read += len(
                        storage.read_entries(st, first, args.batch, READ_RESPONSE_MAX_BYTES)
                    )
                us = (time.process_time() - cpu0) / read * 1e6
                per_entry_us.append(us)
                print(f"round {round_index + 1}: {read:,} entries, {us:.3f} µs/entry")
        finally:
            storage.close()
    print(f"least: {min(per_entry_us):.3f} µs/entry")
    return 0


if __name__ == "__main__":
    sys.exit(main())
