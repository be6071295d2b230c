"""``quorumlog shell``: the operator's commands, after BookKeeper's shell.

    quorumlog shell [--metadata URI] listbookies
    quorumlog shell listledgers [--reads-per-s R]
    quorumlog shell migratelayout [--level-digits D] [--reads-per-s R]
    quorumlog shell ledgermetadata ID
    quorumlog shell readledger ID [--first N] [--last M] [--password TEXT] [--recover]
    quorumlog shell deleteledger ID [--password TEXT]
    quorumlog shell simpletest [--ensemble E] [--write-quorum W] [--ack-quorum A] [--entries N]
    quorumlog shell bookiesanity [--bookie ADDR]
    quorumlog shell auditledger ID [--json] [--password TEXT]
    quorumlog shell recoverbookie BOOKIE [--ledger ID ...] [--dry-run] [--skip-open-ledgers |
                                         --close-open-ledgers] [--json] [--password TEXT]
                                         [--placement P] [--min-racks-per-write-quorum N]
    quorumlog shell listunderreplicated [--json]
    quorumlog shell whoisauditor
    quorumlog shell autorecovery enable|disable|status
    quorumlog shell lostbookierecoverydelay [SECONDS]
    quorumlog shell triggeraudit
    quorumlog shell decommissionbookie BOOKIE [--password TEXT] [--placement P]
                                              [--min-racks-per-write-quorum N]
    quorumlog shell gc [--http HOST:PORT ...] [--minor] [--json]
    quorumlog shell orphans [--delete] [--json] [--password TEXT] [--min-age-s S]
                            [--reads-per-s R] [--http HOST:PORT ...]
    quorumlog shell readjournal|readlog|listfilesondisc|lastmark|bookieinfo|cookie_get ...
        (a stopped bookie's files, read-only: quorumlog.commands.bookie_files)

Every failure is one line on stderr and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from quorumlog.bookie.errors import BookieStartError
from quorumlog.commands import bookie_files, gc_trigger, orphans, positive_float
from quorumlog.errors import BKError
from quorumlog.meta.layout import LEVEL_DIGITS_DEFAULT
from quorumlog.security import options as security_options

if TYPE_CHECKING:
    from quorumlog.client.bookkeeper import BookKeeper
    from quorumlog.client.writing import LedgerHandle

_CLOSE_BEFORE_DELETE_S = 30.0


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    shell = subparsers.add_parser("shell", help="inspect and test a cluster")
    shell.add_argument(
        "--metadata", help="metadata URI (default: $QUORUMLOG_METADATA, else ./.quorumlog)"
    )
    security_options.add_client_tls_options(shell)
    security_options.add_token_file_option(shell)
    commands = shell.add_subparsers(dest="shell_command", metavar="COMMAND", required=True)
    commands.add_parser("listbookies", help="list available bookies (writable and read-only)")
    listledgers = commands.add_parser("listledgers", help="list ledger ids")
    listledgers.add_argument(
        "--reads-per-s",
        type=positive_float,
        default=None,
        help="at most this many metadata listings a second (default: no limit)",
    )
    migrate = commands.add_parser(
        "migratelayout",
        help="move a flat cluster's ledger metadata to the hierarchical layout "
        "(safe to stop and to run again, while clients run)",
    )
    migrate.add_argument(
        "--level-digits",
        type=int,
        default=LEVEL_DIGITS_DEFAULT,
        help="digits per level of a cluster not yet hierarchical (3: 1,000 children)",
    )
    migrate.add_argument(
        "--reads-per-s",
        type=positive_float,
        default=None,
        help="at most this many metadata reads a second (default: no limit)",
    )
    meta = commands.add_parser("ledgermetadata", help="print a ledger's metadata as JSON")
    meta.add_argument("ledger_id", type=int)
    read = commands.add_parser(
        "readledger",
        help="print a ledger's entries; an open ledger is read up to its last add confirmed, "
        "its writer carries on (--recover fences and closes it)",
    )
    read.add_argument("ledger_id", type=int)
    read.add_argument("--first", type=int, default=0)
    read.add_argument("--last", type=int, default=None)
    read.add_argument("--password", default="", help="ledger password (text)")
    recovery = read.add_mutually_exclusive_group()
    recovery.add_argument(
        "--recover",
        action="store_true",
        help="open with recovery: fence an open ledger (its writer can add no more), "
        "recover its end and close it, then read up to that end",
    )
    # The default since reads stopped fencing; still accepted for scripts that pass it.
    recovery.add_argument("--no-recovery", action="store_true", help=argparse.SUPPRESS)
    delete = commands.add_parser("deleteledger", help="delete a ledger")
    delete.add_argument("ledger_id", type=int)
    delete.add_argument("--password", default="", help="ledger password (text)")
    simple = commands.add_parser("simpletest", help="write, read back, verify, print throughput")
    simple.add_argument("--ensemble", type=int, default=3)
    simple.add_argument("--write-quorum", type=int, default=3)
    simple.add_argument("--ack-quorum", type=int, default=2)
    simple.add_argument("--entries", type=int, default=1000)
    simple.add_argument("--entry-size", type=int, default=100)
    simple.add_argument("--outstanding", type=int, default=10_000, help="max adds in flight")
    sanity = commands.add_parser("bookiesanity", help="write and read a ledger on each bookie")
    sanity.add_argument("--bookie", help="check only this bookie (host:port)")
    audit = commands.add_parser(
        "auditledger",
        help="check every replica of a ledger (never fences); exit 0 if healthy, 1 if not",
    )
    audit.add_argument("ledger_id", type=int)
    audit.add_argument("--json", action="store_true", help="print the result as one JSON object")
    audit.add_argument("--password", default="", help="ledger password (text)")
    recover = commands.add_parser(
        "recoverbookie",
        help="copy a lost bookie's entries to other bookies and take it out of the ledgers; "
        "exit 0 when no ledger references it any more, 2 when open ledgers still do, 1 on failure",
    )
    recover.add_argument("bookie", help="the lost bookie (host:port)")
    recover.add_argument(
        "--ledger",
        type=int,
        action="append",
        dest="ledgers",
        metavar="ID",
        help="recover only this ledger (repeatable; default: every ledger naming the bookie)",
    )
    recover.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    open_policy = recover.add_mutually_exclusive_group()
    open_policy.add_argument(
        "--skip-open-ledgers", action="store_true", help="leave ledgers that are not closed alone"
    )
    open_policy.add_argument(
        "--close-open-ledgers",
        action="store_true",
        help="recover and close (fencing the writer) an open ledger whose last fragment "
        "names the bookie, then copy it whole",
    )
    recover.add_argument("--json", action="store_true", help="print the report as one JSON object")
    recover.add_argument("--password", default="", help="the ledgers' password (text)")
    _add_placement_options(recover)
    _add_autorecovery_commands(commands)
    gc_trigger.add_arguments(
        commands.add_parser(
            "gc", help="garbage collection and compaction now, through each bookie's admin API"
        )
    )
    orphans.add_arguments(
        commands.add_parser(
            "orphans",
            help="list (and with --delete remove) ledgers nothing refers to any more, and "
            "bookie data of ledgers whose metadata is gone",
        )
    )
    bookie_files.add_commands(commands)
    shell.set_defaults(func=run)


def _add_autorecovery_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    listur = commands.add_parser(
        "listunderreplicated", help="list the ledgers marked under-replicated, with lost bookies"
    )
    listur.add_argument("--json", action="store_true", help="one JSON object per line")
    listur.add_argument(
        "--lost",
        action="store_true",
        help="list instead the ledgers recorded lost: entries with no copy left anywhere",
    )
    commands.add_parser("whoisauditor", help="print the autorecovery auditor's identifier")
    ar = commands.add_parser("autorecovery", help="enable, disable or show autorecovery")
    ar.add_argument("action", choices=["enable", "disable", "status"])
    delay = commands.add_parser(
        "lostbookierecoverydelay",
        help="print, or set cluster-wide, how long a bookie may be gone before its "
        "ledgers are re-replicated",
    )
    delay.add_argument("seconds", type=int, nargs="?", default=None)
    commands.add_parser("triggeraudit", help="ask the auditor for a full audit now")
    decommission = commands.add_parser(
        "decommissionbookie",
        help="re-replicate everything a bookie holds (fencing and closing open ledgers "
        "whose last fragment names it), then delete its cookie and registration",
    )
    decommission.add_argument("bookie", help="host:port")
    decommission.add_argument("--password", default="", help="the ledgers' password (text)")
    _add_placement_options(decommission)


def _add_placement_options(parser: argparse.ArgumentParser) -> None:
    """Where copies go, as the cluster's clients and autorecovery place them: a shell
    command that chose at random would break a rack-aware cluster's write sets."""
    from quorumlog.core.placement import POLICIES, PlacementPolicy

    parser.add_argument(
        "--placement",
        choices=list(POLICIES),
        default="random",
        help="placement policy the copies' bookies are chosen by (default: %(default)s)",
    )
    parser.add_argument(
        "--min-racks-per-write-quorum",
        type=int,
        default=PlacementPolicy().min_racks_per_write_quorum,
        help="racks each write set should span under rack-aware and region-aware "
        "placement (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    from quorumlog.client.sync import new_event_loop

    # kazoo warns on every failed connection attempt, dozens of lines while ZooKeeper is
    # down; the store's own error says it in the one line this command prints.
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    security_options.redact_logs(args)

    handlers: dict[str, Callable[..., Awaitable[int]]] = {
        "listbookies": _listbookies,
        "listledgers": _listledgers,
        "migratelayout": _migratelayout,
        "ledgermetadata": _ledgermetadata,
        "readledger": _readledger,
        "deleteledger": _deleteledger,
        "simpletest": _simpletest,
        "bookiesanity": _bookiesanity,
        "auditledger": _auditledger,
        "recoverbookie": _recoverbookie,
        "listunderreplicated": _listunderreplicated,
        "whoisauditor": _whoisauditor,
        "autorecovery": _autorecovery,
        "lostbookierecoverydelay": _lostbookierecoverydelay,
        "triggeraudit": _triggeraudit,
        "decommissionbookie": _decommissionbookie,
        "gc": _gc,
        "orphans": orphans.run_orphans,
    }
    offline = args.shell_command in bookie_files.OFFLINE_COMMANDS or (
        args.shell_command == "cookie_get" and args.bookie is None
    )
    if offline:
        # A stopped bookie's files: no metadata store needed.
        try:
            return bookie_files.run(args)
        except BrokenPipeError:
            raise  # the reader of stdout left: quorumlog's main stops quietly
        except (BKError, BookieStartError, OSError, ValueError) as exc:
            print(f"quorumlog shell {args.shell_command}: {exc}", file=sys.stderr)
            return 1
    handlers["cookie_get"] = bookie_files.cookie_get
    handler = handlers[args.shell_command]
    # The runner turns Ctrl-C into the command's cancellation, so that the client closes
    # (its store's tasks end) before the loop does: no traceback, as for any failure.
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        try:
            return runner.run(_with_client(args, handler))
        except BrokenPipeError:
            raise  # the reader of stdout left: quorumlog's main stops quietly
        except (BKError, OSError, ValueError) as exc:
            print(f"quorumlog shell {args.shell_command}: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130


async def _with_client(args: argparse.Namespace, handler: Callable[..., Awaitable[int]]) -> int:
    from quorumlog.client.bookkeeper import BookKeeper
    from quorumlog.client.config import ClientConfig

    config = ClientConfig(
        metadata_session_timeout_ms=10_000,
        tls=security_options.client_tls(args),
        token_file=security_options.token_file(args),
        placement=getattr(args, "placement", "random"),
        min_racks_per_write_quorum=getattr(args, "min_racks_per_write_quorum", 2),
    )
    bk = await asyncio.wait_for(BookKeeper.connect(args.metadata, config=config), 30)
    try:
        return await handler(bk, args)
    finally:
        await bk.close()


async def _listbookies(bk, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    writable = sorted(await bk.registry.writable_bookies())
    read_only = sorted(await bk.registry.readonly_bookies())
    for address in writable:
        print(f"{address} writable")
    for address in read_only:
        print(f"{address} read-only")
    if not writable and not read_only:
        print("no bookies available", file=sys.stderr)
    return 0


async def _listledgers(bk, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    # Walks the layout level by level: printed as found, never listed whole.
    async for ledger_id in bk.ledgers.ledger_ids(reads_per_s=args.reads_per_s):
        print(ledger_id)
    return 0


async def _migratelayout(bk, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    from quorumlog.meta.migrate import migrate_to_hierarchical

    report = await migrate_to_hierarchical(
        bk.store, level_digits=args.level_digits, reads_per_s=args.reads_per_s
    )
    print(
        f"layout {report.layout.kind} ({report.layout.level_digits} digits a level): "
        f"{report.moved} ledger(s) moved in {report.passes} pass(es), {report.left} flat left"
    )
    return 0 if report.left == 0 else 1


async def _ledgermetadata(bk, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    metadata = await bk.ledger_metadata(args.ledger_id)
    print(json.dumps(metadata.to_display(), indent=2, sort_keys=True))
    return 0


async def _readledger(bk, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    password = args.password.encode()
    # A read never fences unless asked: fencing a ledger its writer still uses (a log's
    # current ledger, a database's) makes that writer's next add fail.
    if args.recover:
        handle = await bk.open_ledger(args.ledger_id, password)
    else:
        handle = await bk.open_ledger_no_recovery(args.ledger_id, password)
    last = handle.last_add_confirmed if args.last is None else args.last
    if last < args.first:
        print(f"ledger {args.ledger_id}: no entries to read (last confirmed {last})")
        return 0
    for entry in await handle.read_entries(args.first, last):
        text = entry.data.decode("utf-8", "backslashreplace")
        print(f"{entry.ledger_id}:{entry.entry_id}\t{text}")
    return 0


async def _deleteledger(bk, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    await bk.delete_ledger(args.ledger_id, args.password.encode())
    print(f"ledger {args.ledger_id} deleted")
    return 0


async def _simpletest(bk, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    if args.entries < 1 or args.entry_size < 0:
        raise ValueError("--entries must be at least 1 and --entry-size at least 0")
    payload_base = os.urandom(max(args.entry_size, 1))[: args.entry_size]
    handle = await bk.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum)
    # The ledger is this command's own: deleted whatever happens (a refused token, a
    # failed verification), never left behind in the cluster.
    try:
        return await _write_read_verify(bk, handle, payload_base, args)
    finally:
        await _delete_own_ledger(bk, handle)


async def _write_read_verify(
    bk: BookKeeper, handle: LedgerHandle, payload_base: bytes, args: argparse.Namespace
) -> int:
    print(
        f"ledger {handle.ledger_id} on {', '.join(handle.ensemble)} "
        f"({args.ensemble}/{args.write_quorum}/{args.ack_quorum}), "
        f"{args.entries} entries of {args.entry_size} bytes",
        flush=True,
    )
    outstanding = max(1, args.outstanding)
    started = time.perf_counter()
    futures: list[asyncio.Future[int]] = []
    for _ in range(args.entries):
        if len(futures) >= outstanding:
            # Confirmations come in entry-id order: once this one is done, at most
            # ``outstanding`` adds are in flight.
            await futures[len(futures) - outstanding]
        futures.append(handle.append(payload_base))
    await asyncio.gather(*futures)
    write_s = time.perf_counter() - started
    await handle.close()
    megabytes = args.entries * args.entry_size / 1e6
    print(
        f"wrote {args.entries} entries in {write_s:.3f} s: "
        f"{args.entries / write_s:,.0f} entries/s, {megabytes / write_s:.2f} MB/s",
        flush=True,
    )
    started = time.perf_counter()
    reader = await bk.open_ledger(handle.ledger_id)
    entries = await reader.read_entries(0, args.entries - 1)
    read_s = time.perf_counter() - started
    bad = [e.entry_id for e in entries if e.data != payload_base]
    if len(entries) != args.entries or bad:
        print(
            f"verification FAILED: {len(entries)} entries read, {len(bad)} differ", file=sys.stderr
        )
        return 1
    print(
        f"read back and verified {len(entries)} entries in {read_s:.3f} s: "
        f"{len(entries) / read_s:,.0f} entries/s"
    )
    return 0


async def _delete_own_ledger(bk: BookKeeper, handle: LedgerHandle) -> None:
    """Delete a ledger this command created; on failure say it was left (one line)."""
    try:
        if not handle.is_closed:
            # Settles its pending adds first (each bounded by the add timeout); a close
            # that fails changes nothing the delete needs.
            with contextlib.suppress(BKError, TimeoutError):
                await asyncio.wait_for(handle.close(), _CLOSE_BEFORE_DELETE_S)
        await bk.delete_ledger(handle.ledger_id)
    except (BKError, OSError) as exc:
        print(f"ledger {handle.ledger_id} left behind: {exc}", file=sys.stderr)


async def _bookiesanity(bk, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    bookies = [args.bookie] if args.bookie else sorted(await bk.registry.writable_bookies())
    if not bookies:
        print("bookiesanity: no writable bookies registered", file=sys.stderr)
        return 1
    failures = 0
    for address in bookies:
        try:
            handle = await bk.create_ledger(1, 1, 1, ensemble_bookies=(address,))
            for i in range(10):
                await handle.add_entry(b"sanity-%d" % i)
            await handle.close()
            reader = await bk.open_ledger(handle.ledger_id)
            entries = await reader.read_entries(0, 9)
            if [e.data for e in entries] != [b"sanity-%d" % i for i in range(10)]:
                raise BKError(f"bookie {address}: read back different data")
            await bk.delete_ledger(handle.ledger_id)
            print(f"bookie {address}: ok")
        except BKError as exc:
            failures += 1
            print(f"bookie {address}: FAILED: {exc}")
    return 1 if failures else 0


async def _auditledger(bk, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    from quorumlog.replication import audit_ledger

    audit = await audit_ledger(bk, args.ledger_id, password=args.password.encode())
    if args.json:
        print(json.dumps(audit.to_dict(), sort_keys=True))
    else:
        print(audit.summary())
    return 0 if audit.healthy else 1


async def _recoverbookie(bk, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    from quorumlog.replication import LedgerReplication, recover_bookie

    def show(result: LedgerReplication) -> None:
        print(result.summary(), flush=True)

    report = await recover_bookie(
        bk,
        args.bookie,
        ledger_ids=args.ledgers,
        dry_run=args.dry_run,
        skip_open_ledgers=args.skip_open_ledgers,
        close_open_ledgers=args.close_open_ledgers,
        password=args.password.encode(),
        progress=None if args.json else show,
    )
    if args.json:
        print(json.dumps(report.to_dict(), sort_keys=True))
    else:
        print(report.summary(ledgers=False))
    return report.exit_status


async def _listunderreplicated(bk, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    from quorumlog.meta.underreplication import UnderReplicationManager

    marks = UnderReplicationManager(bk.store)
    if args.lost:
        for lost in await marks.lost_ledgers():
            if args.json:
                print(json.dumps(lost.to_dict(), sort_keys=True))
            else:
                print(f"{lost.ledger_id}\tLOST on {', '.join(lost.bookies)}: {lost.reason}")
        return 0
    for mark in await marks.list_marks():
        owner = await marks.lock_owner(mark.ledger_id)
        if args.json:
            print(json.dumps({**mark.to_dict(), "claimed_by": owner}, sort_keys=True))
        else:
            claim = f" (being repaired by {owner})" if owner else ""
            print(f"{mark.ledger_id}\tlost {', '.join(mark.bookies)}{claim}")
    return 0


async def _whoisauditor(bk, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    from quorumlog.meta.underreplication import UnderReplicationManager

    auditor = await UnderReplicationManager(bk.store).auditor()
    if auditor is None:
        print("no auditor (no autorecovery process is running)", file=sys.stderr)
        return 1
    print(auditor)
    return 0


async def _autorecovery(bk, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    from quorumlog.meta.underreplication import UnderReplicationManager

    marks = UnderReplicationManager(bk.store)
    if args.action != "status":
        await marks.set_enabled(args.action == "enable")
    enabled = await marks.is_enabled()
    print(f"autorecovery {'enabled' if enabled else 'disabled'}")
    if args.action == "status":
        print(f"auditor: {await marks.auditor() or 'none'}")
        print(f"lost bookie recovery delay: {await marks.lost_bookie_recovery_delay_s()} s")
        print(f"under-replicated ledgers: {len(await marks.marked_ledgers())}")
        last = await marks.last_audit()
        if last is not None:
            print(f"last audit: {json.dumps(last, sort_keys=True)}")
    return 0


async def _lostbookierecoverydelay(bk, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    from quorumlog.meta.underreplication import UnderReplicationManager

    marks = UnderReplicationManager(bk.store)
    if args.seconds is not None:
        await marks.set_lost_bookie_recovery_delay_s(args.seconds)
    print(f"lostBookieRecoveryDelay {await marks.lost_bookie_recovery_delay_s()} s")
    return 0


async def _triggeraudit(bk, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    from quorumlog.meta.underreplication import UnderReplicationManager

    marks = UnderReplicationManager(bk.store)
    await marks.request_audit()
    auditor = await marks.auditor()
    if auditor is None:
        print("audit requested; no auditor is running: it runs when one starts")
    else:
        print(f"audit requested from the auditor {auditor}")
    return 0


async def _decommissionbookie(bk, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    from quorumlog.replication.decommission import decommission_bookie

    result = await decommission_bookie(bk, args.bookie, password=args.password.encode())
    for report in result.reports:
        for ledger in report.ledgers:
            if ledger.error:
                print(ledger.summary(), file=sys.stderr)
    print(result.summary())
    return 0 if result.complete else 1


async def _gc(bk, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    return await gc_trigger.run_gc(bk, args)
