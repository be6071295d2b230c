"""Contending on ZooKeeper with kazoo's ``Lock`` recipe.

The contender opens a :class:`~kazoo.client.KazooClient` of its own (session timeout
``session_timeout_ms``, the chroot of the ``zk://`` URI) and holds a
:class:`kazoo.recipe.lock.Lock` on ``/election/<group>`` with its identifier as the
node data. Holding the lock is leading. kazoo's nodes are
``/election/<group>/<uuid>__lock__<sequence>`` (ephemeral sequential); any kazoo
program can see the line with ``Lock(client, "/election/<group>").contenders()`` or
take part in it with a ``Lock`` of its own.

``Lock.acquire`` blocks, so it runs in a thread of the contender; the thread hands
its outcome to the event loop. kazoo's ``Election`` recipe is this same lock, but it
leads by running a function inside ``acquire``; holding the lock directly lets the
contender report gain and loss on the loop and give the lock up from the loop.

The lock says nothing about the session while it is held: kazoo leaves that to a
state listener, and this contender is that listener.

- ``SUSPENDED``: the node may already be gone, so a leader stops leading at once.
  ``CONNECTED`` again means the session survived: the contender lists the nodes and
  leads again if its node is still the lowest.
- ``LOST``: the node went with the session. A leader stops leading and queues again
  with a new ``Lock`` (a new node at the end of the line) in the new session that
  kazoo opens by itself. A contender still waiting in ``acquire`` needs nothing:
  kazoo's lock notices that its node is gone and creates a new one.

A leader also lists the nodes every half session timeout, so a node deleted by hand
(or an event missed) costs at most that long.

Every wait is bounded. The lock's retry policy is replaced by one with short
back-off that stops as soon as the contender closes (kazoo's default sleeps up to a
minute between attempts). Requests made while kazoo is disconnected wait until it
reconnects, so the contender makes them only from the loop with a timeout, or from
threads that closing ends. :meth:`KazooContender.close` cancels the lock
(``Lock.cancel``), deletes its node if held, stops the client (ZooKeeper deletes what
is left of the session's nodes) and joins its threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from kazoo import exceptions as kz  # type: ignore[import-untyped]
from kazoo.client import KazooClient  # type: ignore[import-untyped]
from kazoo.handlers.threading import AsyncResult  # type: ignore[import-untyped]
from kazoo.protocol.states import KazooState  # type: ignore[import-untyped]
from kazoo.recipe.lock import Lock  # type: ignore[import-untyped]
from kazoo.retry import KazooRetry  # type: ignore[import-untyped]

from quorumlog.errors import MetadataError
from quorumlog.meta.zk_store import (
    CONNECT_TIMEOUT_MS,
    PollingHandler,
    parse_zk_uri,
    zk_credentials,
)
from quorumlog.recipes.contender import Contender, SetLeader

log = logging.getLogger(__name__)

# kazoo's Lock names its nodes "<uuid hex>__lock__<10-digit sequence>" and orders them
# by the sequence text (see kazoo.recipe.lock.Lock); contenders() orders them the same.
_LOCK_NODE = re.compile(r"__lock__(-?\d{10})$")
POLL_INTERVAL_S = 0.005
MAX_RETRY_DELAY_S = 0.5
CLOSE_TIMEOUT_S = 60.0

Outcome = tuple[bool, Any]  # (True, value) or (False, exception)


class _ElectionLock(Lock):  # type: ignore[misc]
    """kazoo's Lock with a retry policy whose waits are short and stop on close."""

    def __init__(self, client: KazooClient, path: str, identifier: str, retry: KazooRetry) -> None:
        super().__init__(client, path, identifier)
        # acquire() runs every attempt through a copy of this policy. kazoo's default
        # backs off to a minute between attempts and cannot be interrupted.
        self._retry = retry


class KazooContender(Contender):
    """A contender in kazoo's lock on ``path`` under the root of a ``zk://`` URI."""

    def __init__(
        self,
        uri: str,
        *,
        group: str,
        path: str,
        identifier: str,
        session_timeout_ms: int,
        set_leader: SetLeader,
        connect_timeout_ms: int = CONNECT_TIMEOUT_MS,
    ) -> None:
        self.uri = uri
        self.hosts, self.root = parse_zk_uri(uri)
        self.group = group
        self.path = path
        self.identifier = identifier
        self.session_timeout_ms = session_timeout_ms
        self.connect_timeout_ms = connect_timeout_ms
        # A read that takes longer than this has met a dead connection kazoo has not
        # noticed yet: the answer would be stale anyway.
        self.operation_timeout_s = max(2 * session_timeout_ms, 5_000) / 1000
        self._set_leader = set_leader
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: KazooClient | None = None
        self._lock: _ElectionLock | None = None
        self._acquired = False  # acquire() of the current lock returned True
        self._failed = False  # acquire() of the current lock raised
        self._decided = asyncio.Event()  # the current lock's first verdict is known
        self._wake = asyncio.Event()
        self._threads: list[threading.Thread] = []
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def node(self) -> str | None:
        lock = self._lock
        return None if lock is None else lock.node

    # ------------------------------------------------------------ public

    async def start(self) -> None:
        if self._client is not None:
            return
        self._loop = asyncio.get_running_loop()
        credentials = zk_credentials(self.uri)  # the store's: the same user and ACL
        client = KazooClient(
            hosts=self.hosts,
            handler=PollingHandler.for_session(self.session_timeout_ms),
            timeout=self.session_timeout_ms / 1000,
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0),
            auth_data=credentials.auth_data() if credentials else None,
            default_acl=credentials.acl() if credentials else None,
        )
        self._client = client
        try:
            await self._in_thread("connect", self._connect)
            client.add_listener(self._on_kazoo_state)
            self._queue_again()
            self._task = self._loop.create_task(self._run())
            await self._wait_until_queued()
        except BaseException:
            await self.close()
            raise

    async def contenders(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for name in await self._sorted_nodes():
            node_path = f"{self.path}/{name}"
            try:
                data, _stat = await self._call("get", node_path, self._require_client().get_async)
            except kz.NoNodeError:
                continue
            out.append((name, (data or b"").decode(errors="replace")))
        return out

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True  # also interrupts the lock's retry waits
        self._set_leader(False)
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        client = self._client
        if client is None:
            return
        lock = self._lock
        if lock is not None:
            lock.cancel()  # wakes acquire(): it deletes its node and raises
        threads = list(self._threads)
        closing = self._in_thread("close", partial(self._close_in_thread, client, lock, threads))
        try:
            await asyncio.wait_for(closing, CLOSE_TIMEOUT_S)
        except TimeoutError:
            log.warning(
                "election %s: ZooKeeper client not stopped in %s s", self.group, CLOSE_TIMEOUT_S
            )
        except Exception as exc:
            log.warning("election %s: closing: %s %s", self.group, type(exc).__name__, exc)

    # ------------------------------------------------------------ joining

    def _connect(self) -> None:
        """In a thread: connect, create the root if missing, then make it the chroot."""
        client = self._require_client()
        try:
            client.start(timeout=self.connect_timeout_ms / 1000)
            if self.root:
                client.ensure_path(self.root)
        except Exception as exc:  # kazoo raises its handler's own timeout type on start()
            raise MetadataError(
                f"election {self.group}: cannot reach ZooKeeper at {self.hosts} within "
                f"{self.connect_timeout_ms} ms: {type(exc).__name__} {exc}"
            ) from exc
        client.chroot = self.root

    def _queue_again(self) -> None:
        """Contend with a new lock: a new node, at the end of the line."""
        client = self._require_client()
        retry = KazooRetry(
            max_tries=-1,
            delay=0.05,
            backoff=2,
            max_delay=min(MAX_RETRY_DELAY_S, self.session_timeout_ms / 4000),
            interrupt=lambda: self._closed,
        )
        lock = _ElectionLock(client, self.path, self.identifier, retry)
        self._lock = lock
        self._acquired = False
        self._failed = False
        self._decided.clear()
        acquire = partial(lock.acquire, blocking=True, timeout=None)
        self._spawn("acquire", acquire, partial(self._acquired_by, lock))

    async def _wait_until_queued(self) -> None:
        """Return once our node exists and, if it is first, once leadership is decided."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.operation_timeout_s + self.connect_timeout_ms / 1000
        # Lock.acquire() creates the node in its thread and offers no hook: look at
        # lock.node until it is set (a few milliseconds on a live connection).
        for _ in range(1_000_000):
            lock = self._lock
            if lock is not None and lock.node is not None:
                break
            if self._failed or loop.time() >= deadline:
                raise MetadataError(
                    f"election {self.group}: could not create a node under {self.path} "
                    f"at {self.hosts}{self.root}"
                )
            await asyncio.sleep(POLL_INTERVAL_S)
        if lock is None or lock.node is None:
            raise MetadataError(f"election {self.group}: no node under {self.path}")
        try:
            names = await self._sorted_nodes()
        except MetadataError:
            return  # in line; the loop sorts out the rest
        if names[:1] == [lock.node]:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._decided.wait(), self.operation_timeout_s)
        log.info("election %s: joined as %s (%s)", self.group, lock.node, self.identifier)

    # ------------------------------------------------------------ the loop

    async def _run(self) -> None:
        # Wakes on every acquire() outcome and session change, and at least every half
        # session timeout while leading (a node deleted by hand, a missed event).
        recheck_s = max(0.05, self.session_timeout_ms / 2000)
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), recheck_s)
            self._wake.clear()
            if self._closed:
                return
            if self._failed:
                await asyncio.sleep(min(recheck_s, 0.5))
                if not self._closed:
                    self._queue_again()
            elif self._acquired:
                await self._confirm()

    async def _confirm(self) -> None:
        """Lead while the lock is held, the connection is up and our node is the lowest."""
        client, lock = self._require_client(), self._lock
        if lock is None:
            return
        try:
            await self._confirm_lock(client, lock)
        finally:
            if lock is self._lock:
                self._decided.set()  # start() waits for this when our node is first

    async def _confirm_lock(self, client: KazooClient, lock: _ElectionLock) -> None:
        if client.state != KazooState.CONNECTED:
            self._set_leader(False)  # a CONNECTED event wakes the loop again
            return
        try:
            names = await self._sorted_nodes()
        except MetadataError as exc:
            self._set_leader(False)
            log.warning("election %s: %s", self.group, exc.message)
            return
        if self._closed or lock is not self._lock or not self._acquired:
            return
        if names[:1] == [lock.node]:
            # Still connected after the round trip: no SUSPENDED came in between.
            self._set_leader(client.state == KazooState.CONNECTED)
        else:
            # Our node went (session lost, or deleted by hand) although we held the lock,
            # or something sorts before it: leave that place and queue again.
            self._set_leader(False)
            log.info("election %s: node %s not first, queueing again", self.group, lock.node)
            if lock.node in names:
                with contextlib.suppress(kz.NoNodeError, MetadataError):
                    await self._call("delete", f"{self.path}/{lock.node}", client.delete_async)
            if not self._closed and lock is self._lock:
                self._queue_again()

    # ------------------------------------------------------------ events

    def _acquired_by(self, lock: _ElectionLock, outcome: Outcome) -> None:
        """On the loop: the acquire() thread of ``lock`` ended."""
        if self._closed or lock is not self._lock:
            return
        done, value = outcome
        if done and value is True:
            self._acquired = True
        else:
            self._failed = True
            self._decided.set()
            reason = f"{type(value).__name__} {value}" if not done else "gave up"
            log.warning("election %s: lock on %s: %s", self.group, self.path, reason)
        self._wake.set()

    def _on_kazoo_state(self, state: KazooState) -> None:
        """On a kazoo thread: hand the session change to the loop."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # loop closed
                loop.call_soon_threadsafe(self._on_state, state)

    def _on_state(self, state: KazooState) -> None:
        if self._closed:
            return
        if state != KazooState.CONNECTED:
            self._set_leader(False)  # at once: the node may already be gone
        if state == KazooState.LOST and self._acquired:
            self._queue_again()  # the node went with the session
        self._wake.set()

    # ------------------------------------------------------------ ZooKeeper reads

    async def _sorted_nodes(self) -> list[str]:
        """The lock's node names, in kazoo's order (lowest sequence first)."""
        client = self._require_client()
        try:
            names = await self._call("children", self.path, client.get_children_async)
        except kz.NoNodeError:
            return []
        matches = [m for m in map(_LOCK_NODE.search, names) if m is not None]
        return [m.string for m in sorted(matches, key=lambda m: m.group(1))]

    async def _call(self, what: str, path: str, call: Callable[[str], AsyncResult]) -> Any:
        """One kazoo async call, bounded; NoNodeError passes, other failures are MetadataError."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        try:
            result = call(path)
            result.rawlink(partial(self._hand_over, future))
            # Not wait_for, which on Python 3.11 can swallow a cancel (see ZkStore._call).
            async with asyncio.timeout(self.operation_timeout_s):
                return await future
        except kz.NoNodeError:
            raise
        except TimeoutError:
            raise MetadataError(
                f"election {self.group}: ZooKeeper {what} {path} at {self.hosts}: no answer "
                f"within {self.operation_timeout_s * 1000:.0f} ms"
            ) from None
        except Exception as exc:
            raise MetadataError(
                f"election {self.group}: ZooKeeper {what} {path} at {self.hosts}: "
                f"{type(exc).__name__} {exc}"
            ) from exc

    def _hand_over(self, future: asyncio.Future[Any], done: AsyncResult) -> None:
        """On a kazoo thread: move a result to ``future`` on the loop."""
        outcome = (True, done.value) if done.successful() else (False, done.exception)
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # loop closed
                loop.call_soon_threadsafe(_settle, future, outcome)

    # ------------------------------------------------------------ threads

    def _spawn(
        self, name: str, body: Callable[[], Any], on_done: Callable[[Outcome], None]
    ) -> None:
        """Run ``body`` in a thread of its own; ``on_done(outcome)`` runs on the loop."""
        loop = self._loop
        if loop is None:
            raise MetadataError(f"election {self.group}: not started")

        def run() -> None:
            try:
                outcome: Outcome = (True, body())
            except BaseException as exc:
                outcome = (False, exc)
            with contextlib.suppress(RuntimeError):  # loop closed: nobody waits any more
                loop.call_soon_threadsafe(on_done, outcome)

        self._threads = [t for t in self._threads if t.is_alive()]
        thread = threading.Thread(target=run, name=f"election-{self.group}-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()

    async def _in_thread(self, name: str, body: Callable[[], Any]) -> Any:
        """Run ``body`` in a thread of its own and return its result."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._spawn(name, body, partial(_settle, future))
        return await future

    def _close_in_thread(
        self, client: KazooClient, lock: _ElectionLock | None, threads: list[threading.Thread]
    ) -> None:
        """In a thread: let acquire() end, delete a held lock's node, stop the client, join.

        Requests made while kazoo is disconnected wait in its queue until it reconnects,
        so nothing here waits on ZooKeeper without a bound, or at all while
        disconnected: stopping the client fails whatever is still queued.
        """
        # Connected, a cancelled acquire() deletes its node and ends within a round trip.
        join_s = 1.0 if client.state == KazooState.CONNECTED else 0.0
        for thread in threads:
            thread.join(join_s)
        if lock is not None and lock.is_acquired and client.state == KazooState.CONNECTED:
            # What Lock.release() does, with a bound: the next contender leads at once.
            try:
                client.delete_async(f"{self.path}/{lock.node}").get(
                    timeout=self.operation_timeout_s
                )
            except Exception as exc:  # the session's end below removes the node anyway
                log.debug("election %s: deleting %s: %s", self.group, lock.node, exc)
        try:
            client.stop()  # ends the session: ZooKeeper deletes whatever node is left
        except Exception:
            log.exception("election %s: stopping the ZooKeeper client", self.group)
        finally:
            client.close()
        for thread in threads:  # their requests fail at once on a stopped client
            thread.join(self.session_timeout_ms / 1000 + 1.0)
            if thread.is_alive():
                log.warning("election %s: thread %s still running", self.group, thread.name)

    def _require_client(self) -> KazooClient:
        if self._client is None:
            raise MetadataError(f"election {self.group}: no ZooKeeper session")
        return self._client


def _settle(future: asyncio.Future[Any], outcome: Outcome) -> None:
    if future.done():
        return  # the waiter gave up (timeout, cancel)
    done, value = outcome
    if done:
        future.set_result(value)
    else:
        future.set_exception(value)
