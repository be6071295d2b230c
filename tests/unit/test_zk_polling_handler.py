"""The ZooKeeper client's handler waits with ``poll``, with kazoo's own semantics: for
each state of a socket, it selects what kazoo's default selection selects."""

from __future__ import annotations

import socket
import time

import pytest
from kazoo.handlers.utils import selector_select

from quorumlog.meta.zk_store import PollingHandler


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def both(rlist, wlist, timeout=0.0):
    ours = PollingHandler(socket_wait_s=60.0).select(rlist, wlist, [], timeout)
    kazoos = selector_select(rlist, wlist, [], timeout)
    assert ours == kazoos
    return ours


def test_writable_readable_and_neither(pair):
    a, b = pair
    assert both([], [a]) == ([], [a], [])  # writable, nothing to read
    assert both([a], []) == ([], [], [])  # nothing to read: times out empty
    b.send(b"x")
    assert both([a], []) == ([a], [], [])
    # Readable and writable: kazoo reports it on the read side only, once for each
    # list it was given in, and so do we.
    assert both([a], [a]) == ([a, a], [], [])


def test_a_closed_peer_reads_as_readable(pair):
    a, b = pair
    b.close()
    assert both([a], []) == ([a], [], [])


def test_a_wait_ends_at_its_timeout(pair):
    a, _ = pair
    assert both([a], [], timeout=0.05) == ([], [], [])


def test_bad_arguments_fail_as_kazoo_fails(pair):
    a, _ = pair
    for bad in (-1.0, "1"):
        with pytest.raises((ValueError, TypeError)) as ours:
            PollingHandler(socket_wait_s=60.0).select([a], [], [], bad)
        with pytest.raises((ValueError, TypeError)) as kazoos:
            selector_select([a], [], [], bad)
        assert type(ours.value) is type(kazoos.value)


def test_a_wait_on_the_socket_alone_ends_at_socket_wait_s(pair):
    """kazoo waits for a frame, or the answer to its connection request, with the whole
    session timeout; the handler bounds that wait (a server that never answers)."""
    a, b = pair
    handler = PollingHandler(socket_wait_s=0.05)
    started = time.monotonic()
    assert handler.select([a], [], [], 30.0) == ([], [], [])
    assert handler.select([a], [], [], None) == ([], [], [])
    assert time.monotonic() - started < 5.0
    # The connection loop's wait (the socket and kazoo's wake-up pipe) keeps its own
    # timeout: it follows kazoo's ping schedule.
    c, d = socket.socketpair()
    try:
        started = time.monotonic()
        assert handler.select([c, a], [], [], 0.3) == ([], [], [])
        assert time.monotonic() - started >= 0.25
        b.send(b"x")
        assert handler.select([c, a], [], [], 30.0) == ([a], [], [])
    finally:
        c.close()
        d.close()
