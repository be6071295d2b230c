"""Positions, log names, the ledger list format and the history checker (no I/O)."""

from __future__ import annotations

import asyncio
import json

import pytest

from quorumlog.errors import BKError, InvalidArgumentError, MetadataError
from quorumlog.log import InvalidLogNameError, LogConfig, LogMetadata, Position
from quorumlog.log.checker import check_observations
from quorumlog.log.metadata import (
    check_log_name,
    create_log_if_absent,
    list_log_names,
    log_path,
    read_log,
)
from quorumlog.testing.memory_store import MemoryStore


def test_position_is_ordered_hashable_printable_and_json_able() -> None:
    a, b, c = Position(3, 9), Position(4, 0), Position(4, 1)
    assert a < b < c
    assert sorted([c, a, b]) == [a, b, c]
    assert len({a, Position(3, 9)}) == 1
    assert str(b) == "4:0"
    assert json.loads(json.dumps(c)) == [4, 1]
    assert c.to_dict() == {"ledger": 4, "entry": 1}
    assert Position.parse("12:7") == Position(12, 7) == Position.parse("12,7")
    assert Position.of([12, 7]) == Position.of({"ledger": 12, "entry": 7}) == Position(12, 7)
    assert a.next() == Position(3, 10)


@pytest.mark.parametrize(
    "value",
    [{"ledger": 2.9, "entry": 0}, [2, 0.5], {"ledger": 2, "entry": 5, "e": 1}, (True, 1), [1]],
)
def test_position_of_refuses_what_it_would_have_to_round_or_drop(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match="not a log position"):
        Position.of(value)


@pytest.mark.parametrize("text", ["", "12", "a:b", "-1:0", "1:-2"])
def test_position_parse_refuses_bad_text(text: str) -> None:
    with pytest.raises(InvalidArgumentError):
        Position.parse(text)


@pytest.mark.parametrize("name", ["dice", "orders.v2", "a_b-c", "0"])
def test_log_names_accepted(name: str) -> None:
    assert check_log_name(name) == name
    assert log_path(name) == f"/logs/{name}"


@pytest.mark.parametrize("name", ["db/shop", "a/b/c", "db/orders.v2"])
def test_log_names_with_slashes_are_one_node_each(name: str) -> None:
    """'/' separates the parts of a name (``db/shop``); the log is still one node of
    /logs, its '/' escaped as '%2F' (no name holds '%'), and listed under its name."""
    assert check_log_name(name) == name
    assert log_path(name) == "/logs/" + name.replace("/", "%2F")

    async def listed_and_read() -> tuple[list[str], str]:
        store = MemoryStore()
        for each in (name, "plain"):
            await create_log_if_absent(store, each)
        return await list_log_names(store), (await read_log(store, name))[0].name

    assert asyncio.run(listed_and_read()) == (sorted([name, "plain"]), name)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "..",
        ".hidden",
        "-x",
        "a b",
        "x" * 201,
        "é",
        "/a",
        "a/",
        "a//b",
        "a/.x",
        "a/../b",
        "a%2Fb",
    ],
)
def test_log_names_refused_with_a_bk_error(name: str) -> None:
    with pytest.raises(InvalidLogNameError) as info:
        check_log_name(name)
    assert isinstance(info.value, BKError)


def test_ledger_list_round_trips_and_appends_in_order() -> None:
    md = LogMetadata("x", (3, 8), Position(3, 2), 1234)
    again = LogMetadata.from_bytes("x", md.to_bytes())
    assert again == md
    assert md.with_ledger(9).ledgers == (3, 8, 9)
    with pytest.raises(MetadataError):
        md.with_ledger(8)  # ledger ids only grow along the list


def test_damaged_ledger_list_is_a_metadata_error_naming_the_log() -> None:
    for data in (b"{", b"[]", b'{"format": 2, "ledgers": []}', b'{"format": 1}'):
        with pytest.raises(MetadataError, match="log x"):
            LogMetadata.from_bytes("x", data)
    with pytest.raises(MetadataError, match="not increasing"):
        LogMetadata.from_bytes("x", b'{"format": 1, "ledgers": [5, 4]}')


def test_truncation_keeps_ledgers_from_the_position_and_never_moves_back() -> None:
    md = LogMetadata("x", (3, 8, 9))
    cut = md.truncated(Position(8, 4))
    assert cut.ledgers == (8, 9)
    assert cut.truncated_before == Position(8, 4)
    assert cut.truncated(Position(8, 1)).truncated_before == Position(8, 4)
    assert cut.only_truncated_since(md)
    assert not md.with_ledger(10).only_truncated_since(md)
    assert md.only_truncated_since(md)


def test_l6_removed_end_marks_the_empty_stretch_before_the_truncation_point() -> None:
    md = LogMetadata("x", (3, 8, 9, 12))
    # Ledger 3 closed at entry 4, ledger 8 empty: nothing lies in [3:5, 9:0).
    cut = md.truncated(Position(9, 0), Position(3, 5))
    assert (cut.ledgers, cut.truncated_before, cut.removed_end) == (
        (9, 12),
        Position(9, 0),
        Position(3, 5),
    )
    assert LogMetadata.from_bytes("x", cut.to_bytes()) == cut
    assert cut.is_truncated(Position(3, 4)) and not cut.is_truncated(Position(3, 5))
    assert not cut.is_truncated(Position(8, 0)) and not cut.is_truncated(Position(9, 0))
    # Ledger 9 empty too: the stretch grows down to the old one.
    assert md.truncated(Position(9, 0), Position(3, 5)).truncated(
        Position(12, 0), Position(9, 0)
    ).removed_end == Position(3, 5)
    # Ledger 9 held records: they are removed, a position in it is truncated.
    later = cut.truncated(Position(12, 0), Position(9, 7))
    assert later.removed_end == Position(9, 7) and later.is_truncated(Position(3, 5))
    assert cut.truncated(Position(9, 0)) == cut  # truncated there already
    assert md.truncated(Position(9, 2)).removed_end is None
    assert not md.is_truncated(Position(0, 0))
    with pytest.raises(MetadataError, match="removed_end"):
        LogMetadata.from_bytes("x", b'{"format": 1, "ledgers": [], "removed_end": [1, 0]}')


def test_l7_a_fence_seals_the_list_and_survives_every_other_change() -> None:
    md = LogMetadata("x", (3, 8)).fenced()
    assert md.fences == 1 and LogMetadata.from_bytes("x", md.to_bytes()) == md
    later = md.with_ledger(9).truncated(Position(8, 0)).with_sink_batch("s", 4).fenced()
    assert later.fences == 2
    assert b"fences" not in LogMetadata("x").to_bytes()  # lists never fenced keep their bytes


def test_l5_closed_through_only_grows_and_round_trips() -> None:
    md = LogMetadata("x", (3, 8)).with_all_closed()
    assert md.closed_through == 8 and LogMetadata.from_bytes("x", md.to_bytes()) == md
    assert md.with_closed_through(3).closed_through == 8
    assert md.with_ledger(9).truncated(Position(9, 0)).closed_through == 8
    assert LogMetadata("x").with_all_closed().closed_through == -1
    assert b"closed_through" not in LogMetadata("x", (3,)).to_bytes()


def test_log_config_checks_quorum_shape_r1() -> None:
    with pytest.raises(InvalidArgumentError):
        LogConfig(ensemble=2, write_quorum=3, ack_quorum=2)
    with pytest.raises(InvalidArgumentError):
        LogConfig(long_poll_ms=0)


# ---------------------------------------------------------------- the checker

LOG = [(Position(1, 0), 4), (Position(1, 1), 2), (Position(3, 0), 6)]


def test_checker_accepts_prefixes_and_subsets_of_the_log() -> None:
    report = check_observations(
        LOG,
        prefixes={"a": LOG, "b": LOG[:2], "late": []},
        subsets={"w1": LOG[:2], "w2": LOG[2:]},
    )
    assert report.ok, report.problems
    assert report.divergent_positions == 0
    assert report.log_records == 3 and report.observers == 5


def test_checker_finds_a_gap_a_repeat_and_a_divergence() -> None:
    gap = check_observations(LOG, prefixes={"a": [LOG[0], LOG[2]]})
    assert not gap.ok and "not a prefix" in gap.problems[0]
    repeat = check_observations(LOG, prefixes={"a": [LOG[0], LOG[0]]})
    assert any("twice" in p for p in repeat.problems)
    divergent = check_observations(LOG, prefixes={"a": LOG[:1], "b": [(Position(1, 0), 5)]})
    assert divergent.divergent_positions == 1


def test_checker_finds_a_confirmed_write_missing_from_the_log() -> None:
    report = check_observations(LOG, subsets={"w": [(Position(2, 0), 1)]})
    assert report.problems == ["w: 2:0 was reported done but is not in the log"]


def test_checker_finds_an_observer_beyond_the_log() -> None:
    report = check_observations(LOG[:1], prefixes={"stale": LOG[:2]})
    assert any("beyond the end" in p for p in report.problems)
