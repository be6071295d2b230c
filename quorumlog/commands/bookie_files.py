"""``quorumlog shell`` commands that read a stopped bookie's files, after BookKeeper's.

    quorumlog shell readjournal JOURNAL_ID|FILE --data-dir DIR [--journal-dir DIR] [--json]
    quorumlog shell readlog LOG_ID|FILE --data-dir DIR [--ledger ID] [--entry ID] [--json]
    quorumlog shell listfilesondisc --data-dir DIR [--journal-dir DIR] [--journal]
                                    [--entrylog] [--index] [--json]
    quorumlog shell lastmark --data-dir DIR [--journal-dir DIR] [--json]
    quorumlog shell bookieinfo --data-dir DIR [--journal-dir DIR] [--json]
    quorumlog shell cookie_get [BOOKIE] [--data-dir DIR] [--journal-dir DIR] [--json]

Read-only: they decode with the bookie's own functions
(:mod:`quorumlog.bookie.inspection`) and never write a byte; while they read, they
hold the directories' bookie locks, and refuse if a bookie holds one. They need no
metadata store, except ``cookie_get BOOKIE``, which reads the store's copy.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# The commands that never connect to the metadata store (cookie_get does with a BOOKIE).
OFFLINE_COMMANDS = ("readjournal", "readlog", "listfilesondisc", "lastmark", "bookieinfo")


def _directories(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument(
        "--data-dir", type=Path, required=required, help="the stopped bookie's data directory"
    )
    p.add_argument(
        "--journal-dir", type=Path, help="its journal directory (default DATA_DIR/journal)"
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line")


def add_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    journal = commands.add_parser(
        "readjournal",
        help="print the records of a stopped bookie's journal file (read-only)",
    )
    journal.add_argument("journal", metavar="JOURNAL_ID|FILE", help="file id or file name")
    _directories(journal)
    entry_log = commands.add_parser(
        "readlog", help="print the entries of a stopped bookie's entry log (read-only)"
    )
    entry_log.add_argument("log", metavar="LOG_ID|FILE", help="entry log id or file name")
    entry_log.add_argument("--ledger", type=int, help="only this ledger's entries")
    entry_log.add_argument("--entry", type=int, help="only this entry id")
    _directories(entry_log)
    files = commands.add_parser(
        "listfilesondisc",
        help="list a stopped bookie's journal files, entry logs and index (read-only)",
    )
    files.add_argument("--journal", action="store_true", help="the journal files")
    files.add_argument("--entrylog", action="store_true", help="the entry logs")
    files.add_argument("--index", action="store_true", help="the index files")
    _directories(files)
    mark = commands.add_parser(
        "lastmark",
        help="print a stopped bookie's checkpoint mark: where journal replay starts (read-only)",
    )
    _directories(mark)
    info = commands.add_parser(
        "bookieinfo",
        help="a stopped bookie's identity, space, files and ledgers (read-only)",
    )
    _directories(info)
    cookie = commands.add_parser(
        "cookie_get",
        help="print a bookie's cookie: the metadata store's copy (BOOKIE), the "
        "directories' copies (--data-dir), or both, compared",
    )
    cookie.add_argument("bookie", nargs="?", help="host:port (reads the metadata store)")
    _directories(cookie, required=False)


def _journal_dir(args: argparse.Namespace) -> Path:
    from quorumlog.bookie.inspection import default_journal_dir

    return Path(default_journal_dir(args.data_dir, args.journal_dir))


def run(args: argparse.Namespace) -> int:
    """One of :data:`OFFLINE_COMMANDS`, or ``cookie_get`` without a BOOKIE."""
    from quorumlog.bookie.inspection import stopped_bookie

    journal_dir = _journal_dir(args)
    command = args.shell_command
    if command == "cookie_get":
        return _print_cookies(args, None)
    with stopped_bookie(args.data_dir, journal_dir):
        if command == "readjournal":
            return _readjournal(args, journal_dir)
        if command == "readlog":
            return _readlog(args)
        if command == "listfilesondisc":
            return _listfilesondisc(args, journal_dir)
        if command == "lastmark":
            return _lastmark(args, journal_dir)
        return _bookieinfo(args, journal_dir)


def _print_json(value: object) -> None:
    print(json.dumps(value, sort_keys=True))


def _entry_text(item: dict[str, Any], ledger_id: int | None = None) -> str:
    """An entry's header; its ledger named unless it is ``ledger_id`` (an ADD's own)."""
    if "error" in item:
        return f"{item['size']} bytes: {item['error']}"
    ledger = "" if item["ledger_id"] == ledger_id else f"ledger {item['ledger_id']} "
    return (
        f"{ledger}entry {item['entry_id']} "
        f"(lac {item['lac']}, length {item['length']}, {item['size']} bytes)"
    )


def _journal_text(item: dict[str, Any]) -> str:
    kind = item["type"]
    head = f"{item['offset']:>10}  {kind:<10}"
    if kind == "DAMAGED":
        detail = f"{item['error']}"
        if "bytes" in item:
            detail += f" ({item['bytes']} bytes up to the next batch or the file's end)"
        return f"{head} {detail}"
    if kind == "ADD":
        entries = item["entries"]
        texts = [_entry_text(entry, item["ledger_id"]) for entry in entries]
        return f"{head} ledger {item['ledger_id']}: " + "; ".join(texts)
    if kind in ("FENCE", "DELETE", "MASTER_KEY"):
        return f"{head} ledger {item['ledger_id']}"
    if kind == "LAC":
        return f"{head} ledger {item['ledger_id']} lac {item['lac']}"
    if kind == "BATCH":
        return head.rstrip()
    if kind == "MANIFEST":
        parts = []
        for facts in item["ledgers"]:
            text = f"ledger {facts['ledger_id']}"
            if facts["last_entry_id"] >= 0:
                text += f" entries {facts['first_entry_id']}..{facts['last_entry_id']}"
            flags = [name for name in ("fenced", "deleted") if facts[name]]
            if facts["explicit_lac"] is not None:
                flags.append(f"explicit lac {facts['explicit_lac']}")
            if facts["master_key"]:
                flags.append("master key")
            if flags:
                text += f" ({', '.join(flags)})"
            parts.append(text)
        return f"{head} " + "; ".join(parts)
    if kind == "PAD":
        return f"{head} {item['bytes']} bytes"
    return head.rstrip()


def _readjournal(args: argparse.Namespace, journal_dir: Path) -> int:
    from quorumlog.bookie.inspection import journal_records, resolve_journal_file

    file_id, path = resolve_journal_file(journal_dir, args.journal)
    status = 0
    for item in journal_records(path, file_id):
        if item["type"] == "HEADER":
            if args.json:
                _print_json({"file": str(path), **item})
            elif item["error"]:
                print(f"journal file {path} (id {file_id}): bad header: {item['error']}")
            else:
                print(f"journal file {path} (id {file_id})")
            status = 1 if item["error"] else 0
            continue
        if item["type"] == "DAMAGED":
            status = 1
        print(json.dumps(item, sort_keys=True) if args.json else _journal_text(item))
    return status


def _readlog(args: argparse.Namespace) -> int:
    from quorumlog.bookie.inspection import entry_log_records, resolve_entry_log

    log_id, path = resolve_entry_log(args.data_dir, args.log)
    status = 0
    entries = padding = 0
    for item in entry_log_records(path, log_id):
        kind = item["type"]
        if kind == "HEADER":
            if args.json:
                _print_json({"file": str(path), **item})
            elif item["error"]:
                print(f"entry log {path} (id {log_id}): bad header: {item['error']}")
            else:
                print(f"entry log {path} (id {log_id})")
            status = 1 if item["error"] else 0
            continue
        if kind == "PADDING":
            padding += 1
            continue
        if kind == "DAMAGED":
            status = 1
        elif (args.ledger is not None and item.get("ledger_id") != args.ledger) or (
            args.entry is not None and item.get("entry_id") != args.entry
        ):
            continue
        else:
            entries += 1
        if args.json:
            _print_json(item)
        elif kind == "DAMAGED":
            print(f"{item['offset']:>10}  DAMAGED    {item['error']}: the rest is unreadable")
        else:
            print(f"{item['offset']:>10}  {_entry_text(item)}")
    if not args.json:
        print(f"{entries} entries shown, {padding} padding records")
    return status


def _listfilesondisc(args: argparse.Namespace, journal_dir: Path) -> int:
    from quorumlog.bookie.inspection import files_on_disk

    wanted = {
        kind
        for kind, flag in (
            ("journal", args.journal),
            ("entrylog", args.entrylog),
            ("index", args.index),
        )
        if flag
    } or {"journal", "entrylog", "index", "other"}
    titles = {
        "journal": "journal files",
        "entrylog": "entry logs",
        "index": "index",
        "other": "other files",
    }
    files = [f for f in files_on_disk(args.data_dir, journal_dir) if f.kind in wanted]
    for kind in ("journal", "entrylog", "index", "other"):
        group = [f for f in files if f.kind == kind]
        if kind not in wanted:
            continue
        if args.json:
            for f in group:
                _print_json(
                    {"kind": kind, "path": str(f.path), "size_bytes": f.size_bytes, "note": f.note}
                )
            continue
        print(f"{titles[kind]} ({len(group)}):")
        for f in group:
            note = f"  {f.note}" if f.note else ""
            print(f"  {f.path}  {f.size_bytes} bytes{note}")
    return 0


def _lastmark(args: argparse.Namespace, journal_dir: Path) -> int:
    from quorumlog.bookie.inspection import last_mark

    result = last_mark(args.data_dir, journal_dir)
    if args.json:
        _print_json(result)
        return 0
    mark = result["mark"]
    if mark is None:
        print("LastLogMark: none (no checkpoint yet: replay starts at the first journal file)")
    else:
        present = "" if mark["file_present"] else " (that file is MISSING)"
        print(
            f"LastLogMark: journal file {mark['journal_file']} (id {mark['journal_file_id']}), "
            f"offset {mark['offset']}{present}"
        )
    log_end = result["log_end"]
    if log_end is not None:
        print(
            f"entry log {log_end['log_id']} was current at that checkpoint, ending at "
            f"offset {log_end['offset']}"
        )
    return 0


def _bookieinfo(args: argparse.Namespace, journal_dir: Path) -> int:
    from quorumlog.bookie.inspection import bookie_info

    info = bookie_info(args.data_dir, journal_dir)
    if args.json:
        _print_json(info)
        return 0
    print(f"bookie {info['address'] or '(no cookie)'} instance {info['instance_id'] or '-'}")
    for name in ("data", "journal"):
        space = info["space"][name]
        print(
            f"{name} {info[name + '_dir']}: {space['free_bytes']} bytes free of "
            f"{space['total_bytes']}"
        )
    for kind, totals in info["files"].items():
        print(f"{kind} files: {totals['count']}, {totals['bytes']} bytes")
    mark = info["mark"]
    if mark is not None:
        print(f"last mark: journal file id {mark['journal_file_id']}, offset {mark['offset']}")
    else:
        print("last mark: none")
    print(f"ledgers: {len(info['ledgers'])}")
    for ledger in info["ledgers"]:
        flags = [name for name in ("fenced", "deleted") if ledger[name]]
        if ledger["damaged"]:
            flags.append(f"DAMAGED: {ledger['damaged']}")
        if ledger["suspect"]:
            flags.append(f"suspect entries {ledger['suspect']}")
        extra = f" ({', '.join(flags)})" if flags else ""
        print(
            f"  ledger {ledger['ledger_id']}: {ledger['entries']} entries, last entry "
            f"{ledger['last_entry_id']}, lac {ledger['lac']}{extra}"
        )
    return 0


def _print_cookies(args: argparse.Namespace, stored: Any) -> int:
    """The store's copy (``stored``: a Cookie, or None if BOOKIE has none) and, with
    --data-dir, the directories' copies compared with it."""
    from quorumlog.bookie.inspection import cookie_dict, local_cookies

    if args.bookie is None and args.data_dir is None:
        raise ValueError("cookie_get needs a BOOKIE (the metadata store's copy) or --data-dir")
    result: dict[str, Any] = {}
    if args.bookie is not None:
        result["store"] = cookie_dict(stored)
    if args.data_dir is not None:
        result.update(local_cookies(args.data_dir, _journal_dir(args), stored))
    if args.json:
        _print_json(result)
    else:
        for where in ("store", "data", "journal"):
            if where not in result:
                continue
            cookie = result[where]
            label = {
                "store": f"metadata store ({args.bookie})",
                "data": "data directory",
                "journal": "journal directory",
            }[where]
            if cookie is None:
                print(f"{label}: no cookie")
            else:
                print(f"{label}: {json.dumps(cookie, sort_keys=True)}")
        if "problem" in result:
            print(f"check: {result['problem'] or 'the cookies agree'}")
    if args.bookie is not None and stored is None:
        print(f"bookie {args.bookie} has no cookie in the metadata store", file=sys.stderr)
        return 1
    return 1 if result.get("problem") else 0


async def cookie_get(bk, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    """``cookie_get BOOKIE``: through the shell's metadata store connection."""
    from quorumlog.bookie.cookie import Cookie

    versioned = await bk.registry.read_cookie(args.bookie)
    stored = None if versioned is None else Cookie.from_bytes(versioned.data)
    return _print_cookies(args, stored)
