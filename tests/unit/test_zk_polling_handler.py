"""The ZooKeeper client's handler waits with ``poll``, with kazoo's own semantics: for
each state of a socket, it selects what kazoo's default selection selects."""

from __future__ import annotations

import socket

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
    ours = PollingHandler().select(rlist, wlist, [], timeout)
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
            PollingHandler().select([a], [], [], bad)
        with pytest.raises((ValueError, TypeError)) as kazoos:
            selector_select([a], [], [], bad)
        assert type(ours.value) is type(kazoos.value)
