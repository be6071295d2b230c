"""Fixtures: clusters of real bookie processes on the ``metadata_uri`` store (both drivers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog.server.local_cluster import LocalCluster, running_cluster


@pytest.fixture
def cluster3(metadata_uri: str, tmp_path: Path) -> Iterator[LocalCluster]:
    """Three bookies with journal sync on."""
    yield from running_cluster(metadata_uri, tmp_path / "cluster", 3)


@pytest.fixture
def cluster4(metadata_uri: str, tmp_path: Path) -> Iterator[LocalCluster]:
    """Four bookies with journal sync on."""
    yield from running_cluster(metadata_uri, tmp_path / "cluster", 4)
