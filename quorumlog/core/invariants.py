"""What the core's state machines check about themselves.

Each machine checks its invariants at the end of every step, and an event that cannot
arrive in its current phase fails at once: a bug found where it happens, not entries
lost three steps later (TigerBeetle's way). The checks are plain comparisons on a
step that is not per entry (the writer's per-entry paths, ``add`` and ``ack``, keep
their invariant by construction), so they stay on in production.

:class:`CoreInvariantError` is an ``AssertionError``: the client never retries it or
turns it into a metadata error; it fails the handle or the recovery with it.
"""

from __future__ import annotations


class CoreInvariantError(AssertionError):
    """A protocol state machine reached a state its rules forbid: a bug."""


def require(condition: bool, message: str) -> None:
    """Fail with ``message`` unless ``condition`` (never stripped by ``python -O``)."""
    if not condition:
        raise CoreInvariantError(message)
