"""``quorumlog token create`` and ``verify``: tokens an operator makes are the ones a
bookie with the matching key file accepts."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from tls_certs import HMAC_SECRET, write_hmac_key

from quorumlog.commands import main
from quorumlog.security import Role, TokenVerifier


def _create(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["token", "create", *args]) == 0
    return capsys.readouterr().out.strip()


def test_auth_token_create_signs_what_a_bookie_with_the_key_accepts(tmp_path: Path, capsys):
    key_file = write_hmac_key(tmp_path)
    token = _create(
        capsys, "--key-file", str(key_file), "--role", "client", "--role", "admin",
        "--subject", "app-1", "--expires-in", "2h",
    )  # fmt: skip
    identity = TokenVerifier.from_key_bytes(HMAC_SECRET).verify(token)
    assert identity.subject == "app-1" and identity.roles == {Role.CLIENT, Role.ADMIN}
    assert identity.expires_at_s is not None
    assert 7100 < identity.expires_at_s - time.time() <= 7200


def test_auth_token_create_with_a_private_key_verifies_with_its_public_half(tmp_path: Path, capsys):
    private = ec.generate_private_key(ec.SECP384R1())
    private_file, public_file = tmp_path / "signer.pem", tmp_path / "bookies.pub"
    private_file.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public_file.write_bytes(
        private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    token = _create(capsys, "--key-file", str(private_file), "--role", "bookie")
    assert TokenVerifier.from_key_file(public_file).verify(token).roles == {Role.BOOKIE}
    # The public half signs nothing.
    assert main(["token", "create", "--key-file", str(public_file), "--role", "bookie"]) == 2
    assert "private half" in capsys.readouterr().err


def test_auth_token_verify_reads_stdin_and_says_why_it_refuses(tmp_path: Path, capsys, monkeypatch):
    key_file = write_hmac_key(tmp_path)
    good = _create(capsys, "--key-file", str(key_file), "--role", "client", "--subject", "x")
    monkeypatch.setattr("sys.stdin", io.StringIO(good + "\n"))
    assert main(["token", "verify", "--key-file", str(key_file)]) == 0
    assert capsys.readouterr().out == "valid: x [client], expires never\n"
    # A lifetime of 0: exp is this second, rounded down, so it has passed already.
    expired = _create(capsys, "--key-file", str(key_file), "--role", "client", "--expires-in", "0")
    token_file = tmp_path / "expired.token"
    token_file.write_text(expired)
    status = main(["token", "verify", "--key-file", str(key_file), "--token-file", str(token_file)])
    assert (status, capsys.readouterr().out) == (1, "refused: token expired\n")
