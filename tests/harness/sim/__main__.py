"""``python -m tests.harness.sim``: run seeds of the whole-system simulator.

    python -m tests.harness.sim --seed 1234 --trace    # one seed, its trace, its verdict
    python -m tests.harness.sim --seeds 0..100000      # a range (end excluded), all cores
    python -m tests.harness.sim --seeds 0..1000 --processes 1

Exit status 0 when every rule held, 1 when a seed broke one (each failing seed is
printed with its violations: replay it with ``--seed N --trace``), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import sys

from quorumlog.testing.checkers import check_run
from tests.harness.sim.runner import run_seeds
from tests.harness.sim.workloads import run_seed


def _range(text: str) -> range:
    try:
        low, high = text.split("..", 1)
        return range(int(low), int(high))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A..B (integers), got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.harness.sim",
        description="Run seeds of the whole-system simulator and check every rule.",
        allow_abbrev=False,
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int, help="one seed")
    which.add_argument("--seeds", type=_range, help="a range of seeds, A..B (B excluded)")
    parser.add_argument("--trace", action="store_true", help="print the run's trace (--seed)")
    parser.add_argument("--processes", type=int, default=None, help="worker processes (--seeds)")
    args = parser.parse_args(argv)

    if args.seed is not None:
        history = run_seed(args.seed, trace=args.trace)
        if args.trace:
            print("\n".join(history.trace))
        violations = check_run(history)
        print(f"seed {args.seed} ({history.workload} workload), faults: {history.faults}")
        for v in violations:
            print(f"VIOLATION {v}")
        if not violations:
            print("every rule held")
        return 1 if violations else 0

    summary = run_seeds(args.seeds, args.processes)
    print(summary.text())
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
