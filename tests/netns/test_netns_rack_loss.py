"""A whole rack cut off, across network namespaces (as root): six bookies in three racks
(/r/a, /r/b, /r/c, two each, one namespace per bookie), a ZooKeeper server, a
rack-aware autorecovery daemon and the clients in namespaces of their own.

Two writers make rack-aware ledgers, one ledger of each shape filled and closed, one
kept open and written to: one writer with the policy enforced (3/3/2, 4/3/2, 2/2/2:
shapes that two racks can hold), one best effort with a 3/2/2 besides (two racks
cannot keep all three write sets of an ensemble of three across racks). Then both
bookies of rack /r/a are cut off from everyone at once, and:

- every open ledger keeps writing (its writer changes its ensemble to bookies of the
  other racks): no append fails, each ledger confirms appends after the cut;
- every closed ledger, and every open ledger's earlier fragments, heal onto racks
  /r/b and /r/c within HEAL_BOUND_S, and no write set of the shapes two racks can
  hold ever spans a single rack, before, during or after the cut;
- the rack comes back, its bookies register again, the writers close their ledgers,
  and the auditor ends with no placement violation and no mark: what the best-effort
  3/2/2 ledgers were left with during the cut (a write set in one rack) it reports and
  the workers mend, moving a copy back to /r/a;
- every confirmed entry is read back, by two readers (the history checker).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from quorumlog.core.placement import PlacementPolicy, violations
from quorumlog.server.local_zookeeper import missing_zookeeper_message, zookeeper_installed
from tests.harness.netns.checker import check_appends
from tests.harness.netns.cluster import NetnsCluster
from tests.harness.netns.history import Operation, pair_operations, read_events
from tests.harness.netns.network import netns_unavailable_reason, removal_on_signals

RACKS = ["/r/a", "/r/a", "/r/b", "/r/b", "/r/c", "/r/c"]
LOST_RACK = "/r/a"
ENFORCED_SHAPES = "3,3,2;4,3,2;2,2,2"
BEST_EFFORT_SHAPES = "3,3,2;4,3,2;2,2,2;3,2,2"
# Shapes whose every write set two racks can span (so the cut never excuses one rack).
TWO_RACKS_HOLD = {(3, 3), (4, 3), (2, 2)}
READY_BOUND_S = 60.0
HEAL_BOUND_S = 60.0
REREGISTER_BOUND_S = 30.0
REPAIR_BOUND_S = 60.0
CUT_WRITING_S = 5.0
# By then the cut bookies' sessions (2 s) expired and the auditor saw them go.
LOST_KNOWN_S = 6.0  # appends after the cut before the heal is awaited
RACK_AWARE = PlacementPolicy("rack-aware")
MODULE = "tests.harness.netns.rack_workload"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NetnsCluster]:
    reason = netns_unavailable_reason()
    if reason is not None:
        pytest.fail(f"the namespace suite cannot run here: {reason}", pytrace=False)
    if not zookeeper_installed():
        pytest.fail(missing_zookeeper_message(), pytrace=False)
    with (
        removal_on_signals(),
        NetnsCluster(
            "zk", tmp_path / "cluster", bookies=6, zookeeper_servers=1, racks=RACKS
        ) as built,
    ):
        built.start()
        yield built


def _poll(condition: Callable[[], object], bound_s: float, what: str) -> float:
    """Seconds until ``condition()`` held; AssertionError past ``bound_s``."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < bound_s, f"{what}: not within {bound_s} s"
        time.sleep(0.25)
    return time.monotonic() - started


class Observed:
    """The observer's snapshots (rack_workload observe), read as they come."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def all(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        lines = self.path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]

    def last(self) -> dict[str, Any] | None:
        snapshots = self.all()
        return snapshots[-1] if snapshots else None


def _operations(history: Path) -> list[Operation]:
    return pair_operations(read_events(sorted(history.glob("*.jsonl"))))


def _write_sets_in_one_rack(
    snapshot: dict[str, Any], places: dict[str, str], shapes: dict[int, tuple[int, int]]
) -> list[str]:
    """Write sets of ledgers whose shape two racks can hold that break the policy."""
    found = []
    for key, ledger in snapshot["ledgers"].items():
        ledger_id = int(key)
        if shapes.get(ledger_id) not in TWO_RACKS_HOLD:
            continue
        for first, ensemble in ledger["ensembles"]:
            for broken in violations(RACK_AWARE, ensemble, places, ledger["write_quorum"]):
                found.append(f"ledger {ledger_id} from entry {first}: {broken}")
    return found


def _names_any(snapshot: dict[str, Any], bookies: set[str], ledger_ids: set[int]) -> list[int]:
    return sorted(
        int(key)
        for key, ledger in snapshot["ledgers"].items()
        if int(key) in ledger_ids and any(set(e) & bookies for _, e in ledger["ensembles"])
    )


def test_a_whole_rack_cut_off_keeps_every_ledger_writing_and_heals_across_the_others(
    cluster: NetnsCluster, tmp_path: Path
) -> None:
    logs, history = tmp_path / "logs", tmp_path / "history"
    stop_observer, stop_writers = tmp_path / "stop-observer", tmp_path / "stop-writers"
    meta = ["--metadata", cluster.metadata_uri]
    places = {b.address: RACKS[b.index - 1] for b in cluster.bookies}
    lost_hosts = [b.server.host for b in cluster.bookies if RACKS[b.index - 1] == LOST_RACK]
    lost = {b.address for b in cluster.bookies if RACKS[b.index - 1] == LOST_RACK}

    daemon = cluster.run_python(
        cluster.client("ar"),
        "quorumlog",
        ["autorecovery", *meta, "--placement", "rack-aware", "--audit-interval-s", "2",
         "--bookie-check-interval-s", "2", "--open-ledger-grace-s", "120",
         "--retry-backoff-s", "1", "--autorecovery-session-timeout-ms", "4000",
         "--log-level", "INFO"],
        log_dir=logs, name="autorecovery",
    )  # fmt: skip
    observed = Observed(tmp_path / "observed.jsonl")
    cluster.run_python(
        cluster.client("obs"),
        MODULE,
        ["observe", *meta, "--stop-file", str(stop_observer), "--out", str(observed.path)],
        log_dir=logs, name="observer",
    )  # fmt: skip
    writers: dict[str, subprocess.Popen[bytes]] = {}
    for name, shapes, extra in (
        ("enforced", ENFORCED_SHAPES, ["--enforce"]),
        ("best-effort", BEST_EFFORT_SHAPES, []),
    ):
        writers[name] = cluster.run_python(
            cluster.client(name),
            MODULE,
            ["writer", *meta, "--process", name, "--history", str(history), "--shapes", shapes,
             "--stop-file", str(stop_writers), "--ready-file", str(tmp_path / f"{name}.ready"),
             *extra],
            log_dir=logs, name=name,
        )  # fmt: skip

    def ready() -> bool:
        for name, process in writers.items():
            assert process.poll() is None, (logs / f"{name}.err").read_text()[-2000:]
        return all((tmp_path / f"{name}.ready").exists() for name in writers)

    _poll(ready, READY_BOUND_S, "the writers' ledgers created")
    creates = [op for op in _operations(history) if op.f == "create" and op.ok]
    shapes = {op.result["ledger_id"]: tuple(op.result["shape"][:2]) for op in creates}
    closed = {op.result["ledger_id"] for op in creates if op.result["kind"] == "closed"}
    opened = {op.result["ledger_id"] for op in creates if op.result["kind"] == "open"}
    for op in creates:  # three racks up: every write set across racks, by both modes
        ensemble = op.result["ensemble"]
        assert violations(RACK_AWARE, ensemble, places, op.result["shape"][1]) == [], op.result
    assert _names_any(_poll_snapshot(observed, closed | opened), lost, closed | opened)

    # ---------------------------------------------------------------- the cut
    cut_ns, cut_wall_s = time.monotonic_ns(), time.time()
    others = [h for h in cluster.network.hosts.values() if h not in lost_hosts]
    cluster.network.partition(lost_hosts, others)
    time.sleep(CUT_WRITING_S)

    def healed() -> bool:
        snapshot = observed.last()
        return (
            snapshot is not None
            and snapshot["time_ns"] > cut_ns
            and not set(snapshot["writable"]) & lost
            and not _names_any(snapshot, lost, closed | opened)
            and not snapshot["marks"]
        )

    heal_s = _poll(healed, HEAL_BOUND_S, "every copy of rack a re-replicated elsewhere")
    heal_s += CUT_WRITING_S
    during = observed.last()
    assert during is not None
    for key, ledger in during["ledgers"].items():
        for _, ensemble in ledger["ensembles"]:
            assert {places[b] for b in ensemble} <= {"/r/b", "/r/c"}, (key, ledger)

    # ---------------------------------------------------------------- the rack back
    cluster.network.heal()
    back_ns, back_wall_s = time.monotonic_ns(), time.time()
    reregister_s = _poll(
        lambda: (
            (s := observed.last()) is not None
            and s["time_ns"] > back_ns
            and lost <= set(s["writable"])
        ),
        REREGISTER_BOUND_S,
        "rack a's bookies registered again",
    )
    stop_writers.write_text("stop\n")
    for name, process in writers.items():
        assert process.wait(timeout=60) == 0, (logs / f"{name}.err").read_text()[-2000:]
    closed_ns = time.monotonic_ns()
    closed_wall_ms = time.time() * 1000  # audit summaries carry wall-clock times

    def repaired() -> bool:
        snapshot = observed.last()
        if snapshot is None or snapshot["time_ns"] <= closed_ns or snapshot["marks"]:
            return False
        audit = snapshot["last_audit"] or {}
        if int(audit.get("started_ms", 0)) <= closed_wall_ms or audit.get("misplaced") != 0:
            return False
        ledgers = snapshot["ledgers"]
        return all(ledgers[str(i)]["state"] == "CLOSED" for i in closed | opened)

    repair_s = _poll(
        repaired, REPAIR_BOUND_S, "no placement violation left after the rack came back"
    )
    stop_observer.write_text("stop\n")
    final = observed.last()
    assert final is not None
    for key in sorted(closed | opened):
        ledger = final["ledgers"][str(key)]
        for _, ensemble in ledger["ensembles"]:
            assert violations(RACK_AWARE, ensemble, places, ledger["write_quorum"]) == []

    # ---------------------------------------------------------------- the history
    snapshots = observed.all()
    for snapshot in snapshots:
        assert _write_sets_in_one_rack(snapshot, places, shapes) == []
    operations = _operations(history)
    assert not [op for op in operations if op.f == "broken"], "an open ledger stopped writing"
    appends = [op for op in operations if op.f == "append"]
    assert all(op.ok for op in appends), [op for op in appends if not op.ok][:5]
    for ledger_id in opened:
        after = [op for op in appends if op.result and op.result[0] == ledger_id]
        assert any(op.start_ns > cut_ns and op.end_ns and op.end_ns < back_ns for op in after), (
            f"ledger {ledger_id} confirmed nothing while rack a was cut off"
        )
    _final_read(cluster, meta, history, logs)
    operations = _operations(history)
    reads = {
        str(op.result["reader"]): op.result["values"]
        for op in operations
        if op.f == "read" and op.ok and isinstance(op.result, dict)
    }
    final_read = reads.pop("final")
    acknowledged = 0
    for ledger_id in sorted(closed | opened):  # one order per ledger, not across them
        mine = [op for op in operations if op.f != "append" or _ledger_of(op.value) == ledger_id]
        report = check_appends(
            mine,
            [v for v in final_read if _ledger_of(v) == ledger_id],
            {
                name: [v for v in values if _ledger_of(v) == ledger_id]
                for name, values in reads.items()
            },
        )
        assert report.valid and report.acknowledged > 0, (ledger_id, report)
        acknowledged += report.acknowledged
    assert acknowledged == len(final_read) == len(appends)
    # What the cut left in one rack: only 3/2/2 ledgers (two racks cannot hold them),
    # each reported by the auditor and mended once rack a was back (checked above).
    one_rack = {
        int(k)
        for s in snapshots
        if cut_ns < s["time_ns"] < back_ns
        for k, ledger in s["ledgers"].items()
        for _, e in ledger["ensembles"]
        if violations(RACK_AWARE, e, places, ledger["write_quorum"])
    }
    assert {shapes[i] for i in one_rack} <= {(3, 2)}, one_rack
    daemon_log = (logs / "autorecovery.err").read_text(errors="replace")
    for ledger_id in one_rack:
        assert f"ledger {ledger_id} breaks the rack-aware placement" in daemon_log
    # Once rack a is known lost, no move is planned until it is back: with two racks
    # left a move cannot mend a 3/2/2 write set, only shift it (a copy for nothing).
    churn = [
        line
        for line in daemon_log.splitlines()
        if "marked to move" in line and cut_wall_s + LOST_KNOWN_S < _logged_at(line) < back_wall_s
    ]
    assert churn == [], churn
    print(
        f"rack cut off: healed in {heal_s:.1f} s; rack back registered in {reregister_s:.1f} s; "
        f"placement mended {repair_s:.1f} s after the writers closed; "
        f"{acknowledged} appends confirmed, all read back; "
        f"3/2/2 ledgers left in one rack during the cut: {sorted(one_rack)}; "
        f"auditor placement reports: {daemon_log.count('breaks the rack-aware placement')}"
    )
    assert daemon.poll() is None, daemon_log[-2000:]


def _logged_at(line: str) -> float:
    """The wall-clock time of a log line (``2026-12-06 14:34:13,062 ...``, local time)."""
    stamp = line[:19]
    try:
        return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(line[20:23]) / 1000
    except ValueError:
        return 0.0


def _ledger_of(value: str) -> int:
    """The ledger of a writer's value ``<process>.<ledger id>.<seq>``."""
    return int(value.split(".")[1])


def _poll_snapshot(observed: Observed, ledger_ids: set[int]) -> dict[str, Any]:
    """The first snapshot that lists every ledger of ``ledger_ids``."""

    def listed() -> bool:
        snapshot = observed.last()
        return snapshot is not None and {str(i) for i in ledger_ids} <= set(snapshot["ledgers"])

    _poll(listed, READY_BOUND_S, "the observer's snapshot of every ledger")
    snapshot = observed.last()
    assert snapshot is not None
    return snapshot


def _final_read(cluster: NetnsCluster, meta: list[str], history: Path, logs: Path) -> None:
    final = cluster.run_python(
        cluster.client("checker"),
        "tests.harness.netns.workload",
        ["final-ledger", *meta, "--history", str(history), "--process", "final"],
        log_dir=logs,
        name="final",
    )
    assert final.wait(timeout=120) == 0, (logs / "final.err").read_text()[-2000:]
