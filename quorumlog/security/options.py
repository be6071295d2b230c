"""The security flags of the commands (docs/SECURITY.md), in one place.

Servers (``quorumlog bookie``, ``quorumlog db serve``): ``--tls-cert``, ``--tls-key``,
``--tls-ca`` (mutual TLS when given) and ``--token-key-file`` (the HMAC secret or public
key that tokens must verify with). Clients (``quorumlog shell``, ``autorecovery``, the
database's replicas): ``--tls`` or ``--tls-ca``, ``--tls-cert``/``--tls-key`` for mutual
TLS, and ``--token-file``; without it the token comes from ``QUORUMLOG_TOKEN``. A token is
never a flag's value: command lines are visible to every user of the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import urllib.parse
from pathlib import Path

from quorumlog.security.redaction import RedactingFilter, install_log_redaction
from quorumlog.security.tls import TlsFiles, TlsReloader
from quorumlog.security.tokens import TokenFile, TokenVerifier


def add_server_tls_options(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--tls-cert",
        default=None,
        metavar="PEM",
        help=f"serve TLS on {what} with this certificate (chain); reloaded when it changes",
    )
    p.add_argument("--tls-key", default=None, metavar="PEM", help="the certificate's key")
    p.add_argument(
        "--tls-ca",
        default=None,
        metavar="PEM",
        help="mutual TLS: accept only clients with a certificate of this CA",
    )


def add_token_key_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--token-key-file",
        default=None,
        metavar="FILE",
        help="require a token this key verifies: an HMAC secret (32 bytes or more) or "
        "a PEM public key (RSA, EC, Ed25519); default: none required",
    )


def add_http_security_options(p: argparse.ArgumentParser) -> None:
    """A daemon's own HTTP API (not a bookie's): HTTPS files and the token key."""
    p.add_argument("--http-tls-cert", default=None, metavar="PEM", help="serve HTTPS")
    p.add_argument("--http-tls-key", default=None, metavar="PEM", help="its key")
    add_token_key_option(p)


def http_tls(args: argparse.Namespace) -> TlsReloader | None:
    """The HTTPS contexts of ``--http-tls-cert``/``--http-tls-key``; None: plain HTTP."""
    cert, key = args.http_tls_cert, args.http_tls_key
    if cert is None and key is None:
        return None
    return TlsReloader(TlsFiles(cert, key), server_side=True)


def add_client_tls_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tls",
        action="store_true",
        help="connect to bookies with TLS, verified against the system's CAs",
    )
    p.add_argument(
        "--tls-ca",
        default=None,
        metavar="PEM",
        help="connect to bookies with TLS, verified against this CA",
    )
    p.add_argument(
        "--tls-cert", default=None, metavar="PEM", help="client certificate (mutual TLS)"
    )
    p.add_argument("--tls-key", default=None, metavar="PEM", help="the client certificate's key")


def add_token_file_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help="present the token in FILE to bookies (default: $QUORUMLOG_TOKEN, if set)",
    )


def server_tls(args: argparse.Namespace) -> TlsReloader | None:
    """The server's reloading TLS contexts, None without ``--tls-cert``; ValueError."""
    cert, key, ca = args.tls_cert, args.tls_key, args.tls_ca
    if cert is None and key is None:
        if ca is not None:
            raise ValueError("--tls-ca needs --tls-cert and --tls-key")
        return None
    if cert is None or key is None:
        raise ValueError("--tls-cert and --tls-key go together")
    return TlsReloader(TlsFiles(cert, key, ca), server_side=True)


def token_verifier(args: argparse.Namespace) -> TokenVerifier | None:
    path = args.token_key_file
    return None if path is None else TokenVerifier.from_key_file(path)


def client_tls(args: argparse.Namespace) -> TlsFiles | None:
    """The client's TLS files, None for plain TCP; ValueError for a bad combination."""
    cert, key, ca = args.tls_cert, args.tls_key, args.tls_ca
    if not (getattr(args, "tls", False) or ca is not None or cert is not None or key is not None):
        return None
    files = TlsFiles(cert, key, ca)
    TlsReloader(files, server_side=False)  # files that do not load fail here, named
    return files


def token_file(args: argparse.Namespace) -> str | None:
    """``--token-file``, checked readable now (the client reads it again on change)."""
    path: str | None = args.token_file
    TokenFile(path)  # ValueError naming the file if it cannot be read
    return path


def redact_logs(args: argparse.Namespace) -> RedactingFilter:
    """Keep the process's secrets out of its log lines (call once logging is set up)."""
    secrets: list[str | bytes] = []
    for name in ("token_file", "token_key_file"):
        path = getattr(args, name, None)
        if path is not None:
            try:
                text = Path(path).read_bytes().strip()
            except OSError:
                continue
            if b"-----BEGIN" not in text:  # a public key is no secret
                secrets.append(text)
    token = TokenFile(None)()
    if token is not None:
        secrets.append(token)
    # The metadata store's ZooKeeper password (zk://...?digest_file=PATH: user:password).
    metadata = getattr(args, "metadata", None) or os.environ.get("QUORUMLOG_METADATA", "")
    for path in urllib.parse.parse_qs(metadata.partition("?")[2]).get("digest_file", []):
        with contextlib.suppress(OSError):
            credential = Path(path).read_text(encoding="utf-8").strip()
            password = credential.partition(":")[2]
            if password:
                # The ZooKeeper client prints user:password (its AUTH request, at DEBUG):
                # the whole line is redacted too, as a short password alone is not.
                secrets += [credential, password]
    return install_log_redaction(secrets)
