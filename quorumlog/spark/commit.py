"""Exactly-once writes of a Spark job into a log, with no pyspark in sight.

How a write goes (see docs/SPARK.md):

1. Each task writes its rows into a ledger of its own, closes it, and reports
   ``(ledger id, rows)`` to the driver. Nothing in the log refers to it yet, so
   a task that fails, or a job that is aborted, leaves no record in the log.
2. The driver's commit appends the tasks' ledgers to the log's ledger list in one
   compare-and-set, in partition order, after fencing the ledgers a writer may
   still hold (the sink takes the log over as ``open_writer`` does, R11), and
   after checking that each of them is closed, holds the rows its task reported
   and carries this write's tag. A streaming sink records the batch id in the
   same compare-and-set, so a batch that Spark runs again after a restart is
   recognised and not appended twice; its sinkId belongs to one query.
3. Ledgers that did not make it (failed or duplicate task attempts, aborted jobs,
   replayed batches) are deleted.

Two details make this work:

- *Order.* A log's ledger ids must grow along its list (positions compare as
  ``(ledger id, entry id)``), but tasks create their ledgers in any order. So the
  first task of a stage reserves a block of ledger ids for the whole stage, and
  task ``p`` uses the ids of slot ``p`` in it: ids then grow with the partition
  whatever order tasks run in, and each attempt of a task has an id of its own.
- *Orphans.* Spark may hand ``abort`` a ``None`` even for tasks that succeeded,
  and a killed task reports nothing. So a task registers its ledger id under
  ``/spark-staging/<write token>/`` before creating the ledger; the driver's
  commit or abort deletes every registered ledger that is not in the log. A
  streaming write's token names its query and batch, so that no other query's
  or batch's clean-up touches its ledgers.
- *Stragglers.* Spark runs the driver's abort while tasks of the failed job may
  still run (killing them takes time). A batch write's staging is opened by the
  driver before any task, and a task never creates it: one that asks for its
  ledger id after the clean-up finds no staging and fails. The clean-up deletes a
  registration before the ledger, and a task checks its registration after
  creating its ledger, so a ledger created after the clean-up looked for it is
  deleted by its own task (:func:`create_task_ledger`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial

from quorumlog.client.bookkeeper import BookKeeper
from quorumlog.client.reading import gather_in_order
from quorumlog.client.writing import LedgerHandle
from quorumlog.core.log_metadata import decide_commit_staged
from quorumlog.core.orphans import SPARK_SINK, TAG_SPARK_WRITE, ownership_tags
from quorumlog.errors import (
    BKError,
    InvalidArgumentError,
    MetadataError,
    NodeExistsError,
    NoNodeError,
    NoSuchLedgerError,
)
from quorumlog.log.config import LogConfig
from quorumlog.log.errors import LogFencedError, LogOutcomeUnknownError, NoSuchLogError
from quorumlog.log.log import Log
from quorumlog.log.metadata import (
    LogMetadata,
    create_log_if_absent,
    log_node_name,
    read_log,
)
from quorumlog.log.metadata_updates import LogUpdate, LogUpdated, log_view
from quorumlog.log.writer import fence_previous_ledgers
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.meta.ledgers import MetadataConflictsError

log = logging.getLogger(__name__)

STAGING_PATH = "/spark-staging"
# Ledger ids per partition: one per attempt of its task (across stage retries).
SLOTS_PER_PARTITION = 64
COMMIT_CAS_ATTEMPTS = 20
STAGED_READS_IN_FLIGHT = 32
# Staging left by a driver that died mid-write is swept by a later commit to the same
# log once nothing in it has shown life for this long: its header (the driver that
# opened it, the commit that marked it) and every task registration carry the time
# they last showed life, and a task refreshes its registration every
# STAGING_HEARTBEAT_S while it writes. A write's age does not count, only its silence.
STALE_STAGING_MS = 24 * 3600 * 1000
STAGING_HEARTBEAT_S = 600.0
# A staging with no ledger registered yet holds nothing to reclaim but its node: a batch
# job may run long stages before its write tasks start, so it is swept only after this.
STALE_EMPTY_STAGING_MS = 7 * 24 * 3600 * 1000
# How long a commit keeps re-reading the log to learn whether a compare-and-set whose
# answer was lost was applied (R13), before it says that it cannot tell; and how many
# unknown outcomes or failed reads in a row it takes (reads back off to one a second).
COMMIT_TIMEOUT_S = 120.0
COMMIT_RESOLVE_ATTEMPTS = 125
# How long the clean-up after a commit's compare-and-set may take before the commit
# returns (checked between ledgers; the rest is left registered for a later clean-up).
CLEAN_UP_TIMEOUT_S = 60.0
# A staging child that says a compare-and-set of this write may have been sent: while
# it is there, only a clean-up that read the log after the outcome was known deletes.
COMMIT_MARKER = "commit"
# /spark-sinks/<log>/<log created_ms>/<sinkId>: the streaming query a sinkId belongs to
# (a log deleted and created again starts with no owners).
SINKS_PATH = "/spark-sinks"
# Tags of a task's ledger: which write, log and partition it was written for.
TAG_WRITE = TAG_SPARK_WRITE
TAG_LOG = "log"
TAG_PARTITION = "spark.partition"


class CommitOutcomeUnknownError(LogOutcomeUnknownError):
    """The commit's compare-and-set may or may not have been applied, and reading the log
    did not tell (it could not be read, or what it shows proves neither): the rows may
    be in the log. Nothing was deleted."""


class CommitTimeoutError(BKError):
    """The commit did not reach its compare-and-set within its time (a metadata store or
    bookies too slow to answer): nothing was appended, and the write can be retried."""


class WriteEndedError(BKError):
    """The driver already committed or aborted the write this task belongs to (the
    task straggled behind its job): its rows are not kept, and it left no ledger."""


class StagedLedgerError(BKError):
    """A ledger a task reported is not what the commit may append: gone, still open,
    with other rows, or written for another write. Nothing was appended."""


@dataclass(frozen=True, slots=True)
class SinkBatch:
    """A streaming commit: the sink (named by the sinkId option), the query that owns
    it (Spark's query id, kept across restarts in the checkpoint) and the batch."""

    sink_id: str
    query_id: str
    batch_id: int


@dataclass(frozen=True, slots=True)
class TaskResult:
    """What a write task reports: its partition, its ledger (None: it had no rows)."""

    partition: int
    ledger_id: int | None
    rows: int
    # A streaming task's query (Spark's query id): the driver's commit learns it here.
    query_id: str | None = None


@dataclass(frozen=True, slots=True)
class CommitOutcome:
    """What a commit did: the ledgers appended (in order) and the rows they hold;
    ``replayed`` when the batch was already in the log and nothing was appended."""

    appended: tuple[int, ...]
    rows: int
    replayed: bool
    deleted: tuple[int, ...]


def new_write_token() -> str:
    """The staging name of one batch write (its writer object travels pickled to
    every task and to the commit, so one random name serves the whole job)."""
    return uuid.uuid4().hex


def stream_token(query_id: str, batch_id: int) -> str:
    """The staging name of one micro-batch of one streaming query. Spark makes a new
    writer object for each micro-batch, so the name follows from what both the tasks
    and the driver's commit know; a batch that Spark runs again after a restart has
    the same name, so its commit also clears what the first run left. Scoped so: a
    batch's clean-up never touches another batch's or another query's ledgers."""
    safe = "".join(c for c in query_id if c.isalnum() or c == "-")
    if not safe or batch_id < 0:
        raise InvalidArgumentError(f"not a streaming query id and batch: {query_id!r}, {batch_id}")
    return f"stream.{safe}.{batch_id}"


def query_of(results: Sequence[TaskResult | None]) -> str | None:
    """The streaming query the tasks' reports name (None: no report names one)."""
    queries = {r.query_id for r in results if r is not None and r.query_id is not None}
    if len(queries) > 1:
        raise InvalidArgumentError(f"one streaming batch's tasks name several queries: {queries}")
    return queries.pop() if queries else None


def ledger_tags(log_name: str, token: str, partition: int) -> dict[str, bytes]:
    """The custom metadata of a task's ledger, checked by the commit before it appends."""
    return {
        **ownership_tags(SPARK_SINK, log_name),
        TAG_WRITE: token.encode(),
        TAG_PARTITION: str(partition).encode(),
    }


def staging_path(token: str) -> str:
    return f"{STAGING_PATH}/{token}"


def _now_ms() -> int:
    return int(time.time() * 1000)


def _registration(partition: int) -> bytes:
    """A task's registration: its partition, and when it last showed life."""
    return json.dumps({"partition": partition, "alive_ms": _now_ms()}).encode()


def _alive_ms(data: bytes) -> int | None:
    """When the writer of a staging node last showed life (None: the node does not say)."""
    try:
        record = json.loads(data)
        return int(record["alive_ms"]) if isinstance(record, dict) else None
    except (ValueError, KeyError, TypeError):
        return None


async def prepare_log(bk: BookKeeper, name: str) -> None:
    """Create the log if it does not exist (a sink, like ``open_log``, creates on first use)."""
    await create_log_if_absent(bk.store, name)


# ---------------------------------------------------------------- tasks


async def task_ledger_id(
    bk: BookKeeper,
    token: str,
    log_name: str,
    stage_key: str,
    partition: int,
    task_attempt: int,
    max_partitions: int,
) -> int:
    """The ledger id this task attempt writes to, registered for clean-up.

    Slot ``task_attempt`` of the partition's slots, or the next free one: a stage
    that Spark runs again numbers its task attempts from 0 again, and the
    registration (a create) is what tells which ids are taken.
    """
    if partition >= max_partitions:
        raise InvalidArgumentError(
            f"log {log_name}: partition {partition} of the write is beyond the option "
            f"maxWritePartitions={max_partitions}; raise it or coalesce the DataFrame"
        )
    base = await _stage_block(bk, token, log_name, stage_key, max_partitions)
    first_id = base + partition * SLOTS_PER_PARTITION
    for slot in range(min(task_attempt, SLOTS_PER_PARTITION - 1), SLOTS_PER_PARTITION):
        ledger_id = first_id + slot
        try:
            # Registered before the ledger exists, so no ledger escapes the clean-up;
            # never creating the staging, which a finished write's clean-up removed.
            await bk.store.create(
                f"{staging_path(token)}/l{ledger_id}",
                _registration(partition),
                make_parents=False,
            )
        except NodeExistsError:
            continue
        except NoNodeError:
            raise _write_ended(log_name, token, partition) from None
        return ledger_id
    raise InvalidArgumentError(
        f"log {log_name}: partition {partition} of stage {stage_key} was tried more than "
        f"{SLOTS_PER_PARTITION} times; no ledger id is left for it in this write"
    )


async def open_staging(bk: BookKeeper, token: str, log_name: str) -> None:
    """Open the write's staging, where its tasks register their ledgers: a batch
    write's driver before any task runs; a streaming batch's first task (no driver
    code runs before a micro-batch's tasks)."""
    # The header names the log and when its driver showed life, for the sweep of
    # abandoned writes (the tasks' registrations say when they did).
    now_ms = _now_ms()
    header = json.dumps({"log": log_name, "created_ms": now_ms, "alive_ms": now_ms}).encode()
    with contextlib.suppress(NodeExistsError):
        await bk.store.create(staging_path(token), header)


async def keep_alive(
    bk: BookKeeper, token: str, log_name: str, partition: int, ledger_id: int
) -> None:
    """Refresh a task's registration every STAGING_HEARTBEAT_S while the task writes
    (run it beside the task and cancel it at the end): the sweep of abandoned writes
    judges a write by the last time it showed life, and this task is alive. Ends when
    the registration is gone (the write was committed or aborted meanwhile)."""
    path = f"{staging_path(token)}/l{ledger_id}"
    for _ in range(1 << 40):  # until cancelled
        await asyncio.sleep(STAGING_HEARTBEAT_S)
        try:
            await bk.store.set(path, _registration(partition))
        except NoNodeError:
            log.warning(
                "log %s: write %s ended while the task of partition %d was writing ledger %d",
                log_name,
                token,
                partition,
                ledger_id,
            )
            return
        except BKError as exc:  # the next beat may get through
            log.debug("log %s: heartbeat of ledger %d failed: %s", log_name, ledger_id, exc)


def _write_ended(log_name: str, token: str, partition: int) -> WriteEndedError:
    return WriteEndedError(
        f"log {log_name}: write {token} was already committed or aborted by its driver; "
        f"the task of partition {partition} straggled behind its job and keeps nothing"
    )


async def _stage_block(
    bk: BookKeeper, token: str, log_name: str, stage_key: str, max_partitions: int
) -> int:
    path = f"{staging_path(token)}/b{stage_key}"
    try:
        return int((await bk.store.get(path)).data)
    except NoNodeError:
        pass
    first = await bk.ledgers.reserve_ledger_ids(max_partitions * SLOTS_PER_PARTITION)
    try:
        await bk.store.create(path, str(first).encode(), make_parents=False)
        return first
    except NodeExistsError:
        # Another task of the stage got there first; our reserved block goes unused.
        return int((await bk.store.get(path)).data)
    except NoNodeError:
        raise _write_ended(log_name, token, -1) from None


async def create_task_ledger(
    bk: BookKeeper,
    token: str,
    log_name: str,
    partition: int,
    ledger_id: int,
    ensemble: int,
    write_quorum: int,
    ack_quorum: int,
    *,
    password: bytes = b"",
) -> LedgerHandle:
    """Create the task's ledger (registered by :func:`task_ledger_id`), tagged for the
    commit's checks. If the registration is gone once the ledger exists, the write's
    clean-up ran before the ledger was there to delete: the task deletes it itself."""
    handle = await bk.create_ledger(
        ensemble,
        write_quorum,
        ack_quorum,
        password=password,
        custom_metadata=ledger_tags(log_name, token, partition),
        ledger_id=ledger_id,
    )
    registration = f"{staging_path(token)}/l{ledger_id}"
    # R18: a lagging server may still show the registration a clean-up just deleted,
    # and the ledger would be left behind with nothing to delete it.
    await bk.store.sync(registration)
    if await bk.store.exists(registration) is not None:
        return handle
    # The clean-up deletes a registration before its ledger: seeing it gone after the
    # create means no clean-up will come back for this ledger.
    with contextlib.suppress(BKError):
        await handle.close()
    with contextlib.suppress(NoSuchLedgerError):
        await bk.delete_ledger(ledger_id, password)
    raise WriteEndedError(
        f"log {log_name}: write {token} ended while the task of partition {partition} "
        f"created ledger {ledger_id}; the ledger was deleted again and nothing is kept"
    )


# ---------------------------------------------------------------- the driver


def ledgers_in_order(results: Sequence[TaskResult | None]) -> tuple[list[int], int]:
    """The ledgers to append (partition order) and their rows, from the tasks' reports."""
    reported = sorted((r for r in results if r is not None), key=lambda r: r.partition)
    ledgers = [r.ledger_id for r in reported if r.ledger_id is not None and r.rows > 0]
    return ledgers, sum(r.rows for r in reported if r.ledger_id is not None)


def _holds(metadata: LogMetadata, ledgers: Sequence[int], sink: SinkBatch | None) -> bool:
    """Whether the log holds this write: its ledgers (and its batch id), so that a
    compare-and-set whose answer was lost was applied."""
    if sink is not None and metadata.sink_batches.get(sink.sink_id) != sink.batch_id:
        return False
    listed = set(metadata.ledgers)
    return all(ledger_id in listed for ledger_id in ledgers)


async def commit(
    bk: BookKeeper,
    log_name: str,
    token: str,
    results: Sequence[TaskResult | None],
    *,
    password: bytes = b"",
    sink: SinkBatch | None = None,
    timeout_s: float = COMMIT_TIMEOUT_S,
    clean_up_timeout_s: float = CLEAN_UP_TIMEOUT_S,
) -> CommitOutcome:
    """Append the tasks' ledgers to the log in one compare-and-set (see the module
    docstring); with ``sink``, at most once per batch id, and only by the query that
    owns the sinkId.

    The compare-and-set goes through the log's one update path
    (``log/metadata_updates.py``), as every change of a log's list does. One whose
    outcome is unknown (a lost connection) is resolved by re-reading the log (R13): the
    batch (or the write's ledgers) is in it, or it is tried again on the version read,
    which lets at most one of the two apply. When that does not tell (the log cannot be
    read for ``timeout_s``, or what it shows no longer proves either),
    CommitOutcomeUnknownError; a marker in the staging then keeps :func:`abort` from
    deleting ledgers that the log may list.

    Time: everything up to the compare-and-set's outcome takes at most ``timeout_s``.
    Past it (or when the caller cancels the commit, at its own time limit), a commit
    whose compare-and-set is on its way fails with CommitOutcomeUnknownError, and one
    that sent none fails (CommitTimeoutError, or the cancellation) with nothing
    appended. Once the compare-and-set is applied, the write has succeeded: the
    clean-up after it (the discarded ledgers, the sweep of abandoned writes) takes at
    most ``clean_up_timeout_s`` (checked between ledgers; the rest stays registered for
    a later clean-up), never fails the commit, and if the caller's time limit passes
    during it, the commit still returns its success and the clean-up goes on by itself
    within its bound."""
    return await _Commit(
        bk, log_name, token, results, password, sink, timeout_s, clean_up_timeout_s
    ).run()


class _Commit:
    """One driver's commit of one write: its compare-and-set goes through the log's one
    update path (``log/metadata_updates.py``), deciding with
    ``core.log_metadata.decide_commit_staged``."""

    def __init__(
        self,
        bk: BookKeeper,
        log_name: str,
        token: str,
        results: Sequence[TaskResult | None],
        password: bytes,
        sink: SinkBatch | None,
        timeout_s: float,
        clean_up_timeout_s: float,
    ) -> None:
        self.bk, self.log_name, self.token = bk, log_name, token
        self.results, self.password, self.sink = results, password, sink
        self.ledgers, self.rows = ledgers_in_order(results)
        # The password opens the ledgers a writer may still hold, to fence them.
        self.log_obj = Log(bk, log_name, LogConfig(password=password))
        self.timeout_s = timeout_s
        self.clean_up_timeout_s = clean_up_timeout_s
        self.marked = self.checked = False
        self.update: LogUpdate | None = None

    async def run(self) -> CommitOutcome:
        bk, log_name, sink = self.bk, self.log_name, self.sink
        try:
            async with asyncio.timeout(self.timeout_s):
                done = await self._compare_and_set()
        except LogOutcomeUnknownError as exc:
            raise self._unknown(exc.message) from exc
        except BaseException as exc:
            if self.update is not None and self.update.in_doubt:
                if isinstance(exc, asyncio.CancelledError | TimeoutError):
                    # The time is up (the commit's own, or its caller's) while a
                    # compare-and-set is on its way: it may still land. The marker stays.
                    raise self._unknown(
                        "the commit's time ran out while its compare-and-set was on its "
                        "way, with no answer"
                    ) from exc
                raise
            # A definite failure: nothing of this write is or will be in the log, so the
            # marker goes and abort may delete the ledgers.
            if self.marked:
                with contextlib.suppress(Exception):
                    await bk.store.delete(f"{staging_path(self.token)}/{COMMIT_MARKER}")
            if isinstance(exc, NoSuchLogError):
                raise LogFencedError(
                    f"log {log_name} was deleted while the write was being committed"
                ) from None
            if isinstance(exc, MetadataConflictsError):
                raise LogFencedError(
                    f"log {log_name}: the ledger list kept changing; the write was not added"
                ) from None
            if isinstance(exc, TimeoutError):
                raise CommitTimeoutError(
                    f"log {log_name}: the commit did not reach its compare-and-set within "
                    f"{self.timeout_s:g} s (the metadata store or the bookies answer too "
                    "slowly); nothing was appended"
                ) from exc
            raise
        # From here on the write's outcome is known: nothing below may fail it.
        if done.applied_to is not None or (
            _holds(done.metadata, self.ledgers, sink) and (self.ledgers or done.in_doubt)
        ):
            log.info(
                "log %s: appended ledgers %s (%d rows)%s",
                log_name,
                list(self.ledgers),
                self.rows,
                "" if sink is None else f" for sink {sink.sink_id} batch {sink.batch_id}",
            )
            deleted = await _clean_up_after_commit(
                bk,
                log_name,
                self.token,
                done.metadata.ledgers,
                self.password,
                sweep=True,
                timeout_s=self.clean_up_timeout_s,
            )
            return CommitOutcome(tuple(self.ledgers), self.rows, False, deleted)
        # The batch was in the log already (Spark runs the last batch again after a
        # restart). Keep what the log holds: the first run's registrations may still be
        # there if its driver died between the compare-and-set and the clean-up.
        deleted = await _clean_up_after_commit(
            bk,
            log_name,
            self.token,
            done.metadata.ledgers,
            self.password,
            timeout_s=self.clean_up_timeout_s,
        )
        return CommitOutcome((), 0, True, deleted)

    async def _compare_and_set(self) -> LogUpdated:
        """Everything up to the compare-and-set's outcome: read the log, claim the
        sinkId, check, fence, mark and compare-and-set (the update path)."""
        bk, log_name, sink = self.bk, self.log_name, self.sink
        try:
            metadata, version = await read_log(bk.store, log_name)
        except NoSuchLogError:
            raise LogFencedError(
                f"log {log_name} was deleted before the write was committed"
            ) from None
        if sink is not None:
            await claim_sink(bk, log_name, metadata, sink)
        decide = partial(
            decide_commit_staged,
            base=log_view(metadata),
            ledger_ids=tuple(self.ledgers),
            sink=None if sink is None else (sink.sink_id, sink.batch_id),
        )
        self.update = LogUpdate(
            bk.store,
            log_name,
            decide,
            what=f"appending the write's ledgers {self.ledgers}",
            attempts=COMMIT_CAS_ATTEMPTS,
            resolve_attempts=COMMIT_RESOLVE_ATTEMPTS,
            known=(metadata, version),
            before_write=self._before_write,
            timeout_s=self.timeout_s,
        )
        return await self.update.run()

    def _unknown(self, why: str) -> CommitOutcomeUnknownError:
        return CommitOutcomeUnknownError(
            f"log {self.log_name}: the commit's compare-and-set may or may not have been "
            f"applied ({why}); the rows may be in the log: read it before writing them again"
        )

    async def _before_write(self, metadata: LogMetadata) -> None:
        """Before each compare-and-set: checks the staged ledgers (once), fences the
        ledgers of the list about to change (the sink takes the log over, R11), marks
        the commit in the staging."""
        if not self.checked:
            await check_staged(self.bk, self.log_name, self.token, self.results)
            self.checked = True
        await fence_previous_ledgers(self.log_obj.ctx, metadata)
        if self.ledgers and not self.marked:
            await _mark_commit(self.bk, self.log_name, self.token)
            self.marked = True


async def _mark_commit(bk: BookKeeper, log_name: str, token: str) -> None:
    """Say in the staging that a compare-and-set may be sent (see :func:`abort`); the
    marker also says when this commit showed life, for the sweep."""
    await open_staging(bk, token, log_name)
    marker = json.dumps({"alive_ms": _now_ms()}).encode()
    with contextlib.suppress(NodeExistsError):
        await bk.store.create(f"{staging_path(token)}/{COMMIT_MARKER}", marker)


# Clean-ups that outlived the commit that started them (its caller's time ran out).
_cleaning: set[asyncio.Task[tuple[int, ...]]] = set()


async def _clean_up_after_commit(
    bk: BookKeeper,
    log_name: str,
    token: str,
    keep: Sequence[int],
    password: bytes,
    *,
    sweep: bool = False,
    timeout_s: float,
) -> tuple[int, ...]:
    """The clean-up once the commit's outcome is known, within ``timeout_s``: the
    ledgers deleted. The write has succeeded (or was there already), so this never fails
    the commit: a failure is logged, and a cancellation of the commit (its caller's time
    limit) leaves the clean-up running by itself, within its bound, and the commit
    returns its success all the same."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    work = loop.create_task(
        _best_effort_clean_up(bk, log_name, token, keep, password, sweep=sweep, deadline=deadline)
    )
    _cleaning.add(work)
    work.add_done_callback(_cleaning.discard)
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()  # the commit is not cancelled: it has succeeded
        log.warning(
            "log %s: the write is committed; its clean-up goes on after the time given to "
            "the commit",
            log_name,
        )
        return ()


async def _best_effort_clean_up(
    bk: BookKeeper,
    log_name: str,
    token: str,
    keep: Sequence[int],
    password: bytes,
    *,
    sweep: bool = False,
    deadline: float | None = None,
) -> tuple[int, ...]:
    """Clean up after the outcome is known. The rows are in the log (or the batch was
    there already): a failure here must not make the write look failed, or the user's
    retry would append the rows twice. What is left is cleaned by a later clean-up of
    the same write, or by the sweep of abandoned writes."""
    try:
        deleted = await clean_up(
            bk, log_name, token, keep=keep, password=password, deadline=deadline
        )
        if sweep:
            deleted += await sweep_stale(bk, log_name, keep, password=password, deadline=deadline)
        return deleted
    except Exception as exc:
        log.warning(
            "log %s: the write is committed, but cleaning up its staging failed (%s); "
            "a later commit to the log cleans it up",
            log_name,
            exc,
        )
        return ()


async def claim_sink(bk: BookKeeper, log_name: str, metadata: LogMetadata, sink: SinkBatch) -> None:
    """Make sure ``sink.sink_id`` belongs to ``sink.query_id`` on this log: the first
    query to commit with a sinkId owns it; another one gets an error naming it.

    Two queries sharing a sinkId would take each other's batches for replays (their
    batch ids overlap) and drop rows, so a sinkId is one query's, recorded beside the
    log (keyed by the log's creation time: a log created again starts afresh)."""
    path = f"{SINKS_PATH}/{log_node_name(log_name)}/{metadata.created_ms}/{sink.sink_id}"
    record = json.dumps({"query": sink.query_id, "claimed_ms": int(time.time() * 1000)})
    for _ in range(COMMIT_CAS_ATTEMPTS):
        try:
            owner = json.loads((await bk.store.get(path)).data).get("query")
        except NoNodeError:
            owner = None
        if owner == sink.query_id:
            return
        if owner is not None:
            raise InvalidArgumentError(
                f"log {log_name}: sinkId {sink.sink_id!r} belongs to another streaming query "
                f"({owner}); this query ({sink.query_id}) needs a sinkId of its own (option "
                "sinkId). Two queries on one sinkId would take each other's batches for "
                "replays and drop their rows"
            )
        if sink.sink_id in metadata.sink_batches:
            raise InvalidArgumentError(
                f"log {log_name}: sinkId {sink.sink_id!r} was used by an earlier streaming "
                f"query (it committed batch {metadata.sink_batches[sink.sink_id]}); this "
                f"query ({sink.query_id}) needs a sinkId of its own (option sinkId)"
            )
        try:
            await bk.store.create(path, record.encode())
            return
        except NodeExistsError:
            continue  # another query got there first: the read above tells which
        except MetadataError as exc:
            if isinstance(exc, NoNodeError):
                raise
            continue  # created or not: the read above tells (R13)
    raise InvalidArgumentError(f"log {log_name}: could not claim sinkId {sink.sink_id!r}")


async def check_staged(
    bk: BookKeeper, log_name: str, token: str, results: Sequence[TaskResult | None]
) -> None:
    """Before the compare-and-set: every ledger to append is closed, holds exactly the
    rows its task reported, and carries this write's tags. Anything else (a ledger
    another write's clean-up deleted, a task's ledger still open) would list records
    the log cannot serve, or not the rows the tasks wrote."""
    reported = [r for r in results if r is not None and r.ledger_id is not None and r.rows > 0]
    factories: list[Callable[[], Awaitable[LedgerMetadata | None]]] = [
        partial(_metadata_or_none, bk, r.ledger_id) for r in reported if r.ledger_id is not None
    ]
    found = await gather_in_order(factories, STAGED_READS_IN_FLIGHT)
    expected = ledger_tags(log_name, token, 0)
    for result, metadata in zip(reported, found, strict=True):
        where = f"log {log_name}: ledger {result.ledger_id} of partition {result.partition}"
        if metadata is None:
            problem = "no longer exists (deleted by a clean-up of another write?)"
        elif not metadata.is_closed:
            problem = "is not closed"
        elif metadata.last_entry_id + 1 != result.rows:
            problem = f"holds {metadata.last_entry_id + 1} records, its task reported {result.rows}"
        elif (
            any(metadata.custom_metadata.get(key) != expected[key] for key in (TAG_LOG, TAG_WRITE))
            or metadata.custom_metadata.get(TAG_PARTITION) != str(result.partition).encode()
        ):
            problem = "was not written by this write's task for that partition"
        else:
            continue
        raise StagedLedgerError(f"{where} {problem}; nothing was appended")


async def _metadata_or_none(bk: BookKeeper, ledger_id: int) -> LedgerMetadata | None:
    try:
        return await bk.ledger_metadata(ledger_id)
    except NoSuchLedgerError:
        return None


async def abort(
    bk: BookKeeper, log_name: str, token: str, *, password: bytes = b""
) -> tuple[int, ...]:
    """Delete every ledger the write's tasks registered that is not in the log; nothing
    while a compare-and-set of the write's commit may still be applied (R13).

    The marker and the log are read after a sync (R18): a lagging server could show
    neither the marker nor the ledgers a commit appended, which would then be deleted."""
    await bk.store.sync(staging_path(token))
    if await bk.store.exists(f"{staging_path(token)}/{COMMIT_MARKER}") is not None:
        log.warning(
            "log %s: the write's commit may have appended its ledgers; they are kept "
            "until a later clean-up reads the log",
            log_name,
        )
        return ()
    try:
        metadata, _ = await read_log(bk.store, log_name)
        keep: Sequence[int] = metadata.ledgers
    except NoSuchLogError:
        keep = ()
    return await clean_up(bk, log_name, token, keep=keep, password=password)


async def clean_up(
    bk: BookKeeper,
    log_name: str,
    token: str,
    keep: Sequence[int],
    *,
    password: bytes = b"",
    deadline: float | None = None,
) -> tuple[int, ...]:
    """Delete the write's registered ledgers that are not in ``keep``, then its staging
    nodes. ``password``: the ledgers' (bookies purge a ledger only for its key, R10).
    ``deadline`` (the loop's time): no ledger is started after it; what is left stays
    registered, for a later clean-up."""
    root = staging_path(token)
    try:
        names = await bk.store.children(root)
    except NoNodeError:
        return ()
    loop = asyncio.get_running_loop()
    kept = set(keep)
    deleted: list[int] = []
    for name in names:
        if deadline is not None and loop.time() >= deadline:
            log.info(
                "log %s: the clean-up of write %s ran out of time; the rest is left for a "
                "later one",
                log_name,
                token,
            )
            return tuple(sorted(deleted))
        # The registration goes first, then the ledger: a task that creates its ledger
        # after this clean-up looked for it sees its registration gone and deletes the
        # ledger itself (create_task_ledger).
        with contextlib.suppress(NoNodeError):
            await bk.store.delete(f"{root}/{name}")
        if not (name.startswith("l") and name[1:].isdigit()):
            continue
        ledger_id = int(name[1:])
        if ledger_id in kept:
            continue
        try:
            await bk.delete_ledger(ledger_id, password)
            deleted.append(ledger_id)
        except NoSuchLedgerError:
            pass  # registered, but the task died before creating it (or deleted it)
        except BKError as exc:
            log.warning("log %s: could not delete ledger %d: %s", log_name, ledger_id, exc)
            # Registered again, so that a later clean-up tries again.
            with contextlib.suppress(BKError):
                await bk.store.create(f"{root}/{name}", b"", make_parents=False)
    # A straggling task may have registered something meanwhile: a later clean-up's.
    with contextlib.suppress(BKError):
        await bk.store.delete(root)
    if deleted:
        log.info("log %s: deleted %d ledger(s) the write did not keep", log_name, len(deleted))
    return tuple(sorted(deleted))


async def sweep_stale(
    bk: BookKeeper,
    log_name: str,
    keep: Sequence[int],
    older_than_ms: int = STALE_STAGING_MS,
    *,
    password: bytes = b"",
    empty_older_than_ms: int = STALE_EMPTY_STAGING_MS,
    deadline: float | None = None,
) -> tuple[int, ...]:
    """Clean up the staging of earlier writes to ``log_name`` whose driver never
    committed or aborted (it died): those where nothing has shown life for
    ``older_than_ms`` (``empty_older_than_ms`` when no ledger is registered yet). Life:
    the header's ``alive_ms`` (its driver), each task registration's (refreshed while
    the task writes, :func:`keep_alive`), the commit marker's. A write's age does not
    count: a batch job running for days, or a streaming batch run again long after its
    driver died, is alive while its tasks are. Ledgers are deleted with ``password``,
    the log's; one written with another is kept (and said so) until a clean-up with its
    password."""
    try:
        tokens = await bk.store.children(STAGING_PATH)
    except NoNodeError:
        return ()
    loop = asyncio.get_running_loop()
    deleted: list[int] = []
    for token in tokens:
        if deadline is not None and loop.time() >= deadline:
            break
        try:
            header = json.loads((await bk.store.get(staging_path(token))).data or b"{}")
        except (NoNodeError, ValueError):
            continue
        if not isinstance(header, dict) or header.get("log") != log_name:
            continue
        try:
            if await _alive(bk, token, header, older_than_ms, empty_older_than_ms):
                continue
        except NoNodeError:
            continue  # cleaned up meanwhile
        deleted += await clean_up(bk, log_name, token, keep, password=password, deadline=deadline)
    return tuple(deleted)


async def staging_abandoned(
    bk: BookKeeper,
    token: str,
    older_than_ms: int = STALE_STAGING_MS,
    empty_older_than_ms: int = STALE_EMPTY_STAGING_MS,
) -> bool:
    """Whether write ``token``'s staging is one :func:`sweep_stale` would clean up:
    nothing of it showed life within the window (its driver died). False when the
    staging is gone (the write ended) or shows life."""
    try:
        header = json.loads((await bk.store.get(staging_path(token))).data or b"{}")
        if not isinstance(header, dict):
            header = {}
        return not await _alive(bk, token, header, older_than_ms, empty_older_than_ms)
    except NoNodeError:
        return False
    except ValueError:
        return not await _alive(bk, token, {}, older_than_ms, empty_older_than_ms)


async def _alive(
    bk: BookKeeper,
    token: str,
    header: dict[str, object],
    older_than_ms: int,
    empty_older_than_ms: int,
) -> bool:
    """Whether anything of a staging showed life within the window: ``older_than_ms``,
    or ``empty_older_than_ms`` when no ledger is registered in it yet. Reads stop at the
    first sign of life found."""
    root = staging_path(token)
    names = await bk.store.children(root)
    registered = any(name.startswith("l") for name in names)
    window = older_than_ms if registered else max(older_than_ms, empty_older_than_ms)
    since_ms = _now_ms() - window
    for stamp in (header.get("alive_ms"), header.get("created_ms")):
        if isinstance(stamp, int) and stamp > since_ms:
            return True
    for name in names:
        try:
            stamp = _alive_ms((await bk.store.get(f"{root}/{name}")).data)
        except NoNodeError:
            continue
        if stamp is not None and stamp > since_ms:
            return True
    # Silent for the whole window (or saying nothing of its life: damaged).
    return False
