"""Re-replication of a lost bookie's data (quorumlog.replication) against real bookie
processes, on both metadata drivers.

The lost bookie is killed with SIGKILL and never restarted. Before it dies, each test
waits until an audit finds every ledger healthy: with Qa < Qw the last copies of an
entry may still be on their way when the add is confirmed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from typing import Any

import pytest
from support import holders, plant_copy, poll_until, shell

from quorumlog import BookKeeper
from quorumlog.aio import LedgerHandle as AioLedgerHandle
from quorumlog.client.config import ClientConfig
from quorumlog.errors import BKError, Status
from quorumlog.proto.codec import ReadLacRequest, ReadRequest, ReadResponse
from quorumlog.proto.entry import DigestType
from quorumlog.replication import (
    FragmentStatus,
    LedgerAudit,
    LedgerOutcome,
    LedgerReplication,
    RecoveryReport,
    audit_ledger,
    recover_bookie,
    replicate_ledger,
)
from quorumlog.server.local_cluster import LocalCluster


def payload(ledger_id: int, i: int) -> bytes:
    return b"rerep-%d-%06d-" % (ledger_id, i) + bytes([i % 251]) * (20 + i % 40)


def recover(bk: BookKeeper, bookie: str, **options: Any) -> RecoveryReport:
    return bk.run(recover_bookie(bk.aio, bookie, **options))  # type: ignore[arg-type]


def audit(bk: BookKeeper, ledger_id: int, password: bytes = b"") -> LedgerAudit:
    return bk.run(audit_ledger(bk.aio, ledger_id, password=password))  # type: ignore[arg-type]


def wait_healthy(bk: BookKeeper, ledger_id: int, password: bytes = b"") -> None:
    """Every copy is on its whole write set (Qa < Qw: the last ones may lag the ack)."""
    deadline = time.monotonic() + 15
    result = audit(bk, ledger_id, password)
    while not result.healthy and time.monotonic() < deadline:
        time.sleep(0.05)
        result = audit(bk, ledger_id, password)
    assert result.healthy, result.summary()


def create(
    bk: BookKeeper, shape: tuple[int, int, int], ensemble: tuple[str, ...], **kw: Any
) -> AioLedgerHandle:
    """A ledger on the given bookies (placement through the asyncio client)."""
    return bk.run(bk.aio.create_ledger(*shape, ensemble_bookies=ensemble, **kw))


def add(bk: BookKeeper, lh: AioLedgerHandle, first: int, last: int) -> None:
    """Entries first..last, pipelined, each confirmed."""

    async def go() -> list[int]:
        return list(
            await asyncio.gather(
                *(lh.append(payload(lh.ledger_id, i)) for i in range(first, last + 1))
            )
        )

    assert bk.run(go()) == list(range(first, last + 1))


def write_closed(
    bk: BookKeeper, shape: tuple[int, int, int], ensemble: tuple[str, ...], count: int, **kw: Any
) -> int:
    lh = create(bk, shape, ensemble, **kw)
    add(bk, lh, 0, count - 1)
    bk.run(lh.close())
    return lh.ledger_id


def raw_blob(bk: BookKeeper, bookie: str, ledger_id: int, entry_id: int) -> bytes | None:
    """The blob ``bookie`` stores for the entry, exactly as stored (None if absent)."""

    async def read() -> Any:
        return await bk.aio.pool.request(bookie, ReadRequest(0, ledger_id, entry_id, 1), 5_000)

    answer = bk.run(read())
    assert isinstance(answer, ReadResponse)
    return answer.entries[0] if answer.status == Status.OK and answer.entries else None


def knows_ledger(bk: BookKeeper, bookie: str, ledger_id: int) -> bool:
    async def read_lac() -> Any:
        return await bk.aio.pool.request(bookie, ReadLacRequest(0, ledger_id), 5_000)

    return bk.run(read_lac()).status == Status.OK


def assert_recovered(
    bk: BookKeeper, ledger_id: int, lost: str, count: int, password: bytes = b""
) -> None:
    """Nothing names the lost bookie; every replica is in place, intact; every entry
    reads back; every copy of an entry is the same blob."""
    md = bk.ledger_metadata(ledger_id)
    assert md.is_closed and md.last_entry_id == count - 1
    assert lost not in md.all_bookies()
    result = audit(bk, ledger_id, password)
    assert result.healthy, result.summary()
    assert result.entries_checked == count
    assert lost not in result.unreachable_bookies
    entries = bk.open_ledger(ledger_id, password).read_entries(0, count - 1) if count else []
    assert [e.data for e in entries] == [payload(ledger_id, i) for i in range(count)]
    for entry_id in range(count):
        blobs = {raw_blob(bk, b, ledger_id, entry_id) for b in holders(md, entry_id)}
        assert len(blobs) == 1 and None not in blobs, f"entry {entry_id}"


def all_metadata(bk: BookKeeper) -> dict[int, bytes]:
    return {lid: bk.ledger_metadata(lid).to_bytes() for lid in bk.list_ledgers()}


def index_of(cluster: LocalCluster, address: str) -> int:
    return next(b.index for b in cluster.bookies if b.address == address)


# ---------------------------------------------------------------- closed ledgers


def test_recover_bookie_moves_every_fragment_off_a_killed_bookie(cluster4):
    a, b, c, d = (bookie.address for bookie in cluster4.bookies)
    lost = a
    # Adds wait out c and a being paused below (their requests are answered on SIGCONT).
    patient = ClientConfig(add_timeout_ms=120_000)
    with BookKeeper(cluster4.metadata_uri, config=patient) as bk:
        plain = write_closed(bk, (3, 3, 2), (a, b, c), 300)
        striped = write_closed(bk, (4, 3, 2), (b, a, d, c), 203)  # a at index 1
        empty = write_closed(bk, (3, 3, 2), (c, a, b), 0)
        untouched = write_closed(bk, (3, 3, 2), (b, c, d), 20)
        # Two fragments that both name the lost bookie: b stops mid-way and the
        # writer replaces it (R5) with d. MAC digest, with a password (R10). Qa < Qw:
        # entries two bookies confirm while the writer's ensemble change is in flight
        # still reach the replacement (the writer holds confirmations during a change),
        # so the audit below finds the new fragment whole. c and a are paused until
        # the writer has replaced b: entries they confirmed before the writer learnt of
        # b's refused connection would stay in the first fragment (R5 starts the new
        # one at LAC + 1), missing on the stopped b; a loaded run saw that.
        lh = create(bk, (3, 3, 2), (c, a, b), digest_type=DigestType.MAC, password=b"pw")
        two = lh.ledger_id
        add(bk, lh, 0, 60)
        cluster4.stop(index_of(cluster4, b))
        paused = [index_of(cluster4, bookie) for bookie in (c, a)]
        with concurrent.futures.ThreadPoolExecutor(1) as adder:
            for index in paused:
                cluster4.pause(index)
            try:
                adding = adder.submit(add, bk, lh, 61, 130)
                poll_until(
                    lambda: len(bk.ledger_metadata(two).ensembles) == 2,
                    timeout_s=60,
                    what="the writer replaces the stopped bookie",
                )
            finally:
                for index in paused:
                    cluster4.resume(index)
            adding.result(timeout=120)
        bk.run(lh.close())
        cluster4.restart(index_of(cluster4, b))
        md_two = bk.ledger_metadata(two)
        assert len(md_two.ensembles) == 2
        assert md_two.ensembles[1][1] == (c, a, d)
        split = md_two.ensembles[1][0]
        assert split == 61  # LAC + 1 when the writer saw b fail: nothing after 60 was confirmed
        counts = {plain: 300, striped: 203, empty: 0, untouched: 20, two: 131}
        passwords = {two: b"pw"}
        for ledger_id in counts:
            wait_healthy(bk, ledger_id, passwords.get(ledger_id, b""))

        cluster4.kill(index_of(cluster4, lost))  # for good
        before = all_metadata(bk)

        # A dry run changes nothing and shows the plan; the striped ledger has no
        # bookie outside its ensemble to take the lost one's place.
        plan = recover(bk, lost, dry_run=True, passwords=passwords)
        assert all_metadata(bk) == before
        assert not knows_ledger(bk, d, plain)
        assert [r.ledger_id for r in plan.ledgers] == sorted([plain, striped, empty, two])
        assert plan.ledgers_scanned == 5 and plan.exit_status == 1
        rows = {r.ledger_id: r for r in plan.ledgers}
        assert all(r.outcome is LedgerOutcome.PLANNED for r in plan.ledgers)
        [fragment] = rows[plain].fragments
        assert (fragment.status, fragment.replacement, fragment.entries) == (
            FragmentStatus.PLANNED,
            d,
            300,
        )
        [striped_plan] = rows[striped].fragments
        assert striped_plan.replacement is None and "no writable bookie" in striped_plan.error
        assert striped_plan.entries == sum(1 for e in range(203) if (1 - e) % 4 < 3)
        assert [f.entries for f in rows[two].fragments] == [split, 131 - split]
        assert plan.entries_copied == 0

        # First run: everything but the striped ledger.
        first = recover(bk, lost, passwords=passwords)
        rows = {r.ledger_id: r for r in first.ledgers}
        assert rows[striped].outcome is LedgerOutcome.FAILED
        assert "no writable bookie outside the ensemble" in rows[striped].summary()
        assert rows[striped].references_bookie
        for ledger_id in (plain, empty, two):
            assert rows[ledger_id].outcome is LedgerOutcome.REPLICATED, rows[ledger_id].summary()
            assert not rows[ledger_id].references_bookie
        assert [(f.status, f.replacement, f.entries_copied) for f in rows[plain].fragments] == [
            (FragmentStatus.COPIED, d, 300)
        ]
        assert [(f.first_entry_id, f.replacement) for f in rows[two].fragments] == [
            (0, d),  # outside (c, a, b)
            (split, b),  # outside (c, a, d)
        ]
        assert [f.entries_copied for f in rows[two].fragments] == [split, 131 - split]
        assert rows[empty].fragments[0].entries_copied == 0
        assert first.exit_status == 1 and not first.complete
        assert first.still_referencing == [rows[striped]]
        assert bk.ledger_metadata(untouched).to_bytes() == before[untouched]
        md_two = bk.ledger_metadata(two)
        assert [e for _, e in md_two.ensembles] == [(c, d, b), (c, b, d)]
        assert md_two.is_closed and md_two.last_entry_id == 130  # the close is kept

        # A new bookie joins; the second run takes the striped ledger.
        new = cluster4.bookies[cluster4.start_new_bookie()].address
        second = recover(bk, lost, passwords=passwords)
        assert [r.ledger_id for r in second.ledgers] == [striped]
        [row] = second.ledgers
        assert row.outcome is LedgerOutcome.REPLICATED and row.fragments[0].replacement == new
        assert row.entries_copied == striped_plan.entries
        assert second.complete and second.exit_status == 0
        after = all_metadata(bk)

        for ledger_id, count in counts.items():
            assert_recovered(bk, ledger_id, lost, count, passwords.get(ledger_id, b""))

        # Nothing names the bookie any more: a third run is a no-op.
        third = recover(bk, lost, passwords=passwords)
        assert third.ledgers == [] and third.ledgers_scanned == 5
        assert third.complete and third.exit_status == 0 and third.entries_copied == 0
        assert all_metadata(bk) == after
        json.dumps(first.to_dict())
        json.dumps(plan.to_dict())


# ---------------------------------------------------------------- open ledgers


def test_r5_open_ledger_keeps_its_last_fragment_and_the_writer_carries_on(cluster4):
    a, b, c, d = (bookie.address for bookie in cluster4.bookies)
    lost = a
    with BookKeeper(cluster4.metadata_uri) as bk:
        # Adds after the kill are confirmed only once the writer's ensemble change is
        # done, and reach the replacement (see the two-fragment ledger of the first test).
        lh = create(bk, (3, 3, 2), (a, b, c))
        ledger_id = lh.ledger_id
        add(bk, lh, 0, 29)
        idle = create(bk, (3, 3, 2), (b, a, c))
        add(bk, idle, 0, 9)
        for handle in (lh, idle):
            wait_healthy(bk, handle.ledger_id)
        cluster4.kill(index_of(cluster4, lost))
        before = all_metadata(bk)

        # The lost bookie is in the last fragment only: that is the writer's business.
        report = recover(bk, lost)
        rows = {r.ledger_id: r for r in report.ledgers}
        assert set(rows) == {ledger_id, idle.ledger_id}
        for row in rows.values():
            assert row.outcome is LedgerOutcome.OPEN and row.references_bookie
            [fragment] = row.fragments
            assert fragment.status is FragmentStatus.LEFT_TO_WRITER
            assert fragment.last_entry_id is None
        assert report.exit_status == 2 and report.failed == []
        assert all_metadata(bk) == before
        skipped = recover(bk, lost, skip_open_ledgers=True)
        assert {r.outcome for r in skipped.ledgers} == {LedgerOutcome.SKIPPED_OPEN}
        assert skipped.exit_status == 2 and all_metadata(bk) == before

        # The writer notices, replaces the bookie (R5); the earlier fragment is then
        # recovered while the writer carries on.
        add(bk, lh, 30, 59)
        md = bk.ledger_metadata(ledger_id)
        assert len(md.ensembles) == 2 and md.ensembles[1][1] == (d, b, c)
        split = md.ensembles[1][0]
        report = recover(bk, lost, ledger_ids=[ledger_id])
        [row] = report.ledgers
        assert row.outcome is LedgerOutcome.REPLICATED, row.summary()
        assert [(f.status, f.replacement, f.entries_copied) for f in row.fragments] == [
            (FragmentStatus.COPIED, d, split)
        ]
        assert row.state == "OPEN" and not row.references_bookie
        assert report.exit_status == 0

        add(bk, lh, 60, 89)
        bk.run(lh.close())  # R6: its compare-and-set conflicts once, re-reads and keeps our change
        md = bk.ledger_metadata(ledger_id)
        assert md.is_closed and md.last_entry_id == 89
        assert [e for _, e in md.ensembles] == [(d, b, c), (d, b, c)]
        wait_healthy(bk, ledger_id)
        assert_recovered(bk, ledger_id, lost, 90)

        # BookKeeper's way for a ledger whose last fragment names the bookie: recover
        # and close it (fencing its writer, R7), then copy it whole.
        report = recover(bk, lost, close_open_ledgers=True)
        [row] = report.ledgers
        assert row.ledger_id == idle.ledger_id
        assert row.outcome is LedgerOutcome.REPLICATED and row.state == "CLOSED"
        assert [(f.status, f.replacement, f.entries_copied) for f in row.fragments] == [
            (FragmentStatus.COPIED, d, 10)
        ]
        assert report.complete and report.exit_status == 0
        assert_recovered(bk, idle.ledger_id, lost, 10)
        with pytest.raises(BKError):
            bk.run(idle.add_entry(b"after the recovery closed it"))


# ---------------------------------------------------------------- damaged copies, races


def damage(bk: BookKeeper, bookie: str, ledger_id: int, entry_id: int, password: bytes) -> bytes:
    """Replace ``bookie``'s copy with one that fails the entry digest (R9); returns the
    original blob."""
    original = raw_blob(bk, bookie, ledger_id, entry_id)
    assert original is not None
    forged = original[:-1] + bytes([original[-1] ^ 0x5A])
    assert asyncio.run(plant_copy(bookie, ledger_id, forged, password)) == Status.OK
    assert raw_blob(bk, bookie, ledger_id, entry_id) == forged
    return original


def test_r9_damaged_copies_are_skipped_and_no_intact_copy_fails_the_ledger(cluster4):
    a, b, c, d = (bookie.address for bookie in cluster4.bookies)
    lost = a
    with BookKeeper(cluster4.metadata_uri) as bk:
        good = write_closed(bk, (3, 3, 2), (a, b, c), 60, password=b"pw")
        bad = write_closed(bk, (3, 3, 2), (b, c, a), 20)
        raced = write_closed(bk, (3, 3, 2), (c, a, b), 100)
        for ledger_id, password in ((good, b"pw"), (bad, b""), (raced, b"")):
            wait_healthy(bk, ledger_id, password)
        originals = {
            12: damage(bk, b, good, 12, b"pw"),
            40: damage(bk, c, good, 40, b"pw"),
        }
        damage(bk, b, bad, 5, b"")
        damage(bk, c, bad, 5, b"")  # no intact copy of entry 5 is left
        cluster4.kill(index_of(cluster4, lost))
        bad_before = bk.ledger_metadata(bad).to_bytes()

        report = recover(bk, lost, ledger_ids=[good, bad, 987654], passwords={good: b"pw"})
        rows = {r.ledger_id: r for r in report.ledgers}
        assert rows[987654].outcome is LedgerOutcome.DELETED  # no such ledger: nothing to do
        assert not rows[987654].references_bookie
        row = rows[good]
        assert row.outcome is LedgerOutcome.REPLICATED, row.summary()
        [fragment] = row.fragments
        assert fragment.replacement == d and fragment.entries_copied == 60
        # Whichever replica served a read, one planted copy was met and skipped.
        skipped = fragment.damaged_copies_skipped
        assert skipped and {(e, who) for e, who, _ in skipped} <= {(12, b), (40, c)}
        assert {reason for *_, reason in skipped} == {"digest mismatch (CRC32C)"}
        for entry_id, original in originals.items():
            assert raw_blob(bk, d, good, entry_id) == original  # the intact blob, unchanged
        entries = bk.open_ledger(good, b"pw").read_entries(0, 59)
        assert [e.data for e in entries] == [payload(good, i) for i in range(60)]
        after = audit(bk, good, b"pw")
        assert {(e, who) for e, who, _ in after.damaged} == {(12, b), (40, c)}  # left as found
        assert after.missing == [] and after.unreachable_bookies == []

        row = rows[bad]
        assert row.outcome is LedgerOutcome.FAILED and row.references_bookie
        [fragment] = row.fragments
        assert fragment.status is FragmentStatus.FAILED
        assert f"ledger {bad} entry 5: no intact copy" in fragment.error
        assert bk.ledger_metadata(bad).to_bytes() == bad_before  # nothing swapped
        assert report.exit_status == 1 and report.failed == [row]

        # Two recoveries of one ledger at once: the compare-and-set lets one swap, the
        # other finds the bookie replaced and says so.
        async def twice() -> list[LedgerReplication]:
            return list(
                await asyncio.gather(
                    replicate_ledger(bk.aio, raced, lost), replicate_ledger(bk.aio, raced, lost)
                )
            )

        results = bk.run(twice())
        assert all(
            r.outcome in (LedgerOutcome.REPLICATED, LedgerOutcome.UNAFFECTED) for r in results
        )
        statuses = sorted(f.status.value for r in results for f in r.fragments)
        assert statuses.count(FragmentStatus.COPIED.value) == 1
        assert set(statuses) <= {"copied", "replaced-concurrently"}
        assert {f.replacement for r in results for f in r.fragments} == {d}
        assert [e for _, e in bk.ledger_metadata(raced).ensembles] == [(c, d, b)]
        assert_recovered(bk, raced, lost, 100)


# ---------------------------------------------------------------- the shell command


@pytest.mark.parametrize("metadata_uri", ["sqlite"], indirect=True)
def test_shell_recoverbookie_prints_each_ledger_and_exits_0_when_done(cluster4):
    uri = cluster4.metadata_uri
    a, b, c, d = (bookie.address for bookie in cluster4.bookies)
    with BookKeeper(uri) as bk:
        first = write_closed(bk, (3, 3, 2), (a, b, c), 50)
        second = write_closed(bk, (3, 3, 2), (b, a, c), 70)
        for ledger_id in (first, second):
            wait_healthy(bk, ledger_id)
        cluster4.kill(index_of(cluster4, a))
        before = all_metadata(bk)

        plan = shell(uri, "recoverbookie", a, "--dry-run")
        assert plan.returncode == 0, plan.stdout + plan.stderr
        assert f"ledger {first} (CLOSED): planned" in plan.stdout
        assert f"-> {d}: would copy 50 entries" in plan.stdout
        assert "dry run: nothing was copied" in plan.stdout
        assert all_metadata(bk) == before

        only = shell(uri, "recoverbookie", a, "--ledger", str(first))
        assert only.returncode == 0, only.stdout + only.stderr
        assert f"ledger {first} (CLOSED): replicated, 50 entries copied" in only.stdout
        assert f"-> {d}: copied 50 entries" in only.stdout
        # Only the ledger asked for was looked at: not "no ledger references" the bookie.
        assert f"no ledger references {a}" not in only.stdout
        assert f"none of the ledger(s) asked for references {a} any more" in only.stdout
        assert bk.ledger_metadata(second).to_bytes() == before[second]

        done = shell(uri, "recoverbookie", a, "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        row = json.loads(done.stdout)
        assert row["complete"] and row["exit_status"] == 0
        assert [r["ledger_id"] for r in row["ledgers"]] == [second]
        assert row["ledgers"][0]["fragments"][0]["entries_copied"] == 70
        assert row["entries_copied"] == 70 and row["ledgers_still_referencing"] == []
        for ledger_id, count in ((first, 50), (second, 70)):
            assert_recovered(bk, ledger_id, a, count)

        again = shell(uri, "recoverbookie", a)
        assert again.returncode == 0 and "0 ledger(s) affected of 2 scanned" in again.stdout
        assert f"no ledger references {a} any more" in again.stdout

        # A ledger whose other bookie is gone too: a dry run says it would be lost, as a
        # real run does, instead of planning a copy that cannot be read.
        doomed = write_closed(bk, (2, 2, 2), (b, c), 10)
        wait_healthy(bk, doomed)
        cluster4.kill(index_of(cluster4, c))
        poll_until(
            lambda: c not in bk.run(bk.aio.registry.writable_bookies()),
            timeout_s=30,
            interval_s=0.2,
            what=f"{c}'s registration gone",
        )
        plan = shell(uri, "recoverbookie", b, "--dry-run", "--ledger", str(doomed))
        assert plan.returncode == 1, plan.stdout + plan.stderr
        assert f"ledger {doomed} (CLOSED): lost" in plan.stdout, plan.stdout
        assert "would copy" not in plan.stdout.split("dry run for")[0], plan.stdout
        real = shell(uri, "recoverbookie", b, "--ledger", str(doomed))
        assert real.returncode == 1 and f"ledger {doomed} (CLOSED): lost" in real.stdout, real

    bad = shell(uri, "recoverbookie", "not-an-address")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "not-an-address" in bad.stderr
