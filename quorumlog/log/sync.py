"""The synchronous log streams: the asyncio ones through the client's blocking proxy.

Example::

    from quorumlog import BookKeeper, LogNamespace

    with BookKeeper() as bk:
        log = LogNamespace(bk).open_log("orders")
        writer = log.open_writer()
        position = writer.append(b"first")
        futures = [writer.append_nowait(b"x") for _ in range(1000)]   # pipelined
        writer.close()
        for record in log.open_reader():      # blocks for new records; Ctrl-C to stop
            print(record.position, record.data)
"""

from __future__ import annotations

from quorumlog.client.sync import Blocking, BookKeeper
from quorumlog.log import namespace as _aio


class LogNamespace(Blocking[_aio.LogNamespace]):
    """:class:`quorumlog.log.namespace.LogNamespace` over a synchronous client: the
    same names, blocking calls; the logs it opens, their writers and readers are
    proxies too (``writer.append_nowait`` returns a ``concurrent.futures.Future``)."""

    def __init__(self, bk: BookKeeper) -> None:
        super().__init__(bk._runner, _aio.LogNamespace(bk.aio), nowait_limit=bk._nowait_limit)
