"""Which role may send which request: the table a bookie checks after authentication.

BookKeeper's roles, kept small: ``client`` does ledger operations (adds, reads, fences,
LACs, bookie info); ``bookie`` is what re-replication and autorecovery present (reads,
fences, *recovery* adds that copy entries, bookie info, and a ledger's master key, which
those need for a ledger whose password they were not given; never a writer's plain add);
``admin`` may do everything, and alone deletes ledgers (the HTTP admin API also keeps GC,
decommission and the read-only switch to it). A token may carry several roles.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from quorumlog.proto.codec import (
    AddFlag,
    AddRequest,
    BookieInfoRequest,
    DeleteLedgerRequest,
    FenceRequest,
    LedgerKeyRequest,
    ReadLacRequest,
    ReadRequest,
    Request,
    WriteLacRequest,
)


class Role(enum.StrEnum):
    CLIENT = "client"
    ADMIN = "admin"
    BOOKIE = "bookie"


_LEDGER_USERS = frozenset({Role.CLIENT, Role.ADMIN})
_READERS = frozenset({Role.CLIENT, Role.BOOKIE, Role.ADMIN})
_ADMIN_ONLY = frozenset({Role.ADMIN})
_REPAIRERS = frozenset({Role.BOOKIE, Role.ADMIN})


def required_roles(request: Request) -> frozenset[Role]:
    """The roles of which a connection needs one to send ``request``."""
    if isinstance(request, AddRequest):
        # A recovery add writes back an entry that already exists (recovery, copies of
        # re-replication); a plain add is a writer's.
        return _READERS if request.flags & AddFlag.RECOVERY else _LEDGER_USERS
    if isinstance(request, ReadRequest | ReadLacRequest | FenceRequest | BookieInfoRequest):
        return _READERS
    if isinstance(request, WriteLacRequest):
        return _LEDGER_USERS
    if isinstance(request, DeleteLedgerRequest):
        return _ADMIN_ONLY
    if isinstance(request, LedgerKeyRequest):
        # A client holds its own ledgers' passwords; every ledger's key is for repairs.
        return _REPAIRERS
    # A request kind this table does not name yet: admin only (fail closed: a kind added
    # to the protocol stays refused to clients and bookies until it is given its roles).
    return _ADMIN_ONLY


def permitted(request: Request, roles: Iterable[Role]) -> bool:
    return not required_roles(request).isdisjoint(roles)


def parse_roles(claim: object) -> frozenset[Role]:
    """A token's ``role`` claim (one name or a list of names) as roles; ValueError naming
    what is wrong (an unknown role is refused, not ignored: a typo must not pass)."""
    names = [claim] if isinstance(claim, str) else claim
    if not isinstance(names, list) or not names:
        raise ValueError("the token has no role claim (client, admin or bookie)")
    roles: set[Role] = set()
    for name in names:
        try:
            roles.add(Role(name))
        except ValueError:
            raise ValueError(
                f"unknown role {str(name)[:40]!r} in the token (client, admin or bookie)"
            ) from None
    return frozenset(roles)
