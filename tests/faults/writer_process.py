"""A writer that is meant to be killed: creates a ledger and adds entries pipelined forever,
printing ``ledger ID`` and then ``confirmed ENTRY_ID`` for every confirmed add, in order."""

import asyncio
import sys

from quorumlog.aio import BookKeeper


def payload(i: int) -> bytes:
    return b"entry-%08d-" % i + bytes([i % 251]) * 40


async def main(metadata_uri: str) -> None:
    bk = await BookKeeper.connect(metadata_uri)
    lh = await bk.create_ledger(3, 3, 2)
    print("ledger", lh.ledger_id, flush=True)
    pending = []
    for i in range(10_000_000):  # bounded; the test kills the process long before
        pending.append(lh.append(payload(i)))
        if len(pending) >= 200:
            done = pending[:100]
            del pending[:100]
            for entry_id in await asyncio.gather(*done):
                print("confirmed", entry_id)
            sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
