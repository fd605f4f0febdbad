"""The engine's leak rules (core/leaks.py), on a bare LockClient: no Django.

The watchdog never renews a hold whose owner thread has ended, nor one past
its ``max_hold``; a thread's leaked hold is given back (``release_leaked``,
the default) or only left to expire; an asyncio task's as the task finishes.
"""

from __future__ import annotations

import asyncio
import threading
import time

import redis

from django_rlock.core import LockClient
from django_rlock.core._process import leaks
from django_rlock.core._protocol.holds import Hold
from django_rlock.core.aio import AsyncLockClient

HANG = 20.0
TIMEOUT = 1.5  # the watchdog timeout: ticks every 0.5 s


def test_a_thread_that_ended_holding_is_not_renewed_and_is_given_back(
    redis_url: str, r: redis.Redis
) -> None:
    with LockClient(redis_url, watchdog_timeout=TIMEOUT) as client:
        leaks: list[tuple[Hold, str]] = []
        client.holds.on_leaked(lambda hold, reason: leaks.append((hold, reason)))
        lock = client.lock("orphan")
        thread = threading.Thread(target=lock.acquire)
        thread.start()
        thread.join(HANG)
        assert r.exists(lock.keys.hash)
        # Not kept alive for ever: given back at the watchdog's next tick.
        deadline = time.monotonic() + HANG
        while r.exists(lock.keys.hash) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not r.exists(lock.keys.hash)
        assert [hold.name for hold, _ in leaks] == ["orphan"]


def test_without_release_leaked_the_hold_expires_unrenewed(redis_url: str, r: redis.Redis) -> None:
    with LockClient(redis_url, watchdog_timeout=TIMEOUT) as client:
        client.holds.release_leaked = False
        lock = client.lock("left")
        thread = threading.Thread(target=lock.acquire)
        thread.start()
        thread.join(HANG)
        started = time.monotonic()
        deadline = started + HANG
        while r.exists(lock.keys.hash) and time.monotonic() < deadline:
            time.sleep(0.05)
        # Gone by expiry: not before the first tick found it, not after one timeout.
        assert not r.exists(lock.keys.hash)
        assert time.monotonic() - started <= TIMEOUT + 0.5


def test_a_live_holder_past_max_hold_loses_its_hold(redis_url: str, r: redis.Redis) -> None:
    with LockClient(redis_url, watchdog_timeout=TIMEOUT) as client:
        lock = client.lock("bounded", max_hold=0.6)
        unbounded = client.lock("unbounded")
        lock.acquire()
        unbounded.acquire()
        deadline = time.monotonic() + HANG
        while not lock.lost and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lock.lost
        assert not unbounded.lost  # the bound is per lock
        # Not renewed any more: the key expires by itself.
        while r.exists(lock.keys.hash) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not r.exists(lock.keys.hash)
        assert r.exists(unbounded.keys.hash)
        unbounded.release()


def test_an_asyncio_task_that_finished_holding_gives_it_back(redis_url: str) -> None:
    async def main() -> None:
        async with AsyncLockClient(redis_url, watchdog_timeout=TIMEOUT) as client:
            lock = client.lock("task-orphan")

            async def take() -> None:
                await lock.acquire()  # called in the task: the task owns the hold

            await asyncio.create_task(take())
            # The task's end runs its hooks after this wake-up: one loop turn.
            await asyncio.sleep(0)
            await client.settle()  # the release started as the task ended
            assert not await lock.locked()

    asyncio.run(main())


def test_a_lease_hold_left_by_its_thread_runs_to_its_lease(redis_url: str, r: redis.Redis) -> None:
    # Taking a lease and leaving it is a way to do something at most once per
    # lease: not a leak, never given back early.
    with LockClient(redis_url, watchdog_timeout=TIMEOUT) as client:
        leaks: list[Hold] = []
        client.holds.on_leaked(lambda hold, _: leaks.append(hold))
        watched = client.lock("watched")  # keeps the watchdog ticking meanwhile
        watched.acquire()
        lock = client.lock("throttle")
        thread = threading.Thread(target=lambda: lock.acquire(lease=3.0))
        thread.start()
        thread.join(HANG)
        time.sleep(2 * TIMEOUT / 3 + 0.5)  # two ticks and more
        assert r.exists(lock.keys.hash)
        assert leaks == []
        watched.release()


def test_a_unit_of_works_kept_hold_is_not_reentered_by_the_next(redis_url: str) -> None:
    # A worker thread serves one request or task after another under one owner
    # id: what one left must not pass to the next as a re-entry.
    with LockClient(redis_url, watchdog_timeout=TIMEOUT) as client:
        client.holds.release_leaked = False  # reported only: it stays on the server
        lock = client.lock("kept")
        seen: list[bool] = []

        def serve_two_units_of_work() -> None:
            # A thread of its own, as a worker's: no older hold of other tests.
            leaks.work_started()
            assert lock.acquire()
            leaks.work_ended("request")
            seen.append(lock.locked())  # left to expire, not given back...
            seen.append(lock.acquire(blocking=False))  # ...and not this thread's any more
            seen.append(lock.acquire(timeout=2 * TIMEOUT))  # free once it expired, unrenewed
            lock.release()

        worker = threading.Thread(target=serve_two_units_of_work)
        worker.start()
        worker.join(HANG)
        assert seen == [True, False, True]


def test_holds_taken_before_the_unit_of_work_are_not_its(redis_url: str) -> None:
    with LockClient(redis_url, watchdog_timeout=TIMEOUT) as client:
        outer = client.lock("outer")
        assert outer.acquire()
        leaks.work_started()
        inner = client.lock("inner")
        assert inner.acquire()
        leaks.work_ended("task run")
        assert outer.owned() and not inner.locked()
        outer.release()
