"""Secrets stay out of logs, metrics, metadata and error messages (docs/SECURITY.md), on
both metadata drivers.

A bookie checking tokens (HMAC key file, admin API on) at INFO level; a client writes
a ledger with its token; clients with a bad, an expired and a wrong-role token are
refused; the shell runs with a bad token in QUORUMLOG_TOKEN. Then every text the system
produced is searched for the key and for every token (whole, and its signature alone):
the bookie's stdout and stderr, its /metrics, every node of the metadata store, the
errors the clients got and the shell's output. On ZooKeeper every process also
authenticates with a digest password (``?digest_file=``), searched for as well.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from support import run
from tls_certs import HMAC_SECRET, write_hmac_key

from quorumlog.aio import BookKeeper
from quorumlog.client.config import ClientConfig
from quorumlog.errors import BKError
from quorumlog.meta.factory import open_store
from quorumlog.security import Role, issue_token
from quorumlog.server.local_cluster import LocalCluster


async def _store_dump(uri: str) -> str:
    """Every node's path and data in the store, as text."""
    store = await open_store(uri)
    lines: list[str] = []
    try:
        pending = ["/"]
        while pending and len(lines) < 10_000:
            path = pending.pop()
            for child in await store.children(path):
                child_path = f"{path.rstrip('/')}/{child}"
                pending.append(child_path)
                data = (await store.get(child_path)).data
                lines.append(f"{child_path} {data!r}")
    finally:
        await store.close()
    return "\n".join(lines)


async def _write_and_collect_errors(uri: str, good_file: Path, bad_files: list[Path]) -> str:
    bk = await BookKeeper.connect(uri, config=ClientConfig(token_file=str(good_file)))
    try:
        lh = await bk.create_ledger(1, 1, 1, password=b"pw", custom_metadata={"app": b"t"})
        await lh.add_entry(b"payload")
        await lh.close()
    finally:
        await bk.close()
    errors: list[str] = []
    for token_file in bad_files:
        bk = await BookKeeper.connect(uri, config=ClientConfig(token_file=str(token_file)))
        try:
            lh = await bk.create_ledger(1, 1, 1)
            await lh.add_entry(b"refused")
            raise AssertionError(f"an add with {token_file.name} was accepted")
        except BKError as exc:
            errors.append(f"{type(exc).__name__}: {exc!r} {exc}")
        finally:
            await bk.close()
    return "\n".join(errors)


async def _metrics(url: str, token: str) -> str:
    async with aiohttp.ClientSession() as session:
        headers = {"Authorization": f"Bearer {token}"}
        async with session.get(f"{url}/metrics", headers=headers) as response:
            assert response.status == 200
            return await response.text()


def _with_zookeeper_credentials(metadata_uri: str, tmp_path: Path, password: str) -> str:
    """``metadata_uri`` with a digest file (ZooKeeper's ACLs), unchanged for SQLite."""
    if not metadata_uri.startswith("zk://"):
        return metadata_uri
    digest_file = tmp_path / "zk.digest"
    digest_file.write_text(f"quorumlog:{password}\n")
    digest_file.chmod(0o600)
    return f"{metadata_uri}?digest_file={digest_file}"


def test_secrets_never_appear_in_logs_metrics_metadata_or_errors(metadata_uri: str, tmp_path: Path):
    zk_password = "zk-pass-" + "7" * 24
    metadata_uri = _with_zookeeper_credentials(metadata_uri, tmp_path, zk_password)
    key_file = write_hmac_key(tmp_path)
    later = time.time() + 3600
    tokens = {
        "good": issue_token(HMAC_SECRET, [Role.CLIENT], subject="writer", expires_at_s=later),
        "bad": issue_token(b"q" * 40, [Role.CLIENT], subject="forger", expires_at_s=later),
        "expired": issue_token(HMAC_SECRET, [Role.CLIENT], expires_at_s=time.time() - 60),
        "bookie": issue_token(HMAC_SECRET, [Role.BOOKIE], subject="rw", expires_at_s=later),
        "admin": issue_token(HMAC_SECRET, [Role.ADMIN], subject="ops", expires_at_s=later),
    }
    files = {}
    for name, token in tokens.items():
        files[name] = tmp_path / f"{name}.token"
        files[name].write_text(token)
    args = ["--token-key-file", str(key_file), "--http-port", "0", "--log-level", "INFO"]
    with LocalCluster(metadata_uri, tmp_path / "cluster", 1, extra_args=args) as cluster:
        errors = run(
            _write_and_collect_errors(
                metadata_uri, files["good"], [files["bad"], files["expired"], files["bookie"]]
            )
        )
        shell = subprocess.run(
            [sys.executable, "-m", "quorumlog", "shell", "--metadata", metadata_uri,
             "simpletest", "--ensemble", "1", "--write-quorum", "1", "--ack-quorum", "1",
             "--entries", "1"],
            env={**os.environ, "QUORUMLOG_TOKEN": tokens["bad"]},
            capture_output=True,
            text=True,
            timeout=120,
        )  # fmt: skip
        assert shell.returncode != 0, shell.stdout
        url = cluster.bookies[0].stdout_text().split(" admin ")[1].split()[0]
        metrics = run(_metrics(url, tokens["admin"]))
        dump = run(_store_dump(metadata_uri))
        bookie_logs = cluster.bookies[0].stdout_text() + cluster.bookies[0].stderr_text()

    texts = {
        "bookie logs": bookie_logs,
        "metrics": metrics,
        "metadata": dump,
        "client errors": errors,
        "shell output": shell.stdout + shell.stderr,
    }
    # The texts are not empty: each is evidence, not a vacuous pass.
    assert "token signature does not verify" in bookie_logs
    assert "ledgers" in dump and "bookie_" in metrics
    assert "token expired" in errors and "signature" in shell.stderr
    secrets = {"key": HMAC_SECRET.decode(), "ZooKeeper password": zk_password}
    for name, token in tokens.items():
        secrets[f"{name} token"] = token
        secrets[f"{name} token's signature"] = token.rsplit(".", 1)[1]
    leaks = [
        f"{secret} in {where}"
        for where, text in texts.items()
        for secret, value in secrets.items()
        if value in text
    ]
    assert not leaks, leaks
