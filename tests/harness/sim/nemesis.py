"""Faults drawn from the seed, injected while a workload runs, and healed at the end.

Each run turns on its own mix of fault kinds (a calm run tests the happy path, a
nasty one everything at once), then a loop picks a fault every few milliseconds
of virtual time and undoes it later:

- a bookie killed (kill -9) or losing power, restarted later on the same disk; a
  power loss in the middle of the n-th disk call of a bookie;
- a bookie paused (SIGSTOP) and resumed; a client paused (its bookie traffic held,
  its timers running out) and resumed;
- partitions between any two parties: a client and a bookie, a client and the
  metadata store, a bookie (its garbage collection) and the store;
- disk faults: a sync that fails (its pages lost), a full disk (ENOSPC), a bit
  flipped in a stored journal or entry-log record;
- a bookie lost for good (its machine gone: killed and never restarted), which a
  recovery with Qa = Qw can only get past by replacing it; its registration expires
  with its session soon after, so placement stops choosing it (:meth:`Nemesis.lose`);
  a second one may follow once autorecovery repaired the first
  (:mod:`~tests.harness.sim.autorecovery`);
- replacements that die part-way (:class:`ReplacementDeaths`): a bookie a writer's
  ensemble change, a recovery or a re-replication chose acknowledges a few adds and
  dies, from a generator of its own;
- the metadata store: writes applied with their reply lost (R13), failed calls,
  slow replies, expired sessions;
- a stale listing: the bookies' garbage collection reads from a server that lags (a
  ZooKeeper follower behind the quorum, :class:`StaleReads`), which neither lists nor
  finds a ledger created since it last caught up, though the bookie may hold its
  entries already; only a sync first (R18) makes its reads current. Not healed: a
  lagging server is nothing the system may wait out. Drawn from a generator of its own
  (:meth:`NemesisPlan.draw_stale_listing`), so that the seed's other draws stay as
  they were.

Faults that destroy synced bytes (bit flips: a flipped journal record stops that
bookie for good) are kept to the bookies :attr:`NemesisPlan.damageable` names: at
most Qa - 1 of them, so that every confirmed entry keeps a sound copy, and at most
Qw - Qa, so that a recovery can still write each entry to Qa bookies of its write
set without replacing a bookie. A bookie lost for good is the one bookie a run may
damage instead (Qa >= 2, so a sound copy and enough answers to fence and to find the
end are left; E <= 3, so that two of the five bookies can replace it). A second one
may go only once the system says the first is repaired (no under-replication mark
left, no ledger naming it): then every confirmed entry has a sound copy again. Beyond
that, losing a confirmed entry or never closing the ledger is what the fault model
allows, not a defect. :meth:`Nemesis.heal` ends every fault and restarts every bookie that
is down, paused or refusing adds, except one lost for good, so that the checker's
own recovery at the end can run.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from quorumlog.errors import Status
from quorumlog.meta.layout import DEFAULT_LAYOUT, flat_path
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.proto.codec import AddFlag, AddRequest, AddResponse, Request, Response
from quorumlog.testing.memory_store import MetadataFaults, StaleReads
from quorumlog.testing.sim.cluster import BookieNode, Cluster

__all__ = ["REGISTRATION_EXPIRY_S", "Nemesis", "NemesisPlan", "ReplacementDeaths"]

# How long after a bookie is lost for good its registration goes (its session's timeout).
REGISTRATION_EXPIRY_S = 0.1


@dataclass
class NemesisPlan:
    """Which faults one run has (drawn from its seed)."""

    kill: bool = False
    power_loss: bool = False
    power_loss_in_call: bool = False
    pause: bool = False
    pause_client: bool = False
    partition_client_bookie: bool = False
    partition_client_store: bool = False
    partition_bookie_store: bool = False
    sync_failure: bool = False
    disk_full: bool = False
    bit_flip: bool = False
    session_expiry: bool = False
    metadata_unknown: float = 0.0  # probability per write of "applied, reply lost"
    metadata_fail: float = 0.0
    metadata_slow: float = 0.0
    damageable: list[str] = field(default_factory=list)  # may lose synced bytes
    lose_for_good: str | None = None  # a bookie that dies and never comes back
    interval_ms: tuple[float, float] = (1.0, 20.0)
    # The chance that a GC read finds its lagging server caught up; 0: no stale listing.
    stale_listing: float = 0.0

    @classmethod
    def draw(
        cls, rng: random.Random, addresses: list[str], shape: tuple[int, int, int]
    ) -> NemesisPlan:
        _, write_quorum, ack_quorum = shape
        damageable = min(ack_quorum - 1, write_quorum - ack_quorum)
        if rng.random() < 0.1:
            return cls()  # a calm run
        plan = cls(
            kill=rng.random() < 0.5,
            power_loss=rng.random() < 0.5,
            power_loss_in_call=rng.random() < 0.3,
            pause=rng.random() < 0.3,
            pause_client=rng.random() < 0.2,
            partition_client_bookie=rng.random() < 0.3,
            partition_client_store=rng.random() < 0.25,
            partition_bookie_store=rng.random() < 0.2,
            sync_failure=rng.random() < 0.2,
            disk_full=rng.random() < 0.15,
            bit_flip=damageable > 0 and rng.random() < 0.25,
            session_expiry=rng.random() < 0.2,
            metadata_unknown=rng.choice([0.0, 0.0, 0.05, 0.2]),
            metadata_fail=rng.choice([0.0, 0.0, 0.05]),
            metadata_slow=rng.choice([0.0, 0.1]),
        )
        if plan.bit_flip:
            plan.damageable = rng.sample(addresses, min(damageable, len(addresses)))
        # Drawn last, so that the draws above stay as they were before this fault.
        ensemble_size = shape[0]
        if not plan.bit_flip and ack_quorum >= 2 and ensemble_size <= 3 and rng.random() < 0.2:
            plan.lose_for_good = rng.choice(addresses)
            plan.damageable = [plan.lose_for_good]
        return plan

    def draw_stale_listing(self, rng: random.Random) -> None:
        """Whether the bookies' garbage collection reads from a lagging server, and how
        often it catches up: from ``rng``, a generator that nothing else draws from."""
        if rng.random() < 0.3:
            self.stale_listing = rng.choice([0.02, 0.1, 0.3])

    def metadata_faults(self, rng: random.Random) -> MetadataFaults:
        return MetadataFaults(
            random.Random(rng.random()),
            fail_probability=self.metadata_fail,
            unknown_probability=self.metadata_unknown,
            slow_probability=self.metadata_slow,
            slow_ms_max=20.0,
            timeout_ms=300.0,
        )

    def kinds(self) -> list[str]:
        names = [
            "kill",
            "power_loss",
            "power_loss_in_call",
            "pause",
            "pause_client",
            "partition_client_bookie",
            "partition_client_store",
            "partition_bookie_store",
            "sync_failure",
            "disk_full",
            "bit_flip",
            "session_expiry",
            "lose_for_good",
        ]
        return [n for n in names if getattr(self, n)]


class Nemesis:
    """Injects the faults of a :class:`NemesisPlan` into a :class:`Cluster`."""

    def __init__(self, cluster: Cluster, rng: random.Random, plan: NemesisPlan) -> None:
        self.cluster = cluster
        self.loop = cluster.loop
        self.rng = rng
        self.plan = plan
        self.trace = cluster.trace
        self.counts: Counter[str] = Counter()
        self.clients: list[str] = []  # names of the clients partitions may cut off
        self._undo: list[asyncio.TimerHandle] = []
        self._tasks: set[asyncio.Task[object]] = set()
        self._healing = False
        self.flipped: set[str] = set()  # nodes with a flipped bit on their disk
        # Told of each bookie lost for good (Losses keeps the run's damageable set).
        self.on_lost: list[Callable[[BookieNode], None]] = []
        self.deaths: ReplacementDeaths | None = None
        cluster.on_down.append(self._node_went_down)

    def lag_gc_sessions(self, rng: random.Random) -> None:
        """The stale listing: each bookie's GC session reads from a lagging server whose
        catching up is drawn from a generator of its own, made from ``rng``."""
        if not self.plan.stale_listing:
            return
        for node in self.cluster.nodes:
            if node.gc_store is not None:
                node.gc_store.stale = StaleReads(
                    random.Random(rng.random()), catch_up_probability=self.plan.stale_listing
                )

    def _spawn(self, coro: Coroutine[Any, Any, object]) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _later(
        self, low_ms: float, high_ms: float, callback: Callable[..., object], *args: object
    ) -> None:
        delay_s = self.rng.uniform(low_ms, high_ms) / 1000
        self._undo.append(self.loop.call_later(delay_s, callback, *args))

    def _node_went_down(self, node: BookieNode, power_loss: bool) -> None:
        # Every crash is followed by a restart on the same disk (unless healing does it),
        # but for the bookie lost for good.
        if not self._healing and not node.lost_for_good:
            self._later(1, 60, self._restart, node)

    def _restart(self, node: BookieNode) -> None:
        if node.state == "down" and not self._healing and not node.lost_for_good:
            self._spawn(self._restart_now(node))

    async def _restart_now(self, node: BookieNode) -> None:
        restarted = await node.restart()
        if node.lost_for_good:  # lost while it was starting
            node.power_loss()
        elif not restarted and node.state == "down" and not self._healing:
            self._later(10, 100, self._restart, node)  # it refused: try again later

    async def run(self, duration_s: float) -> None:
        """Inject faults for ``duration_s`` of virtual time."""
        kinds = self.plan.kinds()
        if not kinds:
            await asyncio.sleep(duration_s)
            return
        deadline = self.loop.time() + duration_s
        low, high = self.plan.interval_ms
        while self.loop.time() < deadline:
            await asyncio.sleep(self.rng.uniform(low, high) / 1000)
            kind = self.rng.choice(kinds)
            getattr(self, f"_{kind}")()

    # ------------------------------------------------------------ the faults

    def _up_nodes(self) -> list[BookieNode]:
        return [n for n in self.cluster.nodes if n.state == "up"]

    def _pick_up(self) -> BookieNode | None:
        nodes = self._up_nodes()
        return self.rng.choice(nodes) if nodes else None

    def _kill(self) -> None:
        node = self._pick_up()
        if node is not None:
            self.counts["kill"] += 1
            node.kill()

    def _power_loss(self) -> None:
        node = self._pick_up()
        if node is not None:
            self.counts["power_loss"] += 1
            node.power_loss()

    def _power_loss_in_call(self) -> None:
        node = self._pick_up()
        if node is not None and node.disk.faults.power_loss_in is None:
            self.counts["power_loss_in_call"] += 1
            node.disk.faults.power_loss_in = self.rng.randint(1, 40)
            self.trace(
                node.address, "power will fail in disk call %d", node.disk.faults.power_loss_in
            )

    def _pause(self) -> None:
        node = self._pick_up()
        if node is not None:
            self.counts["pause"] += 1
            node.pause()
            self._later(1, 300, node.resume)

    def _pause_client(self) -> None:
        pools = self.cluster.network.pools
        names = [n for n in self.clients if n in pools and not pools[n].paused]
        if names:
            pool = pools[self.rng.choice(names)]
            self.counts["pause_client"] += 1
            pool.pause()
            self._later(1, 300, pool.resume)

    def _partition_client_bookie(self) -> None:
        if not self.clients:
            return
        client = self.rng.choice(self.clients)
        node = self.rng.choice(self.cluster.nodes)
        self.counts["partition_client_bookie"] += 1
        self.cluster.network.partition(client, node.address)
        self._later(1, 400, self.cluster.network.heal, client, node.address)

    def _partition_client_store(self) -> None:
        if not self.clients:
            return
        name = self.rng.choice(self.clients)
        store = self.cluster.stores.get(name)
        if store is None or store.faults is None:
            return
        self.counts["partition_client_store"] += 1
        store.faults.partitioned = True
        self.trace(name, "PARTITIONED from the metadata store")
        self._later(1, 600, self._heal_store, name)

    def _heal_store(self, name: str) -> None:
        store = self.cluster.stores.get(name)
        if store is not None and store.faults is not None and store.faults.partitioned:
            store.faults.partitioned = False
            self.trace(name, "reaches the metadata store again")

    def _partition_bookie_store(self) -> None:
        node = self.rng.choice(self.cluster.nodes)
        store = node.gc_store
        if store is None:
            return
        if store.faults is None:
            store.faults = MetadataFaults(random.Random(self.rng.random()), timeout_ms=300.0)
        self.counts["partition_bookie_store"] += 1
        store.faults.partitioned = True
        self.trace(node.address, "PARTITIONED from the metadata store")
        self._later(1, 600, setattr, store.faults, "partitioned", False)

    def _sync_failure(self) -> None:
        node = self._pick_up()
        if node is not None:
            self.counts["sync_failure"] += 1
            node.disk.faults.failing_syncs += 1
            self.trace(node.address, "the next sync will fail (EIO)")

    def _disk_full(self) -> None:
        node = self._pick_up()
        if node is not None and not node.disk.faults.full:
            self.counts["disk_full"] += 1
            node.disk.faults.full = True
            self.trace(node.address, "DISK FULL")
            self._later(1, 300, self._disk_freed, node)

    def _disk_freed(self, node: BookieNode) -> None:
        node.disk.faults.full = False
        self.trace(node.address, "disk space freed")

    def _bit_flip(self) -> None:
        if not self.plan.damageable:
            return
        node = self.cluster.node(self.rng.choice(self.plan.damageable))
        files = node.disk.stored_files()
        if not files:
            return
        path, size = self.rng.choice(files)
        offset = self.rng.randrange(size)
        bit = self.rng.randrange(8)
        if node.disk.flip_bit(path, offset, bit):
            self.counts["bit_flip"] += 1
            self.flipped.add(node.address)
            self.trace(node.address, "BIT FLIPPED in %s at byte %d", path, offset)

    def _lose_for_good(self) -> None:
        address = self.plan.lose_for_good
        if address is None:
            return
        node = self.cluster.node(address)
        if node.lost_for_good:
            return
        self.counts["lose_for_good"] += 1
        self.lose(node, "LOST FOR GOOD (never restarted)")

    def lose(self, node: BookieNode, why: str) -> None:
        """``node``'s machine is gone for good: no reset, no answer, never restarted; its
        metadata session expires after a while, and its registration with it."""
        node.lost_for_good = True
        self.trace(node.address, why)
        node.power_loss()
        self._spawn(self._expire_registration(node.address))
        for listener in self.on_lost:
            listener(node)

    async def _expire_registration(self, address: str) -> None:
        await asyncio.sleep(REGISTRATION_EXPIRY_S)
        await self.cluster.expire_registration(address)

    def _session_expiry(self) -> None:
        candidates = [n for n in self.clients if n in self.cluster.stores]
        stores = [self.cluster.stores[n] for n in candidates]
        stores += [n.gc_store for n in self.cluster.nodes if n.gc_store is not None]
        if stores:
            self.counts["session_expiry"] += 1
            store = self.rng.choice(stores)
            store.expire()
            self.trace("metadata", "session %d EXPIRED", store.session_id)

    # ------------------------------------------------------------ healing

    async def heal(self) -> None:
        """End every fault; restart every bookie that is down, paused or refusing adds."""
        self._healing = True
        if self.deaths is not None:
            self.deaths.disarm()
        for handle in self._undo:
            handle.cancel()
        self._undo.clear()
        cluster = self.cluster
        cluster.network.heal()
        cluster.network.calm()
        for pool in cluster.network.pools.values():
            pool.resume()
        for store in cluster.stores.values():
            if store.faults is not None:
                store.faults.partitioned = False
                store.faults.fail_probability = 0.0
                store.faults.unknown_probability = 0.0
        for node in cluster.nodes:
            if node.gc_store is not None and node.gc_store.faults is not None:
                node.gc_store.faults.partitioned = False
            faults = node.disk.faults
            faults.power_loss_in = None
            faults.failing_syncs = 0
            faults.full = False
        for task in list(self._tasks):
            await asyncio.gather(task, return_exceptions=True)
        for node in cluster.nodes:
            if node.lost_for_good:
                continue
            if node.state == "paused":
                node.resume()
            bookie = node.bookie
            if node.state == "down" or (bookie is not None and bookie.read_only):
                await node.restart(last_try=True)
        self.trace("nemesis", "healed: %s", dict(self.counts))


class ReplacementDeaths:
    """Replacement bookies that die part-way: a bookie taking a ledger's adds though it
    is not in the ledger's first ensemble (a writer's ensemble change put it there, or a
    recovery's, or a re-replication copies to it) acknowledges a few of them, then is
    killed or loses power, and is restarted later like any crashed bookie. The writer,
    the recovery or the copy must then choose another one, with part of the entries on
    the dead one. Drawn from a generator of its own (``"<seed>:replacement deaths"``),
    so that the seed's other draws stay as they were."""

    def __init__(self, nemesis: Nemesis, rng: random.Random, deaths: int) -> None:
        self.nemesis = nemesis
        self.rng = rng
        self.left = deaths
        self.killed = 0
        self._first_ensembles: dict[int, tuple[str, ...] | None] = {}
        self._acks: Counter[tuple[str, int]] = Counter()
        self._after: dict[tuple[str, int], int] = {}
        self._dying: set[str] = set()  # sent their last answer; killed on the next turn

    @classmethod
    def draw(
        cls, nemesis: Nemesis, rng: random.Random, probability: float = 0.25
    ) -> ReplacementDeaths | None:
        """In some runs (``probability``, not calm ones): one or two deaths."""
        if nemesis.deaths is not None or not nemesis.plan.kinds() or rng.random() >= probability:
            return None
        deaths = cls(nemesis, rng, rng.choice([1, 1, 2]))
        nemesis.deaths = deaths
        for node in nemesis.cluster.nodes:
            node.on_answer = deaths._answered
        return deaths

    def disarm(self) -> None:
        for node in self.nemesis.cluster.nodes:
            node.on_answer = None

    def _first_ensemble(self, ledger_id: int) -> tuple[str, ...] | None:
        if ledger_id not in self._first_ensembles:
            nodes = self.nemesis.cluster.tree.nodes
            node = nodes.get(DEFAULT_LAYOUT.path(ledger_id)) or nodes.get(flat_path(ledger_id))
            first = None
            if node is not None:
                first = tuple(LedgerMetadata.from_bytes(node.data).ensembles[0][1])
            self._first_ensembles[ledger_id] = first
        return self._first_ensembles[ledger_id]

    def _answered(self, node: BookieNode, request: Request, response: Response) -> bool:
        """Whether this answer goes out: not once the bookie is dying (it sent its last
        acknowledgement, and the kill comes before the next loop turn)."""
        if node.address in self._dying:
            return False
        if (
            type(request) is not AddRequest
            or not isinstance(response, AddResponse)
            or response.status != Status.OK
            or node.state != "up"
            or node.lost_for_good
            or self.left <= 0
        ):
            return True
        ledger_id = request.ledger_id
        first = self._first_ensemble(ledger_id)
        if first is None or node.address in first:
            return True
        key = (node.address, ledger_id)
        self._acks[key] += len(request.entries)
        if request.flags & AddFlag.RECOVERY:
            self.nemesis.counts["replacement_recovery_adds"] += 1
        after = self._after.setdefault(key, self.rng.randint(1, 4))
        if self._acks[key] < after:
            return True
        self.left -= 1
        self._dying.add(node.address)
        power = self.rng.random() < 0.5
        self.nemesis.loop.call_soon(self._die, node, ledger_id, power)
        return True

    def _die(self, node: BookieNode, ledger_id: int, power: bool) -> None:
        self._dying.discard(node.address)
        if self.left <= 0 and not self._dying:
            self.disarm()
        if node.state != "up" or node.lost_for_good or self.nemesis._healing:
            return
        self.killed += 1
        self.nemesis.counts["replacement_deaths"] += 1
        self.nemesis.trace(
            node.address,
            "a replacement in ledger %d dies after %d acknowledged entries",
            ledger_id,
            self._acks[(node.address, ledger_id)],
        )
        if power:
            node.power_loss()
        else:
            node.kill()
