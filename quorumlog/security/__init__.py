"""Security by configuration: TLS contexts that reload, signed tokens with roles, redaction.

Nothing here opens a socket. :mod:`.tokens` checks JSON Web Tokens (PyJWT) against a key
file and yields an :class:`~quorumlog.security.tokens.Identity` with its roles;
:mod:`.roles` says which roles may send which request; :mod:`.tls` builds
:class:`ssl.SSLContext` objects from certificate files and swaps them when the files
change; :mod:`.redaction` keeps tokens and keys out of logs and messages.
See docs/SECURITY.md.
"""

from quorumlog.security.redaction import Secret, install_log_redaction, redact
from quorumlog.security.roles import Role, permitted, required_roles
from quorumlog.security.tls import TlsFiles, TlsReloader
from quorumlog.security.tokens import (
    TOKEN_ENV_VAR,
    Identity,
    TokenVerifier,
    issue_token,
    read_token,
)

__all__ = [
    "TOKEN_ENV_VAR",
    "Identity",
    "Role",
    "Secret",
    "TlsFiles",
    "TlsReloader",
    "TokenVerifier",
    "install_log_redaction",
    "issue_token",
    "permitted",
    "read_token",
    "redact",
    "required_roles",
]
