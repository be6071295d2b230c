"""PySyncObj (PyPI ``pysyncobj``): 3 Raft nodes, each in its own process, a replicated list.

PySyncObj has no separate client: the application is a node. Each node process here
holds a ``ReplList``, a journal file (``journalFile``) and a dump file
(``fullDumpFile``) in its own directory, and takes commands on stdin. Once a leader is
elected, the comparison asks the leader's process to measure (on a follower every
append would be forwarded to the leader: one hop more):

- one at a time: ``append(value, sync=True)`` (returns once the entry is committed by
  a majority and applied);
- pipelined: ``append(value, callback=...)`` with at most ``--window`` in flight.

Each mode runs on a fresh cluster with the setting that suits it: one at a time with
``appendEntriesUseBatch=False`` (with batching, each append waits for the next
``appendEntriesPeriod`` tick: about 100 ms, 10 appends/s), pipelined with it on (about
1.6x the throughput of sending each append at once).

Durability: PySyncObj 0.3.17 writes its journal into an ``mmap`` of the file and never
calls ``msync``/``fsync`` on it (it has no option to), so a confirmed append survives
the crash of a node process but not a power loss or kernel crash of the machine. The
other systems fsync before they confirm; this one is given that advantage.

    python bench/peers/pysyncobj_peer.py node --self 127.0.0.1:P --partners A,B --dir D
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ``peers`` when run as a script

import contextlib

from peers.common import (
    Processes,
    client_env,
    ensure_modules,
    free_ports,
    log,
    log_tail,
    print_json,
    run_one_at_a_time,
    run_windowed,
)

NODES = 3
_LEADER_STATE = 2  # pysyncobj's _RAFT_STATE.LEADER


class PySyncObjCluster:
    """Three node processes; ``ask(i, command)`` sends a JSON command, returns the answer."""

    def __init__(self, base_dir: Path | None = None, append_entries_batch: bool = True) -> None:
        self.append_entries_batch = append_entries_batch
        self._own_dir = base_dir is None
        self.base_dir = base_dir or Path(tempfile.mkdtemp(prefix="compare-pysyncobj-"))
        self.procs = Processes("pysyncobj")
        self.nodes: list[subprocess.Popen[bytes]] = []

    def start(self, timeout_s: float = 30.0) -> PySyncObjCluster:
        ports = free_ports(NODES)
        addresses = [f"127.0.0.1:{p}" for p in ports]
        for i, address in enumerate(addresses):
            home = self.base_dir / f"node{i}"
            home.mkdir(parents=True, exist_ok=True)
            partners = ",".join(a for a in addresses if a != address)
            self.nodes.append(
                self.procs.start(
                    [
                        sys.executable,
                        __file__,
                        "node",
                        "--self",
                        address,
                        "--partners",
                        partners,
                        "--dir",
                        str(home),
                        "--batch",
                        "on" if self.append_entries_batch else "off",
                    ],
                    home / "node.log",
                    env=client_env(),
                    stdin=subprocess.PIPE,
                    stdout_pipe=True,
                )
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.leader_index() is not None:
                return self
            time.sleep(0.2)
        tail = log_tail(self.base_dir / "node0" / "node.log")
        self.stop()
        raise RuntimeError(f"PySyncObj cluster: no leader after {timeout_s:.0f} s\n{tail}")

    def ask(self, index: int, command: dict[str, Any]) -> dict[str, Any]:
        node = self.nodes[index]
        assert node.stdin is not None and node.stdout is not None
        node.stdin.write(json.dumps(command).encode() + b"\n")
        node.stdin.flush()
        line = node.stdout.readline()  # each command's answer is one line
        if not line:
            tail = log_tail(self.base_dir / f"node{index}" / "node.log")
            raise RuntimeError(f"PySyncObj node {index} exited\n{tail}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def leader_index(self) -> int | None:
        leaders = [i for i in range(NODES) if self.ask(i, {"op": "status"}).get("leader")]
        ready = all(self.ask(i, {"op": "status"}).get("ready") for i in range(NODES))
        return leaders[0] if len(leaders) == 1 and ready else None

    def stop(self) -> None:
        for node in self.nodes:
            if node.poll() is None and node.stdin is not None:
                try:
                    node.stdin.write(b'{"op": "quit"}\n')
                    node.stdin.close()
                except OSError:
                    pass
        for node in self.nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.wait(timeout=5)
        self.procs.stop_all()  # whatever did not quit: by pid
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> PySyncObjCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def measure(
    modes: dict[str, dict[str, Any]], time_limit_s: float = 60.0
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Start 3 nodes, have the leader run each mode (``{mode: {entries, warmup, window}}``),
    stop them. Returns ({mode: summary}, facts about the setup)."""
    ensure_modules([("pysyncobj", "pysyncobj>=0.3.12,<0.4")])
    results: dict[str, dict[str, Any]] = {}
    for mode, spec in modes.items():
        # Each mode on a fresh cluster with the setting that suits it best (measured):
        # one at a time without batching (else each append waits for the next
        # appendEntriesPeriod tick, 100 ms), pipelined with it.
        batch = mode != "one-at-a-time"
        with PySyncObjCluster(append_entries_batch=batch) as cluster:
            leader = cluster.leader_index()
            assert leader is not None
            log(f"PySyncObj cluster up (appendEntriesUseBatch={batch}); leader is node {leader}")
            command = {"op": "run", "mode": mode, "time_limit_s": time_limit_s, **spec}
            answer = cluster.ask(leader, command)
            if "error" in answer:
                raise RuntimeError(f"PySyncObj {mode}: {answer['error']}")
            answer["append_entries_use_batch"] = batch
            results[mode] = answer
            log(f"PySyncObj {mode}: {answer['entries_per_s']:,.0f} appends/s")
    setup = {
        "version": importlib.metadata.version("pysyncobj"),
        "nodes": NODES,
        "config": "journalFile + fullDumpFile; appendEntriesUseBatch off for one at a time, "
        "on for pipelined; defaults otherwise. The journal is mmap-written and never "
        "fsynced: it survives a process crash, not a power loss",
        "client": "the leader node's own process (PySyncObj has no separate client)",
    }
    return results, setup


def node_main(args: argparse.Namespace) -> None:
    from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
    from pysyncobj.batteries import ReplList

    home = Path(args.dir)
    conf = SyncObjConf(
        journalFile=str(home / "journal.bin"),
        fullDumpFile=str(home / "dump.bin"),
        dynamicMembershipChange=False,
        appendEntriesUseBatch=args.batch == "on",
    )
    records = ReplList()
    node = SyncObj(args.self, args.partners.split(","), conf=conf, consumers=[records])
    try:
        for line in sys.stdin:  # one JSON command a line, one JSON answer a line
            command = json.loads(line)
            if command["op"] == "quit":
                break
            if command["op"] == "status":
                status = node.getStatus()
                print_json(
                    {"leader": status.get("state") == _LEADER_STATE, "ready": node.isReady()}
                )
                continue
            try:
                print_json(_run(command, records, FAIL_REASON.SUCCESS))
            except Exception as exc:  # reported to the comparison, which fails loudly
                print_json({"error": repr(exc)})
    finally:
        node.destroy()


def _run(command: dict[str, Any], records: Any, success: int) -> dict[str, Any]:
    value = os.urandom(command.get("entry_size", 100))
    entries, warmup = int(command["entries"]), int(command["warmup"])
    time_limit_s = float(command["time_limit_s"])
    if command["mode"] == "one-at-a-time":

        def op(_i: int) -> None:
            records.append(value, sync=True, timeout=30)

        result = run_one_at_a_time(op, entries, warmup, time_limit_s)
    else:

        def start(_i: int, done: Any) -> None:
            def callback(_result: object, error: int) -> None:
                done(None if error == success else RuntimeError(f"FAIL_REASON {error}"))

            records.append(value, callback=callback)

        result = run_windowed(start, entries, warmup, int(command["window"]), time_limit_s)
    result["client_version"] = "pysyncobj " + importlib.metadata.version("pysyncobj")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0], allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    node = sub.add_parser("node", help="one node; JSON commands on stdin", allow_abbrev=False)
    node.add_argument("--self", required=True)
    node.add_argument("--partners", required=True)
    node.add_argument("--dir", required=True)
    node.add_argument("--batch", choices=("on", "off"), default="on", help="appendEntriesUseBatch")
    node_main(parser.parse_args())


if __name__ == "__main__":
    main()
