"""The start-up cookie check: are these the directories this bookie had last time?

A cookie is a small record written on a bookie's first start, with a random
instance id, its address and its directories. One copy goes into the data
directory, one into the journal directory, one into the metadata store under
the bookie's address. At every later start the three must agree:

- no copy anywhere: a new bookie; all three are written;
- the store has a copy but a directory has none: that directory was wiped or
  replaced; starting would answer "no such entry" for entries this bookie
  acknowledged (BookKeeper #2612), so the bookie refuses;
- a directory's copy differs from the store's (another instance id, address or
  directory): a directory of another bookie, or another address; refuse;
- the directories have copies but the store has none: the wrong metadata store
  (or this bookie's record was removed); refuse.

Every refusal is a :class:`BookieStartError` whose message says what differs.
The cookie itself and the comparison of the local copies are
:mod:`quorumlog.bookie.cookie`; this module adds the metadata store's copy.
"""

from __future__ import annotations

from typing import Protocol

from quorumlog.bookie.bookie import BookieStartError
from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.cookie import (
    Cookie,
    check_directories,
    new_cookie,
    read_cookie,
    write_cookie,
)
from quorumlog.errors import MetadataVersionError, NodeExistsError
from quorumlog.meta.store import Versioned


class CookieRegistry(Protocol):
    async def read_cookie(self, address: str) -> Versioned | None: ...

    async def write_cookie(self, address: str, data: bytes, version: int) -> int: ...


def _cookie_port(cookie: Cookie) -> int | None:
    _, _, port = cookie.address.rpartition(":")
    return int(port) if port.isdigit() else None


def _local_cookie(config: BookieConfig) -> Cookie | None:
    return read_cookie(config.data_dir) or read_cookie(config.journal_path)


def recorded_port(config: BookieConfig) -> int | None:
    """The port in the directories' cookie (this bookie's identity), if any."""
    try:
        cookie = _local_cookie(config)
    except BookieStartError:
        return None  # reported by the full check
    return _cookie_port(cookie) if cookie is not None else None


async def verify_or_create(registry: CookieRegistry, config: BookieConfig, address: str) -> None:
    """Check the cookies as described in the module docstring, or write them on first start."""
    data_dir, journal_dir = config.data_dir, config.journal_path
    stored = await registry.read_cookie(address)

    if stored is None:
        local = _local_cookie(config)
        if local is not None:
            if local.address != address:
                host, _, port = local.address.rpartition(":")
                raise BookieStartError(
                    f"bookie {address}: the cookie in {data_dir} belongs to bookie "
                    f"{local.address}; start it with that address (--advertised-address "
                    f"{host} --port {port}) or use empty directories"
                )
            raise BookieStartError(
                f"bookie {address}: data directory {data_dir} holds a cookie (instance "
                f"{local.instance_id}) but the metadata store has none for this bookie: "
                f"wrong metadata store, or its record was removed"
            )
        # Directories first: an unusable one must refuse before the store records a cookie.
        for directory in (data_dir, journal_dir):
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise BookieStartError(
                    f"bookie {address}: cannot create {directory}: {exc}"
                ) from None
        cookie = new_cookie(address, data_dir, journal_dir)
        try:
            await registry.write_cookie(address, cookie.to_bytes(), -1)
        except (MetadataVersionError, NodeExistsError):
            raise BookieStartError(
                f"bookie {address}: another process wrote this bookie's cookie at the same "
                f"time; is a second bookie starting with the same address?"
            ) from None
        directories = [data_dir]
        if journal_dir.resolve() != data_dir.resolve():
            directories.append(journal_dir)
        for directory in directories:
            try:
                write_cookie(directory, cookie)
            except OSError as exc:
                raise BookieStartError(
                    f"bookie {address}: cannot write the cookie into {directory}: {exc}"
                ) from None
        return

    expected = Cookie.from_bytes(
        stored.data, f"the cookie of bookie {address} in the metadata store"
    )
    problem = check_directories(data_dir, journal_dir, expected)
    if problem:
        raise BookieStartError(f"bookie {address}: {problem}")
