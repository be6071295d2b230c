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


def _collectable_ids() -> set[int]:
    """Objects a collection looks at (frozen ones are in no generation)."""
    return {id(obj) for obj in gc.get_objects()}


def test_the_first_read_freezes_the_objects_alive_then(unfrozen: None) -> None:
    held_since_start = [[n] for n in range(1_000)]  # containers, as a worker's modules hold
    scan.freeze_startup_objects()
    assert gc.get_freeze_count() >= len(held_since_start)
    # A full collection, as the daemon runs after a task, leaves them frozen: it does not
    # look at them (other frozen objects may die meanwhile, so the count is not fixed).
    gc.collect()
    collectable = _collectable_ids()
    assert not any(id(obj) in collectable for obj in held_since_start)


def test_later_reads_freeze_nothing_more(unfrozen: None) -> None:
    scan.freeze_startup_objects()
    made_by_a_task = [[index] for index in range(1_000)]  # tracked containers
    scan.freeze_startup_objects()
    # The task's objects stay collectable: only what the first read found is frozen.
    collectable = _collectable_ids()
    assert all(id(obj) in collectable for obj in made_by_a_task)
