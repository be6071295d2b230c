"""Disk usage watch: a bookie turns read-only when its disks fill up.

Above ``high_threshold`` (a fraction of the filesystem) the bookie refuses adds
(READ_ONLY) but keeps serving reads, fences and deletes; it becomes writable
again only below ``low_threshold``, so it does not flap around one value. A
high threshold of 0.0 makes a bookie read-only from the start.

:class:`ReservedSpace` keeps a file of ``reserved_space_bytes`` on each filesystem
the bookie writes: released at every start before the journal is replayed, so that
a bookie that filled its disk finds room to start (issue B4), and set aside again by
the checker. While it cannot be set aside, or a filesystem has less than its size
free, the disk counts as full.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # fileops imports this module
    from quorumlog.bookie.fileops import FileOps

log = logging.getLogger(__name__)

RESERVE_FILE_NAME = "RESERVED_SPACE"


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


def _one_per_filesystem(paths: Iterable[Path], device_fn: Callable[[Path], int]) -> list[Path]:
    seen: dict[int, Path] = {}
    for path in paths:
        seen.setdefault(device_fn(path), path)
    return list(seen.values())


class ReservedSpace:
    """A file of ``size_bytes`` (blocks allocated, no data) in one of ``directories``
    per filesystem.

    :meth:`release` at start, before anything is written, gives its room to the
    journal replay and the checkpoint that ends the start; :meth:`restore` sets it
    aside again afterwards (and at every disk check until it succeeds). A clean close
    whose checkpoint succeeded releases it too: nothing is left to replay then."""

    def __init__(
        self,
        directories: Iterable[Path],
        size_bytes: int,
        ops: FileOps,
        device_fn: Callable[[Path], int],
    ) -> None:
        self.size_bytes = size_bytes
        self.paths = [d / RESERVE_FILE_NAME for d in _one_per_filesystem(directories, device_fn)]
        self._ops = ops
        self.held = False
        self.problem: str | None = None  # why it could not be set aside, last time

    def release(self) -> int:
        """Remove every reserve file; returns the bytes freed."""
        freed = 0
        for path in self.paths:
            try:
                size = self._ops.size(path)
                self._ops.unlink(path)
            except FileNotFoundError:
                continue
            freed += size
        self.held = False
        if freed:
            log.info("released %d reserved bytes (%s)", freed, ", ".join(map(str, self.paths)))
        return freed

    def restore(self) -> bool:
        """Set the reserve files aside (True when every one is in place)."""
        if self.size_bytes <= 0:
            self.held = True
            return True
        for path in self.paths:
            try:
                if self._ops.size(path) == self.size_bytes:
                    continue
                self._ops.unlink(path)  # a part left by a crash
            except FileNotFoundError:
                pass
            try:
                self._make(path)
            except OSError as exc:
                self.problem = f"{path}: {exc.strerror or exc}"
                if exc.errno != errno.ENOSPC:
                    log.warning("could not set aside reserved space: %s", self.problem)
                return False
        self.held = True
        self.problem = None
        return True

    def _make(self, path: Path) -> None:
        ops = self._ops
        fd = ops.create(path)
        try:
            ops.allocate(fd, self.size_bytes)
            ops.fsync(fd)
        except BaseException:
            ops.close(fd)
            with contextlib.suppress(OSError):
                ops.unlink(path)
            raise
        ops.close(fd)
        ops.fsync_directory(path.parent)


class DiskChecker:
    """Decides read-only from the usage of the filesystems holding ``paths``, and from
    the ``reserve`` (full while it cannot be set aside, or while a filesystem has less
    free than its size)."""

    def __init__(
        self,
        paths: Iterable[Path],
        high_threshold: float,
        low_threshold: float,
        usage_fn: Callable[[Path], DiskUsage] = disk_usage,
        device_fn: Callable[[Path], int] = lambda path: os.stat(path).st_dev,
        reserve: ReservedSpace | None = None,
    ) -> None:
        if not 0.0 <= low_threshold <= high_threshold <= 1.0:
            raise ValueError(
                f"disk usage thresholds must satisfy 0 <= low ({low_threshold}) <= "
                f"high ({high_threshold}) <= 1"
            )
        # One path per filesystem is enough.
        self.paths = _one_per_filesystem(paths, device_fn)
        self.high_threshold = high_threshold
        self.low_threshold = low_threshold
        self._usage_fn = usage_fn
        self.reserve = reserve
        self.full = False
        self.short: str | None = None  # why space is short (the reserve), or None
        self.last: list[DiskUsage] = []

    @property
    def why_full(self) -> str | None:
        """Why the disk counts as full, in words (None while it does not)."""
        if not self.full:
            return None
        return self.short or "a disk is at or above its usage threshold"

    def _short_of_space(self) -> str | None:
        reserve = self.reserve
        if reserve is None or reserve.size_bytes <= 0:
            return None
        if not reserve.held:
            return (
                f"the disk is short of space: the {reserve.size_bytes} bytes reserved for "
                f"a start after a full disk cannot be set aside ({reserve.problem})"
            )
        # Entered below the reserve's size free, left at twice that (no flapping).
        floor = reserve.size_bytes if self.short is None else 2 * reserve.size_bytes
        for usage in self.last:
            if usage.free_bytes < floor:
                return (
                    f"the disk is short of space: {usage.path} has {usage.free_bytes} bytes "
                    f"free, less than {floor}"
                )
        return None

    def check(self) -> bool:
        """Measure now; returns True when the full/not-full verdict changed."""
        if self.reserve is not None and not self.reserve.held:
            self.reserve.restore()  # before measuring: what it takes counts as used
        self.last = [self._usage_fn(p) for p in self.paths]
        worst = max(self.last, key=lambda u: u.used_fraction)
        short = self._short_of_space()
        if short is not None:
            full = True
        elif not self.full or self.short is not None:
            full = self.high_threshold <= 0.0 or worst.used_fraction >= self.high_threshold
        else:
            full = not (worst.used_fraction < self.low_threshold)
        if short is not None and self.short is None:
            log.warning("%s: the bookie turns read-only", short)
        self.short = short
        if full == self.full:
            return False
        self.full = full
        if full and short is None:
            log.warning(
                "disk %s is %.1f%% used (threshold %.1f%%): the bookie turns read-only",
                worst.path,
                worst.used_fraction * 100,
                self.high_threshold * 100,
            )
        elif not full:
            log.info(
                "disk %s is %.1f%% used (below %.1f%%): the bookie is writable again",
                worst.path,
                worst.used_fraction * 100,
                self.low_threshold * 100,
            )
        return True
