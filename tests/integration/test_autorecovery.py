"""Autorecovery (auditor and replication workers) against real bookie and autorecovery
processes, on both metadata drivers.

Bookies run with a 2 s metadata session, so that a killed bookie leaves the
available list within a few seconds; the autorecovery processes likewise.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import (
    BOOKIE_COMMAND,
    CuttableLink,
    holders,
    holds_for,
    plant_forged_entry,
    poll_until,
    shell,
)
from test_admin_http import http
from test_metrics import assert_dashboard_names_exported, scrape

from quorumlog import BookKeeper
from quorumlog.errors import BKError, Status
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.proto.codec import ReadRequest, ReadResponse
from quorumlog.replication import audit_ledger
from quorumlog.server.local_cluster import LocalCluster, running_cluster

SESSION_MS = "2000"
DELAY_S = 3
# Bound for the repair once the delay has passed: detection (a session expiry), the
# copies and the compare-and-sets, on a shared 2-core machine.
REPAIR_BOUND_S = 90.0
_ADMIN_LINE = re.compile(r"^autorecovery (\S+) admin http://127\.0\.0\.1:(\d+)$", re.MULTILINE)


@pytest.fixture
def cluster5(metadata_uri: str, tmp_path: Path) -> Iterator[LocalCluster]:
    yield from running_cluster(
        metadata_uri,
        tmp_path / "cluster",
        5,
        extra_args=["--metadata-session-timeout-ms", SESSION_MS],
    )


class Daemon:
    """One ``quorumlog autorecovery`` process, stopped by pid."""

    def __init__(self, uri: str, home: Path, *extra: str) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.out = home / "stdout"
        self.err = home / "stderr"
        env = {k: v for k, v in os.environ.items() if k != "QUORUMLOG_METADATA"}
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "quorumlog",
                    "autorecovery",
                    "--metadata",
                    uri,
                    "--autorecovery-session-timeout-ms",
                    SESSION_MS,
                    "--open-ledger-grace-s",
                    "5",
                    "--retry-backoff-s",
                    "1",
                    "--bookie-check-interval-s",
                    "5",
                    "--log-level",
                    "INFO",
                    *extra,
                ],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        poll_until(
            lambda: "running" in self.out.read_text() or self.process.poll() is not None,
            timeout_s=60,
            what="autorecovery start",
        )
        assert self.process.poll() is None, self.err.read_text()
        self.identifier = self.out.read_text().split()[1]

    @property
    def admin_port(self) -> int:
        """The port of its admin API (``--http-port``), printed before ``running``."""
        found = _ADMIN_LINE.search(self.out.read_text())
        assert found, self.out.read_text()
        assert found.group(1) == self.identifier
        return int(found.group(2))

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    try:
        yield started
    finally:
        for daemon in started:
            daemon.kill()


def payload(ledger_id: int, i: int, size: int = 100) -> bytes:
    head = b"ar-%d-%d-" % (ledger_id, i)
    return head + bytes([i % 251]) * max(0, size - len(head))


def write_closed(bk: BookKeeper, count: int, size: int = 100, **kw: Any) -> int:
    async def go() -> int:
        lh = await bk.aio.create_ledger(3, 3, 2, **kw)
        await asyncio.gather(*(lh.append(payload(lh.ledger_id, i, size)) for i in range(count)))
        await lh.close()
        return lh.ledger_id

    return bk.run(go())


def marks(bk: BookKeeper) -> list[int]:
    return bk.run(UnderReplicationManager(bk.aio.store).marked_ledgers())


def set_delay(bk: BookKeeper, seconds: int) -> None:
    bk.run(UnderReplicationManager(bk.aio.store).set_lost_bookie_recovery_delay_s(seconds))


def closed_naming(bk: BookKeeper, bookie: str) -> list[int]:
    found = []
    for ledger_id in bk.list_ledgers():
        md = bk.ledger_metadata(ledger_id)
        if md.is_closed and bookie in md.all_bookies():
            found.append(ledger_id)
    return found


def naming(bk: BookKeeper, bookie: str) -> list[int]:
    return [i for i in bk.list_ledgers() if bookie in bk.ledger_metadata(i).all_bookies()]


def has_entry(bk: BookKeeper, bookie: str, ledger_id: int, entry_id: int) -> bool:
    async def read() -> Any:
        return await bk.aio.pool.request(bookie, ReadRequest(0, ledger_id, entry_id, 1), 5_000)

    answer = bk.run(read())
    return isinstance(answer, ReadResponse) and answer.status == Status.OK and bool(answer.entries)


def assert_fully_replicated(bk: BookKeeper, ledger_id: int) -> None:
    result = bk.run(audit_ledger(bk.aio, ledger_id))  # type: ignore[arg-type]
    assert result.healthy, result.summary()


def victim(bk: BookKeeper, cluster: LocalCluster, ledgers: list[int]) -> int:
    """The index of a bookie that the first ledger names."""
    address = bk.ledger_metadata(ledgers[0]).ensembles[0][1][0]
    return next(b.index for b in cluster.bookies if b.address == address)


def most_named(bk: BookKeeper, cluster: LocalCluster, ledgers: list[int]) -> int:
    """The index of the bookie that the most of ``ledgers`` name."""
    counts = Counter(b for i in ledgers for b in set(bk.ledger_metadata(i).all_bookies()))
    address = counts.most_common(1)[0][0]
    return next(b.index for b in cluster.bookies if b.address == address)


class Writer(threading.Thread):
    """Writes ledgers of 3/3/2 one after the other (40 entries each, then close)
    until stopped; every add must be confirmed."""

    def __init__(self, uri: str) -> None:
        super().__init__(daemon=True)
        self.uri = uri
        self.stop_event = threading.Event()
        self.entries = 0
        self.ledgers: list[int] = []
        self.errors: list[str] = []

    def run(self) -> None:
        try:
            with BookKeeper(self.uri) as bk:
                while not self.stop_event.is_set():
                    lh = bk.create_ledger(3, 3, 2)
                    for i in range(40):
                        lh.add_entry(payload(lh.ledger_id, i))
                        self.entries += 1
                    lh.close()
                    self.ledgers.append(lh.ledger_id)
        except Exception as exc:  # the test reports it
            self.errors.append(repr(exc))


def test_a_killed_bookie_is_re_replicated_without_operator_action(
    cluster5: LocalCluster, daemons: list[Daemon], tmp_path: Path
) -> None:
    uri = cluster5.metadata_uri
    with BookKeeper(uri) as bk:
        set_delay(bk, DELAY_S)
        ledgers = [write_closed(bk, 300) for _ in range(8)]
        for ledger_id in ledgers:
            assert_fully_replicated(bk, ledger_id)
        daemon = Daemon(uri, tmp_path / "ar1", "--http-port", "0")
        daemons.append(daemon)
        writers = [Writer(uri), Writer(uri)]
        for writer in writers:
            writer.start()
        try:
            poll_until(
                lambda: all(w.entries > 100 for w in writers), timeout_s=60, what="writers started"
            )
            index = victim(bk, cluster5, ledgers)
            lost = cluster5.bookies[index].address
            named = {i for i in ledgers if lost in bk.ledger_metadata(i).all_bookies()}
            assert named
            cluster5.kill(index)
            killed_at = time.monotonic()
            # Nothing is touched before the delay has passed.
            holds_for(
                lambda: set(closed_naming(bk, lost)) >= named,
                duration_s=DELAY_S - 0.5,
                what="ledgers left alone during the delay",
            )
            poll_until(
                lambda: not closed_naming(bk, lost),
                timeout_s=DELAY_S + REPAIR_BOUND_S,
                interval_s=0.5,
                what="every closed ledger off the killed bookie",
            )
            healed_s = time.monotonic() - killed_at
            at_heal = [w.entries for w in writers]
            poll_until(
                lambda: all(w.entries > n + 40 for w, n in zip(writers, at_heal, strict=True)),
                timeout_s=60,
                what="writers go on",
            )
        finally:
            for writer in writers:
                writer.stop_event.set()
            for writer in writers:
                writer.join(timeout=60)
        for writer in writers:
            assert not writer.errors, writer.errors
            assert not writer.is_alive()
        poll_until(lambda: not naming(bk, lost), timeout_s=60, interval_s=0.5, what="no ledger")
        poll_until(lambda: not marks(bk), timeout_s=60, interval_s=0.5, what="marks cleared")
        for ledger_id in bk.list_ledgers():
            assert_fully_replicated(bk, ledger_id)
        for ledger_id in ledgers:
            reader = bk.open_ledger(ledger_id)
            data = [e.data for e in reader.read_entries(0, 299)]
            assert data == [payload(ledger_id, i) for i in range(300)]
        # The daemon's /metrics (prometheus-client's parser) count what it did.
        _, metrics = scrape(daemon.admin_port)
        assert metrics["quorumlog_autorecovery_is_auditor"] == 1
        assert metrics["quorumlog_autorecovery_under_replicated_ledgers"] == 0
        assert metrics["quorumlog_autorecovery_ledgers_marked_total"] >= len(named)
        assert metrics["quorumlog_autorecovery_lost_bookies_marked_total"] == 1
        assert metrics["quorumlog_autorecovery_ledgers_repaired_total"] >= len(named)
        assert metrics["quorumlog_autorecovery_copied_fragments_total"] >= len(named)
        assert metrics["quorumlog_autorecovery_copied_entries_total"] >= 300 * len(named)
        # Each copied entry is a blob: its payload of 100 bytes and its header and digest.
        copied_bytes = metrics["quorumlog_autorecovery_copied_bytes_total"]
        assert copied_bytes > 100 * metrics["quorumlog_autorecovery_copied_entries_total"]
        assert metrics["quorumlog_autorecovery_ledger_repair_failures_total"] == 0
        print(f"healed {len(ledgers)} ledgers {healed_s:.1f} s after the kill")


def test_a_worker_killed_mid_copy_is_replaced_and_leaves_nothing_half_done(
    cluster5: LocalCluster, daemons: list[Daemon], tmp_path: Path
) -> None:
    uri = cluster5.metadata_uri
    with BookKeeper(uri) as bk:
        set_delay(bk, 0)
        # About 20 MB a ledger: a copy lasts long enough to be caught in the middle.
        ledgers = [write_closed(bk, 20_000, size=1000) for _ in range(4)]
        for ledger_id in ledgers:
            assert_fully_replicated(bk, ledger_id)
        before = {i: bk.ledger_metadata(i) for i in ledgers}
        index = victim(bk, cluster5, ledgers)
        lost = cluster5.bookies[index].address
        first = Daemon(uri, tmp_path / "ar1", "--no-auditor")
        daemons.append(first)
        # A worker only (no auditor): the test marks the ledgers itself, so that the
        # worker to kill is the only one that can claim them.
        manager = UnderReplicationManager(bk.aio.store)
        cluster5.kill(index)
        for ledger_id in ledgers:
            bk.run(manager.mark(ledger_id, [lost]))

        def claimed() -> bool:
            return any(bk.run(manager.lock_owner(i)) is not None for i in ledgers)

        poll_until(claimed, timeout_s=60, interval_s=0.02, what="a ledger claimed")

        def copy_under_way() -> bool:
            """A ledger still names the lost bookie while a bookie outside its ensemble
            already holds its first entry: copied in part, not swapped yet."""
            for ledger_id in ledgers:
                md = bk.ledger_metadata(ledger_id)
                if lost not in md.all_bookies():
                    continue
                for other in set(cluster5.addresses) - md.all_bookies():
                    if has_entry(bk, other, ledger_id, 0):
                        return True
            return False

        poll_until(copy_under_way, timeout_s=60, interval_s=0.005, what="a copy under way")
        first.kill()
        # Its claim goes with its session; what it swapped is whole, the rest untouched.
        poll_until(
            lambda: not claimed(), timeout_s=30, interval_s=0.2, what="dead worker's claim freed"
        )
        for ledger_id in ledgers:
            md = bk.ledger_metadata(ledger_id)
            assert md.is_closed and md.last_entry_id == before[ledger_id].last_entry_id
            for _, ensemble in md.ensembles:
                assert len(set(ensemble)) == len(ensemble) == 3
            result = bk.run(audit_ledger(bk.aio, ledger_id))  # type: ignore[arg-type]
            # Every copy is in place except the killed bookie's.
            assert {b for _, b in result.missing} <= {lost}, result.summary()
            assert not result.damaged
        assert set(marks(bk)) >= {i for i in ledgers if lost in bk.ledger_metadata(i).all_bookies()}
        daemons.append(Daemon(uri, tmp_path / "ar2"))
        poll_until(
            lambda: not naming(bk, lost), timeout_s=REPAIR_BOUND_S, interval_s=0.5, what="repair"
        )
        poll_until(lambda: not marks(bk), timeout_s=60, interval_s=0.5, what="marks cleared")
        for ledger_id in ledgers:
            assert_fully_replicated(bk, ledger_id)


def test_one_auditor_at_a_time_and_another_takes_over(
    cluster5: LocalCluster, daemons: list[Daemon], tmp_path: Path
) -> None:
    uri = cluster5.metadata_uri
    first = Daemon(uri, tmp_path / "ar1")
    daemons.append(first)

    def auditor() -> str:
        return shell(uri, "whoisauditor", timeout_s=60).stdout.strip()

    poll_until(lambda: auditor() == first.identifier, timeout_s=30, what="first auditor")
    second = Daemon(uri, tmp_path / "ar2")
    daemons.append(second)
    holds_for(lambda: auditor() == first.identifier, duration_s=4, what="first stays auditor")
    with BookKeeper(uri) as bk:
        contenders = bk.run(bk.aio.store.children("/election/autorecovery-auditor"))
        assert len(contenders) >= 2
    first.kill()
    poll_until(lambda: auditor() == second.identifier, timeout_s=30, what="second takes over")
    # The new auditor audits: a bookie killed now is repaired.
    with BookKeeper(uri) as bk:
        set_delay(bk, 0)
        ledgers = [write_closed(bk, 200) for _ in range(3)]
        for ledger_id in ledgers:
            assert_fully_replicated(bk, ledger_id)
        index = victim(bk, cluster5, ledgers)
        lost = cluster5.bookies[index].address
        cluster5.kill(index)
        poll_until(
            lambda: not naming(bk, lost), timeout_s=REPAIR_BOUND_S, interval_s=0.5, what="repair"
        )


def test_decommissioning_a_live_bookie_leaves_no_ledger_naming_it(
    cluster5: LocalCluster, daemons: list[Daemon]
) -> None:
    uri = cluster5.metadata_uri
    with BookKeeper(uri) as bk:
        ledgers = [write_closed(bk, 200) for _ in range(5)]
        index = victim(bk, cluster5, ledgers)
        bookie = cluster5.bookies[index].address
        ensemble = (bookie, *[b.address for b in cluster5.bookies if b.address != bookie][:2])

        async def write_open() -> Any:
            lh = await bk.aio.create_ledger(3, 3, 2, ensemble_bookies=ensemble)
            for i in range(20):
                await lh.append(payload(lh.ledger_id, i))
            return lh

        open_handle = bk.run(write_open())
        for ledger_id in ledgers:
            assert_fully_replicated(bk, ledger_id)
        done = shell(uri, "decommissionbookie", bookie, timeout_s=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "decommissioned" in done.stdout
        cluster5.stop(index)
        assert not naming(bk, bookie)
        assert bk.run(bk.aio.registry.read_cookie(bookie)) is None
        for ledger_id in [*ledgers, open_handle.ledger_id]:
            assert bk.ledger_metadata(ledger_id).is_closed
            assert_fully_replicated(bk, ledger_id)
        data = [e.data for e in bk.open_ledger(open_handle.ledger_id).read_entries(0, 19)]
        assert data == [payload(open_handle.ledger_id, i) for i in range(20)]


def test_shell_autorecovery_commands_and_a_bookie_running_autorecovery(
    metadata_uri: str, tmp_path: Path
) -> None:
    cluster = LocalCluster(
        metadata_uri,
        tmp_path / "cluster",
        4,
        extra_args=[
            "--metadata-session-timeout-ms",
            SESSION_MS,
            "--autorecovery",
            "--autorecovery-session-timeout-ms",
            SESSION_MS,
        ],
        entry_point=BOOKIE_COMMAND,
    )
    with cluster:
        uri = metadata_uri
        assert shell(uri, "lostbookierecoverydelay").stdout.split()[1] == "0"
        assert shell(uri, "lostbookierecoverydelay", "600").returncode == 0
        assert shell(uri, "lostbookierecoverydelay").stdout.split()[1] == "600"
        poll_until(
            lambda: shell(uri, "whoisauditor").stdout.strip() in cluster.addresses,
            timeout_s=30,
            what="a bookie audits",
        )
        status = shell(uri, "autorecovery", "disable")
        assert status.stdout.startswith("autorecovery disabled")
        status = shell(uri, "autorecovery", "status").stdout
        assert "autorecovery disabled" in status and "600 s" in status
        assert shell(uri, "autorecovery", "enable").stdout.startswith("autorecovery enabled")
        with BookKeeper(uri) as bk:
            ledger_id = write_closed(bk, 100)
            assert_fully_replicated(bk, ledger_id)
            assert shell(uri, "listunderreplicated").stdout == ""
            # Not lost long enough (600 s): marked by nobody.
            md = bk.ledger_metadata(ledger_id)
            lost = md.ensembles[0][1][0]
            index = next(b.index for b in cluster.bookies if b.address == lost)
            cluster.kill(index)
            assert shell(uri, "triggeraudit").returncode == 0
            poll_until(
                lambda: "last audit" in shell(uri, "autorecovery", "status").stdout,
                timeout_s=60,
                what="the requested audit ran",
            )
            assert shell(uri, "listunderreplicated").stdout == ""
            assert lost in bk.ledger_metadata(ledger_id).all_bookies()
            # The delay shortened: the bookies' autorecovery repairs it.
            assert shell(uri, "lostbookierecoverydelay", "0").returncode == 0
            poll_until(
                lambda: lost not in bk.ledger_metadata(ledger_id).all_bookies(),
                timeout_s=REPAIR_BOUND_S,
                interval_s=0.5,
                what="repaired by the bookies' autorecovery",
            )
            assert_fully_replicated(bk, ledger_id)


def test_an_idle_open_ledger_is_left_to_its_writer_then_fenced_and_closed(
    cluster5: LocalCluster, daemons: list[Daemon], tmp_path: Path
) -> None:
    uri = cluster5.metadata_uri
    grace_s = 5.0  # the Daemon's --open-ledger-grace-s
    with BookKeeper(uri) as bk:
        set_delay(bk, 0)
        addresses = [b.address for b in cluster5.bookies]

        async def write_open() -> Any:
            lh = await bk.aio.create_ledger(3, 3, 2, ensemble_bookies=tuple(addresses[:3]))
            for i in range(30):
                await lh.append(payload(lh.ledger_id, i))
            return lh

        handle = bk.run(write_open())
        assert_fully_replicated(bk, handle.ledger_id)
        daemons.append(Daemon(uri, tmp_path / "ar1"))
        lost = addresses[0]
        cluster5.kill(0)
        poll_until(
            lambda: handle.ledger_id in marks(bk), timeout_s=30, interval_s=0.2, what="marked"
        )
        marked_at = time.monotonic()
        # The writer keeps its ledger through the grace period (measured from the mark).
        holds_for(
            lambda: not bk.ledger_metadata(handle.ledger_id).is_closed,
            duration_s=grace_s - 1.5,
            what="open ledger left to its writer",
        )
        poll_until(
            lambda: lost not in bk.ledger_metadata(handle.ledger_id).all_bookies(),
            timeout_s=REPAIR_BOUND_S,
            interval_s=0.5,
            what="fenced, closed and repaired after the grace period",
        )
        assert time.monotonic() - marked_at >= grace_s - 1.5
        md = bk.ledger_metadata(handle.ledger_id)
        assert md.is_closed and md.last_entry_id == 29
        assert_fully_replicated(bk, handle.ledger_id)
        # The writer lost its ledger to the fencing: its next add fails.

        async def late() -> int:
            return int(await handle.append(b"late"))

        with pytest.raises(BKError):  # fenced or closed: either way refused
            bk.run(late())


def test_the_periodic_audit_marks_a_damaged_copy_and_a_worker_replaces_it(
    cluster5: LocalCluster, daemons: list[Daemon], tmp_path: Path
) -> None:
    uri = cluster5.metadata_uri
    with BookKeeper(uri) as bk:
        ledger_id = write_closed(bk, 100)
        assert_fully_replicated(bk, ledger_id)
        liar = holders(bk.ledger_metadata(ledger_id), 12)[0]
        assert asyncio.run(plant_forged_entry(liar, ledger_id, 12, b"")) == 0
        result = bk.run(audit_ledger(bk.aio, ledger_id))  # type: ignore[arg-type]
        assert [(e, b) for e, b, _ in result.damaged] == [(12, liar)]
        daemons.append(Daemon(uri, tmp_path / "ar1", "--audit-interval-s", "2"))
        poll_until(
            lambda: liar not in bk.ledger_metadata(ledger_id).all_bookies(),
            timeout_s=REPAIR_BOUND_S,
            interval_s=0.5,
            what="the damaged copy's bookie replaced",
        )
        poll_until(lambda: not marks(bk), timeout_s=60, interval_s=0.5, what="marks cleared")
        assert_fully_replicated(bk, ledger_id)
        data = [e.data for e in bk.open_ledger(ledger_id).read_entries(0, 99)]
        assert data == [payload(ledger_id, i) for i in range(100)]
        assert liar in cluster5.addresses  # a live bookie: no loss was involved


def test_an_auditor_frozen_past_its_session_rejoins_and_can_lead_again(
    cluster5: LocalCluster, daemons: list[Daemon], tmp_path: Path
) -> None:
    uri = cluster5.metadata_uri

    def auditor() -> str:
        return shell(uri, "whoisauditor", timeout_s=60).stdout.strip()

    first = Daemon(uri, tmp_path / "ar1")
    daemons.append(first)
    poll_until(lambda: auditor() == first.identifier, timeout_s=30, what="first auditor")
    second = Daemon(uri, tmp_path / "ar2")
    daemons.append(second)
    os.kill(first.process.pid, signal.SIGSTOP)
    try:
        poll_until(lambda: auditor() == second.identifier, timeout_s=30, what="second leads")
        time.sleep(3)  # well past the frozen one's 2 s sessions
    finally:
        os.kill(first.process.pid, signal.SIGCONT)
    # Its sessions expired while frozen: it starts again with new ones, and queues.
    poll_until(
        lambda: "session lost" in first.err.read_text(),
        timeout_s=30,
        interval_s=0.2,
        what="the frozen process notices its lost session",
    )
    assert first.process.poll() is None
    holds_for(lambda: auditor() == second.identifier, duration_s=3, what="second still leads")
    second.kill()
    poll_until(lambda: auditor() == first.identifier, timeout_s=30, what="first leads again")


@pytest.mark.parametrize("autorecovery", [True, False])
def test_localbookie_runs_autorecovery_unless_told_not_to(
    tmp_path: Path, autorecovery: bool
) -> None:
    data_dir = tmp_path / "local"
    command = [sys.executable, "-m", "quorumlog", "localbookie", "3", "--data-dir", str(data_dir)]
    if not autorecovery:
        command.append("--no-autorecovery")
    out = tmp_path / "stdout"
    with open(out, "wb") as stdout:
        process = subprocess.Popen(
            command,
            stdout=stdout,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
    try:
        poll_until(lambda: "ready" in out.read_text(), timeout_s=90, what="localbookie ready")
        uri = out.read_text().splitlines()[0].split(" ", 1)[1]
        addresses = [line.split()[1] for line in out.read_text().splitlines() if "pid" in line]
        if autorecovery:
            poll_until(
                lambda: shell(uri, "whoisauditor").stdout.strip() in addresses,
                timeout_s=30,
                what="a bookie audits",
            )
        else:
            holds_for(
                lambda: shell(uri, "whoisauditor").returncode == 1,
                duration_s=3,
                what="no auditor",
            )
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=90) == 0
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def test_disabled_autorecovery_marks_and_copies_nothing_until_enabled(
    cluster5: LocalCluster, daemons: list[Daemon], tmp_path: Path
) -> None:
    uri = cluster5.metadata_uri
    with BookKeeper(uri) as bk:
        set_delay(bk, 0)
        ledgers = [write_closed(bk, 100) for _ in range(3)]
        for ledger_id in ledgers:
            assert_fully_replicated(bk, ledger_id)
        daemons.append(Daemon(uri, tmp_path / "ar1"))
        assert shell(uri, "autorecovery", "disable").returncode == 0
        index = victim(bk, cluster5, ledgers)
        lost = cluster5.bookies[index].address
        named = set(naming(bk, lost))
        cluster5.kill(index)
        poll_until(
            lambda: lost not in bk.list_bookies(), timeout_s=30, what="bookie's session gone"
        )
        holds_for(
            lambda: not marks(bk) and set(naming(bk, lost)) == named,
            duration_s=4,
            interval_s=0.2,
            what="nothing marked or copied while disabled",
        )
        assert shell(uri, "autorecovery", "enable").returncode == 0
        poll_until(
            lambda: not naming(bk, lost), timeout_s=REPAIR_BOUND_S, interval_s=0.5, what="repair"
        )


def test_the_autorecovery_admin_api_answers_and_its_metrics_follow_the_marks(
    cluster3: LocalCluster, daemons: list[Daemon], tmp_path: Path
) -> None:
    """``quorumlog autorecovery --http-port``: the admin endpoints without a bookie
    (those of a bookie answer 404 as JSON), bad parameters refused with 400 naming them,
    and ``/metrics`` following the marks in the store, an audit and the repairs."""
    uri = cluster3.metadata_uri
    daemon = Daemon(uri, tmp_path / "ar", "--http-port", "0")
    daemons.append(daemon)
    port = daemon.admin_port
    assert http(port, "/heartbeat")[:2] == (200, {"status": "OK"})
    poll_until(
        lambda: (
            http(port, "/api/v1/autorecovery/who_is_auditor")[:2]
            == (200, {"Auditor": daemon.identifier})
        ),
        timeout_s=30,
        what="the daemon audits",
    )
    with BookKeeper(uri) as bk:
        ledger_id = write_closed(bk, 20)
        status, listed, _ = http(port, "/api/v1/bookie/list_bookies?type=rw")
        assert (status, set(listed)) == (200, set(cluster3.addresses))
        assert http(port, "/api/v1/bookie/list_bookies?type=ro")[:2] == (200, {})
        status, ledgers, _ = http(port, "/api/v1/ledger/list?print_metadata=true")
        assert status == 200 and ledgers[str(ledger_id)]["state"] == "CLOSED"
        status, metadata, _ = http(port, f"/api/v1/ledger/metadata?ledger_id={ledger_id}")
        assert status == 200 and metadata["last_entry_id"] == 19

        # An audit asked for is counted once it ran.
        assert scrape(port)[1]["quorumlog_autorecovery_audit_runs_total"] == 0
        assert shell(uri, "triggeraudit").returncode == 0
        poll_until(
            lambda: scrape(port)[1]["quorumlog_autorecovery_audit_runs_total"] == 1,
            timeout_s=60,
            what="the requested audit counted",
        )

        # Marks made while autorecovery is paused: listed, and in the gauge.
        manager = UnderReplicationManager(bk.aio.store)
        bk.run(manager.set_enabled(False))
        bk.run(manager.mark(4242, ["127.0.0.1:1"]))
        bk.run(manager.mark(17, ["127.0.0.1:2", "127.0.0.1:3"]))
        status, marked, _ = http(port, "/api/v1/autorecovery/list_under_replicated_ledger")
        assert (status, marked) == (200, [17, 4242])
        status, marked, _ = http(
            port, "/api/v1/autorecovery/list_under_replicated_ledger?print_missing_replica=true"
        )
        assert status == 200
        assert marked == {"17": ["127.0.0.1:2", "127.0.0.1:3"], "4242": ["127.0.0.1:1"]}
        text, metrics = scrape(port)
        assert metrics["quorumlog_autorecovery_under_replicated_ledgers"] == 2
        assert "# TYPE quorumlog_autorecovery_copied_bytes_total counter" in text
        assert_dashboard_names_exported("quorumlog_autorecovery_", metrics)
        # Resumed: the worker clears the marks of ledgers that do not exist.
        bk.run(manager.set_enabled(True))
        poll_until(
            lambda: scrape(port)[1]["quorumlog_autorecovery_under_replicated_ledgers"] == 0,
            timeout_s=60,
            what="the marks cleared",
        )
        assert scrape(port)[1]["quorumlog_autorecovery_ledgers_repaired_total"] == 2

    for path, name in [
        ("/api/v1/ledger/metadata", "ledger_id"),
        ("/api/v1/ledger/metadata?ledger_id=x", "ledger_id"),
        ("/api/v1/ledger/list?print_metadata=maybe", "print_metadata"),
        ("/api/v1/bookie/list_bookies?type=xx", "type"),
        ("/api/v1/autorecovery/list_under_replicated_ledger?print_missing_replica=2", "print"),
    ]:
        status, error, ctype = http(port, path)
        assert status == 400, (path, status, error)
        assert ctype.startswith("application/json") and name in error["error"], (path, error)
    status, error, _ = http(port, "/api/v1/ledger/metadata?ledger_id=987654321")
    assert status == 404 and "987654321" in error["error"]
    for path, method in [("/api/v1/bookie/info", "GET"), ("/api/v1/bookie/gc", "PUT")]:
        status, error, _ = http(port, path, method=method, body={} if method == "PUT" else None)
        assert status == 404 and "no bookie" in error["error"], (path, error)
    status, error, _ = http(port, "/heartbeat", method="POST", body={})
    assert status == 405 and "error" in error


def test_h1_ledgers_with_passwords_heal_with_no_password_given(
    cluster5: LocalCluster, daemons: list[Daemon], tmp_path: Path
) -> None:
    """Closed 3/3/2 ledgers, each with its own password (CRC32C and MAC digests), and
    an open one whose writer went idle, all naming one bookie, which is killed for good.
    The daemon is given no password: it takes each ledger's master key from a bookie
    that holds it (checked against the hash the metadata keeps) and heals every ledger,
    the open one after its grace, never logging a wrong password."""
    from quorumlog.proto.entry import DigestType

    uri = cluster5.metadata_uri
    with BookKeeper(uri) as bk:
        set_delay(bk, DELAY_S)
        passwords: dict[int, bytes] = {}
        for n in range(8):
            password = b"secret-%d" % n
            digest = DigestType.MAC if n % 4 == 3 else DigestType.CRC32C
            ledger_id = write_closed(bk, 50, password=password, digest_type=digest)
            passwords[ledger_id] = password

        async def open_and_idle() -> int:
            lh = await bk.aio.create_ledger(3, 3, 2, password=b"open-one")
            await asyncio.gather(*(lh.append(payload(lh.ledger_id, i)) for i in range(20)))
            return lh.ledger_id

        open_id = bk.run(open_and_idle())
        passwords[open_id] = b"open-one"
        index = victim(bk, cluster5, [open_id])
        lost = cluster5.bookies[index].address
        named = {i for i in passwords if lost in bk.ledger_metadata(i).all_bookies()}
        assert open_id in named and len(named) >= 2
        daemon = Daemon(uri, tmp_path / "ar-h1")
        daemons.append(daemon)
        cluster5.kill(index)
        poll_until(
            lambda: not any(lost in bk.ledger_metadata(i).all_bookies() for i in named),
            timeout_s=DELAY_S + REPAIR_BOUND_S,
            interval_s=0.5,
            what="every ledger with a password off the killed bookie",
        )
        poll_until(lambda: not marks(bk), timeout_s=60, interval_s=0.5, what="marks cleared")
        assert bk.ledger_metadata(open_id).is_closed  # fenced and closed after its grace
        for ledger_id, password in passwords.items():
            result = bk.run(audit_ledger(bk.aio, ledger_id, password=password))  # type: ignore[arg-type]
            assert result.healthy, result.summary()
            count = 20 if ledger_id == open_id else 50
            data = [e.data for e in bk.open_ledger(ledger_id, password).read_entries(0, count - 1)]
            assert data == [payload(ledger_id, i) for i in range(count)]
        assert "wrong password" not in daemon.err.read_text() + daemon.out.read_text()


def test_h2_a_ledger_whose_only_copies_are_lost_is_reported_once_and_not_retried(
    cluster5: LocalCluster, daemons: list[Daemon], tmp_path: Path
) -> None:
    """Both bookies of two 2/2/2 ledgers are lost: no copy of their entries is left.
    One has a password the daemon is not given (no bookie is left to give its key:
    lost all the same, not a wrong password retried for ever). The daemon reports
    each once, at ERROR, records them lost and clears their marks, so the
    under-replicated count returns to zero and no work is spent on them again; a 3/3/2
    ledger on the same two bookies and a third heals from that third one. Deleting a
    lost ledger drops its record; bringing back a bookie that held the other drops
    its record too, and it heals from that bookie."""
    uri = cluster5.metadata_uri
    with BookKeeper(uri) as bk:
        set_delay(bk, 1)
        first, second = cluster5.bookies[0].address, cluster5.bookies[1].address
        third = cluster5.bookies[2].address

        async def write(
            shape: tuple[int, int, int], ensemble: tuple[str, ...], password: bytes = b""
        ) -> int:
            lh = await bk.aio.create_ledger(*shape, ensemble_bookies=ensemble, password=password)
            await asyncio.gather(*(lh.append(payload(lh.ledger_id, i)) for i in range(30)))
            await lh.close()
            return lh.ledger_id

        doomed = bk.run(write((2, 2, 2), (first, second)))
        doomed_pw = bk.run(write((2, 2, 2), (first, second), b"kept-secret"))
        healable = bk.run(write((3, 3, 2), (first, second, third)))
        daemon = Daemon(uri, tmp_path / "ar-h2")
        daemons.append(daemon)
        cluster5.kill(0)
        cluster5.kill(1)
        poll_until(
            lambda: not ({first, second} & set(bk.ledger_metadata(healable).all_bookies())),
            timeout_s=DELAY_S + REPAIR_BOUND_S,
            interval_s=0.5,
            what="the ledger with a copy left healed",
        )
        manager = UnderReplicationManager(bk.aio.store)

        def lost_ids() -> list[int]:
            return sorted(x.ledger_id for x in bk.run(manager.lost_ledgers()))

        poll_until(
            lambda: lost_ids() == [doomed, doomed_pw],
            timeout_s=60,
            interval_s=0.5,
            what="the ledgers with no copy left recorded lost",
        )
        poll_until(lambda: not marks(bk), timeout_s=60, interval_s=0.5, what="marks cleared")
        # Several backoffs and bookie checks later: not marked again, not retried, and
        # reported once.
        holds_for(lambda: not marks(bk), duration_s=8, what="no mark comes back", interval_s=0.5)
        for lost in bk.run(manager.lost_ledgers()):
            assert set(lost.bookies) <= {first, second} and "no copy" in lost.reason, lost
        log_text = daemon.err.read_text() + daemon.out.read_text()
        for ledger_id in (doomed, doomed_pw):
            assert log_text.count(f"ledger {ledger_id} is LOST") == 1, log_text[-3000:]
            assert f"ledger {ledger_id}: re-replicated" not in log_text, log_text[-3000:]
            # Never a failure to retry (a wrong password, a key no bookie gave).
            assert f"autorecovery: ledger {ledger_id} (" not in log_text, log_text[-3000:]
        listed = shell(uri, "listunderreplicated", "--lost")
        assert listed.returncode == 0 and f"{doomed}\tLOST on" in listed.stdout, listed
        assert [e.data for e in bk.open_ledger(healable).read_entries(0, 29)] == [
            payload(healable, i) for i in range(30)
        ]
        # Deleting the ledger drops the record at the auditor's next look.
        bk.delete_ledger(doomed)
        poll_until(
            lambda: lost_ids() == [doomed_pw],
            timeout_s=60,
            interval_s=0.5,
            what="the record of a deleted ledger dropped",
        )
        # A bookie that held it comes back: the record goes, and the ledger heals from it
        # (the other bookie is still lost).
        cluster5.restart(0)
        poll_until(
            lambda: (
                not lost_ids()
                and second not in bk.ledger_metadata(doomed_pw).all_bookies()
                and not marks(bk)
            ),
            timeout_s=DELAY_S + REPAIR_BOUND_S + 30,
            interval_s=0.5,
            what="the record dropped and the ledger healed once a bookie came back",
        )
        reopened = bk.open_ledger(doomed_pw, password=b"kept-secret")
        assert [e.data for e in reopened.read_entries(0, 29)] == [
            payload(doomed_pw, i) for i in range(30)
        ]


def copy_under_way(
    bk: BookKeeper, cluster: LocalCluster, ledgers: list[int], lost: str
) -> tuple[int, str] | None:
    """A ledger that still names ``lost`` while a bookie outside its ensembles already
    holds its first entry (copied in part, not swapped yet), and that bookie."""
    for ledger_id in ledgers:
        try:
            md = bk.ledger_metadata(ledger_id)
        except BKError:
            continue  # deleted
        if lost not in md.all_bookies():
            continue
        for other in sorted(set(cluster.addresses) - md.all_bookies()):
            if has_entry(bk, other, ledger_id, 0):
                return ledger_id, other
    return None


def index_of(cluster: LocalCluster, address: str) -> int:
    return next(b.index for b in cluster.bookies if b.address == address)


def daemon_log(daemon: Daemon) -> str:
    return daemon.err.read_text() + daemon.out.read_text()


def test_h2_a_ledger_deleted_mid_repair_is_given_up_once_and_copied_no_more(
    cluster5: LocalCluster, daemons: list[Daemon], tmp_path: Path
) -> None:
    """apache/bookkeeper#3316: a ledger deleted while it is being re-replicated must not
    be re-replicated for ever. A 20 MB ledger with a password is caught mid-copy (its
    replacement holds its first entries, the metadata still names the lost bookie; the
    replacement is held still for the moment of the delete, so the copy cannot finish
    first) and deleted with its password. The worker gives it up as deleted, once; its
    mark goes, nothing is recorded lost, the daemon's copy counters stop, and a second
    ledger on the lost bookie heals."""
    uri = cluster5.metadata_uri
    started = time.monotonic()
    with BookKeeper(uri) as bk:
        set_delay(bk, 0)
        ensemble = tuple(cluster5.addresses[:3])
        lost = ensemble[0]
        password = b"deleted-mid-repair"
        doomed = write_closed(bk, 20_000, size=1000, password=password, ensemble_bookies=ensemble)
        kept = write_closed(bk, 2_000, size=1000, ensemble_bookies=ensemble)
        daemon = Daemon(uri, tmp_path / "ar-del", "--http-port", "0", "--ledgers-in-flight", "1")
        daemons.append(daemon)
        cluster5.kill(0)
        found: list[tuple[int, str]] = []

        def doomed_copied_in_part() -> bool:
            under_way = copy_under_way(bk, cluster5, [doomed], lost)
            if under_way is not None:
                found.append(under_way)
            return under_way is not None

        poll_until(doomed_copied_in_part, timeout_s=60, interval_s=0.005, what="a copy under way")
        target = index_of(cluster5, found[0][1])
        cluster5.pause(target)
        try:
            assert lost in bk.ledger_metadata(doomed).all_bookies()  # not swapped yet
            bk.delete_ledger(doomed, password)
        finally:
            cluster5.resume(target)
        deleted_at = time.monotonic()
        poll_until(lambda: not marks(bk), timeout_s=REPAIR_BOUND_S, interval_s=0.5, what="marks")
        poll_until(
            lambda: not naming(bk, lost), timeout_s=REPAIR_BOUND_S, interval_s=0.5, what="healed"
        )
        settled_s = time.monotonic() - deleted_at
        assert doomed not in bk.list_ledgers()

        def copied() -> tuple[float, float, float]:
            metrics = scrape(daemon.admin_port)[1]
            return (
                metrics["quorumlog_autorecovery_copied_entries_total"],
                metrics["quorumlog_autorecovery_copied_bytes_total"],
                metrics["quorumlog_autorecovery_copied_fragments_total"],
            )

        counted = copied()
        # Past several backoffs (1 s) and worker polls (5 s): no mark, no copying.
        holds_for(
            lambda: not marks(bk) and copied() == counted,
            duration_s=7,
            interval_s=0.5,
            what="nothing copied any more",
        )
        manager = UnderReplicationManager(bk.aio.store)
        assert not bk.run(manager.lost_ledgers())
        text = daemon_log(daemon)
        assert text.count(f"ledger {doomed}: deleted while being repaired") == 1, text[-3000:]
        assert f"ledger {doomed}: re-replicated" not in text
        assert f"ledger {doomed} is LOST" not in text
        assert_fully_replicated(bk, kept)
        data = [e.data for e in bk.open_ledger(kept).read_entries(0, 1999)]
        assert data == [payload(kept, i, 1000) for i in range(2000)]
        # What reached the replacement is a spare copy of a ledger that no longer
        # exists: its garbage collection drops it (restarted with a short interval; a
        # long delay, so that the restart is not taken for a loss).
        set_delay(bk, 600)
        assert has_entry(bk, found[0][1], doomed, 0)
        cluster5.restart(target, extra_args=["--gc-interval-ms", "500"])
        poll_until(
            lambda: not has_entry(bk, found[0][1], doomed, 0),
            timeout_s=30,
            interval_s=0.5,
            what="the spare copy dropped by the replacement's garbage collection",
        )
    print(
        f"deleted mid-copy: settled {settled_s:.1f} s after the delete; "
        f"test {time.monotonic() - started:.1f} s"
    )


def test_h2_a_bookie_back_mid_copy_leaves_every_ledger_whole(
    cluster5: LocalCluster, daemons: list[Daemon], tmp_path: Path
) -> None:
    """apache/bookkeeper#2766: the lost bookie comes back (same address, same data)
    while its ledgers are being copied off it. Three 10 MB ledgers on it, repaired one
    at a time: as soon as a copy is under way its replacement is held still (SIGSTOP,
    well within its session) while the lost bookie restarts, so the bookie is back in
    the middle of that copy, with the other ledgers not yet done. Every repair
    finishes (a copy is whole before its compare-and-set) or the ledger keeps the
    bookie: either way the marks return to zero, no lock is left, nothing is marked
    again, and every ledger is fully replicated and reads back."""
    uri = cluster5.metadata_uri
    started = time.monotonic()
    count = 10_000
    with BookKeeper(uri) as bk:
        set_delay(bk, 0)
        ensemble = tuple(cluster5.addresses[:3])
        lost = ensemble[0]
        ledgers = [write_closed(bk, count, size=1000, ensemble_bookies=ensemble) for _ in range(3)]
        daemons.append(Daemon(uri, tmp_path / "ar-back", "--ledgers-in-flight", "1"))
        cluster5.kill(0)
        found: list[tuple[int, str]] = []

        def under_way() -> bool:
            copying = copy_under_way(bk, cluster5, ledgers, lost)
            if copying is not None:
                found.append(copying)
            return copying is not None

        poll_until(under_way, timeout_s=60, interval_s=0.005, what="a copy under way")
        copying, target = found[0]
        cluster5.pause(index_of(cluster5, target))
        try:
            cluster5.restart(0)
            back_at = time.monotonic()
            # Back mid-copy: that ledger (and any not done yet) still names it.
            still = naming(bk, lost)
        finally:
            cluster5.resume(index_of(cluster5, target))
        assert copying in still
        poll_until(lambda: lost in bk.list_bookies(), timeout_s=30, what="registered again")
        poll_until(lambda: not marks(bk), timeout_s=REPAIR_BOUND_S, interval_s=0.5, what="marks")
        settled_s = time.monotonic() - back_at
        manager = UnderReplicationManager(bk.aio.store)
        assert all(bk.run(manager.lock_owner(i)) is None for i in ledgers)
        # The auditor sees the bookie available: nothing is marked again.
        holds_for(lambda: not marks(bk), duration_s=3, interval_s=0.5, what="no new marks")
        for ledger_id in ledgers:
            md = bk.ledger_metadata(ledger_id)
            assert md.is_closed and md.last_entry_id == count - 1
            for _, bookies in md.ensembles:
                assert len(set(bookies)) == 3
            assert_fully_replicated(bk, ledger_id)
            reader = bk.open_ledger(ledger_id)
            data = [e.data for e in reader.read_entries(0, count - 1)]
            assert data == [payload(ledger_id, i, 1000) for i in range(count)]
        moved = [i for i in ledgers if lost not in bk.ledger_metadata(i).all_bookies()]
    print(
        f"bookie back with {len(still)} of {len(ledgers)} ledgers still naming it; "
        f"{len(moved)} moved off it; marks cleared {settled_s:.1f} s after its return; "
        f"test {time.monotonic() - started:.1f} s"
    )


def expire_sqlite_sessions_of(uri: str, pid: int) -> int:
    """End every session of process ``pid`` in an embedded store as the store itself does
    once a session is past its expiry (the next heartbeat of another process): the
    session row and its ephemeral nodes go, with their change events. How many went."""
    from quorumlog.meta.sqlite_store import _delete_session, _Txn, db_path_from_uri

    conn = sqlite3.connect(db_path_from_uri(uri), isolation_level=None, timeout=10)
    try:
        with _Txn(conn):
            ids = [i for (i,) in conn.execute("SELECT id FROM sessions WHERE pid = ?", (pid,))]
            for session_id in ids:
                _delete_session(conn, session_id)
    finally:
        conn.close()
    return len(ids)


def test_h2_a_metadata_session_lost_mid_repair_does_not_stop_the_repair(
    cluster5: LocalCluster, daemons: list[Daemon], tmp_path: Path
) -> None:
    """apache/bookkeeper#2471: the replication worker's metadata session is lost while
    it copies. On ZooKeeper the daemon reaches the store through a link that is cut
    mid-copy (bookies and the test are not cut) until ZooKeeper expires its sessions,
    then healed. On the embedded store, which has no server to cut, the daemon's
    sessions are ended mid-copy as the store ends one past its expiry. The store drops
    the dead session's lock, the daemon notices and starts again with a new session,
    and the repair completes: no ledger names the lost bookie, the marks return to
    zero, no lock is left, every ledger is whole."""
    uri = cluster5.metadata_uri
    started = time.monotonic()
    count = 20_000
    link: CuttableLink | None = None
    daemon_uri = uri
    if uri.startswith("zk://"):
        server, chroot = uri[len("zk://") :].split("/", 1)
        host, port = server.rsplit(":", 1)
        link = CuttableLink(host, int(port))
        daemon_uri = f"zk://127.0.0.1:{link.port}/{chroot}"
    try:
        with BookKeeper(uri) as bk:
            set_delay(bk, 0)
            ensemble = tuple(cluster5.addresses[:3])
            lost = ensemble[0]
            ledgers = [
                write_closed(bk, count, size=1000, ensemble_bookies=ensemble) for _ in range(4)
            ]
            daemon = Daemon(daemon_uri, tmp_path / "ar-blip", "--ledgers-in-flight", "1")
            daemons.append(daemon)
            manager = UnderReplicationManager(bk.aio.store)
            cluster5.kill(0)
            held: list[int] = []

            def copying_under_lock() -> bool:
                under_way = copy_under_way(bk, cluster5, ledgers, lost)
                if under_way is None:
                    return False
                if bk.run(manager.lock_owner(under_way[0])) != daemon.identifier:
                    return False
                held.append(under_way[0])
                return True

            poll_until(copying_under_lock, timeout_s=60, interval_s=0.005, what="a copy under way")
            blip_at = time.monotonic()
            if link is not None:
                link.cut()
            else:
                assert expire_sqlite_sessions_of(uri, daemon.process.pid) >= 1
            try:
                assert naming(bk, lost), "every ledger was repaired before the blip"
                # The dead session's lock is dropped by the store, not kept.
                poll_until(
                    lambda: bk.run(manager.lock_owner(held[0])) is None,
                    timeout_s=30,
                    interval_s=0.1,
                    what="the dead session's lock dropped",
                )
            finally:
                if link is not None:
                    link.heal()
            poll_until(
                lambda: "session lost" in daemon.err.read_text(),
                timeout_s=30,
                interval_s=0.2,
                what="the daemon notices its lost session",
            )
            poll_until(
                lambda: not naming(bk, lost),
                timeout_s=REPAIR_BOUND_S,
                interval_s=0.5,
                what="repaired after the blip",
            )
            poll_until(lambda: not marks(bk), timeout_s=60, interval_s=0.5, what="marks")
            repaired_s = time.monotonic() - blip_at
            assert all(bk.run(manager.lock_owner(i)) is None for i in ledgers)
            assert daemon.process.poll() is None
            for ledger_id in ledgers:
                md = bk.ledger_metadata(ledger_id)
                assert md.is_closed and md.last_entry_id == count - 1
                for _, bookies in md.ensembles:
                    assert len(set(bookies)) == 3
                assert_fully_replicated(bk, ledger_id)
                data = [e.data for e in bk.open_ledger(ledger_id).read_entries(0, 999)]
                assert data == [payload(ledger_id, i, 1000) for i in range(1000)]
    finally:
        if link is not None:
            link.close()
    print(
        f"session lost mid-copy: repaired {repaired_s:.1f} s after the blip; "
        f"test {time.monotonic() - started:.1f} s"
    )


def test_h3_the_copy_rate_bound_paces_a_repair_and_is_counted(
    cluster5: LocalCluster, daemons: list[Daemon], tmp_path: Path
) -> None:
    """``--replication-rate-bytes-per-s``: a worker copies no faster than its bound
    (the repair takes at least the copied bytes over the rate, less the burst), says
    how long it waited, and heals everything all the same."""
    uri = cluster5.metadata_uri
    rate = 200_000
    with BookKeeper(uri) as bk:
        set_delay(bk, 0)
        ledgers = [write_closed(bk, 300, size=1000) for _ in range(4)]
        daemon = Daemon(
            uri,
            tmp_path / "ar",
            "--http-port",
            "0",
            "--replication-rate-bytes-per-s",
            str(rate),
        )
        daemons.append(daemon)
        # Four ledgers of 3 bookies out of 5: some bookie holds at least three. A bookie
        # holding one only would lose no more than the first copy, which passes in the
        # burst: its mark could come and go between two polls.
        index = most_named(bk, cluster5, ledgers)
        lost = cluster5.bookies[index].address
        named = [i for i in ledgers if lost in bk.ledger_metadata(i).all_bookies()]
        assert len(named) >= 3, named
        cluster5.kill(index)
        poll_until(lambda: bool(marks(bk)), timeout_s=60, interval_s=0.2, what="marked")
        marked_at = time.monotonic()
        poll_until(
            lambda: not naming(bk, lost) and not marks(bk),
            timeout_s=REPAIR_BOUND_S,
            interval_s=0.2,
            what="every ledger off the killed bookie",
        )
        repair_s = time.monotonic() - marked_at
        for ledger_id in ledgers:
            assert_fully_replicated(bk, ledger_id)
            reader = bk.open_ledger(ledger_id)
            data = [e.data for e in reader.read_entries(0, 299)]
            assert data == [payload(ledger_id, i, 1000) for i in range(300)]
        _, metrics = scrape(daemon.admin_port)
        copied = metrics["quorumlog_autorecovery_copied_bytes_total"]
        assert copied >= 300 * 1000 * len(named)
        # Each chunk is paid for before it is written, so the last one (at most a
        # ledger's bytes here) is written without waiting after it, and the first ones
        # pass in the burst (50 ms of the rate); the mark is seen up to a poll late.
        paced_s = (copied - copied / len(named) - rate * 0.05) / rate - 0.3
        assert repair_s >= paced_s, (repair_s, paced_s, copied)
        assert metrics["quorumlog_autorecovery_copy_throttled_seconds_total"] >= paced_s * 0.8
        print(f"copied {copied} bytes at {rate} B/s in {repair_s:.1f} s (paced {paced_s:.1f} s)")
