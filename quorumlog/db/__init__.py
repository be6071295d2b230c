"""quorumlog db: a replicated SQL database on a log stream, served over rqlite's HTTP API.

Each replica keeps a SQLite file; the elected leader logs every write request as one
record of the log ``db/<name>`` and applies it once confirmed, followers tail the log
and apply the same records in the same order (docs/DB.md).

- :mod:`quorumlog.db.sql` -- statements, parameters, the rewrite of non-deterministic
  calls (pure);
- :mod:`quorumlog.db.machine` -- the state machine: records applied to SQLite with the
  applied position in the same transaction (no network);
- :mod:`quorumlog.db.replica` -- the replica on the asyncio client: election, log
  writer and reader;
- :mod:`quorumlog.db.http` -- rqlite's HTTP API (aiohttp).

Embedding a replica::

    from quorumlog.aio import BookKeeper
    from quorumlog.db import Replica, ReplicaConfig, Statement

    bk = await BookKeeper.connect(uri)
    replica = Replica(bk, ReplicaConfig(name="shop", data_dir="/var/lib/shop", node_id="a"))
    await replica.start()
    if replica.is_leader:
        answer = await replica.execute([Statement("INSERT INTO t VALUES (?)", [1])])
        print(answer.position, answer.results[0].rows_affected)
    print(replica.query([Statement("SELECT * FROM t")])[0].values)
    await replica.close()
"""

from quorumlog.db.machine import DbRecord, ReplicaStorageError, StateMachine, StatementResult
from quorumlog.db.replica import NotLeaderError, Replica, ReplicaConfig, WriteAnswer, log_name_of
from quorumlog.db.sql import BadRequestError, Statement, parse_statements

__all__ = [
    "BadRequestError",
    "DbRecord",
    "NotLeaderError",
    "Replica",
    "ReplicaConfig",
    "ReplicaStorageError",
    "StateMachine",
    "Statement",
    "StatementResult",
    "WriteAnswer",
    "log_name_of",
    "parse_statements",
]
