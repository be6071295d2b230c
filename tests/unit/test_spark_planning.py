"""The Spark source's options and read planning: pure logic, no Spark, no cluster."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumlog.errors import InvalidArgumentError
from quorumlog.log.position import Position
from quorumlog.spark.commit import TaskResult, ledgers_in_order, query_of, stream_token
from quorumlog.spark.options import AtTime, ReadOptions, WriteOptions, parse_bound
from quorumlog.spark.planning import (
    LedgerExtent,
    advance,
    count_between,
    earliest,
    latest,
    offset_of,
    position_of,
    search_by_time,
    split,
    split_planned,
)

URI = "sqlite:///tmp/quorumlog-unit/metadata.db"


def closed(ledger_id: int, last: int, first: int = 0) -> LedgerExtent:
    return LedgerExtent(ledger_id, first, last, True)


def open_(ledger_id: int, lac: int) -> LedgerExtent:
    return LedgerExtent(ledger_id, 0, lac, False)


# ---------------------------------------------------------------- options


def test_read_options_defaults_and_case_insensitive_keys():
    opts = ReadOptions.parse({"metadata": URI, "LOG": "dice"})
    assert opts.log == "dice" and opts.ledgers is None
    assert opts.start == "earliest" and opts.end == "latest"
    assert opts.entries_per_partition == 100_000 and opts.max_records_per_trigger is None


def test_read_options_take_the_log_from_the_load_path():
    assert ReadOptions.parse({"metadata": URI, "path": "dice"}).log == "dice"
    with pytest.raises(InvalidArgumentError, match="name different logs"):
        ReadOptions.parse({"metadata": URI, "path": "a", "log": "b"})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"metadata": URI, "log": "x", "startingposition": "soon"}, "startingPosition"),
        ({"metadata": URI, "log": "x", "colour": "red"}, "unknown quorumlog read option"),
        ({"metadata": URI}, "exactly one of the options log"),
        ({"metadata": URI, "log": "x", "ledgers": "1"}, "got both"),
        ({"metadata": URI, "ledgers": "1,x"}, "'x' is not a ledger id"),
        ({"metadata": URI, "ledgers": "1,1"}, "twice"),
        ({"metadata": URI, "log": "bad//name"}, "bad log name"),
        ({"metadata": "http://x", "log": "x"}, "option metadata"),
        ({"metadata": URI, "log": "x", "entriesperpartition": "0"}, "entriesPerPartition"),
        ({"metadata": URI, "log": "x", "maxrecordspertrigger": "5"}, "only streaming"),
        (
            {"metadata": URI, "log": "x", "startingposition": "5:0", "endingposition": "4:0"},
            "before startingPosition",
        ),
        # Read as 2:0 and 2:5 once: a fraction or an unknown key is a mistake.
        ({"metadata": URI, "log": "x", "startingposition": '{"ledger": 2.9, "entry": 0}'}, "2.9"),
        ({"metadata": URI, "log": "x", "startingposition": "[2, 0.5]"}, "startingPosition"),
        (
            {"metadata": URI, "log": "x", "startingposition": '{"ledger": 2, "entry": 5, "e": 1}'},
            "startingPosition",
        ),
        # One position for several logs: their ledger ids do not compare.
        (
            {"metadata": URI, "logs": "a,b", "startingposition": "3:5"},
            "for several logs give startingPositions",
        ),
        (
            {"metadata": URI, "logpattern": "ev-.*", "endingposition": "3:5"},
            "for several logs give endingPositions",
        ),
    ],
)
def test_bad_read_options_name_the_problem(options, message):
    with pytest.raises(InvalidArgumentError, match=message):
        ReadOptions.parse(options)


def test_streaming_read_options():
    opts = ReadOptions.parse(
        {"metadata": URI, "log": "x", "maxRecordsPerTrigger": "50"}, streaming=True
    )
    assert opts.max_records_per_trigger == 50
    with pytest.raises(InvalidArgumentError, match="streaming reads have no end"):
        ReadOptions.parse({"metadata": URI, "log": "x", "endingPosition": "1:0"}, streaming=True)
    with pytest.raises(InvalidArgumentError, match="streaming reads need a log"):
        ReadOptions.parse({"metadata": URI, "ledgers": "3"}, streaming=True)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("earliest", "earliest"),
        ("LATEST", "latest"),
        ('{"ledger": 12, "entry": 7}', Position(12, 7)),
        ("[12, 7]", Position(12, 7)),
        ("12:7", Position(12, 7)),
    ],
)
def test_positions_in_options(text, expected):
    assert parse_bound("startingPosition", text, "earliest") == expected


def test_write_options():
    opts = WriteOptions.parse({"metadata": URI, "log": "out", "checkpointLocation": "/tmp/c"})
    assert (opts.ensemble, opts.write_quorum, opts.ack_quorum) == (3, 3, 2)
    assert opts.sink_id == "spark" and opts.max_write_partitions == 1024
    with pytest.raises(InvalidArgumentError, match="option log"):
        WriteOptions.parse({"metadata": URI})
    with pytest.raises(InvalidArgumentError, match="unknown quorumlog write option"):
        WriteOptions.parse({"metadata": URI, "log": "out", "startingPosition": "earliest"})
    with pytest.raises(InvalidArgumentError, match="quorum"):
        WriteOptions.parse({"metadata": URI, "log": "out", "ensemble": "2", "writeQuorum": "3"})
    with pytest.raises(InvalidArgumentError, match="sinkId"):
        WriteOptions.parse({"metadata": URI, "log": "out", "sinkId": ".."})


# ---------------------------------------------------------------- planning


def test_latest_stops_after_the_first_open_ledger():
    extents = [closed(3, 9), open_(5, 4), closed(8, 2)]
    assert earliest(extents) == Position(3, 0)
    assert latest(extents) == Position(5, 5)
    assert count_between(extents, earliest(extents), latest(extents)) == 15


def test_truncation_cut_and_empty_ledgers():
    extents = [closed(3, 9, first=4), closed(4, -1), open_(6, -1)]
    assert earliest(extents) == Position(3, 4)
    assert latest(extents) == Position(6, 0)
    assert count_between(extents, earliest(extents), latest(extents)) == 6
    assert latest([]) == earliest([]) == Position(0, 0)


def test_split_respects_bounds_and_partition_size():
    extents = [closed(3, 9), closed(5, 4)]
    ranges = split(extents, Position(3, 2), Position(5, 3), 4)
    assert [(r.ledger_id, r.first_entry_id, r.last_entry_id) for r in ranges] == [
        (3, 2, 5),
        (3, 6, 9),
        (5, 0, 2),
    ]
    with pytest.raises(InvalidArgumentError):
        split(extents, Position(3, 0), Position(5, 0), 0)


def test_advance_with_a_record_limit_crosses_ledgers():
    extents = [closed(3, 9), closed(5, 4), open_(7, 1)]
    assert advance(extents, Position(3, 8), 3) == Position(5, 1)
    assert advance(extents, Position(3, 8), None) == Position(7, 2)
    assert advance(extents, Position(7, 2), 10) == Position(7, 2)  # nothing new: stays
    assert advance(extents, Position(9, 0), 10) == Position(9, 0)  # never backwards


def test_offsets_round_trip_and_reject_junk():
    assert position_of(offset_of(Position(4, 2))) == Position(4, 2)
    with pytest.raises(InvalidArgumentError, match="not a quorumlog streaming offset"):
        position_of({"partition": 1})


@st.composite
def logs(draw):
    ids = sorted(draw(st.sets(st.integers(1, 50), min_size=0, max_size=6)))
    extents = []
    for index, ledger_id in enumerate(ids):
        last = draw(st.integers(-1, 30))
        is_last = index == len(ids) - 1
        extents.append(LedgerExtent(ledger_id, 0, last, not is_last or draw(st.booleans())))
    return extents


@settings(max_examples=300, deadline=None)
@given(logs(), st.lists(st.integers(1, 25), min_size=1, max_size=12), st.integers(1, 7))
def test_micro_batches_cover_every_record_once_in_order(extents, limits, per_partition):
    """Chained micro-batches (any limits) then one unlimited: every readable record
    exactly once, in log order, whatever the partition size."""
    seen: list[tuple[int, int]] = []
    start = earliest(extents)
    for limit in [*limits, None]:
        end = advance(extents, start, limit)
        assert end >= start
        assert limit is None or count_between(extents, start, end) <= limit
        for r in split(extents, start, end, per_partition):
            assert r.entry_count <= per_partition
            seen += [(r.ledger_id, e) for e in range(r.first_entry_id, r.last_entry_id + 1)]
        start = end
    expected = []
    for extent in extents:
        expected += [(extent.ledger_id, e) for e in range(0, extent.last_entry_id + 1)]
        if not extent.closed:
            break
    assert seen == expected


def ranges_of(ranges):
    return [(r.ledger_id, r.first_entry_id, r.last_entry_id) for r in ranges]


def test_l1_a_planned_batch_is_read_to_its_end_whatever_lac_is_seen_now():
    """latestOffset planned up to (5, 6) from a LAC read of 5; the snapshot taken for
    partitions() learnt only LAC 2 (or, without a LAC read, nothing): the batch still
    covers (5, 0..5), as the next one starts at (5, 6)."""
    planned_end = Position(5, 6)
    for now in ([closed(3, 9), open_(5, 2)], [closed(3, 9), open_(5, -1)]):
        assert ranges_of(split_planned(now, Position(3, 8), planned_end, 4)) == [
            (3, 8, 9),
            (5, 0, 3),
            (5, 4, 5),
        ]
    # The ledger was closed since, at or after what was seen: nothing changes.
    assert ranges_of(
        split_planned([closed(3, 9), closed(5, 7)], Position(5, 6), Position(5, 8), 9)
    ) == [(5, 6, 7)]
    assert split_planned([closed(3, 9), open_(5, 0)], Position(5, 6), Position(5, 6), 4) == []


def test_l1_offsets_that_were_not_planned_on_this_log_are_an_error_not_a_cut():
    with pytest.raises(InvalidArgumentError, match="ledger 3 is still open"):
        split_planned([open_(3, 9), closed(5, 4)], Position(3, 0), Position(5, 2), 10)
    with pytest.raises(InvalidArgumentError, match="closed at entry 4"):
        split_planned([closed(3, 9), closed(5, 4)], Position(3, 0), Position(5, 8), 10)


@settings(max_examples=300, deadline=None)
@given(
    logs(),
    st.lists(st.tuples(st.integers(1, 25), st.integers(-1, 30)), min_size=1, max_size=12),
    st.integers(1, 7),
)
def test_l1_micro_batches_cover_every_record_once_when_lac_reads_differ(
    extents, batches, per_partition
):
    """Each batch's end is planned from one snapshot, its partitions from another whose
    open ledger's LAC read answered lower (any value down to -1): every readable record
    exactly once, in log order."""
    seen: list[tuple[int, int]] = []
    start = earliest(extents)
    for limit, lower_lac in [*batches, (None, -1)]:
        end = advance(extents, start, limit)
        now = [
            e if e.closed else LedgerExtent(e.ledger_id, 0, min(e.last_entry_id, lower_lac), False)
            for e in extents
        ]
        for r in split_planned(now, start, end, per_partition):
            assert r.entry_count <= per_partition
            seen += [(r.ledger_id, e) for e in range(r.first_entry_id, r.last_entry_id + 1)]
        start = end
    expected = []
    for extent in extents:
        expected += [(extent.ledger_id, e) for e in range(0, extent.last_entry_id + 1)]
        if not extent.closed:
            break
    assert seen == expected


def test_l2_streaming_staging_is_named_by_query_and_batch():
    assert stream_token("5f2a-77", 3) != stream_token("5f2a-77", 4) != stream_token("9c", 3)
    assert query_of([None, TaskResult(0, None, 0, "q-1"), TaskResult(1, 7, 2, "q-1")]) == "q-1"
    assert query_of([None]) is None
    with pytest.raises(InvalidArgumentError, match="several queries"):
        query_of([TaskResult(0, None, 0, "q-1"), TaskResult(1, None, 0, "q-2")])


def test_commit_orders_ledgers_by_partition_and_skips_failed_and_empty_tasks():
    results = [
        TaskResult(2, 300, 5),
        None,  # a failed task reports nothing
        TaskResult(0, 100, 3),
        TaskResult(1, None, 0),  # no rows, no ledger
    ]
    assert ledgers_in_order(results) == ([100, 300], 8)


def test_prorate_shares_a_budget_as_kafkas_source_does():
    from quorumlog.spark.planning import prorate

    assert prorate(20, {"a": 90, "b": 10}) == {"a": 18, "b": 2}
    assert prorate(20, {"a": 5, "b": 3}) == {"a": 5, "b": 3}  # all fits
    assert prorate(10, {"a": 1000, "b": 1, "c": 0}) == {"a": 9, "b": 1, "c": 0}  # b moves


def test_positions_per_log_and_their_offsets():
    from quorumlog.spark.options import parse_bounds
    from quorumlog.spark.planning import log_offsets_of, log_positions_of

    assert parse_bounds("startingPositions", "LATEST") == ("latest", {})
    every, per_log = parse_bounds(
        "startingPositions", '{"a": {"ledger": 3, "entry": 1}, "b": -2, "c": "4:0", "d": -1}'
    )
    assert every is None
    assert per_log == {"a": Position(3, 1), "b": "earliest", "c": Position(4, 0), "d": "latest"}
    with pytest.raises(InvalidArgumentError, match="log a"):
        parse_bounds("startingPositions", '{"a": "soon"}')
    offset = log_offsets_of({"b": Position(1, 2), "a": Position(3, 4)})
    assert offset == {"a": {"ledger": 3, "entry": 4}, "b": {"ledger": 1, "entry": 2}}
    assert log_positions_of(offset) == {"a": Position(3, 4), "b": Position(1, 2)}
    with pytest.raises(InvalidArgumentError, match="several logs"):
        log_positions_of({"ledger": 1, "entry": 2})


def test_lag_report_keeps_the_offsets_shape_beside_kafkas_lag_metrics():
    from quorumlog.spark.planning import lag_report

    latest = {"b": Position(7, 10), "a": Position(3, 4)}
    behind = {"a": 0, "b": 9}
    assert lag_report(latest, behind, None, "a") == {
        "ledger": 3,
        "entry": 4,
        "recordsBehindLatest": 0,
        "minRecordsBehindLatest": 0,
        "maxRecordsBehindLatest": 0,
        "avgRecordsBehindLatest": 0.0,
    }
    several = lag_report(latest, behind, {"b": 5}, None)
    assert several == {
        "a": {"ledger": 3, "entry": 4, "recordsBehindLatest": 0, "recordsSkipped": 0},
        "b": {"ledger": 7, "entry": 10, "recordsBehindLatest": 9, "recordsSkipped": 5},
        "minRecordsBehindLatest": 0,
        "maxRecordsBehindLatest": 9,
        "avgRecordsBehindLatest": 4.5,
        "recordsSkipped": 5,
    }
    assert list(several)[:2] == ["a", "b"]  # the logs first, in name order
    # A log named like a metric keeps its place; the number is left out.
    named = lag_report(
        {"maxRecordsBehindLatest": Position(1, 1)}, {"maxRecordsBehindLatest": 3}, None, None
    )
    assert named["maxRecordsBehindLatest"] == {"ledger": 1, "entry": 1, "recordsBehindLatest": 3}
    assert named["minRecordsBehindLatest"] == 3


# ---------------------------------------------------------------- by time


def _search(extents: list[LedgerExtent], times: dict[Position, int], at_ms: int):
    """Run search_by_time against ``times``; (bound, positions probed)."""
    search = search_by_time(extents, at_ms)
    probed: list[Position] = []
    try:
        probe = next(search)
        while True:
            probed.append(probe)
            probe = search.send(times[probe])
    except StopIteration as done:
        return done.value, probed


@given(
    st.lists(st.integers(0, 6), min_size=1, max_size=5),
    st.lists(st.integers(0, 3), min_size=40, max_size=40),
    st.integers(-1, 130),
)
def test_search_by_time_finds_the_first_record_at_or_after_the_time(sizes, steps, at_ms):
    # Ledgers 1..n of sizes[i] entries (some empty), the first cut at entry 1 when it
    # has two or more; times non-decreasing along the log.
    extents, times, clock, step = [], {}, 0, iter(steps)
    for index, size in enumerate(sizes):
        first = 1 if index == 0 and size > 1 else 0
        extents.append(LedgerExtent(index + 1, first, size - 1, True))
        for entry_id in range(first, size):
            clock += next(step, 1)
            times[Position(index + 1, entry_id)] = clock
    bound, probed = _search(extents, times, at_ms)
    in_order = sorted(times)
    wanted = next((p for p in in_order if times[p] >= at_ms), latest(extents))
    assert bound == wanted
    assert len(probed) <= 2 * (len(extents).bit_length() + 3)


def test_search_by_time_stops_at_an_open_ledger_and_past_the_end_means_the_end():
    extents = [closed(1, 1), LedgerExtent(2, 0, 1, False), closed(3, 0)]
    times = {Position(1, 0): 10, Position(1, 1): 20, Position(2, 0): 30, Position(2, 1): 40}
    assert _search(extents, times, 25)[0] == Position(2, 0)
    assert _search(extents, times, 41)[0] == Position(2, 2) == latest(extents)
    assert _search(extents, times, 0)[0] == Position(1, 0)
    assert _search([], {}, 5)[0] == latest([])


def test_timestamp_options():
    opts = ReadOptions.parse({"metadata": URI, "log": "a", "startingTimestamp": "1000"})
    assert opts.start == AtTime(1000)
    opts = ReadOptions.parse(
        {
            "metadata": URI,
            "logs": "a,b",
            "startingPositionsByTimestamp": '{"a": 5, "b": "6"}',
            "endingTimestamp": "9",
        }
    )
    assert opts.starts == {"a": AtTime(5), "b": AtTime(6)} and opts.start == "earliest"
    assert opts.end == AtTime(9)
    opts = ReadOptions.parse(
        {"metadata": URI, "logs": "a,b", "endingPositionsByTimestamp": '{"b": 3}'}
    )
    assert opts.ends == {"b": AtTime(3)} and opts.end == "latest"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"startingTimestamp": "5", "startingPosition": "1:0"},
            "startingTimestamp='5': give startingPosition or startingTimestamp, not both",
        ),
        (
            {"startingTimestamp": "5", "startingPositionsByTimestamp": '{"a": 5}'},
            "give startingTimestamp or startingPositionsByTimestamp, not both",
        ),
        (
            {"startingPositions": "earliest", "startingPositionsByTimestamp": '{"a": 5}'},
            "give startingPositions or startingPositionsByTimestamp, not both",
        ),
        (
            {"endingTimestamp": "5", "endingPositions": '{"a": "latest"}'},
            "give endingPositions or endingTimestamp, not both",
        ),
        ({"startingTimestamp": "-1"}, "startingTimestamp='-1': must be >= 0"),
        ({"startingTimestamp": "soon"}, "expected milliseconds since the Unix epoch"),
        ({"endingPositionsByTimestamp": "[1]"}, 'expected {"<log>": <ms'),
        ({"startingPositionsByTimestamp": '{"b": 1}'}, "log b is not read"),
        ({"startingPositionsByTimestamp": '{"a": 1.5}'}, "log a: expected milliseconds"),
        ({"startingTimestamp": "9", "endingTimestamp": "5"}, "is before the starting time 9"),
    ],
)
def test_bad_timestamp_options_name_both_options(options, message):
    with pytest.raises(InvalidArgumentError) as e:
        ReadOptions.parse({"metadata": URI, "log": "a", **options})
    assert message in e.value.message


def test_timestamp_options_refused_for_ledgers_and_ends_of_streams():
    with pytest.raises(InvalidArgumentError, match="a read of ledgers has no append times"):
        ReadOptions.parse({"metadata": URI, "ledgers": "3", "startingTimestamp": "5"})
    with pytest.raises(InvalidArgumentError, match="endingTimestamp='5': streaming reads"):
        ReadOptions.parse({"metadata": URI, "log": "a", "endingTimestamp": "5"}, streaming=True)


def test_a_skip_looked_at_again_moves_past_the_truncation_without_a_second_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The stream's partitions() looks again at a skip its latestOffset counted and
    reported; a second warning would give a short count (the removed ledgers are gone
    from its snapshot), so it moves on silently. failOnDataLoss=true still fails."""
    from quorumlog.log.errors import LogTruncatedError
    from quorumlog.spark.datasource import _after_loss

    lenient = ReadOptions.parse({"metadata": URI, "log": "dice", "failOnDataLoss": "false"})
    caplog.set_level(logging.WARNING, logger="quorumlog.spark.datasource")
    assert _after_loss(lenient, "dice", Position(1, 5), Position(3, 0), warn=False) == (
        Position(3, 0),
        0,
    )
    assert not caplog.records
    begin, _ = _after_loss(lenient, "dice", Position(1, 5), Position(3, 0))
    assert begin == Position(3, 0)
    assert len(caplog.records) == 1 and "log dice" in caplog.records[0].getMessage()
    strict = ReadOptions.parse({"metadata": URI, "log": "dice"})
    with pytest.raises(LogTruncatedError, match="log dice"):
        _after_loss(strict, "dice", Position(1, 5), Position(3, 0), warn=False)
