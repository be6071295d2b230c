"""A bookie as a process: start, serve until SIGTERM or SIGINT, stop, and the exit status.

Listens on ``listen.bind_host`` and registers ``HOST:PORT`` with HOST its
``advertised_host``. Prints ``bookie HOST:PORT ready`` (``ready read-only`` in
read-only mode) on stdout once it is registered, after ``bookie HOST:PORT admin URL``
when it serves the admin API; SIGTERM or SIGINT stop it gracefully (exit status 0,
after ``bookie HOST:PORT stopped``). A bookie that refuses to start (cookie mismatch,
damaged journal, port in use) prints one line on stderr and exits with status 2; an
unreachable metadata store or another runtime failure exits with status 1; a broken
invariant (a state that cannot be) stops the bookie at once with status 70
(:mod:`quorumlog.bookie.invariants`).

A *companion* is a service that shares the bookie's process and lifetime (the
co-hosted autorecovery of ``quorumlog bookie --autorecovery``). The server knows no
client, so it cannot build one: whoever starts the process passes a factory, called
once the bookie is registered, whose ``run()`` goes on until ``stop()``.

``python -m quorumlog.server`` runs a bookie with the bookie's flags (no companion).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from quorumlog.errors import BKError
from quorumlog.server.memory_tuning import keep_freed_memory, tune_for_serving
from quorumlog.server.open_files import raise_open_files_limit

if TYPE_CHECKING:
    from quorumlog.bookie.config import BookieConfig
    from quorumlog.server.config import ServerConfig
    from quorumlog.server.server import BookieServer

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_REFUSED = 2  # refused to start (or to go on): the operator must act
_COMPANION_STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Listen:
    """Where the bookie listens and the host it registers (and its cookie records)."""

    port: int
    bind_host: str
    advertised_host: str


class Companion(Protocol):
    """A service run beside the bookie, in its process, until the bookie stops."""

    async def run(self) -> None: ...

    def stop(self) -> None: ...


# Called once the bookie is registered, with the running server and the metadata URI.
CompanionFactory = Callable[["BookieServer", str], Companion]


def run_bookie(
    config: BookieConfig,
    server_config: ServerConfig,
    uri: str,
    listen: Listen,
    *,
    companion: CompanionFactory | None = None,
    prog: str = "quorumlog bookie",
) -> int:
    """Run one bookie in this process until SIGTERM or SIGINT; returns the exit status
    (errors go to stderr as one line, prefixed with ``prog``)."""
    from quorumlog.bookie.bookie import BookieStartError

    keep_freed_memory()  # before the first big buffer
    raise_open_files_limit()
    loop = new_event_loop()
    try:
        return loop.run_until_complete(
            serve(config, server_config, uri, listen, companion=companion, prog=prog)
        )
    except BookieStartError as exc:
        print(f"{prog}: refusing to start: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except (BKError, OSError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        loop.close()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when present, else asyncio's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a declared dependency
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


async def serve(
    config: BookieConfig,
    server_config: ServerConfig,
    uri: str,
    listen: Listen,
    *,
    companion: CompanionFactory | None = None,
    prog: str = "quorumlog bookie",
) -> int:
    """Start the bookie, serve until SIGTERM or SIGINT (or a failure), stop; the exit
    status. Raises the start-up error (BookieStartError, BKError, OSError)."""
    from quorumlog.bookie.bookie import BookieStartError
    from quorumlog.server.server import BookieServer

    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop_requested.set)
    server = BookieServer(
        config,
        uri,
        port=listen.port,
        host=listen.bind_host,
        advertised_host=listen.advertised_host,
        server_config=server_config,
    )
    beside: Companion | None = None
    beside_task: asyncio.Task[None] | None = None
    starting = loop.create_task(server.start())
    stop_wait = loop.create_task(stop_requested.wait())
    try:
        await asyncio.wait({starting, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            # Stopped while starting: start() releases what it opened when cancelled.
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, BKError, OSError):
                await starting
            return EXIT_OK
        starting.result()  # raises the start-up error, if any
        tune_for_serving()
        mode = " read-only" if server.registered_read_only else ""
        if server_config.http_port is not None:
            scheme = "https" if server_config.tls is not None else "http"
            admin_url = f"{scheme}://{listen.advertised_host}:{server.http_port}"
            print(f"bookie {server.address} admin {admin_url}", flush=True)
        print(f"bookie {server.address} ready{mode}", flush=True)
        if companion is not None:
            beside = companion(server, uri)
            beside_task = loop.create_task(beside.run())
        failed_wait = loop.create_task(server.failed.wait())
        await asyncio.wait({stop_wait, failed_wait}, return_when=asyncio.FIRST_COMPLETED)
        failed_wait.cancel()
    finally:
        stop_wait.cancel()
        if beside is not None and beside_task is not None:
            beside.stop()
            with contextlib.suppress(asyncio.CancelledError, BKError):
                await asyncio.wait_for(beside_task, _COMPANION_STOP_TIMEOUT_S)
    await server.stop()
    if server.failure is not None:
        # Serving unlisted helps nobody: exit, and let the supervisor start it again.
        failure = server.failure
        refused = isinstance(failure, BookieStartError)
        what = "refusing to go on" if refused else "failed"
        print(f"{prog}: {what}: {failure}", file=sys.stderr)
        return EXIT_REFUSED if refused else EXIT_FAILURE
    print(f"bookie {server.address} stopped", flush=True)
    return EXIT_OK
