"""What :class:`~quorumlog.recipes.election.LeaderElection` needs from a way of contending.

An election has one contender per process. The contender owns the session and the
node, follows the line, and tells the election whether it leads through a
``set_leader(bool)`` callable that it calls on the event loop only. The election
keeps the public state (``is_leader``, ``terms``, the callbacks) so that every
contender reports gain and loss the same way.

Two contenders exist: :class:`~quorumlog.recipes.store_election.StoreContender`
(ephemeral sequential entries of a :class:`~quorumlog.meta.store.MetadataStore`, used
on the embedded store) and :class:`~quorumlog.recipes.zk_election.KazooContender`
(kazoo's ``Lock`` recipe, used on ZooKeeper).
"""

from __future__ import annotations

import abc
from collections.abc import Callable

SetLeader = Callable[[bool], None]


class Contender(abc.ABC):
    """One process's place in one election."""

    @property
    @abc.abstractmethod
    def node(self) -> str | None:
        """The name (not path) of this contender's node, None while it has none."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Open the session and create the node; return once the node exists."""

    @abc.abstractmethod
    async def contenders(self) -> list[tuple[str, str]]:
        """``(node name, identifier)`` of every contender, the leader first."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Delete the node, end the session and every task or thread of the contender."""
