"""``quorumlog shell`` against a real cluster: every command, and one-line errors."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest
from support import shell
from tls_certs import write_hmac_key

import quorumlog.errors
from quorumlog import BookKeeper
from quorumlog.server.local_cluster import LocalCluster
from quorumlog.server.local_zookeeper import ZooKeeperServer


def assert_one_line_error(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("metadata_uri", ["sqlite"], indirect=True)
def test_shell_commands_on_a_real_cluster(cluster3: LocalCluster) -> None:
    uri = cluster3.metadata_uri
    listed = shell(uri, "listbookies")
    assert listed.returncode == 0, listed.stderr
    assert sorted(line.split()[0] for line in listed.stdout.splitlines()) == sorted(
        cluster3.addresses
    )

    with BookKeeper(uri) as bk:
        lh = bk.create_ledger(3, 3, 2, custom_metadata={"app": b"shell-test"})
        for word in ("alpha", "beta", "gamma"):
            lh.add_entry(word.encode())
        lh.close()
    ledger = str(lh.ledger_id)

    assert shell(uri, "listledgers").stdout.split() == [ledger]
    meta = json.loads(shell(uri, "ledgermetadata", ledger).stdout)
    assert meta["state"] == "CLOSED" and meta["last_entry_id"] == 2
    assert meta["custom_metadata"] == {"app": "shell-test"}
    read = shell(uri, "readledger", ledger, "--first", "1")
    assert read.returncode == 0, read.stderr
    assert [line.split("\t")[1] for line in read.stdout.splitlines()] == ["beta", "gamma"]

    simple = shell(uri, "simpletest", "--entries", "3000")
    assert simple.returncode == 0, simple.stderr
    assert "entries/s" in simple.stdout and "verified 3000 entries" in simple.stdout

    sanity = shell(uri, "bookiesanity")
    assert sanity.returncode == 0, sanity.stdout + sanity.stderr
    assert sanity.stdout.count(": ok") == 3

    with BookKeeper(uri) as bk:
        protected = bk.create_ledger(3, 3, 2, password=b"pw")
        protected.add_entry(b"kept")
    assert_one_line_error(shell(uri, "deleteledger", str(protected.ledger_id)))
    deleted = shell(uri, "deleteledger", str(protected.ledger_id), "--password", "pw")
    assert deleted.returncode == 0, deleted.stderr
    deleted = shell(uri, "deleteledger", ledger)
    assert deleted.returncode == 0
    assert shell(uri, "listledgers").stdout.split() == []
    assert_one_line_error(shell(uri, "ledgermetadata", ledger))
    assert_one_line_error(shell(uri, "readledger", "424242"))
    assert_one_line_error(shell(uri, "simpletest", "--ensemble", "5"))  # not enough bookies


def test_shell_bad_arguments_and_stores_are_one_line_errors(tmp_path: Path) -> None:
    assert_one_line_error(shell("mysql://nowhere", "listledgers"))
    assert_one_line_error(shell(f"sqlite://{tmp_path}/db", "ledgermetadata", "notanumber"))
    assert_one_line_error(shell("sqlite:///proc/no-such-dir/metadata.db", "listledgers"))
    assert_one_line_error(shell(f"sqlite://{tmp_path}/db", "nosuchcommand"))


def test_u1_a_client_refuses_a_missing_store_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "typo" / "metadata.db"
    result = shell(f"sqlite://{missing}", "listbookies")
    assert_one_line_error(result)
    assert str(missing) in result.stderr and "no metadata store" in result.stderr
    assert not missing.parent.exists()  # neither the file nor its directory was made
    with pytest.raises(quorumlog.errors.MetadataError, match="no metadata store"):
        BookKeeper(f"sqlite://{missing}")
    assert not missing.parent.exists()


@pytest.mark.zookeeper
def test_u1_a_client_refuses_a_missing_zookeeper_root(zookeeper_server: ZooKeeperServer) -> None:
    result = shell(zookeeper_server.uri(f"/u1-typo-{time.monotonic_ns()}"), "listbookies")
    assert_one_line_error(result)
    assert "no metadata store" in result.stderr


def test_u1_shell_with_zookeeper_down_prints_one_line_within_a_bounded_time() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    result = shell(f"zk://127.0.0.1:{port}/ql", "listbookies", timeout_s=60)
    assert_one_line_error(result)
    assert f"127.0.0.1:{port}" in result.stderr
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("metadata_uri", ["sqlite"], indirect=True)
def test_readledger_never_fences_an_open_ledger_unless_asked(cluster3: LocalCluster) -> None:
    uri = cluster3.metadata_uri
    with BookKeeper(uri) as bk:
        writer = bk.create_ledger(3, 3, 2, password=b"pw")
        for word in ("alpha", "beta"):
            writer.add_entry(word.encode())
        writer.add_entry(b"gamma")  # carries the LAC of beta: a reader sees 0..1 at least
        read = shell(uri, "readledger", str(writer.ledger_id), "--password", "pw")
        assert read.returncode == 0, read.stderr
        assert [line.split("\t")[1] for line in read.stdout.splitlines()][:2] == ["alpha", "beta"]
        writer.add_entry(b"delta")  # still the ledger's writer: nothing fenced it
        assert not bk.is_closed(writer.ledger_id)

        recovered = shell(uri, "readledger", str(writer.ledger_id), "--password", "pw", "--recover")
        assert recovered.returncode == 0, recovered.stderr
        assert [line.split("\t")[1] for line in recovered.stdout.splitlines()] == [
            "alpha",
            "beta",
            "gamma",
            "delta",
        ]
        assert bk.is_closed(writer.ledger_id)
        with pytest.raises(quorumlog.errors.BKError):
            writer.add_entry(b"epsilon")


@pytest.mark.parametrize("metadata_uri", ["sqlite"], indirect=True)
def test_simpletest_deletes_its_ledger_when_it_fails(metadata_uri: str, tmp_path: Path) -> None:
    """Bookies that check tokens refuse a shell without one: its adds fail after the
    ledger's metadata was written, and the ledger must not be left behind."""
    key_args = ["--token-key-file", str(write_hmac_key(tmp_path))]
    with LocalCluster(metadata_uri, tmp_path / "cluster", 3, extra_args=key_args):
        result = shell(metadata_uri, "simpletest", "--entries", "10")
        assert_one_line_error(result)
        with BookKeeper(metadata_uri) as bk:
            assert bk.list_ledgers() == []
