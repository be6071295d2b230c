"""A Spark read freezes its Python worker's startup objects once (quorumlog.spark.scan).

PySpark's worker daemon collects garbage after every task; the objects a worker holds
from its start are frozen at its first read so that those collections skip them."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from quorumlog.spark import scan


@pytest.fixture
def unfrozen(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(scan, "_startup_objects_frozen", False)
    gc.unfreeze()
    yield
    gc.unfreeze()  # the test process must not keep its objects frozen


def test_the_first_read_freezes_the_objects_alive_then(unfrozen: None) -> None:
    held_since_start = [object() for _ in range(1_000)]  # stands for the worker's modules
    assert gc.get_freeze_count() == 0
    scan.freeze_startup_objects()
    frozen = gc.get_freeze_count()
    assert frozen >= len(held_since_start)
    # A full collection, as the daemon runs after a task, leaves them frozen.
    gc.collect()
    assert gc.get_freeze_count() == frozen


def test_later_reads_freeze_nothing_more(unfrozen: None) -> None:
    scan.freeze_startup_objects()
    frozen = gc.get_freeze_count()
    made_by_a_task = [[index] for index in range(1_000)]  # tracked containers
    scan.freeze_startup_objects()
    # The task's objects stay collectable: only what the first read found is frozen.
    assert gc.get_freeze_count() == frozen
    assert gc.is_tracked(made_by_a_task[0])
