"""Keeping secrets out of logs, metrics, metadata and error messages.

Three guards: :class:`Secret` holds a secret whose ``repr`` and ``str`` are a
placeholder (a secret in a dataclass or an f-string prints as ``***``); :func:`redact`
replaces known secrets and anything shaped like a JSON Web Token in a text; and
:func:`install_log_redaction` puts a filter on the root logger's handlers that does the
same to every record, a last line of defence for messages of other libraries.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

PLACEHOLDER = "***"
# header.payload.signature, each base64url; headers always start with '{"' = "eyJ".
_JWT_SHAPE = re.compile(r"eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*")
# A secret shorter than this would redact ordinary words: such secrets are refused where
# they are configured (an HMAC key has at least 32 bytes).
_MIN_REDACTED_LENGTH = 8


class Secret:
    """A secret value that does not print itself. ``reveal()`` is the one way to read it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({PLACEHOLDER})"

    def __str__(self) -> str:
        return PLACEHOLDER

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def redact(text: str, secrets: Iterable[str | bytes] = ()) -> str:
    """``text`` with every listed secret and every token-shaped string replaced."""
    for secret in secrets:
        value = secret.decode("utf-8", "replace") if isinstance(secret, bytes) else secret
        if len(value) >= _MIN_REDACTED_LENGTH:
            text = text.replace(value, PLACEHOLDER)
    return _JWT_SHAPE.sub(PLACEHOLDER, text)


class RedactingFilter(logging.Filter):
    """Rewrites each record's message with :func:`redact` (formatting it first)."""

    def __init__(self, secrets: Iterable[str | bytes] = ()) -> None:
        super().__init__()
        self.secrets: list[str | bytes] = list(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message, self.secrets)
        if cleaned != message:
            record.msg = cleaned
            record.args = None
        if record.exc_info and record.exc_text is None and record.exc_info[1] is not None:
            formatted = logging.Formatter().formatException(record.exc_info)
            record.exc_text = redact(formatted, self.secrets)
        return True


def install_log_redaction(secrets: Iterable[str | bytes] = ()) -> RedactingFilter:
    """Add a :class:`RedactingFilter` to every handler of the root logger (call after
    logging is configured); returns it, so that more secrets can be appended."""
    redacting = RedactingFilter(secrets)
    for handler in logging.getLogger().handlers:
        handler.addFilter(redacting)
    return redacting
