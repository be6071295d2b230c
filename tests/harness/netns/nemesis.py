"""Nemeses: faults started, held for a bounded time, and undone.

Each nemesis names the mechanism it uses (the kernel of the project's machines has no
``netem``):

- ``neighbour``: a permanent neighbour entry to a MAC nobody owns, in the sender's
  namespace: its frames to that address vanish (silence, as a pulled cable; one
  direction per entry, a partition sets both);
- ``proxy``: the bookie's TCP proxy holds chunks: delay, jitter (reordering across
  connections), loss as TCP retransmission stalls; ``netem`` instead where the kernel
  has it (:func:`~tests.harness.netns.network.netem_available`): the same faults
  at the packet level on the bookie's links;
- ``signal``: SIGSTOP/SIGCONT or SIGKILL by pid (and a restart on the same data).

``start(context)`` applies it, ``heal(context)`` undoes it; :class:`RunContext` gives
both the cluster and the run's client processes. ``heal`` is safe to call twice and
is always called, also when the run fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.netns.cluster import BookieNode, NetnsCluster, ServerProcess
from tests.harness.netns.history import read_events
from tests.harness.netns.network import Host, netem_available
from tests.harness.netns.proxy import LinkFaults


@dataclass
class RunContext:
    """What a nemesis may act on during one run."""

    cluster: NetnsCluster
    history_dir: Path
    clients: dict[str, Host]  # process name -> its namespace
    processes: dict[str, subprocess.Popen[bytes]]  # process name -> the client process
    notes: dict[str, object] = field(default_factory=dict)

    def leading_writer(self) -> str | None:
        """The log writer that opened the log last (from the recorded history)."""
        events = read_events(sorted(self.history_dir.glob("*.jsonl")))
        opened = {e.op_id for e in events if e.f == "open" and e.type == "ok"}
        leader = None
        for event in events:
            if event.op_id in opened and event.type == "ok":
                leader = event.process
        return leader


class Nemesis:
    name = "none"
    mechanism = "none"
    drivers: tuple[str, ...] = ("sqlite", "zk")

    def describe(self) -> str:
        return self.name

    def start(self, context: RunContext) -> None:
        raise NotImplementedError

    def heal(self, context: RunContext) -> None:
        raise NotImplementedError


def _bookie(context: RunContext, index: int) -> BookieNode:
    """The ``index``-th bookie of the ensemble the ledger writer chose last (so the
    fault hits a bookie the writer is using); the cluster's order when there is none."""
    by_address = {bookie.address: bookie for bookie in context.cluster.bookies}
    chosen = context.notes.get("ensemble")
    if not isinstance(chosen, list):
        chosen = []
        for event in read_events(sorted(context.history_dir.glob("*.jsonl"))):
            if event.f == "create" and event.type == "ok" and isinstance(event.value, dict):
                chosen = [str(a) for a in event.value["ensemble"]]
        context.notes["ensemble"] = chosen
    ordered = [by_address[a] for a in chosen if a in by_address]
    ordered += [b for b in context.cluster.bookies if b not in ordered]
    return ordered[index]


class _NetworkCut(Nemesis):
    """A fault of neighbour entries (the links cut in ``start``): healing removes every
    entry the network holds."""

    mechanism = "neighbour"

    def heal(self, context: RunContext) -> None:
        context.cluster.network.heal()


def _zookeeper_hosts(context: RunContext) -> list[Host]:
    """The namespaces of the ZooKeeper ensemble (the nemeses that cut them need ``zk``)."""
    zookeeper = context.cluster.zookeeper
    assert zookeeper is not None
    return [node.host for node in zookeeper.nodes]


def _db_leader(context: RunContext, action: str) -> ServerProcess:
    """The database's leading replica, which the nemesis is to ``action``."""
    leader = context.cluster.db_leader()
    if leader is None:
        raise RuntimeError(f"no database leader to {action}")
    return leader


class IsolateBookie(_NetworkCut):
    """A bookie cut off from everyone (both directions)."""

    name = "partition-bookie"

    def start(self, context: RunContext) -> None:
        context.cluster.network.isolate(_bookie(context, 0).server.host)


class WriterFromBookies(_NetworkCut):
    """The writer cut off from some bookies (both directions), not from the others
    nor from the metadata store."""

    name = "partition-writer-from-bookies"

    def __init__(self, count: int = 1) -> None:
        self.count = count

    def start(self, context: RunContext) -> None:
        bookies = [_bookie(context, i).server.host for i in range(self.count)]
        context.cluster.network.partition([context.clients["writer"]], bookies)


class OneWayLoss(_NetworkCut):
    """Everything one bookie sends to the writer is lost; the writer's requests still
    arrive (entries stored, acknowledgements lost)."""

    name = "one-way-loss"

    def start(self, context: RunContext) -> None:
        bookie = _bookie(context, 0).server.host
        context.cluster.network.cut(bookie, context.clients["writer"])


def netem_arguments(faults: LinkFaults) -> list[str]:
    """The ``tc qdisc ... netem`` arguments for the same faults at the packet level:
    delay with uniform jitter (netem's default distribution; packets overtake each
    other), and loss of packets, which TCP retransmits."""
    arguments = ["netem"]
    if faults.delay_ms or faults.jitter_ms:
        # The proxy holds delay + U(0, jitter); netem holds delay' +- jitter'.
        centre_ms = faults.delay_ms + faults.jitter_ms / 2
        arguments += ["delay", f"{centre_ms:g}ms", f"{faults.jitter_ms / 2:g}ms"]
    if faults.loss_rate:
        arguments += ["loss", f"{faults.loss_rate * 100:g}%"]
    return arguments


class ProxyFaults(Nemesis):
    """Delay, loss or reordering on the first ``count`` bookies (of the writer's
    ensemble), or all: with netem on the bookie's links where the kernel has it (its
    eth0 for what it sends, its switch port for what it receives), else through the
    bookies' proxies."""

    def __init__(self, name: str, faults: LinkFaults, count: int | None = None) -> None:
        self.name = name
        self.faults = faults
        self.count = count

    @property
    def mechanism(self) -> str:  # type: ignore[override]
        return "netem" if netem_available() else "proxy"

    def describe(self) -> str:
        return f"{self.name} {self.faults.to_json()}"

    def _targets(self, context: RunContext) -> list[BookieNode]:
        if self.count is None:
            return context.cluster.bookies
        return [_bookie(context, i) for i in range(self.count)]

    def _links(self, context: RunContext, bookie: BookieNode) -> list[tuple[str, str]]:
        """(namespace, device) of the bookie's links the faults' direction covers."""
        host = bookie.server.host
        links = []
        if self.faults.applies(to_target=False):
            links.append((host.namespace, "eth0"))
        if self.faults.applies(to_target=True):
            links.append((context.cluster.network.switch, host.switch_port))
        return links

    def start(self, context: RunContext) -> None:
        for bookie in self._targets(context):
            if self.mechanism == "netem":
                for namespace, device in self._links(context, bookie):
                    subprocess.run(
                        ["ip", "netns", "exec", namespace, "tc", "qdisc", "replace", "dev",
                         device, "root", *netem_arguments(self.faults)],
                        check=True, capture_output=True,
                    )  # fmt: skip
            else:
                context.cluster.set_link_faults(bookie, self.faults)

    def heal(self, context: RunContext) -> None:
        for bookie in context.cluster.bookies:
            if self.mechanism == "netem":
                for namespace, device in self._links(context, bookie):
                    subprocess.run(
                        ["ip", "netns", "exec", namespace, "tc", "qdisc", "del", "dev",
                         device, "root"],
                        capture_output=True,
                    )  # fmt: skip
            context.cluster.set_link_faults(bookie, LinkFaults())


class PauseBookie(Nemesis):
    name = "pause-bookie"
    mechanism = "signal"

    def start(self, context: RunContext) -> None:
        context.cluster.pause(_bookie(context, 0).server)

    def heal(self, context: RunContext) -> None:
        context.cluster.resume(_bookie(context, 0).server)


class KillBookie(Nemesis):
    """kill -9 of a bookie; healing restarts it on the same data."""

    name = "kill-bookie"
    mechanism = "signal"

    def start(self, context: RunContext) -> None:
        context.cluster.kill(_bookie(context, 0).server)

    def heal(self, context: RunContext) -> None:
        bookie = _bookie(context, 0)
        if not bookie.server.alive():
            context.cluster.restart(bookie.server)
            context.cluster.wait_bookie_ready(bookie)


class _LeaderFault(Nemesis):
    """Acts on the log writer that leads when the fault starts."""

    def target(self, context: RunContext) -> str:
        leader = context.notes.get("target")
        if isinstance(leader, str):
            return leader
        found = context.leading_writer()
        if found is None:
            raise RuntimeError("no log writer has opened the log yet")
        context.notes["target"] = found
        return found


class PauseLeader(_LeaderFault):
    """SIGSTOP of the leading writer past its election session; another takes over;
    SIGCONT at healing, when it must find itself fenced."""

    name = "pause-leader"
    mechanism = "signal"

    def start(self, context: RunContext) -> None:
        process = context.processes[self.target(context)]
        process.send_signal(19)  # SIGSTOP

    def heal(self, context: RunContext) -> None:
        if "target" in context.notes:
            context.processes[str(context.notes["target"])].send_signal(18)  # SIGCONT


class KillLeader(_LeaderFault):
    """kill -9 of the leading writer; the other contender takes the log over."""

    name = "kill-leader"
    mechanism = "signal"

    def start(self, context: RunContext) -> None:
        process = context.processes[self.target(context)]
        process.kill()
        process.wait(timeout=10)

    def heal(self, context: RunContext) -> None:
        pass  # a dead writer stays dead: the other one writes from now on


class LeaderFromZooKeeper(_NetworkCut, _LeaderFault):
    """The leading writer cut off from ZooKeeper but not from the bookies: its election
    session is suspended, then expires; its writes must be fenced."""

    name = "partition-writer-from-zookeeper"
    drivers = ("zk",)

    def start(self, context: RunContext) -> None:
        writer = context.clients[self.target(context)]
        context.cluster.network.partition([writer], _zookeeper_hosts(context))


class ZooKeeperMinority(_NetworkCut):
    """The ZooKeeper leader cut off from everyone: a minority of one; the other two
    elect a leader and serve."""

    name = "partition-zookeeper-minority"
    drivers = ("zk",)

    def start(self, context: RunContext) -> None:
        zookeeper = context.cluster.zookeeper
        assert zookeeper is not None
        leader = zookeeper.leader() or zookeeper.nodes[0]
        context.notes["isolated_zookeeper"] = leader.server_id
        context.cluster.network.isolate(leader.host)


class BookieFromZooKeeper(_NetworkCut):
    """A bookie cut off from ZooKeeper (not from clients) past its session timeout:
    its registration expires; after healing it must register again."""

    name = "partition-bookie-from-zookeeper"
    drivers = ("zk",)

    def start(self, context: RunContext) -> None:
        bookie = _bookie(context, 0)
        context.notes["bookie"] = bookie.address
        context.cluster.network.partition([bookie.server.host], _zookeeper_hosts(context))


def registered_bookies(cluster: NetnsCluster, host: Host, timeout_s: float = 30) -> list[str]:
    """The writable bookies the metadata store lists, asked from ``host``."""
    done = host.run(
        [*_python(cluster), "bookies", "--metadata", cluster.metadata_uri], timeout_s=timeout_s
    )
    if done.returncode != 0:
        raise RuntimeError(f"listing bookies failed: {done.stderr[-2000:]}")
    listed = json.loads(done.stdout.strip().splitlines()[-1])
    return [str(address) for address in listed]


def _python(cluster: NetnsCluster) -> list[str]:
    return ["env", f"PYTHONPATH={cluster.env['PYTHONPATH']}", sys.executable, "-m",
            "tests.harness.netns.workload"]  # fmt: skip


def server_named(context: RunContext, name: str) -> ServerProcess:
    for server in context.cluster.servers():
        if server.name == name:
            return server
    raise KeyError(name)


class IsolateDbLeader(_NetworkCut):
    """The database's leading replica cut off from everyone."""

    name = "partition-db-leader"

    def start(self, context: RunContext) -> None:
        leader = _db_leader(context, "cut off")
        context.notes["isolated_replica"] = leader.name
        context.cluster.network.isolate(leader.host)


class PauseDbLeader(Nemesis):
    """SIGSTOP of the database's leading replica past its 1.5 s election session: another
    replica takes the lead; SIGCONT at healing, when the old leader must acknowledge
    nothing its successor's log does not hold."""

    name = "pause-db-leader"
    mechanism = "signal"

    def start(self, context: RunContext) -> None:
        leader = _db_leader(context, "pause")
        context.notes["paused_replica"] = leader.name
        context.cluster.pause(leader)

    def heal(self, context: RunContext) -> None:
        name = context.notes.get("paused_replica")
        if isinstance(name, str):
            context.cluster.resume(server_named(context, name))
