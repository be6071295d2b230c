"""Configuration files for the servers: ``--config FILE`` (TOML) and ``QUORUMLOG_*``.

Every option of a server (``quorumlog bookie``, ``quorumlog autorecovery``,
``quorumlog db serve``) is also a key of its configuration file and an environment
variable, from one table: the server's own command-line parser. The key is the
option's name with underscores (``--journal-dir`` is ``journal_dir``), the variable
``QUORUMLOG_<SERVER>_<KEY>`` in capitals (``QUORUMLOG_BOOKIE_JOURNAL_DIR``). A
value is taken from, first to last: the command line, the environment, the file,
the built-in default. A key the server does not know, or a value of the wrong type,
is an error naming the key and the file, never ignored: a typo would otherwise
leave a setting at its default without a word.

Example ``bookie.toml``::

    metadata = "zk://zk1:2181,zk2:2181,zk3:2181/quorumlog"
    data_dir = "/var/lib/quorumlog/data"
    journal_dir = "/srv/journal/quorumlog"
    bind_address = "0.0.0.0"
    advertised_address = "bookie1.example.com"
    port = 3181

``docs/CONFIGURATION.md`` is :func:`reference_markdown` (``python -m
quorumlog.commands.config_file > docs/CONFIGURATION.md``); a test keeps them equal.
"""

from __future__ import annotations

import argparse
import os
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_PREFIX = "QUORUMLOG_"
_SKIPPED_DESTS = frozenset({"help", "config"})
_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
_FALSE_WORDS = frozenset({"0", "false", "no", "off"})


class ConfigError(ValueError):
    """A configuration file or variable that cannot be used; the message names the key."""


@dataclass(frozen=True, slots=True)
class Key:
    """One setting of one server."""

    name: str  # the TOML key, and the option's argparse dest
    flag: str  # its command-line form
    env: str  # its environment variable
    kind: str  # "bool", "int", "float", "string", "list of strings"
    default: Any
    required: bool
    doc: str
    choices: tuple[Any, ...] | None
    # The option's own conversion and checks (argparse's ``type``), run on file and
    # environment values too: a value refused on the command line is refused there.
    convert: Callable[[str], Any] | None


def enable_config_file(parser: argparse.ArgumentParser, server: str) -> None:
    """Give ``parser`` (a server's, complete with its options) ``--config FILE`` and
    make its keys settable from the file and the environment (see :func:`resolve`)."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        type=Path,
        default=None,
        help=f"TOML file of settings, one key per option (docs/CONFIGURATION.md); flags "
        f"and {ENV_PREFIX}{server.upper()}_* variables override it",
    )
    required = []
    for action in parser._actions:
        if action.required and action.option_strings:
            # Checked after the file and the environment had their say (resolve()).
            action.required = False
            required.append(action.dest)
    parser.set_defaults(
        _config_server=server, _config_parser=parser, _config_required=tuple(required)
    )


def keys(parser: argparse.ArgumentParser) -> list[Key]:
    """The settings of a server whose parser went through :func:`enable_config_file`."""
    server = parser.get_default("_config_server")
    required = set(parser.get_default("_config_required") or ())
    out = []
    for action in parser._actions:
        if not action.option_strings or action.dest in _SKIPPED_DESTS:
            continue
        if action.dest.startswith("_"):
            continue
        out.append(
            Key(
                name=action.dest,
                flag=max(action.option_strings, key=len),
                env=f"{ENV_PREFIX}{server.upper()}_{action.dest.upper()}",
                kind=_kind(action),
                default=action.default,
                required=action.dest in required,
                doc=_doc(parser, action),
                choices=tuple(action.choices) if action.choices else None,
                convert=action.type if callable(action.type) else None,
            )
        )
    return out


def _kind(action: argparse.Action) -> str:
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return "bool"
    if isinstance(action, argparse._AppendAction):
        return "list of strings"
    if action.type is int or getattr(action.type, "__name__", "") == "positive_int":
        return "int"
    if action.type is float:
        return "float"
    return "string"


def _doc(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    text = action.help or ""
    if "%" in text:
        text = text % dict(vars(action), prog=parser.prog)
    return " ".join(text.split())


def resolve(
    args: argparse.Namespace, argv: Sequence[str] | None, top: argparse.ArgumentParser
) -> argparse.Namespace:
    """``args`` again, with what the file and environment set under the flags given.

    ConfigError (one line) for an unknown key, a bad value, or a required setting
    given nowhere."""
    parser: argparse.ArgumentParser = args._config_parser
    table = {key.name: key for key in keys(parser)}
    settings: dict[str, Any] = {}
    if args.config is not None:
        settings.update(_from_file(args.config, table))
    settings.update(_from_environment(os.environ, table))
    if settings:
        # Defaults under the command line: parsing again lets every flag given win.
        parser.set_defaults(**settings)
        args = top.parse_args(argv)
    for name in args._config_required:
        if getattr(args, name) is None:
            key = table[name]
            raise ConfigError(f"{key.flag} is required (or {key.name} in --config, or {key.env})")
    return args


def _from_file(path: Path, table: Mapping[str, Key]) -> dict[str, Any]:
    try:
        with open(path, "rb") as source:
            raw = tomllib.load(source)
    except OSError as exc:
        raise ConfigError(f"--config {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config {path}: not TOML: {exc}") from None
    values = {}
    for name, value in raw.items():
        key = table.get(name)
        if key is None:
            close = [k for k in table if k.replace("_", "") == name.replace("_", "").lower()]
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{path}: unknown key {name!r}{hint}")
        values[name] = _typed(key, value, f"{path}: key {name!r}")
    return values


def _from_environment(environ: Mapping[str, str], table: Mapping[str, Key]) -> dict[str, Any]:
    values = {}
    for key in table.values():
        text = environ.get(key.env)
        if text is not None:
            values[key.name] = _from_text(key, text, f"{key.env}={text!r}")
    return values


def _typed(key: Key, value: Any, where: str) -> Any:
    """A TOML value checked against the key's kind (TOML has the types: no guessing)."""
    expected: tuple[type, ...]
    if key.kind == "bool":
        expected = (bool,)
    elif key.kind == "int":
        expected = (int,)
    elif key.kind == "float":
        expected = (int, float)
    elif key.kind == "list of strings":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
        return value
    else:
        expected = (str,)
    if (isinstance(value, bool) and bool not in expected) or not isinstance(value, expected):
        raise ConfigError(f"{where}: expected {_article(key.kind)}, got {value!r}")
    return _checked(key, value, where)


def _from_text(key: Key, text: str, where: str) -> Any:
    if key.kind == "bool":
        word = text.strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
        raise ConfigError(f"{where}: expected true or false")
    if key.kind == "list of strings":
        return [part for part in text.split(",") if part]
    return _checked(key, text, where)


def _checked(key: Key, value: Any, where: str) -> Any:
    if key.convert is not None:
        try:
            value = key.convert(str(value))
        except argparse.ArgumentTypeError as exc:  # the option's own words
            raise ConfigError(f"{where}: {exc}") from None
        except (ValueError, TypeError):
            raise ConfigError(f"{where}: expected {_article(key.kind)}") from None
    if key.choices is not None and value not in key.choices:
        raise ConfigError(f"{where}: expected one of {', '.join(map(str, key.choices))}")
    return value


def _article(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


# ------------------------------------------------------------------ reference


def server_parsers() -> dict[str, argparse.ArgumentParser]:
    """The parser of every server that takes ``--config``, by server name."""
    from quorumlog.commands import build_parser

    found: dict[str, argparse.ArgumentParser] = {}

    def visit(parser: argparse.ArgumentParser) -> None:
        server = parser.get_default("_config_server")
        if server is not None and parser.get_default("_config_parser") is parser:
            found[server] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    visit(sub)

    visit(build_parser())
    return found


def _default_text(key: Key) -> str:
    if key.required:
        return "required"
    if key.default is None:
        return "not set"
    if key.kind == "bool":
        return "false" if key.default is False else "true"
    if isinstance(key.default, str):
        return f'`"{key.default}"`'
    if isinstance(key.default, list):
        return "`[]`" if not key.default else f"`{key.default!r}`"
    return f"`{key.default}`"


def reference_markdown() -> str:
    """docs/CONFIGURATION.md: every key of every server, its type and default."""
    lines = [
        "# Configuration",
        "",
        "<!-- Generated by `python -m quorumlog.commands.config_file > docs/CONFIGURATION.md`"
        " from the servers' options; tests/local/test_config_file.py keeps it current. -->",
        "",
        "Every server takes `--config FILE`, a TOML file whose keys are its options with",
        "underscores (`--journal-dir` is `journal_dir`). Each key is also an environment",
        "variable, `QUORUMLOG_<SERVER>_<KEY>`. A value comes from, first to last: the",
        "command line, the environment, the file, the default below. A key the server does",
        "not know, or a value of another type, stops it with an error naming the key and",
        "the file. In the environment, a bool is `true`/`false` (or `1`/`0`, `yes`/`no`)",
        "and a list is comma-separated. `metadata`, when set nowhere, falls back to",
        "`$QUORUMLOG_METADATA`, then to `./.quorumlog/metadata.db`.",
        "",
        "```toml",
        "# /etc/quorumlog/bookie.toml",
        'metadata = "zk://zk1:2181,zk2:2181,zk3:2181/quorumlog?digest_file=/etc/quorumlog/zk-digest"',
        'data_dir = "/var/lib/quorumlog/data"',
        'journal_dir = "/srv/journal/quorumlog"',
        'bind_address = "0.0.0.0"',
        'advertised_address = "bookie1.example.com"',
        "port = 3181",
        "http_port = 8000",
        "```",
    ]
    titles = {
        "bookie": "`quorumlog bookie`",
        "autorecovery": "`quorumlog autorecovery`",
        "db": "`quorumlog db serve`",
    }
    for server, parser in server_parsers().items():
        lines += [
            "",
            f"## {titles.get(server, server)}",
            "",
            "| key | type | default | variable | meaning |",
            "|---|---|---|---|---|",
        ]
        for key in keys(parser):
            doc = key.doc.replace("|", "\\|")
            if key.choices:
                doc += f" (one of: {', '.join(map(str, key.choices))})"
            lines.append(
                f"| `{key.name}` | {key.kind} | {_default_text(key)} | `{key.env}` | {doc} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference_markdown())
