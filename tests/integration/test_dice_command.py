"""``quorumlog dice`` as a newcomer first runs it: before any bookie is up."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from support import holds_for, poll_until, start_quorumlog, stop_process

from quorumlog.server.local_cluster import LocalCluster


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("metadata_uri", ["sqlite"], indirect=True)
@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
def test_dice_says_once_what_it_waits_for_then_only_what_changes(
    metadata_uri: str, tmp_path: Path, verbose: bool
) -> None:
    """A store and no bookies: one line says how many writable bookies a ledger needs and
    how many there are; nothing repeats while nothing changes; a bookie that starts is
    reported, and with enough of them the dice rolls."""
    args = ["dice", "--metadata", metadata_uri, "--interval-ms", "100", "--count", "1"]
    args += ["--ensemble", "2", "--write-quorum", "2", "--ack-quorum", "2"]
    dice = start_quorumlog(tmp_path, "dice", [*args, *(["--verbose"] if verbose else [])])
    err = tmp_path / "dice.err"
    try:
        poll_until(
            lambda: any("waiting for bookies" in line for line in _lines(err)),
            timeout_s=30,
            what="dice says it waits for bookies",
        )
        waiting = [line for line in _lines(err) if "waiting for bookies" in line]
        assert len(waiting) == 1, _lines(err)
        assert "2 writable bookies" in waiting[0] and "0 are writable" in waiting[0], waiting

        # Two seconds of nothing new: ten retries a second would have printed twenty lines.
        said = _lines(err)
        holds_for(lambda: _lines(err) == said, duration_s=2, what="nothing said again")

        with LocalCluster(metadata_uri, tmp_path / "cluster", 1) as cluster:
            poll_until(
                lambda: any("1 of the 2" in line for line in _lines(err)),
                timeout_s=30,
                what="dice reports the first bookie",
            )
            cluster.start_new_bookie()
            assert dice.wait(60) == 0, _lines(err)
        assert len(_lines(tmp_path / "dice.out")) == 1  # one roll, then --count stopped it
        lines = _lines(err)
        assert len(lines) == len(set(lines)), lines  # no line twice
        assert any("2 bookies writable" in line for line in lines), lines
    finally:
        if dice.poll() is None:
            dice.send_signal(signal.SIGTERM)
        stop_process(dice)
