"""The dice application on the simulator (real bookies on simulated machines): three
instances, a crashed leader, a late instance; every instance's output must be a prefix of
the log (virtual time)."""

from __future__ import annotations

import asyncio
import random

from support import run_virtual

from quorumlog.aio import BookKeeper, LogNamespace
from quorumlog.apps.dice import CATCHUP, FOLLOWING, LEADING, Dice, DiceConfig, Roll
from quorumlog.formats.dice import decode_value
from quorumlog.log.checker import check_observations
from quorumlog.log.position import Position
from quorumlog.meta.store import MetadataStore
from quorumlog.testing.memory_store import MemoryStore, MemoryTree
from quorumlog.testing.sim import SIM_CONFIG, ClientPool, Cluster, NetworkFaults

CONFIG = DiceConfig(interval_ms=100, check_interval_ms=50, session_timeout_ms=1000)


class Instance:
    def __init__(self, name: str, tree: MemoryTree, network: ClientPool, seed: int) -> None:
        self.name = name
        self.rolls: list[Roll] = []
        self.sessions: list[MemoryStore] = []
        self.bk = BookKeeper(
            MemoryStore(tree),
            SIM_CONFIG,
            pool=network,  # type: ignore[arg-type]
            rng=random.Random(seed),
        )

        async def session() -> MetadataStore:
            store = MemoryStore(tree)
            self.sessions.append(store)
            return store

        self.dice = Dice(
            self.bk,
            CONFIG,
            self.rolls.append,
            rng=random.Random(seed),
            identifier=name,
            election_source=session,
        )
        self.task = asyncio.ensure_future(self.dice.run())

    def crash(self) -> None:
        """As kill -9: the process stops at once, its session expires later."""
        self.task.cancel()
        self.sessions[-1].expire()

    async def stop(self) -> None:
        self.dice.stop()
        await asyncio.wait_for(self.task, 30)
        await self.bk.close()


def test_dice_instances_show_prefixes_of_one_log_across_a_crash_and_a_late_start() -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        cluster = Cluster(
            loop, random.Random(7), bookies=4, network_faults=NetworkFaults(delay_ms_max=1.0)
        )
        await cluster.start()
        tree = cluster.tree
        instances = [Instance(f"d{i}", tree, cluster.network.pool(f"d{i}"), i) for i in range(3)]
        await asyncio.sleep(2.0)
        leaders = [x for x in instances if x.dice.is_leader]
        assert len(leaders) == 1
        first = leaders[0]
        assert sum(r.role == LEADING for r in first.rolls) >= 10
        first.crash()
        await asyncio.sleep(3.0)
        survivors = [x for x in instances if x is not first]
        assert sum(x.dice.is_leader for x in survivors) == 1
        late = Instance("late", tree, cluster.network.pool("late"), 99)
        await asyncio.sleep(2.0)
        for x in [*survivors, late]:
            await x.stop()

        checker_bk = BookKeeper(MemoryStore(tree), SIM_CONFIG, pool=cluster.network.pool("checker"))  # type: ignore[arg-type]
        log = await LogNamespace(checker_bk).open_log(CONFIG.log_name)
        final: list[tuple[Position, int | None]] = [
            (r.position, decode_value(r.data)) for r in await log.read_all(fence=True)
        ]
        await checker_bk.close()
        await cluster.close()
        every = [*instances, late]
        report = check_observations(
            final, prefixes={x.name: [(r.position, r.value) for r in x.rolls] for x in every}
        )
        assert report.ok, report.problems
        print(report.summary(), {x.name: len(x.rolls) for x in every})
        assert len({p.ledger_id for p, _ in final}) >= 2  # two leaders wrote
        roles = {r.role for x in every for r in x.rolls}
        assert LEADING in roles and FOLLOWING in roles
        assert all(r.role != CATCHUP or r.position < final[-1][0] for x in every for r in x.rolls)
        # The late instance printed the whole history, from the first record.
        assert late.rolls[0].position == final[0][0]
        assert len(late.rolls) >= len(final) - 25

    run_virtual(main)


def test_roll_lines_in_both_formats_read_back() -> None:
    roll = Roll(4, Position(12, 7), LEADING)
    assert roll.text() == "Value = 4, epoch = 12, entry = 7, leading"
    assert roll.json() == '{"value": 4, "ledger": 12, "entry": 7, "role": "leading"}'
    assert Roll.parse(roll.text()) == roll == Roll.parse(roll.json())
