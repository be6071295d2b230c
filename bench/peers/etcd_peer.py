"""etcd 3.4 (Debian's ``etcd-server``) as a 3-member cluster, written over gRPC from Python.

Each member has its own data directory and client/peer ports on 127.0.0.1. etcd
fsyncs its write-ahead log before a member acknowledges an entry (there is no
``--unsafe-no-fsync`` here), and a put is confirmed once a majority (2 of 3) has it.
The client is ``etcd-sdk-python`` (the maintained successor of ``python-etcd3``,
module ``pyetcd``) on one gRPC channel to the leader (a follower would forward):

- one at a time: ``client.put(key, value)``;
- pipelined: ``KV.Put`` calls issued as gRPC futures on the same channel (HTTP/2
  streams), at most ``--window`` in flight.

Keys are ``/bench/<pid>/<index>`` (distinct keys: each put is a new record, not an
overwrite), values ``--entry-size`` bytes.

    python bench/peers/etcd_peer.py client --endpoint 127.0.0.1:PORT --mode pipelined ...
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ``peers`` when run as a script

from peers.common import (
    PeerCluster,
    add_client_arguments,
    ensure_binary,
    ensure_modules,
    free_ports,
    log,
    print_json,
    run_modes,
    run_one_at_a_time,
    run_windowed,
)

MEMBERS = 3
# etcd-sdk-python declares only grpcio, but its generated code (protoc 5.27.2) imports
# google.protobuf and checks the runtime: protobuf 5.27.2 or later within major 5.
CLIENT_PACKAGES = (
    ("pyetcd", "etcd-sdk-python==0.0.7"),
    ("grpc", "grpcio>=1.60,<2"),
    ("google.protobuf", "protobuf>=5.27.2,<6"),
)


class EtcdCluster(PeerCluster):
    """Three etcd members on 127.0.0.1 in a temporary directory."""

    NAME = "etcd"
    READY_WHAT = "etcd cluster"
    FIRST_LOG = "m0/etcd.log"

    def __init__(self, base_dir: Path | None = None) -> None:
        super().__init__(base_dir)
        self.client_ports: list[int] = []

    def launch(self) -> None:
        etcd = ensure_binary("etcd", "etcd-server")
        self.version = subprocess.run(
            [etcd, "--version"], capture_output=True, text=True, check=False
        ).stdout.splitlines()[0]
        ports = free_ports(2 * MEMBERS)
        self.client_ports, peer_ports = ports[:MEMBERS], ports[MEMBERS:]
        cluster = ",".join(f"m{i}=http://127.0.0.1:{peer_ports[i]}" for i in range(MEMBERS))
        for i in range(MEMBERS):
            home = self.base_dir / f"m{i}"
            home.mkdir(parents=True, exist_ok=True)
            client_url = f"http://127.0.0.1:{self.client_ports[i]}"
            peer_url = f"http://127.0.0.1:{peer_ports[i]}"
            self.procs.start(
                [
                    etcd,
                    f"--name=m{i}",
                    f"--data-dir={home / 'data'}",
                    f"--listen-client-urls={client_url}",
                    f"--advertise-client-urls={client_url}",
                    f"--listen-peer-urls={peer_url}",
                    f"--initial-advertise-peer-urls={peer_url}",
                    f"--initial-cluster={cluster}",
                    "--initial-cluster-token=compare",
                    "--initial-cluster-state=new",
                    "--logger=zap",
                    "--log-level=warn",
                ],
                home / "etcd.log",
                cwd=home,
            )

    def ready(self) -> bool:
        return self.leader_port() is not None

    def leader_port(self) -> int | None:
        """The client port of the member that is leader, once all members answer."""
        import pyetcd

        leader = None
        for port in self.client_ports:
            client = pyetcd.client(host="127.0.0.1", port=port, timeout=2)
            try:
                status = client.maintenancestub.Status(pyetcd.etcdrpc.StatusRequest(), 2)
            finally:
                client.close()
            if status.leader == 0:
                return None
            if status.header.member_id == status.leader:
                leader = port
        return leader


def measure(
    modes: dict[str, dict[str, Any]], time_limit_s: float = 60.0
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Start a cluster, run each mode's client (``{mode: {entries, warmup, window}}``),
    stop it. Returns ({mode: summary}, facts about the setup)."""
    ensure_modules(CLIENT_PACKAGES)
    with EtcdCluster() as cluster:
        leader = cluster.leader_port()
        log(f"etcd cluster up ({cluster.version}); leader on port {leader}")
        target = ["--endpoint", f"127.0.0.1:{leader}"]
        results = run_modes("etcd", Path(__file__), target, modes, time_limit_s)
    setup = {
        "version": cluster.version,
        "members": MEMBERS,
        "config": "default (WAL fsynced before acknowledging), majority ack 2/3",
        "client": "etcd-sdk-python (pyetcd) over gRPC, connected to the leader",
    }
    return results, setup


def client_main(args: argparse.Namespace) -> None:
    import pyetcd

    host, port = args.endpoint.rsplit(":", 1)
    client = pyetcd.client(host=host, port=int(port), timeout=30)
    try:
        value = os.urandom(args.entry_size)
        prefix = f"/bench/{os.getpid()}/"
        if args.mode == "one-at-a-time":

            def op(i: int) -> None:
                client.put(prefix + str(i), value)

            result = run_one_at_a_time(op, args.entries, args.warmup, args.time_limit_s)
        else:
            put = client.kvstub.Put

            def start(i: int, done: Any) -> None:
                request = pyetcd.etcdrpc.PutRequest(key=(prefix + str(i)).encode(), value=value)
                put.future(request, 30).add_done_callback(lambda f: done(f.exception()))

            result = run_windowed(start, args.entries, args.warmup, args.window, args.time_limit_s)
        result["client_version"] = "etcd-sdk-python " + importlib.metadata.version(
            "etcd-sdk-python"
        )
        print_json(result)
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0], allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    client = sub.add_parser(
        "client", help="run one measurement against a running cluster", allow_abbrev=False
    )
    client.add_argument("--endpoint", required=True)
    add_client_arguments(client)
    client_main(parser.parse_args())


if __name__ == "__main__":
    main()
