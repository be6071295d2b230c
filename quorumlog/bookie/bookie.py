"""A bookie's storage and request logic, independent of sockets.

The server (``quorumlog.server``) decodes frames and calls :meth:`Bookie.submit`
for each request on its event loop; the bookie answers through the ``respond``
callback, also on that loop, possibly later (an add is answered only once its
journal batch is durable, R2; a long poll when the LAC moves or it times out).
No task is created per request: the hot path is plain calls and one
thread-safe wake-up per journal batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from quorumlog.bookie.config import BookieConfig
from quorumlog.proto.codec import Request, Response

Respond = Callable[[Response], None]


class BookieStartError(Exception):
    """The bookie refuses to start (cookie mismatch, damaged journal, ...); the message says why."""


class Bookie:
    """Journal + ledger storage + per-ledger state (fence, master key, LACs)."""

    def __init__(self, config: BookieConfig) -> None:
        raise NotImplementedError

    @classmethod
    def open(cls, config: BookieConfig) -> Bookie:
        """Check directories, replay the journal into ledger storage, and return the bookie.

        Raises BookieStartError with a clear message on a damaged journal (unless
        ``journal_skip_corruption``) or unusable directories.
        """
        raise NotImplementedError

    async def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the journal thread, checkpoints and the disk checker on ``loop``."""
        raise NotImplementedError

    def submit(self, request: Request, respond: Respond) -> None:
        """Handle one request; ``respond`` is called exactly once, on the loop."""
        raise NotImplementedError

    @property
    def read_only(self) -> bool:
        raise NotImplementedError

    def ledger_ids(self) -> set[int]:
        """Ledgers this bookie holds data or state for."""
        raise NotImplementedError

    def garbage_collect(self, live_ledger_ids: Iterable[int], snapshot: set[int]) -> int:
        """Drop ledgers in ``snapshot`` that are not live; returns how many were dropped."""
        raise NotImplementedError

    async def close(self) -> None:
        """Stop accepting work, answer what is queued, checkpoint, release files."""
        raise NotImplementedError
