"""Process faults for tests, always by process id (never by name: other runs on the same
machine must not be hit).

- :func:`kill_process`: ``kill -9``, a crash; nothing the process buffered is flushed.
- :func:`pause_process`: ``SIGSTOP``; the process keeps its sockets, sessions and locks
  but answers nothing, like a long GC pause or a frozen VM.
- :func:`resume_process`: ``SIGCONT``.

The bookies of a :class:`~quorumlog.server.local_cluster.LocalCluster` have methods of
their own (``kill``, ``stop``, ``pause``, ``resume``, ``restart``), which signal by pid
too and keep track of which bookies run; use these for your application's processes
(a writer, a reader, a leader).

Example::

    writer = subprocess.Popen([sys.executable, "my_writer.py", cluster.metadata_uri])
    pause_process(writer.pid)  # its ZooKeeper session expires, another leader takes over
    resume_process(writer.pid)  # it must now find out it lost the log (R11)
    kill_process(writer.pid)
    writer.wait()
"""

from __future__ import annotations

import os
import signal


def kill_process(pid: int) -> None:
    """SIGKILL process ``pid`` (a paused process dies too). Reaping a child of yours is
    still up to you (``Popen.wait``)."""
    os.kill(pid, signal.SIGKILL)


def pause_process(pid: int) -> None:
    """SIGSTOP process ``pid``: it stays alive and connected but does nothing."""
    os.kill(pid, signal.SIGSTOP)


def resume_process(pid: int) -> None:
    """SIGCONT process ``pid`` after :func:`pause_process`."""
    os.kill(pid, signal.SIGCONT)


__all__ = ["kill_process", "pause_process", "resume_process"]
