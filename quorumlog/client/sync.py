"""The synchronous API: a thin facade over the asyncio client.

One event loop runs on a background thread per :class:`BookKeeper`; every call
is handed to it. ``add_entry_async`` does not create a coroutine per entry:
entries queue under a lock and one wake-up of the loop drains them all, and the
returned ``concurrent.futures.Future`` is completed by the ledger handle itself, so
a thread adding entries in a tight loop pays a few microseconds per entry;
``add_entries_async`` pays that per batch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING
from functools import partial
from typing import Any, ClassVar, Generic, Self, TypeVar

from quorumlog.client import bookkeeper as _aio
from quorumlog.client.config import ClientConfig
from quorumlog.client.reading import ReadHandle as _AioReadHandle
from quorumlog.client.writing import LedgerHandle as _AioLedgerHandle
from quorumlog.errors import BKError, InvalidArgumentError
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.proto.entry import DigestType, Entry

T = TypeVar("T")

# The states in which Future.set_result and set_exception refuse.
_SETTLED = frozenset((CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED))


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed (it is a dependency), else asyncio's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a declared dependency
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class LoopThread:
    """An event loop running forever on a daemon thread."""

    def __init__(self, name: str = "quorumlog-client") -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("synchronous quorumlog call made from its own event loop thread")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


class ReadHandle:
    """A ledger opened for reading. See :class:`quorumlog.client.reading.ReadHandle`."""

    def __init__(self, runner: LoopThread, handle: _AioReadHandle) -> None:
        self._runner = runner
        self._handle = handle

    @property
    def ledger_id(self) -> int:
        return self._handle.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._handle.metadata

    @property
    def last_add_confirmed(self) -> int:
        return self._handle.last_add_confirmed

    @property
    def is_closed(self) -> bool:
        return self._handle.is_closed

    @property
    def length(self) -> int:
        return self._handle.length

    def read_entries(self, first_entry_id: int, last_entry_id: int) -> list[Entry]:
        return self._runner.run(self._handle.read_entries(first_entry_id, last_entry_id))

    def read_last_add_confirmed(self) -> int:
        return self._runner.run(self._handle.read_last_add_confirmed())

    def read_last_add_confirmed_and_entry(
        self, entry_id: int, timeout_ms: int
    ) -> tuple[int, Entry | None]:
        return self._runner.run(
            self._handle.read_last_add_confirmed_and_entry(entry_id, timeout_ms)
        )

    def refresh_metadata(self) -> LedgerMetadata:
        return self._runner.run(self._handle.refresh_metadata())

    def close(self) -> None:
        self._runner.run(self._handle.close())

    def __enter__(self) -> ReadHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._handle)


class Handoff:
    """Items from any thread to the loop, under a bound on the items in flight.

    A thread queues an item with :meth:`put`: one lock, no call to the loop but one
    ``call_soon_threadsafe`` per burst, and ``run(items)`` gets the burst on the loop.
    Two waits keep a busy thread from starving the loop, under the same lock:

    - room: at most ``limit`` items (counted as each put says) are in flight, until the
      loop gives them back with :meth:`give` (once per batch of settled items). A thread
      that found no room is woken only once a quarter of the bound is free again, so a
      thread that keeps the pipeline full is woken once per quarter of the bound, not
      once per item: each wake-up is a thread switch (tens of microseconds here).
    - the burst: a thread that queued ``max_burst`` items the loop has not taken yet
      waits for the loop to take them. Without it, a thread adding in a tight loop keeps
      the GIL while the loop thread waits for it after each of its system calls (up to
      the switch interval, 5 ms, each time): adds pile up but hardly leave.
    """

    def __init__(
        self,
        loop: Any,
        run: Callable[[list[Any]], None],
        limit: int,
        *,
        max_burst: int = 512,
    ) -> None:
        if limit < 1:
            raise ValueError(f"a bound of {limit} items in flight")
        self._loop = loop
        self._run = run
        self.limit = limit
        self._resume_at = limit - max(1, limit // 4)
        self._max_burst = max_burst
        self._lock = threading.Lock()  # taken with ``with``: a C call, unlike a Condition's
        self._room = threading.Condition(self._lock)
        self._taken = threading.Condition(self._lock)
        self._items: list[Any] = []
        self._wake_pending = False
        self._in_flight = 0
        self._waiting = 0  # threads waiting for room

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def put(self, item: Any, count: int = 1) -> None:
        """Queue ``item``, which stands for ``count`` items in flight; blocks while they
        do not fit under the bound (callers refuse a ``count`` above it first)."""
        with self._lock:
            while self._in_flight and self._in_flight + count > self.limit:
                self._waiting += 1
                try:
                    self._room.wait()
                finally:
                    self._waiting -= 1
            self._in_flight += count
            items = self._items
            items.append(item)
            wake = not self._wake_pending
            self._wake_pending = True
            if len(items) >= self._max_burst and not wake:
                # Let the loop take this burst (timed: a stopped loop must not hang us).
                self._taken.wait_for(lambda: self._items is not items, 1.0)
        if wake:
            self._loop.call_soon_threadsafe(self.drain)

    def give(self, count: int) -> None:
        """``count`` items in flight were settled (any thread, usually the loop)."""
        with self._lock:
            self._in_flight -= count
            if self._waiting and self._in_flight <= self._resume_at:
                self._room.notify_all()

    def drain(self) -> None:
        """Run everything queued (on the loop)."""
        with self._lock:
            items, self._items = self._items, []
            self._wake_pending = False
            if len(items) >= self._max_burst:
                self._taken.notify_all()
        if items:
            self._run(items)


class AddWaits:
    """What the futures of one handle's adds share: one lock, one condition over it, and
    how many threads wait on it (so that a completion nobody waits for notifies no one)."""

    __slots__ = ("condition", "lock", "waiting")

    def __init__(self) -> None:
        # An RLock: concurrent.futures.wait and as_completed take each future's lock in
        # turn, here the same one several times.
        self.lock = threading.RLock()
        self.condition = threading.Condition(self.lock)
        self.waiting = 0


class AddFuture(concurrent.futures.Future[T]):
    """A ``concurrent.futures.Future`` that shares one condition with the other adds of
    its handle instead of building its own.

    ``Future()`` builds a ``threading.Condition`` and an ``RLock`` per future, about
    1.2 µs of Python: for a thread adding in a loop, a fifth of what an add costs it;
    and ``set_result`` enters and notifies that condition in Python, about 1.5 µs on the
    loop's thread. The futures of one handle share an :class:`AddWaits`; a thread
    waiting for one of them may then be woken by another's completion, so :meth:`result`
    and :meth:`exception` wait until this one is settled, and a completion takes the lock
    itself (a C call) and notifies only when a thread waits. Everything else is
    ``concurrent.futures.Future``'s own code.
    """

    def __init__(self, waits: AddWaits) -> None:
        # The attributes Future.__init__ sets, but the condition: it is shared.
        self._waits = waits
        self._condition = waits.condition
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Any] = []

    def _wait_settled(self, timeout: float | None) -> None:
        if self._state == FINISHED:
            return
        waits = self._waits
        with waits.lock:
            waits.waiting += 1
            try:
                waits.condition.wait_for(self.done, timeout)
            finally:
                waits.waiting -= 1

    def result(self, timeout: float | None = None) -> T:
        self._wait_settled(timeout)
        return super().result(0)  # settled: returns or raises now; else TimeoutError

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait_settled(timeout)
        return super().exception(0)

    def set_result(self, result: T) -> None:
        self._settle(result, None)

    def set_exception(self, exception: BaseException | None) -> None:
        self._settle(None, exception)

    def _settle(self, result: Any, exception: BaseException | None) -> None:
        """Future.set_result / set_exception, with the lock taken directly."""
        waits = self._waits
        with waits.lock:
            if self._state in _SETTLED:
                raise concurrent.futures.InvalidStateError(f"{self._state}: {self!r}")
            self._result = result
            self._exception = exception
            self._state = FINISHED
            for waiter in self._waiters:
                if exception is None:
                    waiter.add_result(self)
                else:
                    waiter.add_exception(self)
            if waits.waiting:
                waits.condition.notify_all()
        self._invoke_callbacks()  # type: ignore[attr-defined]  # Future's, not in its stubs


class ThreadedSubmitter(Generic[T]):
    """Hands payloads from any thread to a loop-side ``send(data) -> asyncio.Future``.

    Payloads queue under a lock and one ``call_soon_threadsafe`` per burst drains them
    on the loop, so a thread submitting in a tight loop pays a few microseconds each
    instead of a coroutine and a wake-up per payload. At most ``max_outstanding`` are
    unconfirmed at once: further submitters block (back-pressure for threads, see
    :class:`Handoff`).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        send: Callable[[bytes], asyncio.Future[T]],
        max_outstanding: int,
    ) -> None:
        self._send = send
        self._handoff = Handoff(loop, self._send_all, max_outstanding)

    def submit(self, data: bytes) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._handoff.put((bytes(data), future))
        return future

    def drain(self) -> None:
        """Send everything queued (on the loop)."""
        self._handoff.drain()

    def _send_all(self, items: list[tuple[bytes, concurrent.futures.Future[T]]]) -> None:
        send = self._send
        for data, future in items:
            try:
                sent = send(data)
            except BKError as exc:
                self._handoff.give(1)
                future.set_exception(exc)
                continue
            sent.add_done_callback(partial(self._transfer, future))

    def _transfer(self, future: concurrent.futures.Future[T], sent: asyncio.Future[T]) -> None:
        self._handoff.give(1)
        if sent.cancelled():
            future.cancel()
            return
        exc = sent.exception()
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled meanwhile
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(sent.result())


class LedgerSubmitter:
    """The synchronous ledger handle's adds, from any thread to the loop.

    Each add's ``concurrent.futures.Future`` is the token the asyncio handle completes
    itself (:meth:`~quorumlog.client.writing.LedgerHandle.append_with_token`): no
    asyncio future, done callback or second hop per add. A batch (:meth:`submit_many`)
    is one future for all its entries. The bound on adds in flight is counted in
    entries and given back once per batch of confirmations (``on_settled``).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, handle: _AioLedgerHandle) -> None:
        self._handle = handle
        self._handoff = handoff = Handoff(loop, self._send_all, handle._config.max_outstanding_adds)
        handle.on_settled(handoff.give)
        self._add_waits = AddWaits()  # shared by this handle's adds

    def submit(self, data: bytes) -> concurrent.futures.Future[int]:
        future: AddFuture[int] = AddFuture(self._add_waits)
        if type(data) is not bytes:
            data = bytes(data)  # a copy now: the caller may reuse its buffer at once
        self._handoff.put((data, future))
        return future

    def submit_many(self, entries: Sequence[bytes]) -> concurrent.futures.Future[list[int]]:
        future: concurrent.futures.Future[list[int]] = concurrent.futures.Future()
        batch = [data if type(data) is bytes else bytes(data) for data in entries]
        limit = self._handoff.limit
        if len(batch) > limit:
            future.set_exception(
                InvalidArgumentError(
                    f"ledger {self._handle.ledger_id}: a batch of {len(batch)} entries is "
                    f"over max_outstanding_adds ({limit})"
                )
            )
            return future
        if not batch:
            future.set_result([])
            return future
        self._handoff.put((batch, future), len(batch))
        return future

    def drain(self) -> None:
        """Send everything queued (on the loop)."""
        self._handoff.drain()

    def _send_all(self, items: list[tuple[Any, concurrent.futures.Future[Any]]]) -> None:
        append = self._handle.append_with_token
        append_entries = self._handle.append_entries_with_token
        for data, future in items:
            try:
                if type(data) is list:
                    append_entries(data, future)
                else:
                    append(data, future)
            except BKError as exc:
                self._handoff.give(len(data) if type(data) is list else 1)
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    future.set_exception(exc)


class LedgerHandle(ReadHandle):
    """The writer's handle. ``add_entry`` waits; ``add_entry_async`` returns a Future;
    ``add_entries`` and ``add_entries_async`` do the same for a batch of entries."""

    _handle: _AioLedgerHandle

    def __init__(self, runner: LoopThread, handle: _AioLedgerHandle) -> None:
        super().__init__(runner, handle)
        self._submitter = LedgerSubmitter(runner.loop, handle)

    def add_entry(self, data: bytes) -> int:
        """Add one entry and wait until it is confirmed; returns its entry id."""
        return self.add_entry_async(data).result()

    def add_entry_async(self, data: bytes) -> concurrent.futures.Future[int]:
        """Send an entry; the future gives its entry id once confirmed, in entry-id order.

        Blocks while ``max_outstanding_adds`` adds of this handle are unconfirmed."""
        return self._submitter.submit(data)

    def add_entries(self, entries: Sequence[bytes]) -> list[int]:
        """Add several entries and wait until all are confirmed; returns their entry ids
        (consecutive, in order)."""
        return self.add_entries_async(entries).result()

    def add_entries_async(self, entries: Sequence[bytes]) -> concurrent.futures.Future[list[int]]:
        """Send several entries; the one future gives their entry ids once the last is
        confirmed. The cheapest way to pipeline from a thread: one future, one hand-off
        to the loop and one completion per batch instead of per entry.

        Blocks while the batch does not fit under ``max_outstanding_adds`` with the adds
        already unconfirmed; a batch larger than that bound fails (InvalidArgumentError).
        The batch is taken whole or refused whole. If the future fails, entries before
        the failure may have been confirmed (:attr:`last_add_confirmed` says up to where).

        Example::

            pending = [lh.add_entries_async([b"a"] * 100) for _ in range(50)]
            ids = [i for f in pending for i in f.result()]       # 0 .. 4999
        """
        return self._submitter.submit_many(entries)

    @property
    def outstanding_adds(self) -> int:
        return self._handle.outstanding_adds

    @property
    def ensemble(self) -> tuple[str, ...]:
        return self._handle.ensemble

    def close(self) -> None:
        """Wait for the adds sent so far, then close the ledger at its LAC (R6)."""

        async def drain_then_close() -> None:
            self._submitter.drain()
            await self._handle.close()

        self._runner.run(drain_then_close())


class BookKeeper:
    """Synchronous BookKeeper client; a context manager.

    Example::

        with BookKeeper() as bk:          # metadata from $QUORUMLOG_METADATA or ./.quorumlog
            lh = bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw")
            for value in (b"a", b"b"):
                lh.add_entry(value)
            lh.close()
            print([e.data for e in bk.open_ledger(lh.ledger_id, b"pw").read_entries(0, 1)])
    """

    # The asyncio client this one runs: a subclass that adds methods built above the
    # client (the log streams of quorumlog.log) names its own asyncio class here.
    _aio_class: ClassVar[type[_aio.BookKeeper]] = _aio.BookKeeper

    def __init__(self, metadata: str | None = None, *, config: ClientConfig | None = None):
        self._runner = LoopThread()
        try:
            self._client = self._runner.run(self._aio_class.connect(metadata, config=config))
        except BaseException:
            self._runner.stop()
            raise

    @property
    def aio(self) -> _aio.BookKeeper:
        """The asyncio client underneath (use it only on :attr:`loop`)."""
        return self._client

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._runner.loop

    @property
    def metadata_uri(self) -> str:
        return self._client.metadata_uri

    def list_bookies(self) -> list[str]:
        return self._runner.run(self._client.list_bookies())

    def create_ledger(
        self,
        ensemble: int = 3,
        write_quorum: int = 3,
        ack_quorum: int = 2,
        digest_type: DigestType = DigestType.CRC32C,
        password: bytes = b"",
        custom_metadata: Mapping[str, bytes] | None = None,
        *,
        ledger_id: int | None = None,
    ) -> LedgerHandle:
        handle = self._runner.run(
            self._client.create_ledger(
                ensemble,
                write_quorum,
                ack_quorum,
                digest_type,
                password,
                custom_metadata,
                ledger_id=ledger_id,
            )
        )
        return LedgerHandle(self._runner, handle)

    def open_ledger(self, ledger_id: int, password: bytes = b"") -> ReadHandle:
        return ReadHandle(
            self._runner, self._runner.run(self._client.open_ledger(ledger_id, password))
        )

    def open_ledger_no_recovery(self, ledger_id: int, password: bytes = b"") -> ReadHandle:
        handle = self._runner.run(self._client.open_ledger_no_recovery(ledger_id, password))
        return ReadHandle(self._runner, handle)

    def delete_ledger(self, ledger_id: int, password: bytes = b"") -> None:
        self._runner.run(self._client.delete_ledger(ledger_id, password))

    def list_ledgers(self) -> list[int]:
        return self._runner.run(self._client.list_ledgers())

    def is_closed(self, ledger_id: int) -> bool:
        return self._runner.run(self._client.is_closed(ledger_id))

    def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return self._runner.run(self._client.ledger_metadata(ledger_id))

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine of the asyncio API on this client's loop and wait for it."""
        return self._runner.run(coro)

    def close(self) -> None:
        try:
            self._runner.run(self._client.close(), timeout_s=30)
        finally:
            self._runner.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
