"""A seeded, deterministic simulator for the client protocol against many bookies.

The real client code (ledger handles, recovery, the add tracker) runs on a
virtual-time event loop: when nothing is ready the clock jumps to the next
timer instead of sleeping, so a run that covers minutes of timeouts takes
milliseconds, and the same seed always gives the same run. Bookies are
in-memory models of the bookie protocol (fencing, master keys, LACs); the
network between them and the clients delays, reorders and drops messages and
can take bookies down and bring them back, all from one seeded random source.

Checkers stay apart from the system: :func:`run_scenario` records what the
clients were told and what can be read at the end, and :func:`check_history`
says whether the rules held.
"""

from __future__ import annotations

import asyncio
import random
import selectors
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from quorumlog.client.connection import request_future
from quorumlog.errors import (
    BKError,
    BookieUnavailableError,
    Status,
    TimeoutError_,
)
from quorumlog.proto.codec import (
    AddFlag,
    AddRequest,
    AddResponse,
    BookieInfoRequest,
    BookieInfoResponse,
    DeleteLedgerRequest,
    FenceRequest,
    FenceResponse,
    ReadFlag,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    StatusResponse,
    WriteLacRequest,
)
from quorumlog.proto.entry import entry_id_and_lac


class SimulationDeadlock(RuntimeError):
    """Nothing is ready and no timer is set, yet the simulated program still waits."""


# ---------------------------------------------------------------- virtual time


class _VirtualSelector(selectors.BaseSelector):
    """A selector with no file descriptors: 'waiting' moves the virtual clock."""

    def __init__(self) -> None:
        self._keys: dict[int, selectors.SelectorKey] = {}
        self.loop: VirtualTimeLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        self.unregister(fileobj)
        return self.register(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        assert self.loop is not None
        if timeout is None:
            raise SimulationDeadlock("the simulated program waits with no timer set")
        self.loop.advance(max(timeout, 0.0))
        return []

    def get_map(self) -> dict[int, selectors.SelectorKey]:  # type: ignore[override]
        return self._keys

    def close(self) -> None:
        self._keys.clear()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose clock only moves when it would otherwise sleep."""

    def __init__(self) -> None:
        self._virtual_now = 0.0
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += seconds


# ---------------------------------------------------------------- bookies


@dataclass
class SimLedger:
    master_key: bytes | None = None
    fenced: bool = False
    deleted: bool = False
    entries: dict[int, bytes] = field(default_factory=dict)
    lac: int = -1


class SimBookie:
    """The bookie protocol over memory. State survives a crash (it was durable when acked)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.up = True
        self.ledgers: dict[int, SimLedger] = {}

    def _keyed(self, ledger_id: int, key: bytes) -> tuple[SimLedger | None, int]:
        ledger = self.ledgers.setdefault(ledger_id, SimLedger())
        if ledger.deleted:
            return None, Status.NO_SUCH_LEDGER
        if ledger.master_key is None:
            ledger.master_key = key
        elif ledger.master_key != key:
            return None, Status.UNAUTHORIZED
        return ledger, Status.OK

    def handle(self, request: Request) -> Response:
        rid = request.request_id
        if isinstance(request, AddRequest):
            ledger, status = self._keyed(request.ledger_id, request.master_key)
            if ledger is None:
                return AddResponse(rid, status, request.ledger_id, len(request.entries))
            if ledger.fenced and not request.flags & AddFlag.RECOVERY:
                return AddResponse(rid, Status.FENCED, request.ledger_id, len(request.entries))
            for blob in request.entries:
                entry_id, lac = entry_id_and_lac(blob)
                ledger.entries[entry_id] = blob
                ledger.lac = max(ledger.lac, lac)
            return AddResponse(rid, Status.OK, request.ledger_id, len(request.entries))
        if isinstance(request, ReadRequest):
            if request.flags & ReadFlag.FENCE:
                ledger, status = self._keyed(request.ledger_id, request.master_key)
                if ledger is None:
                    return ReadResponse(rid, status, request.ledger_id, request.first_entry_id, -1)
                ledger.fenced = True
            found = self.ledgers.get(request.ledger_id)
            if found is None or found.deleted:
                return ReadResponse(
                    rid, Status.NO_SUCH_LEDGER, request.ledger_id, request.first_entry_id, -1
                )
            out: list[bytes] = []
            entry_id = request.first_entry_id
            while len(out) < max(1, request.count) and entry_id in found.entries:
                out.append(found.entries[entry_id])
                entry_id += 1
            status = (
                Status.OK if out or request.flags & ReadFlag.LONG_POLL else Status.NO_SUCH_ENTRY
            )
            return ReadResponse(
                rid, status, request.ledger_id, request.first_entry_id, found.lac, out
            )
        if isinstance(request, ReadLacRequest):
            found = self.ledgers.get(request.ledger_id)
            if found is None or found.deleted:
                return ReadLacResponse(rid, Status.NO_SUCH_LEDGER, request.ledger_id, -1, -1)
            last = max(found.entries, default=-1)
            return ReadLacResponse(rid, Status.OK, request.ledger_id, found.lac, last)
        if isinstance(request, FenceRequest):
            ledger, status = self._keyed(request.ledger_id, request.master_key)
            if ledger is None:
                return FenceResponse(rid, status, request.ledger_id, -1, -1)
            ledger.fenced = True
            last = max(ledger.entries, default=-1)
            return FenceResponse(rid, Status.OK, request.ledger_id, ledger.lac, last)
        if isinstance(request, WriteLacRequest):
            ledger, status = self._keyed(request.ledger_id, request.master_key)
            if ledger is not None:
                ledger.lac = max(ledger.lac, request.lac)
            return StatusResponse(rid, 5, status, request.ledger_id)
        if isinstance(request, DeleteLedgerRequest):
            self.ledgers[request.ledger_id] = SimLedger(deleted=True)
            return StatusResponse(rid, 6, Status.OK, request.ledger_id)
        assert isinstance(request, BookieInfoRequest)
        return BookieInfoResponse(rid, Status.OK, False, 1 << 30, 1 << 31)


# ---------------------------------------------------------------- network


@dataclass
class NetworkFaults:
    drop_probability: float = 0.0
    delay_ms_min: float = 0.1
    delay_ms_max: float = 2.0


class SimConnection:
    def __init__(self, network: SimNetwork, address: str) -> None:
        self.network = network
        self.address = address
        self.closed = False
        self._next_request_id = 1

    def send(
        self,
        request: Request,
        callback: Callable[[Response | BKError], None],
        timeout_ms: float | None,
    ) -> None:
        net = self.network
        loop = net.loop
        request.request_id = self._next_request_id
        self._next_request_id += 1
        answered = False

        def answer(result: Response | BKError) -> None:
            nonlocal answered
            if answered:
                return
            answered = True
            if timer is not None:
                timer.cancel()
            callback(result)

        def on_timeout() -> None:
            answer(TimeoutError_(f"bookie {self.address}: request timed out"))

        timer = loop.call_later(timeout_ms / 1000, on_timeout) if timeout_ms else None
        bookie = net.bookies.get(self.address)
        if bookie is None or not bookie.up:
            loop.call_later(
                net.delay_s(),
                answer,
                BookieUnavailableError(f"bookie {self.address}: connection refused"),
            )
            return
        if net.dropped():
            return  # lost on the way: only the timeout will tell

        def deliver() -> None:
            if not bookie.up:
                return  # crashed while the request travelled
            response = bookie.handle(request)
            net.requests_handled += 1
            if net.dropped():
                return
            loop.call_later(net.delay_s(), answer, response)

        loop.call_later(net.delay_s(), deliver)


class SimNetwork:
    """Stands in for the client's ConnectionPool; seeded delays, drops and crashes."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        rng: random.Random,
        bookies: list[SimBookie],
        faults: NetworkFaults,
    ) -> None:
        self.loop = loop
        self.rng = rng
        self.bookies = {b.address: b for b in bookies}
        self.faults = faults
        self.requests_handled = 0
        self._connections: dict[str, SimConnection] = {}

    def delay_s(self) -> float:
        f = self.faults
        return self.rng.uniform(f.delay_ms_min, f.delay_ms_max) / 1000

    def dropped(self) -> bool:
        return self.faults.drop_probability > 0 and self.rng.random() < self.faults.drop_probability

    def get(self, address: str) -> SimConnection:
        conn = self._connections.get(address)
        if conn is None:
            conn = self._connections[address] = SimConnection(self, address)
        return conn

    def request(
        self, address: str, request: Request, timeout_ms: float | None
    ) -> asyncio.Future[Response]:
        return request_future(self.loop, self.get(address), request, timeout_ms)

    def close(self) -> None:
        self._connections.clear()
