"""A bound on how fast re-replication copies, so that repairs do not starve writers.

Copying a lost bookie's data reads from the surviving bookies and writes to the
replacements as fast as the disks allow; the writers sharing those bookies then wait
behind it. BookKeeper bounds it with ``replicationRateByBytes``; here each replication
worker holds one :class:`CopyThrottle`, shared by every ledger and chunk it copies, and
each chunk's bytes are paid for before the chunk is written.

Pacing, not a bucket that fills while idle: a chunk may start once the bytes before it
have had their time at the rate, so a burst after a pause is at most ``burst_s`` worth
of bytes. A chunk larger than that is let through and the next one waits longer (the
rate holds on average; a copy is never split to fit).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

__all__ = ["RATE_BYTES_PER_S_DEFAULT", "CopyThrottle"]

# Per worker. bench/autorecovery_heal.py --writer-rate times a writer on the same bookies
# beside a repair at this rate (docs/PERFORMANCE.md): on one shared disk its p99 moves
# with the disk's stalls more than with the repair, and a small fdatasync's own p99
# rises beside bulk writes at twice this rate (each copied byte is written to the
# target's journal and entry log), which the bench measures first.
RATE_BYTES_PER_S_DEFAULT = 16 * 1024 * 1024
_BURST_S = 0.05


class CopyThrottle:
    """Paces copies to ``bytes_per_s`` (0: no bound). ``clock`` and ``sleep`` default to
    the running event loop's (the simulator's virtual time included)."""

    def __init__(
        self,
        bytes_per_s: int,
        *,
        burst_s: float = _BURST_S,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if bytes_per_s < 0:
            raise ValueError(f"a copy rate of {bytes_per_s} bytes/s: expected 0 (no bound) or more")
        if burst_s < 0:
            raise ValueError(f"a burst of {burst_s} s: expected 0 or more")
        self.bytes_per_s = bytes_per_s
        self._burst_s = burst_s
        self._clock = clock
        self._sleep = sleep
        # When the bytes taken so far have had their time at the rate.
        self._paid_until: float | None = None
        self.waited_s = 0.0  # time copies spent waiting here, for the worker's metrics

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    async def take(self, nbytes: int) -> None:
        """Wait until ``nbytes`` more may be copied, and count them."""
        if self.bytes_per_s == 0 or nbytes <= 0:
            return
        now = self._now()
        # Idle time earns at most burst_s of credit.
        start = now - self._burst_s if self._paid_until is None else self._paid_until
        start = max(start, now - self._burst_s)
        self._paid_until = start + nbytes / self.bytes_per_s
        delay = start - now
        if delay > 0:
            self.waited_s += delay
            await self._sleep(delay)
