"""``python -m tests.harness.model``: explore a world of the model checker.

    python -m tests.harness.model                          # the default world
    python -m tests.harness.model --entries 3 --depth 40   # deeper
    python -m tests.harness.model --all-shapes --entries 2 --reorders 2
    python -m tests.harness.model --shape 3,3,3 --dead C --entries 4 --spares 2 \\
        --failures 1 --drops 0 --losses 0 --delays 0 --reorders 0 --no-close
    python -m tests.harness.model --replay trace.txt --entries 3 --spares 2

Prints the states explored, the time taken, and the first counterexample, if any, as
a numbered list of steps (``--explain`` adds the world after each step). ``--replay``
plays a list of steps (one a line, numbers optional) and explains it. Exit status 0
when every rule held, 1 when one broke, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import replace
from pathlib import Path

from tests.harness.model.explore import Result, explain, explore
from tests.harness.model.world import WorldConfig

SHAPES = ((3, 2, 2), (3, 3, 2), (3, 3, 3))


def _shape(text: str) -> tuple[int, int, int]:
    try:
        e, qw, qa = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected E,Qw,Qa (integers), got {text!r}") from None
    return e, qw, qa


def _reorders(text: str) -> int | None:
    if text == "any":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'any', got {text!r}") from None


def parser() -> argparse.ArgumentParser:
    default = WorldConfig()
    p = argparse.ArgumentParser(
        prog="python -m tests.harness.model",
        description="Explore every interleaving of a small world around the real core "
        "state machines and check the protocol's rules in every state.",
        allow_abbrev=False,
    )
    world = p.add_argument_group("the world")
    world.add_argument("--shape", type=_shape, default=None, help="E,Qw,Qa (default 3,2,2)")
    world.add_argument(
        "--all-shapes", action="store_true", help="one run for each of 3,2,2 3,3,2 3,3,3"
    )
    world.add_argument("--entries", type=int, default=default.entries, help="adds, at most")
    world.add_argument("--spares", type=int, default=default.spares, help="spare bookies")
    world.add_argument(
        "--failures", type=int, default=default.bookie_failures, help="bookies that may crash"
    )
    world.add_argument(
        "--dead", nargs="*", default=[], metavar="BOOKIE", help="bookies crashed from the start"
    )
    world.add_argument("--drops", type=int, default=default.drops, help="messages lost")
    world.add_argument(
        "--losses", type=int, default=default.metadata_losses, help="metadata replies lost"
    )
    world.add_argument(
        "--read-failures", type=int, default=default.read_failures, help="metadata reads failed"
    )
    world.add_argument(
        "--delays", type=int, default=default.delays, help="replies held back in flight"
    )
    world.add_argument(
        "--reorders",
        type=_reorders,
        default=default.reorders,
        help="messages delivered before an older one (default 1); 'any': no bound",
    )
    world.add_argument("--cancels", type=int, default=default.cancels, help="adds given up")
    world.add_argument("--no-recovery", action="store_true", help="no recovery starts")
    world.add_argument("--no-close", action="store_true", help="the writer never closes")
    world.add_argument(
        "--no-shared-spares",
        action="store_true",
        help="a spare chosen by one client is never chosen by the other",
    )
    world.add_argument(
        "--rewrite-attempts", type=int, default=default.rewrite_attempts, help="recovery's"
    )
    world.add_argument(
        "--reads-in-flight", type=int, default=default.reads_in_flight, help="recovery's"
    )
    world.add_argument(
        "--metadata-attempts", type=int, default=default.metadata_attempts, help="both's"
    )
    world.add_argument(
        "--recovery-changes", type=int, default=None, help="recovery's ensemble changes (E)"
    )
    search = p.add_argument_group("the search")
    search.add_argument("--depth", type=int, default=None, help="steps from the start, at most")
    search.add_argument("--max-states", type=int, default=None, help="stop after this many")
    search.add_argument(
        "--shortest", action="store_true", help="go on to find a shortest counterexample"
    )
    search.add_argument(
        "--every-rule", action="store_true", help="go on for a counterexample of each rule"
    )
    search.add_argument(
        "--explain", action="store_true", help="print the world after each step of one"
    )
    search.add_argument(
        "--order",
        default="listed",
        help="the order steps are tried in: listed (the writer's progress first), "
        "reversed (faults first), or a number (a shuffle); never changes what is explored",
    )
    search.add_argument("--progress", action="store_true", help="a line every 100,000 states")
    search.add_argument("--replay", type=Path, help="play this trace (one step a line)")
    return p


def config(args: argparse.Namespace, shape: tuple[int, int, int]) -> WorldConfig:
    e, qw, qa = shape
    return WorldConfig(
        ensemble_size=e,
        write_quorum=qw,
        ack_quorum=qa,
        entries=args.entries,
        spares=args.spares,
        bookie_failures=args.failures,
        drops=args.drops,
        metadata_losses=args.losses,
        read_failures=args.read_failures,
        recovery=not args.no_recovery,
        close=not args.no_close,
        cancels=args.cancels,
        dead_at_start=tuple(args.dead),
        delays=args.delays,
        reorders=args.reorders,
        shared_spares=not args.no_shared_spares,
        rewrite_attempts=args.rewrite_attempts,
        reads_in_flight=args.reads_in_flight,
        metadata_attempts=args.metadata_attempts,
        recovery_changes=args.recovery_changes,
    )


def read_trace(path: Path) -> list[str]:
    """Steps, one a line; a leading "12." and blank lines are ignored."""
    steps = []
    for line in path.read_text().splitlines():
        line = re.sub(r"^\s*\d+\.\s*", "", line).strip()
        if line and not line.startswith("#"):
            steps.append(line)
    return steps


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.all_shapes and args.shape:
        parser().error("--shape and --all-shapes exclude each other")
    if args.order not in ("listed", "reversed") and not args.order.isdigit():
        parser().error("--order is listed, reversed or a number")
    shapes = SHAPES if args.all_shapes else [args.shape or SHAPES[0]]
    try:
        configs = [config(args, shape) for shape in shapes]
    except ValueError as exc:
        parser().error(str(exc))
    if args.replay is not None:
        print(explain(configs[0], read_trace(args.replay)))
        return 0

    def progress(result: Result) -> None:
        print(
            f"... {result.states:,} states, {result.cpu_seconds:.0f} s of CPU, "
            f"depth {result.max_depth}",
            flush=True,
        )

    broken = False
    for cfg in configs:
        result = explore(
            cfg,
            max_depth=args.depth,
            max_states=args.max_states,
            shortest=args.shortest,
            every_rule=args.every_rule,
            progress=progress if args.progress else None,
            order=int(args.order) if args.order.isdigit() else args.order,
        )
        print(result.text(), flush=True)
        for counterexample in result.counterexamples:
            broken = True
            if args.explain:
                print(explain(replace(cfg), counterexample.trace))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
