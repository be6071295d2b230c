"""``quorumlog shell`` against a real cluster: every command, and one-line errors."""

from __future__ import annotations

import json

import pytest
from support import shell

from quorumlog import BookKeeper


def assert_one_line_error(result):
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("metadata_uri", ["sqlite"], indirect=True)
def test_shell_commands_on_a_real_cluster(cluster3):
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


def test_shell_bad_arguments_and_stores_are_one_line_errors(tmp_path):
    assert_one_line_error(shell("mysql://nowhere", "listledgers"))
    assert_one_line_error(shell(f"sqlite://{tmp_path}/db", "ledgermetadata", "notanumber"))
    assert_one_line_error(shell("sqlite:///proc/no-such-dir/metadata.db", "listledgers"))
    assert_one_line_error(shell(f"sqlite://{tmp_path}/db", "nosuchcommand"))
