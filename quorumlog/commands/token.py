"""``quorumlog token``: make and check the tokens bookies and HTTP APIs accept.

``create`` signs a token with a key file (the HMAC secret the bookies also hold, or the
private half of the key pair whose public half they hold) and prints it on stdout, to
be written to a token file. ``verify`` reads a token from a file or stdin (never from
the command line) and says whom it names, its roles and expiry, or why a bookie with
that key file would refuse it. See docs/SECURITY.md.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from quorumlog.commands import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from quorumlog.errors import AuthenticationError
from quorumlog.security.roles import Role
from quorumlog.security.tokens import TokenVerifier, issue_token, signing_key_from_bytes

_DURATION = re.compile(r"^(\d+)([smhd]?)$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_s(text: str) -> int:
    """``90``, ``90s``, ``15m``, ``12h``, ``30d`` in seconds (argparse type)."""
    found = _DURATION.match(text.strip())
    if found is None:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number with s, m, h or d")
    return int(found.group(1)) * _UNIT_S[found.group(2)]


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("token", help="create or check a token (docs/SECURITY.md)")
    sub = parser.add_subparsers(dest="token_command", metavar="COMMAND", required=True)
    create = sub.add_parser("create", help="sign a token and print it on stdout")
    create.add_argument(
        "--key-file",
        required=True,
        help="the HMAC secret, or a PEM private key (RSA, EC, Ed25519) whose public half "
        "the bookies hold",
    )
    create.add_argument(
        "--role",
        action="append",
        required=True,
        choices=[role.value for role in Role],
        help="a role of the token (repeatable)",
    )
    create.add_argument("--subject", default="", help="whom the token names (its sub claim)")
    create.add_argument(
        "--expires-in",
        type=duration_s,
        default=None,
        metavar="DURATION",
        help="lifetime, e.g. 3600, 15m, 12h, 30d (default: no expiry; prefer short lives)",
    )
    create.add_argument(
        "--algorithm", default=None, help="signing algorithm (default: from the key)"
    )
    create.set_defaults(func=run_create)
    verify = sub.add_parser("verify", help="check a token against a key file")
    verify.add_argument(
        "--key-file", required=True, help="the key file a bookie is given (--token-key-file)"
    )
    verify.add_argument("--token-file", default=None, help="the token's file (default: read stdin)")
    verify.set_defaults(func=run_verify)


def run_create(args: argparse.Namespace) -> int:
    try:
        key, algorithm = signing_key_from_bytes(
            Path(args.key_file).read_bytes(), name=args.key_file
        )
    except (OSError, ValueError) as exc:
        print(f"quorumlog token create: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        return EXIT_USAGE
    expires = None if args.expires_in is None else time.time() + args.expires_in
    token = issue_token(
        key,
        args.role,
        subject=args.subject,
        expires_at_s=expires,
        algorithm=args.algorithm or algorithm,
    )
    print(token)
    return EXIT_OK


def run_verify(args: argparse.Namespace) -> int:
    try:
        verifier = TokenVerifier.from_key_file(args.key_file)
        source = Path(args.token_file).read_text() if args.token_file else sys.stdin.read()
    except (OSError, ValueError) as exc:
        print(f"quorumlog token verify: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        identity = verifier.verify(source.strip())
    except AuthenticationError as exc:
        print(f"refused: {exc.message}")
        return EXIT_FAILURE
    expiry = (
        "never"
        if identity.expires_at_s is None
        else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(identity.expires_at_s))
    )
    print(f"valid: {identity.describe()}, expires {expiry}")
    return EXIT_OK
