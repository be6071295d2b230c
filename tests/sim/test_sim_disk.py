"""The simulated disk keeps exactly POSIX's promises, and the real bookie runs on it.

SimDisk (quorumlog.testing.sim.disk): what a power loss keeps (synced pages and synced
directory entries; anything else maybe), a failed sync reported once with its pages
gone, ENOSPC, a dead process's calls. Then the real Bookie on it, driven through
submit() in virtual time: R2 (an acknowledged add survives a power loss), R7 (a fence
survives a restart), and a defect the simulator found in journal replay.
"""

from __future__ import annotations

import asyncio
import errno
import random
from pathlib import Path

import pytest
from support import run_virtual

from quorumlog.bookie.bookie import Bookie
from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.index import IndexUpdate
from quorumlog.errors import Status
from quorumlog.proto.codec import AddRequest, FenceRequest, ReadRequest, Response
from quorumlog.testing.raw_client import make_entry, master_key
from quorumlog.testing.sim.disk import PowerLoss, SimDisk
from quorumlog.testing.sim.loop import SimExecutor

D = Path("/m/d")


def disk_with_dir(seed: int = 1, page_survives: float = 0.0) -> SimDisk:
    disk = SimDisk(random.Random(seed))
    disk.faults.page_survives = page_survives
    disk.files().mkdir(D)
    return disk


def write_file(disk: SimDisk, name: str, data: bytes, *, sync: bool, sync_dir: bool) -> None:
    files = disk._handle or disk.files()
    fd = files.create(D / name)
    files.write(fd, data)
    if sync:
        files.fdatasync(fd)
    if sync_dir:
        files.fsync_directory(D)
    files.close(fd)


def test_synced_bytes_survive_a_power_loss_and_unsynced_ones_may_not() -> None:
    disk = disk_with_dir()
    write_file(disk, "a", b"synced", sync=True, sync_dir=True)
    files = disk.files()
    fd = files.open_read(D / "a")
    files.pwrite(fd, memoryview(b"-later"), 6)  # written, never synced
    assert files.read_file(D / "a") == b"synced-later"  # the page cache has it
    disk.power_loss()
    assert disk.files().read_file(D / "a") == b"synced"


def test_a_write_may_reach_the_disk_partly_and_out_of_order() -> None:
    seen = set()
    for seed in range(40):
        disk = disk_with_dir(seed, page_survives=0.5)
        write_file(disk, "a", b"", sync=True, sync_dir=True)
        files = disk.files()
        fd = files.open_read(D / "a")
        files.pwrite(fd, memoryview(b"x" * 3 * 4096), 0)
        disk.power_loss()
        data = disk.files().read_file(D / "a")
        seen.add(tuple(data[i * 4096 : (i + 1) * 4096] == b"x" * 4096 for i in range(3)))
    # Some runs kept a later page and lost an earlier one: pages land in any order.
    assert (False, True, True) in seen or (False, False, True) in seen
    assert (True, True, True) in seen


def test_a_created_file_needs_its_directory_synced() -> None:
    outcomes = set()
    for seed in range(20):
        disk = disk_with_dir(seed)
        write_file(disk, "kept", b"1", sync=True, sync_dir=True)
        write_file(disk, "maybe", b"2", sync=True, sync_dir=False)
        disk.power_loss()
        names = disk.files().listdir(D)
        assert "kept" in names
        outcomes.add("maybe" in names)
    assert outcomes == {True, False}


def test_r14_a_failed_sync_is_reported_once_and_its_pages_are_gone() -> None:
    disk = disk_with_dir(page_survives=1.0)
    write_file(disk, "a", b"", sync=True, sync_dir=True)
    files = disk.files()
    fd = files.open_read(D / "a")
    files.pwrite(fd, memoryview(b"lost"), 0)
    disk.faults.failing_syncs = 1
    with pytest.raises(OSError) as failed:
        files.fdatasync(fd)
    assert failed.value.errno == errno.EIO
    files.fdatasync(fd)  # succeeds, as Linux's does: the pages were marked clean
    assert files.read_file(D / "a") == b"lost"  # still in the page cache ...
    disk.power_loss()
    # ... but never on the platter (the later sync made the new size durable: zeros).
    assert disk.files().read_file(D / "a") in (b"", bytes(4))


def test_a_full_disk_refuses_writes_and_a_dead_process_cannot_touch_it() -> None:
    disk = disk_with_dir()
    files = disk.files()
    fd = files.create(D / "a")
    disk.faults.full = True
    with pytest.raises(OSError) as full:
        files.write(fd, b"x")
    assert full.value.errno == errno.ENOSPC
    disk.faults.full = False
    disk.crash()
    with pytest.raises(PowerLoss):
        files.write(fd, b"x")


def test_power_loss_in_the_middle_of_a_call() -> None:
    disk = disk_with_dir()
    lost: list[str] = []
    disk.on_power_loss = lambda: lost.append("power")
    files = disk.files()
    fd = files.create(D / "a")
    disk.faults.power_loss_in = 2
    files.write(fd, b"first")
    with pytest.raises(PowerLoss):
        files.fdatasync(fd)
    assert lost == ["power"]
    with pytest.raises(PowerLoss):
        files.listdir(D)  # the process that was running is gone


def test_the_index_keeps_committed_transactions() -> None:
    disk = disk_with_dir()
    index = disk.files().open_index(D / "index", 1 << 20)
    update = IndexUpdate(mark=(3, 100))
    update.entries.append((7, {0: (1, 16, 40)}))
    index.apply(update)
    disk.power_loss()
    again = disk.files().open_index(D / "index", 1 << 20)
    assert again.load_mark() == (3, 100) and again.get(7, 0) == (1, 16, 40)


# ---------------------------------------------------------------- the real bookie


class Node:
    """A real Bookie on a SimDisk, its threads as SimExecutor jobs (virtual time)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, disk: SimDisk) -> None:
        self.loop = loop
        self.disk = disk
        self.config = BookieConfig(
            data_dir=Path("/b/data"),
            journal_dir=Path("/b/journal"),
            checkpoint_interval_ms=600_000,
            journal_file_max_bytes=4096,
        )
        self.bookie: Bookie | None = None
        self.executors: list[SimExecutor] = []

    def _worker(self, name: str) -> SimExecutor:
        executor = SimExecutor(self.loop, random.Random(len(self.executors)), (0.1, 1.0), name)
        self.executors.append(executor)
        return executor

    async def start(self) -> Bookie:
        self.executors = []
        self.bookie = Bookie.open(self.config, files=self.disk.files(), workers=self._worker)
        await self.bookie.start(self.loop)
        return self.bookie

    def power_loss(self) -> None:
        for executor in self.executors:
            executor.kill()
        assert self.bookie is not None
        self.bookie._timers.stop()
        self.disk.power_loss()
        self.bookie = None

    async def call(self, request: object) -> Response:
        future: asyncio.Future[Response] = self.loop.create_future()
        assert self.bookie is not None
        self.bookie.submit(request, future.set_result)  # type: ignore[arg-type]
        return await asyncio.wait_for(future, 10)


KEY = master_key(b"pw")


def test_r2_every_acknowledged_add_survives_a_power_loss_of_the_real_bookie() -> None:
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        node = Node(loop, SimDisk(random.Random(5)))
        node.disk.faults.page_survives = 0.0  # nothing unsynced reaches the disk
        await node.start()
        answers = await asyncio.gather(
            *(
                node.call(AddRequest(0, 9, KEY, [make_entry(9, e, b"e%d" % e, lac=e - 1)]))
                for e in range(50)
            )
        )
        assert all(a.status == Status.OK for a in answers)
        node.power_loss()
        await node.start()
        read = await node.call(ReadRequest(0, 9, 0, 50))
        assert read.status == Status.OK and len(read.entries) == 50

    run_virtual(body)


def test_r7_a_fence_survives_a_power_loss_of_the_real_bookie() -> None:
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        node = Node(loop, SimDisk(random.Random(6)))
        node.disk.faults.page_survives = 0.0
        await node.start()
        assert (await node.call(FenceRequest(0, 9, KEY))).status == Status.OK
        node.power_loss()
        await node.start()
        add = await node.call(AddRequest(0, 9, KEY, [make_entry(9, 0, b"x")]))
        assert add.status == Status.FENCED

    run_virtual(body)


def test_a_bookie_starts_after_an_empty_journal_file_that_is_not_the_last() -> None:
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        node = Node(loop, SimDisk(random.Random(7)))
        await node.start()
        add = await node.call(AddRequest(0, 9, KEY, [make_entry(9, 0, b"x")]))
        assert add.status == Status.OK
        node.power_loss()
        # What two failed starts and a power loss leave behind: the start creates a new
        # journal file, its header's sync fails (so the header never reaches the disk),
        # a later start creates the next one, and the power goes before its header does.
        files = node.disk.files()
        journal = node.config.journal_path
        last = max(int(n.split(".")[0], 16) for n in files.listdir(journal))
        for file_id in (last + 1, last + 2):
            files.close(files.create(journal / f"{file_id:016x}.jnl"))
        files.fsync_directory(journal)
        await node.start()  # nothing acknowledged is in those files
        read = await node.call(ReadRequest(0, 9, 0, 1))
        assert read.status == Status.OK

    run_virtual(body)
