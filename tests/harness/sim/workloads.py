"""What the simulated clients do, and what they are told: one seeded run.

:func:`run_seed` builds a :class:`~quorumlog.testing.sim.cluster.Cluster` of five
real bookies on simulated machines, draws a workload and a nemesis plan from the
seed, runs them on a :class:`~quorumlog.testing.sim.loop.VirtualTimeLoop`, heals
every fault, and then does the checker's own part: a fresh client with no faults
recovers and reads everything. It returns the history;
:func:`quorumlog.testing.checkers.check_run` judges it.

Workloads:

``ledger``  one ledger of a random shape (Qa < Qw or Qa = Qw, striping when E > Qw):
            a writer pipelines entries, a reader tails the LAC, then one to three
            clients recover it at once while the old writer (a zombie) keeps adding;
            sometimes the writer closes it first, or closes it with adds in flight
            while the recoveries run, and gives up on the close or on some adds after
            a short wait (a cancelled future, as ``asyncio.wait_for`` leaves it); in
            some rounds a client without the password knocks at its bookies (R10),
            and every round first asks for ledgers of shapes R1 forbids.
``race``    two to four ledgers in a row, each recovered while its writer is busy (or
            stalled, its adds sent after the recovery, sometimes after the bookies that
            fenced the ledger restarted), on a lossy network with slow links: the
            interleavings of fencing, recovery reads and a live writer's adds.
``log``     a log stream with small rollovers: one to three writers take it from each
            other (R11), a reader tails it; some appends are given up on after a
            short wait.

In the ledger and log workloads a bookie may be lost for good, and autorecovery
(the auditor and replication workers, :mod:`.autorecovery`) then copies its share
while the writer and the recoveries go on; a second bookie may go once the first is
repaired. In some runs the clients' metadata sessions read from lagging servers
(stale reads until ``sync()``, late watch events), as ZooKeeper's followers do.

Nothing that goes wrong inside a run escapes as a harness error: an exception in
the system, a hang past the virtual-time budget, or a failure of the final
recovery is recorded in the history with the seed, and becomes a named violation.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import random
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable, Iterator
from typing import Any

from quorumlog.aio import LogNamespace
from quorumlog.client.bookkeeper import BookKeeper
from quorumlog.errors import BKError, InvalidArgumentError, NoSuchEntryError, Status
from quorumlog.log.config import LogConfig
from quorumlog.log.errors import LogFencedError
from quorumlog.log.position import Position
from quorumlog.log.record_format import record_of
from quorumlog.proto.codec import AddRequest, FenceRequest, ReadRequest
from quorumlog.proto.entry import master_key
from quorumlog.testing.checkers import LedgerHistory, LogHistory, RunHistory
from quorumlog.testing.memory_store import StaleReads
from quorumlog.testing.raw_client import make_entry
from quorumlog.testing.sim.cluster import Cluster, NetworkFaults, Trace
from quorumlog.testing.sim.disk import PowerLoss
from quorumlog.testing.sim.loop import VirtualTimeLoop
from tests.harness.sim.autorecovery import Losses, LossPlan
from tests.harness.sim.nemesis import Nemesis, NemesisPlan, ReplacementDeaths

__all__ = ["BUDGET_S", "WORKLOADS", "run_seed"]

WORKLOADS = ("ledger", "ledger", "ledger", "race", "log", "log")
# (E, Qw, Qa), weighted by repetition: Qa < Qw and Qa = Qw, striping (E > Qw), and a
# few single-copy shapes.
SHAPES = (
    *[(3, 3, 2)] * 3,
    (3, 2, 2),
    (2, 2, 2),
    (3, 3, 3),
    *[(4, 3, 2)] * 2,
    (4, 2, 2),
    (4, 3, 3),
    (4, 4, 2),
    (3, 2, 1),
    (2, 2, 1),
    (2, 1, 1),
)
STUCK_S = 20.0  # an operation unanswered this long: the workload stops waiting for it
# How far behind the other sessions a lagging client's server may be (StaleReads).
CLIENT_MAX_LAG_S = 0.5
# After healing, how long losses and their repairs may still go on (virtual seconds).
LOSSES_AFTER_HEAL_S = 6.0
BUDGET_S = 120.0  # virtual seconds a run may take before it counts as hung (most take 1-10)
PASSWORD = b"pw"


class _Run:
    """The state one run's coroutines share."""

    def __init__(self, seed: int, loop: asyncio.AbstractEventLoop, trace: Trace) -> None:
        self.seed = seed
        self.loop = loop
        self.rng = random.Random(seed)
        self.trace = trace
        self.history = RunHistory(seed)
        self.order = itertools.count()  # one sequence for "which came first"
        self.network_faults = NetworkFaults(
            drop_probability=self.rng.choice([0.0, 0.0, 0.005, 0.02]),
            delay_ms_min=0.05,
            delay_ms_max=self.rng.choice([0.5, 2.0, 8.0]),
            slow_link_probability=self.rng.choice([0.0, 0.0, 0.1, 0.3]),
            lossy_link_probability=self.rng.choice([0.0, 0.0, 0.1]),
        )
        self.cluster_rng = random.Random(self.rng.random())
        self.cluster: Cluster  # made on the loop (its stores need it)
        self.damageable: set[str] = set()  # bookies the nemesis may damage for good
        self.nemeses: list[Nemesis] = []
        self.losses: Losses | None = None
        # Lagging servers for the clients' sessions (ZooKeeper followers behind the
        # quorum), in some runs: drawn from a generator of its own.
        self.lag_rng = random.Random(f"{seed}:client lag")
        self.client_lag: tuple[float, float] | None = None  # (catch-up chance, watch delay)
        if self.lag_rng.random() < 0.3:
            self.client_lag = (
                self.lag_rng.choice([0.05, 0.2, 0.5]),
                self.lag_rng.choice([0.0, 5.0, 30.0]),
            )
        self.counts: Counter[str] = Counter()  # what the workloads' clients did

    def shape(self) -> tuple[int, int, int]:
        return self.rng.choice(SHAPES)

    def nemesis(self, shape: tuple[int, int, int]) -> Nemesis:
        addresses = [n.address for n in self.cluster.nodes]
        plan = NemesisPlan.draw(random.Random(self.rng.random()), addresses, shape)
        self.damageable.update(plan.damageable)
        self.trace("nemesis", "plan: %s; damageable: %s", plan.kinds(), plan.damageable)
        nemesis = Nemesis(self.cluster, random.Random(self.rng.random()), plan)
        # The stale listing comes from a generator of its own, so that the seed's other
        # draws (and so every run without it) stay as they were.
        stale = random.Random(f"{self.seed}:stale listing")
        plan.draw_stale_listing(stale)
        nemesis.lag_gc_sessions(stale)
        self.deaths_rng = random.Random(f"{self.seed}:replacement deaths")
        ReplacementDeaths.draw(nemesis, self.deaths_rng)
        self.nemeses.append(nemesis)
        return nemesis

    def client(self, name: str, nemesis: Nemesis, kind: type[Any] | None = None) -> Any:
        faults = nemesis.plan.metadata_faults(self.rng)
        nemesis.clients.append(name)
        bk = self.cluster.client(name, metadata_faults=faults, kind=kind)
        self._lag(name)
        return bk

    def _lag(self, name: str) -> None:
        if self.client_lag is not None:
            catch_up, watch_delay_ms = self.client_lag
            self.cluster.stores[name].stale = StaleReads(
                random.Random(self.lag_rng.random()),
                catch_up_probability=catch_up,
                watch_delay_ms=watch_delay_ms,
                max_lag_s=CLIENT_MAX_LAG_S,
            )

    def lose_and_repair(self, nemesis: Nemesis, shape: tuple[int, int, int]) -> Losses:
        """The losses for good of this run, and autorecovery: from generators of their
        own, so that the seed's other draws stay as they were."""
        rng = random.Random(f"{self.seed}:losses")
        plan = nemesis.plan
        allowed = bool(plan.kinds()) and not plan.bit_flip
        loss_plan = LossPlan.draw(rng, shape, plan.lose_for_good is not None, allowed)
        if loss_plan.first_at_ms is not None or loss_plan.autorecovery:
            self.trace("nemesis", "losses: %s", loss_plan.kinds())
        if loss_plan.first_at_ms is not None or plan.lose_for_good is not None:
            # A bookie lost for good makes recoveries replace it: their replacements die
            # more often (another draw of the same generator).
            ReplacementDeaths.draw(nemesis, self.deaths_rng, 0.5)

        def client(name: str) -> Any:
            faults = plan.metadata_faults(rng)
            bk = self.cluster.client(
                name, metadata_faults=faults, kind=BookKeeper, rng=random.Random(rng.random())
            )
            self._lag(name)
            return bk

        self.losses = Losses(
            nemesis, loss_plan, rng, client, self.damageable, PASSWORD, CLIENT_MAX_LAG_S
        )
        return self.losses


def _payload(seed: int, who: str, n: int) -> bytes:
    return f"s{seed}-{who}-{n}-".encode() * (1 + n % 3)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------- ledger workload


async def _ledger_workload(run: _Run) -> None:
    shape = run.shape()
    nemesis = run.nemesis(shape)
    fault_period = asyncio.ensure_future(nemesis.run(run.rng.uniform(0.02, 0.3)))
    losses = run.lose_and_repair(nemesis, shape)
    if losses.active:
        losses.start(nemesis.plan.lose_for_good)
    lh = await _ledger_round(run, nemesis, shape, "", Race(run.rng))
    await fault_period
    await nemesis.heal()
    await losses.finish(LOSSES_AFTER_HEAL_S)
    await asyncio.sleep(0.6)  # the zombie's last adds settle (an add times out in 0.5 s)
    if lh is not None:
        await _final_ledger_check(run, lh)


async def _race_workload(run: _Run) -> None:
    """Several ledgers, each recovered while its writer is busy, on a lossy network with
    slow links and no crashes but the bookie restarts a race asks for: the interleavings
    of fencing, recovery reads and a live writer's adds (BookKeeper #2614)."""
    rng = run.rng
    faults = run.cluster.network.faults
    faults.drop_probability = rng.choice([0.0, 0.01, 0.03])
    faults.slow_link_probability = 0.2
    faults.lossy_link_probability = 0.1
    nemesis = run.nemesis((3, 3, 2))
    nemesis.plan = NemesisPlan(
        pause_client=rng.random() < 0.3, metadata_slow=nemesis.plan.metadata_slow
    )
    ledgers = []
    for round_no in range(rng.randint(3, 6)):
        race = Race(rng, racing=True)
        shape = (3, 3, 2) if race.pattern or rng.random() < 0.5 else run.shape()
        lh = await _ledger_round(run, nemesis, shape, str(round_no), race)
        if lh is not None:
            ledgers.append(lh)
    await nemesis.heal()
    await asyncio.sleep(0.6)
    for lh in ledgers:
        await _final_ledger_check(run, lh)


class Race:
    """How one ledger round plays out (drawn from the seed)."""

    def __init__(self, rng: random.Random, racing: bool = False) -> None:
        self.first_burst = rng.randint(5, 120) if not racing else rng.randint(0, 20)
        self.close_first = not racing and rng.random() < 0.15
        self.recoverers = rng.randint(1, 3) if not racing else rng.randint(1, 2)
        self.zombie_adds = rng.randint(0, 30) if not racing else rng.randint(10, 60)
        # The writer stalls (a pause shorter than its timeouts) during the recoveries and
        # sends its adds after them. Or it goes quiet with nothing in flight, and starts
        # adding again after the recoveries closed the ledger and, sometimes, after the
        # bookies that fenced it restarted (R7: the fence must survive that).
        self.stalled = rng.random() < (0.3 if not racing else 0.4)
        self.quiet = not self.stalled and rng.random() < 0.3
        self.restart_fenced = (self.stalled or self.quiet) and rng.random() < 0.6
        self.power_loss = rng.random() < 0.5
        self.racing = racing
        self.recovery_delay_ms = rng.uniform(0, 3) if racing else 0.0
        # After the racing entry the writer may stay quiet while the recovery runs, so
        # that no FENCED answer tells it of the recovery before that entry's last ack.
        self.pattern = racing and rng.random() < 0.5
        self.idle_ms = (
            rng.uniform(20, 100) if self.pattern or (racing and rng.random() < 0.5) else 0.0
        )
        # Racing writers send one entry at a time, so one is nearly always in flight;
        # other writers sometimes spread their entries over the faults (ensemble changes).
        self.pace_ms = rng.uniform(0.2, 3) if racing else rng.choice([0.0, 0.0, 2.0, 6.0])
        # Message faults as the recovery starts: a lost fence request (#1067, #2614), a
        # lost add, a slow path from the writer and from the recovery to some bookie.
        # Either each on its own, or together on three bookies X, Y, Z as in #2614: the
        # writer's add lost to X and slow to Y, the recovery's fence of Y lost and its
        # path to Z slow (the entry is then on Z only when the recovery reads it).
        self.lose_fence = racing and rng.random() < 0.5
        self.lose_add = racing and rng.random() < 0.5
        self.slow_writer_ms = rng.uniform(5, 50) if racing and rng.random() < 0.5 else 0.0
        self.slow_recovery_ms = rng.uniform(5, 30) if racing and rng.random() < 0.5 else 0.0


async def _ledger_round(
    run: _Run, nemesis: Nemesis, shape: tuple[int, int, int], tag: str, race: Race
) -> LedgerHistory | None:
    """One ledger: a writer, a tailing reader, concurrent recoveries, a zombie writer."""
    ensemble, write_quorum, ack_quorum = shape
    writer_name = f"writer{tag}"
    writer_bk = run.client(writer_name, nemesis, BookKeeper)
    await _create_refuses_a_bad_shape(run, writer_bk, shape)
    handle = None
    for _ in range(20):
        try:
            handle = await writer_bk.create_ledger(
                ensemble, write_quorum, ack_quorum, password=PASSWORD
            )
            break
        except BKError as exc:
            run.trace(writer_name, "create_ledger failed: %s", exc)
            await asyncio.sleep(0.05)
    if handle is None:
        return None
    lh = LedgerHistory(handle.ledger_id, shape)
    run.history.ledgers.append(lh)
    run.trace(writer_name, "created ledger %d with E=%d Qw=%d Qa=%d", lh.ledger_id, *shape)
    await _LedgerRound(run, nemesis, tag, race, writer_name, handle, lh).play()
    return lh


async def _create_refuses_a_bad_shape(
    run: _Run, bk: BookKeeper, shape: tuple[int, int, int]
) -> None:
    """R1: a creation with Qw > E, or Qa > Qw, fails (before it touches anything)."""
    ensemble, write_quorum, _ = shape
    for bad in ((ensemble, ensemble + 1, 1), (ensemble, write_quorum, write_quorum + 1)):
        try:
            handle = await bk.create_ledger(*bad, password=PASSWORD)
        except InvalidArgumentError:
            continue
        except BKError as exc:
            run.history.wrongly_accepted.append(
                ("R1-shape", f"creating a ledger of shape {bad} failed otherwise: {exc}")
            )
            continue
        run.history.wrongly_accepted.append(
            ("R1-shape", f"ledger {handle.ledger_id} was created with shape {bad}")
        )


class _LedgerRound:
    """The clients of one ledger round, each a method, and the order ``race`` plays
    them in: the writer (later a zombie), a tailing reader, the recoveries."""

    def __init__(
        self,
        run: _Run,
        nemesis: Nemesis,
        tag: str,
        race: Race,
        writer_name: str,
        handle: Any,
        lh: LedgerHistory,
    ) -> None:
        self.run = run
        self.nemesis = nemesis
        self.tag = tag
        self.race = race
        self.writer_name = writer_name
        self.handle = handle
        self.lh = lh
        self.next_id = 0
        self.recoverers = [f"recoverer{tag}-{i}" for i in range(race.recoverers)]
        self.owner = _Owner(random.Random(f"{run.seed}:{tag}:owner"))

    async def play(self) -> None:
        run, race, rng = self.run, self.race, self.run.rng
        tailer = asyncio.ensure_future(self.tail())
        await self.write(race.first_burst)
        intruder = asyncio.ensure_future(self.intrude())
        if not race.racing:
            await _lose_a_change_reply(run, self.writer_name, self.handle, self.tag, self.write)
        if race.quiet:  # nothing in flight: it hears of the recovery only when it adds again
            await _settled(self.handle)
        if race.close_first:
            await self.close_writer()
        if race.racing:
            self.arm_message_faults()
            await self.write(1)  # the racing entry
            await asyncio.sleep(rng.uniform(0.3, 3) / 1000)
        recovering = asyncio.ensure_future(self.recoveries())
        await asyncio.gather(recovering, self.zombie_writes(recovering))
        await tailer
        await intruder

    async def intrude(self) -> None:
        """R10: in some rounds (drawn from a generator of its own), a client that does
        not know the password fences the ledger and overwrites its first entry, on each
        bookie that holds the ledger's key. Every answer must be a refusal; an OK from
        the same bookie process is a violation."""
        run, lh = self.run, self.lh
        rng = random.Random(f"{run.seed}:{self.tag}:intruder")
        if rng.random() >= 0.3:
            return
        await asyncio.sleep(rng.uniform(0, 0.01))
        name = f"intruder{self.tag}"
        pool = run.cluster.network.pool(name)
        key, wrong = master_key(PASSWORD), master_key(b"not the password")
        blob = make_entry(lh.ledger_id, 0, b"intruder", password=b"not the password")
        asked = []
        for address in self.handle.metadata.ensembles[0][1]:
            node = run.cluster.node(address)
            st = node.bookie.state(lh.ledger_id) if node.bookie is not None else None
            if node.state != "up" or st is None or st.master_key != key:
                continue
            for request in (
                AddRequest(0, lh.ledger_id, wrong, [blob]),
                FenceRequest(0, lh.ledger_id, wrong),
            ):
                future = pool.request(address, request, 500)
                asked.append((node, node.incarnation, request, future))
                run.counts["wrong_key_requests"] += 1
        for node, incarnation, request, future in asked:
            try:
                response = await future
            except BKError:
                continue  # lost or timed out: nothing to judge
            if response.status == Status.OK and node.incarnation == incarnation:
                run.history.wrongly_accepted.append(
                    (
                        "R10-password",
                        f"{node.address} accepted a {type(request).__name__} for ledger "
                        f"{lh.ledger_id} with another master key",
                    )
                )

    def confirmed(self, expected: int, future: asyncio.Future[int]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        entry_id = future.result()
        lh = self.lh
        lh.confirmed.append((entry_id, self.run.loop.time(), next(self.run.order)))
        if entry_id != expected:
            self.run.history.system_errors.append(
                f"ledger {lh.ledger_id}: the {expected}th append was confirmed as entry {entry_id}"
            )

    async def write(self, count: int) -> None:
        run, race, handle = self.run, self.race, self.handle
        for _ in range(count):
            payload = _payload(run.seed, self.writer_name, self.next_id)
            try:
                future = handle.append(payload)
            except BKError as exc:
                run.trace(self.writer_name, "append refused: %s", exc)
                return
            self.lh.written[self.next_id] = payload
            future.add_done_callback(functools.partial(self.confirmed, self.next_id))
            give_up_ms = self.owner.give_up_ms()
            if give_up_ms is not None:
                run.loop.call_later(give_up_ms / 1000, self.give_up, self.next_id, future)
            self.next_id += 1
            if race.pace_ms:
                await asyncio.sleep(run.rng.uniform(0, race.pace_ms) / 1000)
            elif handle.outstanding_adds >= 50 or run.rng.random() < 0.3:
                await asyncio.sleep(run.rng.uniform(0, 0.004))

    def give_up(self, entry_id: int, future: asyncio.Future[int]) -> None:
        """The add's owner stops waiting (its ``asyncio.wait_for`` timed out, which
        cancels the future): the entry may or may not end up in the ledger."""
        if not future.done():
            future.cancel()
            self.lh.cancelled.add(entry_id)
            self.run.counts["adds_cancelled"] += 1

    async def tail(self) -> None:
        run, lh = self.run, self.lh
        name = f"tailer{self.tag}"
        reader_bk = run.client(name, self.nemesis, BookKeeper)
        reader = None
        for _ in range(20):
            try:
                reader = await reader_bk.open_ledger_no_recovery(lh.ledger_id, PASSWORD)
                break
            except BKError:
                await asyncio.sleep(0.01)
        if reader is None:
            return
        next_entry = 0
        for _ in range(40):
            await asyncio.sleep(run.rng.uniform(0.001, 0.01))
            try:
                lac = await reader.read_last_add_confirmed()
                if not reader.metadata.is_closed:  # else it is the metadata's last entry
                    lh.lacs.append((name, lac, next(run.order)))
                if lac >= next_entry:
                    for entry in await reader.read_entries(next_entry, lac):
                        lh.reads.append((name, entry.entry_id, entry.data, lac))
                    next_entry = lac + 1
            except BKError:
                continue

    async def recover(self, name: str) -> None:
        run, lh = self.run, self.lh
        bk = run.client(name, self.nemesis, BookKeeper)
        for _ in range(20):
            try:
                rh = await bk.open_ledger(lh.ledger_id, PASSWORD)
            except BKError as exc:
                run.trace(name, "recovery failed: %s", exc)
                await asyncio.sleep(0.05)
                continue
            last = rh.metadata.last_entry_id
            lh.closes.append((name, last, run.loop.time(), next(run.order)))
            run.trace(name, "recovered: ledger %d closed at %d", lh.ledger_id, last)
            if last >= 0:
                with contextlib.suppress(BKError):
                    for entry in await rh.read_entries(0, last):
                        lh.reads.append((name, entry.entry_id, entry.data, None))
            return

    async def close_writer(self, timeout_s: float = 30) -> None:
        run, handle = self.run, self.handle
        if handle.outstanding_adds:
            run.counts["closes_with_adds_in_flight"] += 1
        try:
            await asyncio.wait_for(handle.close(), timeout_s)
        except TimeoutError:
            run.counts["closes_timed_out"] += 1
            run.trace(self.writer_name, "close unanswered in %.3f s: gave up waiting", timeout_s)
            return
        except BKError as exc:
            run.trace(self.writer_name, "close failed: %s", exc)
            return
        last = handle.metadata.last_entry_id
        self.lh.closes.append((self.writer_name, last, run.loop.time(), next(run.order)))
        run.trace(self.writer_name, "closed ledger %d at %d", self.lh.ledger_id, last)

    def arm_message_faults(self) -> None:
        race, rng = self.race, self.run.rng
        net = self.run.cluster.network
        bookies = list(self.handle.ensemble)
        rng.shuffle(bookies)
        pattern = race.pattern and len(bookies) >= 3
        # In the pattern the writer's path to Y is slower than the recovery's fencing.
        slow = race.slow_writer_ms if not pattern else rng.uniform(60, 120)
        writer_slow = (slow, slow * 1.1)
        slow = race.slow_recovery_ms if not pattern else rng.uniform(5, 25)
        recovery_slow = (slow, slow * 1.1)
        if pattern or race.lose_add:
            target = bookies[0] if pattern else rng.choice(bookies)
            net.drop_next(self.writer_name, target, AddRequest)
        if pattern or race.slow_writer_ms:
            target = bookies[1] if pattern else rng.choice(bookies)
            net.set_link(self.writer_name, target, delay_ms=writer_slow)
        for name in self.recoverers:
            if pattern or race.lose_fence:
                target = bookies[1] if pattern else rng.choice(bookies)
                net.drop_next(name, target, FenceRequest)
            if pattern or race.slow_recovery_ms:
                target = bookies[2] if pattern else rng.choice(bookies)
                net.set_link(name, target, delay_ms=recovery_slow)

    async def recoveries(self) -> None:
        await asyncio.sleep(self.race.recovery_delay_ms / 1000)
        await asyncio.gather(*(self.recover(name) for name in self.recoverers))

    async def zombie_writes(self, recovering: asyncio.Future[None]) -> None:
        # The writer keeps adding while others recover; a stalled writer (a long pause)
        # sends them late, after the recoveries, as BookKeeper's zombie writers do.
        run, race = self.run, self.race
        pool = run.cluster.network.pools[self.writer_name]
        if race.stalled:
            pool.pause()
        if race.quiet:
            await asyncio.wait([recovering], timeout=5)
            if race.restart_fenced:
                await _restart_nodes(run, self.handle.ensemble, race.power_loss)
        if race.idle_ms:
            await asyncio.sleep(race.idle_ms / 1000)  # the racing entry is alone in flight
        await self.write(race.zombie_adds)
        close_timeout_s = self.owner.close_timeout_s
        if close_timeout_s is not None:
            await self.close_writer(close_timeout_s)  # adds in flight, recoveries running
        if race.stalled:
            await asyncio.wait([recovering], timeout=run.rng.uniform(0.05, 0.3))
            if race.restart_fenced:
                await _restart_nodes(run, self.handle.ensemble, race.power_loss)
            await asyncio.sleep(run.rng.uniform(0, 0.02))
            pool.resume()


class _Owner:
    """How a writer's owner treats its adds (drawn from a generator of its own, so that
    the seed's other draws stay as they were): in some rounds it gives up on some adds
    after a short wait (a cancelled future, as ``asyncio.wait_for`` leaves it), and
    closes the ledger while adds are in flight and recoveries run, giving up on the
    close too after a timeout."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.give_up_probability = rng.choice([0.0, 0.0, 0.05, 0.3])
        self.close_timeout_s = rng.choice([0.002, 0.05, 30.0]) if rng.random() < 0.2 else None

    def give_up_ms(self) -> float | None:
        if self.give_up_probability and self.rng.random() < self.give_up_probability:
            return self.rng.uniform(0, 4)
        return None


async def _lose_a_change_reply(
    run: _Run,
    writer_name: str,
    handle: Any,
    tag: str,
    write: Callable[[int], Coroutine[Any, Any, None]],
) -> None:
    """C1's schedule, in some rounds: a bookie B of the ensemble acks a few entries and
    dies before the writer's slower links to the others bring their acks, which arrive
    while the writer changes the ensemble; the compare-and-set of its new fragment is
    applied, slowly, with its reply lost (R13). A writer that took that for "not
    written" would confirm those entries from the old write set, counting B's acks,
    though the metadata names B's replacement, which holds none of them. Drawn from a
    generator of its own, so that the seed's other draws stay as they were."""
    rng = random.Random(f"{run.seed}:{tag}:lost change reply")
    store = run.cluster.stores.get(writer_name)
    if rng.random() >= 0.5 or store is None or store.faults is None:
        return
    node = run.cluster.node(rng.choice(list(handle.ensemble)))
    if node.state != "up":
        return
    net = run.cluster.network
    others = [b for b in handle.ensemble if b != node.address]
    links = {b: net.link(writer_name, b).delay_ms for b in others}
    slow_ms = rng.uniform(1, 8)
    for address in others:
        net.set_link(writer_name, address, delay_ms=(slow_ms, slow_ms * 1.2))
    faults = store.faults
    usual = faults.unknown_probability, faults.slow_probability, faults.slow_ms_max
    lost_before = len(faults.unknown)
    faults.unknown_probability, faults.slow_probability, faults.slow_ms_max = 1.0, 1.0, 20.0
    run.trace(writer_name, "slow to all but %s; its next metadata reply will be lost", node.address)
    await write(rng.randint(1, 4))
    await asyncio.sleep(rng.uniform(0.3, 1.5) / 1000)  # B has acked, the others not yet
    node.kill()
    deadline = run.loop.time() + 1.0
    while len(faults.unknown) == lost_before and run.loop.time() < deadline:
        await asyncio.sleep(0.001)
    faults.unknown_probability, faults.slow_probability, faults.slow_ms_max = usual
    for address, delay_ms in links.items():
        net.set_link(writer_name, address, delay_ms=delay_ms)


def _no_answer(response: Any) -> None:
    return None


def _replicas(run: _Run, metadata: Any, wanted: dict[int, bytes]) -> dict[int, int]:
    """How many bookies of each entry's write set (as the metadata records it) hold the
    entry's bytes: read from each bookie's storage directly, the ground truth a client
    cannot see. Bookies the nemesis may damage, or that do not start, count as holding
    (their losses are allowed, or reported as a refused start)."""
    ledger_id = metadata.ledger_id
    out: dict[int, int] = {}
    for entry_id, data in wanted.items():
        ensemble = metadata.ensemble_for(entry_id)
        count = 0
        # R1, as the rule says it (not the system's code): Qw bookies from e mod E on.
        ensemble_size = metadata.ensemble_size
        for index in [(entry_id + i) % ensemble_size for i in range(metadata.write_quorum)]:
            node = run.cluster.node(ensemble[index])
            bookie = node.bookie
            if node.address in run.damageable or node.state == "broken":
                count += 1
                if node.state == "up" and node.disk.bits_flipped:
                    # Its copy may be damaged: it must say so, never "no such entry"
                    # (R9; the node judges the answer).
                    node.receive(ReadRequest(0, ledger_id, entry_id), _no_answer)
                continue
            st = bookie.state(ledger_id) if bookie is not None else None
            if bookie is None or st is None:
                continue
            try:
                blobs = bookie.storage.read_entries(st, entry_id, 1, 1 << 20)
            except (BKError, PowerLoss):
                continue
            if blobs and blobs[0].endswith(data):
                count += 1
        out[entry_id] = count
    return out


async def _settled(handle: Any, timeout_s: float = 5.0) -> None:
    """Until the writer has nothing in flight (every add answered or failed)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while handle.outstanding_adds and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.001)


async def _restart_nodes(run: _Run, addresses: Iterable[str], power_loss: bool) -> None:
    """Restart bookies one after the other (a rolling restart, or a power cut)."""
    for address in addresses:
        node = run.cluster.node(address)
        if node.state != "up":
            continue
        if power_loss:
            node.power_loss()
        else:
            node.kill()
        await node.restart()


async def _final_ledger_check(run: _Run, lh: LedgerHistory) -> None:
    """The checker's part: recover with a client that has no faults, read everything."""
    bk = run.cluster.client("checker", kind=BookKeeper)
    error = ""
    for _ in range(10):
        try:
            rh = await bk.open_ledger(lh.ledger_id, PASSWORD)
            last = rh.metadata.last_entry_id
            entries = await rh.read_entries(0, last) if last >= 0 else []
        except BKError as exc:
            error = _why(exc)
            await asyncio.sleep(0.5)
            continue
        lh.final_last = last
        lh.final_entries = {e.entry_id: e.data for e in entries}
        confirmed = {e for e, _, _ in lh.confirmed if e <= last}
        lh.replicas = _replicas(run, rh.metadata, {e: lh.written[e] for e in confirmed})
        try:
            await rh.read_entries(last + 1, last + 1)
            lh.read_past_end = True
        except NoSuchEntryError:
            pass
        except BKError as exc:
            error = f"reading past the end: {_why(exc)}"
            break
        run.trace(
            "checker",
            "ledger %d ends at %d; %d entries were confirmed (the last %s), %d closes",
            lh.ledger_id,
            last,
            len(lh.confirmed),
            max((e for e, _, _ in lh.confirmed), default="none"),
            len(lh.closes),
        )
        return
    lh.final_error = error


# ---------------------------------------------------------------- log workload


class _LogStreamRun:
    """What the writers and the tailer of one log workload share."""

    def __init__(self, run: _Run, shape: tuple[int, int, int]) -> None:
        rng = run.rng
        ensemble, write_quorum, ack_quorum = shape
        self.run = run
        self.config = LogConfig(
            ensemble=ensemble,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            password=PASSWORD,
            rollover_size_bytes=rng.choice([64, 256, 2048]),
            read_batch_entries=rng.choice([3, 16]),
            long_poll_ms=100,
            rollover_retry_ms=50,
        )
        self.nemesis = run.nemesis(shape)
        self.name = "events"
        self.history = LogHistory(self.name)
        run.history.logs.append(self.history)


async def _log_workload(run: _Run) -> None:
    rng = run.rng
    shape = run.shape()
    stream = _LogStreamRun(run, shape)
    writers = rng.randint(1, 3)
    appends = rng.randint(5, 40)
    stop = asyncio.Event()
    fault_period = asyncio.ensure_future(stream.nemesis.run(rng.uniform(0.02, 0.3)))
    losses = run.lose_and_repair(stream.nemesis, shape)
    if losses.active:
        losses.start(stream.nemesis.plan.lose_for_good)
    tailer = asyncio.ensure_future(_tail_log(stream, stop))
    await asyncio.gather(*(_write_log(stream, f"writer{i}", appends) for i in range(writers)))
    await fault_period
    await stream.nemesis.heal()
    await losses.finish(LOSSES_AFTER_HEAL_S)
    await asyncio.sleep(0.6)
    await _final_log_check(run, stream.history, stream.config)
    await asyncio.sleep(0.3)  # the reader catches up with the final log
    stop.set()
    await tailer


async def _write_log(stream: _LogStreamRun, who: str, appends: int) -> None:
    """One writer: takes the log over, term after term, until ``appends`` were sent."""
    run, history, rng = stream.run, stream.history, stream.run.rng
    records = history.confirmed.setdefault(who, [])
    log = await _open_log(run, run.client(who, stream.nemesis), stream.name, stream.config)
    if log is None:
        return
    sent = 0
    owner = _AppendOwner(random.Random(f"{run.seed}:{who}:append timeouts"))
    for _ in range(30):  # terms: each open takes the log over
        if sent >= appends:
            return
        try:
            writer = await log.open_writer()
        except BKError as exc:
            run.trace(who, "open_writer failed: %s", exc)
            await asyncio.sleep(rng.uniform(0.005, 0.05))
            continue
        run.trace(who, "is the writer")
        try:
            while sent < appends:
                data = _payload(run.seed, who, sent)
                sent += 1
                history.sent[data] = next(run.order)
                wait_s = owner.wait_s()
                try:
                    position = await asyncio.wait_for(writer.append(data), wait_s or STUCK_S)
                except TimeoutError:
                    if not wait_s:
                        raise
                    run.counts["log_appends_timed_out"] += 1
                    continue  # given up on: the record may or may not be in the log
                history.confirmed_at[data] = next(run.order)
                records.append((position, data))
                await asyncio.sleep(rng.uniform(0, 0.003))
        except LogFencedError as exc:
            run.trace(who, "fenced: %s", exc)
        except BKError as exc:
            run.trace(who, "append failed: %s", exc)
        except TimeoutError:
            run.trace(who, "append unanswered for %.0f s: this writer gives up", STUCK_S)
            return
        await asyncio.sleep(rng.uniform(0.005, 0.05))


class _AppendOwner:
    """In some runs a log writer's owner waits only a little for some appends
    (``asyncio.wait_for``, which cancels the append's future) and goes on with the next
    record: from a generator of its own, so that the seed's other draws stay as they
    were."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.probability = rng.choice([0.0, 0.0, 0.1, 0.3])

    def wait_s(self) -> float | None:
        if self.probability and self.rng.random() < self.probability:
            return self.rng.uniform(0.0005, 0.005)
        return None


async def _tail_log(stream: _LogStreamRun, stop: asyncio.Event) -> None:
    """The tailing reader: reads until ``stop``, or its first failure."""
    run = stream.run
    log = await _open_log(run, run.client("tailer", stream.nemesis), stream.name, stream.config)
    reader = None
    while log is not None and reader is None and not stop.is_set():
        try:
            reader = await log.open_reader()
        except BKError:
            await asyncio.sleep(0.02)
    while reader is not None and not stop.is_set():
        try:
            record = await reader.read_next(50)
        except BKError as exc:
            run.trace("tailer", "read failed: %s", exc)
            return  # a reader that fails stops; what it saw stays a prefix
        if record is not None:
            stream.history.tailed.append((record.position, record.data))


async def _open_log(run: _Run, bk: Any, name: str, config: LogConfig) -> Any:
    for _ in range(20):
        try:
            return await LogNamespace(bk).open_log(name, config)
        except BKError as exc:
            run.trace(run.cluster.names.get(id(bk), "client"), "open_log failed: %s", exc)
            await asyncio.sleep(0.02)
    return None


async def _final_log_check(run: _Run, history: LogHistory, config: LogConfig) -> None:
    """The checker's part, with ledger recovery only (not the log code it checks): the
    ledger list as stored, and every listed ledger recovered and read whole."""
    bk = run.cluster.client("checker")
    log = await _open_log(run, bk, history.name, config)
    if log is None:
        history.final_error = "the log could not be opened"
        return
    error = ""
    for _ in range(10):
        try:
            final: list[tuple[Position, bytes]] = []
            confirmed = {p: d for records in history.confirmed.values() for p, d in records}
            for ledger_id in await log.ledgers():
                rh = await bk.open_ledger(ledger_id, config.password)
                last = rh.metadata.last_entry_id
                for entry in await rh.read_entries(0, last) if last >= 0 else []:
                    record = record_of(ledger_id, entry.entry_id, entry.data)
                    final.append((record.position, record.data))
                wanted = {
                    p.entry_id: d
                    for p, d in confirmed.items()
                    if p.ledger_id == ledger_id and p.entry_id <= last
                }
                for entry_id, count in _replicas(run, rh.metadata, wanted).items():
                    history.replicas[Position(ledger_id, entry_id)] = (count, config.ack_quorum)
        except BKError as exc:
            error = _why(exc)
            await asyncio.sleep(0.5)
            continue
        history.final = final
        run.trace("checker", "log %s holds %d records", history.name, len(final))
        return
    history.final_error = error


# ---------------------------------------------------------------- one run


@contextlib.contextmanager
def _quiet_logs(trace: Trace) -> Iterator[None]:
    """quorumlog's log lines go to the trace (with virtual time) or nowhere."""
    logger = logging.getLogger("quorumlog")
    saved = (logger.level, logger.propagate, list(logger.handlers))

    class ToTrace(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            trace("log", "%s %s: %s", record.levelname, record.name, record.getMessage())

    logger.handlers = [ToTrace()] if trace.enabled else []
    logger.propagate = False
    logger.setLevel(logging.INFO if trace.enabled else logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        logger.handlers = saved[2]


def _on_loop_error(run: _Run) -> Any:
    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if exc is None or isinstance(exc, PowerLoss | BKError | asyncio.CancelledError):
            return  # a dead process's leftovers, or an error a caller chose not to await
        where = context.get("message", "")
        run.history.system_errors.append(f"{where}: {_why(exc)}")
        run.trace("system", "UNEXPECTED %s: %s", where, _why(exc))

    return handler


async def _main(run: _Run) -> None:
    run.cluster = cluster = Cluster(
        run.loop, run.cluster_rng, network_faults=run.network_faults, trace=run.trace
    )
    await cluster.start()
    workload = run.rng.choice(WORKLOADS)
    run.history.workload = workload
    run.trace("run", "seed %d: %s workload", run.seed, workload)
    try:
        if workload == "ledger":
            await _ledger_workload(run)
        elif workload == "race":
            await _race_workload(run)
        else:
            await _log_workload(run)
    finally:
        run.history.system_errors += [
            f"{n.address}: {message}" for n in cluster.nodes for message in n.broken_invariants
        ]
        run.history.wrongly_accepted += [
            ("R9-absence", message) for n in cluster.nodes for message in n.false_absences[:1]
        ]
        if run.losses is not None:
            run.history.system_errors += run.losses.errors
        run.history.refused_starts += [
            f"{n.address} refused to start though its disk lost no synced byte: {n.start_error}"
            for n in cluster.nodes
            if n.state == "broken" and n.address not in _flipped(cluster)
        ]
        await cluster.close()


def _flipped(cluster: Cluster) -> set[str]:
    return {n.address for n in cluster.nodes if n.disk.bits_flipped}


def run_seed(seed: int, *, trace: bool = False) -> RunHistory:
    """One seeded run on a fresh virtual-time loop; never raises for what the system did."""
    loop = VirtualTimeLoop()
    tracer = Trace(loop, trace)
    run = _Run(seed, loop, tracer)
    loop.set_exception_handler(_on_loop_error(run))
    try:
        with _quiet_logs(tracer):
            loop.run_until_complete(asyncio.wait_for(_main(run), BUDGET_S))
    except TimeoutError:
        run.history.unfinished = f"the run did not finish within {BUDGET_S:.0f} virtual seconds"
    except Exception as exc:  # the system's exception, reported with its seed
        run.history.system_errors.append(f"the run raised {_why(exc)}")
    finally:
        virtual_s = loop.time()
        _stop_everything(loop)
        loop.close()
    run.history.faults = dict(_counts(run))
    run.history.virtual_s = virtual_s
    run.history.trace = tracer.lines
    return run.history


def _stop_everything(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what is left of the run (a zombie writer's tasks, parked reads)."""
    for _ in range(3):
        tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
        if not tasks:
            break
        for task in tasks:
            task.cancel()
        with contextlib.suppress(BaseException):
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    with contextlib.suppress(Exception):
        loop.run_until_complete(loop.shutdown_asyncgens())


def _counts(run: _Run) -> dict[str, int]:
    if not hasattr(run, "cluster"):
        return {}
    nodes = run.cluster.nodes
    counts: Counter[str] = Counter()
    for nemesis in run.nemeses:
        counts.update(nemesis.counts)
    if run.losses is not None:
        counts.update(run.losses.counts)
    counts.update(run.counts)
    client_stores = list(run.cluster.stores.values())
    for store in client_stores + [n.gc_store for n in nodes if n.gc_store is not None]:
        faults = store.faults
        if faults is not None:
            counts["metadata_failed"] += faults.failed
            for what in faults.unknown:
                counts[f"metadata_unknown_{what.split(' ', 1)[0]}"] += 1
    for store in client_stores:
        if store.stale is not None:
            counts["stale_client_reads"] += store.stale.stale_reads
            counts["late_watch_events"] += store.stale.late_events
    return {
        **counts,
        "crashes": sum(n.crashes for n in nodes),
        "restarts": sum(n.restarts for n in nodes),
        "power_losses": sum(n.disk.power_losses for n in nodes),
        "syncs_failed": sum(n.disk.syncs_failed for n in nodes),
        "bits_flipped": sum(n.disk.bits_flipped for n in nodes),
        "bookies_lost_for_good": sum(n.lost_for_good for n in nodes),
        "stale_gc_reads": sum(
            n.gc_store.stale.stale_reads
            for n in nodes
            if n.gc_store is not None and n.gc_store.stale is not None
        ),
        "requests": run.cluster.network.requests_delivered,
    }
