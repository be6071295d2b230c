"""The synchronous API's one proxy over asyncio objects: coroutine methods block,
future-returning methods answer with a concurrent future at once and keep their order
with the blocking calls after them, returned asyncio objects are proxied in turn."""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest

from quorumlog.client.sync import Blocking, LoopThread, is_async_object
from quorumlog.errors import LedgerClosedError


class Child:
    def __init__(self, name: str) -> None:
        self.name = name

    async def hello(self) -> str:
        return f"hello from {self.name}"


class Target:
    """An asyncio object as the client's are: coroutines, a nowait method, a property."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed = False

    @property
    def count(self) -> int:
        return len(self.sent)

    async def child(self, name: str) -> Child:
        return Child(name)

    async def total(self) -> int:
        return len(self.sent)

    def send_nowait(self, data: bytes) -> asyncio.Future[int]:
        if self.closed:
            raise LedgerClosedError("closed")
        self.sent.append(data)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.001, future.set_result, len(self.sent) - 1)
        return future

    def describe(self) -> str:
        return "plain"

    async def close(self) -> None:
        self.closed = True

    def __aiter__(self) -> Target:
        self._left = 3
        return self

    async def __anext__(self) -> int:
        if self._left == 0:
            raise StopAsyncIteration
        self._left -= 1
        return self._left

    def __repr__(self) -> str:
        return "<Target>"


@pytest.fixture
def runner():
    runner = LoopThread("test-proxy")
    yield runner
    runner.stop()


def test_coroutines_block_and_results_that_are_asyncio_objects_come_back_proxied(runner):
    proxy = Blocking(runner, Target())
    child = proxy.child("a")
    assert isinstance(child, Blocking) and isinstance(child.aio, Child)
    assert child.hello() == "hello from a"
    assert child.name == "a"  # attributes are read as they are
    assert proxy.describe() == "plain"
    assert repr(proxy) == "<Target>"
    assert not is_async_object(b"bytes") and not is_async_object(Target)


def test_nowait_calls_answer_with_concurrent_futures_in_order_before_a_blocking_call(runner):
    target = Target()
    proxy = Blocking(runner, target, nowait_limit=4)
    data = bytearray(b"x")
    futures = [proxy.send_nowait(data) for _ in range(20)]  # more than the bound in flight
    data[:] = b"y"  # the proxy copied the buffer when called
    assert all(isinstance(f, concurrent.futures.Future) for f in futures)
    assert proxy.total() == 20  # the queued calls were made before this one
    assert [f.result(5) for f in futures] == list(range(20))
    assert set(target.sent) == {b"x"}


def test_a_nowait_call_that_raises_fails_its_future(runner):
    proxy = Blocking(runner, Target())
    proxy.close()
    with pytest.raises(LedgerClosedError):
        proxy.send_nowait(b"late").result(5)


def test_iteration_and_with_follow_the_asyncio_object(runner):
    target = Target()
    with Blocking(runner, target) as proxy:
        assert list(proxy) == [2, 1, 0]
    assert target.closed
