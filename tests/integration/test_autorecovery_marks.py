"""Under-replication marks, locks and switches on both metadata drivers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import run, shell

from quorumlog.errors import InvalidArgumentError, NoNodeError
from quorumlog.meta.factory import open_store
from quorumlog.meta.underreplication import (
    LOST_BOOKIE_RECOVERY_DELAY_DEFAULT_S,
    UnderReplicationManager,
)


def test_marks_merge_and_clear_only_at_the_version_read(metadata_uri: str) -> None:
    async def go() -> None:
        async with await open_store(metadata_uri) as store:
            marks = UnderReplicationManager(store)
            assert await marks.marked_ledgers() == []
            assert await marks.mark(7, ["h:1"])
            assert not await marks.mark(7, ["h:1"])  # nothing new: nothing written
            first = await marks.get(7)
            assert first.bookies == ("h:1",)
            assert await marks.mark(7, {"h:2"})
            second = await marks.get(7)
            assert second.bookies == ("h:1", "h:2")
            assert second.marked_ms == first.marked_ms  # the first mark's time is kept
            # A worker that read the first version must not clear what was added since.
            assert not await marks.clear(7, first.version)
            assert await marks.marked_ledgers() == [7]
            assert await marks.clear(7, second.version)
            assert await marks.marked_ledgers() == []
            assert await marks.clear(7, second.version)  # already gone: fine
            with pytest.raises(NoNodeError):
                await marks.get(7)
            await marks.mark(3, ["h:1"])
            await marks.mark(12, ["h:9"])
            assert [m.ledger_id for m in await marks.list_marks()] == [3, 12]
            with pytest.raises(InvalidArgumentError):
                await marks.mark(4, [])

    run(go())


def test_a_lock_is_held_once_and_goes_with_its_session(metadata_uri: str) -> None:
    async def go() -> None:
        async with await open_store(metadata_uri) as store:
            marks = UnderReplicationManager(store)
            worker = await open_store(metadata_uri, session_timeout_ms=2_000)
            other = UnderReplicationManager(worker)
            token = await other.claim(5, "worker-1")
            assert token is not None
            assert await marks.claim(5, "worker-2") is None
            assert await marks.lock_owner(5) == "worker-1"
            await marks.release(5, "not-the-token")  # another's lock: left alone
            assert await marks.lock_owner(5) == "worker-1"
            await other.release(5, token)
            assert await marks.lock_owner(5) is None
            assert await other.claim(5, "worker-1") is not None
            await worker.close()  # the worker's session ends: its claim goes
            assert await marks.lock_owner(5) is None
            assert await marks.claim(5, "worker-2") is not None

    run(go())


def test_switches_enabled_delay_audit_request(metadata_uri: str) -> None:
    async def go() -> None:
        async with await open_store(metadata_uri) as store:
            marks = UnderReplicationManager(store)
            assert await marks.is_enabled()
            await marks.set_enabled(False)
            assert not await marks.is_enabled()
            await marks.set_enabled(True)
            assert await marks.is_enabled()
            delay = await marks.lost_bookie_recovery_delay_s()
            assert delay == LOST_BOOKIE_RECOVERY_DELAY_DEFAULT_S
            await marks.set_lost_bookie_recovery_delay_s(1800)
            assert await marks.lost_bookie_recovery_delay_s() == 1800
            with pytest.raises(InvalidArgumentError):
                await marks.set_lost_bookie_recovery_delay_s(-1)
            assert await marks.auditor() is None
            assert await marks.last_audit() is None
            await marks.request_audit()
            await marks.request_audit()
            await marks.put_last_audit({"audited": 3})
            assert await marks.last_audit() == {"audited": 3}

    run(go())


def test_shell_lists_the_marks_and_who_repairs_them(metadata_uri: str) -> None:
    async def setup() -> None:
        async with await open_store(metadata_uri) as store:
            marks = UnderReplicationManager(store)
            await marks.mark(7, ["127.0.0.1:3181", "127.0.0.1:3182"])
            await marks.mark(9, ["127.0.0.1:3183"])

    run(setup())
    listed = shell(metadata_uri, "listunderreplicated")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == [
        "7\tlost 127.0.0.1:3181, 127.0.0.1:3182",
        "9\tlost 127.0.0.1:3183",
    ]
    rows = [
        json.loads(line)
        for line in shell(metadata_uri, "listunderreplicated", "--json").stdout.splitlines()
    ]
    assert [(r["ledger_id"], r["bookies"], r["claimed_by"]) for r in rows] == [
        (7, ["127.0.0.1:3181", "127.0.0.1:3182"], None),
        (9, ["127.0.0.1:3183"], None),
    ]
    status = shell(metadata_uri, "autorecovery", "status").stdout
    assert "under-replicated ledgers: 2" in status and "auditor: none" in status
    assert shell(metadata_uri, "whoisauditor").returncode == 1
    assert shell(metadata_uri, "lostbookierecoverydelay", "-5").returncode != 0


def test_autorecovery_command_refuses_bad_options_and_a_missing_store(tmp_path: Path) -> None:
    def command(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "quorumlog", "autorecovery", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    bad = command("--metadata", f"sqlite://{tmp_path}/x.db", "--audit-sample", "2")
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, bad.stderr
    assert "--audit-sample" in bad.stderr
    bad_port = command("--metadata", f"sqlite://{tmp_path}/x.db", "--http-port", "70000")
    assert bad_port.returncode == 2 and len(bad_port.stderr.splitlines()) == 1, bad_port.stderr
    assert "--http-port" in bad_port.stderr
    missing = command("--metadata", f"sqlite://{tmp_path}/missing.db")
    assert missing.returncode == 1 and len(missing.stderr.splitlines()) == 1, missing.stderr
    assert "missing.db" in missing.stderr
    assert not (tmp_path / "missing.db").exists()  # a client never makes a store
