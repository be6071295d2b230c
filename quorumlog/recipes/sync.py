"""The synchronous leader election: the asyncio recipe run on a client's loop thread.

Example::

    from quorumlog import BookKeeper
    from quorumlog.recipes.sync import LeaderElection

    with BookKeeper() as bk, LeaderElection(bk, "jobs") as election:
        if election.wait_for_leadership(timeout_s=10):
            ...

Callbacks run on the loop thread: keep them short (set a flag, put on a queue).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quorumlog.client.sync import LoopThread
from quorumlog.recipes import election as _aio

if TYPE_CHECKING:
    from quorumlog.client.sync import BookKeeper


class LeaderElection:
    """See :class:`quorumlog.recipes.election.LeaderElection`; same names, blocking calls."""

    def __init__(
        self,
        source: BookKeeper | str,
        group: str,
        *,
        identifier: str | None = None,
        session_timeout_ms: int = 2_000,
        on_gain: _aio.Callback | None = None,
        on_loss: _aio.Callback | None = None,
    ) -> None:
        if isinstance(source, str):
            self._runner = LoopThread("quorumlog-election")
            self._own_runner = True
            uri = source
        else:
            self._runner = source._runner
            self._own_runner = False
            uri = source.metadata_uri

        async def build() -> _aio.LeaderElection:
            return _aio.LeaderElection(
                uri,
                group,
                identifier=identifier,
                session_timeout_ms=session_timeout_ms,
                on_gain=on_gain,
                on_loss=on_loss,
            )

        self._election = self._runner.run(build())

    @property
    def aio(self) -> _aio.LeaderElection:
        return self._election

    @property
    def is_leader(self) -> bool:
        return self._election.is_leader

    @property
    def identifier(self) -> str:
        return self._election.identifier

    def start(self) -> None:
        self._runner.run(self._election.start())

    def wait_for_leadership(self, timeout_s: float | None = None) -> bool:
        return self._runner.run(self._election.wait_for_leadership(timeout_s))

    def contenders(self) -> list[tuple[str, str]]:
        return self._runner.run(self._election.contenders())

    def close(self) -> None:
        try:
            self._runner.run(self._election.close())
        finally:
            if self._own_runner:
                self._runner.stop()

    def __enter__(self) -> LeaderElection:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
