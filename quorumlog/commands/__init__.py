"""The ``quorumlog`` command (also ``python -m quorumlog``) and its subcommands.

Every subcommand's argument parsing and printing lives in this package, one module
per subcommand, listed in :data:`SUBCOMMAND_MODULES`; the layers below (server,
client, log, apps, spark) know nothing of the command line and are called with plain
values. Nothing outside this package imports it.

Each module has ``add_parser(subparsers)``, which adds its parser and sets
``func`` to a function ``(argparse.Namespace) -> int`` returning the exit
status. To add a subcommand, write such a module and add it here. A module that
cannot be imported (an optional dependency missing) shows as an unavailable
subcommand instead of breaking the others.

Every failure a user can cause (bad arguments, an unreachable store, a bookie
that refuses to start) is one line on stderr and a non-zero exit status, never
a traceback.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

# In the order they are listed by ``quorumlog --help``; each module is named after
# its subcommand (an unavailable one is listed under that name).
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "quorumlog.commands.bookie",
    "quorumlog.commands.localbookie",
    "quorumlog.commands.autorecovery",
    "quorumlog.commands.shell",
    "quorumlog.commands.token",
    "quorumlog.commands.bench",
    "quorumlog.commands.dice",
    "quorumlog.commands.pipeline",
    "quorumlog.commands.db",
)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2  # bad arguments; also a bookie that refuses to start


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is a single line (``prog: error: ...``), and a flag is
    taken only whole: ``--interval`` is not ``--interval-ms`` (abbreviations would make
    any new flag sharing a prefix break the scripts that relied on them). Every
    subcommand's parser is of this class too (argparse makes them of the parent's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _SubcommandsAction)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def unrecognized(self, extras: Sequence[str]) -> NoReturn:
        """The error for arguments this parser does not know, with the nearest flag."""
        message = f"unrecognized arguments: {' '.join(extras)}"
        flags = [e.split("=", 1)[0] for e in extras if e.startswith("-")]
        known = [o for o in self._option_string_actions if o.startswith("--")]
        for flag in flags:
            # A flag cut short is the likeliest slip (--data for --data-dir); then spelling.
            near = [o for o in known if o.startswith(flag)][:1] if len(flag) > 3 else []
            near = near or difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
            if near:
                message += f" (did you mean {near[0]}?)"
                break
        self.error(message)


class _SubcommandsAction(argparse._SubParsersAction):  # type: ignore[type-arg]
    """argparse's subcommands, but arguments the chosen subcommand does not know are its
    error, named after it (``quorumlog dice: error: ... (see quorumlog dice --help)``),
    not the top-level parser's. Nothing after a subcommand's name can belong to a parent:
    a subcommand takes every argument that follows it."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        super().__call__(parser, namespace, values, option_string)
        extras = getattr(namespace, argparse._UNRECOGNIZED_ARGS_ATTR, None)
        chosen = self.choices.get(values[0]) if isinstance(values, list) and values else None
        if extras and isinstance(chosen, OneLineArgumentParser):
            chosen.unrecognized(extras)


def positive_int(text: str) -> int:
    """A whole number >= 1 (an argparse type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def positive_float(text: str) -> float:
    """A number > 0 (an argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number above 0: {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(
        prog="quorumlog",
        description="quorumlog: Apache BookKeeper's replicated log in Python.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            _unavailable(subparsers, module_name, exc)
            continue
        module.add_parser(subparsers)
    return parser


def _unavailable(
    subparsers: argparse._SubParsersAction,  # type: ignore[type-arg]
    module_name: str,
    exc: ImportError,
) -> None:
    name = module_name.rsplit(".", 1)[-1]
    sub = subparsers.add_parser(name, help=f"(unavailable: {exc})")
    sub.add_argument("rest", nargs=argparse.REMAINDER)

    def run(args: argparse.Namespace) -> int:
        print(f"quorumlog {name}: unavailable: {exc}", file=sys.stderr)
        return EXIT_FAILURE

    sub.set_defaults(func=run)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``), run the subcommand, return its exit status."""
    return run_parsed(build_parser(), argv)


def run_parsed(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse ``argv`` with ``parser`` and run the ``func`` the chosen subcommand set;
    its exit status, or 130 (the shell's status for SIGINT) on Ctrl-C."""
    args = parser.parse_args(argv)
    if getattr(args, "_config_parser", None) is not None:  # a server: --config, QUORUMLOG_*
        from quorumlog.commands.config_file import ConfigError, resolve

        try:
            args = resolve(args, argv, parser)
        except ConfigError as exc:
            print(f"{args._config_parser.prog}: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    try:
        status = int(args.func(args))
        sys.stdout.flush()
        return status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of stdout went away (`... | head`): as a Unix tool, stop quietly.
        # Whatever is still buffered goes nowhere instead of raising again at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
