"""The search: every interleaving of the world's steps, depth first, each state once.

States are told apart by a hash of :meth:`World.key` (64 bits: two of ten million
states share one with a chance below one in 10^5). Without a depth bound a state seen
before is not explored again; with one, it is explored again only when reached in
fewer steps (it then has more steps left). The state graph has no cycles: every step
uses up a message, a budget or an add, or moves a state machine on.

A counterexample is the list of step labels from the initial world; ``replay`` in
``world.py`` plays it again on fresh state machines, and :func:`explain` prints it with
the world after each step.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.harness.model.invariants import Violation, check, check_end
from tests.harness.model.world import Action, World, WorldConfig


@dataclass
class Counterexample:
    cfg: WorldConfig
    trace: list[str]
    violations: list[Violation]

    def text(self) -> str:
        lines = [f"counterexample in {len(self.trace)} steps ({self.cfg.describe()}):"]
        lines += [f"{n:3d}. {label}" for n, label in enumerate(self.trace, 1)]
        lines += [f"VIOLATION {v}" for v in self.violations]
        return "\n".join(lines)


@dataclass
class Result:
    cfg: WorldConfig
    states: int = 0  # distinct states reached
    transitions: int = 0  # steps taken (to states new or not)
    ends: int = 0  # states where nothing can happen any more
    max_depth: int = 0  # the longest trace explored
    seconds: float = 0.0  # wall-clock time
    cpu_seconds: float = 0.0  # CPU time of this process (the machine may be shared)
    complete: bool = True  # False: cut by the depth bound or the state limit
    counterexamples: list[Counterexample] = field(default_factory=list)

    @property
    def counterexample(self) -> Counterexample | None:
        return self.counterexamples[0] if self.counterexamples else None

    def text(self) -> str:
        rate = self.states / self.cpu_seconds if self.cpu_seconds else 0.0
        if self.complete:
            scope = "the whole state space"
        elif self.counterexamples:
            scope = "stopped at a violation"
        else:
            scope = "cut by the depth or state bound"
        head = (
            f"{self.cfg.describe()}: {self.states:,} states, {self.transitions:,} transitions, "
            f"{self.ends:,} end states, longest trace {self.max_depth}; {self.seconds:.1f} s, "
            f"{self.cpu_seconds:.1f} s of CPU ({rate:,.0f} states a CPU second; {scope})"
        )
        if not self.counterexamples:
            return head + "\nevery rule held"
        return "\n\n".join([head, *(c.text() for c in self.counterexamples)])


def explore(
    cfg: WorldConfig,
    *,
    max_depth: int | None = None,
    max_states: int | None = None,
    shortest: bool = False,
    every_rule: bool = False,
    progress: Callable[[Result], None] | None = None,
    progress_every: int = 100_000,
    start: World | None = None,
    order: str | int = "listed",
) -> Result:
    """Explore every state of the world ``cfg`` reachable in at most ``max_depth`` steps
    (None: all), checking the rules in each (``invariants.check``) and, in states where
    nothing can happen any more, the rules about ends (``invariants.check_end``).

    Stops at the first violation, unless ``every_rule`` (then it keeps the first
    counterexample of each rule and goes on). With ``shortest``, it goes on after a
    violation looking for a shorter one (the depth bound shrinks to below it), so the
    counterexample returned is one of the shortest.

    ``start`` is a world to explore from instead of the initial one (a trace's traces
    then start there).

    ``order`` is the order the steps of a state are tried in: ``"listed"`` (the
    writer's progress first, faults after), ``"reversed"`` (faults and the recovery
    first), or a number that seeds a shuffle. It changes how soon a violation is met,
    never which states are explored.
    """
    started = time.perf_counter()
    cpu_started = time.process_time()
    result = Result(cfg)

    def clock() -> None:
        result.seconds = time.perf_counter() - started
        result.cpu_seconds = time.process_time() - cpu_started

    root = World.initial(cfg) if start is None else start
    bound = max_depth
    visited: dict[int, int] = {hash(root.key()): 0}
    result.states = 1
    broken: set[str] = set()

    def found(trace: list[str], violations: list[Violation]) -> bool:
        """Keep a counterexample; True when the search should stop."""
        nonlocal bound
        new = [v for v in violations if v.rule not in broken]
        if every_rule and not new:
            return False
        if shortest and result.counterexamples and not every_rule:
            result.counterexamples[0] = Counterexample(cfg, trace, violations)
        else:
            result.counterexamples.append(Counterexample(cfg, trace, violations))
        broken.update(v.rule for v in violations)
        result.complete = False
        if shortest:
            bound = len(trace) - 1
            return False
        return not every_rule

    shuffle = random.Random(order) if isinstance(order, int) else None

    def steps(world: World) -> list[Action]:
        acts = world.actions()
        if order == "reversed":
            acts.reverse()
        elif shuffle is not None:
            shuffle.shuffle(acts)
        return acts

    root_acts = steps(root)
    violations = check(root)
    if not root_acts and not violations:
        result.ends += 1
        violations = check_end(root)
    if violations and found([], violations):
        clock()
        return result
    # Each frame: the world, its steps, the index of the next one to take.
    stack: list[list[object]] = [[root, root_acts, 0]]
    trace: list[str] = []
    next_report = progress_every
    while stack:
        frame = stack[-1]
        world, acts, index = frame
        assert isinstance(world, World) and isinstance(acts, list) and isinstance(index, int)
        if index >= len(acts) or (bound is not None and len(stack) > bound):
            stack.pop()
            if trace:
                trace.pop()
            continue
        frame[2] = index + 1
        label, make = acts[index]
        result.transitions += 1
        depth = len(stack)
        try:
            child = make(world)
        except Exception as exc:  # a state machine raised: a broken rule of its own
            if found([*trace, label], [raised(exc)]):
                break
            continue
        digest = hash(child.key())
        seen = visited.get(digest)
        if seen is not None and (bound is None or seen <= depth):
            continue
        visited[digest] = depth
        if seen is None:
            result.states += 1
            if max_states is not None and result.states >= max_states:
                result.complete = False
                break
        result.max_depth = max(result.max_depth, depth)
        if progress is not None and result.states >= next_report:
            next_report += progress_every
            clock()
            progress(result)
        violations = check(child)
        child_acts = steps(child)
        if not child_acts and not violations:
            result.ends += 1
            violations = check_end(child)
        if violations:
            if found([*trace, label], violations):
                break
            continue
        if child_acts:
            if bound is not None and depth >= bound:
                result.complete = False
                continue
            stack.append([child, child_acts, 0])
            trace.append(label)
    clock()
    return result


def raised(exc: Exception) -> Violation:
    return Violation("core-raised", f"{type(exc).__name__}: {exc}")


def explain(cfg: WorldConfig, trace: list[str]) -> str:
    """The trace played again, with the world after each step and the rules it broke
    (up to a step that cannot happen, or that raises)."""
    world = World.initial(cfg)
    lines = ["(start)", *("       " + line for line in world.summary().splitlines())]
    for number, label in enumerate(trace, 1):
        lines.append(f"{number:3d}. {label}")
        make = dict(world.actions()).get(label)
        if make is None:
            lines.append("       cannot happen here; what could:")
            lines += [f"         {name}" for name, _ in world.actions()]
            break
        try:
            world = make(world)
        except Exception as exc:
            lines.append(f"       VIOLATION {raised(exc)}")
            break
        lines += ["       " + line for line in world.summary().splitlines()]
        lines += [f"       VIOLATION {violation}" for violation in check(world)]
    return "\n".join(lines)


@dataclass
class TraceCheck:
    """What :func:`check_trace` found."""

    played: list[str]  # the steps of the trace that could happen, in order
    diverged: str | None  # the first step that could not (the core now acts otherwise)
    violations: list[Violation]  # broken on the way, or in a continuation from the end
    continuation: Result | None  # the exploration from where the trace stopped
    text: str  # the trace played, explained, and what broke

    @property
    def held(self) -> bool:
        return not self.violations


def check_trace(
    cfg: WorldConfig, labels: list[str], *, max_states: int | None = None
) -> TraceCheck:
    """Play a counterexample's steps on the real core and check the rules after each.

    On the code it was found on, a rule breaks on the way. On code where the defect is
    fixed, the core answers differently at some step, so the trace stops there (or
    runs to its end); then every continuation from that state is explored, and the
    rules must hold in all of them."""
    world = World.initial(cfg)
    played: list[str] = []
    diverged: str | None = None
    violations: list[Violation] = []
    for label in labels:
        steps = dict(world.actions())
        make = steps.get(label)
        if make is None:
            diverged = label
            break
        try:
            world = make(world)
        except Exception as exc:
            played.append(label)
            violations = [raised(exc)]
            break
        played.append(label)
        violations = check(world)
        if violations:
            break
    continuation: Result | None = None
    if not violations:
        continuation = explore(cfg, start=world, max_states=max_states)
        for counterexample in continuation.counterexamples:
            violations += counterexample.violations
    lines = [explain(cfg, played) if played else "(nothing played)"]
    if diverged is not None:
        lines.append(f"the core no longer lets this happen: {diverged}")
    if continuation is not None:
        lines.append("from there: " + continuation.text())
    return TraceCheck(played, diverged, violations, continuation, "\n".join(lines))
