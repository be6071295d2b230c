"""The replicated dice of the BookKeeper tutorial: every instance shows the same rolls.

Every instance joins a leader election. The leader draws a number from 1 to 6 each
interval, appends it to a log stream and shows it once the append is confirmed;
the others tail the log and show what the leader wrote. A new leader first opens
the log for writing, which fences the ledgers of the previous leader (R11), then
shows what it had not seen yet (``catchup``), then leads. A stale leader (frozen
past its session timeout, then resumed) finds its ledger fenced on its next
append and shows nothing more as leader: the value it drew is not in the log.

Each instance remembers the last position it showed and never shows a position
twice or out of order, so what any instance shows is a prefix of the log.

Example::

    dice = Dice(bk, DiceConfig(log_name="dice"), emit=print)
    await dice.run(stop_event)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quorumlog.errors import BKError
from quorumlog.formats.dice import decode_value, encode_value
from quorumlog.log.config import LogConfig
from quorumlog.log.errors import LogFencedError
from quorumlog.log.log import open_log
from quorumlog.log.position import Position, Record
from quorumlog.recipes.election import LeaderElection, StoreFactory

if TYPE_CHECKING:
    from quorumlog.client.bookkeeper import BookKeeper
    from quorumlog.log.log import Log
    from quorumlog.log.reader import LogReader

log = logging.getLogger(__name__)

LEADING = "leading"
FOLLOWING = "following"
CATCHUP = "catchup"


@dataclass(frozen=True, slots=True)
class Roll:
    """One line the application shows."""

    value: int
    position: Position
    role: str

    def text(self) -> str:
        """The tutorial's line: ``Value = 4, epoch = 12, entry = 7, leading``."""
        return (
            f"Value = {self.value}, epoch = {self.position.ledger_id}, "
            f"entry = {self.position.entry_id}, {self.role}"
        )

    def json(self) -> str:
        return json.dumps(
            {
                "value": self.value,
                "ledger": self.position.ledger_id,
                "entry": self.position.entry_id,
                "role": self.role,
            }
        )

    @classmethod
    def parse(cls, line: str) -> Roll:
        """Read back a line in either format (for checkers and tests)."""
        line = line.strip()
        if line.startswith("{"):
            raw = json.loads(line)
            return cls(int(raw["value"]), Position(raw["ledger"], raw["entry"]), raw["role"])
        parts = [p.strip() for p in line.split(",")]
        fields = dict(p.split(" = ", 1) for p in parts[:3])
        return cls(
            int(fields["Value"]), Position(int(fields["epoch"]), int(fields["entry"])), parts[3]
        )


@dataclass
class DiceConfig:
    log_name: str = "dice"
    group: str | None = None  # election group; the log's name by default
    interval_ms: int = 1_000
    session_timeout_ms: int = 2_000
    log_config: LogConfig = field(default_factory=LogConfig)
    # How long one read or wait lasts before leadership and stop are looked at again.
    check_interval_ms: int = 100
    # Stop after showing this many values (0: run until stopped).
    max_values: int = 0


class Dice:
    """One instance of the dice application on an asyncio BookKeeper client."""

    def __init__(
        self,
        bk: BookKeeper,
        config: DiceConfig | None = None,
        emit: Callable[[Roll], None] = lambda roll: print(roll.text(), flush=True),
        *,
        rng: random.Random | None = None,
        identifier: str | None = None,
        status: Callable[[str], None] | None = None,
        notice: Callable[[str], None] | None = None,
        election_source: str | StoreFactory | None = None,
    ) -> None:
        self.bk = bk
        self.config = config or DiceConfig()
        self.emit = emit
        self.rng = rng or random.Random()
        self.identifier = identifier
        # Where the election opens its sessions: the client's store URI by default.
        self.election_source = election_source
        self._status = status or (lambda message: log.info("%s", message))
        # What a user must see even when not asking for role changes: what the leader
        # waits for before it can roll (bookies), and when that wait ends.
        self._notice = notice or (lambda message: log.warning("%s", message))
        self._last_said: str | None = None
        # Writable bookies last seen while too few for a ledger; None when not waiting.
        self._bookies_seen: int | None = None
        self.last_shown: Position | None = None
        self.shown = 0
        self.terms = 0
        self._stop = asyncio.Event()
        self._election: LeaderElection | None = None

    # ------------------------------------------------------------ running

    def status(self, message: str) -> None:
        """Report a role change or a failure; never the same line twice in a row (a
        retry that fails as before five times a second says it once)."""
        if message != self._last_said:
            self._last_said = message
            self._status(message)

    def notice(self, message: str) -> None:
        """Report what the application waits for; like :meth:`status`, only changes."""
        if message != self._last_said:
            self._last_said = message
            self._notice(message)

    def stop(self) -> None:
        """Ask :meth:`run` to finish (it closes the writer and leaves the election)."""
        self._stop.set()

    @property
    def is_leader(self) -> bool:
        return self._election is not None and self._election.is_leader

    async def run(self) -> None:
        """Play until :meth:`stop` (or ``max_values`` shown)."""
        config = self.config
        election = LeaderElection(
            self.election_source or self.bk,
            config.group or config.log_name,
            identifier=self.identifier,
            session_timeout_ms=config.session_timeout_ms,
        )
        self._election = election
        the_log = await open_log(self.bk, config.log_name, config.log_config)
        await election.start()
        self.status(f"dice: joined election {election.group} as {election.node}")
        try:
            for _ in range(10_000_000):  # bounded: each turn leads or follows for a while
                if self._stop.is_set():
                    break
                if election.is_leader:
                    await self._lead(the_log, election)
                else:
                    await self._follow(the_log, election)
        finally:
            await election.close()

    def _done(self) -> bool:
        limit = self.config.max_values
        if limit and self.shown >= limit:
            self._stop.set()
        return self._stop.is_set()

    def _show(self, record: Record, role: str) -> None:
        if self.last_shown is not None and record.position <= self.last_shown:
            return  # shown already (a catch-up overlapping what was followed)
        value = decode_value(record.data)
        if value is None:
            log.warning("dice: record %s is not a roll; skipped", record.position)
            self.last_shown = record.position
            return
        self.last_shown = record.position
        self.shown += 1
        self.emit(Roll(value, record.position, role))

    def _start_after_shown(self) -> Position | None:
        return None if self.last_shown is None else self.last_shown.next()

    # ------------------------------------------------------------ following

    async def _follow(self, the_log: Log, election: LeaderElection) -> None:
        try:
            reader = await the_log.open_reader(self._start_after_shown())
        except BKError as exc:
            self.status(f"dice: cannot read the log: {exc.message}")
            await self._pause()
            return
        try:
            while not self._done() and not election.is_leader:
                record = await reader.read_next(timeout_ms=self.config.check_interval_ms)
                if record is not None:
                    self._show(record, FOLLOWING)
        except BKError as exc:
            self.status(f"dice: reading failed: {exc.message}")
            await self._pause()
        finally:
            with contextlib.suppress(BKError):
                await reader.close()

    # ------------------------------------------------------------ leading

    async def _lead(self, the_log: Log, election: LeaderElection) -> None:
        try:
            writer = await the_log.open_writer()  # fences the previous leader's ledgers
        except LogFencedError as exc:
            self.status(f"dice: another writer took the log first: {exc.message}")
            await self._pause()
            return
        except BKError as exc:
            if not await self._too_few_bookies():
                self.status(f"dice: cannot open the log for writing: {exc.message}")
            await self._pause()
            return
        if self._bookies_seen is not None:
            self._bookies_seen = None
            with contextlib.suppress(BKError):
                writable = len(await self.bk.registry.writable_bookies())
                self.notice(f"dice: {writable} bookies writable: rolling")
        self.terms += 1
        self.status(f"dice: leading, term {self.terms}, ledger {writer.ledger_id}")
        try:
            if not await self._catch_up(the_log, election, Position(writer.ledger_id, 0)):
                return
            interval_s = self.config.interval_ms / 1000
            while election.is_leader and not self._done():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), interval_s)
                if not election.is_leader or self._stop.is_set():
                    break
                value = self.rng.randint(1, 6)
                data = encode_value(value)
                position = await writer.append(data)
                self._show(Record(position, data, writer.last_timestamp_ms), LEADING)
        except LogFencedError as exc:
            self.status(f"dice: lost the log: {exc.message}")
        except BKError as exc:
            self.status(f"dice: leading failed: {exc.message}")
            await self._pause()
        finally:
            self.status("dice: no longer leading")
            with contextlib.suppress(BKError, TimeoutError):
                await asyncio.wait_for(writer.close(), 5)

    async def _catch_up(self, the_log: Log, election: LeaderElection, end: Position) -> bool:
        """Show every record before ``end`` not shown yet. False if leadership went."""
        reader: LogReader = await the_log.open_reader(self._start_after_shown())
        try:
            for _ in range(10_000_000):  # bounded; ends at ``end`` (earlier ledgers are closed)
                if reader.position >= end:
                    return True
                if not election.is_leader or self._stop.is_set():
                    return False
                record = await reader.read_next(timeout_ms=self.config.check_interval_ms)
                if record is None:
                    continue
                if record.position >= end:
                    return True
                self._show(record, CATCHUP)
            return False
        finally:
            with contextlib.suppress(BKError):
                await reader.close()

    async def _too_few_bookies(self) -> bool:
        """Whether fewer bookies are writable than a ledger of the log needs; if so, say
        what the leader waits for: once, then again only when the count changes."""
        needed = self.config.log_config.ensemble
        try:
            writable = len(await self.bk.registry.writable_bookies())
        except BKError:
            return False
        if writable >= needed:
            return False
        if self._bookies_seen is None:
            self.notice(
                f"dice: waiting for bookies: each ledger of the log {self.config.log_name!r} "
                f"needs {needed} writable bookies (--ensemble {needed}) and {writable} are "
                f"writable; start some (quorumlog localbookie {needed}, or quorumlog bookie)"
            )
        elif writable != self._bookies_seen:
            self.notice(f"dice: waiting for bookies: {writable} of the {needed} needed writable")
        self._bookies_seen = writable
        return True

    async def _pause(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), self.config.check_interval_ms / 1000 * 2)


__all__ = ["CATCHUP", "FOLLOWING", "LEADING", "Dice", "DiceConfig", "Roll"]
