"""What a bookie does when one of its invariants breaks: it stops at once (TigerBeetle's way).

Three kinds of failure meet a request, and each has its answer:

- bad input (R12): the request is answered BAD_REQUEST (or the connection closed) and the
  bookie serves on; nothing was changed, because handlers check before they change;
- a failing environment: a disk's I/O error, a damaged record (R9), a failed journal
  (R14): the request is answered IO_ERROR, and the failure's own rules apply (read-only
  mode, a refused start);
- a state that cannot be: an assertion, a :class:`BrokenInvariant`, or any other exception
  no handler expects. Then the bookie's memory can no longer be trusted: answering IO_ERROR
  and serving on could acknowledge or serve wrong data, and a graceful close would
  checkpoint that state. So the bookie stops without another write: :class:`Halt` logs
  the failure with its traceback, and its action (by default :func:`exit_process`) puts
  the message on stderr and ends the process with status 70 (EX_SOFTWARE), as a crash
  would. The journal holds every change the bookie acknowledged; the next start replays it.

In a process that hosts bookies among other things (tests, the simulator), the action may
record the message instead; the bookie then answers SHUTTING_DOWN to everything and runs
no timed job.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["EXIT_BROKEN_INVARIANT", "BrokenInvariant", "Halt", "exit_process"]

log = logging.getLogger(__name__)

EXIT_BROKEN_INVARIANT = 70  # sysexits' EX_SOFTWARE: an internal software error


class BrokenInvariant(AssertionError):
    """A state that cannot be, found by the bookie's own checks."""


def exit_process(message: str) -> None:
    """Write ``message`` on stderr and end the process now: no clean-up runs, nothing more
    is written to the bookie's files."""
    try:
        sys.stderr.write(f"quorumlog bookie: {message}\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_BROKEN_INVARIANT)


class Halt:
    """Stops one bookie when an invariant breaks; see the module docstring.

    ``halt(where, exc)`` from any part of the bookie (event loop only). Parts that must stop
    with it register with :meth:`on_halt` (they matter only when the action returns).
    """

    def __init__(self, data_dir: Path, action: Callable[[str], None] | None = None) -> None:
        self._data_dir = data_dir
        self._action = action or exit_process
        self._stops: list[Callable[[], None]] = []
        self.message: str | None = None  # the first invariant that broke, in words

    def on_halt(self, stop: Callable[[], None]) -> None:
        self._stops.append(stop)

    def __call__(self, where: str, exc: BaseException) -> None:
        message = (
            f"bookie {self._data_dir}: broken invariant in {where}: "
            f"{type(exc).__name__}: {exc}; stopping now without a checkpoint (the journal "
            f"holds every acknowledged change; a restart replays it)"
        )
        log.critical("%s", message, exc_info=exc)
        if self.message is None:
            self.message = message
        for stop in self._stops:
            try:
                stop()
            except Exception:  # stopping must go on whatever one part does
                log.exception("bookie %s: stopping after a broken invariant", self._data_dir)
        self._action(message)
