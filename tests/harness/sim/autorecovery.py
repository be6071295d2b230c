"""Bookies lost for good, and autorecovery putting their copies back, in one run.

A bookie lost for good (its machine gone) takes its copies with it. What a cluster
does about it is autorecovery (``quorumlog/replication/``): the auditor sees that a
bookie some ledger names is no longer registered and marks those ledgers
under-replicated; replication workers claim the marks, copy the lost bookie's
share of each fragment to a replacement and compare-and-set the ensemble; an open
ledger's last fragment is left to its writer (its ensemble change, R5) until a
grace period ends, when the worker fences and closes the ledger (R7, R8).

:class:`Losses` drives that, next to a workload's writer and recoveries:

- the loss itself, when the nemesis plan has none of its own: a bookie lost for good
  at a drawn moment; either way its registration expires with its session, so
  placement stops choosing it and the auditor sees it lost;
- autorecovery daemons as ``quorumlog autorecovery`` runs them: each with a metadata
  session of its own (the run's metadata faults and, in some runs, a lagging server),
  a replication worker, and, on the first daemon, the auditor; a daemon whose session
  expires starts again with a new one, as the real daemon does (some runs expire
  one: its locks go with it, and another worker may take the ledger over);
- a second loss once the system says the first is repaired: an operator's client
  finds no under-replicated mark left and no ledger naming the lost bookie
  (:func:`~quorumlog.replication.decommission.ledgers_naming`, which syncs first, R18).
  Only then may a second bookie go: every confirmed entry then still has a sound copy
  (the fault model of docs/TESTING.md). A system that says so too early loses
  confirmed entries, and the checkers say which (R8-durability, R3-replicas).

Everything is drawn from a generator of its own (``"<seed>:losses"``), so the seed's
other draws stay as they were.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quorumlog.errors import BKError
from quorumlog.meta.store import SessionState
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.replication.auditor import Auditor, AuditorConfig, AuditorStats
from quorumlog.replication.decommission import ledgers_naming
from quorumlog.replication.worker import ReplicationWorker, WorkerConfig, WorkerStats
from quorumlog.testing.sim.cluster import BookieNode
from tests.harness.sim.nemesis import REGISTRATION_EXPIRY_S, Nemesis

__all__ = ["LossPlan", "Losses"]

# How often the operator looks whether the first loss is repaired (virtual seconds).
_OPERATOR_POLL_S = 0.05
# A daemon's pause before it starts again (the real one waits a second).
_RESTART_PAUSE_S = 0.05
# How long a daemon told to stop may take to stop its worker and auditor.
_STOP_S = 5.0


@dataclass
class LossPlan:
    """What one run loses for good, and what repairs it (drawn from its seed)."""

    first_at_ms: float | None = None  # a loss of this plan's own, at this time
    autorecovery: bool = False
    daemons: int = 1
    # How long an open ledger's writer may keep a fragment on the lost bookie before a
    # worker fences and closes the ledger (openLedgerRereplicationGracePeriod).
    grace_s: float = math.inf
    expire_daemon_at_ms: float | None = None  # a daemon's session expires then
    second_loss: bool = False

    @classmethod
    def draw(
        cls,
        rng: random.Random,
        shape: tuple[int, int, int],
        planned_loss: bool,
        allowed: bool,
    ) -> LossPlan:
        """``planned_loss``: the nemesis plan loses a bookie already; ``allowed``: the
        fault model lets this run lose one (Qa >= 2, E <= 3, nothing else destroying
        synced bytes, not a calm run)."""
        ensemble, _, ack_quorum = shape
        plan = cls()
        if not allowed or ack_quorum < 2 or ensemble > 3:
            return plan
        if not planned_loss:
            if rng.random() >= 0.15:
                return plan
            plan.first_at_ms = rng.uniform(5, 300)
        if rng.random() < 0.7:
            plan.autorecovery = True
            plan.daemons = rng.choice([1, 1, 2])
            plan.grace_s = rng.choice([0.0, 0.05, 0.3, math.inf])
            if rng.random() < 0.3:
                plan.expire_daemon_at_ms = rng.uniform(5, 600)
            plan.second_loss = rng.random() < 0.6
        return plan

    def kinds(self) -> list[str]:
        out = []
        if self.first_at_ms is not None:
            out.append("loss")
        if self.autorecovery:
            out.append(f"autorecovery x{self.daemons} (grace {self.grace_s} s)")
        if self.expire_daemon_at_ms is not None:
            out.append("daemon session expiry")
        if self.second_loss:
            out.append("second loss")
        return out


class _Daemon:
    """One autorecovery process: sessions one after another, each with a worker and,
    on the first daemon, the auditor (as ``quorumlog.replication.autorecovery``)."""

    def __init__(self, losses: Losses, index: int) -> None:
        self.losses = losses
        self.index = index
        self.sessions = 0
        self.bk: Any = None
        self.worker_stats = WorkerStats()
        self.auditor_stats = AuditorStats()
        self.stopped = asyncio.Event()

    async def run(self) -> None:
        while not self.stopped.is_set():
            await self._session()
            if not self.stopped.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopped.wait(), _RESTART_PAUSE_S)

    async def _session(self) -> None:
        losses = self.losses
        self.sessions += 1
        name = f"autorecovery{self.index}.{self.sessions}"
        bk = self.bk = losses.client(name)
        lost = asyncio.Event()

        def on_session(state: SessionState) -> None:
            if state is SessionState.LOST:
                lost.set()

        bk.store.add_session_listener(on_session)
        clock = losses.loop.time
        worker = ReplicationWorker(
            bk,
            name,
            WorkerConfig(
                open_ledger_grace_s=losses.plan.grace_s,
                retry_backoff_s=0.05,
                poll_interval_s=0.1,
                password=losses.password,
            ),
            rng=random.Random(losses.rng.random()),
            stats=self.worker_stats,
            clock=clock,
        )
        tasks = [asyncio.ensure_future(self._again_on_error(worker.run))]
        if self.index == 0:
            auditor = Auditor(
                bk,
                name,
                AuditorConfig(
                    audit_interval_s=1e9, bookie_check_interval_s=0.2, password=losses.password
                ),
                rng=random.Random(losses.rng.random()),
                stats=self.auditor_stats,
                clock=clock,
            )
            tasks.append(asyncio.ensure_future(self._again_on_error(auditor.run)))
        waits = [asyncio.ensure_future(self.stopped.wait()), asyncio.ensure_future(lost.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in [*waits, *tasks]:
                task.cancel()
            await asyncio.gather(*waits, *tasks, return_exceptions=True)
        if lost.is_set():
            losses.trace(name, "metadata session lost: autorecovery starts again")
        with contextlib.suppress(BKError):
            await bk.close()

    async def _again_on_error(self, run: Callable[[], Any]) -> None:
        """An auditor's or a worker's loop, again after a pause when it fails (a store
        hiccup must not stop autorecovery)."""
        while True:
            try:
                await run()
                return
            except BKError as exc:
                self.losses.trace(f"autorecovery{self.index}", "failed, again soon: %s", exc)
            await asyncio.sleep(_RESTART_PAUSE_S)


class Losses:
    """Losses for good and autorecovery in one run; see the module docstring."""

    def __init__(
        self,
        nemesis: Nemesis,
        plan: LossPlan,
        rng: random.Random,
        client: Callable[[str], Any],
        damageable: set[str],
        password: bytes,
        max_lag_s: float,
    ) -> None:
        self.nemesis = nemesis
        self.cluster = nemesis.cluster
        self.loop = nemesis.loop
        self.trace = nemesis.trace
        self.plan = plan
        self.rng = rng
        self.client = client  # a new client with the run's faults, by name
        self.damageable = damageable  # the run's: bookies that may lose synced bytes
        self.password = password
        self.max_lag_s = max_lag_s  # how far a client's server may lag (StaleReads)
        self.counts: Counter[str] = Counter()
        self.daemons = [_Daemon(self, i) for i in range(plan.daemons if plan.autorecovery else 0)]
        self._daemon_tasks: list[asyncio.Task[None]] = []
        self._task: asyncio.Task[None] | None = None
        self.lost: list[tuple[str, float]] = []  # (bookie, when) of each loss for good
        self.errors: list[str] = []  # what autorecovery did that it must not (system errors)
        nemesis.on_lost.append(self._lost)

    @property
    def active(self) -> bool:
        plan = self.plan
        return plan.first_at_ms is not None or plan.autorecovery

    def _lost(self, node: BookieNode) -> None:
        self.damageable.add(node.address)
        self.lost.append((node.address, self.loop.time()))

    def start(self, planned: str | None) -> None:
        """Start the daemons and the losses; ``planned``: the nemesis plan's own loss."""
        self._daemon_tasks = [asyncio.ensure_future(d.run()) for d in self.daemons]
        if self.plan.expire_daemon_at_ms is not None and self.daemons:
            self.loop.call_later(self.plan.expire_daemon_at_ms / 1000, self._expire_a_daemon)
        self._task = asyncio.ensure_future(self._run(planned))

    async def _run(self, planned: str | None) -> None:
        plan = self.plan
        if plan.first_at_ms is not None:
            await asyncio.sleep(plan.first_at_ms / 1000)
            if not self.lost:
                self.nemesis.lose(self.rng.choice(self.cluster.nodes), "LOST FOR GOOD")
        elif planned is None:
            return
        while not self.lost:  # the nemesis plan's loss, when its turn comes
            await asyncio.sleep(0.005)
        if not plan.second_loss:
            return
        operator = self.client("operator")
        first, lost_at = self.lost[0]
        await self._repaired(operator, first, lost_at)
        candidates = [n for n in self.cluster.nodes if not n.lost_for_good and n.state != "broken"]
        if not candidates:
            return
        self.counts["second_losses"] += 1
        node = self.rng.choice(candidates)
        self.nemesis.lose(node, f"LOST FOR GOOD too ({first} was repaired)")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._repaired(operator, node.address, self.loop.time()), 2.0)

    async def _repaired(self, operator: Any, bookie: str, lost_at: float) -> None:
        """Until the system says ``bookie`` is no longer needed: no mark is left and no
        ledger names it, as the operator's client reads the store, twice in a row a
        lagging server's bound apart; and not before every client's server has seen
        the bookie's registration go (then no placement chooses it again)."""
        marks = UnderReplicationManager(operator.store)
        settled = lost_at + REGISTRATION_EXPIRY_S + self.max_lag_s
        since: float | None = None
        while True:
            await asyncio.sleep(_OPERATOR_POLL_S)
            try:
                done = not await marks.marked_ledgers() and not await ledgers_naming(
                    operator, bookie
                )
            except BKError:
                continue
            now = self.loop.time()
            if not done:
                since = None
            elif since is None:
                since = now
            elif now - since >= self.max_lag_s and now >= settled:
                self.trace("operator", "%s is repaired: no ledger names it", bookie)
                return

    async def _stop_daemons(self) -> None:
        """Told to stop, a daemon cancels its worker and auditor and waits for them, as
        the real daemon does when its session is lost. One that is still running after
        ``_STOP_S`` is a defect of its own (a loop that swallowed its cancellation): it
        is reported, and cancelled again until it ends, so that the run goes on."""
        tasks = self._daemon_tasks
        if not tasks:
            return
        _, running = await asyncio.wait(tasks, timeout=_STOP_S)
        if running:
            self.errors.append(
                f"autorecovery: {len(running)} daemon(s) still running {_STOP_S:.0f} s after "
                "being told to stop (a worker or auditor kept running after its cancellation)"
            )
        for _ in range(100):
            if not running:
                break
            for task in running:
                task.cancel()
            _, running = await asyncio.wait(running, timeout=0.5)

    def _expire_a_daemon(self) -> None:
        daemon = self.rng.choice(self.daemons)
        if daemon.bk is not None and not daemon.stopped.is_set():
            daemon.bk.store.expire()
            self.counts["autorecovery_sessions_expired"] += 1
            self.trace("metadata", "session of autorecovery%d EXPIRED", daemon.index)

    async def finish(self, timeout_s: float) -> None:
        """Let the losses and repairs go on for up to ``timeout_s`` (the faults healed),
        then stop the daemons."""
        if self._task is None:
            return
        if self.lost or self.plan.first_at_ms is not None:
            # (else the nemesis plan's loss never came: there is nothing to wait for)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        for daemon in self.daemons:
            daemon.stopped.set()
        await self._stop_daemons()
        for daemon in self.daemons:
            stats = daemon.worker_stats
            self.counts["rereplicated_ledgers"] += stats.ledgers_repaired
            self.counts["rereplicated_fragments"] += stats.fragments_copied
            self.counts["rereplicated_entries"] += stats.entries_copied
            # a ledger's last fragment left to its live writer while the rest was copied
            self.counts["rereplications_deferred_to_writer"] += stats.ledgers_deferred
            self.counts["ledgers_marked"] += daemon.auditor_stats.ledgers_marked
            self.counts["autorecovery_sessions"] += daemon.sessions
