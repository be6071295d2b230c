"""A bookie moving between writable and read-only is in one list or the other at every
moment: the auditor counts a bookie in neither as lost (at the default recovery delay
of 0 it marked a healthy bookie's ledgers, and workers copied its data away)."""

from __future__ import annotations

import asyncio
from typing import Any

from quorumlog.server.registration import Registration

ADDRESS = "127.0.0.1:3181"


class _Registry:
    """The registry's lists, with every state they pass through recorded."""

    def __init__(self) -> None:
        self.writable: set[str] = set()
        self.readonly: set[str] = set()
        self.states: list[tuple[bool, bool]] = []

    def _note(self) -> None:
        self.states.append((ADDRESS in self.writable, ADDRESS in self.readonly))

    async def register(
        self, address: str, read_only: bool = False, *, service_info: bytes = b""
    ) -> None:
        # As BookieRegistry.register: the new node first, then the other one removed.
        (self.readonly if read_only else self.writable).add(address)
        self._note()
        (self.writable if read_only else self.readonly).discard(address)
        self._note()

    async def unregister(self, address: str) -> None:
        self.writable.discard(address)
        self._note()
        self.readonly.discard(address)
        self._note()

    async def writable_bookies(self) -> list[str]:
        return sorted(self.writable)

    async def readonly_bookies(self) -> list[str]:
        return sorted(self.readonly)


class _Store:
    uri = "memory://"

    def add_session_listener(self, callback: Any) -> None:
        pass


def test_moving_to_read_only_and_back_never_leaves_the_bookie_unlisted() -> None:
    async def scenario() -> list[tuple[bool, bool]]:
        registry = _Registry()
        registration = Registration(registry, _Store(), ADDRESS)  # type: ignore[arg-type]
        await registration.start(read_only=False, timeout_s=5)
        first = len(registry.states)
        for read_only in (True, False, True, False):
            registration.set_read_only(read_only)
            await registration._wait_applied(5)
            assert registration.registered_read_only is read_only
        await registration.stop(timeout_s=5)
        return registry.states[first:-2]  # from registered until the stop's unregister

    states = asyncio.run(scenario())
    assert states and all(writable or readonly for writable, readonly in states), states
