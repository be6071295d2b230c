"""The asyncio BookKeeper client users get: ledgers, plus the named log streams.

The client package knows ledgers only; log streams are built on top of it. This
class composes the two so that ``await bk.open_log(name)`` works on the client
that :mod:`quorumlog.aio` exports.

Example::

    from quorumlog.aio import BookKeeper

    async with await BookKeeper.connect(uri) as bk:
        log = await bk.open_log("orders")
        writer = await log.open_writer()
"""

from __future__ import annotations

from quorumlog.client import bookkeeper as _client
from quorumlog.log.config import LogConfig
from quorumlog.log.log import Log, delete_log, list_logs, open_log


class BookKeeper(_client.BookKeeper):
    """:class:`quorumlog.client.bookkeeper.BookKeeper` with the log streams of
    :mod:`quorumlog.log` as methods."""

    async def open_log(self, name: str, config: LogConfig | None = None) -> Log:
        """The named log stream ``name`` (created empty on first use); see quorumlog.log."""
        self._check_open()
        return await open_log(self, name, config)

    async def list_logs(self) -> list[str]:
        """Names of the log streams in the metadata store, sorted."""
        self._check_open()
        return await list_logs(self)

    async def delete_log(self, name: str) -> list[int]:
        """Delete a log stream and its ledgers; returns the ledgers deleted."""
        self._check_open()
        return await delete_log(self, name)
