"""``python -m tests.harness.netns``: the namespace suite, as root.

    python -m tests.harness.netns                        # every nemesis, both drivers
    python -m tests.harness.netns --driver zk --nemesis kill-bookie --nemesis loss
    python -m tests.harness.netns --out /tmp/netns-run   # where histories are kept

Prints each run's summary line, keeps each run's history under the directory it names,
and exits 1 if a run broke a rule (2: namespaces cannot be built here, or --out holds
an earlier run).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.harness.netns.cluster import NetnsCluster
from tests.harness.netns.network import netns_unavailable_reason, removal_on_signals
from tests.harness.netns.runner import SUITE, RunResult, default_out_dir, run_nemesis


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.harness.netns", allow_abbrev=False)
    parser.add_argument("--driver", action="append", choices=["sqlite", "zk"])
    parser.add_argument("--nemesis", action="append", choices=sorted(SUITE))
    parser.add_argument("--out", type=Path, default=None, help="where histories are kept")
    args = parser.parse_args(argv)
    reason = netns_unavailable_reason()
    if reason is not None:
        print(f"cannot build network namespaces here: {reason}", file=sys.stderr)
        return 2
    out = args.out or default_out_dir()
    if out.exists() and any(out.iterdir()):
        print(f"{out} holds an earlier run: give another --out", file=sys.stderr)
        return 2
    print(f"histories under {out}", flush=True)
    results: list[RunResult] = []
    with removal_on_signals():
        for driver in args.driver or ["sqlite", "zk"]:
            specs = [
                SUITE[name]
                for name in (args.nemesis or list(SUITE))
                if driver in SUITE[name].drivers
            ]
            if not specs:
                continue
            with NetnsCluster(driver, out / f"{driver}-cluster") as cluster:
                cluster.start()
                for spec in specs:
                    result = run_nemesis(cluster, spec, out / driver)
                    results.append(result)
                    print(result.summary_line(), flush=True)
    broken = [r for r in results if not r.valid]
    print(f"{len(results)} runs, {len(broken)} invalid; histories under {out}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
