"""Cookies: which bookie a data or journal directory belongs to.

On its first start a bookie writes a small file, ``COOKIE``, into its data
directory and its journal directory: a random instance id, the bookie's
address, and both directory paths (JSON). At every later start the copies must
agree with each other, with the directories they sit in, and with the copy the
server keeps in the metadata store. A directory without a cookie next to one
that has it was wiped or replaced: serving from it would answer "no such
entry" for entries this bookie acknowledged (BookKeeper #2612), so the bookie
refuses to start.

This module is the pure part: build, read, write and compare cookies, and say
in words what differs. Example::

    expected = read_cookie(data_dir)
    problem = check_directories(data_dir, journal_dir, expected)
    if problem:
        raise BookieStartError(problem)
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from quorumlog.bookie.errors import BookieStartError

COOKIE_FILE_NAME = "COOKIE"
LAYOUT_VERSION = 1


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
    def from_bytes(cls, data: bytes, where: str = "cookie") -> Cookie:
        try:
            raw = json.loads(data)
            known = {f.name for f in fields(cls)}
            return cls(**{k: v for k, v in raw.items() if k in known})
        except (ValueError, TypeError, AttributeError) as exc:
            raise BookieStartError(f"{where} is unreadable: {exc}") from None


def new_cookie(address: str, data_dir: Path, journal_dir: Path) -> Cookie:
    """A cookie for a bookie starting for the first time (a fresh instance id)."""
    return Cookie(
        address=address,
        instance_id=uuid.uuid4().hex,
        data_dir=str(Path(data_dir).resolve()),
        journal_dir=str(Path(journal_dir).resolve()),
    )


def read_cookie(directory: Path) -> Cookie | None:
    """The cookie in ``directory``, or None if it has none."""
    path = Path(directory) / COOKIE_FILE_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BookieStartError(f"cannot read cookie {path}: {exc}") from None
    return Cookie.from_bytes(data, f"cookie {path}")


def write_cookie(directory: Path, cookie: Cookie) -> None:
    """Write atomically: temporary file, fsync, rename, fsync of the directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (COOKIE_FILE_NAME + ".tmp")
    with open(tmp, "wb") as f:
        f.write(cookie.to_bytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / COOKIE_FILE_NAME)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def differences(expected: Cookie, found: Cookie) -> list[str]:
    """``field: expected 'a', found 'b'`` for every field that differs."""
    out = []
    for f in fields(Cookie):
        want, got = getattr(expected, f.name), getattr(found, f.name)
        if want != got:
            out.append(f"{f.name}: expected {want!r}, found {got!r}")
    return out


def check_directories(
    data_dir: Path, journal_dir: Path, expected: Cookie | None = None
) -> str | None:
    """What is wrong with the directories' cookies, in words; None when all is well.

    ``expected``: the copy kept elsewhere (the metadata store), if any. With no
    cookie anywhere and nothing expected, this is a new bookie: no problem.
    """
    data_dir, journal_dir = Path(data_dir), Path(journal_dir)
    same_dir = data_dir.resolve() == journal_dir.resolve()
    data_cookie = read_cookie(data_dir)
    journal_cookie = data_cookie if same_dir else read_cookie(journal_dir)
    named = [
        ("data directory", data_dir, data_cookie),
        ("journal directory", journal_dir, journal_cookie),
    ]
    problems: list[str] = []

    if data_cookie is None and journal_cookie is None:
        if expected is None:
            return None
        return (
            f"data directory {data_dir} and journal directory {journal_dir} have no cookie but "
            f"bookie {expected.address} has one (instance {expected.instance_id}): were they "
            f"wiped or replaced?"
        )
    for (name, directory, cookie), (other_name, other_dir, other) in (
        (named[0], named[1]),
        (named[1], named[0]),
    ):
        if cookie is None and other is not None:
            problems.append(
                f"{name} {directory} has no cookie but {other_name} {other_dir} does "
                f"(instance {other.instance_id}): was it wiped?"
            )
    if problems:
        return "; ".join(problems)
    assert data_cookie is not None and journal_cookie is not None
    diff = differences(data_cookie, journal_cookie)
    if diff:
        return (
            f"the cookies of data directory {data_dir} and journal directory {journal_dir} "
            f"differ ({'; '.join(diff)}): the directories belong to different bookies"
        )
    actual = {"data_dir": str(data_dir.resolve()), "journal_dir": str(journal_dir.resolve())}
    for key, path in actual.items():
        recorded = getattr(data_cookie, key)
        if recorded != path:
            problems.append(f"the cookie records {key} {recorded!r} but it is {path!r}")
    if expected is not None:
        diff = differences(expected, data_cookie)
        if diff:
            problems.append(
                f"the directories' cookie differs from bookie {expected.address}'s: "
                + "; ".join(diff)
            )
    return "; ".join(problems) if problems else None
