"""The redaction a server puts on its log handlers (quorumlog.security.options
.redact_logs) against what the ZooKeeper client prints at DEBUG: its AUTH request with
the digest credential ``user:password``, whatever the password's length."""

from __future__ import annotations

import argparse
import io
import logging
from pathlib import Path

import pytest

from quorumlog.commands.gc_trigger import _Credentials
from quorumlog.security.options import redact_logs


@pytest.mark.parametrize("password", ["s3cr3t", "a-longer-password"])
def test_auth_a_zookeeper_digest_credential_is_redacted_as_printed(tmp_path: Path, password: str):
    digest_file = tmp_path / "zk-digest"
    digest_file.write_text(f"quorumlog:{password}\n")
    digest_file.chmod(0o600)
    args = argparse.Namespace(metadata=f"zk://127.0.0.1:2181/q?digest_file={digest_file}")
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    root = logging.getLogger()
    root.addHandler(handler)
    redacting = None
    try:
        redacting = redact_logs(args)
        # What kazoo logs at DEBUG when it authenticates a session.
        logging.getLogger("kazoo.protocol.connection").warning(
            "Sending request(xid=%s): %s",
            -4,
            f"Auth(auth_type=0, scheme='digest', auth='quorumlog:{password}')",
        )
    finally:
        root.removeHandler(handler)
        if redacting is not None:
            handler.removeFilter(redacting)
    assert "Sending request" in out.getvalue()
    assert password not in out.getvalue()


def test_auth_the_shells_admin_api_credentials_do_not_print_the_token(
    tmp_path: Path,
):
    token_file = tmp_path / "admin.token"
    token_file.write_text("eyJhbGciOiJIUzI1NiJ9.eyJyb2xlIjoiYWRtaW4ifQ.c2lnbmF0dXJl\n")
    credentials = _Credentials.from_args(argparse.Namespace(token_file=str(token_file)))
    assert credentials.headers["Authorization"].startswith("Bearer eyJ")
    assert "eyJ" not in repr(credentials) and "eyJ" not in str(credentials)
