"""A private network of Linux network namespaces, built and removed by a test run.

Layout (``run`` is a short random suffix, unique per run)::

    ql<run>-sw       the switch: a bridge ``br0``, one veth end per host (v1, v2, ...)
    ql<run>-<host>   one namespace per host (a ZooKeeper server, a bookie, a client),
                     its veth end named eth0 with an address of 10.213.0.0/24, and lo

Everything is created inside the run's own namespaces (the veth pairs from inside the
switch namespace), so the machine's own interfaces, addresses and routes are never
touched, and the private range exists only in there: traffic cannot leave.

Links are cut with a permanent neighbour entry that points the peer's address at a
MAC address no interface owns: the bridge floods such frames and every host drops
them, so the sender sees silence (timeouts), as with a pulled cable, not a fast
error. The entry cuts one direction (A to B); a partition cuts both. Removing the
entry lets ARP find the real address again.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and ``ip`` from iproute2;
:func:`netns_unavailable_reason` says why not when they are missing, and
:meth:`Network.create` raises :class:`NetnsUnavailableError` with that reason.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ipaddress
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

SUBNET = ipaddress.ip_network("10.213.0.0/24")
# A locally administered unicast MAC that no interface of the run has: frames sent to
# it are flooded by the bridge and dropped by every host.
NOWHERE_MAC = "02:00:00:00:00:00"
_CLONE_NEWNET = 0x40000000
_IP_TIMEOUT_S = 10.0

# Every network not yet removed, removed at interpreter exit (and on SIGTERM/SIGINT
# through the runner's handlers) if a run is interrupted before its finally.
_LIVE_NETWORKS: list[Network] = []


class NetnsUnavailableError(RuntimeError):
    """Network namespaces cannot be created here (not root, no iproute2, a kernel or
    container that refuses them)."""


def netns_unavailable_reason() -> str | None:
    """Why namespaces cannot be built here, or None if they can (tries one)."""
    if os.geteuid() != 0:
        return "network namespace tests need root (CAP_NET_ADMIN): run them as root"
    if shutil.which("ip") is None:
        return "network namespace tests need iproute2's `ip` (apt-get install iproute2)"
    probe = f"qlprobe{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed here: {made.stderr.strip() or made.returncode}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, namespace: str | None = None, check: bool = True) -> str:
    command = ["ip", *args] if namespace is None else ["ip", "-n", namespace, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=_IP_TIMEOUT_S)
    if check and done.returncode != 0:
        raise NetnsUnavailableError(f"{' '.join(command)}: {done.stderr.strip()}")
    return done.stdout


@dataclass
class Host:
    """One namespace of the network with one address."""

    name: str
    namespace: str
    address: str
    mac: str = ""
    network: Network | None = field(default=None, repr=False)
    # More addresses of the same interface (a bookie's proxy listens on one).
    extra_addresses: list[str] = field(default_factory=list)
    # The veth end in the switch namespace: what leaves it enters this host.
    switch_port: str = ""

    @property
    def addresses(self) -> list[str]:
        return [self.address, *self.extra_addresses]

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` in this namespace (a new session, so signals reach only it)."""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs.setdefault("start_new_session", True)
        return subprocess.Popen(self.command(argv), **kwargs)

    def run(self, argv: Sequence[str], timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(argv), capture_output=True, text=True, timeout=timeout_s)

    def connect(self, address: str, port: int, timeout_s: float = 2.0) -> socket.socket:
        """A TCP connection made from inside this namespace (for readiness probes from
        the orchestrating process, which stays in the machine's own namespace)."""
        sock = socket_in_namespace(self.namespace)
        try:
            sock.settimeout(timeout_s)
            sock.connect((address, port))
        except BaseException:
            sock.close()
            raise
        return sock

    def exchange(self, address: str, port: int, request: bytes, timeout_s: float) -> bytes:
        """Send ``request`` from inside this namespace and read the answer until the
        peer closes (HTTP/1.0, ZooKeeper's four-letter words); OSError if it does not
        answer within ``timeout_s`` a read."""
        with self.connect(address, port, timeout_s=timeout_s) as sock:
            sock.sendall(request)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        return answer


def socket_in_namespace(namespace: str, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A TCP socket (UDP with ``kind=socket.SOCK_DGRAM``) that belongs to ``namespace``:
    made by a short-lived thread that enters the namespace (setns applies to the calling
    thread only), so the caller's own threads never leave the machine's namespace. The
    socket stays in the namespace it was made in, whichever thread uses it afterwards."""
    libc = ctypes.CDLL(None, use_errno=True)
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def enter_and_make() -> None:
        try:
            fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
            try:
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {namespace}")
            finally:
                os.close(fd)
            made.append(socket.socket(socket.AF_INET, kind))
        except BaseException as error:  # handed to the caller's thread
            failed.append(error)

    thread = threading.Thread(target=enter_and_make, name=f"setns-{namespace}")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return made[0]


class Network:
    """The run's namespaces: a switch with a bridge and hosts joined to it.

    Example::

        with Network.create() as net:
            zk = net.add_host("zk1")
            client = net.add_host("client")
            net.cut(client, zk)        # client -> zk frames dropped
            net.partition([zk], [client])
            net.heal()                 # every cut undone
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.prefix = f"ql{run_id}"
        self.switch = f"{self.prefix}-sw"
        self.hosts: dict[str, Host] = {}
        self._addresses = SUBNET.hosts()
        next(self._addresses)  # .1 stays free (no gateway: nothing leaves the bridge)
        self._cuts: set[tuple[str, str]] = set()
        self._namespaces: list[str] = []
        self._lock = threading.Lock()
        self.removed = False

    @staticmethod
    def create(run_id: str | None = None) -> Network:
        reason = netns_unavailable_reason()
        if reason is not None:
            raise NetnsUnavailableError(reason)
        network = Network(run_id or secrets.token_hex(3))
        _LIVE_NETWORKS.append(network)
        try:
            network._add_namespace(network.switch)
            _ip("link", "add", "br0", "type", "bridge", namespace=network.switch)
            # No STP and no forwarding delay: ports forward at once.
            _ip(
                "link",
                "set",
                "br0",
                "type",
                "bridge",
                "forward_delay",
                "0",
                namespace=network.switch,
            )
            _ip("link", "set", "br0", "up", namespace=network.switch)
        except BaseException:
            network.remove()
            raise
        return network

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._namespaces.append(name)
        _ip("link", "set", "lo", "up", namespace=name)

    def add_host(self, name: str) -> Host:
        """A new namespace joined to the bridge, with the next free address."""
        with self._lock:
            if name in self.hosts:
                raise ValueError(f"host {name!r} exists")
            index = len(self.hosts) + 1
            address = str(next(self._addresses))
        namespace = f"{self.prefix}-{name}"
        self._add_namespace(namespace)
        port = f"v{index}"
        # Made from inside the switch namespace: neither end ever exists in the machine's.
        _ip(
            "link",
            "add",
            port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            namespace,
            namespace=self.switch,
        )
        _ip("link", "set", port, "master", "br0", "up", namespace=self.switch)
        _ip("addr", "add", f"{address}/{SUBNET.prefixlen}", "dev", "eth0", namespace=namespace)
        _ip("link", "set", "eth0", "up", namespace=namespace)
        mac = _ip("-brief", "link", "show", "eth0", namespace=namespace).split()[2]
        host = Host(name, namespace, address, mac, self, switch_port=port)
        with self._lock:
            self.hosts[name] = host
        return host

    def add_address(self, host: Host) -> str:
        """One more address of the range on ``host``'s interface."""
        with self._lock:
            address = str(next(self._addresses))
        _ip("addr", "add", f"{address}/{SUBNET.prefixlen}", "dev", "eth0", namespace=host.namespace)
        host.extra_addresses.append(address)
        return address

    # ------------------------------------------------------------ link faults

    def cut(self, source: Host, destination: Host) -> None:
        """Drop every frame ``source`` sends to ``destination`` (one direction)."""
        _ip(
            "neigh",
            "replace",
            destination.address,
            "lladdr",
            NOWHERE_MAC,
            "nud",
            "permanent",
            "dev",
            "eth0",
            namespace=source.namespace,
        )
        with self._lock:
            self._cuts.add((source.name, destination.name))

    def restore(self, source: Host, destination: Host) -> None:
        """Undo :meth:`cut`: ARP finds the real address again."""
        _ip(
            "neigh",
            "del",
            destination.address,
            "dev",
            "eth0",
            namespace=source.namespace,
            check=False,
        )
        with self._lock:
            self._cuts.discard((source.name, destination.name))

    def partition(self, side_a: Sequence[Host], side_b: Sequence[Host]) -> None:
        """Cut every link between the two sides, both ways."""
        for a in side_a:
            for b in side_b:
                self.cut(a, b)
                self.cut(b, a)

    def isolate(self, host: Host) -> None:
        """Cut ``host`` off from every other host, both ways."""
        self.partition([host], [h for h in self.hosts.values() if h is not host])

    @property
    def cuts(self) -> set[tuple[str, str]]:
        with self._lock:
            return set(self._cuts)

    def heal(self) -> None:
        """Undo every cut."""
        for source, destination in sorted(self.cuts):
            self.restore(self.hosts[source], self.hosts[destination])

    # ------------------------------------------------------------ removal

    def kill_processes(self) -> None:
        """SIGKILL whatever still runs in the run's namespaces (by the pids the kernel
        lists for each namespace: only this run's processes)."""
        for namespace in self._namespaces:
            done = subprocess.run(
                ["ip", "netns", "pids", namespace],
                capture_output=True,
                text=True,
                timeout=_IP_TIMEOUT_S,
            )
            for pid in done.stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGCONT)
                    os.kill(int(pid), signal.SIGKILL)

    def remove(self) -> None:
        """Kill what runs inside, then delete every namespace (their veths go with them)."""
        if self.removed:
            return
        self.removed = True
        with contextlib.suppress(Exception):
            self.kill_processes()
        for namespace in reversed(self._namespaces):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        with contextlib.suppress(ValueError):
            _LIVE_NETWORKS.remove(self)

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def remove_live_networks() -> None:
    """Remove every network of this process that is still up."""
    for network in list(_LIVE_NETWORKS):
        network.remove()


atexit.register(remove_live_networks)


@contextlib.contextmanager
def removal_on_signals() -> Iterator[None]:
    """Turn SIGTERM into SystemExit while the block runs, so ``finally`` and atexit
    remove the namespaces when a run is stopped (Ctrl-C already raises)."""
    previous = signal.getsignal(signal.SIGTERM)

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


_netem: list[bool] = []


def netem_available() -> bool:
    """Whether this kernel has the netem qdisc (tried once, on the loopback of a
    namespace made for the probe and deleted after it)."""
    if not _netem:
        probe = f"qlnetem{secrets.token_hex(3)}"
        if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
            _netem.append(False)
            return False
        try:
            added = subprocess.run(
                ["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root",
                 "netem", "delay", "1ms"],
                capture_output=True,
                timeout=_IP_TIMEOUT_S,
            )  # fmt: skip
            _netem.append(added.returncode == 0)
        except (OSError, subprocess.TimeoutExpired):  # no tc at all
            _netem.append(False)
        finally:
            subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return _netem[0]
