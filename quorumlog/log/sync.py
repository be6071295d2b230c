"""The synchronous log API: the same names as the asyncio one, run on the client's loop.

Example::

    from quorumlog import BookKeeper

    with BookKeeper() as bk:
        log = bk.open_log("orders")
        writer = log.open_writer()
        position = writer.append(b"first")
        futures = [writer.append_nowait(b"x") for _ in range(1000)]   # pipelined
        writer.close()
        for record in log.open_reader():      # blocks for new records; Ctrl-C to stop
            print(record.position, record.data)
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

from quorumlog.client import sync as _client
from quorumlog.client.sync import LoopThread, ThreadedSubmitter
from quorumlog.errors import BKError
from quorumlog.log import bookkeeper as _aio_bookkeeper
from quorumlog.log import log as _aio
from quorumlog.log.config import LogConfig
from quorumlog.log.errors import LogClosedError
from quorumlog.log.metadata import LogMetadata
from quorumlog.log.position import LogPositions, Position, Record
from quorumlog.log.reader import LogReader as _AioLogReader
from quorumlog.log.writer import LogWriter as _AioLogWriter


class BookKeeper(_client.BookKeeper):
    """The synchronous client users get (:class:`quorumlog.BookKeeper`): ledgers, as in
    :class:`quorumlog.client.sync.BookKeeper`, plus the named log streams."""

    _aio_class = _aio_bookkeeper.BookKeeper
    _client: _aio_bookkeeper.BookKeeper

    @property
    def aio(self) -> _aio_bookkeeper.BookKeeper:
        """The asyncio client underneath (use it only on :attr:`loop`)."""
        return self._client

    def open_log(self, name: str, config: LogConfig | None = None) -> Log:
        """The named log stream ``name`` (created empty on first use); see quorumlog.log."""
        return Log(self._runner, self._runner.run(self._client.open_log(name, config)))

    def list_logs(self) -> list[str]:
        return self._runner.run(self._client.list_logs())

    def delete_log(self, name: str) -> list[int]:
        return self._runner.run(self._client.delete_log(name))


class Log:
    """One named log. See :class:`quorumlog.log.log.Log`."""

    def __init__(self, runner: LoopThread, log: _aio.Log) -> None:
        self._runner = runner
        self._log = log

    @property
    def aio(self) -> _aio.Log:
        """The asyncio log underneath (use it only on the client's loop)."""
        return self._log

    @property
    def name(self) -> str:
        return self._log.name

    @property
    def config(self) -> LogConfig:
        return self._log.config

    def metadata(self) -> tuple[LogMetadata, int]:
        return self._runner.run(self._log.metadata())

    def ledgers(self) -> list[int]:
        return self._runner.run(self._log.ledgers())

    def open_writer(self) -> LogWriter:
        return LogWriter(self._runner, self._runner.run(self._log.open_writer()))

    def open_reader(self, start: Position | tuple[int, int] | None = None) -> LogReader:
        return LogReader(self._runner, self._runner.run(self._log.open_reader(start)))

    def fence(self) -> list[int]:
        return self._runner.run(self._log.fence())

    def read_all(self, *, fence: bool = False) -> list[Record]:
        return self._runner.run(self._log.read_all(fence=fence))

    def positions(self) -> LogPositions:
        return self._runner.run(self._log.positions())

    def truncate(self, before: Position | tuple[int, int]) -> list[int]:
        return self._runner.run(self._log.truncate(before))

    def __repr__(self) -> str:
        return repr(self._log)


class LogWriter:
    """The log's writer. ``append`` waits; ``append_nowait`` returns a Future."""

    def __init__(self, runner: LoopThread, writer: _AioLogWriter) -> None:
        self._runner = runner
        self._writer = writer
        self._submitter: ThreadedSubmitter[Position] = ThreadedSubmitter(
            runner.loop, writer.append_nowait, writer._log.bk.config.max_outstanding_adds
        )

    @property
    def ledger_id(self) -> int:
        return self._writer.ledger_id

    @property
    def last_position(self) -> Position | None:
        return self._writer.last_position

    @property
    def is_fenced(self) -> bool:
        return self._writer.is_fenced

    @property
    def failure(self) -> BKError | None:
        return self._writer.failure

    def append(self, data: bytes) -> Position:
        """Append one record and wait until it is confirmed; returns its position."""
        return self._runner.run(self._writer.append(bytes(data)))

    def append_nowait(self, data: bytes) -> concurrent.futures.Future[Position]:
        """Send a record; the future gives its position once confirmed, in append order."""
        return self._submitter.submit(data)

    def rollover(self) -> int:
        return self._runner.run(self._writer.rollover())

    def close(self) -> None:
        """Wait for the appends sent so far, then close the current ledger."""

        async def drain_then_close() -> None:
            self._submitter.drain()
            await self._writer.close()

        self._runner.run(drain_then_close())

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._writer)


class LogReader:
    """A tailing reader; iterating it blocks for new records until it is closed."""

    def __init__(self, runner: LoopThread, reader: _AioLogReader) -> None:
        self._runner = runner
        self._reader = reader

    @property
    def position(self) -> Position:
        return self._reader.position

    def read_next(self, timeout_ms: float | None = None) -> Record | None:
        """The next record, or None after ``timeout_ms`` (None: wait as long as needed)."""
        return self._runner.run(self._reader.read_next(timeout_ms))

    def read_available(self, max_records: int = 10_000) -> list[Record]:
        return self._runner.run(self._reader.read_available(max_records))

    def __iter__(self) -> Iterator[Record]:
        while True:
            try:
                record = self.read_next(None)
            except LogClosedError:
                return
            if record is None:  # pragma: no cover - read_next(None) waits for a record
                return
            yield record

    def close(self) -> None:
        self._runner.run(self._reader.close())

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._reader)
