"""A token-checking bookie process seen by an attacker on its port: raw frames written on a
plain socket, in one write each, so that requests arrive pipelined with (or before) the
AUTH frame in the same segment. One bookie (sqlite metadata: nothing here depends on
the driver), a client token, a bookie token and an admin token of the bookie's key, and
a long-lived good connection that must be served from start to end.
"""

from __future__ import annotations

import asyncio
import struct
import time
from pathlib import Path

from support import run
from tls_certs import HMAC_SECRET, write_hmac_key

from quorumlog.errors import Status
from quorumlog.proto.codec import (
    MASTER_KEY_SIZE,
    AddFlag,
    AddRequest,
    AuthRequest,
    AuthResponse,
    BookieInfoRequest,
    DeleteLedgerRequest,
    FrameDecoder,
    Message,
    ReadFlag,
    ReadRequest,
    WriteLacRequest,
    encode,
)
from quorumlog.security import Role, issue_token
from quorumlog.server.local_cluster import LocalCluster

KEY = bytes(MASTER_KEY_SIZE)
ANSWER_TIMEOUT_S = 10.0
LEDGER_ID = 77


def _auth(request_id: int, token: str) -> bytes:
    return encode(AuthRequest(request_id, token.encode("ascii")))


def _token(*roles: Role, key: bytes = HMAC_SECRET, expires_in_s: float = 600) -> str:
    return issue_token(key, roles, subject="tester", expires_at_s=time.time() + expires_in_s)


class RawConnection:
    """A plain socket to the bookie: bytes out in one write, decoded answers in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder()
        self.answers: list[Message] = []

    @classmethod
    async def open(cls, address: str) -> RawConnection:
        host, port = address.rsplit(":", 1)
        return cls(*await asyncio.open_connection(host, int(port)))

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def answers_until(self, count: int) -> list[Message]:
        """The next ``count`` answers (fewer if the bookie closes first)."""
        async with asyncio.timeout(ANSWER_TIMEOUT_S):
            while len(self.answers) < count:
                data = await self.reader.read(65536)
                if not data:
                    break
                self.answers.extend(self.decoder.feed(data))
        taken, self.answers = self.answers[:count], self.answers[count:]
        return taken

    async def closed_by_bookie(self) -> bool:
        """Whether the bookie closed (EOF after any answers still on the way)."""
        try:
            async with asyncio.timeout(ANSWER_TIMEOUT_S):
                while data := await self.reader.read(65536):
                    self.answers.extend(self.decoder.feed(data))
        except ConnectionError:
            pass
        return True

    def close(self) -> None:
        self.writer.close()


def _statuses(answers: list[Message]) -> list[tuple[str, int, int]]:
    return [(type(a).__name__, a.request_id, a.status) for a in answers]  # type: ignore[union-attr]


async def _scenario(address: str) -> None:
    client, bookie, admin = _token(Role.CLIENT), _token(Role.BOOKIE), _token(Role.ADMIN)
    unauthorized = Status.UNAUTHORIZED
    # A good connection opened first: the bookie must serve it after every refusal below.
    good = await RawConnection.open(address)
    await good.send(_auth(1, client) + encode(BookieInfoRequest(2)))
    assert _statuses(await good.answers_until(2)) == [
        ("AuthResponse", 1, Status.OK),
        ("BookieInfoResponse", 2, Status.OK),
    ]

    # A connection whose token expires while the steps below run (exp counts in seconds).
    short = await RawConnection.open(address)
    await short.send(_auth(1, _token(Role.CLIENT, expires_in_s=2)))
    assert _statuses(await short.answers_until(1)) == [("AuthResponse", 1, Status.OK)]

    # 1. Requests pipelined before the AUTH, in the same segment: none is served, the
    # first gets its refusal (and the reason on request id 0), the connection closes.
    for before, answer_name in [
        (BookieInfoRequest(1), "BookieInfoResponse"),
        (AddRequest(1, LEDGER_ID, KEY, [b"x"]), "AddResponse"),
        (ReadRequest(1, LEDGER_ID, 0, flags=ReadFlag.FENCE, master_key=KEY), "ReadResponse"),
        (DeleteLedgerRequest(1, LEDGER_ID, KEY), "StatusResponse"),
    ]:
        raw = await RawConnection.open(address)
        await raw.send(encode(before) + _auth(2, admin) + encode(BookieInfoRequest(3)))
        assert await raw.closed_by_bookie()
        answers = raw.answers
        assert _statuses(answers)[1:] == [(answer_name, 1, unauthorized)], before
        assert isinstance(answers[0], AuthResponse) and answers[0].request_id == 0
        assert "authentication required" in answers[0].reason
        raw.close()

    # 2. AUTH and requests in one segment: served in order, after the AUTH.
    raw = await RawConnection.open(address)
    await raw.send(
        _auth(1, client)
        + encode(BookieInfoRequest(2))
        + encode(DeleteLedgerRequest(3, LEDGER_ID, KEY))
        + encode(AddRequest(4, LEDGER_ID, KEY, [b"e0"]))
    )
    got = _statuses(await raw.answers_until(4))
    assert got[:3] == [
        ("AuthResponse", 1, Status.OK),
        ("BookieInfoResponse", 2, Status.OK),
        ("StatusResponse", 3, unauthorized),  # a client deletes no ledger on bookies
    ]
    assert got[3][:2] == ("AddResponse", 4) and got[3][2] != unauthorized
    # 3. A second AUTH with another key's token on the authenticated connection: refused
    # and closed; the request after it in the same write is not served.
    await raw.send(
        _auth(5, _token(Role.ADMIN, key=b"another-key-of-32-bytes-or-more-!!"))
        + encode(BookieInfoRequest(6))
    )
    assert await raw.closed_by_bookie()
    assert _statuses(raw.answers) == [("AuthResponse", 5, unauthorized)]
    assert "signature" in raw.answers[0].reason  # type: ignore[union-attr]
    raw.close()

    # 4. A second, weaker token replaces the first: admin, then client, cannot delete.
    raw = await RawConnection.open(address)
    await raw.send(
        _auth(1, admin) + _auth(2, client) + encode(DeleteLedgerRequest(3, LEDGER_ID, KEY))
    )
    assert _statuses(await raw.answers_until(3)) == [
        ("AuthResponse", 1, Status.OK),
        ("AuthResponse", 2, Status.OK),
        ("StatusResponse", 3, unauthorized),
    ]
    raw.close()

    # 5. The bookie role: reads (fencing too) and recovery adds, never a writer's add,
    # a LAC write or a delete.
    raw = await RawConnection.open(address)
    await raw.send(
        _auth(1, bookie)
        + encode(AddRequest(2, LEDGER_ID, KEY, [b"e1"]))
        + encode(WriteLacRequest(3, LEDGER_ID, KEY, 0))
        + encode(DeleteLedgerRequest(4, LEDGER_ID, KEY))
        + encode(AddRequest(5, LEDGER_ID, KEY, [b"e1"], flags=AddFlag.RECOVERY))
        + encode(ReadRequest(6, LEDGER_ID, 0, flags=ReadFlag.FENCE, master_key=KEY))
    )
    got = _statuses(await raw.answers_until(6))
    assert got[:4] == [
        ("AuthResponse", 1, Status.OK),
        ("AddResponse", 2, unauthorized),
        ("StatusResponse", 3, unauthorized),
        ("StatusResponse", 4, unauthorized),
    ]
    assert [(name, rid) for name, rid, _ in got[4:]] == [("AddResponse", 5), ("ReadResponse", 6)]
    assert unauthorized not in [status for _, _, status in got[4:]]
    raw.close()

    # 6. Malformed AUTH frames: a credential length that disagrees with the frame, one
    # over the limit, a frame cut short by the end of the stream. Each closes its
    # connection; nothing after it is served.
    # A frame: length (4 bytes), then version, op, request id (10), then AUTH's body:
    # auth version, mechanism, credential length (4), credential.
    auth_frame = _auth(1, client)
    lying_length = auth_frame[:16] + struct.pack(">H", 9) + auth_frame[18:]
    oversized = struct.pack(">I", 10 + 4 + 20_000) + auth_frame[4:14]
    oversized += struct.pack(">BBH", 1, 1, 20_000) + b"a" * 20_000
    for frame in [lying_length, oversized]:
        raw = await RawConnection.open(address)
        await raw.send(frame + encode(BookieInfoRequest(2)))
        assert await raw.closed_by_bookie()
        assert raw.answers == [], frame[:20]
        raw.close()
    raw = await RawConnection.open(address)
    await raw.send(auth_frame[: len(auth_frame) // 2])
    raw.writer.write_eof()
    assert await raw.closed_by_bookie()
    assert raw.answers == []
    raw.close()

    # 7. A first frame larger than any AUTH (an 8 MiB ADD) is not buffered up to its
    # length before a token: the bookie closes as soon as it holds more than an AUTH.
    raw = await RawConnection.open(address)
    big_add = struct.pack(">I", 8 * 1024 * 1024 - 4) + encode(BookieInfoRequest(1))[4:]
    await raw.send(big_add + b"x" * (256 * 1024))
    assert await raw.closed_by_bookie()
    assert _statuses(raw.answers) == [("AuthResponse", 0, unauthorized)]
    assert "before a token" in raw.answers[0].reason  # type: ignore[union-attr]
    raw.close()

    # The good connection is still served.
    await good.send(encode(BookieInfoRequest(3)))
    assert _statuses(await good.answers_until(1)) == [("BookieInfoResponse", 3, Status.OK)]
    good.close()

    # The expired token's connection is told so (request id 0) and closed.
    assert await short.closed_by_bookie()
    assert _statuses(short.answers) == [("AuthResponse", 0, unauthorized)]
    assert short.answers[0].reason == "token expired"  # type: ignore[union-attr]
    short.close()


def test_auth_every_request_before_auth_is_refused_and_roles_hold_on_the_wire(
    tmp_path: Path,
):
    key_file = write_hmac_key(tmp_path)
    metadata_uri = f"sqlite://{tmp_path / 'metadata.db'}"
    with LocalCluster(metadata_uri, tmp_path / "cluster", 0) as cluster:
        cluster.start_new_bookie(["--token-key-file", str(key_file)])
        run(_scenario(cluster.addresses[0]))


async def _idle_connections_scenario(address: str, max_connections: int) -> None:
    good = await RawConnection.open(address)
    await good.send(_auth(1, _token(Role.CLIENT)))
    assert _statuses(await good.answers_until(1)) == [("AuthResponse", 1, Status.OK)]
    # Peers without a token take every other slot and say nothing.
    idle = [await RawConnection.open(address) for _ in range(max_connections - 1)]
    # Each is told why and closed at its deadline, which frees the slots.
    for raw in idle:
        assert await raw.closed_by_bookie()
        assert _statuses(raw.answers) == [("AuthResponse", 0, Status.UNAUTHORIZED)]
        assert "no token" in raw.answers[0].reason  # type: ignore[union-attr]
        raw.close()
    late = await RawConnection.open(address)
    await late.send(_auth(1, _token(Role.CLIENT)) + encode(BookieInfoRequest(2)))
    assert _statuses(await late.answers_until(2)) == [
        ("AuthResponse", 1, Status.OK),
        ("BookieInfoResponse", 2, Status.OK),
    ]
    late.close()
    # The authenticated connection outlived the deadline.
    await good.send(encode(BookieInfoRequest(2)))
    assert _statuses(await good.answers_until(1)) == [("BookieInfoResponse", 2, Status.OK)]
    good.close()


def test_auth_connections_without_a_token_cannot_hold_the_bookies_slots(tmp_path: Path):
    key_file = write_hmac_key(tmp_path)
    metadata_uri = f"sqlite://{tmp_path / 'metadata.db'}"
    max_connections = 4
    with LocalCluster(metadata_uri, tmp_path / "cluster", 0) as cluster:
        flags = [
            "--token-key-file", str(key_file),
            "--max-connections", str(max_connections),
            "--auth-timeout-ms", "500",
        ]  # fmt: skip
        cluster.start_new_bookie(flags)
        run(_idle_connections_scenario(cluster.addresses[0], max_connections))
