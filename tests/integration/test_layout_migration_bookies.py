"""Moving a flat cluster to the hierarchical layout with real bookies, on both metadata
drivers: a writer appends and rolls to new ledgers, a recovery closes an open ledger,
and the migration is stopped after every move and run again (the last run through
``quorumlog shell migratelayout``). Every ledger is then listed once, found at its
hierarchical place only, and reads back every entry that was confirmed."""

from __future__ import annotations

import asyncio

from support import run, shell

from quorumlog.aio import BookKeeper
from quorumlog.meta.factory import open_store
from quorumlog.meta.layout import LEDGERS_PATH, Layout, flat_ledger_id
from quorumlog.meta.ledgers import LedgerManager
from quorumlog.meta.migrate import migrate_to_hierarchical
from quorumlog.server.local_cluster import LocalCluster

PASSWORD = b"layout"


def test_migration_stopped_after_each_move_while_a_writer_appends_and_a_recovery_closes(
    cluster3: LocalCluster,
) -> None:
    uri = cluster3.metadata_uri

    async def scenario() -> dict[int, list[bytes]]:
        async with await open_store(uri) as store:
            await store.create(LEDGERS_PATH)  # a cluster from before layouts: flat
            bk = await BookKeeper.connect(uri)
            try:
                written: dict[int, list[bytes]] = {}
                handles = []
                for n in range(6):
                    lh = await bk.create_ledger(3, 2, 2, password=PASSWORD)
                    written[lh.ledger_id] = []
                    for e in range(3):
                        payload = b"%d-%d" % (lh.ledger_id, e)
                        await lh.add_entry(payload)
                        written[lh.ledger_id].append(payload)
                    if n < 3:
                        await lh.close()
                    else:
                        handles.append(lh)
                names = await store.children(LEDGERS_PATH)
                assert sorted(map(flat_ledger_id, names)) == sorted(written)  # all flat

                stop = asyncio.Event()
                current = handles[0]

                async def writer() -> None:
                    nonlocal current
                    count = 0
                    while not stop.is_set():
                        payload = b"%d-%d" % (current.ledger_id, len(written[current.ledger_id]))
                        await current.add_entry(payload)
                        written[current.ledger_id].append(payload)
                        count += 1
                        if count % 15 == 0:  # roll over: a new ledger, then close the old
                            previous = current
                            current = await bk.create_ledger(3, 2, 2, password=PASSWORD)
                            written[current.ledger_id] = []
                            await previous.close()

                async def recovery() -> None:
                    await asyncio.sleep(0.05)
                    # Another client recovers an open ledger: fence, close (a CAS).
                    other = await BookKeeper.connect(uri)
                    try:
                        rh = await other.open_ledger(handles[1].ledger_id, PASSWORD)
                        await rh.close()
                    finally:
                        await other.close()

                tasks = [asyncio.create_task(writer()), asyncio.create_task(recovery())]
                runs = 0
                while True:
                    report = await migrate_to_hierarchical(store, max_moves=1)
                    runs += 1
                    if report.left <= 1:
                        break
                    await asyncio.sleep(0.02)
                await tasks[1]
                stop.set()
                await tasks[0]
                await current.close()
                return written
            finally:
                await bk.close()

    written = run(scenario(), timeout_s=120)

    # The last run as operators run it: through the shell command, which finds the
    # last flat ledger (if it was not moved yet) and reports none left.
    result = shell(uri, "migratelayout")
    assert result.returncode == 0, result.stderr
    assert "0 flat left" in result.stdout
    again = shell(uri, "migratelayout")
    assert again.returncode == 0 and "0 ledger(s) moved" in again.stdout
    listed = shell(uri, "listledgers")
    assert [int(x) for x in listed.stdout.split()] == sorted(written)

    async def check() -> None:
        async with await open_store(uri) as store:
            names = await store.children(LEDGERS_PATH)
            assert [n for n in names if flat_ledger_id(n) is not None] == []
            ledgers = LedgerManager(store)
            assert await ledgers.list_ledger_ids() == sorted(written)
            for ledger_id in written:
                assert await ledgers.path_of(ledger_id) == Layout().path(ledger_id)
        bk = await BookKeeper.connect(uri)
        try:
            for ledger_id, payloads in written.items():
                rh = await bk.open_ledger(ledger_id, PASSWORD)
                if payloads:
                    entries = await rh.read_entries(0, rh.last_add_confirmed)
                    got = [e.data for e in entries]
                    # The recovered ledger was closed at what its writer had confirmed.
                    assert got == payloads, ledger_id
                else:
                    assert rh.last_add_confirmed == -1
                await rh.close()
        finally:
            await bk.close()

    run(check(), timeout_s=120)
