"""A bookie process that filled its disk, then killed with kill -9, starts again by itself
and serves every entry it acknowledged (issue B4), on a real small filesystem: an ext4
image on a loop device (as root; skipped, saying why, where that cannot be had).

What the start needs room for is the journal's replay into new entry logs and the
checkpoint after it; the bookie's own dead copies (logs the index does not name, the
tail of the last current log) and its reserved file are released first. The same on
the simulated disk, always run: tests/unit/test_bookie_disk_full.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import run

from quorumlog.errors import Status
from quorumlog.proto.codec import AddRequest, AddResponse, BookieInfoRequest
from quorumlog.server.local_cluster import LocalCluster
from quorumlog.testing.raw_client import RawClient, make_entry, master_key

KEY = master_key(b"disk-full")
ENTRY_BYTES = 64 * 1024
FILESYSTEM_BYTES = 48 * 1024 * 1024


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "mounting a loop device needs root"
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = subprocess.run(["losetup", "-f"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"no free loop device (losetup -f: {probe.stderr.strip() or probe.returncode})"
    return None


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 48 MiB ext4 filesystem mounted under tmp_path, unmounted afterwards."""
    why = _unavailable()
    if why is not None:
        pytest.skip(f"no small real filesystem: {why}")
    image, mount_point = tmp_path / "fs.img", tmp_path / "fs"
    mount_point.mkdir()
    with open(image, "wb") as f:
        f.truncate(FILESYSTEM_BYTES)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(mount_point)])
    if mounted.returncode != 0:
        pytest.skip(f"no small real filesystem: mount -o loop failed ({mounted.returncode})")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)]).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)])


def _entry(entry_id: int) -> bytes:
    return make_entry(1, entry_id, bytes([entry_id % 251]) * ENTRY_BYTES, lac=entry_id - 1)


@pytest.mark.parametrize("metadata_uri", ["sqlite"], indirect=True)
def test_b4_a_bookie_that_filled_its_disk_restarts_after_kill_9_and_serves_every_entry(
    metadata_uri: str, small_filesystem: Path
) -> None:
    # Usage threshold 1.0 and one big entry log: nothing turns the bookie read-only
    # before a write meets a full disk, as with adds faster than the disk checks.
    cluster = LocalCluster(
        metadata_uri,
        small_filesystem / "cluster",
        1,
        extra_args=["--disk-usage-threshold", "1.0", "--reserved-space-bytes", str(4 << 20)],
    )
    try:
        cluster.start()
        address = cluster.addresses[0]

        async def fill() -> list[bytes]:
            client = await RawClient.connect(address)
            try:
                futures = [
                    client.send(AddRequest(0, 1, KEY, [_entry(e)]))
                    for e in range(FILESYSTEM_BYTES // ENTRY_BYTES)
                ]
                answers = await asyncio.gather(*futures)
            finally:
                await client.close()
            statuses = [a.status for a in answers if isinstance(a, AddResponse)]
            assert len(statuses) == len(answers)
            refused = [i for i, status in enumerate(statuses) if status != Status.OK]
            assert refused and refused[0] > 0, statuses  # the disk filled on the way
            # A failed write refuses every add after it (the journal's: IO_ERROR; an
            # entry log's: READ_ONLY), so the entries acknowledged are those before.
            assert Status.OK not in statuses[refused[0] :], statuses
            return [_entry(e) for e in range(refused[0])]

        acknowledged = run(fill())
        stderr = cluster.bookies[0].stderr_path.read_text()
        assert "No space left on device" in stderr
        cluster.kill(0)
        assert cluster.restart(0) == address  # was: BookieStartError ... [Errno 28]

        async def read_back() -> None:
            client = await RawClient.connect(address)
            try:
                for entry_id, blob in enumerate(acknowledged):
                    read = await client.read(1, entry_id)
                    assert read.status == Status.OK and read.entries == [blob], entry_id
                info = await client.request(BookieInfoRequest(0))
                assert info.status == Status.OK
            finally:
                await client.close()

        run(read_back())
    finally:
        with contextlib.suppress(Exception):
            cluster.stop_all()
