"""Chaos for the replicated dice: three ``quorumlog dice`` processes over four bookies.

The harness kill -9s the leader, freezes (SIGSTOP) the next leader past its session
timeout and resumes it, kills a bookie of the current ledger's ensemble, and starts
a late instance. At the end every instance is stopped with SIGTERM and the log is
read (fenced, so it is final). The checker then asks:

- every instance's printed (position, value) sequence is a prefix of the log;
- no two instances show different values at one position;
- no instance prints a position twice;
- the frozen leader prints nothing as leader after it was fenced: whatever it
  printed after SIGCONT is in the log (its last draw, refused by the fence, is not).

Runs on both metadata drivers; the summary line gives the time each took.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from quorumlog.aio import BookKeeper as AsyncBookKeeper
from quorumlog.aio import LogNamespace
from quorumlog.apps.dice import LEADING, Roll
from quorumlog.formats.dice import decode_value
from quorumlog.log.checker import check_observations
from quorumlog.log.position import Position
from quorumlog.server.local_cluster import LocalCluster

INTERVAL_MS = 100
SESSION_TIMEOUT_MS = 1_500
LOG_NAME = "dice"
_ROOT = str(Path(__file__).resolve().parents[2])


class DiceProcess:
    """One ``quorumlog dice --json`` process; its stdout goes to a file."""

    def __init__(self, uri: str, name: str, log_dir: Path) -> None:
        self.name = name
        self.out_path = log_dir / f"{name}.out"
        self.err_path = log_dir / f"{name}.err"
        self.paused = False
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "quorumlog",
                    "dice",
                    "--metadata",
                    uri,
                    "--log",
                    LOG_NAME,
                    "--interval-ms",
                    str(INTERVAL_MS),
                    "--session-timeout-ms",
                    str(SESSION_TIMEOUT_MS),
                    "--json",
                    "--verbose",
                    "--id",
                    name,
                ],
                stdout=out,
                stderr=err,
                env={**os.environ, "PYTHONPATH": _ROOT},
            )

    def rolls(self) -> list[Roll]:
        text = self.out_path.read_text()
        complete = text[: text.rfind("\n") + 1]  # a line being written is read next time
        return [Roll.parse(line) for line in complete.splitlines() if line.strip()]

    def alive(self) -> bool:
        return self.process.poll() is None

    def leading(self) -> list[Roll]:
        return [r for r in self.rolls() if r.role == LEADING]

    def signal(self, signum: int) -> None:
        os.kill(self.process.pid, signum)
        if signum == signal.SIGSTOP:
            self.paused = True
        elif signum == signal.SIGCONT:
            self.paused = False

    def terminate(self) -> int | None:
        if self.alive():
            if self.paused:
                self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.process.wait(timeout=10)
                return None
        return self.process.returncode

    def stderr_tail(self) -> str:
        return self.err_path.read_text(errors="replace")[-3000:]


def wait_until(what: str, predicate: Callable[[], bool], timeout_s: float, procs) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    details = "\n".join(
        f"--- {p.name} (alive={p.alive()}): {len(p.rolls())} rolls\n{p.stderr_tail()}"
        for p in procs
    )
    raise AssertionError(f"{what}: not within {timeout_s} s\n{details}")


def current_leader(procs: list[DiceProcess]) -> DiceProcess | None:
    """The running instance that printed the latest position as leader."""
    best: tuple[Position, DiceProcess] | None = None
    for proc in procs:
        if not proc.alive() or proc.paused:
            continue
        leading = proc.leading()
        if leading and (best is None or leading[-1].position > best[0]):
            best = (leading[-1].position, proc)
    return None if best is None else best[1]


def leads_with(proc: DiceProcess, count: int, after: Position | None = None) -> bool:
    return sum(1 for r in proc.leading() if after is None or r.position > after) >= count


def freeze_leader(leader: DiceProcess, procs: list[DiceProcess], events: list[str]) -> None:
    """SIGSTOP ``leader`` until another instance leads in a later ledger and twice the
    session timeout passed, then SIGCONT it and wait until it prints again (it noticed
    and follows, or leads in a later term)."""
    ledger = leader.leading()[-1].position.ledger_id
    leader.signal(signal.SIGSTOP)
    paused_at = time.monotonic()
    events.append(f"froze leader {leader.name}")
    others = [p for p in procs if p is not leader and p.alive()]
    wait_until(
        f"a new leader while {leader.name} is frozen",
        lambda: any(
            leads_with(p, 5) and p.leading()[-1].position.ledger_id > ledger for p in others
        ),
        30,
        procs,
    )
    time.sleep(max(0.0, 2 * SESSION_TIMEOUT_MS / 1000 - (time.monotonic() - paused_at)))
    printed = len(leader.rolls())
    leader.signal(signal.SIGCONT)
    events.append(f"resumed {leader.name} after {time.monotonic() - paused_at:.1f} s")
    wait_until(
        f"{leader.name} prints again after it resumed",
        lambda: len(leader.rolls()) > printed,
        30,
        procs,
    )


async def final_log(uri: str) -> tuple[list[tuple[Position, int]], list[int]]:
    async with await AsyncBookKeeper.connect(uri) as bk:
        log = await LogNamespace(bk).open_log(LOG_NAME)
        records = await log.read_all(fence=True)
        ledgers = await log.ledgers()
    out = []
    for record in records:
        value = decode_value(record.data)
        assert value is not None and 1 <= value <= 6, record
        out.append((record.position, value))
    return out, ledgers


def test_dice_chaos_every_instance_shows_a_prefix_of_one_log(
    cluster4: LocalCluster, tmp_path: Path
) -> None:
    uri = cluster4.metadata_uri
    started = time.monotonic()
    procs = [DiceProcess(uri, f"d{i}", tmp_path) for i in range(3)]
    events: list[str] = []
    try:
        # 1. A leader emerges and rolls.
        wait_until("a first leader", lambda: current_leader(procs) is not None, 30, procs)
        first = current_leader(procs)
        assert first is not None
        wait_until("10 rolls by the first leader", lambda: leads_with(first, 10), 20, procs)

        # 2. kill -9 the leader: another takes over after the session timeout.
        last_before_kill = first.leading()[-1].position
        first.signal(signal.SIGKILL)
        first.process.wait(timeout=10)
        events.append(f"killed leader {first.name}")
        wait_until(
            "a new leader after kill -9",
            lambda: (
                (c := current_leader(procs)) is not None
                and c is not first
                and leads_with(c, 5, last_before_kill)
            ),
            30,
            procs,
        )
        second = current_leader(procs)
        assert second is not None

        # 3. Freeze that leader past its session timeout; a third leader must take over
        #    (fencing the frozen one's ledger), then the frozen one resumes.
        frozen_ledger = second.leading()[-1].position.ledger_id
        frozen_rolls = len(second.rolls())
        freeze_leader(second, procs, events)

        # 4. Kill a bookie of the ledger being written: the leader changes ensemble.
        leader = current_leader(procs)
        assert leader is not None
        mark = leader.leading()[-1].position

        async def ensemble_of(ledger_id: int) -> tuple[str, ...]:
            async with await AsyncBookKeeper.connect(uri) as bk:
                return (await bk.ledger_metadata(ledger_id)).last_ensemble

        ensemble = asyncio.run(ensemble_of(mark.ledger_id))
        victim = next(b for b in cluster4.bookies if b.address in ensemble)
        cluster4.kill(victim.index)
        events.append(f"killed bookie {victim.address}")
        wait_until(
            "rolls after the bookie died",
            lambda: (c := current_leader(procs)) is not None and leads_with(c, 10, mark),
            30,
            procs,
        )

        # 5. A late instance prints the whole history first.
        history_len = max(len(p.rolls()) for p in procs if p.alive())
        late = DiceProcess(uri, "late", tmp_path)
        procs.append(late)
        events.append("started a late instance")
        wait_until(
            "the late instance caught up", lambda: len(late.rolls()) >= history_len, 30, procs
        )

        # 6. One more freeze of whoever leads now (possibly the late instance).
        leader = current_leader(procs)
        assert leader is not None
        freeze_leader(leader, procs, events)
        time.sleep(1.0)
    finally:
        codes = {p.name: p.terminate() for p in procs}
    elapsed_s = time.monotonic() - started

    # --- the checker
    final, ledgers = asyncio.run(final_log(uri))
    shown = {p.name: [(r.position, r.value) for r in p.rolls()] for p in procs}
    report = check_observations(final, prefixes=shown)
    leader_terms = len({pos.ledger_id for pos, _ in final})
    refused = sum(p.err_path.read_text(errors="replace").count("dice: lost the log") for p in procs)
    events.append(f"{refused} stale leader(s) refused by fencing")
    summary = (
        f"dice chaos ({uri.split(':')[0]}): {report.summary()}; {leader_terms} leader terms "
        f"({leader_terms - 1} leader changes) in {len(ledgers)} ledgers; "
        f"{elapsed_s:.1f} s; events: {'; '.join(events)}"
    )
    print(summary)
    assert report.ok, "\n".join([summary, *report.problems])
    assert report.divergent_positions == 0
    assert leader_terms >= 3  # the first leader, one after the kill, one after the freeze
    assert all(code == 0 for name, code in codes.items() if name != first.name), codes

    # The frozen leader printed nothing as leader after it was fenced: whatever it
    # printed after it resumed is in the log (prefix check), and nothing in its old
    # ledger beyond where the fence closed it.
    old_ledger_end = max(
        (pos.entry_id for pos, _ in final if pos.ledger_id == frozen_ledger), default=-1
    )
    after_resume = second.rolls()[frozen_rolls:]
    stale = [
        r
        for r in after_resume
        if r.role == LEADING
        and r.position.ledger_id == frozen_ledger
        and r.position.entry_id > old_ledger_end
    ]
    assert stale == []
    # Everything the frozen leader printed after resuming came from others or from a
    # later term of its own (it never printed its refused draw).
    assert all(
        r.position.ledger_id != frozen_ledger or r.position.entry_id <= old_ledger_end
        for r in after_resume
    )
    late_rolls = late.rolls()
    assert len(late_rolls) >= history_len and late_rolls[0].position == final[0][0]
