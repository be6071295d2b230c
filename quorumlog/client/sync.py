"""The synchronous API: one blocking proxy over the asyncio objects.

One event loop runs on a background thread per :class:`BookKeeper`. A
:class:`Blocking` proxy wraps an asyncio object (the client, a ledger handle, a log,
its reader or writer, ...): its coroutine methods become blocking calls run on that
loop, a method that returns an asyncio future returns a ``concurrent.futures.Future``
without waiting, and what a call returns is wrapped in turn when it is an asyncio
object itself. Attributes and properties are read as they are.

One fast path stands beside it: a ledger's ``add_entry_async`` does not create a
coroutine per entry: entries queue under a lock and one wake-up of the loop drains
them all, and the returned ``concurrent.futures.Future`` is completed by the ledger
handle itself, so a thread adding entries in a tight loop pays a few microseconds
per entry; ``add_entries_async`` pays that per batch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING
from functools import partial
from typing import Any, Generic, Self, TypeVar

from quorumlog.client import bookkeeper as _aio
from quorumlog.client.config import ClientConfig
from quorumlog.client.writing import LedgerHandle as _AioLedgerHandle
from quorumlog.errors import BKError, InvalidArgumentError

T = TypeVar("T")
A = TypeVar("A")

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


class NowaitCalls:
    """Calls of an asyncio object's future-returning methods (``writer.append_nowait``),
    from any thread to the loop, each answered by a ``concurrent.futures.Future``.

    Calls queue under a lock and one ``call_soon_threadsafe`` per burst runs them on
    the loop (:class:`Handoff`), so a thread calling in a tight loop pays a few
    microseconds each instead of a coroutine and a wake-up per call. At most ``limit``
    are unsettled at once: further callers block (back-pressure for threads).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self._handoff = Handoff(loop, self._call_all, limit)

    def submit(
        self, method: Callable[..., asyncio.Future[Any]], args: tuple[Any, ...]
    ) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._handoff.put((method, args, future))
        return future

    def drain(self) -> None:
        """Make every call queued (on the loop)."""
        self._handoff.drain()

    def _call_all(self, items: list[tuple[Any, tuple[Any, ...], Any]]) -> None:
        for method, args, future in items:
            try:
                sent = method(*args)
            except BKError as exc:
                self._handoff.give(1)
                future.set_exception(exc)
                continue
            sent.add_done_callback(partial(self._transfer, future))

    def _transfer(self, future: concurrent.futures.Future[Any], sent: asyncio.Future[Any]) -> None:
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


# How a proxy calls each method of an asyncio class: "coroutine" (a blocking call),
# "future" (returns an asyncio future: queued, answered by a concurrent future) or
# "plain" (called as it is). Found once per class and name.
_KINDS: dict[tuple[type, str], str] = {}
_ASYNC_TYPES: dict[type, bool] = {}


def _method_kind(cls: type, name: str) -> str:
    key = (cls, name)
    kind = _KINDS.get(key)
    if kind is None:
        function = inspect.getattr_static(cls, name, None)
        function = getattr(function, "__func__", function)  # a classmethod/staticmethod
        if inspect.iscoroutinefunction(function):
            kind = "coroutine"
        else:
            returns = getattr(function, "__annotations__", {}).get("return")
            text = returns if isinstance(returns, str) else getattr(returns, "__name__", "")
            kind = "future" if text.split("[")[0].endswith("Future") else "plain"
        _KINDS[key] = kind
    return kind


def is_async_object(value: object) -> bool:
    """Whether ``value`` is an asyncio object a proxy wraps: one with coroutine methods."""
    cls = type(value)
    known = _ASYNC_TYPES.get(cls)
    if known is None:
        known = not isinstance(value, type) and any(
            inspect.iscoroutinefunction(v)
            for klass in cls.__mro__[:-1]
            for v in vars(klass).values()
        )
        _ASYNC_TYPES[cls] = known
    return known


_NOWAIT_LOCK = threading.Lock()
_OWN_ATTRIBUTES = frozenset(("_runner", "_target", "_nowait_limit", "_nowait", "_submitter"))


class Blocking(Generic[A]):
    """A blocking proxy over the asyncio object ``target``, run on ``runner``'s loop.

    ``proxy.method(...)`` runs a coroutine method on the loop and waits for it; a
    method that returns an asyncio future (``append_nowait``) returns a
    ``concurrent.futures.Future`` at once; other attributes are read as they are.
    Results that are asyncio objects come back as proxies. ``with proxy:`` closes
    the object; iterating a proxy iterates the object's ``async for``.

    Example::

        with BookKeeper() as bk:                      # a Blocking proxy of the client
            lh = bk.create_ledger(3, 3, 2)            # a proxy of the ledger handle
            lh.add_entry(b"x")
    """

    def __init__(self, runner: LoopThread, target: A, *, nowait_limit: int = 1000) -> None:
        self._runner = runner
        self._target = target
        self._nowait_limit = nowait_limit
        self._nowait: NowaitCalls | None = None

    @property
    def aio(self) -> A:
        """The asyncio object underneath (use it only on :attr:`loop`)."""
        return self._target

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._runner.loop

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine of the asyncio API on this proxy's loop and wait for it."""
        return self._runner.run(coro)

    def wrap(self, value: Any) -> Any:
        """``value`` as this proxy returns it: a proxy if it is an asyncio object."""
        if not is_async_object(value):
            return value
        proxy = _AioLedgerHandleProxy if isinstance(value, _AioLedgerHandle) else Blocking
        return proxy(self._runner, value, nowait_limit=self._nowait_limit)

    def _drain(self) -> None:
        """Make the calls this proxy queued first (on the loop): a blocking call comes
        after them, as it does in the caller's thread."""
        if self._nowait is not None:
            self._nowait.drain()

    async def _call(self, method: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        self._drain()
        return await method(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Only names the proxy itself lacks get here: the target's methods and attributes
        # (not the special ones, which copy and pickle probe for on a bare instance).
        if name.startswith("__") or name in _OWN_ATTRIBUTES:
            raise AttributeError(name)
        target = self._target
        value = getattr(target, name)
        if not inspect.ismethod(value):
            return self.wrap(value)
        kind = _method_kind(type(target), name)
        if kind == "coroutine":

            def blocking(*args: Any, **kwargs: Any) -> Any:
                return self.wrap(self._runner.run(self._call(value, args, kwargs)))

            return blocking
        if kind == "future":

            def nowait(*args: Any) -> concurrent.futures.Future[Any]:
                calls = self._nowait
                if calls is None:
                    with _NOWAIT_LOCK:  # one queue per proxy, whichever thread comes first
                        if self._nowait is None:
                            self._nowait = NowaitCalls(self._runner.loop, self._nowait_limit)
                        calls = self._nowait
                # A copy now: the caller may reuse its buffer at once.
                copies = tuple(
                    bytes(a) if isinstance(a, bytearray | memoryview) else a for a in args
                )
                return calls.submit(value, copies)

            return nowait
        return value

    def close(self) -> None:
        """Close the object, after the calls queued so far."""
        self._runner.run(self._call(getattr(self._target, "close"), (), {}))  # noqa: B009

    def __iter__(self) -> Iterator[Any]:
        """The object's ``async for``, one blocking step at a time."""
        iterator = self._target.__aiter__()  # type: ignore[attr-defined]
        while True:
            try:
                item = self._runner.run(self._call(iterator.__anext__, (), {}))
            except StopAsyncIteration:
                return
            yield self.wrap(item)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._target)


# Read handles, logs, their readers and writers: the proxy as it is.
ReadHandle = Blocking


class LedgerHandle(Blocking[_AioLedgerHandle]):
    """The writer's handle. ``add_entry`` waits; ``add_entry_async`` returns a Future;
    ``add_entries`` and ``add_entries_async`` do the same for a batch of entries.
    Everything else is the asyncio handle's, through :class:`Blocking`."""

    def __init__(
        self, runner: LoopThread, handle: _AioLedgerHandle, *, nowait_limit: int = 1000
    ) -> None:
        super().__init__(runner, handle, nowait_limit=nowait_limit)
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

    def _drain(self) -> None:
        self._submitter.drain()
        super()._drain()


_AioLedgerHandleProxy = LedgerHandle


class BookKeeper(Blocking[_aio.BookKeeper]):
    """Synchronous BookKeeper client: a :class:`Blocking` proxy of
    :class:`quorumlog.client.bookkeeper.BookKeeper` on a loop of its own; a context
    manager.

    Example::

        with BookKeeper() as bk:          # metadata from $QUORUMLOG_METADATA or ./.quorumlog
            lh = bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw")
            for value in (b"a", b"b"):
                lh.add_entry(value)
            lh.close()
            print([e.data for e in bk.open_ledger(lh.ledger_id, b"pw").read_entries(0, 1)])
    """

    def __init__(
        self,
        metadata: str | None = None,
        *,
        config: ClientConfig | None = None,
        placement: str | None = None,
    ):
        runner = LoopThread()
        try:
            client = runner.run(
                _aio.BookKeeper.connect(metadata, config=config, placement=placement)
            )
        except BaseException:
            runner.stop()
            raise
        super().__init__(runner, client, nowait_limit=client.config.max_outstanding_adds)

    def close(self) -> None:
        try:
            self._runner.run(self._target.close(), timeout_s=30)
        finally:
            self._runner.stop()
