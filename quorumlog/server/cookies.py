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
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Protocol

from quorumlog.bookie.bookie import BookieStartError
from quorumlog.bookie.config import BookieConfig
from quorumlog.errors import MetadataVersionError, NodeExistsError
from quorumlog.meta.store import Versioned

COOKIE_FILE_NAME = "COOKIE"
LAYOUT_VERSION = 1


class CookieRegistry(Protocol):
    async def read_cookie(self, address: str) -> Versioned | None: ...

    async def write_cookie(self, address: str, data: bytes, version: int) -> int: ...


@dataclass(frozen=True, slots=True)
class Cookie:
    address: str
    instance_id: str
    data_dir: str
    journal_dir: str
    layout_version: int = LAYOUT_VERSION

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode() + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Cookie:
        try:
            raw = json.loads(data)
            names = {f.name for f in fields(cls)}
            return cls(**{k: v for k, v in raw.items() if k in names})
        except (ValueError, TypeError) as exc:
            raise BookieStartError(f"cookie {where} is unreadable: {exc}") from None

    def port(self) -> int | None:
        _, _, port = self.address.rpartition(":")
        return int(port) if port.isdigit() else None

    def differences(self, other: Cookie) -> list[str]:
        """``field: mine != other's`` for every field that differs."""
        out = []
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if a != b:
                out.append(f"{f.name} {a!r} != {b!r}")
        return out


def _dirs(config: BookieConfig) -> list[tuple[str, Path]]:
    return [("data directory", config.data_dir), ("journal directory", config.journal_path)]


def read_local(directory: Path) -> Cookie | None:
    path = directory / COOKIE_FILE_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BookieStartError(f"cannot read cookie {path}: {exc}") from None
    return Cookie.from_bytes(data, str(path))


def write_local(directory: Path, cookie: Cookie) -> None:
    """Write atomically (temporary file, fsync, rename, fsync the directory)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / COOKIE_FILE_NAME
    tmp = directory / (COOKIE_FILE_NAME + ".tmp")
    with open(tmp, "wb") as f:
        f.write(cookie.to_bytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def recorded_port(config: BookieConfig) -> int | None:
    """The port in the data directory's cookie (this bookie's identity), if any."""
    for _, directory in _dirs(config):
        try:
            cookie = read_local(directory)
        except BookieStartError:
            continue  # reported by the full check
        if cookie is not None:
            return cookie.port()
    return None


def _new_cookie(config: BookieConfig, address: str) -> Cookie:
    return Cookie(
        address=address,
        instance_id=uuid.uuid4().hex,
        data_dir=str(config.data_dir.resolve()),
        journal_dir=str(config.journal_path.resolve()),
    )


def _expected(config: BookieConfig, address: str, instance_id: str) -> Cookie:
    return Cookie(
        address=address,
        instance_id=instance_id,
        data_dir=str(config.data_dir.resolve()),
        journal_dir=str(config.journal_path.resolve()),
    )


async def verify_or_create(registry: CookieRegistry, config: BookieConfig, address: str) -> None:
    """Check the cookies as described in the module docstring, or write them on first start."""
    local = {name: (directory, read_local(directory)) for name, directory in _dirs(config)}
    stored = await registry.read_cookie(address)

    if stored is None:
        present = [f"{name} {d}" for name, (d, c) in local.items() if c is not None]
        if present:
            recorded = next(c for _, c in local.values() if c is not None)
            assert recorded is not None
            if recorded.address != address:
                raise BookieStartError(
                    f"bookie {address}: the cookie in {', '.join(present)} belongs to bookie "
                    f"{recorded.address}; start it with that address (--port "
                    f"{recorded.port()}) or use empty directories"
                )
            raise BookieStartError(
                f"bookie {address}: {' and '.join(present)} hold a cookie but the metadata "
                f"store has none for this bookie: wrong metadata store, or its record was "
                f"removed"
            )
        new = _new_cookie(config, address)
        try:
            await registry.write_cookie(address, new.to_bytes(), -1)
        except (MetadataVersionError, NodeExistsError):
            raise BookieStartError(
                f"bookie {address}: another process wrote this bookie's cookie at the same "
                f"time; is a second bookie starting with the same address?"
            ) from None
        for directory, _ in local.values():
            write_local(directory, new)
        return

    remote = Cookie.from_bytes(stored.data, f"of bookie {address} in the metadata store")
    expected = _expected(config, address, remote.instance_id)
    problems = []
    for name, (directory, cookie) in local.items():
        if cookie is None:
            problems.append(
                f"{name} {directory} has no cookie (wiped or replaced?) but the metadata "
                f"store has one for this bookie (instance {remote.instance_id})"
            )
            continue
        diff = cookie.differences(remote)
        if diff:
            problems.append(
                f"{name} {directory}: cookie differs from the metadata store's: " + "; ".join(diff)
            )
            continue
        diff = expected.differences(cookie)
        if diff:
            problems.append(f"{name} {directory}: cookie records " + "; ".join(diff))
    if problems:
        raise BookieStartError(f"bookie {address}: " + " | ".join(problems))
