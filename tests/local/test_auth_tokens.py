"""Tokens, roles and the AUTH frame (quorumlog.security, quorumlog.proto): no sockets."""

from __future__ import annotations

import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from tls_certs import HMAC_SECRET

from quorumlog.errors import AuthenticationError, ProtocolError
from quorumlog.proto.codec import (
    AddFlag,
    AddRequest,
    AuthRequest,
    BookieInfoRequest,
    DeleteLedgerRequest,
    FenceRequest,
    FrameDecoder,
    LedgerKeyRequest,
    ReadRequest,
    WriteLacRequest,
    encode,
)
from quorumlog.security import Role, TokenVerifier, issue_token, permitted, read_token

KEY = bytes(20)


def _hmac_verifier() -> TokenVerifier:
    return TokenVerifier.from_key_bytes(HMAC_SECRET)


def test_auth_a_valid_token_yields_its_subject_roles_and_expiry():
    expires = time.time() + 600
    token = issue_token(HMAC_SECRET, ["client", "admin"], subject="app-1", expires_at_s=expires)
    identity = _hmac_verifier().verify(token)
    assert identity.subject == "app-1"
    assert identity.roles == {Role.CLIENT, Role.ADMIN}
    assert identity.expires_at_s == int(expires)
    assert identity.describe() == "app-1 [admin,client]"


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        (issue_token(HMAC_SECRET, ["client"], expires_at_s=time.time() - 5), "token expired"),
        (issue_token(b"another-secret-of-32-bytes-or-more!!", ["client"]), "signature"),
        (jwt.encode({"sub": "x"}, HMAC_SECRET, algorithm="HS256"), "no role claim"),
        (jwt.encode({"role": "root"}, HMAC_SECRET, algorithm="HS256"), "unknown role 'root'"),
        (jwt.encode({"role": []}, HMAC_SECRET, algorithm="HS256"), "no role claim"),
        (jwt.encode({"role": "client"}, None, algorithm="none"), "algorithm"),
        ("not-a-token", "invalid token"),
        ("x" * 20_000, "refused"),
    ],
    ids=[
        "expired",
        "bad-signature",
        "no-role",
        "unknown-role",
        "empty-roles",
        "alg-none",
        "garbage",
        "oversized",
    ],
)
def test_auth_bad_tokens_are_refused_with_a_reason_that_does_not_quote_them(token, reason):
    with pytest.raises(AuthenticationError, match=reason) as caught:
        _hmac_verifier().verify(token)
    assert token[:40] not in str(caught.value)


def test_auth_public_key_files_pick_their_algorithms_and_refuse_hmac_confusion(tmp_path: Path):
    private = ec.generate_private_key(ec.SECP256R1())
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    key_file = tmp_path / "tokens.pub"
    key_file.write_bytes(public_pem)
    verifier = TokenVerifier.from_key_file(key_file)
    assert verifier.algorithms == ("ES256",)  # its curve's alone
    good = issue_token(private, ["bookie"], subject="rw-1", algorithm="ES256")
    assert verifier.verify(good).roles == {Role.BOOKIE}
    # The classic confusion: an HMAC token whose secret is the (public) key file itself.
    forged = jwt.encode({"role": "admin"}, b"x" * 64, algorithm="HS256")
    with pytest.raises(AuthenticationError, match="algorithm"):
        verifier.verify(forged)


def test_auth_key_files_too_weak_or_private_are_refused(tmp_path: Path):
    short = tmp_path / "short.key"
    short.write_bytes(b"password\n")
    with pytest.raises(ValueError, match="at least 32"):
        TokenVerifier.from_key_file(short)
    private = tmp_path / "private.pem"
    private.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    with pytest.raises(ValueError, match="public half"):
        TokenVerifier.from_key_file(private)
    with pytest.raises(ValueError, match=r"missing\.key"):
        TokenVerifier.from_key_file(tmp_path / "missing.key")


def test_auth_tokens_come_from_a_file_before_the_environment(tmp_path: Path):
    path = tmp_path / "token"
    path.write_text("from-file\n")
    env = {"QUORUMLOG_TOKEN": "from-env"}
    assert read_token(path, env) == "from-file"
    assert read_token(None, env) == "from-env"
    assert read_token(None, {}) is None
    path.write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        read_token(path, env)


def test_auth_roles_permit_what_docs_security_md_lists():
    add = AddRequest(1, 1, KEY, [])
    recovery_add = AddRequest(1, 1, KEY, [], AddFlag.RECOVERY)
    table = {
        "add": add,
        "recovery add": recovery_add,
        "read": ReadRequest(1, 1, 0),
        "fence": FenceRequest(1, 1, KEY),
        "write lac": WriteLacRequest(1, 1, KEY, 0),
        "delete": DeleteLedgerRequest(1, 1, KEY),
        "info": BookieInfoRequest(1),
        "ledger key": LedgerKeyRequest(1, 1),
    }
    allowed = {
        role: sorted(name for name, r in table.items() if permitted(r, [role])) for role in Role
    }
    assert allowed == {
        Role.CLIENT: ["add", "fence", "info", "read", "recovery add", "write lac"],
        Role.BOOKIE: ["fence", "info", "ledger key", "read", "recovery add"],
        Role.ADMIN: sorted(table),
    }


def test_auth_frame_hides_its_credential_and_refuses_lying_lengths():
    request = AuthRequest(7, b"eyJsecret.payload.sig")
    assert "secret" not in repr(request)
    frame = bytearray(encode(request))
    frame[16:18] = (999).to_bytes(2, "big")  # credential length past the body
    with pytest.raises(ProtocolError, match="credential length"):
        FrameDecoder().feed(bytes(frame))
    # An unknown version or mechanism still decodes: the bookie answers it with a reason.
    odd = FrameDecoder().feed(encode(AuthRequest(7, b"t", mechanism=9, version=2)))
    assert odd == [AuthRequest(7, b"t", mechanism=9, version=2)]
