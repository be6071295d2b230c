"""A bookie's settings. Names carry their units."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(slots=True)
class BookieConfig:
    data_dir: Path
    journal_dir: Path | None = None  # default: <data_dir>/journal
    # R2: an add is acknowledged only once its journal batch is fdatasynced. Turning this
    # off is for benchmarks of the rest of the stack; the bookie says so loudly at start.
    journal_sync: bool = True
    # Group commit: a batch is synced when it reaches either bound, or when the journal
    # has nothing more queued (an idle journal never waits).
    journal_max_group_wait_ms: float = 2.0
    journal_max_batch_bytes: int = 4 * 1024 * 1024
    journal_max_batch_records: int = 10_000
    journal_file_max_bytes: int = 256 * 1024 * 1024
    # Drop the journal's synced pages from the page cache (BookKeeper's
    # journalRemovePagesFromCache): the journal is read only at replay.
    journal_remove_pages_from_cache: bool = True
    # Write the journal around the page cache (O_DIRECT), where the filesystem allows
    # it: the journal is read only at replay, so caching its pages only costs CPU.
    journal_direct_io: bool = True
    # Zeros written ahead of small direct batches (BookKeeper's journalPreAllocSizeMB),
    # so that a batch's fdatasync need not commit a new file size (0: none).
    journal_prealloc_bytes: int = 1024 * 1024
    # Back-pressure: bytes queued for the journal beyond which new adds wait.
    journal_queue_max_bytes: int = 64 * 1024 * 1024
    # Start even when the journal has a damaged record before its tail: the damaged
    # bytes are skipped (what they held is lost) and replay goes on with the valid
    # records after them. Off by default: a damaged middle stops the start.
    journal_skip_corruption: bool = False
    entry_log_max_bytes: int = 512 * 1024 * 1024
    # Entry-log bytes held in memory before one write to the file (reads are served
    # from this buffer too). Written directly, a larger write holds the disk longer
    # ahead of the journal's syncs: 64 KiB appends with 16 in flight had p99 10-11.5 ms
    # with 4 MiB, 5.8-6.6 ms with 512 KiB, at the same rate.
    entry_log_write_buffer_bytes: int = 512 * 1024
    # How much of the current entry log, back from its end, stays in the page cache;
    # written pages further back are dropped (reads of them go to the disk), so the
    # cache is reused instead of growing by every byte logged. 0: all left to the kernel.
    entry_log_page_cache_max_bytes: int = 256 * 1024 * 1024
    # Write entry logs around the page cache (O_DIRECT, as BookKeeper's direct-I/O entry
    # logger does), where the filesystem allows it: no copy into cached pages and no
    # writeback later, so an entry costs less CPU (64 KiB: 240 against 400 us in the
    # bookies; 100 B: 2.8 against 3.5). Reads still go through the page cache.
    entry_log_direct_io: bool = True
    read_cache_max_bytes: int = 64 * 1024 * 1024
    # A read answer carries at most this many entry bytes, whatever the request asks
    # (at least one entry), so that it stays well under the frame size limit.
    read_response_max_bytes: int = 4 * 1024 * 1024
    # LMDB's map: the most the index may grow to (address space only; the file grows
    # as needed).
    index_map_size_bytes: int = 64 * 1024 * 1024 * 1024
    checkpoint_interval_ms: int = 10_000
    # Read-only mode when the data disk's usage passes this fraction; writable again
    # below the lower mark.
    disk_usage_threshold: float = 0.95
    disk_usage_lwm_threshold: float = 0.90
    disk_check_interval_ms: int = 2_000
    # Space set aside in a file on each filesystem the bookie writes, released at every
    # start before the journal is replayed and set aside again after: a bookie that
    # filled its disk still finds room to start. Less than this free is a full disk
    # (read-only), as is a reserve that cannot be set aside again. 0: none.
    reserved_space_bytes: int = 8 * 1024 * 1024
    long_poll_max_timeout_ms: int = 60_000
    # Parked long-poll reads beyond these bounds are refused with TOO_MANY_REQUESTS.
    long_poll_max_per_ledger: int = 1_000
    long_poll_max_total: int = 10_000
    # Entry-log compaction (BookKeeper's minor and major compaction): a log whose live
    # bytes are below the threshold's fraction of its size is rewritten, at most once
    # per interval; a threshold or interval of 0 turns that kind off.
    minor_compaction_threshold: float = 0.2
    minor_compaction_interval_ms: int = 3_600_000
    major_compaction_threshold: float = 0.8
    major_compaction_interval_ms: int = 86_400_000
    # Copy pace of compaction (0: unpaced), so that it leaves the disk to adds and reads.
    compaction_rate_bytes_per_s: float = 16 * 1024 * 1024
    compaction_rate_entries_per_s: float = 0.0
    # While a disk is at its usage threshold compaction goes on one log at a time, and
    # only what fits in the room left beyond the reserved space (suspended without
    # room); with this on, it runs as usual then, whatever the room.
    compaction_allowed_when_disk_full: bool = False

    def problems(self) -> list[str]:
        """What makes these settings unusable, in words (empty when they are fine)."""
        out = []
        if not 0.0 <= self.disk_usage_lwm_threshold <= self.disk_usage_threshold <= 1.0:
            out.append(
                f"disk usage thresholds must satisfy 0 <= disk_usage_lwm_threshold "
                f"({self.disk_usage_lwm_threshold}) <= disk_usage_threshold "
                f"({self.disk_usage_threshold}) <= 1"
            )
        for name in (
            "journal_max_batch_bytes",
            "journal_max_batch_records",
            "journal_file_max_bytes",
            "journal_queue_max_bytes",
            "entry_log_max_bytes",
            "entry_log_write_buffer_bytes",
            "read_response_max_bytes",
            "index_map_size_bytes",
            "checkpoint_interval_ms",
            "disk_check_interval_ms",
            "long_poll_max_per_ledger",
            "long_poll_max_total",
        ):
            if getattr(self, name) <= 0:
                out.append(f"{name} must be positive, got {getattr(self, name)}")
        for name in (
            "journal_max_group_wait_ms",
            "journal_prealloc_bytes",
            "read_cache_max_bytes",
            "entry_log_page_cache_max_bytes",
            "reserved_space_bytes",
            "long_poll_max_timeout_ms",
            "minor_compaction_interval_ms",
            "major_compaction_interval_ms",
            "compaction_rate_bytes_per_s",
            "compaction_rate_entries_per_s",
        ):
            if getattr(self, name) < 0:
                out.append(f"{name} must not be negative, got {getattr(self, name)}")
        for name in ("minor_compaction_threshold", "major_compaction_threshold"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                out.append(f"{name} must be between 0 and 1, got {getattr(self, name)}")
        return out

    @property
    def journal_path(self) -> Path:
        return self.journal_dir if self.journal_dir is not None else self.data_dir / "journal"
