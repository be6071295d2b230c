"""``quorumlog shell readjournal|readlog|listfilesondisc|lastmark|bookieinfo|cookie_get``
on a real bookie's directories: what a bookie process wrote, read back after it stopped,
without changing a byte; refused while the bookie runs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from support import shell

from quorumlog import BookKeeper
from quorumlog.server.local_cluster import LocalCluster, embedded_metadata_uri

WORDS = (b"alpha", b"beta", b"gamma")


def snapshot(*directories: Path) -> dict[str, tuple[int, str]]:
    """Every file under the directories: size and SHA-256 (and the files present)."""
    out = {}
    for directory in directories:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                data = path.read_bytes()
                out[str(path)] = (len(data), hashlib.sha256(data).hexdigest())
    return out


def offline(*args: str) -> tuple[int, str, str]:
    result = shell(None, *args)
    return result.returncode, result.stdout, result.stderr


def test_storage_commands_read_a_stopped_bookie_and_change_nothing(tmp_path: Path) -> None:
    uri = embedded_metadata_uri(tmp_path)
    with LocalCluster(uri, tmp_path, 1) as cluster:
        with BookKeeper(uri) as bk:
            lh = bk.create_ledger(1, 1, 1, password=b"pw")
            for word in WORDS:
                lh.add_entry(word)
            lh.close()
            ledger_id = lh.ledger_id
        address = cluster.addresses[0]
        bookie = cluster.bookies[0]
        data_dir, journal_dir = bookie.data_dir, bookie.journal_dir
        dirs = ["--data-dir", str(data_dir), "--journal-dir", str(journal_dir)]

        # While the bookie runs, its lock is held: every command refuses, in one line.
        for command in (["readjournal", "1"], ["readlog", "1"], ["lastmark"], ["bookieinfo"]):
            status, out, err = offline(*command, *dirs)
            assert status == 1 and out == "", (command, out, err)
            assert "in use by a running bookie" in err and len(err.strip().splitlines()) == 1
        assert cluster.stop(0) == 0

    before = snapshot(data_dir, journal_dir)
    assert any(name.endswith(".jnl") for name in before)

    # lastmark: the checkpoint of the graceful stop, in the journal file that exists.
    status, out, err = offline("lastmark", *dirs, "--json")
    assert status == 0, err
    mark = json.loads(out)["mark"]
    assert mark["file_present"] and mark["journal_file"].endswith(".jnl")
    journal_size = before[str(journal_dir / mark["journal_file"])][0]
    assert 0 < mark["offset"] <= journal_size
    status, out, _ = offline("lastmark", *dirs)
    assert status == 0
    assert f"LastLogMark: journal file {mark['journal_file']}" in out
    assert f"offset {mark['offset']}" in out

    # readjournal: the master key, then one ADD per entry, with the writer's LAC.
    status, out, err = offline("readjournal", str(mark["journal_file_id"]), *dirs, "--json")
    assert status == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert records[0]["type"] == "HEADER" and records[0]["error"] is None
    adds = [r for r in records if r["type"] == "ADD"]
    assert {r["ledger_id"] for r in adds} == {ledger_id}
    entries = [e for r in adds for e in r["entries"]]
    assert [(e["ledger_id"], e["entry_id"], e["lac"]) for e in entries] == [
        (ledger_id, 0, -1),
        (ledger_id, 1, 0),
        (ledger_id, 2, 1),
    ]
    assert [r["ledger_id"] for r in records if r["type"] == "MASTER_KEY"] == [ledger_id]
    manifests = [f for r in records if r["type"] == "MANIFEST" for f in r["ledgers"]]
    # One batch per add; a batch that carried only an explicit LAC (the writer idle
    # between adds) names no entry (-1).
    assert {f["ledger_id"] for f in manifests} == {ledger_id}
    assert {f["last_entry_id"] for f in manifests} - {-1} == {0, 1, 2}
    status, text, _ = offline("readjournal", mark["journal_file"], *dirs)
    assert status == 0
    assert f"ADD        ledger {ledger_id}: entry 2 (lac 1, length " in text

    # readlog: the three entries in the entry log, by offset; --entry filters.
    logs = [name for name in before if name.endswith(".log")]
    assert len(logs) == 1
    log_name = Path(logs[0]).name
    status, out, err = offline("readlog", log_name, *dirs, "--json")
    assert status == 0, err
    items = [json.loads(line) for line in out.splitlines()]
    assert items[0]["type"] == "HEADER" and items[0]["error"] is None
    logged = [(i["ledger_id"], i["entry_id"], i["lac"]) for i in items if i["type"] == "ENTRY"]
    assert logged == [(ledger_id, 0, -1), (ledger_id, 1, 0), (ledger_id, 2, 1)]
    lengths = [i["length"] for i in items if i["type"] == "ENTRY"]
    assert lengths == [5, 9, 14]  # the ledger's length in bytes after each entry
    status, text, _ = offline("readlog", str(int(log_name[:-4], 16)), *dirs, "--entry", "1")
    assert status == 0
    assert f"ledger {ledger_id} entry 1 (lac 0, length 9" in text
    assert "entry 0 " not in text and "1 entries shown" in text

    # listfilesondisc: every journal file, entry log and index file, with its size.
    status, out, err = offline("listfilesondisc", *dirs, "--json")
    assert status == 0, err
    listed = {
        row["path"]: (row["kind"], row["size_bytes"]) for row in map(json.loads, out.splitlines())
    }
    assert {path: size for path, (_, size) in listed.items()} == {
        path: size for path, (size, _) in before.items()
    }
    assert listed[str(journal_dir / mark["journal_file"])][0] == "journal"
    assert listed[logs[0]][0] == "entrylog"
    assert listed[str(data_dir / "index" / "data.mdb")][0] == "index"
    status, text, _ = offline("listfilesondisc", *dirs, "--entrylog")
    assert status == 0 and log_name in text and ".jnl" not in text

    # bookieinfo: the cookie's address and the ledger's state in the index.
    status, out, err = offline("bookieinfo", *dirs, "--json")
    assert status == 0, err
    info = json.loads(out)
    assert info["address"] == address
    [ledger] = info["ledgers"]
    assert ledger["ledger_id"] == ledger_id and ledger["entries"] == 3
    assert ledger["last_entry_id"] == 2 and not ledger["fenced"] and ledger["has_master_key"]

    # cookie_get: the directories' copies agree with each other and the store's copy.
    status, out, err = offline("cookie_get", *dirs, "--json")
    assert status == 0, err
    cookies = json.loads(out)
    assert cookies["data"]["address"] == address and cookies["problem"] is None
    assert cookies["journal"] == cookies["data"]
    stored = shell(uri, "cookie_get", address, *dirs, "--json")
    assert stored.returncode == 0, stored.stderr
    both = json.loads(stored.stdout)
    assert both["store"] == both["data"] and both["problem"] is None

    assert snapshot(data_dir, journal_dir) == before  # not a byte changed, nothing created

    # Bad input is one line on stderr.
    for command in (["readjournal", "99"], ["readlog", "77"], ["lastmark"]):
        bad_dirs = dirs if command[0] != "lastmark" else ["--data-dir", str(tmp_path / "nope")]
        status, out, err = offline(*command, *bad_dirs)
        assert status == 1 and len(err.strip().splitlines()) == 1, (command, err)
        assert "Traceback" not in err


def test_readjournal_reports_a_damaged_record_and_leaves_it(tmp_path: Path) -> None:
    uri = embedded_metadata_uri(tmp_path)
    with LocalCluster(uri, tmp_path, 1) as cluster:
        with BookKeeper(uri) as bk:
            lh = bk.create_ledger(1, 1, 1)
            for word in WORDS:
                lh.add_entry(word)
            lh.close()
        bookie = cluster.bookies[0]
        assert cluster.stop(0) == 0
    journal = sorted(bookie.journal_dir.glob("*.jnl"))[-1]
    data = bytearray(journal.read_bytes())
    at = data.index(b"gamma")
    data[at] ^= 0x01  # the last entry's payload: its ADD record fails its checksum
    journal.write_bytes(data)
    before = snapshot(bookie.data_dir, bookie.journal_dir)
    dirs = ["--data-dir", str(bookie.data_dir), "--journal-dir", str(bookie.journal_dir)]
    status, out, _ = offline("readjournal", journal.name, *dirs, "--json")
    assert status == 1  # damage found
    records = [json.loads(line) for line in out.splitlines()]
    damaged = [r for r in records if r["type"] == "DAMAGED"]
    assert len(damaged) == 1 and damaged[0]["error"] == "checksum mismatch"
    entry_ids = [e["entry_id"] for r in records if r["type"] == "ADD" for e in r["entries"]]
    assert entry_ids == [0, 1]
    assert damaged[0]["offset"] < at
    assert snapshot(bookie.data_dir, bookie.journal_dir) == before
