"""The bookie server: a :class:`~quorumlog.bookie.bookie.Bookie` behind a TCP listener.

Start-up, in this order (each step refuses with :class:`BookieStartError` and a
message that names what is wrong):

1. bind the listening socket on the bind host (127.0.0.1 unless given; not yet
   accepting): the port is the one asked for, else the one the cookie records (a
   restarted bookie keeps its identity), else a free one; the address
   ``ADVERTISED_HOST:PORT`` (the advertised host is the bind host unless given) is
   the bookie's id, registered, and recorded by its cookie;
2. open the metadata store;
3. check the cookies: the copies in the data and journal directories against
   the metadata store's copy (a wiped or swapped directory refuses to start);
   the first start writes all of them;
4. open the bookie (journal replay) and start it;
5. accept connections;
6. register as writable (or read-only) in the bookie registry.

Then it follows read-only changes by moving the registration, registers again
when a lost metadata session comes back, and collects garbage periodically.

Stop (:meth:`BookieServer.stop`): stop accepting, read no more requests, leave
the registry, let in-flight requests be answered (bounded), close the bookie,
close the connections, close the store.

Example::

    server = BookieServer(BookieConfig(data_dir=Path("/tmp/b1")), "sqlite:///tmp/m.db")
    await server.start()
    print(server.address)
    ...
    await server.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import socket
from typing import TYPE_CHECKING

from quorumlog.bookie.bookie import Bookie, BookieStartError
from quorumlog.bookie.config import BookieConfig
from quorumlog.errors import BKError
from quorumlog.meta.factory import open_store
from quorumlog.meta.store import MetadataStore, SessionState
from quorumlog.server import cookies
from quorumlog.server.config import ServerConfig
from quorumlog.server.connection import BookieProtocol, RequestBudget
from quorumlog.server.gc import StoreGcMetadata, collect_once, gc_loop
from quorumlog.server.registration import Registration

if TYPE_CHECKING:
    from quorumlog.server.admin_http import AdminContext, AdminServer

log = logging.getLogger(__name__)

LISTEN_HOST = "127.0.0.1"
_REFUSAL_LOG_INTERVAL_S = 10.0


class _RefusedConnection(asyncio.Protocol):
    """A connection beyond ``max_connections``: closed as soon as it is made (R16)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class BookieServer:
    """One bookie process's network side. See the module docstring for the life cycle."""

    def __init__(
        self,
        config: BookieConfig,
        metadata_uri: str,
        port: int = 0,
        host: str = LISTEN_HOST,
        server_config: ServerConfig | None = None,
        advertised_host: str | None = None,
    ) -> None:
        self.config = config
        self.metadata_uri = metadata_uri
        self.server_config = server_config or ServerConfig()
        self._requested_port = port
        self._host = host
        # What clients connect to; a wildcard bind host (0.0.0.0) cannot be it.
        self._advertised_host = advertised_host or host
        if self._advertised_host in ("0.0.0.0", ""):
            raise BookieStartError(
                f"bookie bound to {host!r} (every interface) needs an advertised host"
            )
        self.address = ""
        self.bookie: Bookie | None = None
        self.store: MetadataStore | None = None
        self._registration: Registration | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[BookieProtocol] = set()
        self._budget = RequestBudget(
            self.server_config.max_in_flight_bytes,
            floor_bytes=self.server_config.max_frame_size_bytes,
        )
        self._refused = 0  # connections refused since the last warning about them
        self._refusal_logged_at = -_REFUSAL_LOG_INTERVAL_S
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = asyncio.Event()
        self._session_task: asyncio.Task[None] | None = None
        # Set when the bookie cannot go on serving (its cookie refused on a new metadata
        # session): the process should exit so that a supervisor restarts it.
        self.failure: BaseException | None = None
        self.failed = asyncio.Event()
        self._started = False
        self._stopping = False
        self._admin: AdminServer | None = None
        # What the admin API serves (its metrics registry, a scrape hook): autorecovery
        # run in this process adds its metrics there.
        self.admin_context: AdminContext | None = None
        self.http_port = 0  # the admin API's port once it serves

    # ------------------------------------------------------------ start

    async def start(self) -> None:
        """Run the start-up sequence; on failure everything opened so far is closed."""
        self._loop = asyncio.get_running_loop()
        try:
            await self._start()
        except BaseException:
            await self._release()
            raise
        self._started = True

    async def _start(self) -> None:
        loop = self._loop
        assert loop is not None
        config = self.config
        sc = self.server_config
        recorded_port = cookies.recorded_port(config)
        port = self._requested_port or recorded_port or 0
        self._server = await self._bind(port, from_cookie=not self._requested_port)
        bound_port = self._server.sockets[0].getsockname()[1]
        self.address = f"{self._advertised_host}:{bound_port}"

        self.store = await self._open_store()
        from quorumlog.meta.bookies import BookieRegistry

        await cookies.verify_or_create(BookieRegistry(self.store), config, self.address)

        # The bookie itself warns loudly at start when journal sync is off (R2).
        # Journal replay reads files: keep it off the loop so the metadata session's
        # heartbeats keep flowing.
        self.bookie = await asyncio.to_thread(Bookie.open, config)
        await self.bookie.start(loop)
        # A forced gc (shell, admin API) runs a collection round against the store first.
        self.bookie.gc_round = self.collect_garbage

        await self._server.start_serving()
        log.info("bookie %s accepting connections", self.address)

        # The admin API serves before the bookie registers: its address is published in
        # the registration, where `quorumlog shell gc` finds it.
        if sc.http_port is not None:
            await self._start_admin(sc.http_port)
        await self._register(self.store)
        self._watch_read_only(self.bookie)
        self._tasks.append(
            loop.create_task(gc_loop(self.bookie, self._gc_metadata(), sc.gc_interval_ms))
        )

    async def _start_admin(self, port: int) -> None:
        # Imported here: a bookie without --http-port loads no HTTP server.
        from quorumlog.server.admin_http import AdminContext, AdminServer, build_admin_app
        from quorumlog.server.metrics import bookie_registry

        ctx = AdminContext(
            store=lambda: self.store,
            bookie=self.bookie,
            bookie_id=self.address,
            registry=bookie_registry(self),
            gc_round=self.collect_garbage,
            shutting_down=lambda: self._stopping,
            token_verifier=self.server_config.token_verifier,
        )
        # HTTPS with the bookie port's certificates (docs/SECURITY.md).
        tls = self.server_config.tls
        ssl_context = tls.server_front_context() if tls is not None else None
        admin = AdminServer(build_admin_app(ctx), self._host, port, ssl_context)
        try:
            await admin.start()
        except OSError as exc:
            raise BookieStartError(
                f"bookie {self.address}: cannot serve the admin API on {self._host}:{port}: "
                f"{exc.strerror or exc}"
            ) from None
        self._admin = admin
        self.admin_context = ctx
        self.http_port = admin.port
        scheme = "https" if ssl_context is not None else "http"
        log.info("bookie %s: admin API on %s://%s:%d", self.address, scheme, self._host, admin.port)

    async def _open_store(self) -> MetadataStore:
        sc = self.server_config
        try:
            return await asyncio.wait_for(
                open_store(self.metadata_uri, session_timeout_ms=sc.metadata_session_timeout_ms),
                sc.metadata_connect_timeout_ms / 1000,
            )
        except TimeoutError:
            raise BKError(
                f"metadata store {self.metadata_uri} unreachable: no session within "
                f"{sc.metadata_connect_timeout_ms / 1000:.0f} s"
            ) from None

    async def _register(self, store: MetadataStore) -> None:
        """Register on ``store``'s session and follow that session."""
        from quorumlog.meta.bookies import BookieRegistry

        assert self.bookie is not None
        store.add_session_listener(self._on_session)
        self._registration = Registration(
            BookieRegistry(store),
            store,
            self.address,
            verify_interval_ms=10_000,
            service_info=self._service_info(),
        )
        await self._registration.start(
            self.bookie.read_only, timeout_s=self.server_config.registration_timeout_ms / 1000
        )

    def _service_info(self) -> bytes:
        """The registration's data: the bookie's place (``rack``, /REGION/RACK) and the
        admin API's address when it serves."""
        # The advertised host, as for the bookie's own address: the bind address may be
        # a wildcard other machines cannot connect to.
        scheme = "https" if self.server_config.tls is not None else "http"
        http = f"{scheme}://{self._advertised_host}:{self.http_port}"
        info = {"rack": self.server_config.location}
        if self._admin:
            info["http"] = http
        return json.dumps(info, sort_keys=True).encode()

    def _gc_metadata(self) -> StoreGcMetadata:
        def store() -> MetadataStore:
            assert self.store is not None
            return self.store  # the current one: a lost session brings a new store

        return StoreGcMetadata(
            store, self.address, reads_per_s=self.server_config.gc_metadata_reads_per_s
        )

    # ------------------------------------------------------------ session loss

    def _on_session(self, state: SessionState) -> None:
        if state is not SessionState.LOST or self._stopping or self._session_task is not None:
            return
        log.warning("bookie %s: metadata session lost; opening a new one", self.address)
        assert self._loop is not None
        self._session_task = self._loop.create_task(self._new_session())

    async def _new_session(self) -> None:
        """A lost session is final for its store (its ephemeral registration is gone):
        open a new store, check the cookie again (the store may have changed while this
        bookie was cut off from it), register on it, and close the old one. A refused
        cookie, or anything unexpected, fails the server (see ``failed``) rather than
        leaving a bookie that serves but is never listed."""
        try:
            while not self._stopping:
                await self._register_on_new_session()
                store = self.store
                if store is None or store.session_state is not SessionState.LOST:
                    break
                # The new session was lost too (a second partition) while this task ran,
                # so its listener's call was not acted on: start over.
                log.warning("bookie %s: the new metadata session was lost too", self.address)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.error("bookie %s: cannot register again: %s", self.address, exc)
            self.failure = exc
            self.failed.set()
        finally:
            self._session_task = None

    async def _register_on_new_session(self) -> None:
        from quorumlog.meta.bookies import BookieRegistry

        old_store, old_registration = self.store, self._registration
        if old_registration is not None:
            await old_registration.abandon()
        delay_s = 0.2
        store: MetadataStore | None = None
        for _ in range(1_000_000):  # until it works or the server stops
            if self._stopping:
                return
            try:
                store = await self._open_store()
                await cookies.verify_or_create(BookieRegistry(store), self.config, self.address)
                break
            except (BKError, OSError, BookieStartError) as exc:
                if store is not None:
                    with contextlib.suppress(TimeoutError, BKError, OSError):
                        await asyncio.wait_for(store.close(), 5.0)
                    store = None
                if isinstance(exc, BookieStartError):
                    raise
                log.warning("bookie %s: metadata store: %s (retrying)", self.address, exc)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, 5.0)
        if store is None:
            return
        self.store = store
        try:
            await self._register(store)
            log.warning("bookie %s: registered again on a new metadata session", self.address)
        except BKError as exc:
            log.warning("bookie %s: %s (still trying)", self.address, exc)
        finally:
            if old_store is not None:
                with contextlib.suppress(TimeoutError, BKError, OSError):
                    await asyncio.wait_for(old_store.close(), 5.0)

    async def _bind(self, port: int, *, from_cookie: bool) -> asyncio.Server:
        loop = self._loop
        assert loop is not None
        try:
            return await loop.create_server(
                self._make_protocol,
                self._host,
                port,
                family=socket.AF_INET,
                backlog=self.server_config.listen_backlog,
                reuse_address=True,
                start_serving=False,
                # TLS (docs/SECURITY.md): each handshake takes the current certificates.
                ssl=tls.server_front_context() if (tls := self.server_config.tls) else None,
                ssl_handshake_timeout=(
                    self.server_config.tls_handshake_timeout_ms / 1000 if tls else None
                ),
            )
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                why = (
                    f"the cookie in {self.config.data_dir} records port {port}, which is the "
                    f"bookie's identity"
                    if from_cookie and port
                    else "asked for with --port"
                )
                raise BookieStartError(
                    f"bookie {self._host}:{port}: port {port} is in use ({why}); stop the "
                    f"process holding it"
                ) from None
            raise BookieStartError(f"bookie {self._host}:{port}: cannot listen: {exc}") from None

    def _make_protocol(self) -> asyncio.Protocol:
        assert self.bookie is not None and self._loop is not None
        if len(self._connections) >= self.server_config.max_connections:
            self._refuse()
            return _RefusedConnection()
        protocol = BookieProtocol(
            self.bookie,
            self.server_config,
            self._loop,
            self._connections.discard,
            self._budget,
            self.bookie.halt,
        )
        self._connections.add(protocol)
        if self.server_config.tls is not None:
            # A handshake that fails or times out never reaches the protocol (neither
            # connection_made nor connection_lost): without this, each would hold one of
            # max_connections for good. asyncio gives up the handshake at the deadline;
            # a second after it, a protocol never made is forgotten.
            handshake_s = self.server_config.tls_handshake_timeout_ms / 1000
            self._loop.call_later(handshake_s + 1.0, self._forget_if_never_made, protocol)
        if self._stopping:
            protocol.drain()
        return protocol

    def _forget_if_never_made(self, protocol: BookieProtocol) -> None:
        if not protocol.made:
            self._connections.discard(protocol)

    def _refuse(self) -> None:
        # One warning per interval, not one per connection: a flood must not flood the log.
        assert self._loop is not None
        self._refused += 1
        now = self._loop.time()
        if now - self._refusal_logged_at >= _REFUSAL_LOG_INTERVAL_S:
            log.warning(
                "bookie %s: %d connection(s) closed at once: already holding max_connections=%d",
                self.address,
                self._refused,
                self.server_config.max_connections,
            )
            self._refused = 0
            self._refusal_logged_at = now

    def _watch_read_only(self, bookie: Bookie) -> None:
        def changed(*_: object) -> None:
            if self._registration is not None and not self._stopping:
                self._registration.set_read_only(bookie.read_only)

        add_listener = getattr(bookie, "add_read_only_listener", None)
        if add_listener is not None:
            add_listener(changed)

        async def poll() -> None:
            interval_s = self.server_config.read_only_poll_interval_ms / 1000
            while True:
                await asyncio.sleep(interval_s)
                changed()

        assert self._loop is not None
        self._tasks.append(self._loop.create_task(poll()))

    # ------------------------------------------------------------ running

    @property
    def registered_read_only(self) -> bool | None:
        """How the registry lists this bookie now: False writable, True read-only, None absent."""
        return self._registration.registered_read_only if self._registration else None

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    async def collect_garbage(self) -> int:
        """One garbage-collection round now (tests, operators); returns ledgers dropped.

        GcSkipped when the store cannot prove any deletion (R15)."""
        assert self.bookie is not None
        return await collect_once(self.bookie, self._gc_metadata())

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # ------------------------------------------------------------ stop

    async def stop(self) -> None:
        """Graceful stop; safe to call more than once."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        await self._release()

    async def _release(self) -> None:
        self._stopping = True
        sc = self.server_config
        timeout_s = sc.stop_timeout_ms / 1000
        if self._server is not None:
            self._server.close()  # stop accepting
        if self._admin is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._admin.stop(), 2.0)
            self._admin = None
        for protocol in list(self._connections):
            protocol.drain()  # read no more requests
        if self._session_task is not None:
            self._tasks.append(self._session_task)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self._registration is not None:
            await self._registration.stop(timeout_s=timeout_s)
        # Parked long polls are answered by the bookie's close: do not wait for them here.
        await self._wait_answered(timeout_s, polls=False)
        if self.bookie is not None:
            try:
                await self.bookie.close()  # answers what is still queued
            except Exception:
                log.exception("bookie %s: error while closing storage", self.address)
        await self._wait_answered(1.0)
        for protocol in list(self._connections):
            protocol.abort()
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
        if self.store is not None:
            try:
                await asyncio.wait_for(self.store.close(), timeout_s)
            except (TimeoutError, BKError, OSError) as exc:
                log.warning("bookie %s: closing the metadata store: %s", self.address, exc)
        self._stopped.set()

    async def _wait_answered(self, timeout_s: float, *, polls: bool = True) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline and any(
            p.in_flight - (0 if polls else p.polls) for p in self._connections
        ):
            await asyncio.sleep(0.01)
