"""The leader election recipe on both metadata drivers, in one process and across
real processes (kill -9 and SIGSTOP of the leader).

Run as a script, this file is one contender: it joins the election and prints
``leader <t>`` / ``follower <t>`` on every change (``t``: monotonic seconds), until
SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SESSION_TIMEOUT_MS = 1_000
_ROOT = str(Path(__file__).resolve().parents[2])


# ---------------------------------------------------------------- the contender process


async def _contend(uri: str, group: str, name: str) -> None:
    from quorumlog.recipes.election import LeaderElection

    def say(what: str) -> None:
        print(f"{what} {time.monotonic():.3f}", flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    election = LeaderElection(
        uri,
        group,
        identifier=name,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        on_gain=lambda: say("leader"),
        on_loss=lambda: say("follower"),
    )
    await election.start()
    say("joined")
    await stop.wait()
    await election.close()
    say("closed")


class ContenderProcess:
    def __init__(self, uri: str, group: str, name: str, log_dir: Path) -> None:
        self.name = name
        self.out_path = log_dir / f"{name}.out"
        self.err_path = log_dir / f"{name}.err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, __file__, uri, group, name],
                stdout=out,
                stderr=err,
                env={**os.environ, "PYTHONPATH": _ROOT},
            )

    def lines(self) -> list[tuple[str, float]]:
        out = []
        for line in self.out_path.read_text().splitlines():
            what, _, when = line.partition(" ")
            out.append((what, float(when)))
        return out

    def state(self) -> str | None:
        states = [w for w, _ in self.lines() if w in ("leader", "follower")]
        return states[-1] if states else None

    def wait_for(self, predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.02)
        raise AssertionError(
            f"{self.name}: {what} not seen in {timeout_s} s; out={self.lines()} "
            f"err={self.err_path.read_text()[-2000:]}"
        )

    def signal(self, signum: int) -> None:
        os.kill(self.process.pid, signum)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


@pytest.fixture
def contenders(metadata_uri: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    started: list[ContenderProcess] = []

    def start(name: str) -> ContenderProcess:
        proc = ContenderProcess(metadata_uri, "group", name, tmp_path)
        started.append(proc)
        proc.wait_for(lambda: any(w == "joined" for w, _ in proc.lines()), 30, "joined")
        return proc

    yield start
    for proc in started:
        proc.stop()


# ---------------------------------------------------------------- tests


def test_election_in_one_process_gain_loss_and_callbacks(metadata_uri: str) -> None:
    from quorumlog.recipes.election import LeaderElection

    # Sessions of 30 s: a handover by a watch is told from one by a session timeout (or
    # a periodic re-check, every half session) with a bound generous for a shared machine.
    session_timeout_ms = 30_000

    async def main() -> None:
        events: list[str] = []
        first = LeaderElection(
            metadata_uri,
            "jobs",
            identifier="first",
            session_timeout_ms=session_timeout_ms,
            on_gain=lambda: events.append("first gains"),
            on_loss=lambda: events.append("first loses"),
        )
        second = LeaderElection(
            metadata_uri,
            "jobs",
            identifier="second",
            session_timeout_ms=session_timeout_ms,
            on_gain=lambda: events.append("second gains"),
        )
        await first.start()
        await second.start()
        assert await first.wait_for_leadership(30)  # the only contender: a bound, not a target
        assert not second.is_leader
        assert [ident for _, ident in await second.contenders()] == ["first", "second"]
        started = time.monotonic()
        await first.close()
        assert await second.wait_for_leadership(30)
        handover_s = time.monotonic() - started
        assert events == ["first gains", "first loses", "second gains"]
        await second.close()
        print(f"handover after close: {handover_s * 1000:.0f} ms")
        assert handover_s < 10.0  # a watch, not a 30 s session timeout or a 15 s re-check

    asyncio.run(main())


def test_election_killed_leader_is_replaced_after_its_session_timeout(contenders) -> None:  # type: ignore[no-untyped-def]
    from support import holds_for  # tests/ is on the path under pytest, not in the script

    a = contenders("a")
    a.wait_for(lambda: a.state() == "leader", 10, "a leads")
    b = contenders("b")
    holds_for(lambda: b.state() is None, duration_s=0.3, what="b waits in line while a leads")
    killed_at = time.monotonic()
    a.signal(signal.SIGKILL)
    b.wait_for(lambda: b.state() == "leader", 10 * SESSION_TIMEOUT_MS / 1000, "b leads")
    failover_s = b.lines()[-1][1] - killed_at
    print(f"failover after kill -9 of the leader: {failover_s:.2f} s")
    # The bound is the behaviour: b takes over once a's 1 s session expired, not later.
    assert failover_s < 3 * SESSION_TIMEOUT_MS / 1000


def test_election_sigstopped_leader_stops_leading_and_requeues(contenders) -> None:  # type: ignore[no-untyped-def]
    from support import holds_for  # tests/ is on the path under pytest, not in the script

    a = contenders("a")
    a.wait_for(lambda: a.state() == "leader", 10, "a leads")
    b = contenders("b")
    a.signal(signal.SIGSTOP)
    try:
        b.wait_for(lambda: b.state() == "leader", 10, "b leads while a is frozen")
        time.sleep(SESSION_TIMEOUT_MS / 1000)
    finally:
        a.signal(signal.SIGCONT)
    resumed_at = time.monotonic()
    # a learns at once that its session is suspended or lost: it stops leading.
    a.wait_for(lambda: a.state() == "follower", 5, "a steps down")
    step_down_s = a.lines()[-1][1] - resumed_at
    print(f"frozen leader stepped down {step_down_s * 1000:.0f} ms after SIGCONT")
    holds_for(
        lambda: a.state() == "follower" and b.state() == "leader",
        duration_s=1.0,
        what="one leader, b, after a resumed",
    )
    b.stop()  # a queued again behind b: now it leads
    a.wait_for(lambda: a.state() == "leader", 10, "a leads again")


if __name__ == "__main__":
    sys.path.insert(0, _ROOT)
    asyncio.run(_contend(sys.argv[1], sys.argv[2], sys.argv[3]))
