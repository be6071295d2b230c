"""The named log streams over a client, after DistributedLog's namespace.

Example::

    from quorumlog.aio import BookKeeper, LogNamespace

    async with await BookKeeper.connect(uri) as bk:
        logs = LogNamespace(bk)
        log = await logs.open_log("orders")      # created empty on first use
        writer = await log.open_writer()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quorumlog.log.log import Log, delete_log, list_logs, open_log

if TYPE_CHECKING:
    from quorumlog.client.bookkeeper import BookKeeper
    from quorumlog.log.config import LogConfig


class LogNamespace:
    """The log streams of the metadata store ``bk`` is connected to."""

    def __init__(self, bk: BookKeeper) -> None:
        self.bk = bk

    async def open_log(self, name: str, config: LogConfig | None = None) -> Log:
        """The named log stream ``name`` (created empty on first use); see quorumlog.log."""
        self.bk.check_open()
        return await open_log(self.bk, name, config)

    async def list_logs(self) -> list[str]:
        """Names of the log streams in the metadata store, sorted."""
        self.bk.check_open()
        return await list_logs(self.bk)

    async def delete_log(self, name: str) -> list[int]:
        """Delete a log stream and its ledgers; returns the ledgers deleted."""
        self.bk.check_open()
        return await delete_log(self.bk, name)

    def __repr__(self) -> str:
        return f"<LogNamespace {self.bk.metadata_uri}>"
