"""Both spellings of an absolute SQLite path open one store, for bookies and clients."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from quorumlog.errors import InvalidArgumentError
from quorumlog.meta.factory import open_store
from quorumlog.meta.sqlite_store import db_path_from_uri


def test_three_and_four_slashes_name_the_same_file() -> None:
    assert db_path_from_uri("sqlite:///tmp/x/meta.db") == "/tmp/x/meta.db"
    assert db_path_from_uri("sqlite:////tmp/x/meta.db") == "/tmp/x/meta.db"
    with pytest.raises(InvalidArgumentError, match=r"expected sqlite:///absolute/path\.db"):
        db_path_from_uri("sqlite://tmp/x/meta.db")


def test_a_client_opens_with_four_slashes_the_store_a_bookie_made(tmp_path: Path) -> None:
    """A bookie creates the store (create=True) and a client opens an existing one only
    (create=False, SQLite's URI form): once, the second failed on four slashes with
    'invalid uri authority'."""

    async def main() -> bytes:
        made = await open_store(f"sqlite://{tmp_path}/meta.db")  # tmp_path: /...
        try:
            await made.create("/kept", b"here")
        finally:
            await made.close()
        opened = await open_store(f"sqlite:///{tmp_path}/meta.db", create=False)
        try:
            return (await opened.get("/kept")).data
        finally:
            await opened.close()

    assert asyncio.run(main()) == b"here"
