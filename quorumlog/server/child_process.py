"""What a harness keeps of a server process it starts, stops and starts again: the
bookies of :class:`~quorumlog.server.local_cluster.LocalCluster`, the servers of the
namespace cluster (:mod:`tests.harness.netns`).

Both are dataclass records that declare the attributes named here; these classes add
only behaviour, so each record keeps its own fields and constructor. Processes are only
ever signalled by pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

KILL_WAIT_S = 10.0


class ChildProcess:
    """A process this harness started (``process``: None before the first start)."""

    process: subprocess.Popen[bytes] | None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.process.poll() if self.process is not None else None


class RestartedChildProcess(ChildProcess):
    """A child process started again with its home kept: start K (``starts``, from 1)
    writes ``home/stdout-K.log`` and ``home/stderr-K.log``, so that what an earlier run
    printed is still there to diagnose it."""

    home: Path
    starts: int

    @property
    def stdout_path(self) -> Path:
        return self.home / f"stdout-{self.starts}.log"

    @property
    def stderr_path(self) -> Path:
        return self.home / f"stderr-{self.starts}.log"

    def stdout_text(self) -> str:
        """What the current (or last) run printed on stdout."""
        return read_text(self.stdout_path)

    def stderr_text(self) -> str:
        """What the current (or last) run printed on stderr."""
        return read_text(self.stderr_path)


def read_text(path: Path) -> str:
    """A log file's text ("" before the process wrote it)."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def kill_now(process: subprocess.Popen[bytes], wait_s: float = KILL_WAIT_S) -> None:
    """kill -9 by pid (a paused process resumed first) and reap it."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)
            os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=wait_s)
