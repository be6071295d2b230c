"""The autorecovery daemon: an auditor candidate and a replication worker in one process.

Every autorecovery process (``quorumlog autorecovery``, or one inside a bookie with
``quorumlog bookie --autorecovery``) joins the auditor election; the leader runs the
:class:`~quorumlog.replication.auditor.Auditor`, and every process runs a
:class:`~quorumlog.replication.worker.ReplicationWorker`. When the leader dies or is
cut off, its election node goes with its session and the next candidate audits.

The client's metadata session holds the worker's locks and the auditor's published
name. If that session is lost (LOST is final for a store), the daemon stops both,
closes the client and starts again with a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from quorumlog.client.bookkeeper import BookKeeper
from quorumlog.client.config import ClientConfig
from quorumlog.errors import BKError
from quorumlog.meta.store import SessionState
from quorumlog.meta.underreplication import AUDITOR_ELECTION_GROUP
from quorumlog.recipes.election import LeaderElection
from quorumlog.replication.auditor import Auditor, AuditorConfig, AuditorStats
from quorumlog.replication.waiting import wait_event
from quorumlog.replication.worker import ReplicationWorker, WorkerConfig, WorkerStats
from quorumlog.security.tls import TlsFiles

log = logging.getLogger(__name__)

_RECONNECT_PAUSE_S = 1.0
# How long a new auditor waits for the one this process stopped before it (its
# unpublish), when leadership is lost and regained at once.
_PREVIOUS_AUDITOR_WAIT_S = 30.0


@dataclass
class AutoRecoveryConfig:
    auditor: AuditorConfig = field(default_factory=AuditorConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    # The election's session: how long a frozen or cut-off auditor keeps its place.
    election_session_timeout_ms: int = 4_000
    # The client's session: how long a dead worker's locks outlive it.
    metadata_session_timeout_ms: int = 4_000
    run_worker: bool = True
    run_auditor: bool = True
    # How the daemon's client reaches bookies that check (docs/SECURITY.md): TLS files,
    # and the token file (a ``bookie`` role; None: QUORUMLOG_TOKEN, if set).
    tls: TlsFiles | None = None
    token_file: str | None = None


class AutoRecovery:
    """Run with ``await daemon.run()`` until cancelled or :meth:`stop`."""

    def __init__(
        self,
        metadata_uri: str,
        config: AutoRecoveryConfig | None = None,
        *,
        identifier: str | None = None,
    ) -> None:
        self.metadata_uri = metadata_uri
        self.config = config or AutoRecoveryConfig()
        self.identifier = identifier or f"{socket.gethostname()}:{os.getpid()}"
        self.worker: ReplicationWorker | None = None
        self.auditor: Auditor | None = None
        self.is_auditor = False
        # The client of the current session (None between sessions): the admin API
        # reads the metadata store through it.
        self.bk: BookKeeper | None = None
        # One count for the process: each session's worker and auditor add to them.
        self.worker_stats = WorkerStats()
        self.auditor_stats = AuditorStats()
        self.sessions_started = 0
        self._stop = asyncio.Event()
        self.started = asyncio.Event()
        # Auditor tasks cancelled and not yet ended (still unpublishing, say).
        self._auditors_stopping: set[asyncio.Task[None]] = set()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        while not self._stop.is_set():
            try:
                await self._session()
            except BKError as exc:
                log.warning("autorecovery: %s; starting again", exc)
            if not self._stop.is_set():
                await wait_event(self._stop, _RECONNECT_PAUSE_S)

    async def _session(self) -> None:
        client_config = ClientConfig(
            metadata_session_timeout_ms=self.config.metadata_session_timeout_ms,
            # The auditor's policy is the workers' too: targets that mend what it marks.
            placement=self.config.auditor.placement,
            min_racks_per_write_quorum=self.config.auditor.min_racks_per_write_quorum,
            tls=self.config.tls,
            token_file=self.config.token_file,
        )
        bk = await BookKeeper.connect(self.metadata_uri, config=client_config)
        self.bk = bk
        self.sessions_started += 1
        lost = asyncio.Event()

        def on_session(state: SessionState) -> None:
            if state is SessionState.LOST:
                lost.set()

        bk.store.add_session_listener(on_session)
        tasks: set[asyncio.Task[None]] = set()
        auditor_task: list[asyncio.Task[None]] = []
        election: LeaderElection | None = None
        try:
            if self.config.run_worker:
                tasks.add(self._start_worker(bk))
            if self.config.run_auditor:
                election = self._auditor_election(bk, auditor_task)
                await election.start()
            self.started.set()
            await self._until_stopped_or_lost(lost)
        finally:
            await self._end_session(bk, election, tasks, auditor_task)

    def _start_worker(self, bk: BookKeeper) -> asyncio.Task[None]:
        worker = ReplicationWorker(bk, self.identifier, self.config.worker, stats=self.worker_stats)
        self.worker = worker
        return asyncio.get_running_loop().create_task(self._again_on_error("worker", worker.run))

    def _auditor_election(
        self, bk: BookKeeper, auditor_task: list[asyncio.Task[None]]
    ) -> LeaderElection:
        """The auditor election to join; its leader runs an auditor in ``auditor_task``."""
        return LeaderElection(
            bk,
            AUDITOR_ELECTION_GROUP,
            identifier=self.identifier,
            session_timeout_ms=self.config.election_session_timeout_ms,
            on_gain=lambda: self._become_auditor(bk, auditor_task),
            on_loss=lambda: self._stop_auditing(auditor_task),
        )

    def _become_auditor(self, bk: BookKeeper, auditor_task: list[asyncio.Task[None]]) -> None:
        self.is_auditor = True
        auditor = Auditor(bk, self.identifier, self.config.auditor, stats=self.auditor_stats)
        self.auditor = auditor
        previous = set(self._auditors_stopping)
        task = asyncio.get_running_loop().create_task(self._audit_after(previous, auditor))
        auditor_task.append(task)

    async def _audit_after(self, previous: set[asyncio.Task[None]], auditor: Auditor) -> None:
        """Run ``auditor`` once the auditors this process stopped before it have ended.

        Leadership lost and regained at once: the old auditor is still unpublishing,
        and its node and the new one's carry the same identifier, so an unpublish after
        the new auditor published would delete the new node (whoisauditor: nobody)."""
        if previous:
            _, late = await asyncio.wait(previous, timeout=_PREVIOUS_AUDITOR_WAIT_S)
            if late:
                log.warning(
                    "autorecovery (%s): the previous auditor has not stopped after %.0f s; "
                    "auditing anyway",
                    self.identifier,
                    _PREVIOUS_AUDITOR_WAIT_S,
                )
        await self._again_on_error("auditor", auditor.run)

    def _stop_auditing(self, auditor_task: list[asyncio.Task[None]]) -> None:
        self.is_auditor = False
        while auditor_task:
            task = auditor_task.pop()
            task.cancel()
            if not task.done():
                self._auditors_stopping.add(task)
                task.add_done_callback(self._auditors_stopping.discard)

    async def _until_stopped_or_lost(self, lost: asyncio.Event) -> None:
        waits = [
            asyncio.ensure_future(self._stop.wait()),
            asyncio.ensure_future(lost.wait()),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        if lost.is_set():
            log.warning("autorecovery: metadata session lost; reconnecting")

    async def _end_session(
        self,
        bk: BookKeeper,
        election: LeaderElection | None,
        tasks: set[asyncio.Task[None]],
        auditor_task: list[asyncio.Task[None]],
    ) -> None:
        """Stops the auditor and the worker, leaves the election, closes the client."""
        self._stop_auditing(auditor_task)
        for task in tasks:
            task.cancel()
        if election is not None:
            with contextlib.suppress(BKError):
                await election.close()
        for task in [*tasks]:
            with contextlib.suppress(asyncio.CancelledError, BKError):
                await task
        self.bk = None
        with contextlib.suppress(BKError):
            await bk.close()

    async def _again_on_error(self, what: str, run: Callable[[], Awaitable[None]]) -> None:
        """Run an auditor or a worker loop, again after a pause when it fails: a store
        hiccup or one bad ledger must not stop autorecovery."""
        while True:
            try:
                await run()
                return
            except BKError as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    # Cancelled (the session was lost) in the turn the call failed:
                    # Python 3.11's wait_for hands back the failure and drops the cancel.
                    raise asyncio.CancelledError from exc
                log.warning(
                    "autorecovery %s (%s): %s; again in %.0f s",
                    what,
                    self.identifier,
                    exc,
                    _RECONNECT_PAUSE_S,
                )
            await asyncio.sleep(_RECONNECT_PAUSE_S)
