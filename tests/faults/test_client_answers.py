"""R12 both ways: the client checks what bookies answer. A bookie that answers with the
wrong message type, for another ledger, or with more entries than asked, gets a
ProtocolError naming it and is treated as failed for that request; nothing it said is
used, and no AssertionError reaches the caller.

The lying bookie is a fake speaking the real codec from memory, next to real bookies."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from support import run

from quorumlog.aio import BookKeeper as AsyncBookKeeper
from quorumlog.errors import ProtocolError, Status
from quorumlog.proto.codec import (
    AddRequest,
    AddResponse,
    BookieInfoRequest,
    BookieInfoResponse,
    DeleteLedgerRequest,
    FenceRequest,
    FenceResponse,
    FrameDecoder,
    Op,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    StatusResponse,
    WriteLacRequest,
    encode,
)
from quorumlog.proto.entry import entry_id_and_lac

# Turns the honest answer to a request into the one the fake bookie sends.
Spoil = Callable[[Request, Response], Response]


class FakeBookie:
    """A bookie that keeps entries in memory and answers through ``spoil``."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, int], bytes] = {}
        self.lac: dict[int, int] = {}
        self.spoil: Spoil | None = None
        self.address = ""
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _FakeConnection(self), "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        return self.address

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    def stored(self, ledger_id: int) -> list[int]:
        return sorted(e for (lid, e) in self.entries if lid == ledger_id)

    def answer(self, request: Request) -> Response:
        honest = self._honest(request)
        return honest if self.spoil is None else self.spoil(request, honest)

    def _honest(self, r: Request) -> Response:
        rid = r.request_id
        if isinstance(r, AddRequest):
            for blob in r.entries:
                entry_id, lac = entry_id_and_lac(blob)
                self.entries[(r.ledger_id, entry_id)] = blob
                self.lac[r.ledger_id] = max(self.lac.get(r.ledger_id, -1), lac)
            return AddResponse(rid, Status.OK, r.ledger_id, len(r.entries))
        if isinstance(r, ReadRequest):
            found = []
            entry_id = r.first_entry_id
            while len(found) < r.count and (r.ledger_id, entry_id) in self.entries:
                found.append(self.entries[(r.ledger_id, entry_id)])
                entry_id += 1
            status = Status.OK if found else Status.NO_SUCH_ENTRY
            lac = self.lac.get(r.ledger_id, -1)
            return ReadResponse(rid, status, r.ledger_id, r.first_entry_id, lac, found)
        if isinstance(r, ReadLacRequest | FenceRequest):
            lac = self.lac.get(r.ledger_id, -1)
            last = max(self.stored(r.ledger_id), default=-1)
            kind = ReadLacResponse if isinstance(r, ReadLacRequest) else FenceResponse
            return kind(rid, Status.OK, r.ledger_id, lac, last)
        if isinstance(r, WriteLacRequest):
            self.lac[r.ledger_id] = max(self.lac.get(r.ledger_id, -1), r.lac)
            return StatusResponse(rid, Op.WRITE_LAC, Status.OK, r.ledger_id)
        if isinstance(r, DeleteLedgerRequest):
            return StatusResponse(rid, Op.DELETE_LEDGER, Status.OK, r.ledger_id)
        assert isinstance(r, BookieInfoRequest)
        return BookieInfoResponse(rid, Status.OK, False, 1 << 30, 1 << 31)


class _FakeConnection(asyncio.Protocol):
    def __init__(self, bookie: FakeBookie) -> None:
        self._bookie = bookie
        self._decoder = FrameDecoder()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        assert self._transport is not None
        for request in self._decoder.feed(data):
            self._transport.write(encode(self._bookie.answer(request)))  # type: ignore[arg-type]


async def _cluster_with_liar(metadata_uri: str) -> tuple[AsyncBookKeeper, FakeBookie, list[str]]:
    """A client, a started fake bookie, and the real bookies' addresses."""
    bk = await AsyncBookKeeper.connect(metadata_uri)
    fake = FakeBookie()
    await fake.start()
    return bk, fake, await bk.list_bookies()


def test_r12_client_validates_read_answers_and_never_returns_entries_past_last(cluster3):
    async def main() -> None:
        bk, fake, real = await _cluster_with_liar(cluster3.metadata_uri)
        try:
            # The fake is first in the ensemble: reads start at ensemble index 0.
            lh = await bk.create_ledger(3, 3, 2, ensemble_bookies=[fake.address, *real[:2]])
            for i in range(10):
                await lh.add_entry(b"e%d" % i)
            assert fake.stored(lh.ledger_id) == list(range(10))

            def every_entry_it_has(request: Request, honest: Response) -> Response:
                if isinstance(request, ReadRequest) and isinstance(honest, ReadResponse):
                    honest.entries = [fake.entries[(lh.ledger_id, e)] for e in range(10)]
                    honest.entries = honest.entries[request.first_entry_id :]
                return honest

            fake.spoil = every_entry_it_has
            entries = await lh.read_entries(0, 4)
            assert [e.entry_id for e in entries] == [0, 1, 2, 3, 4]
            assert [e.data for e in entries] == [b"e%d" % i for i in range(5)]
            with pytest.raises(ProtocolError, match=f"bookie {fake.address}.*6 entries.*asked 1"):
                await bk.pool.request(fake.address, ReadRequest(0, lh.ledger_id, 4, 1), 5_000)
            await lh.close()
        finally:
            fake.stop()
            await bk.close()

    run(main())


def test_r12_client_validates_answer_types_without_assertion_errors(cluster3):
    async def main() -> None:
        bk, fake, real = await _cluster_with_liar(cluster3.metadata_uri)
        try:
            lh = await bk.create_ledger(3, 3, 2, ensemble_bookies=[fake.address, *real[:2]])
            for i in range(5):
                await lh.add_entry(b"t%d" % i)

            def wrong_type(request: Request, honest: Response) -> Response:
                if isinstance(request, ReadLacRequest):
                    return FenceResponse(request.request_id, Status.OK, request.ledger_id, 99, 99)
                return honest

            fake.spoil = wrong_type
            # The reader asks every bookie for the LAC; the fake's answer counts as a
            # failed bookie, the two real ones are enough.
            rh = await bk.open_ledger_no_recovery(lh.ledger_id)
            assert await rh.read_last_add_confirmed() in (3, 4)
            with pytest.raises(ProtocolError, match=f"bookie {fake.address}.*FENCE"):
                await bk.pool.request(fake.address, ReadLacRequest(0, lh.ledger_id), 5_000)
            await lh.close()
        finally:
            fake.stop()
            await bk.close()

    run(main())


def test_r12_client_refuses_an_add_acknowledgement_for_another_ledger(cluster4):
    async def main() -> None:
        bk, fake, real = await _cluster_with_liar(cluster4.metadata_uri)
        try:
            lh = await bk.create_ledger(3, 3, 3, ensemble_bookies=[fake.address, *real[:2]])

            def ack_without_storing(request: Request, honest: Response) -> Response:
                if isinstance(request, AddRequest):
                    fake.entries.clear()  # it kept nothing
                    return AddResponse(
                        request.request_id, Status.OK, request.ledger_id + 1, len(request.entries)
                    )
                return honest

            fake.spoil = ack_without_storing
            assert await lh.add_entry(b"needs three copies") == 0
            # The lie is a failed bookie: the writer replaced it, so the entry is on three
            # real bookies (Qa = 3) and the fake is out of the ensemble.
            md = await bk.ledger_metadata(lh.ledger_id)
            assert fake.address not in md.last_ensemble
            assert fake.address not in lh.ensemble
            await lh.close()
        finally:
            fake.stop()
            await bk.close()

    run(main())
