"""Read-only mode after a failed entry-log write does not flap (issue B7)."""

from __future__ import annotations

from pathlib import Path

from quorumlog.bookie.disk_checker import DiskChecker, DiskUsage
from quorumlog.bookie.maintenance import WRITABLE_AFTER_CLEAN_CHECKPOINTS, ReadOnlyMode
from quorumlog.bookie.timers import Timers


class Storage:
    failure: str | None = None
    write_failure: str | None = None


def _mode(tmp_path: Path) -> ReadOnlyMode:
    checker = DiskChecker(
        [tmp_path], 0.95, 0.90, usage_fn=lambda p: DiskUsage(p, 0.1, 90, 100), device_fn=lambda _: 1
    )
    return ReadOnlyMode(checker, Timers(), 1000, tmp_path)


def test_b7_a_disk_failing_every_other_write_does_not_flap_the_registration(tmp_path):
    mode = _mode(tmp_path)
    changes: list[bool] = []
    mode.add_listener(changes.append)
    storage = Storage()
    for _ in range(10):  # a write fails, the next checkpoint writes it again, and so on
        storage.write_failure = "a write to the entry logs failed"
        mode.storage_checked(storage)  # type: ignore[arg-type]
        storage.write_failure = None
        mode.storage_checked(storage)  # type: ignore[arg-type]
    assert changes == [True]  # read-only once, never back and forth
    assert mode.read_only


def test_b7_writable_again_after_clean_checkpoints_in_a_row(tmp_path):
    mode = _mode(tmp_path)
    storage = Storage()
    storage.write_failure = "a write to the entry logs failed"
    mode.storage_checked(storage)  # type: ignore[arg-type]
    assert mode.read_only
    storage.write_failure = None
    for _ in range(WRITABLE_AFTER_CLEAN_CHECKPOINTS - 1):
        mode.storage_checked(storage)  # type: ignore[arg-type]
        assert mode.read_only
    mode.storage_checked(storage)  # type: ignore[arg-type]
    assert not mode.read_only
    assert mode.reason is None
