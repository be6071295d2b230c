"""Signed tokens (JSON Web Tokens through PyJWT) with roles and an expiry.

A bookie (or an HTTP API) is configured with a key file: an HMAC secret (at least 32
bytes, HS256/384/512) or a PEM public key (RSA: RS*/PS*, EC: ES*, Ed25519/Ed448:
EdDSA); the algorithms follow from the key, so a token can never pick a weaker one
(``none`` is never accepted, nor an HMAC token checked with a public key as its
secret). A token must carry a ``role`` claim (``client``, ``admin``, ``bookie``, or a
list of them); ``exp`` is checked when present, ``sub`` names the holder in logs.

Clients read their token from a file or from ``QUORUMLOG_TOKEN``, never from a command
line (``ps`` shows those to every user of the machine).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import jwt
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import (
    load_der_public_key,
    load_pem_private_key,
    load_pem_public_key,
)

from quorumlog.errors import AuthenticationError
from quorumlog.security.roles import Role, parse_roles

TOKEN_ENV_VAR = "QUORUMLOG_TOKEN"
MIN_HMAC_KEY_BYTES = 32  # HS256's own size: a shorter secret is guessable
# A token is a few hundred bytes; a larger one is refused before it is parsed.
MAX_TOKEN_BYTES = 16 * 1024
MAX_LOGGED_SUBJECT_CHARS = 100

_HMAC_ALGORITHMS = ("HS256", "HS384", "HS512")
_RSA_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
# An EC key signs with one algorithm, named by its curve: allowing the others only lets
# a token of another curve reach PyJWT, which then raises InvalidKeyError.
_EC_ALGORITHM_BY_CURVE_BITS = {256: "ES256", 384: "ES384", 521: "ES512"}
_EDDSA_ALGORITHMS = ("EdDSA",)


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a verified token says its holder is. ``expires_at_s``: the ``exp`` claim
    (seconds since the epoch), None when the token has none."""

    subject: str
    roles: frozenset[Role]
    expires_at_s: float | None = None

    def describe(self) -> str:
        """For logs: the subject and roles, never the token."""
        roles = ",".join(sorted(self.roles))
        # The subject is the token issuer's text: escaped (no line breaks of its own in
        # the log) and cut short.
        subject = self.subject[:MAX_LOGGED_SUBJECT_CHARS].encode("unicode_escape").decode("ascii")
        return f"{subject or '(no subject)'} [{roles}]"


class TokenVerifier:
    """Checks tokens against one key; :meth:`verify` raises AuthenticationError saying why."""

    def __init__(
        self, key: bytes | str | object, algorithms: Iterable[str], *, leeway_s: float = 0.0
    ) -> None:
        self._key = key
        self.algorithms = tuple(algorithms)
        self.leeway_s = leeway_s

    @classmethod
    def from_key_file(cls, path: str | os.PathLike[str], *, leeway_s: float = 0.0) -> TokenVerifier:
        """A verifier for the key in ``path`` (see the module docstring for the kinds)."""
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ValueError(f"token key file {path}: {exc.strerror or exc}") from None
        return cls.from_key_bytes(data, name=str(path), leeway_s=leeway_s)

    @classmethod
    def from_key_bytes(
        cls, data: bytes, *, name: str = "key", leeway_s: float = 0.0
    ) -> TokenVerifier:
        if b"-----BEGIN" in data:
            try:
                public_key = load_pem_public_key(data)
            except ValueError:
                raise ValueError(
                    f"token key file {name}: a PEM block that is not a public key "
                    "(give the public half: bookies only check tokens)"
                ) from None
            if isinstance(public_key, rsa.RSAPublicKey):
                return cls(public_key, _RSA_ALGORITHMS, leeway_s=leeway_s)
            if isinstance(public_key, ec.EllipticCurvePublicKey):
                algorithm = _EC_ALGORITHM_BY_CURVE_BITS.get(public_key.curve.key_size)
                if algorithm is None:
                    raise ValueError(f"token key file {name}: unsupported curve")
                return cls(public_key, (algorithm,), leeway_s=leeway_s)
            if isinstance(public_key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
                return cls(public_key, _EDDSA_ALGORITHMS, leeway_s=leeway_s)
            raise ValueError(f"token key file {name}: unsupported key type")
        secret = data.strip()
        if len(secret) < MIN_HMAC_KEY_BYTES:
            raise ValueError(
                f"token key file {name}: an HMAC secret of {len(secret)} bytes; at least "
                f"{MIN_HMAC_KEY_BYTES} are needed"
            )
        # The bytes as given: a DER key whose last byte is whitespace no longer parses
        # once stripped (one fresh P-256 key in about 43).
        _refuse_asymmetric_secret(data, name)
        return cls(secret, _HMAC_ALGORITHMS, leeway_s=leeway_s)

    def verify(self, token: str | bytes) -> Identity:
        """The identity ``token`` proves; AuthenticationError (never quoting the token) if none."""
        if len(token) > MAX_TOKEN_BYTES:
            raise AuthenticationError(
                f"token of {len(token)} bytes refused (over {MAX_TOKEN_BYTES})"
            )
        if isinstance(token, bytes):
            try:
                token = token.decode("ascii")
            except UnicodeDecodeError:
                raise AuthenticationError("malformed token (not ASCII)") from None
        try:
            claims = jwt.decode(
                token,
                self._key,  # type: ignore[arg-type]
                algorithms=list(self.algorithms),
                leeway=self.leeway_s,
                options={"require": ["role"], "verify_aud": False},
            )
        except jwt.ExpiredSignatureError:
            raise AuthenticationError("token expired") from None
        except jwt.ImmatureSignatureError:
            raise AuthenticationError("token not valid yet (nbf or iat in the future)") from None
        except jwt.MissingRequiredClaimError:
            raise AuthenticationError(
                "the token has no role claim (client, admin or bookie)"
            ) from None
        except jwt.InvalidAlgorithmError:
            raise AuthenticationError(
                "token signed with an algorithm this key does not allow "
                f"({', '.join(self.algorithms)})"
            ) from None
        except jwt.InvalidSignatureError:
            raise AuthenticationError(
                "token signature does not verify with the configured key"
            ) from None
        except jwt.InvalidKeyError:
            # A token whose algorithm the key allows but whose parameters it does not fit.
            raise AuthenticationError(
                "token signed with an algorithm this key does not allow "
                f"({', '.join(self.algorithms)})"
            ) from None
        except jwt.PyJWTError as exc:
            # PyJWT's messages name the defect (bad padding, bad header), never the token;
            # only the exception's name is kept all the same.
            raise AuthenticationError(f"invalid token: {type(exc).__name__}") from None
        return _identity(claims)


def _refuse_asymmetric_secret(data: bytes, name: str) -> None:
    """A public key in a format other than PEM (OpenSSH, DER) is no HMAC secret: its bytes
    are public (anyone could sign), and PyJWT refuses such keys at every token anyway.
    ``data``: the key file's bytes as read, before any whitespace is stripped."""
    if not _is_asymmetric_key(data):
        return
    raise ValueError(
        f"token key file {name}: an asymmetric key that is not PEM (give the public key "
        "as PEM, e.g. openssl pkey -pubin -in KEY -out token.pub; or an HMAC secret)"
    )


def _is_asymmetric_key(data: bytes) -> bool:
    """Whether ``data`` is, or starts with, a public key: PEM, OpenSSH or certificate
    text, or a DER SubjectPublicKeyInfo. Whitespace around the key changes nothing: the
    bytes as given, stripped, and the first DER element after any leading whitespace are
    all tried (stripping alone would eat a DER key's own last byte when it is one)."""
    stripped = data.strip()
    hmac = jwt.algorithms.HMACAlgorithm(jwt.algorithms.HMACAlgorithm.SHA256)
    for text in (data, stripped):
        try:
            hmac.prepare_key(text)
        except jwt.InvalidKeyError:
            return True  # PEM, OpenSSH or certificate text
    candidates = (data, stripped, _first_der_element(data.lstrip()))
    return any(candidate and _is_der_public_key(candidate) for candidate in candidates)


def _first_der_element(data: bytes) -> bytes:
    """The leading DER SEQUENCE of ``data`` by its own length (whatever follows it), or
    b"" when ``data`` does not start with one that fits."""
    if len(data) < 2 or data[0] != 0x30:
        return b""
    first = data[1]
    if first < 0x80:
        header, length = 2, first
    else:
        count = first & 0x7F
        if not 1 <= count <= 4 or len(data) < 2 + count:
            return b""
        header, length = 2 + count, int.from_bytes(data[2 : 2 + count], "big")
    if header + length > len(data):
        return b""
    return data[: header + length]


def _is_der_public_key(data: bytes) -> bool:
    try:
        load_der_public_key(data)
    except UnsupportedAlgorithm:
        return True  # a public key all the same, of a kind this library does not load
    except ValueError:
        return False
    return True


def _identity(claims: Mapping[str, object]) -> Identity:
    try:
        roles = parse_roles(claims.get("role"))
    except ValueError as exc:
        raise AuthenticationError(str(exc)) from None
    expires = claims.get("exp")
    subject = claims.get("sub")
    return Identity(
        subject=subject if isinstance(subject, str) else "",
        roles=roles,
        expires_at_s=_expiry_s(expires),
    )


def _expiry_s(claim: object) -> float | None:
    """An ``exp`` claim as seconds since the epoch, read as PyJWT checks it: a number, or
    a string of digits (int()); None when absent or unreadable."""
    if isinstance(claim, int | float):
        return float(claim)
    if isinstance(claim, str):
        try:
            return float(int(claim))
        except ValueError:
            return None
    return None


def signing_key_from_bytes(data: bytes, *, name: str = "key") -> tuple[object, str]:
    """The key that signs tokens, from a key file's bytes, and its default algorithm: an
    HMAC secret (HS256) or a PEM private key (RS256, ES256/384/512 by curve, EdDSA)."""
    if b"-----BEGIN" not in data:
        secret = data.strip()
        if len(secret) < MIN_HMAC_KEY_BYTES:
            raise ValueError(
                f"token key file {name}: an HMAC secret of {len(secret)} bytes; at least "
                f"{MIN_HMAC_KEY_BYTES} are needed"
            )
        return secret, "HS256"
    try:
        private_key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise ValueError(
            f"token key file {name}: not an unencrypted PEM private key (tokens are "
            "signed with the private half)"
        ) from None
    if isinstance(private_key, rsa.RSAPrivateKey):
        return private_key, "RS256"
    if isinstance(private_key, ec.EllipticCurvePrivateKey):
        bits = private_key.curve.key_size
        return private_key, {256: "ES256", 384: "ES384"}.get(bits, "ES512")
    if isinstance(private_key, ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey):
        return private_key, "EdDSA"
    raise ValueError(f"token key file {name}: unsupported key type")


def issue_token(
    key: bytes | str | object,
    roles: Iterable[Role | str],
    *,
    subject: str = "",
    expires_at_s: float | None = None,
    algorithm: str = "HS256",
) -> str:
    """A signed token (operators' tooling and tests): ``key`` is the HMAC secret or the
    private key; ``expires_at_s`` the ``exp`` claim, seconds since the epoch."""
    names = [Role(r).value for r in roles]
    claims: dict[str, object] = {"role": names[0] if len(names) == 1 else names}
    if subject:
        claims["sub"] = subject
    if expires_at_s is not None:
        claims["exp"] = int(expires_at_s)
    return jwt.encode(claims, key, algorithm=algorithm)  # type: ignore[arg-type]


# A client presents a renewed token this long before its token expires (or halfway
# through a shorter remaining life), so that the bookie never ends the connection.
RENEW_BEFORE_EXPIRY_S = 30.0


def unverified_expiry_s(token: str) -> float | None:
    """The ``exp`` claim of ``token`` read without checking the signature: only to know
    when to renew it, never to trust it. None when absent or unreadable."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.InvalidTokenError:
        return None
    return _expiry_s(claims.get("exp"))


def renewal_delay_s(expires_at_s: float, now_s: float) -> float:
    """How long from ``now_s`` until a token expiring at ``expires_at_s`` is renewed."""
    remaining_s = max(0.0, expires_at_s - now_s)
    return remaining_s - min(RENEW_BEFORE_EXPIRY_S, remaining_s / 2)


def read_token(
    token_file: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The token from ``token_file`` (whitespace stripped), else from ``QUORUMLOG_TOKEN``,
    else None. A named file that cannot be read is a ValueError naming the file."""
    if token_file is not None:
        try:
            text = Path(token_file).read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(
                f"token file {token_file}: {getattr(exc, 'strerror', None) or exc}"
            ) from None
        if not text:
            raise ValueError(f"token file {token_file} is empty")
        return text
    env = os.environ if environ is None else environ
    value = env.get(TOKEN_ENV_VAR, "").strip()
    return value or None


class TokenFile:
    """A client's token, read again when its file changes (a renewed token serves the next
    connection); without a file, ``QUORUMLOG_TOKEN``. Call it for the token (or None)."""

    def __init__(
        self, token_file: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None
    ) -> None:
        """Reads the token now: a named file that cannot be read is a ValueError."""
        self.token_file = token_file
        self._token = read_token(token_file, environ)
        self._stamp = self._mtime()

    def _mtime(self) -> int:
        if self.token_file is None:
            return -1
        try:
            return os.stat(self.token_file).st_mtime_ns
        except OSError:
            return -1

    def __call__(self) -> str | None:
        stamp = self._mtime()
        if stamp != self._stamp and stamp != -1:
            try:
                self._token = read_token(self.token_file)
                self._stamp = stamp
            except ValueError:
                pass  # caught half-written: keep the previous token, read again next time
        return self._token

    def __repr__(self) -> str:
        return f"TokenFile({self.token_file!r})"
