"""A bookie's request handling: dispatch, adds, and the answers of the journal.

:meth:`Requests.submit` takes every request on the event loop and calls its
handler; ``respond`` is called exactly once, possibly later: an add is answered
only once its journal batch is durable (R2). No task is created per request: the
hot path is plain calls and one thread-safe wake-up per journal batch.

An add checks everything before it changes anything (R12): entries of another
ledger, shorter than the header or with a negative id are a bad request; another
master key is refused (R10); a fenced ledger refuses normal adds (R7); a deleted one
answers NO_SUCH_LEDGER (BookKeeper #4462). Above ``journal_queue_max_bytes`` of
queued journal bytes, adds wait here in order until the journal drains.
"""

from __future__ import annotations

import collections
import logging
import struct
from collections.abc import Callable
from typing import Any

from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.disk_checker import disk_usage
from quorumlog.bookie.invariants import Halt
from quorumlog.bookie.journal.format import add_record, master_key_record
from quorumlog.bookie.journal.writer import Done, Journal
from quorumlog.bookie.ledger_changes import LedgerChanges
from quorumlog.bookie.long_poll import LongPolls
from quorumlog.bookie.maintenance import ReadOnlyMode
from quorumlog.bookie.reads import Reads, Respond, describe
from quorumlog.bookie.storage import LedgerStorage
from quorumlog.bookie.suspicion import settle
from quorumlog.errors import BKError, Status
from quorumlog.proto.codec import (
    AddFlag,
    AddRequest,
    AddResponse,
    BookieInfoRequest,
    BookieInfoResponse,
    DeleteLedgerRequest,
    FenceRequest,
    LedgerKeyRequest,
    LedgerKeyResponse,
    ReadFlag,
    ReadLacRequest,
    ReadRequest,
    Request,
    WriteLacRequest,
    error_response,
)
from quorumlog.proto.entry import ENTRY_HEADER_SIZE

__all__ = ["Requests"]

log = logging.getLogger(__name__)

Handler = Callable[[Any, Respond], None]

_HEADER3 = struct.Struct(">qqq")  # ledger id, entry id, LAC: what a bookie reads of a blob
_OK = Status.OK


class Requests:
    """Dispatch and adds of one bookie (event loop only); takes requests while serving."""

    def __init__(
        self,
        config: BookieConfig,
        storage: LedgerStorage,
        journal: Journal,
        polls: LongPolls,
        reads: Reads,
        changes: LedgerChanges,
        mode: ReadOnlyMode,
        halt: Halt,
    ) -> None:
        self.serving = False  # between the bookie's start() and close()
        self._halt = halt
        halt.on_halt(self._stop_serving)
        self._deferred: collections.deque[tuple[AddRequest, Respond]] = collections.deque()
        self._config = config
        self._mode = mode
        self._reads = reads
        # What every add touches, one attribute away: the add path is the hot one.
        self._storage = storage
        self._states = storage.states
        self._journal = journal
        self._polls = polls
        self._handlers: dict[type, Handler] = {
            AddRequest: self._on_add,
            ReadRequest: self._on_read,
            ReadLacRequest: reads.read_lac,
            FenceRequest: changes.on_fence,
            WriteLacRequest: changes.on_write_lac,
            DeleteLedgerRequest: changes.on_delete,
            BookieInfoRequest: self._on_info,
            LedgerKeyRequest: self._on_ledger_key,
        }
        self._fence = changes.fence
        # One set of counters for the journal, the adds and the reads (server metrics).
        reads.counters = journal.counters

    def _stop_serving(self) -> None:
        self.serving = False

    @property
    def deferred_adds(self) -> int:
        return len(self._deferred)

    def submit(self, request: Request, respond: Respond) -> None:
        """Handle one request; ``respond`` is called exactly once, on the loop."""
        if not self.serving:
            respond(error_response(request, Status.SHUTTING_DOWN))
            return
        handler = self._handlers.get(request.__class__)
        if handler is None:
            respond(error_response(request, Status.BAD_REQUEST))
            return
        self._run_guarded(handler, request, respond)

    def _run_guarded(self, handler: Handler, request: Any, respond: Respond) -> None:
        # Handlers check everything before they change anything, and hand ``respond``
        # on (or call it) as their last step, so an exception means it was not called.
        # Bad input and a failing disk cost that request only; anything else is a state
        # that cannot be, and stops the bookie (see .invariants).
        try:
            handler(request, respond)
        except BKError as exc:
            log.warning(
                "bookie %s: %s failed: %s", self._storage.data_dir, type(request).__name__, exc
            )
            respond(error_response(request, exc.status))
        except (struct.error, ValueError, OverflowError) as exc:
            respond(error_response(request, Status.BAD_REQUEST))
            log.warning(
                "bookie %s: bad %s: %s", self._storage.data_dir, type(request).__name__, exc
            )
        except OSError as exc:
            log.error("bookie %s: %s failed: %s", self._storage.data_dir, describe(request), exc)
            respond(error_response(request, Status.IO_ERROR))
        except Exception as exc:
            self._halt(f"handling {describe(request)}", exc)
            respond(error_response(request, Status.SHUTTING_DOWN))  # only if halt returns

    def _on_read(self, request: ReadRequest, respond: Respond) -> None:
        if request.first_entry_id < 0 or request.count < 0:
            respond(error_response(request, Status.BAD_REQUEST))
            return
        if request.flags & ReadFlag.FENCE:
            self._fence(request, respond, self._reads.read_after_fence)
            return
        self._reads.read(request, respond)

    def _on_ledger_key(self, request: LedgerKeyRequest, respond: Respond) -> None:
        """The ledger's master key as stored at its first write (R10), for re-replication
        of a ledger whose password its repairer was not given (docs/SECURITY.md)."""
        st = self._states.get(request.ledger_id)
        if st is None or st.deleted or st.master_key is None:
            respond(error_response(request, Status.NO_SUCH_LEDGER))
            return
        respond(LedgerKeyResponse(request.request_id, _OK, request.ledger_id, st.master_key))

    def _on_info(self, request: BookieInfoRequest, respond: Respond) -> None:
        usage = disk_usage(self._storage.data_dir)
        respond(
            BookieInfoResponse(
                request.request_id, _OK, self._mode.read_only, usage.free_bytes, usage.total_bytes
            )
        )

    # -------------------------------------------------------------- add

    def _on_add(self, request: AddRequest, respond: Respond) -> None:
        mode = self._mode
        if mode.read_only:
            status = Status.IO_ERROR if mode.journal_failed else Status.READ_ONLY
            respond(error_response(request, status))
            return
        if self._deferred or self._journal.queued_bytes > self._config.journal_queue_max_bytes:
            # Back-pressure: hold the request (in order) until the journal drains.
            self._deferred.append((request, respond))
            return
        self._add(request, respond)

    def _add(self, request: AddRequest, respond: Respond) -> None:
        ledger_id = request.ledger_id
        st = self._states.get(ledger_id)
        if st is not None and (st.deleted or st.damaged):
            # R17: a state that failed its checksum (fence, key) is unknown, not gone.
            status = Status.IO_ERROR if st.damaged else Status.NO_SUCH_LEDGER
            respond(error_response(request, status))
            return
        entries = request.entries
        count = len(entries)
        if count == 1:  # the common case of a lightly loaded writer: no batch machinery
            blob = entries[0]
            size = len(blob)
            if size < ENTRY_HEADER_SIZE:
                respond(error_response(request, Status.BAD_REQUEST))
                return
            blob_ledger_id, entry_id, lac = _HEADER3.unpack_from(blob)
            if blob_ledger_id != ledger_id or entry_id < 0:
                respond(error_response(request, Status.BAD_REQUEST))
                return
        else:
            try:
                headers = list(map(_HEADER3.unpack_from, entries))
            except struct.error:
                respond(error_response(request, Status.BAD_REQUEST))
                return
            if not headers:
                respond(error_response(request, Status.BAD_REQUEST))
                return
            ledger_ids, entry_ids, lacs = zip(*headers)  # noqa: B905 - rows of three
            sizes = list(map(len, entries))
            if (
                min(sizes) < ENTRY_HEADER_SIZE
                or ledger_ids.count(ledger_id) != count
                or min(entry_ids) < 0
            ):
                respond(error_response(request, Status.BAD_REQUEST))
                return
        key = request.master_key
        journal = self._journal
        if st is None:
            st = self._storage.create_state(ledger_id)
            st.master_key = key
            journal.append(master_key_record(ledger_id, key), None)
        elif st.master_key != key and st.master_key is not None:
            respond(error_response(request, Status.UNAUTHORIZED))  # R10
            return
        if st.fenced and not request.flags & AddFlag.RECOVERY:
            respond(error_response(request, Status.FENCED))  # R7
            return
        if st.master_key is None:  # a state recovered without its key: take this one
            st.master_key = key
            self._storage.mark_dirty(st)
            journal.append(master_key_record(ledger_id, key), None)
        if count == 1:
            data = self._storage.add_one(st, blob, size, entry_id)
            first = last = entry_id
        else:
            first, last = min(entry_ids), max(entry_ids)
            data = self._storage.add_entries(st, entries, sizes, entry_ids, last)
            lac = max(lacs)
        if st.suspect:  # a recovery writing again what a damaged journal batch held
            settle(self._storage, st, first, last)
        if lac > st.lac:
            st.lac = lac
            if ledger_id in self._polls:
                self._reads.wake(st)
        counters = journal.counters  # plain integers: metrics cost no call per add
        counters.add_requests += 1
        counters.add_entries += count
        journal.append(
            add_record(ledger_id, data, first, last),
            (respond, AddResponse(request.request_id, _OK, ledger_id, count)),
        )

    def _drain_deferred(self) -> None:
        limit = self._config.journal_queue_max_bytes
        deferred = self._deferred
        mode = self._mode
        while deferred and self._journal.queued_bytes <= limit:
            request, respond = deferred.popleft()
            if mode.read_only:
                status = Status.IO_ERROR if mode.journal_failed else Status.READ_ONLY
                respond(error_response(request, status))
                continue
            self._run_guarded(self._add, request, respond)

    def journal_deferred(self) -> None:
        """Journal every add held back by the queue bound (the bookie is closing)."""
        while self._deferred:
            request, respond = self._deferred.popleft()
            self._run_guarded(self._add, request, respond)

    # -------------------------------------------------------------- journal completions

    def on_journal_batch(self, dones: list[Done], size: int, error: BaseException | None) -> None:
        """A journal batch is durable (answer it), or failed (answer IO_ERROR, refuse adds)."""
        if error is None:
            for fn, arg in dones:
                try:
                    fn(arg)
                except Exception as exc:
                    self._halt("answering a request after its journal batch", exc)
        else:
            if not self._mode.journal_failed:
                log.error(
                    "bookie %s: journal %s failed (%s): refusing adds from now on",
                    self._storage.data_dir,
                    self._journal.directory,
                    error,
                )
                self._mode.journal_failure()
            for fn, arg in dones:
                try:
                    if isinstance(arg, tuple):  # (request, respond) of a continuation
                        arg[1](error_response(arg[0], Status.IO_ERROR))
                    else:
                        arg.status = Status.IO_ERROR
                        fn(arg)
                except Exception as exc:
                    self._halt("answering a request after its journal batch failed", exc)
        if self._deferred:
            self._drain_deferred()
