"""Recipes on the metadata store: leader election.

:class:`LeaderElection` is the asyncio recipe; :mod:`quorumlog.recipes.sync` has the
blocking one with the same names.
"""

from quorumlog.recipes.election import LeaderElection

__all__ = ["LeaderElection"]
