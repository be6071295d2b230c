"""Requests that change a ledger's state without adding entries: fence, explicit LAC, delete.

Fence (R7): the flag is set in memory at once, so an add handled after it is refused
even before the FENCE record is synced, and the fence is answered once it is durable;
the record makes it survive a restart. Fence and explicit LAC carry the master key:
another key is refused and changes nothing (R10); the first key seen is journaled.
A delete carries the master key too: another key is refused (UNAUTHORIZED) and changes
nothing; a ledger this bookie never saw (or knows without a key) has no key to compare,
and gets its tombstone, so a late add of the old writer cannot revive the ledger
(BookKeeper #4462). Every change is journaled before it is answered (R2).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from quorumlog.bookie.invariants import Halt
from quorumlog.bookie.journal.format import (
    delete_record,
    fence_record,
    lac_record,
    master_key_record,
)
from quorumlog.bookie.journal.writer import Journal
from quorumlog.bookie.ledger_state import LedgerState
from quorumlog.bookie.maintenance import ReadOnlyMode
from quorumlog.bookie.reads import Reads, Respond, describe
from quorumlog.bookie.storage import LedgerStorage
from quorumlog.errors import BKError, Status
from quorumlog.proto.codec import (
    DeleteLedgerRequest,
    FenceRequest,
    FenceResponse,
    Op,
    ReadRequest,
    StatusResponse,
    WriteLacRequest,
    error_response,
)

__all__ = ["LedgerChanges", "raise_explicit_lac"]

log = logging.getLogger(__name__)

_OK = Status.OK


def raise_explicit_lac(storage: LedgerStorage, st: LedgerState, lac: int) -> bool:
    """Record an explicit LAC; True when it moved the ledger's LAC (polls may wake)."""
    if lac > st.explicit_lac:
        st.explicit_lac = lac
        storage.mark_dirty(st)
    if lac > st.lac:
        st.lac = lac
        storage.mark_dirty(st)
        return True
    return False


class LedgerChanges:
    """Fence, explicit LAC and delete of one bookie (event loop only)."""

    def __init__(
        self,
        storage: LedgerStorage,
        journal: Journal,
        reads: Reads,
        mode: ReadOnlyMode,
        halt: Halt,
    ) -> None:
        self._halt = halt
        self._storage = storage
        self._journal = journal
        self._reads = reads
        self._mode = mode

    def _keyed_state(
        self, request: FenceRequest | ReadRequest | WriteLacRequest, key: bytes, respond: Respond
    ) -> LedgerState | None:
        """The ledger's state for a keyed request that changes it (fence, explicit LAC).

        Answers the request and returns None when the journal has failed, the ledger was
        deleted here, or ``key`` is not the ledger's master key (R10: nothing changes).
        Otherwise creates the state if this bookie never saw the ledger, and records the
        key on first use (journaled before the request that follows it is answered).
        """
        if self._mode.journal_failed:
            respond(error_response(request, Status.IO_ERROR))
            return None
        ledger_id = request.ledger_id
        st = self._storage.states.get(ledger_id)
        if st is not None:
            if st.deleted:
                respond(error_response(request, Status.NO_SUCH_LEDGER))
                return None
            if st.damaged:  # R17: its key and fence are unknown; only a delete settles it
                respond(error_response(request, Status.IO_ERROR))
                return None
            if st.master_key is not None and st.master_key != key:
                respond(error_response(request, Status.UNAUTHORIZED))  # R10
                return None
        else:
            st = self._storage.create_state(ledger_id)
        if st.master_key is None:
            st.master_key = key
            self._storage.mark_dirty(st)
            self._journal.append(master_key_record(ledger_id, key), None)
        return st

    # -------------------------------------------------------------- fencing

    def fence(
        self,
        request: FenceRequest | ReadRequest,
        respond: Respond,
        then: Callable[[tuple[Any, Respond]], None],
    ) -> None:
        """Fence (R7): in memory at once, answered through ``then`` once durable."""
        st = self._keyed_state(request, request.master_key, respond)
        if st is None:
            return
        if st.fenced and st.fence_durable:
            then((request, respond))
            return
        if not st.fenced:
            st.fenced = True
            self._storage.mark_dirty(st)
        self._journal.append(
            fence_record(st.ledger_id), (self._fence_durable, (request, respond, then))
        )

    def _fence_durable(self, arg: tuple[Any, Respond, Callable[[Any], None]]) -> None:
        request, respond, then = arg
        st = self._storage.states.get(request.ledger_id)
        if st is not None and st.fenced:
            st.fence_durable = True
        try:
            then((request, respond))
        except BKError as exc:
            log.warning(
                "bookie %s: %s failed: %s", self._storage.data_dir, type(request).__name__, exc
            )
            respond(error_response(request, exc.status))
        except OSError as exc:  # a disk failed: that request's answer, not the bookie
            log.error("bookie %s: %s failed: %s", self._storage.data_dir, describe(request), exc)
            respond(error_response(request, Status.IO_ERROR))
        except Exception as exc:
            self._halt(f"answering {describe(request)} after its fence", exc)
            respond(error_response(request, Status.SHUTTING_DOWN))  # only if halt returns

    def on_fence(self, request: FenceRequest, respond: Respond) -> None:
        self.fence(request, respond, self._answer_fence)

    def _answer_fence(self, arg: tuple[FenceRequest, Respond]) -> None:
        request, respond = arg
        st = self._storage.states.get(request.ledger_id)
        if st is None or st.deleted:
            respond(error_response(request, Status.NO_SUCH_LEDGER))
            return
        respond(FenceResponse(request.request_id, _OK, request.ledger_id, st.lac, st.last_entry_id))

    # -------------------------------------------------------------- explicit LAC, delete

    def on_write_lac(self, request: WriteLacRequest, respond: Respond) -> None:
        ledger_id = request.ledger_id
        st = self._keyed_state(request, request.master_key, respond)
        if st is None:
            return
        if raise_explicit_lac(self._storage, st, request.lac):
            self._reads.wake(st)  # answers nothing when no poll is parked on the ledger
        self._journal.append(
            lac_record(ledger_id, request.lac),
            (respond, StatusResponse(request.request_id, Op.WRITE_LAC, _OK, ledger_id)),
        )

    def on_delete(self, request: DeleteLedgerRequest, respond: Respond) -> None:
        ledger_id = request.ledger_id
        if self._mode.journal_failed:
            respond(error_response(request, Status.IO_ERROR))
            return
        st = self._storage.states.get(ledger_id)
        if (
            st is not None
            and not st.deleted
            and st.master_key is not None
            and st.master_key != request.master_key
        ):
            # R10: only the ledger's owner may purge it; nothing changes, not even its polls.
            respond(error_response(request, Status.UNAUTHORIZED))
            return
        self._reads.drop(ledger_id)
        self._storage.drop_ledger(ledger_id, tombstone=True)
        self._journal.append(
            delete_record(ledger_id),
            (respond, StatusResponse(request.request_id, Op.DELETE_LEDGER, _OK, ledger_id)),
        )
