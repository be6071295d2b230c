"""The timed jobs of one bookie (checkpoints, disk checks) on its event loop.

Stopping them is the first step of a close: a job that fires or finishes after that
must not start new work on files that are about to be released, so every job checks
:attr:`Timers.stopped` before it acts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator


class Timers:
    """Loop timers of one bookie; :meth:`stop` cancels them and marks the bookie closing."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None  # set when the bookie starts
        self.stopped = False
        self._handles: list[asyncio.TimerHandle] = []

    def schedule(self, delay_ms: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` once after ``delay_ms`` (jobs reschedule themselves)."""
        assert self.loop is not None
        now = self.loop.time()
        # Forget the handles that already fired, so the list stays as short as the jobs.
        self._handles = [t for t in self._handles if not t.cancelled() and t.when() > now]
        self._handles.append(self.loop.call_later(delay_ms / 1000, callback))

    def call_soon(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the next loop turn, unless not started yet or stopped."""
        if self.loop is not None and not self.stopped:
            self.loop.call_soon(callback)

    def stop(self) -> None:
        self.stopped = True
        for handle in self._handles:
            handle.cancel()
        self._handles.clear()

    def __iter__(self) -> Iterator[asyncio.TimerHandle]:
        return iter(self._handles)
