"""Statements as requests carry them, and the rewrite that makes them replay identically.

No I/O here: text in, text out. The leader turns each write request into one log
record; every replica applies that record to its own SQLite file, so whatever the
record asks for must come out the same on each of them. SQLite is deterministic given
the same file and the same statements, except for the functions that read the clock
or a random source. Every replica computes those from the record (the leader's clock
and seed, ``machine.py``), whatever their spelling; the usual spellings the leader
also evaluates once and writes into the statement as literals (as rqlite does), so
the log shows the values. Some statements are refused before anything is logged
(docs/DB.md lists them function by function).
"""

from __future__ import annotations

import functools
import re
import secrets
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from quorumlog.errors import InvalidArgumentError

__all__ = [
    "BadRequestError",
    "Param",
    "Statement",
    "batchable",
    "explained",
    "inserts_rows",
    "parse_statements",
    "rewrite_all_for_replay",
    "rewrite_for_replay",
    "split_sql",
    "sqlite_params",
]

# A list is a BLOB given as its bytes (rqlite's byte arrays): JSON has no bytes, so it
# is logged as the list and bound as bytes (:func:`sqlite_params`).
Param = int | float | str | None | list[int]
Params = list[Param] | dict[str, Param]

# Statements that would end or escape the transaction a record is applied in: a COMMIT
# in the middle would store changes without the applied position (breaking exactly
# once), ATTACH would reach files outside the replica. Refused before logging.
_REFUSED_FIRST_WORDS = frozenset(
    {"BEGIN", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE", "ATTACH", "DETACH", "VACUUM"}
)
# Functions whose value depends on the connection's history, which differs between a
# replica that restarted and one that did not: refused in writes (use RETURNING).
_CONNECTION_FUNCTIONS = frozenset({"last_insert_rowid", "changes", "total_changes"})
_DATE_FUNCTIONS = frozenset({"date", "time", "datetime", "julianday", "unixepoch", "strftime"})
_CURRENT_KEYWORDS = {
    "CURRENT_TIMESTAMP": "%Y-%m-%d %H:%M:%S",
    "CURRENT_DATE": "%Y-%m-%d",
    "CURRENT_TIME": "%H:%M:%S",
}
APPLIED_TABLE = "_quorumlog_applied"


class BadRequestError(InvalidArgumentError):
    """The request cannot be run as sent (the client's fault): HTTP 400, nothing logged."""


@dataclass(frozen=True, slots=True)
class Statement:
    """One SQL statement and its parameters (positional list or named dict)."""

    sql: str
    params: Params = field(default_factory=list)

    def to_json(self) -> list[object]:
        return [self.sql, self.params]

    @classmethod
    def from_json(cls, raw: object) -> Statement:
        if not isinstance(raw, list) or len(raw) != 2 or not isinstance(raw[0], str):
            raise BadRequestError(f"not a logged statement: {raw!r}")
        params = raw[1]
        if not isinstance(params, list | dict):
            raise BadRequestError(f"not logged parameters: {params!r}")
        return cls(raw[0], params)


# The JSON values a parameter may be; bool is an int in Python and SQLite stores it as
# 0/1, as rqlite does.
_PARAM_TYPES = frozenset({str, int, float, bool, type(None)})
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _params_ok(values: Iterable[object]) -> bool:
    """Whether every value can be bound as it is (the common case, checked in one pass;
    the message for a bad one is built only then, by :func:`_check_param`)."""
    for value in values:
        kind = type(value)
        if kind not in _PARAM_TYPES:
            return False
        if kind is int and not _INT64_MIN <= value <= _INT64_MAX:  # type: ignore[operator]
            return False
    return True


def _check_param(value: object, where: str) -> Param:
    if isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX:
        raise BadRequestError(f"{where}: integer {value} does not fit SQLite's 64 bits")
    if value is None or isinstance(value, int | float | str):
        return value
    if isinstance(value, list):
        for byte in value:
            if type(byte) is not int or not 0 <= byte <= 255:
                raise BadRequestError(
                    f"{where}: a BLOB given as an array holds integers 0 to 255, not {byte!r}"
                )
        return value
    raise BadRequestError(
        f"{where}: unsupported parameter type {type(value).__name__} "
        "(use a number, a string, true/false, null, or an array of bytes 0 to 255 for a BLOB)"
    )


def sqlite_params(params: Params) -> Sequence[object] | Mapping[str, object]:
    """``params`` as SQLite binds them: each byte array as bytes (a BLOB). The parameters
    themselves when none is an array, which is nearly always (no copy then)."""
    if isinstance(params, dict):
        if any(type(v) is list for v in params.values()):
            return {k: bytes(v) if isinstance(v, list) else v for k, v in params.items()}
        return params
    for value in params:
        if type(value) is list:
            return [bytes(v) if isinstance(v, list) else v for v in params]
    return params


def parse_statements(body: object) -> list[Statement]:
    """The statements of a request body: ``["sql", ["sql ?", 1], ["sql :a", {"a": 1}]]``.

    Raises :class:`BadRequestError` for any other shape (nothing is logged for it).
    """
    if not isinstance(body, list):
        raise BadRequestError("the body must be a JSON array of statements")
    if not body:
        raise BadRequestError("empty statement list")
    statements: list[Statement] = []
    append = statements.append
    for index, item in enumerate(body):
        # The common shape first, checked inline: ["sql", value, ...] with every value
        # a string, a number of 64 bits or null (a 100-row batch: 53 -> 39 µs).
        if type(item) is list and item and type(item[0]) is str:
            rest = item[1:]
            for value in rest:
                kind = type(value)
                if kind is str or kind is float or kind is bool or value is None:
                    continue
                if kind is int and _INT64_MIN <= value <= _INT64_MAX:
                    continue
                break
            else:
                append(Statement(item[0], rest))
                continue
        if isinstance(item, str):
            statements.append(Statement(item, []))
            continue
        if not isinstance(item, list) or not item or not isinstance(item[0], str):
            raise BadRequestError(f"statement {index}: expected a string or [sql, parameters...]")
        sql, rest = item[0], item[1:]
        if len(rest) == 1 and isinstance(rest[0], dict):
            named: dict[str, Param] = rest[0]
            if not _params_ok(named.values()):
                named = {
                    str(k): _check_param(v, f"statement {index} parameter {k!r}")
                    for k, v in named.items()
                }
            statements.append(Statement(sql, named))
        elif _params_ok(rest):
            statements.append(Statement(sql, rest))
        else:
            positional = [
                _check_param(v, f"statement {index} parameter {i + 1}") for i, v in enumerate(rest)
            ]
            statements.append(Statement(sql, positional))
    return statements


# ---------------------------------------------------------------- tokens

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<comment>--[^\n]*|/\*.*?(?:\*/|\Z))
  | (?P<string>'(?:[^']|'')*'?)
  | (?P<quoted>"(?:[^"]|"")*"?|`(?:[^`]|``)*`?|\[[^\]]*\]?)
  | (?P<blob>[xX]'[0-9a-fA-F]*'?)
  | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
  | (?P<number>[0-9][0-9A-Za-z_.]*|\.[0-9][0-9A-Za-z_.]*)
  | (?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)


@dataclass(slots=True)
class _Token:
    kind: str
    text: str


def _tokens(sql: str) -> list[_Token]:
    return [_Token(str(m.lastgroup), m.group()) for m in _TOKEN.finditer(sql)]


def _significant(tokens: list[_Token]) -> list[int]:
    return [i for i, t in enumerate(tokens) if t.kind not in ("space", "comment")]


def first_word(sql: str) -> str:
    for token in _tokens(sql):
        if token.kind == "word":
            return token.text.upper()
        if token.kind not in ("space", "comment"):
            return ""
    return ""


def explained(sql: str) -> str:
    """``sql`` without a leading ``EXPLAIN`` or ``EXPLAIN QUERY PLAN``: SQLite judges an
    explained statement read-only or not as the statement itself
    (``sqlite3_stmt_readonly``)."""
    tokens = _tokens(sql)
    sig = _significant(tokens)
    if not sig or tokens[sig[0]].text.upper() != "EXPLAIN":
        return sql
    rest = 1
    if (
        len(sig) > 2
        and tokens[sig[1]].text.upper() == "QUERY"
        and tokens[sig[2]].text.upper() == "PLAN"
    ):
        rest = 3
    if rest >= len(sig):
        return sql
    return "".join(t.text for t in tokens[sig[rest] :])


# Statements up to this length are analysed once per text: a program sends the same
# few statements again and again (tokenizing each one was the leader's largest cost per
# request); longer ones (a restore's INSERTs of literal rows) are not kept in memory.
_CACHED_SQL_CHARS = 4096
_CACHED_STATEMENTS = 4096


def _split(sql: str) -> tuple[str, ...]:
    pieces: list[str] = []
    start = 0
    at = 0
    for token in _tokens(sql):
        at += len(token.text)
        # A ';' outside strings, comments and quoted names ends a statement if SQLite
        # says so (not inside a trigger's BEGIN ... END).
        # (complete_statement raises on a NUL; a NUL is no ';', so asking without it
        # gives the same answer, and the statement's own run reports the character.)
        if token.text == ";" and sqlite3.complete_statement(sql[start:at].replace("\0", " ")):
            piece = sql[start:at]
            if any(t.kind not in ("space", "comment") and t.text != ";" for t in _tokens(piece)):
                pieces.append(piece)  # not an empty statement (";;")
            start = at
    rest = sql[start:]
    if any(t.kind not in ("space", "comment") for t in _tokens(rest)):
        pieces.append(rest)
    elif pieces:
        pieces[-1] += rest
    return tuple(pieces) or (sql,)


_split_cached = functools.lru_cache(maxsize=_CACHED_STATEMENTS)(_split)


def split_sql(sql: str) -> tuple[str, ...]:
    """The statements of one SQL string, in order (``"INSERT ...; UPDATE ..."`` is two;
    a trigger's body stays in its CREATE TRIGGER). One piece for most strings; a
    string with nothing but spaces and comments is itself. What ends a statement is
    SQLite's ``sqlite3_complete``, so the split depends on the text and SQLite alone."""
    if ";" not in sql:
        return (sql,)
    return _split(sql) if len(sql) > _CACHED_SQL_CHARS else _split_cached(sql)


def several_statements_refusal(statement: Statement) -> str:
    """Why ``statement`` cannot run as sent ("" when it can): several statements in one
    string share named parameters, but positional ones would have to be dealt out."""
    if (
        statement.params
        and isinstance(statement.params, list)
        and len(split_sql(statement.sql)) > 1
    ):
        return (
            "positional parameters with several statements in one string: send each "
            "statement with its own parameters, or use named parameters"
        )
    return ""


def _inserts(sql: str) -> bool:
    words = [t.text.upper() for t in _tokens(sql) if t.kind == "word"]
    if not words:
        return False
    if words[0] == "WITH":
        return "INSERT" in words or "REPLACE" in words
    return words[0] in ("INSERT", "REPLACE")


_inserts_cached = functools.lru_cache(maxsize=_CACHED_STATEMENTS)(_inserts)


def inserts_rows(sql: str) -> bool:
    """Whether a statement is an INSERT or REPLACE (possibly after WITH): the only ones
    whose result carries a ``last_insert_id``. SQLite's last inserted rowid belongs to
    the connection, so for any other statement it would be the history of whichever
    statement inserted last, not something of this one."""
    return _inserts(sql) if len(sql) > _CACHED_SQL_CHARS else _inserts_cached(sql)


def _batchable(sql: str) -> bool:
    words = [t.text.upper() for t in _tokens(sql) if t.kind == "word"]
    return (
        bool(words)
        and words[0] in _BATCHABLE_FIRST_WORDS
        and "RETURNING" not in words
        and len(split_sql(sql)) == 1
    )


_BATCHABLE_FIRST_WORDS = frozenset({"INSERT", "REPLACE", "UPDATE", "DELETE"})
_batchable_cached = functools.lru_cache(maxsize=_CACHED_STATEMENTS)(_batchable)


def batchable(sql: str) -> bool:
    """Whether runs of this statement with different parameters may go to SQLite's
    ``executemany`` where nobody reads their results: one INSERT, REPLACE, UPDATE or
    DELETE (no RETURNING, whose rows executemany would not read)."""
    return _batchable(sql) if len(sql) > _CACHED_SQL_CHARS else _batchable_cached(sql)


# ---------------------------------------------------------------- the rewrite


@dataclass(frozen=True, slots=True)
class Choices:
    """What the leader chose for one request: the time 'now' is and a random source."""

    now: datetime
    random_int: Callable[[], int]
    random_bytes: Callable[[int], bytes]

    @classmethod
    def fresh(cls, now: datetime | None = None) -> Choices:
        return cls(
            now=datetime.now(UTC) if now is None else now,
            random_int=lambda: int.from_bytes(secrets.token_bytes(8), "big", signed=True),
            random_bytes=secrets.token_bytes,
        )


_MAX_RANDOMBLOB_BYTES = 1 << 20

# Stand-in choices for finding out whether a statement calls anything non-deterministic:
# the values are thrown away, only "changed or not" (or a refusal) is kept.
_PROBE_CHOICES = Choices(
    now=datetime(2000, 1, 1, tzinfo=UTC),
    random_int=lambda: 0,
    random_bytes=lambda size: bytes(min(size, 1)),
)


def _replays_as_is(sql: str) -> bool:
    """Whether ``sql`` replays identically without a rewrite. Raises BadRequestError
    for a refused statement (never cached: ``lru_cache`` stores no exception)."""
    if len(sql) > _CACHED_SQL_CHARS:
        return _probe(sql)
    return _probe_cached(sql)


def _probe(sql: str) -> bool:
    probe = Statement(sql, [])
    return _rewrite(probe, _PROBE_CHOICES) is probe


_probe_cached = functools.lru_cache(maxsize=_CACHED_STATEMENTS)(_probe)


def rewrite_all_for_replay(
    statements: list[Statement], *, now: datetime | None = None
) -> tuple[Statement, ...]:
    """Every statement of one request rewritten with one set of :class:`Choices` (the
    same 'now' for all: ``now``, the record's, or the clock's), drawn only when some
    statement needs them."""
    if all(_replays_as_is(s.sql) for s in statements):
        return tuple(statements)
    choices = Choices.fresh(now)
    return tuple(rewrite_for_replay(s, choices) for s in statements)


def _closing(tokens: list[_Token], sig: list[int], open_at: int) -> int:
    """Index in ``sig`` of the ')' matching the '(' at ``sig[open_at]``; -1 if none."""
    depth = 0
    for k in range(open_at, len(sig)):
        text = tokens[sig[k]].text
        if text == "(":
            depth += 1
        elif text == ")":
            depth -= 1
            if depth == 0:
                return k
    return -1


def rewrite_for_replay(statement: Statement, choices: Choices) -> Statement:
    """``statement`` with every non-deterministic call replaced by the leader's value.

    RANDOM() becomes an integer literal, RANDOMBLOB(n) (n a literal) a blob literal,
    the date and time functions' 'now' (and their no-argument forms) and
    CURRENT_TIMESTAMP/DATE/TIME the leader's UTC time as text (RANDOMBLOB of a computed
    size is left to the replicas' function, which draws from the record's seed).
    Refused (BadRequestError): transaction control, ATTACH/DETACH/VACUUM, statements
    naming the applied-position table, last_insert_rowid()/changes()/total_changes(),
    and any of these in CREATE statements (a default, trigger or view would evaluate
    them later, for another record).
    """
    if _replays_as_is(statement.sql):
        return statement
    return _rewrite(statement, choices)


def _rewrite(statement: Statement, choices: Choices) -> Statement:
    tokens = _tokens(statement.sql)
    sig = _significant(tokens)
    creating = _is_create_or_refuse(statement, tokens, sig)
    changed = False
    k = 0
    while k < len(sig):
        token = tokens[sig[k]]
        if token.kind != "word":
            k += 1
            continue
        upper = token.text.upper()
        is_call = k + 1 < len(sig) and tokens[sig[k + 1]].text == "("
        if upper in _CURRENT_KEYWORDS and not is_call:
            _replace_current_keyword(token, upper, creating, choices.now)
            changed = True
            k += 1
            continue
        if not is_call:
            k += 1
            continue
        k, call_changed = _rewrite_call(tokens, sig, k, creating, choices)
        changed = changed or call_changed
    if not changed:
        return statement
    return Statement("".join(t.text for t in tokens), statement.params)


def _is_create_or_refuse(statement: Statement, tokens: list[_Token], sig: list[int]) -> bool:
    """Whether ``statement`` is a CREATE; raises BadRequestError for transaction control,
    ATTACH/DETACH/VACUUM and statements naming the applied-position table."""
    words = [tokens[i].text.upper() for i in sig if tokens[i].kind == "word"]
    head = words[0] if words else ""
    if head in ("ATTACH", "DETACH"):
        raise BadRequestError(f"{head} is not allowed: it reaches files outside the replica")
    if head == "VACUUM":
        raise BadRequestError(
            "VACUUM is not allowed: it rewrites one replica's file, not replicated data"
        )
    if head in _REFUSED_FIRST_WORDS:
        raise BadRequestError(
            f"{head} is not allowed: each request runs in a transaction of its own "
            "(ask for one with the 'transaction' parameter)"
        )
    if APPLIED_TABLE in statement.sql.lower():
        raise BadRequestError(f"{APPLIED_TABLE} is the replica's own table")
    return head == "CREATE"


def _replace_current_keyword(token: _Token, upper: str, creating: bool, now: datetime) -> None:
    """CURRENT_TIMESTAMP/DATE/TIME becomes the leader's UTC time as text."""
    if creating:
        raise BadRequestError(
            f"{upper} in CREATE would be evaluated separately on each replica: "
            "store the value explicitly"
        )
    token.kind, token.text = "string", f"'{now.strftime(_CURRENT_KEYWORDS[upper])}'"


def _rewrite_call(
    tokens: list[_Token], sig: list[int], k: int, creating: bool, choices: Choices
) -> tuple[int, bool]:
    """Rewrites the call whose name is at ``sig[k]``, or refuses it. Returns the index
    in ``sig`` to go on from and whether a token changed."""
    end = _closing(tokens, sig, k + 1)
    if end < 0:
        return k + 1, False  # unbalanced: SQLite reports the syntax error when applying
    name = tokens[sig[k]].text.lower()
    args = sig[k + 2 : end]
    if name in _CONNECTION_FUNCTIONS:
        raise BadRequestError(
            f"{name}() depends on the replica's connection and is refused in writes (use RETURNING)"
        )
    reads_clock = name in _DATE_FUNCTIONS and (
        (not args and name != "strftime") or any(tokens[j].text.lower() == "'now'" for j in args)
    )
    if creating and (name in ("random", "randomblob") or reads_clock):
        raise BadRequestError(f"{name}() in CREATE would be evaluated separately on each replica")
    if name == "random" and not args:
        _replace_call(tokens, sig, k, end, "number", f"({choices.random_int()})")
        return end + 1, True
    if name == "randomblob":
        size = _literal_int([tokens[j] for j in args])
        if size is None or size > _MAX_RANDOMBLOB_BYTES:
            # Every replica's randomblob() draws the same bytes, as many as asked (or
            # SQLite's "too big"): a literal in the record is kept for small blobs only.
            return k + 1, False
        blob = choices.random_bytes(max(1, size))
        _replace_call(tokens, sig, k, end, "blob", f"X'{blob.hex()}'")
        return end + 1, True
    if name in _DATE_FUNCTIONS:
        return k + 2, _stamp_date_call(tokens, sig, k, args, name, choices.now)
    return k + 1, False


def _replace_call(
    tokens: list[_Token], sig: list[int], k: int, end: int, kind: str, literal: str
) -> None:
    """The call from its name at ``sig[k]`` to its ')' at ``sig[end]`` becomes ``literal``."""
    tokens[sig[k]].kind, tokens[sig[k]].text = kind, literal
    for j in sig[k + 1 : end + 1]:
        tokens[j].text = ""


def _stamp_date_call(
    tokens: list[_Token], sig: list[int], k: int, args: list[int], name: str, now: datetime
) -> bool:
    """A date function's 'now' (or its missing time argument) becomes the leader's
    time; whether a token changed."""
    stamp = f"'{now.strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]}'"
    changed = False
    if not args and name != "strftime":
        tokens[sig[k + 1]].text = f"({stamp}"
        changed = True
    for j in args:
        if tokens[j].kind == "string" and tokens[j].text.lower() == "'now'":
            tokens[j].text = stamp
            changed = True
    return changed


def _literal_int(args: list[_Token]) -> int | None:
    significant = [t for t in args if t.kind not in ("space", "comment")]
    if len(significant) == 1 and significant[0].kind == "number":
        try:
            return int(significant[0].text)
        except ValueError:
            return None
    return None
