"""Keep a bookie's entry in the registry equal to what it is: writable, read-only, or gone.

The registration is an ephemeral node of the metadata session. One task
reconciles the wanted state with the registered one, so that changes (read-only
mode on and off, a session lost and a new one made, the stop) are applied in
order, one at a time, retried while the store is unreachable.

A node under this bookie's address left by an earlier run of the same bookie
(killed before its session ended) is replaced rather than waited out: the
server holds the address's port, so that run is certainly gone.

A registration lives and dies with its store's session: once that session is
lost, the server abandons it and makes a new one on a new store. Abandoning
does not rely on cancelling the task alone: on Python 3.11 ``asyncio.wait_for``
swallows a cancel that lands in the same turn as the result it waits for, and
kazoo fails every pending call (SessionExpired) at the very moment it reports the
session lost, so a registration checking the registry then would otherwise go on
retrying on the dead session for ever and the bookie would never be listed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from quorumlog.errors import BKError, NodeExistsError, NoNodeError, SessionExpiredError
from quorumlog.meta.store import MetadataStore, SessionState

log = logging.getLogger(__name__)

_RETRY_MIN_S = 0.2
_RETRY_MAX_S = 3.0
# How long abandon() waits for the task to end (it ends at its next step once told).
_ABANDON_WAIT_S = 5.0


class Registry(Protocol):
    async def register(
        self, address: str, read_only: bool = False, *, service_info: bytes = b""
    ) -> None: ...

    async def unregister(self, address: str) -> None: ...

    async def writable_bookies(self) -> list[str]: ...

    async def readonly_bookies(self) -> list[str]: ...


class Registration:
    """The registry entry of one bookie."""

    def __init__(
        self,
        registry: Registry,
        store: MetadataStore,
        address: str,
        *,
        verify_interval_ms: int = 10_000,
        service_info: bytes = b"",
    ) -> None:
        self._registry = registry
        # The node's data (JSON): what clients and tools learn about this bookie there,
        # such as its admin HTTP address.
        self._service_info = service_info
        self._store = store
        self.address = address
        self._verify_interval_s = verify_interval_ms / 1000
        self._wanted: bool | None = None  # read_only flag, or None: not registered
        self._current: bool | None = None
        # True once this process's session made the node: a node found under the address
        # before that was left by an earlier run and is replaced.
        self._owned = False
        self._changed = asyncio.Event()
        self._applied = asyncio.Event()
        # Set when the store's session is lost: nothing can be registered on it any more,
        # so whoever waits for the registration must hear of it now, not at its timeout.
        self._session_lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._abandoned = False  # the session is gone: the task must end, whatever it does
        store.add_session_listener(self._on_session)

    @property
    def registered_read_only(self) -> bool | None:
        """What the registry says now (None: not registered)."""
        return self._current

    async def start(self, read_only: bool, timeout_s: float) -> None:
        """Register and wait until it is done (BKError after ``timeout_s``)."""
        self._wanted = read_only
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._changed.set()
        await self._wait_applied(timeout_s)

    def set_read_only(self, read_only: bool) -> None:
        """Move the registration (applied in the background)."""
        if self._stopping or self._wanted == read_only:
            return
        log.warning(
            "bookie %s is now %s", self.address, "read-only" if read_only else "writable again"
        )
        self._wanted = read_only
        self._applied.clear()
        self._changed.set()

    async def stop(self, timeout_s: float) -> None:
        """Unregister (best effort within ``timeout_s``) and stop the task."""
        if self._abandoned:
            return  # its session, and the node with it, is gone: nothing to remove
        self._stopping = True
        self._wanted = None
        self._applied.clear()
        self._changed.set()
        try:
            await self._wait_applied(timeout_s)
        except BKError as exc:
            log.warning("bookie %s: unregistering failed: %s", self.address, exc)
        await self.abandon()  # ends the task, boundedly

    async def abandon(self) -> None:
        """Stop without unregistering (the session, and with it the node, is gone).

        Returns within a few seconds whatever the task is doing (see the module
        docstring for why a cancel alone is not enough)."""
        self._stopping = True
        self._abandoned = True
        self._changed.set()
        task = self._task
        if task is None:
            return
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=_ABANDON_WAIT_S)
        if not done:
            log.warning("bookie %s: the old registration task did not end", self.address)
        elif not task.cancelled() and task.exception() is not None:
            log.warning("bookie %s: old registration: %s", self.address, task.exception())

    async def _wait_applied(self, timeout_s: float) -> None:
        applied = asyncio.ensure_future(self._applied.wait())
        lost = asyncio.ensure_future(self._session_lost.wait())
        try:
            await asyncio.wait(
                {applied, lost}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            applied.cancel()
            lost.cancel()
        if self._applied.is_set():
            return
        if self._session_lost.is_set():
            raise BKError(
                f"bookie {self.address}: the metadata session of {self._store.uri} was lost "
                "before its registration was confirmed"
            )
        raise BKError(
            f"bookie {self.address}: could not update its registration in the metadata "
            f"store {self._store.uri} within {timeout_s:.0f} s"
        )

    # ------------------------------------------------------------ session

    def _on_session(self, state: SessionState) -> None:
        if state is SessionState.LOST:
            # The ephemeral node went with the session.
            self._current = None
            self._owned = False
            self._session_lost.set()
            if not self._stopping:
                log.info("bookie %s: registration gone with the metadata session", self.address)
        if state is SessionState.CONNECTED and self._wanted is not None:
            self._changed.set()

    # ------------------------------------------------------------ reconciliation

    async def _run(self) -> None:
        delay_s = _RETRY_MIN_S
        while not self._abandoned:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self._verify_interval_s)
            self._changed.clear()
            if self._abandoned:
                return
            try:
                await self._reconcile()
            except asyncio.CancelledError:
                raise
            except (BKError, OSError) as exc:
                task = asyncio.current_task()
                if self._abandoned or (task is not None and task.cancelling()):
                    return  # told to end in the turn the call failed (see the docstring)
                if isinstance(exc, SessionExpiredError):
                    # Nothing can be registered on this session any more: the server
                    # replaces it with a new one (and abandons this registration).
                    log.info("bookie %s: registration: %s", self.address, exc)
                else:
                    log.warning("bookie %s: registration: %s (retrying)", self.address, exc)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, _RETRY_MAX_S)
                self._changed.set()
                continue
            delay_s = _RETRY_MIN_S
            if self._current == self._wanted:
                self._applied.set()

    async def _listed_as(self) -> bool | None:
        if self.address in await self._registry.writable_bookies():
            return False
        if self.address in await self._registry.readonly_bookies():
            return True
        return None

    async def _reconcile(self) -> None:
        # Ask the registry rather than trusting memory: a session can be replaced
        # without this process being told in time.
        listed = await self._listed_as()
        self._current = listed
        wanted = self._wanted
        if listed == wanted and (self._owned or wanted is None):
            return
        # Moving between writable and read-only: register() makes the new node before it
        # removes the old one, so the bookie is never in neither list, which the auditor
        # (at a recovery delay of 0) would take for a lost bookie and copy its data away.
        # Unregistered first only to go, or to replace a node an earlier run left.
        if listed is not None and (wanted is None or listed == wanted):
            with contextlib.suppress(NoNodeError):
                await self._registry.unregister(self.address)
            self._current = None
            self._owned = False
        if wanted is None:
            return
        try:
            await self._registry.register(
                self.address, read_only=wanted, service_info=self._service_info
            )
        except NodeExistsError:
            # Left by an earlier run of this bookie whose session has not expired.
            log.info("bookie %s: replacing a registration left by an earlier run", self.address)
            with contextlib.suppress(NoNodeError):
                await self._registry.unregister(self.address)
            await self._registry.register(
                self.address, read_only=wanted, service_info=self._service_info
            )
        self._current = wanted
        self._owned = True
        log.info("bookie %s registered as %s", self.address, "read-only" if wanted else "writable")
