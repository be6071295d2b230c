"""Journal batches written around the page cache (``O_DIRECT``).

With direct I/O (the default where the filesystem allows it) batches are written
around the page cache (``O_DIRECT``): a write must cover whole blocks, so each batch
is copied into an aligned staging buffer, followed by a PAD record up to its last
block's end, and written from the block after the previous batch's (the header's
block is filled by a PAD when the file is created). No write covers a block of an
earlier batch, so a write cut by a power loss cannot damage synced data, even on a
device whose sector writes are not atomic. A file therefore always ends in whole
records: a crash or a rollover leaves a PAD last, never zeros that replay would
take for a torn tail or for damage.
"""

from __future__ import annotations

import logging
import mmap
from pathlib import Path

from quorumlog.bookie.fileops import FileOps
from quorumlog.bookie.journal.format import (
    OUT_OF_DESCRIPTORS,
    PAGE_BYTES,
    RECORD_OVERHEAD,
    pad_record,
)

log = logging.getLogger(__name__)

_STAGE_MIN_BYTES = 4 * 1024 * 1024


def open_direct_writes(ops: FileOps, path: Path, file_id: int) -> tuple[int | None, bool]:
    """A descriptor that writes journal file ``path`` around the page cache, and whether
    direct I/O stays on. ``(None, True)`` when no descriptor can be had (EMFILE: this
    file is written through the page cache, the next ones directly); ``(None, False)``
    when the filesystem refuses ``O_DIRECT`` (tmpfs and some others): correct either
    way, through the page cache from now on."""
    try:
        return ops.open_direct_write(path), True
    except OSError as exc:
        if exc.errno in OUT_OF_DESCRIPTORS:
            # Not the filesystem's doing: this file is written through the page cache
            # (appended after its header's block), the next ones directly.
            log.warning(
                "journal %s: no descriptor for direct writes of file %d (%s); "
                "writing it through the page cache",
                path.parent,
                file_id,
                exc,
            )
            return None, True
        log.warning(
            "journal %s: direct I/O is not available here (%s); writing through the page cache",
            path.parent,
            exc,
        )
        return None, False


class StagedDirectWrites:
    """Writes batches around the page cache through a page-aligned staging buffer, kept
    from one batch to the next."""

    __slots__ = ("_stage",)

    def __init__(self) -> None:
        self._stage: mmap.mmap | None = None

    def write(self, ops: FileOps, fd: int, parts: list[bytes], start: int) -> int:
        """Write the parts at ``start`` (the block after the last batch's), with a PAD
        record to the end of their last block; returns the bytes written.

        A batch never writes over a block of the batch before it: on a device whose
        sector writes are not atomic, a write cut by a power loss damages only blocks of
        a batch that was never synced, so never acknowledged."""
        size = sum(map(len, parts))
        pad = -size % PAGE_BYTES
        if pad < RECORD_OVERHEAD:
            pad += PAGE_BYTES
        padded = size + pad
        if self._stage is None or len(self._stage) < padded:
            if self._stage is not None:
                self._stage.close()
            # Sized for a full batch at once, so it is allocated (and faulted in) rarely.
            self._stage = mmap.mmap(-1, max(padded, _STAGE_MIN_BYTES))
        with memoryview(self._stage) as view:
            position = 0
            for part in parts:
                view[position : position + len(part)] = part
                position += len(part)
            view[size:padded] = pad_record(pad)
            written = 0
            while written < padded:
                written += ops.pwrite(fd, view[written:padded], start + written)
        return padded
