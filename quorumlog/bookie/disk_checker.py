"""Disk usage watch: a bookie turns read-only when its disks fill up.

Above ``high_threshold`` (a fraction of the filesystem) the bookie refuses adds
(READ_ONLY) but keeps serving reads, fences and deletes; it becomes writable
again only below ``low_threshold``, so it does not flap around one value. A
high threshold of 0.0 makes a bookie read-only from the start.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

log = logging.getLogger(__name__)


class DiskUsage(NamedTuple):
    path: Path
    used_fraction: float
    free_bytes: int
    total_bytes: int


def disk_usage(path: Path) -> DiskUsage:
    usage = shutil.disk_usage(path)
    used = usage.total - usage.free
    fraction = used / usage.total if usage.total else 1.0
    return DiskUsage(path, fraction, usage.free, usage.total)


class DiskChecker:
    """Decides read-only from the usage of the filesystems holding ``paths``."""

    def __init__(
        self,
        paths: Iterable[Path],
        high_threshold: float,
        low_threshold: float,
        usage_fn: Callable[[Path], DiskUsage] = disk_usage,
        device_fn: Callable[[Path], int] = lambda path: os.stat(path).st_dev,
    ) -> None:
        if not 0.0 <= low_threshold <= high_threshold <= 1.0:
            raise ValueError(
                f"disk usage thresholds must satisfy 0 <= low ({low_threshold}) <= "
                f"high ({high_threshold}) <= 1"
            )
        # One path per filesystem is enough.
        seen: dict[int, Path] = {}
        for path in paths:
            seen.setdefault(device_fn(path), path)
        self.paths = list(seen.values())
        self.high_threshold = high_threshold
        self.low_threshold = low_threshold
        self._usage_fn = usage_fn
        self.full = False
        self.last: list[DiskUsage] = []

    def check(self) -> bool:
        """Measure now; returns True when the full/not-full verdict changed."""
        self.last = [self._usage_fn(p) for p in self.paths]
        worst = max(self.last, key=lambda u: u.used_fraction)
        if not self.full:
            full = self.high_threshold <= 0.0 or worst.used_fraction >= self.high_threshold
        else:
            full = not (worst.used_fraction < self.low_threshold)
        if full == self.full:
            return False
        self.full = full
        if full:
            log.warning(
                "disk %s is %.1f%% used (threshold %.1f%%): the bookie turns read-only",
                worst.path,
                worst.used_fraction * 100,
                self.high_threshold * 100,
            )
        else:
            log.info(
                "disk %s is %.1f%% used (below %.1f%%): the bookie is writable again",
                worst.path,
                worst.used_fraction * 100,
                self.low_threshold * 100,
            )
        return True
