"""Waiting for a wake event without losing a cancellation.

``asyncio.wait_for(event.wait(), timeout)`` returns normally on Python 3.11 when the
event is set in the same loop turn as the waiting task is cancelled: the cancellation
is dropped, and a loop around it goes round again for ever (a daemon told to stop, or
whose session was lost, never ends). :func:`wait_event` lets a cancellation through
always.
"""

from __future__ import annotations

import asyncio

__all__ = ["wait_event"]


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Until ``event`` is set or ``timeout_s`` passed; whether it is set. A cancellation
    of the caller always raises ``CancelledError`` here."""
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter}, timeout=timeout_s)
    finally:
        waiter.cancel()
    return event.is_set()
