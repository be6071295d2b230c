"""Tokens and key files an attacker or a careless operator may bring (quorumlog.security):
no sockets. Every refusal is an AuthenticationError or a ValueError naming the defect,
never a library exception escaping, and never quoting the token or the key."""

from __future__ import annotations

import time
import typing

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from tls_certs import HMAC_SECRET

from quorumlog.errors import AuthenticationError
from quorumlog.proto.codec import (
    AddFlag,
    AddRequest,
    AuthRequest,
    BookieInfoRequest,
    DeleteLedgerRequest,
    FenceRequest,
    LedgerKeyRequest,
    ReadFlag,
    ReadLacRequest,
    ReadRequest,
    Request,
    WriteLacRequest,
)
from quorumlog.security import Role, TokenVerifier, required_roles
from quorumlog.security.tokens import unverified_expiry_s


def _public_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@pytest.mark.parametrize(
    ("curve", "algorithm"),
    [(ec.SECP384R1(), "ES256"), (ec.SECP256R1(), "ES512"), (ec.SECP521R1(), "ES384")],
    ids=["p384-key-es256-token", "p256-key-es512-token", "p521-key-es384-token"],
)
def test_auth_an_ec_token_of_another_curve_is_refused_not_a_crash(
    curve: ec.EllipticCurve, algorithm: str
):
    """A bookie with a P-384 key: anyone may send an ES256 token. PyJWT then raises
    InvalidKeyError, which is no InvalidTokenError: it must still be a refusal."""
    bookie_key = ec.generate_private_key(curve)
    attacker_key = ec.generate_private_key(
        {"ES256": ec.SECP256R1(), "ES384": ec.SECP384R1(), "ES512": ec.SECP521R1()}[algorithm]
    )
    verifier = TokenVerifier.from_key_bytes(_public_pem(bookie_key))
    token = jwt.encode({"role": "admin"}, attacker_key, algorithm=algorithm)
    with pytest.raises(AuthenticationError) as refused:
        verifier.verify(token)
    assert "algorithm" in refused.value.message
    assert token not in refused.value.message


def test_auth_an_ec_key_allows_only_its_own_curves_algorithm():
    for curve, algorithm in [
        (ec.SECP256R1(), "ES256"),
        (ec.SECP384R1(), "ES384"),
        (ec.SECP521R1(), "ES512"),
    ]:
        key = ec.generate_private_key(curve)
        verifier = TokenVerifier.from_key_bytes(_public_pem(key))
        assert verifier.algorithms == (algorithm,)
        assert verifier.verify(jwt.encode({"role": "client"}, key, algorithm=algorithm)).roles


def test_auth_a_string_exp_still_ends_the_connection():
    """PyJWT accepts an ``exp`` written as a string of digits (and checks it): the
    identity must carry that expiry too, or the bookie never ends the connection."""
    expires_at_s = int(time.time()) + 60
    token = jwt.encode({"role": "client", "exp": str(expires_at_s)}, HMAC_SECRET, "HS256")
    identity = TokenVerifier.from_key_bytes(HMAC_SECRET).verify(token)
    assert identity.expires_at_s == expires_at_s


def _ssh_public_key() -> bytes:
    key = rsa.generate_private_key(65537, 2048)
    return key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )


def _p256_der_public_key(scalar: int) -> bytes:
    """The DER SubjectPublicKeyInfo of the P-256 key whose private scalar is ``scalar``:
    the same bytes on every run (a generated key's last byte is whitespace one time in
    about 43, which the refusal once depended on)."""
    key = ec.derive_private_key(scalar, ec.SECP256R1())
    return key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


# Scalar 1's key (the curve's generator) ends in 0xf5, no whitespace byte: the plain case.
_DER_KEY = _p256_der_public_key(1)
_ASCII_WHITESPACE = b" \t\n\r\x0b\x0c"  # what bytes.strip() takes off


@pytest.mark.parametrize("key_bytes", [_ssh_public_key(), _DER_KEY], ids=["ssh", "der"])
def test_auth_a_public_key_not_in_pem_is_refused_at_load(key_bytes: bytes):
    """A public key in another format must not become an HMAC secret (public bytes as a
    secret would let anyone sign): the key file is refused when the bookie starts."""
    assert key_bytes[-1] not in _ASCII_WHITESPACE
    with pytest.raises(ValueError, match="PEM") as refused:
        TokenVerifier.from_key_bytes(key_bytes, name="token.pub")
    assert "token.pub" in str(refused.value)
    assert key_bytes.decode("latin-1")[:60] not in str(refused.value)


def _der_keys_covering_every_trailing_whitespace_byte() -> list[bytes]:
    """P-256 DER public keys from scalars 2, 3, ...: at least 300 of them, and on until
    two end in each whitespace byte (the same keys on every run)."""
    keys: list[bytes] = []
    ending = dict.fromkeys(_ASCII_WHITESPACE, 0)
    scalar = 2
    while len(keys) < 300 or min(ending.values()) < 2:
        key = _p256_der_public_key(scalar)
        keys.append(key)
        if key[-1] in ending:
            ending[key[-1]] += 1
        scalar += 1
    return keys


def test_auth_a_der_public_key_ending_in_whitespace_is_refused_at_load():
    """The secret is stripped of whitespace; a DER key whose last byte is whitespace must
    be recognised all the same (stripped, it no longer parses), and so must a DER key
    saved with a line break or other whitespace after it."""
    keys = _der_keys_covering_every_trailing_whitespace_byte()
    ending_in_whitespace = [key for key in keys if key[-1] in _ASCII_WHITESPACE]
    assert len(ending_in_whitespace) >= 2 * len(_ASCII_WHITESPACE)
    accepted = 0
    for key in keys:
        for key_file in (key, key + b"\n", b"\n" + key + b" \r\n"):
            try:
                TokenVerifier.from_key_bytes(key_file, name="token.der")
            except ValueError as exc:
                assert "PEM" in str(exc)
            else:
                accepted += 1
    assert accepted == 0, f"{accepted} of {3 * len(keys)} DER key files taken as HMAC secrets"


def test_auth_a_subject_is_logged_on_one_line_and_cut_short():
    token = jwt.encode({"role": "client", "sub": "app\nFORGED line" + "x" * 500}, HMAC_SECRET)
    described = TokenVerifier.from_key_bytes(HMAC_SECRET).verify(token).describe()
    assert "\n" not in described and described.startswith("app\\nFORGED line")
    assert len(described) < 150


def test_auth_the_role_table_is_the_documented_one_and_fails_closed():
    """docs/SECURITY.md's table, request kind by request kind; a kind the table does not
    name (one added to the protocol later) is left to admin, not opened to every role."""
    key = bytes(20)
    every, ledger_users = set(Role), {Role.CLIENT, Role.ADMIN}
    table = {
        AddRequest: (AddRequest(1, 1, key, [b"e"]), ledger_users),
        ReadRequest: (ReadRequest(1, 1, 0, flags=ReadFlag.FENCE, master_key=key), every),
        ReadLacRequest: (ReadLacRequest(1, 1), every),
        FenceRequest: (FenceRequest(1, 1, key), every),
        WriteLacRequest: (WriteLacRequest(1, 1, key, 0), ledger_users),
        DeleteLedgerRequest: (DeleteLedgerRequest(1, 1, key), {Role.ADMIN}),
        BookieInfoRequest: (BookieInfoRequest(1), every),
        LedgerKeyRequest: (LedgerKeyRequest(1, 1), {Role.BOOKIE, Role.ADMIN}),
    }
    # Every request kind of the protocol but AUTH (answered before any role) is listed.
    assert set(typing.get_args(Request)) - {AuthRequest} == set(table)
    for request, roles in table.values():
        assert required_roles(request) == roles, request
    assert required_roles(AddRequest(1, 1, key, [b"e"], flags=AddFlag.RECOVERY)) == every
    assert required_roles(object()) == {Role.ADMIN}  # type: ignore[arg-type]


def test_auth_a_client_renews_a_token_whose_exp_is_a_string():
    """The bookie ends the connection at such a token's exp: the client must know it too,
    to present a renewed token before then."""
    expires_at_s = int(time.time()) + 60
    token = jwt.encode({"role": "client", "exp": str(expires_at_s)}, HMAC_SECRET, "HS256")
    assert unverified_expiry_s(token) == expires_at_s
    assert unverified_expiry_s(jwt.encode({"role": "client", "exp": "soon"}, HMAC_SECRET)) is None
