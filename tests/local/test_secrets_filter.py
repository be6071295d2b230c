"""Redaction helpers (quorumlog.security.redaction): what a log line may never carry."""

from __future__ import annotations

import argparse
import io
import logging

from tls_certs import HMAC_SECRET

from quorumlog.security import Role, Secret, issue_token, redact
from quorumlog.security import options as security_options
from quorumlog.security.redaction import RedactingFilter


def test_secrets_redact_replaces_listed_secrets_and_anything_shaped_like_a_token():
    token = issue_token(HMAC_SECRET, [Role.CLIENT])
    text = f"key={HMAC_SECRET.decode()} header=Bearer {token} short=abc"
    cleaned = redact(text, [HMAC_SECRET])
    assert cleaned == "key=*** header=Bearer *** short=abc"
    # Too short to be a secret: redacting it would eat ordinary words.
    assert redact("a pw here", ["pw"]) == "a pw here"


def test_secrets_the_log_filter_cleans_messages_arguments_and_tracebacks():
    token = issue_token(HMAC_SECRET, [Role.ADMIN])
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter([HMAC_SECRET]))
    logger = logging.getLogger("test_secrets_filter")
    logger.addHandler(handler)
    logger.propagate = False  # this test's handler only
    try:
        logger.warning("presented %s", token)
        try:
            raise ValueError(f"bad key {HMAC_SECRET.decode()}")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    output = stream.getvalue()
    assert "presented ***" in output and "bad key ***" in output
    assert token not in output and HMAC_SECRET.decode() not in output


def test_secrets_a_secret_value_prints_as_a_placeholder():
    secret = Secret("s3cr3t-value")
    assert (str(secret), repr(secret), f"{secret}") == ("***", "Secret(***)", "***")
    assert secret.reveal() == "s3cr3t-value"
    assert secret == Secret("s3cr3t-value")


def test_secrets_the_commands_redact_the_key_token_and_zookeeper_password(tmp_path, monkeypatch):
    digest = tmp_path / "zk.digest"
    digest.write_text("quorumlog:zk-password-of-the-test\n")
    key = tmp_path / "token.key"
    key.write_bytes(HMAC_SECRET)
    token = issue_token(HMAC_SECRET, [Role.CLIENT])
    monkeypatch.setenv("QUORUMLOG_TOKEN", token)
    args = argparse.Namespace(
        metadata=f"zk://127.0.0.1:2181/q?digest_file={digest}",
        token_file=None,
        token_key_file=str(key),
    )
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        redacting = security_options.redact_logs(args)
        logging.getLogger("test_secrets_filter.commands").warning(
            "zk-password-of-the-test %s %s", HMAC_SECRET.decode(), token
        )
    finally:
        root.removeHandler(handler)
        for each in root.handlers:
            each.removeFilter(redacting)
    assert stream.getvalue() == "*** *** ***\n"
