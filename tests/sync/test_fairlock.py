"""FairLock and AsyncFairLock: grants in arrival order, against a real redis-server.

The order tests are built so that a plain lock fails them: the waiters that
arrive later wait with shorter timeouts, so their waiting-set entries end
first, and a plain lock's release wakes the waiter whose entry ends first
(core/scripts.py, RELEASE). A fair lock must still grant in arrival order.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_rlock.core import FairLock, LockClient, LockTimeout
from django_rlock.core.aio import AsyncFairLock, AsyncLockClient
from tests.owners import acquire_in_task
from tests.servers import RedisServer
from tests.sync.fairqueue import HANG, kill_once_queued, queued, wait_until

#: Short, so that a dead waiter's entry expires within a couple of seconds.
WATCHDOG_TIMEOUT = 1.5

WAITERS = 5

#: Longer than any order test's waiter waits (see ``long_client``).
ORDER_WATCHDOG = 60.0


@pytest.fixture
def client(r: redis.Redis, redis_url: str) -> Iterator[LockClient]:
    with LockClient(redis_url, key_prefix="fair", watchdog_timeout=WATCHDOG_TIMEOUT) as made:
        yield made


def queue_of(lock: FairLock | AsyncFairLock) -> str:
    return lock.fair_keys.queue


@pytest.fixture
def long_client(r: redis.Redis, redis_url: str) -> Iterator[LockClient]:
    """A client whose watchdog timeout is longer than the waiters' timeouts.

    Waiters then announce sleeps as long as their own timeouts, so a plain
    lock would wake the latest arrival first (see the module's docstring).
    """
    with LockClient(redis_url, key_prefix="fair", watchdog_timeout=ORDER_WATCHDOG) as made:
        yield made


def test_threads_are_granted_in_arrival_order(long_client: LockClient, r: redis.Redis) -> None:
    lock = long_client.fair_lock("orders")
    assert lock.acquire(lease=60)  # a long lease: the waiters' own timeouts bound their sleeps
    history: list[int] = []

    def waiter(index: int) -> None:
        # Later arrivals wait less: a plain lock would wake them first.
        assert lock.acquire(timeout=HANG * 2 - index)
        history.append(index)
        lock.release()

    threads = []
    for index in range(WAITERS):
        thread = threading.Thread(target=waiter, args=(index,))
        thread.start()
        threads.append(thread)
        wait_until(queued(r, lock, index + 1), f"{index + 1} are queued")
    lock.release()
    for thread in threads:
        thread.join(HANG)
    assert history == list(range(WAITERS))
    assert r.zcard(queue_of(lock)) == 0


def test_tasks_are_granted_in_arrival_order(redis_url: str, r: redis.Redis) -> None:
    async def main() -> list[int]:
        async with AsyncLockClient(
            redis_url, key_prefix="fair", watchdog_timeout=ORDER_WATCHDOG
        ) as aclient:
            lock = aclient.fair_lock("orders")
            assert await lock.acquire(lease=60)
            history: list[int] = []

            async def waiter(index: int) -> None:
                assert await lock.acquire(timeout=HANG * 2 - index)
                history.append(index)
                await lock.release()

            tasks = []
            for index in range(WAITERS):
                tasks.append(asyncio.create_task(waiter(index)))
                async with asyncio.timeout(HANG):
                    while r.zcard(queue_of(lock)) != index + 1:
                        await asyncio.sleep(0.01)
            await lock.release()
            async with asyncio.timeout(HANG):
                await asyncio.gather(*tasks)
            return history

    assert asyncio.run(main()) == list(range(WAITERS))


def test_a_waiter_that_times_out_leaves_the_queue_at_once(
    client: LockClient, r: redis.Redis
) -> None:
    lock = client.fair_lock("report")
    assert lock.acquire(lease=60)
    outcomes: dict[str, Any] = {}

    def quitter() -> None:
        outcomes["quitter"] = lock.acquire(timeout=0.5)

    def patient() -> None:
        outcomes["patient"] = lock.acquire(timeout=HANG)
        lock.release()

    first = threading.Thread(target=quitter)
    first.start()
    wait_until(queued(r, lock, 1), "the quitter is queued")
    second = threading.Thread(target=patient)
    second.start()
    wait_until(queued(r, lock, 2), "the patient waiter is queued")
    first.join(HANG)
    assert outcomes["quitter"] is False
    # Gone from the queue as it gave up, not when its entry would have expired.
    assert r.zcard(queue_of(lock)) == 1
    assert r.zcard(lock.keys.waiters) == 1
    lock.release()
    second.join(HANG)
    assert outcomes["patient"] is True


def test_a_killed_waiter_stalls_the_queue_at_most_about_the_watchdog_timeout(
    client: LockClient, r: redis.Redis, redis_server: RedisServer
) -> None:
    lock = client.fair_lock("report")
    assert lock.acquire(lease=60)
    kill_once_queued(redis_server.url, WATCHDOG_TIMEOUT, queued(r, lock, 1))
    got: dict[str, float] = {}

    def next_in_line() -> None:
        assert lock.acquire(timeout=HANG)
        got["at"] = time.monotonic()
        lock.release()

    thread = threading.Thread(target=next_in_line)
    thread.start()
    wait_until(queued(r, lock, 2), "the next waiter is queued")
    lock.release()
    released = time.monotonic()
    # The dead head's entry still lives: a newcomer may not jump the queue.
    newcomer = threading.Thread(target=lambda: got.update(barged=lock.acquire(blocking=False)))
    newcomer.start()
    newcomer.join(HANG)
    assert got["barged"] is False
    thread.join(HANG)
    stall = got["at"] - released
    # The head's entry outlives its sleep (<= the watchdog timeout) by 0.5 s;
    # the bound is generous for a loaded machine.
    assert stall < 2 * WATCHDOG_TIMEOUT + 2
    assert r.zcard(queue_of(lock)) == 0


def test_a_non_blocking_attempt_never_queues(client: LockClient, r: redis.Redis) -> None:
    lock = client.fair_lock("report")
    holder = threading.Thread(target=lambda: lock.acquire(lease=60))
    holder.start()
    holder.join(HANG)
    assert lock.acquire(blocking=False) is False
    assert lock.acquire(timeout=0) is False
    assert r.exists(queue_of(lock)) == 0
    with pytest.raises(LockTimeout), client.fair_lock("report", blocking=False):
        pass


def test_the_rlock_api_holds(client: LockClient, r: redis.Redis) -> None:
    lock = client.fair_lock("api")
    with lock as held:
        assert isinstance(held, FairLock)
        first = lock.token
        assert first is not None
        with lock:  # re-entry keeps the token
            assert lock.hold_count() == 2
            assert lock.token == first
        assert lock.owned()
        assert lock.locked()
        time.sleep(WATCHDOG_TIMEOUT * 1.5)  # the watchdog keeps it alive
        assert not lock.lost
        assert lock.ttl() is not None
    assert not lock.locked()
    assert lock.acquire(lease=0.3)
    second = lock.token
    assert second is not None and second > first
    ttl = lock.ttl()
    assert ttl is not None and ttl <= 0.3
    lost = threading.Event()
    lock.on_lost(lambda _lock: lost.set())
    wait_until(lambda: not lock.locked(), "the lease ran out")
    assert lock.lost
    wait_until(lost.is_set, "on_lost was called")
    assert lock.acquire()  # a new grant (the lapsed hold is the owner's own)
    assert lock.token is not None and lock.token > second
    lock.release()


def test_a_fair_lock_and_a_plain_lock_of_one_name_are_two_locks(client: LockClient) -> None:
    fair, plain = client.fair_lock("same"), client.lock("same")
    assert fair.acquire(blocking=False)
    outcome: list[bool] = []
    other = threading.Thread(target=lambda: outcome.append(plain.acquire(blocking=False)))
    other.start()
    other.join(HANG)
    assert outcome == [True]
    assert fair.keys.hash != plain.keys.hash
    fair.release()


def test_min_replicas_is_refused_clearly(redis_url: str) -> None:
    with (
        LockClient(redis_url, key_prefix="fair", min_replicas=1) as replicated,
        pytest.raises(ValueError, match="min_replicas"),
    ):
        replicated.fair_lock("x")


def test_a_cancelled_async_waiter_leaves_the_queue(redis_url: str, r: redis.Redis) -> None:
    async def main() -> None:
        async with AsyncLockClient(
            redis_url, key_prefix="fair", watchdog_timeout=WATCHDOG_TIMEOUT
        ) as aclient:
            lock = aclient.fair_lock("cancel")
            assert await lock.acquire(lease=60)
            waiter = asyncio.create_task(acquire_in_task(lock))
            async with asyncio.timeout(HANG):
                while r.zcard(queue_of(lock)) != 1:
                    await asyncio.sleep(0.01)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            await aclient.settle()
            assert r.zcard(queue_of(lock)) == 0
            await lock.release()

    asyncio.run(main())


def test_threads_and_tasks_wait_in_one_queue(
    long_client: LockClient, redis_url: str, r: redis.Redis
) -> None:
    lock = long_client.fair_lock("mixed")
    assert lock.acquire(lease=60)
    history: list[str] = []
    loop = asyncio.new_event_loop()
    looper = threading.Thread(target=loop.run_forever, daemon=True)
    looper.start()

    async def make_client() -> AsyncLockClient:
        return AsyncLockClient(redis_url, key_prefix="fair", watchdog_timeout=ORDER_WATCHDOG)

    aclient = asyncio.run_coroutine_threadsafe(make_client(), loop).result(HANG)

    async def task_waiter(label: str, timeout: float) -> None:
        alock = aclient.fair_lock("mixed")
        assert await alock.acquire(timeout=timeout)
        history.append(label)
        await alock.release()

    def thread_waiter(label: str, timeout: float) -> None:
        assert lock.acquire(timeout=timeout)
        history.append(label)
        lock.release()

    pending: list[Any] = []
    for index, kind in enumerate(("task", "thread", "task", "thread")):
        label, timeout = f"{kind}{index}", HANG * 2 - index
        if kind == "task":
            pending.append(asyncio.run_coroutine_threadsafe(task_waiter(label, timeout), loop))
        else:
            thread = threading.Thread(target=thread_waiter, args=(label, timeout))
            thread.start()
            pending.append(thread)
        wait_until(queued(r, lock, index + 1), f"{label} is queued")
    lock.release()
    try:
        for waiter in pending:
            if isinstance(waiter, threading.Thread):
                waiter.join(HANG)
            else:
                waiter.result(HANG)
        assert history == ["task0", "thread1", "task2", "thread3"]
    finally:
        asyncio.run_coroutine_threadsafe(aclient.aclose(), loop).result(HANG)
        loop.call_soon_threadsafe(loop.stop)
        looper.join(HANG)
        loop.close()
