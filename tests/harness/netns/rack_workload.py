"""Client processes of the whole-rack test (tests/netns/test_netns_rack_loss.py), each
in a namespace of its own: ``python -m tests.harness.netns.rack_workload KIND ...``.

Kinds:

- ``writer``: with rack-aware placement (``--enforce``: enforced), for each shape of
  ``--shapes`` creates one ledger it fills and closes, and one it keeps open; once all
  are made it creates ``--ready-file``, then appends to every open ledger until
  ``--stop-file`` exists, and closes them. Its history (JSON lines, the same records as
  :mod:`.workload`'s ``ledger`` kind: ``create`` with the ledger id, ``append`` with
  ``[ledger id, entry id]``) lets ``workload final-ledger`` read everything back. An
  open ledger whose append fails is recorded ``broken`` and written no more.
- ``observe``: every half second, one JSON line with the writable bookies and their
  racks, the read-only ones, every ledger's state, write quorum and ensembles, the
  under-replication marks and the auditor's last audit summary, until ``--stop-file``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from quorumlog.aio import BookKeeper
from quorumlog.meta.underreplication import UnderReplicationManager
from tests.harness.netns.history import HistoryRecorder
from tests.harness.netns.workload import CLIENT_CONFIG, OPERATION_BOUND_S

OBSERVE_INTERVAL_S = 0.5


def _shapes(text: str) -> list[tuple[int, int, int]]:
    """``3,3,2;2,2,2`` -> [(3, 3, 2), (2, 2, 2)]."""
    shapes = []
    for part in text.split(";"):
        e, w, a = (int(x) for x in part.split(","))
        shapes.append((e, w, a))
    return shapes


def _stopped(args: argparse.Namespace) -> bool:
    return Path(args.stop_file).exists()


async def writer(args: argparse.Namespace) -> None:
    directory = Path(args.history)
    directory.mkdir(parents=True, exist_ok=True)
    history = HistoryRecorder(directory / f"{args.process}.jsonl", args.process)
    config = dataclasses.replace(
        CLIENT_CONFIG, placement="rack-aware", enforce_placement=args.enforce
    )
    bk = await BookKeeper.connect(args.metadata, config=config)
    open_handles: list[Any] = []
    seq = 0

    async def append(handle: Any) -> bool:
        nonlocal seq
        value = f"{args.process}.{handle.ledger_id}.{seq}"
        seq += 1
        op_id = history.invoke("append", "ledgers", value)
        try:
            future = handle.append(value.encode())
        except Exception:  # refused before anything was sent
            history.complete(op_id, "fail", "append", "ledgers")
            return False
        done, _ = await asyncio.wait({future}, timeout=OPERATION_BOUND_S)
        if done and future.exception() is None:
            history.complete(op_id, "ok", "append", "ledgers", [handle.ledger_id, future.result()])
            return True
        history.complete(op_id, "info", "append", "ledgers")
        return False

    for shape in _shapes(args.shapes):
        for kind in ("closed", "open"):
            op_id = history.invoke("create", "ledgers", None)
            handle = await asyncio.wait_for(bk.create_ledger(*shape), 10)
            created = {
                "ledger_id": handle.ledger_id,
                "shape": list(shape),
                "kind": kind,
                "ensemble": list(handle.ensemble),
            }
            history.complete(op_id, "ok", "create", "ledgers", created)
            if kind == "closed":
                for _ in range(args.closed_entries):
                    if not await append(handle):
                        raise SystemExit(f"ledger {handle.ledger_id}: an append failed")
                await asyncio.wait_for(handle.close(), 10)
            else:
                open_handles.append(handle)
    Path(args.ready_file).write_text("ready\n")

    async def keep_writing(handle: Any) -> None:
        window: set[asyncio.Task[bool]] = set()
        while not _stopped(args):
            while len(window) >= args.window:
                done, window = await asyncio.wait(window, return_when=asyncio.FIRST_COMPLETED)
                if not all(task.result() for task in done):
                    history.complete(
                        history.invoke("broken", "ledgers", handle.ledger_id),
                        "ok",
                        "broken",
                        "ledgers",
                    )
                    return
            window.add(asyncio.ensure_future(append(handle)))
            await asyncio.sleep(args.pause_ms / 1000)
        if window:
            await asyncio.wait(window)
        op_id = history.invoke("close", "ledgers", handle.ledger_id)
        try:
            await asyncio.wait_for(handle.close(), 15)
        except Exception:
            history.complete(op_id, "info", "close", "ledgers")
        else:
            history.complete(op_id, "ok", "close", "ledgers")

    await asyncio.gather(*(keep_writing(h) for h in open_handles))
    history.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(bk.close(), 5)


async def observe(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    bk = await BookKeeper.connect(args.metadata, config=CLIENT_CONFIG)
    marks = UnderReplicationManager(bk.store)
    with open(out, "a") as sink:
        while not _stopped(args):
            started = time.monotonic()
            with contextlib.suppress(Exception):
                snapshot = await asyncio.wait_for(_snapshot(bk, marks), 5)
                sink.write(json.dumps(snapshot, separators=(",", ":")) + "\n")
                sink.flush()
            await asyncio.sleep(max(0.0, OBSERVE_INTERVAL_S - (time.monotonic() - started)))
    with contextlib.suppress(Exception):
        await asyncio.wait_for(bk.close(), 5)


async def _snapshot(bk: BookKeeper, marks: UnderReplicationManager) -> dict[str, Any]:
    locations = await bk.registry.writable_locations()
    readonly = await bk.registry.readonly_bookies()
    ledgers: dict[str, Any] = {}
    for ledger_id in await bk.ledgers.list_ledger_ids():
        with contextlib.suppress(Exception):  # deleted since the listing
            md, _ = await bk.ledgers.read(ledger_id)
            ledgers[str(ledger_id)] = {
                "state": md.state.value,
                "write_quorum": md.write_quorum,
                "ensembles": [[first, list(ensemble)] for first, ensemble in md.ensembles],
            }
    return {
        "time_ns": time.monotonic_ns(),
        "writable": locations,
        "readonly": readonly,
        "ledgers": ledgers,
        "marks": await marks.marked_ledgers(),
        "last_audit": await marks.last_audit(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.harness.netns.rack_workload", allow_abbrev=False
    )
    parser.add_argument("kind", choices=["writer", "observe"])
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--history", default=".")
    parser.add_argument("--process", default="writer")
    parser.add_argument("--shapes", default="3,3,2")
    parser.add_argument("--enforce", action="store_true", help="enforced rack-aware placement")
    parser.add_argument("--closed-entries", type=int, default=100)
    parser.add_argument("--ready-file", default="")
    parser.add_argument("--window", type=int, default=4, help="appends in flight per ledger")
    parser.add_argument("--pause-ms", type=float, default=10.0, help="between appends")
    parser.add_argument("--out", default="observed.jsonl", help="where observe writes")
    args = parser.parse_args(argv)
    asyncio.run(writer(args) if args.kind == "writer" else observe(args))
    sys.exit(0)


if __name__ == "__main__":
    main()
