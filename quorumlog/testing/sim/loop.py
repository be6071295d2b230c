"""Virtual time and a deterministic scheduler for the simulator.

:class:`VirtualTimeLoop` is an asyncio loop whose clock only moves when it would
otherwise sleep: when nothing is ready it jumps to the next timer, so seconds of
timeouts take microseconds and one seed always gives the same run.

:class:`SimExecutor` stands for one worker thread (the bookie's journal writer,
its checkpoint thread): jobs run one at a time, in order, on the loop's thread,
each after a latency drawn from the seed. A simulation can freeze it (the process
is paused) or kill it (the process died: queued jobs never run, and a job that
meets a :class:`~quorumlog.testing.sim.disk.PowerLoss` completes nothing).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import heapq
import random
import selectors
from collections.abc import Callable
from typing import Any, TypeVarTuple

from quorumlog.testing.sim.disk import PowerLoss

__all__ = ["SimExecutor", "SimulationDeadlock", "VirtualTimeLoop"]

# asyncio's own thresholds (base_events): the heap is rebuilt without cancelled timers
# when it holds over 100 and more than half of them are cancelled.
_MIN_SCHEDULED_TIMER_HANDLES = 100
_MIN_CANCELLED_FRACTION = 0.5
_MAXIMUM_TIMEOUT_S = 24 * 3600

_Ts = TypeVarTuple("_Ts")


class SimulationDeadlock(RuntimeError):
    """Nothing is ready and no timer is set, yet the simulated program still waits."""


class _VirtualSelector(selectors.BaseSelector):
    """A selector with no file descriptors: 'waiting' moves the virtual clock."""

    def __init__(self) -> None:
        self._keys: dict[int, selectors.SelectorKey] = {}
        self.loop: VirtualTimeLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        self.unregister(fileobj)
        return self.register(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        assert self.loop is not None
        if timeout is None:
            raise SimulationDeadlock("the simulated program waits with no timer set")
        self.loop.advance(max(timeout, 0.0))
        return []

    def get_map(self) -> dict[int, selectors.SelectorKey]:  # type: ignore[override]
        return self._keys

    def close(self) -> None:
        self._keys.clear()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose clock only moves when it would otherwise sleep."""

    def __init__(self) -> None:
        self._virtual_now = 0.0
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += seconds

    def _write_to_self(self) -> None:
        # Everything runs on this one thread: a wake-up byte would only fill a socket
        # buffer that nobody reads (the selector never waits on it).
        pass

    # The timer heap holds (when, handle) pairs instead of handles: asyncio's TimerHandle
    # compares with a Python __lt__, called millions of times a minute here, while a
    # pair compares its floats in C. At equal times the pair compares the handles, whose
    # answer is "not less" both ways, as TimerHandle's own, so every push and pop makes
    # the same heap as asyncio's and each seed runs exactly as it did on the stock loop
    # (tests/sim/test_simulation.py pins trace digests).

    def call_at(
        self,
        when: float,
        callback: Callable[[*_Ts], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        if when is None:
            raise TypeError("when cannot be None")
        base: Any = self  # asyncio's private state, which typeshed does not declare
        base._check_closed()
        timer = asyncio.TimerHandle(when, callback, args, self, context)
        heapq.heappush(base._scheduled, (when, timer))
        base_timer: Any = timer
        base_timer._scheduled = True
        return timer

    def _run_once(self) -> None:
        """asyncio's BaseEventLoop._run_once for this heap, with the clock moved in place
        of the selector's wait (there are no file descriptors to poll)."""
        base: Any = self  # asyncio's private state, which typeshed does not declare
        scheduled: list[tuple[float, Any]] = base._scheduled
        ready: collections.deque[Any] = base._ready
        count = len(scheduled)
        if (
            count > _MIN_SCHEDULED_TIMER_HANDLES
            and base._timer_cancelled_count / count > _MIN_CANCELLED_FRACTION
        ):
            kept = []
            for entry in scheduled:
                if entry[1]._cancelled:
                    entry[1]._scheduled = False
                else:
                    kept.append(entry)
            heapq.heapify(kept)
            base._scheduled = scheduled = kept
            base._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0][1]._cancelled:
                base._timer_cancelled_count -= 1
                heapq.heappop(scheduled)[1]._scheduled = False

        if ready or base._stopping:
            timeout = 0.0
        elif scheduled:
            timeout = min(max(0, scheduled[0][0] - self._virtual_now), _MAXIMUM_TIMEOUT_S)
        else:
            raise SimulationDeadlock("the simulated program waits with no timer set")
        self._virtual_now += max(timeout, 0.0)

        end_time = self._virtual_now + base._clock_resolution
        while scheduled and scheduled[0][0] < end_time:
            when, handle = heapq.heappop(scheduled)
            handle._scheduled = False
            ready.append(handle)
            # A timer due within the clock's resolution runs now, as on asyncio's loop;
            # but on a real clock time goes on, and here it would not: a waiter whose
            # deadline lies one float step ahead would wake, see it not reached, wait
            # again for that step, and spin. So the clock reaches every timer it runs.
            if when > self._virtual_now:
                self._virtual_now = when

        # Only the callbacks ready now run; those they schedule wait for the next turn.
        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle._cancelled:
                handle._run()


Job = tuple[concurrent.futures.Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class SimExecutor(concurrent.futures.Executor):
    """One simulated worker thread: jobs in order, one at a time, on the loop's thread."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        rng: random.Random,
        latency_ms: tuple[float, float],
        name: str = "worker",
    ) -> None:
        self._loop = loop
        self._rng = rng
        self._latency_ms = latency_ms
        self.name = name
        self._jobs: collections.deque[Job] = collections.deque()
        self._handle: asyncio.TimerHandle | None = None
        self.frozen = False
        self.dead = False
        self.jobs_run = 0

    def submit(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if self.dead:
            return future  # a call from a dead process: it never completes
        self._jobs.append((future, fn, args, kwargs))
        self._schedule()
        return future

    def _schedule(self) -> None:
        if self._handle is None and self._jobs and not self.frozen and not self.dead:
            low, high = self._latency_ms
            delay_s = self._rng.uniform(low, high) / 1000
            self._handle = self._loop.call_later(delay_s, self._run_next)

    def _run_next(self) -> None:
        self._handle = None
        if self.dead or self.frozen or not self._jobs:
            return
        self._run(self._jobs.popleft())
        self._schedule()

    def _run(self, job: Job) -> None:
        future, fn, args, kwargs = job
        if not future.set_running_or_notify_cancel():
            return
        self.jobs_run += 1
        try:
            result = fn(*args, **kwargs)
        except PowerLoss:
            return  # the process is gone: nobody may hear of this job again
        except BaseException as exc:
            future.set_exception(exc)
        else:
            future.set_result(result)

    def freeze(self) -> None:
        """The process is paused: no job starts until :meth:`thaw`."""
        self.frozen = True
        self._cancel_timer()

    def _cancel_timer(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def thaw(self) -> None:
        self.frozen = False
        self._schedule()

    def kill(self) -> None:
        """The process died: queued jobs never run."""
        self.dead = True
        self._cancel_timer()
        self._jobs.clear()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        # A thread pool's shutdown waits for the jobs queued before it: run them now.
        self._cancel_timer()
        while self._jobs and not self.dead:
            job = self._jobs.popleft()
            if cancel_futures:
                job[0].cancel()
            else:
                self._run(job)
        self.dead = True
