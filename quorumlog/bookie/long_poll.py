"""Parked long-poll reads: answered when the ledger's LAC passes theirs, or on timeout.

One loop timer per parked read and no task. Bounded per ledger and in total:
beyond the bound a new poll is refused (TOO_MANY_REQUESTS) rather than held.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from quorumlog.proto.codec import ReadRequest

Answer = Callable[["Poll"], None]


class Poll:
    """One parked read."""

    __slots__ = ("handle", "request", "respond")

    def __init__(self, request: ReadRequest, respond: Callable[[Any], None]) -> None:
        self.request = request
        self.respond = respond
        self.handle: asyncio.TimerHandle | None = None


class LongPolls:
    """The parked reads of one bookie, by ledger (event loop only)."""

    def __init__(self, max_per_ledger: int, max_total: int) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None  # set when the bookie starts
        self.max_per_ledger = max_per_ledger
        self.max_total = max_total
        self._by_ledger: dict[int, list[Poll]] = {}
        self.total = 0

    def __contains__(self, ledger_id: int) -> bool:
        return ledger_id in self._by_ledger

    def park(
        self,
        request: ReadRequest,
        respond: Callable[[Any], None],
        timeout_s: float,
        on_timeout: Answer,
    ) -> bool:
        """Park ``request``; False when a bound is reached (the caller refuses it)."""
        polls = self._by_ledger.get(request.ledger_id)
        if self.total >= self.max_total or (
            polls is not None and len(polls) >= self.max_per_ledger
        ):
            return False
        poll = Poll(request, respond)
        if polls is None:
            polls = self._by_ledger[request.ledger_id] = []
        polls.append(poll)
        self.total += 1
        assert self.loop is not None
        poll.handle = self.loop.call_later(timeout_s, self._expire, poll, on_timeout)
        return True

    def _expire(self, poll: Poll, on_timeout: Answer) -> None:
        polls = self._by_ledger.get(poll.request.ledger_id)
        if polls is None or poll not in polls:
            return
        polls.remove(poll)
        if not polls:
            del self._by_ledger[poll.request.ledger_id]
        self.total -= 1
        on_timeout(poll)

    def ready(self, ledger_id: int, lac: int) -> list[Poll]:
        """Unpark and return the polls of ``ledger_id`` whose previous LAC is below ``lac``."""
        polls = self._by_ledger.get(ledger_id)
        if not polls:
            return []
        woken = [p for p in polls if p.request.previous_lac < lac]
        if not woken:
            return []
        if len(woken) == len(polls):
            del self._by_ledger[ledger_id]
        else:
            self._by_ledger[ledger_id] = [p for p in polls if p.request.previous_lac >= lac]
        self.total -= len(woken)
        for poll in woken:
            if poll.handle is not None:
                poll.handle.cancel()
        return woken

    def take(self, ledger_id: int) -> list[Poll]:
        """Unpark every poll of ``ledger_id`` (the ledger was deleted)."""
        polls = self._by_ledger.pop(ledger_id, [])
        self.total -= len(polls)
        for poll in polls:
            if poll.handle is not None:
                poll.handle.cancel()
        return polls

    def take_all(self) -> list[Poll]:
        out: list[Poll] = []
        for ledger_id in list(self._by_ledger):
            out += self.take(ledger_id)
        return out
