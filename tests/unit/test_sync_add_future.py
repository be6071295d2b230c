"""The synchronous facade's AddFuture: futures of one handle share a condition, and each
still behaves as a concurrent.futures.Future (waits, timeouts, cancel, wait/as_completed)."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest
from support import poll_until

from quorumlog.client.sync import AddFuture, AddWaits


def futures(count: int) -> list[AddFuture[int]]:
    shared = AddWaits()
    return [AddFuture(shared) for _ in range(count)]


def test_a_waiter_woken_by_another_futures_completion_keeps_waiting_for_its_own() -> None:
    shared = AddWaits()
    first, second = AddFuture[int](shared), AddFuture[int](shared)
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(first.result(timeout=10)))
    waiter.start()
    poll_until(lambda: shared.waiting, timeout_s=10, what="the waiter waits")
    second.set_result(2)  # notifies the shared condition: the waiter must not return
    # The notification took it off the condition's waiters; it waits again.
    poll_until(lambda: shared.condition._waiters, timeout_s=10, what="the waiter waits again")  # type: ignore[attr-defined]
    assert not first.done()
    first.set_result(1)
    waiter.join(10)
    assert got == [1]


def test_result_and_exception_time_out_while_pending() -> None:
    (future,) = futures(1)
    with pytest.raises(concurrent.futures.TimeoutError):
        future.result(timeout=0.01)
    with pytest.raises(concurrent.futures.TimeoutError):
        future.exception(timeout=0.01)


def test_exceptions_cancel_and_callbacks_are_those_of_a_future() -> None:
    failed, cancelled, done = futures(3)
    error = RuntimeError("bookie lost")
    failed.set_exception(error)
    assert failed.exception() is error
    with pytest.raises(RuntimeError):
        failed.result()
    assert cancelled.cancel()
    with pytest.raises(concurrent.futures.CancelledError):
        cancelled.result()
    with pytest.raises(concurrent.futures.InvalidStateError):
        cancelled.set_result(1)  # what the ledger handle meets for a cancelled add
    seen: list[int] = []
    done.add_done_callback(lambda f: seen.append(f.result()))
    done.set_result(7)
    assert seen == [7]


def test_wait_and_as_completed_take_the_shared_condition_once_per_future() -> None:
    group = futures(3)
    timer = threading.Timer(0.05, lambda: [f.set_result(i) for i, f in enumerate(group)])
    timer.start()
    finished, pending = concurrent.futures.wait(group, timeout=10)
    assert len(finished) == 3 and not pending
    assert sorted(f.result() for f in concurrent.futures.as_completed(group)) == [0, 1, 2]


def test_a_completion_wakes_a_waiter_and_only_then_notifies() -> None:
    shared = AddWaits()
    (future,) = [AddFuture[int](shared)]
    notified: list[int] = []
    notify_all = shared.condition.notify_all

    def counting_notify_all() -> None:
        notified.append(1)
        notify_all()

    shared.condition.notify_all = counting_notify_all  # type: ignore[method-assign]
    AddFuture[int](shared).set_result(0)  # nobody waits
    assert notified == []
    got: list[BaseException | None] = []
    waiter = threading.Thread(target=lambda: got.append(future.exception(timeout=10)))
    waiter.start()
    poll_until(lambda: shared.waiting, timeout_s=10, what="the waiter waits")
    error = RuntimeError("fenced")
    future.set_exception(error)
    waiter.join(10)
    assert got == [error] and notified == [1]
