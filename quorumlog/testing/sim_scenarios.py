"""Seeded fault scenarios for the simulator, and the history checker.

One scenario: a writer creates a ledger with a random quorum shape and adds
entries pipelined while the network drops and delays messages and bookies
crash and come back; a tailing reader follows the LAC; at a random moment
one or more clients recover the ledger concurrently while the old writer
(now a zombie) keeps adding. At the end a fresh client reads the ledger.

The checker then asks:
- R3: the writer's confirmations arrived in entry-id order, without gaps;
- R4: everything a tailing reader read was at or below a LAC and is what the
  writer wrote at that id;
- R7/R8: every entry confirmed to any writer (zombie included) is at or below
  the recovered last entry; every recovery that finished agrees on the last
  entry; every entry up to it reads back byte-identical; nothing past it reads.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from quorumlog.client.bookkeeper import BookKeeper
from quorumlog.client.config import ClientConfig
from quorumlog.errors import BKError, LedgerRecoveryError, NoSuchEntryError
from quorumlog.meta.bookies import BookieRegistry
from quorumlog.testing.memory_store import MemoryStore, MemoryTree
from quorumlog.testing.sim import NetworkFaults, SimBookie, SimNetwork, VirtualTimeLoop

SIM_CONFIG = ClientConfig(
    connect_timeout_ms=500,
    add_timeout_ms=500,
    read_timeout_ms=500,
    speculative_read_timeout_ms=50,
    fence_timeout_ms=500,
    explicit_lac_delay_ms=2,
    max_outstanding_adds=1000,
    read_batch_entries=16,
)


@dataclass
class History:
    seed: int
    shape: tuple[int, int, int]
    values: dict[int, bytes] = field(default_factory=dict)  # entry id -> payload sent
    confirmed: list[int] = field(default_factory=list)  # in the order the writer was told
    zombie_confirmed: list[int] = field(default_factory=list)  # confirmed after recovery began
    tail_reads: list[tuple[int, bytes, int]] = field(default_factory=list)  # (id, data, lac)
    recovered_last: list[int] = field(default_factory=list)
    recovery_errors: list[str] = field(default_factory=list)
    final_last: int | None = None
    final_entries: dict[int, bytes] = field(default_factory=dict)
    read_past_end: bool = False
    writer_error: str = ""
    crashes: int = 0


def _payload(seed: int, entry_id: int) -> bytes:
    return f"seed{seed}-entry{entry_id}-".encode() * (1 + entry_id % 3)


async def _scenario(seed: int, loop: asyncio.AbstractEventLoop) -> History:
    rng = random.Random(seed)
    num_bookies = 5
    ensemble = rng.randint(2, 4)
    write_quorum = rng.randint(1, ensemble)
    ack_quorum = rng.randint(1, write_quorum)
    history = History(seed, (ensemble, write_quorum, ack_quorum))
    faults = NetworkFaults(
        drop_probability=rng.choice([0.0, 0.0, 0.005, 0.02]),
        delay_ms_min=0.05,
        delay_ms_max=rng.choice([0.5, 2.0, 8.0]),
    )
    bookies = [SimBookie(f"10.0.0.{i}:3181") for i in range(num_bookies)]
    network = SimNetwork(loop, rng, bookies, faults)
    tree = MemoryTree()
    registry = BookieRegistry(MemoryStore(tree))
    for bookie in bookies:
        await registry.register(bookie.address)

    def client() -> BookKeeper:
        return BookKeeper(
            MemoryStore(tree),
            SIM_CONFIG,
            pool=network,  # type: ignore[arg-type]
            rng=random.Random(rng.random()),
        )

    writer_bk = client()
    handle = await writer_bk.create_ledger(ensemble, write_quorum, ack_quorum, password=b"pw")
    ledger_id = handle.ledger_id
    recovery_started = False

    def on_confirmed(future: asyncio.Future[int]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        history.confirmed.append(future.result())
        if recovery_started:
            history.zombie_confirmed.append(future.result())

    async def write(count: int) -> None:
        for _ in range(count):
            entry_id = handle._tracker.next_entry_id
            payload = _payload(seed, entry_id)
            try:
                future = handle.append(payload)
            except BKError as exc:
                history.writer_error = type(exc).__name__
                return
            history.values[entry_id] = payload
            future.add_done_callback(on_confirmed)
            if handle.outstanding_adds >= 50 or rng.random() < 0.3:
                await asyncio.sleep(rng.uniform(0, 0.004))

    async def crash_bookies(duration_s: float) -> None:
        deadline = loop.time() + duration_s
        while loop.time() < deadline:
            await asyncio.sleep(rng.uniform(0.002, 0.02))
            victim = rng.choice(bookies)
            if victim.up and sum(b.up for b in bookies) > 2 and rng.random() < 0.3:
                victim.up = False
                history.crashes += 1
                loop.call_later(rng.uniform(0.001, 0.05), setattr, victim, "up", True)

    async def tail() -> None:
        reader_bk = client()
        try:
            reader = None
            for _ in range(20):
                try:
                    reader = await reader_bk.open_ledger_no_recovery(ledger_id, b"pw")
                    break
                except BKError:
                    await asyncio.sleep(0.01)
            if reader is None:
                return
            next_id = 0
            for _ in range(40):
                await asyncio.sleep(rng.uniform(0.001, 0.01))
                try:
                    lac = await reader.read_last_add_confirmed()
                    if lac >= next_id:
                        for entry in await reader.read_entries(next_id, lac):
                            history.tail_reads.append((entry.entry_id, entry.data, lac))
                        next_id = lac + 1
                except BKError:
                    continue
        finally:
            await reader_bk.close()

    first_burst = rng.randint(5, 120)
    tailer = asyncio.ensure_future(tail())
    await asyncio.gather(write(first_burst), crash_bookies(rng.uniform(0.0, 0.1)))

    # Recovery: 1 to 3 clients at once, while the old writer keeps writing.
    recovery_started = True
    recoverers = rng.randint(1, 3)

    async def recover() -> None:
        bk = client()
        try:
            for _ in range(20):
                try:
                    rh = await bk.open_ledger(ledger_id, b"pw")
                    history.recovered_last.append(rh.metadata.last_entry_id)
                    return
                except LedgerRecoveryError as exc:
                    history.recovery_errors.append(exc.message)
                    await asyncio.sleep(0.05)
        finally:
            await bk.close()

    await asyncio.gather(
        *(recover() for _ in range(recoverers)),
        write(rng.randint(0, 30)),
        crash_bookies(rng.uniform(0.0, 0.05)),
    )
    await tailer
    # Let the zombie's last adds settle (they must all fail or be within the ledger).
    await asyncio.sleep(2.0)
    for bookie in bookies:
        bookie.up = True
    faults.drop_probability = 0.0

    final_bk = client()
    try:
        rh = await final_bk.open_ledger(ledger_id, b"pw")
        history.final_last = rh.metadata.last_entry_id
        if history.final_last >= 0:
            for entry in await rh.read_entries(0, history.final_last):
                history.final_entries[entry.entry_id] = entry.data
        try:
            await rh.read_entries(history.final_last + 1, history.final_last + 1)
            history.read_past_end = True
        except NoSuchEntryError:
            pass
    finally:
        await final_bk.close()
        await writer_bk.close()
    return history


def run_scenario(seed: int) -> History:
    """Run one seeded scenario on a fresh virtual-time loop."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(asyncio.wait_for(_scenario(seed, loop), timeout=600))
    finally:
        loop.close()


def check_history(h: History) -> list[str]:
    """Violations of R3, R4, R7 and R8 in a history (empty when all rules held)."""
    problems: list[str] = []
    if h.confirmed != list(range(len(h.confirmed))):
        problems.append(f"R3: confirmations out of order or with gaps: {h.confirmed[:20]}")
    if h.final_last is None:
        problems.append("recovery never finished")
        return problems
    for rec in h.recovered_last:
        if rec != h.final_last:
            problems.append(f"R8: recoveries disagree: {rec} vs {h.final_last}")
    if h.confirmed and h.confirmed[-1] > h.final_last:
        problems.append(
            f"R7/R8: entry {h.confirmed[-1]} was confirmed but the ledger closed at {h.final_last}"
        )
    for entry_id in range(h.final_last + 1):
        got = h.final_entries.get(entry_id)
        if got != h.values.get(entry_id):
            problems.append(
                f"R8: entry {entry_id} reads {got!r}, written {h.values.get(entry_id)!r}"
            )
            break
    if h.read_past_end:
        problems.append("R8: an entry past the last entry was readable")
    for entry_id, data, lac in h.tail_reads:
        if entry_id > lac or data != h.values.get(entry_id) or entry_id > h.final_last:
            problems.append(f"R4: tailing reader read entry {entry_id} (lac {lac}) wrongly")
            break
    return problems
