"""Cookies: what a data or journal directory says about whose it is, and the words a
mismatch is reported in."""

from __future__ import annotations

import shutil

import pytest

from quorumlog.bookie.bookie import Bookie, BookieStartError
from quorumlog.bookie.cookie import (
    COOKIE_FILE_NAME,
    Cookie,
    check_directories,
    differences,
    new_cookie,
    read_cookie,
    write_cookie,
)


@pytest.fixture
def dirs(tmp_path):
    data, journal = tmp_path / "data", tmp_path / "journal"
    data.mkdir()
    journal.mkdir()
    return data, journal


def test_new_directories_have_no_problem_and_cookies_round_trip(dirs):
    data, journal = dirs
    assert check_directories(data, journal) is None
    cookie = new_cookie("127.0.0.1:3181", data, journal)
    assert len(cookie.instance_id) == 32 and cookie.data_dir == str(data.resolve())
    write_cookie(data, cookie)
    write_cookie(journal, cookie)
    assert read_cookie(data) == cookie == Cookie.from_bytes(cookie.to_bytes())
    assert check_directories(data, journal) is None
    assert check_directories(data, journal, expected=cookie) is None
    assert new_cookie("127.0.0.1:3181", data, journal).instance_id != cookie.instance_id


def test_wiped_journal_directory_is_named(dirs):
    data, journal = dirs
    cookie = new_cookie("127.0.0.1:3181", data, journal)
    write_cookie(data, cookie)
    problem = check_directories(data, journal)
    assert problem == (
        f"journal directory {journal} has no cookie but data directory {data} does "
        f"(instance {cookie.instance_id}): was it wiped?"
    )


def test_wiped_data_directory_is_named(dirs):
    data, journal = dirs
    write_cookie(journal, new_cookie("127.0.0.1:3181", data, journal))
    problem = check_directories(data, journal)
    assert problem.startswith(f"data directory {data} has no cookie but journal directory")
    assert "was it wiped?" in problem


def test_both_wiped_while_the_store_remembers(dirs):
    data, journal = dirs
    expected = new_cookie("127.0.0.1:3181", data, journal)
    problem = check_directories(data, journal, expected=expected)
    assert "have no cookie" in problem and expected.instance_id in problem


def test_directories_of_different_bookies(dirs):
    data, journal = dirs
    write_cookie(data, new_cookie("127.0.0.1:3181", data, journal))
    write_cookie(journal, new_cookie("127.0.0.1:3182", data, journal))
    problem = check_directories(data, journal)
    assert "differ" in problem and "instance_id" in problem and "address" in problem
    assert "127.0.0.1:3182" in problem


def test_cookie_that_differs_from_the_expected_one(dirs):
    data, journal = dirs
    mine = new_cookie("127.0.0.1:3181", data, journal)
    write_cookie(data, mine)
    write_cookie(journal, mine)
    other = new_cookie("127.0.0.1:3181", data, journal)
    problem = check_directories(data, journal, expected=other)
    assert f"instance_id: expected {other.instance_id!r}, found {mine.instance_id!r}" in problem
    assert differences(mine, mine) == []


def test_moved_directory_is_reported(dirs, tmp_path):
    data, journal = dirs
    cookie = new_cookie("127.0.0.1:3181", data, journal)
    write_cookie(data, cookie)
    write_cookie(journal, cookie)
    moved = tmp_path / "moved-data"
    shutil.move(data, moved)
    problem = check_directories(moved, journal)
    assert f"the cookie records data_dir {str(data.resolve())!r}" in problem


def test_unreadable_cookie_refuses(dirs):
    data, _journal = dirs
    (data / COOKIE_FILE_NAME).write_bytes(b"{not json")
    with pytest.raises(BookieStartError, match="unreadable"):
        read_cookie(data)


def test_bookie_open_refuses_a_wiped_journal_directory(make_config, tmp_path):
    config = make_config(journal_dir=tmp_path / "journal")
    config.data_dir.mkdir()
    config.journal_path.mkdir()
    cookie = new_cookie("127.0.0.1:3181", config.data_dir, config.journal_path)
    write_cookie(config.data_dir, cookie)
    with pytest.raises(BookieStartError, match="was it wiped"):
        Bookie.open(config)
