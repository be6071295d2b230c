"""Many seeds at once: each run checked on its own, the results summed up.

:func:`run_seeds` spreads seeds over worker processes (each seed is independent
and replays alone), checks each history as soon as it is made, and keeps only
what a report needs: the violations by seed and counters of what the runs did.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from quorumlog.testing.checkers import RunHistory, Violation, check_run
from tests.harness.sim.workloads import run_seed

__all__ = ["SeedResult", "Summary", "check_seed", "first_failure", "run_seeds"]


@dataclass
class SeedResult:
    """One seed, checked: its violations and what it exercised."""

    seed: int
    workload: str
    violations: list[Violation]
    stats: Counter[str]
    elapsed_s: float


@dataclass
class Summary:
    seeds: int = 0
    seeds_asked: int = 0  # more than ``seeds`` when a time budget ran out first
    elapsed_s: float = 0.0
    failures: dict[int, list[Violation]] = field(default_factory=dict)
    stats: Counter[str] = field(default_factory=Counter)

    @property
    def seeds_per_minute(self) -> float:
        return 60 * self.seeds / self.elapsed_s if self.elapsed_s else 0.0

    def text(self) -> str:
        rate = self.seeds_per_minute
        cut = (
            f" (of {self.seeds_asked}: the time budget ran out)"
            if self.seeds_asked > self.seeds
            else ""
        )
        lines = [
            f"{self.seeds} seeds{cut} in {self.elapsed_s:.1f} s ({rate:.0f} seeds/min), "
            f"{len(self.failures)} failing"
        ]
        lines.append("exercised: " + ", ".join(f"{k} {v}" for k, v in sorted(self.stats.items())))
        for seed, violations in sorted(self.failures.items())[:20]:
            for v in violations[:3]:
                lines.append(f"seed {seed}: {v}")
        return "\n".join(lines)


def _stats(history: RunHistory) -> Counter[str]:
    stats: Counter[str] = Counter()
    stats[f"workload {history.workload}"] += 1
    for ledger in history.ledgers:
        e, w, a = ledger.shape
        stats["ledgers"] += 1
        stats["confirmed entries"] += len(ledger.confirmed)
        stats["recoveries"] += len(ledger.closes)
        stats["ack < write quorum" if a < w else "ack = write quorum"] += 1
        if e > w:
            stats["striped (E > Qw)"] += 1
        if len(ledger.closes) > 1:
            stats["concurrent closes"] += 1
        zombie = [
            order
            for _, _, order in ledger.confirmed
            if ledger.closes and order > min(c[3] for c in ledger.closes)
        ]
        stats["confirmed after a close"] += len(zombie)
    for log in history.logs:
        stats["logs"] += 1
        stats["log records confirmed"] += sum(len(v) for v in log.confirmed.values())
        stats["log records tailed"] += len(log.tailed)
        writers = sum(1 for v in log.confirmed.values() if v)
        if writers > 1:
            stats["logs with 2+ writers"] += 1
    for name, count in history.faults.items():
        stats[name] += count
    return stats


def check_seed(seed: int) -> SeedResult:
    started = time.perf_counter()
    history = run_seed(seed)
    violations = check_run(history)
    return SeedResult(
        seed, history.workload, violations, _stats(history), time.perf_counter() - started
    )


def _default_processes() -> int:
    return max(1, len(os.sched_getaffinity(0)))


def run_seeds(
    seeds: Iterable[int], processes: int | None = None, budget_s: float | None = None
) -> Summary:
    """Run and check every seed; ``processes`` workers (default: one per usable core).

    With ``budget_s``, seeds are no longer started once that much wall time has gone
    (the ones under way finish or are dropped): ``summary.seeds`` says how many ran."""
    seed_list: Sequence[int] = list(seeds)
    processes = processes or _default_processes()
    summary = Summary()
    started = time.perf_counter()
    deadline = None if budget_s is None else started + budget_s
    if processes <= 1 or len(seed_list) < 2:
        for seed in seed_list:
            if deadline is not None and time.perf_counter() >= deadline:
                break
            _add(summary, check_seed(seed))
    else:
        context = multiprocessing.get_context("fork")
        with context.Pool(processes) as pool:  # its exit stops the workers still running
            for result in pool.imap_unordered(check_seed, seed_list, chunksize=16):
                _add(summary, result)
                if deadline is not None and time.perf_counter() >= deadline:
                    break
    summary.elapsed_s = time.perf_counter() - started
    summary.seeds_asked = len(seed_list)
    return summary


def _add(summary: Summary, result: SeedResult) -> None:
    summary.seeds += 1
    summary.stats.update(result.stats)
    if result.violations:
        summary.failures[result.seed] = result.violations


def first_failure(seeds: Iterable[int], processes: int | None = None) -> SeedResult | None:
    """The first seed (in order) that breaks a rule, or None; stops as soon as it is known.

    Worker processes are forked, so that whatever the caller changed in this process
    (a bug planted by patching, in a test) holds in them too.
    """
    seed_list = list(seeds)
    processes = processes or _default_processes()
    if processes <= 1:
        for seed in seed_list:
            result = check_seed(seed)
            if result.violations:
                return result
        return None
    context = multiprocessing.get_context("fork")
    with context.Pool(processes) as pool:
        for result in pool.imap(check_seed, seed_list, chunksize=2):
            if result.violations:
                pool.terminate()
                return result
    return None
