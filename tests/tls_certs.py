"""Test certificates made with ``cryptography``: a CA, a bookie (server) certificate for
127.0.0.1, a client certificate, and an expired one; plus a token key. Written as PEM
files under a directory of the test's own.

EC P-256 keys: generating one costs well under a millisecond, RSA would cost tens.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

HMAC_SECRET = b"k3y-0f-the-test-cluster-" + b"x" * 24  # 48 bytes, over the 32-byte floor


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


@dataclass(frozen=True)
class TlsMaterial:
    directory: Path
    ca_cert: Path
    ca_key: ec.EllipticCurvePrivateKey
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    expired_cert: Path
    expired_key: Path

    def issue(
        self,
        name: str,
        *,
        ip: str | None = "127.0.0.1",
        days_valid: int = 30,
        expired: bool = False,
        ca_key: ec.EllipticCurvePrivateKey | None = None,
        ca_name: str = "quorumlog test CA",
    ) -> tuple[Path, Path]:
        """A certificate for ``name`` signed by the CA (or ``ca_key``), written as
        ``name.pem`` and ``name.key``."""
        return _issue(self.directory, name, ca_key or self.ca_key, ca_name, ip, days_valid, expired)


def _issue(
    directory: Path,
    name: str,
    ca_key: ec.EllipticCurvePrivateKey,
    ca_name: str,
    ip: str | None,
    days_valid: int,
    expired: bool,
) -> tuple[Path, Path]:
    now = datetime.datetime.now(datetime.UTC)
    start, end = (
        (now - datetime.timedelta(days=10), now - datetime.timedelta(days=1))
        if expired
        else (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days_valid))
    )
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(ca_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
    )
    if ip is not None:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]),
            critical=False,
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key_path, key)
    return cert_path, key_path


def make_ca(
    directory: Path, name: str = "quorumlog test CA"
) -> tuple[Path, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = directory / f"{name.replace(' ', '-')}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path, key


def make_tls_material(directory: Path) -> TlsMaterial:
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = make_ca(directory)
    ca_name = "quorumlog test CA"
    server_cert, server_key = _issue(directory, "bookie", ca_key, ca_name, "127.0.0.1", 30, False)
    client_cert, client_key = _issue(directory, "client", ca_key, ca_name, None, 30, False)
    expired_cert, expired_key = _issue(directory, "expired", ca_key, ca_name, "127.0.0.1", 30, True)
    return TlsMaterial(
        directory,
        ca_cert,
        ca_key,
        server_cert,
        server_key,
        client_cert,
        client_key,
        expired_cert,
        expired_key,
    )


def write_hmac_key(directory: Path) -> Path:
    path = directory / "token.key"
    path.write_bytes(HMAC_SECRET + b"\n")
    path.chmod(0o600)
    return path
