"""A bookie's reads: entries, long polls and the LAC.

A read answers the entries the bookie has from ``first_entry_id`` and the LAC it
knows (R4); a damaged record is an I/O error, never "no such entry" (R9, raised by
ledger storage), and so is a missing entry that a damaged journal batch may have
held, and the LAC while such an entry may have carried a higher one (R17,
:mod:`.suspicion`). A long poll parks until an add or an explicit LAC moves the
ledger's LAC past the reader's, or until it times out (:mod:`.long_poll`).
A deleted ledger answers NO_SUCH_LEDGER to every read (its tombstone).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.invariants import Halt
from quorumlog.bookie.ledger_state import LedgerState
from quorumlog.bookie.long_poll import LongPolls, Poll
from quorumlog.bookie.metrics import BookieCounters
from quorumlog.bookie.storage import LedgerStorage
from quorumlog.bookie.suspicion import entry_unknown, lac_unknown
from quorumlog.errors import BKError, Status
from quorumlog.proto.codec import (
    ReadFlag,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Response,
    error_response,
)

__all__ = ["Reads", "Respond", "describe"]

log = logging.getLogger(__name__)

Respond = Callable[[Response], None]


def describe(request: object) -> str:
    """A request in a few words for a message (never its entries)."""
    return (
        f"{type(request).__name__}(request {getattr(request, 'request_id', '?')}, "
        f"ledger {getattr(request, 'ledger_id', '-')})"
    )


_OK = Status.OK


class Reads:
    """Answers reads and read-LACs, and keeps the parked long polls (event loop only)."""

    def __init__(
        self, config: BookieConfig, storage: LedgerStorage, polls: LongPolls, halt: Halt
    ) -> None:
        self._config = config
        self._halt = halt
        self._storage = storage
        self._states = storage.states
        self._polls = polls
        self.counters = BookieCounters()  # the bookie's, once it is opened

    def read(self, request: ReadRequest, respond: Respond) -> None:
        """A read whose ids were checked (and that was fenced first, if it asked to be)."""
        ledger_id = request.ledger_id
        st = self._states.get(ledger_id)
        if st is not None and (st.deleted or st.damaged):
            # R17: a state that failed its checksum is unknown, not gone.
            status = Status.IO_ERROR if st.damaged else Status.NO_SUCH_LEDGER
            respond(error_response(request, status))
            return
        if request.flags & ReadFlag.LONG_POLL:
            self._long_poll(request, respond, st)
            return
        if st is None:
            respond(error_response(request, Status.NO_SUCH_LEDGER))
            return
        started = time.perf_counter()
        entries = self._storage.read_entries(
            st, request.first_entry_id, request.count, self._max_bytes(request)
        )
        counters = self.counters
        counters.read_latency.observe(time.perf_counter() - started)
        counters.read_requests += 1
        counters.read_entries += len(entries)
        if not entries:
            # R17: absent only if no damaged journal batch may have held it.
            missing = request.first_entry_id
            if st.suspect and entry_unknown(st, missing):
                log.warning(
                    "bookie %s: ledger %d entry %d is unknown: a damaged journal batch held it",
                    self._storage.data_dir,
                    ledger_id,
                    missing,
                )
                respond(error_response(request, Status.IO_ERROR))
                return
        status = _OK if entries else Status.NO_SUCH_ENTRY
        respond(
            ReadResponse(
                request.request_id, status, ledger_id, request.first_entry_id, st.lac, entries
            )
        )

    def read_after_fence(self, arg: tuple[ReadRequest, Respond]) -> None:
        request, respond = arg
        self.read(request, respond)

    def read_lac(self, request: ReadLacRequest, respond: Respond) -> None:
        st = self._states.get(request.ledger_id)
        if st is None or st.deleted:
            respond(error_response(request, Status.NO_SUCH_LEDGER))
            return
        if st.damaged:
            respond(error_response(request, Status.IO_ERROR))  # R17: its LAC is unknown
            return
        if st.suspect and lac_unknown(self._storage, st):
            respond(error_response(request, Status.IO_ERROR))  # R17: it may be higher
            return
        respond(
            ReadLacResponse(request.request_id, _OK, request.ledger_id, st.lac, st.last_entry_id)
        )

    def _max_bytes(self, request: ReadRequest) -> int:
        return min(request.max_bytes, self._config.read_response_max_bytes)

    # ------------------------------------------------------------ long polls

    def _long_poll(self, request: ReadRequest, respond: Respond, st: LedgerState | None) -> None:
        lac = st.lac if st is not None else -1
        timeout_ms = min(request.timeout_ms, self._config.long_poll_max_timeout_ms)
        if lac > request.previous_lac or timeout_ms <= 0:
            self._answer_poll_now(Poll(request, respond), with_entries=True)
            return
        if not self._polls.park(request, respond, timeout_ms / 1000, self._poll_timed_out):
            respond(error_response(request, Status.TOO_MANY_REQUESTS))

    def _poll_timed_out(self, poll: Poll) -> None:
        self._answer_poll_now(poll, with_entries=False)

    def wake(self, st: LedgerState) -> None:
        """Answer the polls of ``st`` that its LAC now passes (after an add or explicit LAC)."""
        for poll in self._polls.ready(st.ledger_id, st.lac):
            self._answer_poll_now(poll, with_entries=True)

    def drop(self, ledger_id: int) -> None:
        """Answer the polls of a ledger that is deleted or collected: NO_SUCH_LEDGER."""
        for poll in self._polls.take(ledger_id):
            poll.respond(error_response(poll.request, Status.NO_SUCH_LEDGER))

    def answer_all(self) -> None:
        """Answer every parked poll with the LAC as it is (the bookie is closing)."""
        for poll in self._polls.take_all():
            self._answer_poll_now(poll, with_entries=False)

    def _answer_poll_now(self, poll: Poll, with_entries: bool) -> None:
        request = poll.request
        try:
            st = self._states.get(request.ledger_id)
            if st is not None and st.deleted:
                poll.respond(error_response(request, Status.NO_SUCH_LEDGER))
                return
            lac = st.lac if st is not None else -1
            entries: list[bytes] = []
            if with_entries and st is not None:
                entries = self._storage.read_entries(
                    st, request.first_entry_id, request.count, self._max_bytes(request)
                )
            poll.respond(
                ReadResponse(
                    request.request_id, _OK, request.ledger_id, request.first_entry_id, lac, entries
                )
            )
        except BKError as exc:
            log.warning("bookie %s: long poll: %s", self._storage.data_dir, exc)
            poll.respond(error_response(request, exc.status))
        except OSError as exc:  # a disk failed: that poll's answer, not the bookie
            log.error("bookie %s: long poll: %s", self._storage.data_dir, exc)
            poll.respond(error_response(request, Status.IO_ERROR))
        except Exception as exc:
            # Not answered: the failure may lie in the answering itself.
            self._halt(f"answering the long poll {describe(request)}", exc)
