"""Real bookies on simulated machines, a simulated network, and clients over them.

A :class:`BookieNode` is one machine: a :class:`~quorumlog.testing.sim.disk.SimDisk`
that outlives its processes, and the real :class:`~quorumlog.bookie.bookie.Bookie`
running on it, with :class:`~quorumlog.testing.sim.loop.SimExecutor` workers
standing for its journal and checkpoint threads. The node can be killed (kill -9:
the page cache survives), lose power (what was not synced may go), pause
(SIGSTOP: nothing moves, requests wait) and restart on the same disk.

The :class:`SimNetwork` carries requests and answers between named parties through
the real codec (frames encoded and decoded as on a socket), in order on each
connection, with delays, drops and partitions drawn from the seed. Each client gets
its own :class:`ClientPool` (what the client's ``ConnectionPool`` does, simulated).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from quorumlog.bookie.bookie import Bookie, BookieStartError
from quorumlog.bookie.config import BookieConfig
from quorumlog.client.bookkeeper import BookKeeper
from quorumlog.client.config import ClientConfig
from quorumlog.client.connection import ConnectionPool, request_future
from quorumlog.errors import BKError, BookieUnavailableError, Status, TimeoutError_
from quorumlog.meta.bookies import BookieRegistry
from quorumlog.proto.codec import (
    AddRequest,
    Message,
    ReadFlag,
    ReadRequest,
    Request,
    Response,
    decode_message,
    encode_parts,
)
from quorumlog.server.gc import StoreGcMetadata, collect_once
from quorumlog.testing.memory_store import MemoryStore, MemoryTree, MetadataFaults
from quorumlog.testing.sim.disk import PowerLoss, SimDisk
from quorumlog.testing.sim.loop import SimExecutor

__all__ = [
    "SIM_CONFIG",
    "BookieNode",
    "ClientPool",
    "Cluster",
    "NetworkFaults",
    "SimNetwork",
    "Trace",
]

# Short timeouts: a run covers many of them in little virtual time.
SIM_CONFIG = ClientConfig(
    connect_timeout_ms=500,
    add_timeout_ms=500,
    read_timeout_ms=500,
    speculative_read_timeout_ms=50,
    fence_timeout_ms=500,
    explicit_lac_delay_ms=2,
    max_outstanding_adds=1000,
    read_batch_entries=16,
)


class Trace:
    """A readable account of one run (kept only when enabled: formatting costs)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, enabled: bool = False) -> None:
        self.loop = loop
        self.enabled = enabled
        self.lines: list[str] = []

    def __call__(self, party: str, message: str, *args: object) -> None:
        if self.enabled:
            text = message % args if args else message
            self.lines.append(f"{self.loop.time() * 1000:10.3f} ms  {party:<16} {text}")


@dataclass
class NetworkFaults:
    """Delays and losses. Each link (a client and a bookie) is drawn once per run: most
    are normal, some slow (a congested path) and some lossy, so that one party's
    messages systematically overtake another's, as on a real network."""

    drop_probability: float = 0.0
    delay_ms_min: float = 0.05
    delay_ms_max: float = 2.0
    slow_link_probability: float = 0.0
    slow_link_ms: tuple[float, float] = (2.0, 30.0)
    lossy_link_probability: float = 0.0
    lossy_link_drop: float = 0.2


@dataclass
class _Link:
    delay_ms: tuple[float, float]
    drop_probability: float
    drop_next: list[type[Request]] = field(default_factory=list)  # set by tests


_FRAME_HEADER = struct.Struct(">IBBQ")  # length, version, op, request id
_ENTRY_IDS = struct.Struct(">qq")  # an entry blob's ledger id and entry id
_OK = Status.OK
_ABSENT = (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER)


def _roundtrip(message: Message) -> Message:
    """What the other end of a socket decodes of ``message``: the real encoder and the
    real body decoder, one whole frame at a time (the stream decoder's buffering is what
    the codec's own tests cover)."""
    frame = b"".join(encode_parts(message))
    length, _, op, request_id = _FRAME_HEADER.unpack_from(frame)
    assert length == len(frame) - 4
    return decode_message(op, request_id, memoryview(frame)[_FRAME_HEADER.size :])


def sim_bookie_config(name: str, rng: random.Random) -> BookieConfig:
    """Small files and frequent checkpoints, so that a short run rotates journal files
    and entry logs, checkpoints and deletes journal files many times. The journal's
    zeros ahead follow its file size (not drawn: every seed keeps its schedule)."""
    journal_file_max_bytes = rng.choice([4096, 16384, 1 << 20])
    return BookieConfig(
        data_dir=Path(f"/sim/{name}/data"),
        journal_dir=Path(f"/sim/{name}/journal"),
        journal_max_group_wait_ms=1.0,
        journal_file_max_bytes=journal_file_max_bytes,
        journal_prealloc_bytes={4096: 0, 16384: 8192}.get(journal_file_max_bytes, 1 << 20),
        journal_queue_max_bytes=rng.choice([8192, 64 << 20]),
        entry_log_max_bytes=rng.choice([8192, 65536, 1 << 20]),
        entry_log_write_buffer_bytes=rng.choice([512, 4096, 65536]),
        read_cache_max_bytes=rng.choice([0, 65536]),
        checkpoint_interval_ms=rng.choice([25, 150, 600]),
        disk_check_interval_ms=200,
    )


class BookieNode:
    """One simulated machine running the real bookie."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        rng: random.Random,
        address: str,
        trace: Trace,
        on_down: Callable[[BookieNode, bool], None],
    ) -> None:
        self.loop = loop
        self.rng = rng
        self.address = address
        self.trace = trace
        self.disk = SimDisk(random.Random(rng.random()), address)
        self.disk.on_power_loss = self._power_lost_in_call
        self.config = sim_bookie_config(address.split(":")[0], rng)
        self.bookie: Bookie | None = None
        self.state = "down"  # down, up, paused, broken (refused to start)
        self.start_error = ""
        self.incarnation = 0
        self._executors: list[SimExecutor] = []
        self._held: list[Callable[[], None]] = []  # work that waits while paused
        self._on_down = on_down
        self.gc_store: MemoryStore | None = None
        self._gc_task: asyncio.Task[None] | None = None
        self.crashes = 0
        self.restarts = 0
        self.powered_off = False  # down by a power loss: the machine does not answer at all
        self.lost_for_good = False  # never restarted (its disk stays for the checker)
        self.broken_invariants: list[str] = []  # what its halts said (each a defect)
        # What any of its processes acknowledged (ledger id -> entry ids), and each
        # answer of absence for something in there (R9, R17: a defect).
        self.acknowledged: dict[int, set[int]] = {}
        self.false_absences: list[str] = []
        # Asked before each answer this bookie sends whether it goes out (False: the
        # process died right after the previous one); None on the usual path.
        self.on_answer: Callable[[BookieNode, Request, Response], bool] | None = None

    @property
    def up(self) -> bool:
        return self.state == "up"

    def _worker(self, name: str) -> SimExecutor:
        latency = (0.02, 1.5) if name == "journal" else (0.05, 4.0)
        executor = SimExecutor(self.loop, random.Random(self.rng.random()), latency, name)
        self._executors.append(executor)
        return executor

    async def start(self, last_try: bool = False) -> bool:
        """Start a bookie process on this machine's disk; False if it refused to start
        (a full disk or a failing sync may pass; on the ``last_try`` it is broken)."""
        self.incarnation += 1
        files = self.disk.files()
        self._executors = []
        try:
            bookie = Bookie.open(
                self.config,
                files=files,
                workers=self._worker,
                on_broken_invariant=self._broken_invariant,
            )
            await bookie.start(self.loop)
        except BookieStartError as exc:
            self.disk.crash()
            self.state = "broken" if last_try else "down"
            self.start_error = str(exc)
            self.trace(self.address, "REFUSED TO START: %s", exc)
            return False
        except PowerLoss:
            self.trace(self.address, "power lost during the start")
            return False
        self.bookie = bookie
        self.state = "up"
        self.powered_off = False
        self.trace(
            self.address,
            "started (incarnation %d, %d journal records replayed)",
            self.incarnation,
            bookie.replay_report.records,
        )
        if self.gc_store is not None:
            self._gc_task = self.loop.create_task(self._gc_loop(self.incarnation))
        return True

    def _broken_invariant(self, message: str) -> None:
        """The bookie found a state that cannot be: a real one ends its process (status
        70, as a crash); here the message is kept for the checker (a system error) and
        the process dies on the next loop turn, to be restarted like any crashed one."""
        self.broken_invariants.append(message)
        self.trace(self.address, "BROKEN INVARIANT: %s", message)
        self.loop.call_soon(self.kill)

    def receive(self, request: Request, answer: Callable[[Response], None]) -> None:
        """A request arrives at the bookie process (or waits, if it is paused)."""
        if self.state == "paused":
            self._held.append(lambda: self.receive(request, answer))
            return
        if self.state != "up" or self.bookie is None:
            return
        incarnation = self.incarnation
        ask = self.on_answer
        if ask is not None:
            send = answer

            def answer(response: Response) -> None:
                if ask(self, request, response):
                    send(response)

        def respond(response: Response) -> None:
            if self.incarnation != incarnation:
                return  # a dead process says nothing
            kind = type(request)
            if kind is AddRequest or kind is ReadRequest:
                self._judge(request, response)
            if self.state == "paused":
                self._held.append(lambda: answer(response))
                return
            answer(response)

        with contextlib.suppress(PowerLoss):  # the power went while it handled the request
            self.bookie.submit(request, respond)

    def _judge(self, request: Any, response: Response) -> None:
        """R9, R17: remember what this bookie acknowledged (durable, R2); an answer of
        absence for one of those entries is a defect."""
        status = response.status
        if type(request) is AddRequest:
            if status == _OK:
                unpack = _ENTRY_IDS.unpack_from
                for blob in request.entries:
                    ledger_id, entry_id = unpack(blob)
                    self.acknowledged.setdefault(ledger_id, set()).add(entry_id)
            return
        if status not in _ABSENT or request.flags & ReadFlag.LONG_POLL:
            return
        held = self.acknowledged.get(request.ledger_id)
        if held and (status == Status.NO_SUCH_LEDGER or request.first_entry_id in held):
            self.false_absences.append(
                f"{self.address} answered {Status(status).name} for ledger "
                f"{request.ledger_id} entry {request.first_entry_id}, which it acknowledged"
            )

    # ------------------------------------------------------------ faults

    def _stop_process(self) -> None:
        self.incarnation += 1
        for executor in self._executors:
            executor.kill()
        bookie = self.bookie
        if bookie is not None:
            bookie._timers.stop()  # its timed jobs would run in a dead process
        self.bookie = None
        self._held.clear()
        if self._gc_task is not None:
            self._gc_task.cancel()
            self._gc_task = None

    def kill(self) -> None:
        """kill -9: the process goes; what it wrote is in the page cache and stays."""
        if self.state not in ("up", "paused"):
            return
        self._stop_process()
        self.disk.crash()
        self.state = "down"
        self.crashes += 1
        self.trace(self.address, "KILLED (kill -9)")
        self._on_down(self, False)

    def power_loss(self) -> None:
        """The machine loses power: unsynced writes may be lost or torn."""
        if self.state not in ("up", "paused", "down"):
            return
        was = self.state
        self._stop_process()
        self.disk.power_loss()
        self.state = "down"
        self.powered_off = True
        self.crashes += 1
        self.trace(self.address, "POWER LOST (was %s)", was)
        self._on_down(self, True)

    def _power_lost_in_call(self) -> None:
        # A disk fault cut the power in the middle of a system call of the bookie.
        self._stop_process()
        self.state = "down"
        self.powered_off = True
        self.crashes += 1
        self.trace(self.address, "POWER LOST in the middle of a disk call")
        self._on_down(self, True)

    def pause(self) -> None:
        if self.state != "up":
            return
        self.state = "paused"
        for executor in self._executors:
            executor.freeze()
        self.trace(self.address, "PAUSED")

    def resume(self) -> None:
        if self.state != "paused":
            return
        self.state = "up"
        for executor in self._executors:
            executor.thaw()
        held, self._held = self._held, []
        self.trace(self.address, "RESUMED (%d held messages)", len(held))
        for work in held:
            work()

    async def restart(self, last_try: bool = False) -> bool:
        if self.state in ("up", "paused"):
            self.kill()
        if self.state == "broken":
            return False
        self.restarts += 1
        return await self.start(last_try)

    # ------------------------------------------------------------ garbage collection

    async def _gc_loop(self, incarnation: int) -> None:
        """The server's garbage collection, on this machine's metadata session; like the
        server's, it needs this bookie's cookie in the store (R15), written here as the
        server's start-up writes it."""
        assert self.gc_store is not None
        store = self.gc_store
        registry = BookieRegistry(store)
        metadata = StoreGcMetadata(lambda: store, self.address)
        while self.incarnation == incarnation:
            await asyncio.sleep(self.rng.uniform(0.1, 0.5))
            bookie = self.bookie
            if bookie is None or self.incarnation != incarnation or self.state != "up":
                continue
            try:
                if await registry.read_cookie(self.address) is None:
                    await registry.write_cookie(self.address, b"simulated bookie", -1)
                dropped = await collect_once(bookie, metadata)
            except (BKError, OSError):
                continue
            except PowerLoss:
                return
            if dropped:
                self.trace(self.address, "garbage collection dropped %d ledgers", dropped)

    def close(self) -> None:
        """End of the run: stop the process without closing files (nothing is checked
        after this)."""
        self._stop_process()


class SimNetwork:
    """Delivers requests and answers between clients and bookie nodes."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        rng: random.Random,
        faults: NetworkFaults,
        trace: Trace,
        codec: bool = True,
    ) -> None:
        self.loop = loop
        self.rng = rng
        self.faults = faults
        self.trace = trace
        self.codec = codec
        self.nodes: dict[str, BookieNode] = {}
        self.blocked: set[frozenset[str]] = set()  # partitioned pairs of parties
        self.requests_delivered = 0
        self._connections: list[SimConnection] = []
        self.pools: dict[str, ClientPool] = {}
        self._links: dict[tuple[str, str], _Link] = {}

    def add(self, node: BookieNode) -> None:
        self.nodes[node.address] = node

    def link(self, client: str, address: str) -> _Link:
        key = (client, address)
        found = self._links.get(key)
        if found is None:
            f = self.faults
            delay = (f.delay_ms_min, f.delay_ms_max)
            drop = f.drop_probability
            roll = self.rng.random()
            if roll < f.slow_link_probability:
                delay = f.slow_link_ms
            elif roll < f.slow_link_probability + f.lossy_link_probability:
                drop = max(drop, f.lossy_link_drop)
            found = self._links[key] = _Link(delay, drop)
        return found

    def set_link(
        self,
        client: str,
        address: str,
        *,
        delay_ms: tuple[float, float] | None = None,
        drop_probability: float | None = None,
    ) -> None:
        """Fix one link's delays or losses (a test's exact schedule)."""
        link = self.link(client, address)
        if delay_ms is not None:
            link.delay_ms = delay_ms
        if drop_probability is not None:
            link.drop_probability = drop_probability

    def drop_next(self, client: str, address: str, kind: type[Request]) -> None:
        """Lose the next request of ``kind`` from ``client`` to ``address`` on its way."""
        self.link(client, address).drop_next.append(kind)

    def delay_s(self, link: _Link | None = None) -> float:
        if link is None:
            f = self.faults
            return self.rng.uniform(f.delay_ms_min, f.delay_ms_max) / 1000
        return self.rng.uniform(*link.delay_ms) / 1000

    def dropped(self, link: _Link | None = None) -> bool:
        p = self.faults.drop_probability if link is None else link.drop_probability
        return p > 0 and self.rng.random() < p

    def partitioned(self, a: str, b: str) -> bool:
        return bool(self.blocked) and frozenset((a, b)) in self.blocked

    def partition(self, a: str, b: str) -> None:
        self.blocked.add(frozenset((a, b)))
        self.trace("network", "PARTITION %s <-> %s", a, b)

    def heal(self, a: str | None = None, b: str | None = None) -> None:
        if a is None or b is None:
            self.blocked.clear()
            self.trace("network", "all partitions healed")
        else:
            self.blocked.discard(frozenset((a, b)))
            self.trace("network", "HEAL %s <-> %s", a, b)

    def calm(self) -> None:
        """No more losses (delays stay): what the checker's part runs on."""
        self.faults.drop_probability = 0.0
        for link in self._links.values():
            link.drop_probability = 0.0
        self.faults.lossy_link_probability = 0.0

    def pool(self, client: str) -> ClientPool:
        pool = self.pools[client] = ClientPool(self, client)
        return pool

    def node_down(self, node: BookieNode, power_loss: bool) -> None:
        """A bookie process died: its open connections break (a reset the clients see,
        unless the whole machine went, when only their timeouts tell)."""
        for conn in self._connections:
            if conn.address == node.address and not conn.closed:
                conn.broken(power_loss)


class ClientPool:
    """One client's connections (stands in for its ``ConnectionPool``)."""

    def __init__(self, network: SimNetwork, client: str) -> None:
        self.network = network
        self.client = client
        self._connections: dict[str, SimConnection] = {}
        self.paused = False
        self._held: list[Callable[[], None]] = []

    def pause(self) -> None:
        """The client process stalls (a long GC pause, SIGSTOP): nothing it sends leaves and
        nothing sent to it is read until :meth:`resume`; its timers still run out."""
        self.paused = True
        self.network.trace(self.client, "PAUSED")

    def resume(self) -> None:
        if not self.paused:
            return
        self.paused = False
        held, self._held = self._held, []
        self.network.trace(self.client, "RESUMED (%d held messages)", len(held))
        for work in held:
            work()

    def hold(self, work: Callable[[], None]) -> None:
        self._held.append(work)

    def get(self, address: str) -> SimConnection:
        conn = self._connections.get(address)
        if conn is None or conn.closed:
            conn = SimConnection(self.network, self.client, address, self)
            self._connections[address] = conn
            self.network._connections.append(conn)
        return conn

    def request(
        self, address: str, request: Request, timeout_ms: float | None
    ) -> asyncio.Future[Response]:
        return request_future(self.network.loop, self.get(address), request, timeout_ms)

    def close(self) -> None:
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()


class SimConnection:
    """One client's connection to one bookie: FIFO in each direction, as TCP is."""

    def __init__(
        self, network: SimNetwork, client: str, address: str, pool: ClientPool | None = None
    ) -> None:
        self.network = network
        self.client = client
        self.pool = pool
        self.address = address
        self.closed = False
        self._next_request_id = 1
        self._out_at = 0.0  # when the last request arrives (FIFO)
        self._in_at = 0.0  # when the last answer arrives
        self._pending: dict[int, Callable[[Response | BKError], None]] = {}

    def _arrival(self, last: float) -> float:
        net = self.network
        return max(last, net.loop.time() + net.delay_s(net.link(self.client, self.address)))

    def send(
        self,
        request: Request,
        callback: Callable[[Response | BKError], None],
        timeout_ms: float | None,
    ) -> None:
        net = self.network
        loop = net.loop
        if self.closed:
            loop.call_soon(
                callback, BookieUnavailableError(f"bookie {self.address}: connection is closed")
            )
            return
        request_id = self._next_request_id
        self._next_request_id += 1
        request.request_id = request_id
        timer: asyncio.TimerHandle | None = None
        done = False

        def answer(result: Response | BKError) -> None:
            nonlocal done
            if done:
                return  # timed out, or the connection broke, already
            done = True
            self._pending.pop(request_id, None)
            if timer is not None:
                timer.cancel()
            callback(result)

        def on_timeout() -> None:
            answer(TimeoutError_(f"bookie {self.address}: request timed out"))

        self._pending[request_id] = answer
        if timeout_ms:
            timer = loop.call_later(timeout_ms / 1000, on_timeout)
        pool = self.pool
        if pool is not None and pool.paused:
            pool.hold(lambda: self._transmit(request, answer))
            return
        self._transmit(request, answer)

    def _transmit(self, request: Request, answer: Callable[[Response | BKError], None]) -> None:
        # A request whose client timed out still travels: bytes handed to the network
        # are not taken back (and a paused client's held sends leave when it resumes,
        # unless the connection broke meanwhile: they go nowhere, the reset tells).
        net = self.network
        loop = net.loop
        if self.closed:
            return
        node = net.nodes.get(self.address)
        if node is None or node.state in ("down", "broken"):
            if node is not None and node.powered_off:
                return  # the machine is off: no answer at all, the timeout tells
            delay = net.delay_s()
            loop.call_later(
                delay,
                answer,
                BookieUnavailableError(f"bookie {self.address}: connection refused"),
            )
            return
        link = net.link(self.client, self.address)
        if link.drop_next and isinstance(request, link.drop_next[0]):
            link.drop_next.pop(0)
            net.trace(self.client, "%s to %s LOST", type(request).__name__, self.address)
            return
        if net.partitioned(self.client, self.address) or net.dropped(link):
            return  # lost on the way: only the timeout will tell
        message: Request = (
            _roundtrip(request) if net.codec else request  # type: ignore[assignment]
        )
        self._out_at = self._arrival(self._out_at)
        loop.call_at(self._out_at, self._deliver, node, message, answer)

    def _deliver(
        self, node: BookieNode, request: Request, answer: Callable[[Response | BKError], None]
    ) -> None:
        net = self.network
        if net.partitioned(self.client, self.address):
            return
        net.requests_delivered += 1

        link = net.link(self.client, self.address)

        def respond(response: Response) -> None:
            if self.closed or net.partitioned(self.client, self.address) or net.dropped(link):
                return
            decoded: Response = (
                _roundtrip(response) if net.codec else response  # type: ignore[assignment]
            )
            self._in_at = self._arrival(self._in_at)
            net.loop.call_at(self._in_at, self._arrived, answer, decoded)

        node.receive(request, respond)

    def _arrived(
        self, answer: Callable[[Response | BKError], None], response: Response | BKError
    ) -> None:
        pool = self.pool
        if pool is not None and pool.paused:
            pool.hold(lambda: answer(response))
        else:
            answer(response)

    def broken(self, power_loss: bool) -> None:
        """The bookie process died: a reset fails every request still waiting, unless the
        machine lost power (no reset comes; each request times out)."""
        self.closed = True
        if power_loss:
            return
        pending, self._pending = self._pending, {}
        error = BookieUnavailableError(f"bookie {self.address}: connection reset")
        delay = self.network.delay_s()
        for answer in pending.values():
            self.network.loop.call_later(delay, self._arrived, answer, error)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        pending, self._pending = self._pending, {}
        error = BookieUnavailableError(f"bookie {self.address}: connection closed by client")
        for answer in list(pending.values()):
            self.network.loop.call_soon(answer, error)


class Cluster:
    """Bookie machines, the network, the metadata tree, and clients on them.

    Everything random comes from ``rng`` (one seed): every node, disk, executor,
    network delay and client draws its own generator from it, in a fixed order.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        rng: random.Random,
        *,
        bookies: int = 5,
        network_faults: NetworkFaults | None = None,
        trace: Trace | None = None,
        codec: bool = True,
        gc: bool = True,
    ) -> None:
        self.loop = loop
        self.rng = rng
        self.trace = trace or Trace(loop)
        self.network = SimNetwork(
            loop, random.Random(rng.random()), network_faults or NetworkFaults(), self.trace, codec
        )
        self.tree = MemoryTree()
        self.nodes = [
            BookieNode(
                loop, random.Random(rng.random()), f"10.0.0.{i}:3181", self.trace, self._down
            )
            for i in range(bookies)
        ]
        for node in self.nodes:
            self.network.add(node)
            if gc:
                node.gc_store = MemoryStore(self.tree)
        self.clients: list[Any] = []
        self.stores: dict[str, MemoryStore] = {}
        self.names: dict[int, str] = {}  # id(client) -> its name
        self._client_count = 0
        # Told when a bookie process dies (the nemesis restarts it later).
        self.on_down: list[Callable[[BookieNode, bool], None]] = []

    def _down(self, node: BookieNode, power_loss: bool) -> None:
        self.network.node_down(node, power_loss)
        for listener in self.on_down:
            listener(node, power_loss)

    def node(self, address: str) -> BookieNode:
        return self.network.nodes[address]

    async def start(self) -> None:
        """Start every bookie and register it. The registrations stay (a bookie restarts
        within its session's timeout), but a bookie lost for good loses its own
        (:meth:`expire_registration`)."""
        registry = self._registry = BookieRegistry(MemoryStore(self.tree))
        for node in self.nodes:
            await node.start()
            await registry.register(node.address)

    async def expire_registration(self, address: str) -> None:
        """The session of a bookie that is gone expires: its registration goes."""
        await self._registry.unregister(address)
        self.trace(address, "registration expired")

    def client(
        self,
        name: str | None = None,
        *,
        config: ClientConfig | None = None,
        metadata_faults: MetadataFaults | None = None,
        kind: type[Any] | None = None,
        rng: random.Random | None = None,
    ) -> Any:
        """A new client (``kind``: the BookKeeper class, quorumlog.aio.BookKeeper by default) with
        its own metadata session and connections, named for partitions and the trace.
        Its random source is drawn from the cluster's, unless ``rng`` is given."""
        if name is None:
            self._client_count += 1
            name = f"client{self._client_count}"
        store = MemoryStore(self.tree, faults=metadata_faults)
        if metadata_faults is not None and self.trace.enabled:
            metadata_faults.on_event = lambda what: self.trace(name, "metadata: %s", what)
        self.stores[name] = store
        cls = kind or BookKeeper
        bk = cls(
            store,
            config or SIM_CONFIG,
            # The simulator's pool stands in for the client's: same calls, no sockets.
            pool=cast(ConnectionPool, self.network.pool(name)),
            rng=rng if rng is not None else random.Random(self.rng.random()),
        )
        self.names[id(bk)] = name
        self.clients.append(bk)
        return bk

    async def close(self) -> None:
        for bk in self.clients:
            with contextlib.suppress(Exception):
                await bk.close()
        for node in self.nodes:
            node.close()
