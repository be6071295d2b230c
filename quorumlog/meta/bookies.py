"""Bookie registration, discovery and cookies in the metadata store.

Layout (see docs/METADATA.md)::

    /bookies/available/<host:port>   ephemeral: a writable bookie is up; its data is the
                                     bookie's service info (JSON, e.g. its admin HTTP address)
    /bookies/readonly/<host:port>    ephemeral: a read-only bookie is up (same data)
    /bookies/cookies/<host:port>     persistent: the bookie's cookie (identity of its disks)

A bookie's registration is an ephemeral node of its metadata session, so it
disappears by itself when the bookie process dies (after the session timeout).

A bookie that restarts quickly may find its previous registration still there,
held by the session of its dead predecessor. ``register`` then waits (up to
``stale_wait_ms``) for that node to go, which happens when the old session
expires; if it is still there after the wait, another live process holds the
address and ``register`` fails. It never deletes another session's
registration, so two live bookies can never both hold one address.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable

from quorumlog.errors import (
    InvalidArgumentError,
    MetadataError,
    MetadataVersionError,
    NodeExistsError,
    NoNodeError,
)
from quorumlog.meta.store import MetadataStore, Versioned, Watch, WatchEvent

BOOKIES_PATH = "/bookies"
AVAILABLE_PATH = f"{BOOKIES_PATH}/available"
READONLY_PATH = f"{BOOKIES_PATH}/readonly"
COOKIES_PATH = f"{BOOKIES_PATH}/cookies"
DEFAULT_STALE_WAIT_MS = 30_000
_STALE_POLL_S = 0.1


def check_bookie_address(address: str) -> str:
    """``host:port`` with a port in 1..65535, else InvalidArgumentError naming it."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or "/" in address or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgumentError(f"bookie address {address!r}: expected host:port")
    return address


def parse_service_info(data: bytes) -> dict[str, str]:
    """A registration's data as a dict of strings; nothing usable (a bookie of an
    earlier version wrote b"") is ``{}``."""
    try:
        decoded = json.loads(data) if data else {}
    except ValueError:
        return {}
    if not isinstance(decoded, dict):
        return {}
    return {str(key): value for key, value in decoded.items() if isinstance(value, str)}


class _PairWatch(Watch):
    def __init__(self, watches: list[Watch]) -> None:
        self.watches = watches

    def cancel(self) -> None:
        for watch in self.watches:
            watch.cancel()


class BookieRegistry:
    """Which bookies are up (writable or read-only), and their cookies.

    Example::

        registry = BookieRegistry(store)
        await registry.register("127.0.0.1:3181")
        await registry.writable_bookies()          # ["127.0.0.1:3181"]
        await registry.register("127.0.0.1:3181", read_only=True)   # moves it
    """

    def __init__(self, store: MetadataStore, *, stale_wait_ms: int = DEFAULT_STALE_WAIT_MS):
        self.store = store
        self.stale_wait_ms = stale_wait_ms
        self._registered: set[str] = set()  # paths this registry created in this session

    async def register(
        self, address: str, read_only: bool = False, *, service_info: bytes = b""
    ) -> None:
        """Announce the bookie as writable (or read-only), moving it out of the other list.

        ``service_info`` (JSON, see ``read_service_info``) is the registration's data.
        """
        check_bookie_address(address)
        target = f"{READONLY_PATH if read_only else AVAILABLE_PATH}/{address}"
        other = f"{AVAILABLE_PATH if read_only else READONLY_PATH}/{address}"
        await self._create_registration(
            address, target, ours=target in self._registered, data=service_info
        )
        self._registered.add(target)
        with contextlib.suppress(NoNodeError):
            await self.store.delete(other)
        self._registered.discard(other)

    async def _create_registration(
        self, address: str, path: str, *, ours: bool, data: bytes
    ) -> None:
        deadline = time.monotonic() + self.stale_wait_ms / 1000
        gone = asyncio.Event()
        watch = self.store.watch(path, lambda _event: gone.set())
        try:
            for _ in range(1_000_000):  # bounded by the deadline below
                try:
                    await self.store.create(path, data, ephemeral=True)
                    return
                except NodeExistsError:
                    if ours:  # registered earlier by this registry, in this session
                        return
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    break
                # Woken by the deletion event; the poll covers a missed one.
                gone.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(gone.wait(), min(remaining_s, _STALE_POLL_S))
        finally:
            watch.cancel()
        raise MetadataError(
            f"bookie {address} is already registered ({path}) by another live session; "
            f"it did not expire within {self.stale_wait_ms} ms"
        )

    async def unregister(self, address: str) -> None:
        """Remove the bookie from both lists (no error if it is in neither)."""
        check_bookie_address(address)
        for path in (f"{AVAILABLE_PATH}/{address}", f"{READONLY_PATH}/{address}"):
            with contextlib.suppress(NoNodeError):
                await self.store.delete(path)
            self._registered.discard(path)

    async def writable_bookies(self) -> list[str]:
        """Addresses of the registered writable bookies, sorted."""
        return await self._list(AVAILABLE_PATH)

    async def readonly_bookies(self) -> list[str]:
        """Addresses of the registered read-only bookies, sorted."""
        return await self._list(READONLY_PATH)

    async def writable_locations(self) -> dict[str, str | None]:
        """The registered writable bookies and where each stands (its ``rack``,
        /REGION/RACK), None for one that recorded no place (an earlier version). One
        read per bookie, in parallel: placement policies other than random ask it."""
        bookies = await self._list(AVAILABLE_PATH)

        async def rack(address: str) -> str | None:
            try:
                node = await self.store.get(f"{AVAILABLE_PATH}/{address}")
            except NoNodeError:  # gone since the listing: placed nowhere in particular
                return None
            return parse_service_info(node.data).get("rack")

        racks = await asyncio.gather(*(rack(b) for b in bookies))
        return dict(zip(bookies, racks, strict=True))

    async def read_service_info(self, address: str) -> dict[str, str] | None:
        """What a registered bookie published about itself, or None if it is not registered.

        A JSON object of strings, e.g. ``{"http": "http://127.0.0.1:8000"}`` for a bookie
        serving the admin API; ``{}`` for one that published nothing.
        """
        check_bookie_address(address)
        for listing in (AVAILABLE_PATH, READONLY_PATH):
            try:
                node = await self.store.get(f"{listing}/{address}")
            except NoNodeError:
                continue
            return parse_service_info(node.data)
        return None

    async def _list(self, path: str) -> list[str]:
        try:
            return await self.store.children(path)
        except NoNodeError:
            return []

    def watch(self, callback: Callable[[], None]) -> Watch:
        """Call ``callback()`` whenever either list changes."""

        def changed(_event: WatchEvent) -> None:
            callback()

        return _PairWatch(
            [
                self.store.watch(AVAILABLE_PATH, changed, children=True),
                self.store.watch(READONLY_PATH, changed, children=True),
            ]
        )

    async def read_cookie(self, address: str) -> Versioned | None:
        """The bookie's cookie and its version, or None if it has none."""
        check_bookie_address(address)
        try:
            return await self.store.get(f"{COOKIES_PATH}/{address}")
        except NoNodeError:
            return None

    async def write_cookie(self, address: str, data: bytes, version: int) -> int:
        """Compare-and-set the cookie; ``version=-1`` creates it. Returns the new version.

        MetadataVersionError if the cookie is not at ``version`` (or exists already
        when creating, or is gone when updating).
        """
        check_bookie_address(address)
        path = f"{COOKIES_PATH}/{address}"
        if version == -1:
            try:
                await self.store.create(path, data)
            except NodeExistsError:
                raise MetadataVersionError(
                    f"bookie {address}: a cookie exists already ({path})"
                ) from None
            return 0
        try:
            return await self.store.set(path, data, version)
        except NoNodeError:
            raise MetadataVersionError(
                f"bookie {address}: no cookie at {path} to update from version {version}"
            ) from None
        except MetadataVersionError:
            raise MetadataVersionError(
                f"bookie {address}: cookie changed since version {version} ({path})"
            ) from None

    async def delete_cookie(self, address: str, version: int = -1) -> None:
        """Remove the bookie's cookie (an operator wiping a bookie); NoNodeError if none."""
        check_bookie_address(address)
        path = f"{COOKIES_PATH}/{address}"
        try:
            await self.store.delete(path, version)
        except NoNodeError:
            raise NoNodeError(f"bookie {address}: no cookie at {path}") from None
