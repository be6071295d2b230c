"""Named log streams against real bookie processes, on both metadata drivers."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time

import pytest

from quorumlog import BookKeeper, LogNamespace
from quorumlog.aio import BookKeeper as AsyncBookKeeper
from quorumlog.aio import LogNamespace as AsyncLogNamespace
from quorumlog.errors import InvalidArgumentError
from quorumlog.log import (
    LogConfig,
    LogFencedError,
    LogTruncatedError,
    NoSuchLogError,
    Position,
    Record,
)
from quorumlog.log.checker import check_observations
from quorumlog.server.local_cluster import LocalCluster

SMALL_LEDGERS = LogConfig(rollover_size_bytes=1_000)
# How long a reader may take to return a record that is already confirmed: a bound for it
# to arrive at all, not a latency target. Generous because the first read of a reader
# opens the ledger through the metadata store (a loaded ZooKeeper can take seconds).
READ_BOUND_MS = 30_000


def test_r11_append_read_rollover_truncate_round_trip(cluster3: LocalCluster) -> None:
    with BookKeeper(cluster3.metadata_uri) as bk:
        log = LogNamespace(bk).open_log("orders", SMALL_LEDGERS)
        writer = log.open_writer()
        assert writer.last_position is None
        payloads = [b"order-%04d-" % i + b"x" * 90 for i in range(50)]  # 100 bytes each
        positions = [writer.append(p) for p in payloads[:25]]
        assert writer.last_position == positions[-1]
        futures = [writer.append_nowait(p) for p in payloads[25:]]
        positions += [f.result(timeout=30) for f in futures]
        assert positions == sorted(positions) and len(set(positions)) == 50
        # Kept once per batch of confirmations, across the rollovers of the burst.
        assert writer.last_position == positions[-1]
        writer.close()
        ledgers = log.ledgers()
        assert len(ledgers) >= 3  # 1000-byte ledgers (a pipelined burst fills one)
        assert all(bk.is_closed(ledger_id) for ledger_id in ledgers)
        assert [r.data for r in log.read_all()] == payloads
        info = log.positions()
        assert (info.first, info.last, info.record_count, info.count_exact) == (
            positions[0],
            positions[-1],
            50,
            True,
        )
        assert LogNamespace(bk).list_logs() == ["orders"]

        cut = positions[30]
        removed = log.truncate(cut)
        assert removed == [x for x in ledgers if x < cut.ledger_id]
        with pytest.raises(LogTruncatedError):
            log.open_reader(positions[0])
        with log.open_reader() as reader:
            first = reader.read_next(timeout_ms=READ_BOUND_MS)
            assert first is not None and first[:2] == (cut, payloads[30])
            rest = [reader.read_next(timeout_ms=READ_BOUND_MS) for _ in range(19)]
            assert [r.data for r in rest if r] == payloads[31:]
            assert reader.read_next(timeout_ms=100) is None
        assert LogNamespace(bk).delete_log("orders") == [x for x in ledgers if x >= cut.ledger_id]
        assert LogNamespace(bk).list_logs() == []
        assert not any(x in bk.list_ledgers() for x in ledgers)
        with pytest.raises(NoSuchLogError):
            LogNamespace(bk).delete_log("orders")


def test_a_truncation_past_the_written_end_is_refused_and_hides_no_later_record(
    cluster3: LocalCluster,
) -> None:
    """A cut beyond the last record of the writer's open ledger would hide the records
    appended there afterwards, confirmed to their writer: it is refused, naming the
    end; a cut at the end hides nothing appended after it."""
    with BookKeeper(cluster3.metadata_uri) as bk:
        log = LogNamespace(bk).open_log("cut-ahead")
        writer = log.open_writer()
        old = [writer.append(b"old-%d" % i) for i in range(5)]
        ledger_id = old[-1].ledger_id
        with pytest.raises(InvalidArgumentError, match=rf"before {ledger_id}:100:.*at most before"):
            log.truncate(Position(ledger_id, 100))
        assert log.metadata()[0].truncated_before is None  # nothing recorded
        end = Position(ledger_id, old[-1].entry_id + 1)
        log.truncate(end)
        new = [writer.append(b"new-%d" % i) for i in range(3)]
        assert new[0] == end
        with log.open_reader() as reader:
            read = [reader.read_next(timeout_ms=READ_BOUND_MS) for _ in range(3)]
        assert [(r.position, r.data) for r in read if r] == [
            (p, b"new-%d" % i) for i, p in enumerate(new)
        ]
        writer.close()


def test_r11_reader_follows_rollovers_and_a_new_writer(cluster3: LocalCluster) -> None:
    async def main() -> None:
        uri = cluster3.metadata_uri
        async with (
            await AsyncBookKeeper.connect(uri) as bk_w1,
            await AsyncBookKeeper.connect(uri) as bk_w2,
            await AsyncBookKeeper.connect(uri) as bk_r,
        ):
            reader = await (
                await AsyncLogNamespace(bk_r).open_log("tail", SMALL_LEDGERS)
            ).open_reader()
            writer = await (
                await AsyncLogNamespace(bk_w1).open_log("tail", SMALL_LEDGERS)
            ).open_writer()
            written = [await writer.append(b"a" * 300) for _ in range(6)]  # rolls over
            # A new writer takes over without the first one closing (as after a crash).
            successor = await (
                await AsyncLogNamespace(bk_w2).open_log("tail", SMALL_LEDGERS)
            ).open_writer()
            with pytest.raises(LogFencedError):
                await writer.append(b"stale")
            written += [await successor.append(b"b" * 10) for _ in range(3)]
            read = [await reader.read_next(timeout_ms=READ_BOUND_MS) for _ in range(9)]
            assert [r.position for r in read if r] == written
            await reader.close()

    asyncio.run(main())


def test_r11_concurrent_writers_exactly_one_wins(cluster3: LocalCluster) -> None:
    async def main() -> None:
        uri = cluster3.metadata_uri
        clients = [await AsyncBookKeeper.connect(uri) for _ in range(3)]
        try:
            logs = [await AsyncLogNamespace(bk).open_log("race") for bk in clients]
            outcomes = await asyncio.gather(
                *(lg.open_writer() for lg in logs), return_exceptions=True
            )
            opened = [o for o in outcomes if not isinstance(o, BaseException)]
            assert all(isinstance(o, LogFencedError) for o in outcomes if o not in opened)
            appended = await asyncio.gather(
                *(w.append(b"mine") for w in opened), return_exceptions=True
            )
            wins = [a for a in appended if isinstance(a, Position)]
            assert len(wins) == 1, outcomes
            losers = [a for a in appended if not isinstance(a, Position)]
            assert all(isinstance(a, LogFencedError) for a in losers)
            for w in opened:
                if w.is_fenced:  # every later append fails too
                    with pytest.raises(LogFencedError):
                        await w.append(b"again")
            final = await logs[0].read_all(fence=True)
            assert [r.position for r in final] == wins
        finally:
            for bk in clients:
                await bk.close()

    asyncio.run(main())


def test_reader_sees_each_record_of_an_idle_writer_without_a_next_append(
    cluster3: LocalCluster,
) -> None:
    """The writer appends one record, then stays idle; the tailing reader must not wait
    for the next append to learn the LAC (explicit LAC + long poll): each record reaches
    it while no other is appended. The latency target (under 50 ms) is checked by
    bench/latency.py; this prints the figures."""

    async def main() -> list[float]:
        uri = cluster3.metadata_uri
        async with (
            await AsyncBookKeeper.connect(uri) as bk_w,
            await AsyncBookKeeper.connect(uri) as bk_r,
        ):
            writer = await (await AsyncLogNamespace(bk_w).open_log("latency")).open_writer()
            reader = await (await AsyncLogNamespace(bk_r).open_log("latency")).open_reader()
            await writer.append(b"warm-up")
            assert await reader.read_next(timeout_ms=READ_BOUND_MS) is not None
            latencies_ms: list[float] = []
            for i in range(20):
                # Nothing else is appended until this read returns: without the explicit
                # LAC it would end empty at its timeout.
                pending = asyncio.ensure_future(reader.read_next(timeout_ms=READ_BOUND_MS))
                await asyncio.sleep(0.05)  # the reader is parked in a long poll
                position = await writer.append(b"record-%d" % i)
                confirmed = time.perf_counter()
                record = await pending
                latencies_ms.append((time.perf_counter() - confirmed) * 1000)
                assert record is not None and record.position == position
            await reader.close()
            return latencies_ms

    latencies_ms = asyncio.run(main())
    print(
        f"tail latency after confirmation: median {statistics.median(latencies_ms):.1f} ms, "
        f"max {max(latencies_ms):.1f} ms"
    )


def test_sync_api_reader_iterates_while_a_thread_appends(cluster3: LocalCluster) -> None:
    with BookKeeper(cluster3.metadata_uri) as bk_w, BookKeeper(cluster3.metadata_uri) as bk_r:
        reader = LogNamespace(bk_r).open_log("iterate").open_reader()
        writer = LogNamespace(bk_w).open_log("iterate").open_writer()
        confirmed: list[Position] = []

        def produce() -> None:
            for i in range(30):
                confirmed.append(writer.append(b"%d" % i))
                time.sleep(0.005)

        producer = threading.Thread(target=produce)
        producer.start()
        seen: list[Record] = []
        for record in reader:
            seen.append(record)
            if len(seen) == 30:
                break
        producer.join(timeout=30)
        reader.close()
        assert [r.position for r in seen] == confirmed
        assert [r.data for r in seen] == [b"%d" % i for i in range(30)]
        report = check_observations(
            [(r.position, r.data) for r in LogNamespace(bk_r).open_log("iterate").read_all()],
            prefixes={"reader": [(r.position, r.data) for r in seen]},
        )
        assert report.ok, report.problems
        writer.close()
