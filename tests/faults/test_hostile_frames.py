"""R12: hostile bytes on one connection of a real bookie process.

For every kind of bad input the hostile connection is closed (or answered with
an error), while a second client on another connection keeps adding and
reading correctly throughout; the bookie process stays alive, the entries it
stored before are unchanged, and its memory stays bounded.
"""

from __future__ import annotations

import asyncio
import os
import random
import struct
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import poll_until_async, run

from quorumlog.errors import Status
from quorumlog.proto.codec import (
    PROTOCOL_VERSION,
    AddRequest,
    AddResponse,
    BookieInfoRequest,
    ReadLacRequest,
    encode,
)
from quorumlog.server.local_cluster import LocalCluster
from quorumlog.testing.raw_client import RawClient, make_entry, master_key

KEY = master_key(b"hostile-test")
STORED_LEDGER = 1
STORED = [make_entry(STORED_LEDGER, i, os.urandom(200 + i)) for i in range(100)]


@pytest.fixture(scope="module")
def bookie(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One bookie (the metadata driver plays no part here: the embedded store)."""
    base = tmp_path_factory.mktemp("hostile")
    cluster = LocalCluster(f"sqlite://{base / 'metadata.db'}", base, 1)
    try:
        cluster.start()

        async def store() -> None:
            client = await RawClient.connect(cluster.addresses[0])
            try:
                assert (await client.add(STORED_LEDGER, KEY, STORED)).status == Status.OK
            finally:
                await client.close()

        run(store())
        yield cluster
    finally:
        cluster.stop_all()


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def _frame(version: int, op: int, request_id: int, body: bytes) -> bytes:
    return struct.pack(">IBBQ", 10 + len(body), version, op, request_id) + body


class GoodClient:
    """Adds and reads back on its own connection until stopped; records any failure."""

    def __init__(self, address: str, ledger_id: int) -> None:
        self.address = address
        self.ledger_id = ledger_id
        self.rounds = 0
        self.failures: list[str] = []
        self._stop = asyncio.Event()

    async def run(self) -> None:
        client = await RawClient.connect(self.address)
        try:
            entry_id = 0
            while not self._stop.is_set():
                blob = make_entry(self.ledger_id, entry_id, b"good %d" % entry_id)
                added = await client.add(self.ledger_id, KEY, [blob])
                read = await client.read(self.ledger_id, entry_id)
                if added.status != Status.OK or read.entries != [blob]:
                    self.failures.append(f"entry {entry_id}: add {added.status} read {read}")
                entry_id += 1
                self.rounds += 1
        except Exception as exc:
            self.failures.append(repr(exc))
        finally:
            await client.close()

    def stop(self) -> None:
        self._stop.set()


async def _assert_unchanged(address: str) -> None:
    client = await RawClient.connect(address)
    try:
        read = await client.read(STORED_LEDGER, 0, count=len(STORED))
        assert (read.status, read.entries) == (Status.OK, STORED)
    finally:
        await client.close()


async def _with_good_client(
    cluster: LocalCluster, ledger_id: int, attack: Callable[[str], Coroutine[Any, Any, None]]
) -> None:
    address = cluster.addresses[0]
    good = GoodClient(address, ledger_id)
    task = asyncio.create_task(good.run())
    await poll_until_async(
        lambda: good.rounds > 0 or task.done(), timeout_s=30, what="the good client's first round"
    )
    before = good.rounds
    await attack(address)
    await poll_until_async(
        lambda: good.rounds > before or task.done(),
        timeout_s=30,
        what="the good client made no progress during the attack",
    )
    good.stop()
    await task
    assert good.failures == []
    assert good.rounds > before, "the good client made no progress during the attack"
    await _assert_unchanged(address)


async def _expect_closed(address: str, data: bytes, *, shut_write: bool = False) -> RawClient:
    hostile = await RawClient.connect(address)
    hostile.send_raw(data)
    if shut_write:
        transport = hostile._transport
        assert transport is not None
        transport.write_eof()
    assert await hostile.wait_closed(10), "the bookie kept a hostile connection open"
    return hostile


def _valid_add(ledger_id: int) -> bytes:
    return encode(AddRequest(1, ledger_id, KEY, [make_entry(ledger_id, 0, b"valid")]))


HOSTILE_INPUTS: dict[str, bytes] = {
    "huge_length_prefix": struct.pack(">I", 0xFFFFFFFF) + b"\x01\x01" + bytes(64),
    "length_below_header": struct.pack(">I", 3) + b"abc",
    "unknown_operation": _frame(PROTOCOL_VERSION, 0x55, 9, b""),
    "bad_version": _frame(PROTOCOL_VERSION + 7, 1, 9, b""),
    "response_sent_to_bookie": _frame(PROTOCOL_VERSION, 1 | 0x80, 9, struct.pack(">hQI", 0, 1, 1)),
    "add_with_lying_entry_count": _frame(
        PROTOCOL_VERSION, 1, 9, struct.pack(">QB20sI", 3, 0, KEY, 1_000_000)
    ),
    "garbage_after_valid_frame": _valid_add(77) + b"\xde\xad\xbe\xef" * 8,
}


@pytest.mark.parametrize("name", sorted(HOSTILE_INPUTS))
def test_r12_hostile_frame_closes_only_that_connection(bookie: LocalCluster, name: str) -> None:
    data = HOSTILE_INPUTS[name]
    pid = bookie.bookies[0].pid
    assert pid is not None

    async def attack(address: str) -> None:
        hostile = await _expect_closed(address, data)
        assert hostile.unmatched == [] or all(isinstance(m, AddResponse) for m in hostile.unmatched)

    run(_with_good_client(bookie, 1000 + sorted(HOSTILE_INPUTS).index(name), attack))
    assert bookie.bookies[0].alive()


def test_r12_truncated_frame_then_close(bookie: LocalCluster) -> None:
    frame = _valid_add(78)

    async def attack(address: str) -> None:
        for cut in (1, 4, 10, len(frame) - 1):
            hostile = await RawClient.connect(address)
            hostile.send_raw(frame[:cut])
            await hostile.close()
        # The bookie never saw a whole frame for ledger 78: nothing was stored.
        client = await RawClient.connect(address)
        try:
            lac = await client.request(ReadLacRequest(0, 78))
            assert lac.status == Status.NO_SUCH_LEDGER
        finally:
            await client.close()

    run(_with_good_client(bookie, 2001, attack))
    assert bookie.bookies[0].alive()


def test_r12_half_closed_connection_still_gets_its_answers(bookie: LocalCluster) -> None:
    """A client that sends whole requests and then shuts its write side gets every answer."""

    async def attack(address: str) -> None:
        client = await RawClient.connect(address)
        futures = [client.send(BookieInfoRequest(0)) for _ in range(10)]
        transport = client._transport
        assert transport is not None
        transport.write_eof()
        answers = await asyncio.wait_for(asyncio.gather(*futures), 10)
        assert all(a.status == Status.OK for a in answers)
        assert await client.wait_closed(10)

    run(_with_good_client(bookie, 2002, attack))


def test_r12_random_bytes_and_memory_stays_bounded(bookie: LocalCluster) -> None:
    pid = bookie.bookies[0].pid
    assert pid is not None
    rng = random.Random(12)

    async def warm_up(address: str) -> None:
        # Warm the allocator and code paths before measuring.
        for _ in range(20):
            junk = b"\xff\xff\xff\xff" + rng.randbytes(rng.randint(1, 4096))
            await _expect_closed(address, junk)

    run(_with_good_client(bookie, 2003, warm_up))
    rss_before_kib = _rss_kib(pid)

    async def attack(address: str) -> None:
        # A 4 GiB length prefix followed by as much as the bookie will swallow.
        hostile = await RawClient.connect(address)
        hostile.send_raw(struct.pack(">IBBQ", 0xFFFFFFFF, PROTOCOL_VERSION, 1, 1))
        hostile.send_raw(bytes(1 << 20))
        assert await hostile.wait_closed(10)
        # A frame just under the maximum size, announced but never completed, from many
        # connections at once: each may hold at most what it sent.
        holders = []
        for _ in range(20):
            holder = await RawClient.connect(address)
            holder.send_raw(struct.pack(">IBBQ", 8 * 1024 * 1024, PROTOCOL_VERSION, 1, 1))
            holder.send_raw(bytes(64 * 1024))
            holders.append(holder)
        # Many junk connections, each with random bytes.
        for i in range(300):
            junk = rng.randbytes(rng.randint(1, 2048))
            if i % 3 == 0:
                junk = struct.pack(">I", rng.randint(0x01000000, 0xFFFFFFFF)) + junk
            hostile = await RawClient.connect(address)
            hostile.send_raw(junk + b"\xff" * 16)
            await hostile.wait_closed(0.05)
            await hostile.close()
        for holder in holders:
            await holder.close()

    run(_with_good_client(bookie, 2004, attack), timeout_s=120)
    assert bookie.bookies[0].alive()
    growth_kib = _rss_kib(pid) - rss_before_kib
    assert growth_kib < 32 * 1024, f"bookie RSS grew by {growth_kib} KiB"


def test_r12_peer_that_never_reads_its_answers_is_throttled(bookie: LocalCluster) -> None:
    """Thousands of large reads from a peer that reads no answers: the bookie stops reading
    that connection instead of queueing answers without bound."""
    import socket
    import time

    from quorumlog.proto.codec import ReadRequest

    pid = bookie.bookies[0].pid
    assert pid is not None
    address = bookie.addresses[0]
    host, _, port = address.rpartition(":")
    # Each read asks for every stored entry (about 30 KB of answer).
    request = encode(ReadRequest(1, STORED_LEDGER, 0, count=len(STORED)))
    burst = request * 1000
    rss_before_kib = _rss_kib(pid)

    async def attack(address: str) -> None:
        sock = socket.create_connection((host, int(port)))
        sock.setblocking(False)
        sent = 0
        deadline = time.monotonic() + 3
        try:
            while time.monotonic() < deadline and sent < 200 * len(burst):
                try:
                    sent += sock.send(burst[sent % len(burst) :])
                except BlockingIOError:
                    await asyncio.sleep(0.01)
            # Unthrottled, the bookie would now hold sent/len(request) answers of ~30 KB.
            assert sent < 200 * len(burst), "the bookie read everything: no back-pressure"
            # A request answered on another connection: the bookie has turned its loop
            # past everything it read from this one.
            await _assert_unchanged(address)
            growth_kib = _rss_kib(pid) - rss_before_kib
            assert growth_kib < 64 * 1024, f"bookie RSS grew by {growth_kib} KiB"
        finally:
            sock.close()

    run(_with_good_client(bookie, 2005, attack))
    assert bookie.bookies[0].alive()


async def _raw_answer(address: str, frame: bytes) -> object | None:
    """Send one hand-built frame on a connection of its own; its answer, or None when the
    bookie closed the connection instead of answering."""
    client = await RawClient.connect(address)
    try:
        client.send_raw(frame)
        deadline = asyncio.get_running_loop().time() + 10
        while not client.unmatched and not client.is_closed:
            assert asyncio.get_running_loop().time() < deadline, "no answer, no close"
            await asyncio.sleep(0.01)
        return client.unmatched[0] if client.unmatched else None
    finally:
        await client.close()


def test_r10_delete_ledger_needs_the_master_key(bookie: LocalCluster) -> None:
    """DELETE_LEDGER carries the ledger's master key: a delete without one is bad input,
    a delete with another key is UNAUTHORIZED; neither changes anything."""
    ledger_id = 3001
    blobs = [make_entry(ledger_id, i, b"kept %d" % i) for i in range(5)]
    other_key = master_key(b"not the password")

    async def attack(address: str) -> None:
        client = await RawClient.connect(address)
        try:
            assert (await client.add(ledger_id, KEY, blobs)).status == Status.OK
            keyless = _frame(PROTOCOL_VERSION, 6, 71, struct.pack(">Q", ledger_id))
            assert await _raw_answer(address, keyless) is None, "a keyless delete was answered"
            wrong = _frame(PROTOCOL_VERSION, 6, 72, struct.pack(">Q20s", ledger_id, other_key))
            answer = await _raw_answer(address, wrong)
            assert getattr(answer, "status", None) == Status.UNAUTHORIZED, answer
            read = await client.read(ledger_id, 0, count=len(blobs))
            assert (read.status, read.entries) == (Status.OK, blobs), "the ledger was purged"
            right = _frame(PROTOCOL_VERSION, 6, 73, struct.pack(">Q20s", ledger_id, KEY))
            answer = await _raw_answer(address, right)
            assert getattr(answer, "status", None) == Status.OK, answer
            assert (await client.read(ledger_id, 0)).status == Status.NO_SUCH_LEDGER
        finally:
            await client.close()

    run(_with_good_client(bookie, 2006, attack))
    assert bookie.bookies[0].alive()
