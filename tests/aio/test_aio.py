"""The asyncio engine against real Redis: exclusion, task ownership, cancellation, loop lag."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis

from django_rlock.core import LockClient, LockLostError, LockNotOwnedError, LockTimeout
from django_rlock.core.aio import AsyncLockClient, AsyncRLock
from tests.lockhash import owner_counts
from tests.owners import acquire_in_task, release_in_task
from tests.servers import RedisServer


def run(url: str, scenario: Callable[[AsyncLockClient], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with AsyncLockClient(url, key_prefix="test") as client:
            return await scenario(client)

    return asyncio.run(main())


def assert_clean(r: redis.Redis, name: str) -> None:
    """No hold, no waiting registration, no subscription left for ``name``."""
    assert not r.exists(f"test:{{{name}}}")
    assert not r.exists(f"test:{{{name}}}:waiters")
    deadline = time.monotonic() + 5
    while r.pubsub_numsub(f"test:{{{name}}}:released")[0][1]:
        assert time.monotonic() < deadline, "a subscription was left behind"
        time.sleep(0.01)


def test_two_hundred_tasks_update_a_counter_exactly(redis_url: str, r: redis.Redis) -> None:
    raw_url = redis_url

    async def scenario(client: AsyncLockClient) -> None:
        counter = redis.asyncio.Redis.from_url(raw_url)
        lock = client.lock("counter")

        async def work() -> None:
            for _ in range(5):
                async with lock:
                    value = int(await counter.get("count") or 0)  # read-modify-write
                    await counter.set("count", value + 1)

        await asyncio.gather(*(work() for _ in range(200)))
        await counter.aclose()
        assert client.listener.subscribed_channels() == set()

    run(redis_url, scenario)
    assert int(r.get("count") or 0) == 1000
    assert_clean(r, "counter")


def test_tasks_on_one_loop_are_separate_owners_and_reenter(redis_url: str, r: redis.Redis) -> None:
    async def scenario(client: AsyncLockClient) -> None:
        lock = client.lock("tasks")
        async with lock:
            async with lock:
                assert await lock.hold_count() == 2
                assert await lock.owned()
                token = lock.token

                async def other() -> bool:
                    return await lock.acquire(blocking=False)

                assert list(await asyncio.gather(other(), other())) == [False, False]
                with pytest.raises(LockNotOwnedError):
                    await asyncio.create_task(release_in_task(lock))
            assert lock.token == token
        assert not await lock.owned()
        assert lock.token is None
        assert not await lock.locked()

    run(redis_url, scenario)
    assert_clean(r, "tasks")


def test_a_sync_thread_and_an_async_task_exclude_each_other(redis_url: str, r: redis.Redis) -> None:
    holder_has_it, let_go = threading.Event(), threading.Event()

    def sync_holder() -> None:
        with LockClient(redis_url, key_prefix="test") as client, client.lock("mixed"):
            holder_has_it.set()
            let_go.wait(10)

    thread = threading.Thread(target=sync_holder)
    thread.start()
    assert holder_has_it.wait(5)

    async def scenario(client: AsyncLockClient) -> float:
        lock = client.lock("mixed")
        assert not await lock.acquire(blocking=False)
        threading.Timer(0.2, let_go.set).start()
        started = time.monotonic()
        assert await lock.acquire(timeout=10)
        waited = time.monotonic() - started
        sync_token = 1
        assert lock.token is not None
        assert lock.token > sync_token
        await lock.release()
        return waited

    waited = run(redis_url, scenario)
    thread.join(10)
    assert 0.1 < waited < 5  # woken by the sync holder's release, not by its 30 s lease
    assert_clean(r, "mixed")


def test_async_with_raises_lock_timeout_and_a_lease_expires(redis_url: str, r: redis.Redis) -> None:
    async def scenario(client: AsyncLockClient) -> None:
        lock = client.lock("leased")
        # A lease long enough to outlive the contender's timeout and the TTL query
        # that follows it on a loaded machine, short enough to wait out.
        assert await lock.acquire(lease=1.0)

        async def contender() -> None:
            async with client.lock("leased", timeout=0.05):
                pass

        with pytest.raises(LockTimeout) as caught:
            await asyncio.create_task(contender())
        assert caught.value.retry_after is not None
        await asyncio.sleep(1.3)
        assert lock.lost
        assert not await lock.owned()
        with pytest.raises(LockLostError):
            await lock.release()
        assert lock.lost
        assert await lock.acquire(blocking=False)
        assert not lock.lost  # a new grant clears it for this task
        await lock.release()

    run(redis_url, scenario)
    assert_clean(r, "leased")


@pytest.mark.parametrize("steps", range(0, 14, 1))
def test_cancelling_a_waiting_acquire_at_any_point_leaves_nothing(
    redis_url: str, r: redis.Redis, steps: int
) -> None:
    async def scenario(client: AsyncLockClient) -> None:
        lock = client.lock("cancel-wait")
        assert await lock.acquire()
        waiter = asyncio.create_task(acquire_in_task(lock, timeout=10))
        for _ in range(steps):
            await asyncio.sleep(0)
        await asyncio.sleep(0.001 * steps)  # reach the awaits that wait on the network
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await client.settle()
        assert len(owner_counts(r, "test:{cancel-wait}")) == 1  # only the holder
        assert await lock.hold_count() == 1
        await lock.release()

    run(redis_url, scenario)
    assert_clean(r, "cancel-wait")


@pytest.mark.parametrize("steps", range(0, 8))
def test_cancelling_a_granted_acquire_at_any_point_gives_the_grant_back(
    redis_url: str, r: redis.Redis, steps: int
) -> None:
    async def scenario(client: AsyncLockClient) -> None:
        lock = client.lock("cancel-grant")
        attempt = asyncio.create_task(acquire_in_task(lock))
        for _ in range(steps):
            await asyncio.sleep(0)
        attempt.cancel()
        try:
            await attempt
        except asyncio.CancelledError:
            pass
        else:
            await asyncio.create_task(_release_from_task(lock, attempt))
        await client.settle()

    run(redis_url, scenario)
    assert_clean(r, "cancel-grant")


async def _release_from_task(lock: Any, finished: asyncio.Task[Any]) -> None:
    # The acquire finished before the cancel landed: its task owns the hold, and
    # a finished task cannot release, so force it (what an operator would do).
    await lock.force_release()


@pytest.mark.parametrize("steps", range(0, 8))
def test_cancelling_a_release_still_releases(redis_url: str, r: redis.Redis, steps: int) -> None:
    async def scenario(client: AsyncLockClient) -> None:
        lock = client.lock("cancel-release")
        acquired = asyncio.Event()

        async def hold_then_release() -> None:
            await lock.acquire()
            acquired.set()
            await lock.release()  # the cancellation lands inside (or after) this await

        task = asyncio.create_task(hold_then_release())
        await acquired.wait()
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.settle()
        assert not await lock.locked()

    run(redis_url, scenario)
    assert_clean(r, "cancel-release")


def test_cancellation_inside_async_with_releases(redis_url: str, r: redis.Redis) -> None:
    async def scenario(client: AsyncLockClient) -> None:
        lock = client.lock("cancel-body")
        entered = asyncio.Event()

        async def body() -> None:
            async with lock:
                entered.set()
                await asyncio.sleep(30)

        task = asyncio.create_task(body())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await client.settle()
        assert not await lock.locked()

    run(redis_url, scenario)
    assert_clean(r, "cancel-body")


def test_the_library_does_not_block_the_event_loop(redis_url: str, r: redis.Redis) -> None:
    async def scenario(client: AsyncLockClient) -> list[float]:
        lock = client.lock("lag")
        lags: list[float] = []
        running = True

        async def ticker() -> None:
            while running:
                before = time.monotonic()
                await asyncio.sleep(0.001)
                lags.append(time.monotonic() - before - 0.001)

        async def work() -> None:
            for _ in range(100):
                async with lock:
                    await asyncio.sleep(0)

        tick = asyncio.create_task(ticker())
        await asyncio.gather(*(work() for _ in range(10)))  # 1,000 contended acquisitions
        running = False
        await tick
        return lags

    lags = run(redis_url, scenario)
    assert len(lags) > 50
    # Scheduling noise on a shared, loaded machine shows in single ticks (p99 went
    # to 8 ms under load), so it is not what this checks; a library that blocked
    # the loop (a synchronous round trip or wait per acquisition) would show in
    # the typical tick, 1,000 times.
    assert statistics.median(lags) < 0.005, f"median lag {statistics.median(lags) * 1000:.1f} ms"
    assert_clean(r, "lag")


def test_aclose_closes_every_connection_the_client_opened(
    redis_server: RedisServer, r: redis.Redis
) -> None:
    """A URL-built client's pools are its own: closing it leaves no connection open.

    (redis-py closes a pool it was *given* only when asked to.)
    """

    def others() -> int:
        return len(r.client_list()) - 1  # every connection but this test's own

    async def main() -> None:
        client = AsyncLockClient(redis_server.url, key_prefix="test", watchdog_timeout=3)
        locks = [client.lock("closing") for _ in range(3)]

        async def hold(lock: AsyncRLock) -> None:
            async with lock:
                await asyncio.sleep(0.05)

        await asyncio.gather(*(hold(lock) for lock in locks))  # several connections at once
        assert others() >= 2
        await client.aclose()

    before = others()
    asyncio.run(main())
    deadline = time.monotonic() + 5
    while others() > before:
        assert time.monotonic() < deadline, f"{others() - before} connections left open"
        time.sleep(0.02)


@pytest.mark.parametrize("steps", range(8))
def test_a_release_cancelled_in_flight_never_undoes_the_tasks_next_grant(
    redis_url: str, steps: int
) -> None:
    # Found by review: a background resend of the cancelled release, reaching
    # Redis after the task's next acquire, released that new grant while the
    # task still believed it held the lock (a rival then got it too).
    seen: dict[str, object] = {}
    # The cancellation is meant for the release or the acquire after it; a
    # later step count finds the task past both (tests/aio/test_aio_cancellation.py
    # cancels at every point of longer sequences).
    in_calls = True

    async def scenario() -> None:
        async with AsyncLockClient(redis_url, key_prefix="test") as client:
            lock = client.lock("undone")
            inside = asyncio.Event()

            async def holder() -> None:
                nonlocal in_calls
                await lock.acquire()
                inside.set()
                current = asyncio.current_task()
                assert current is not None
                try:
                    await lock.release()
                except asyncio.CancelledError:
                    current.uncancel()  # the task goes on, as code under asyncio.timeout does
                try:
                    acquired = await lock.acquire(timeout=5)
                except asyncio.CancelledError:  # the cancel landed here instead
                    current.uncancel()
                    acquired = await lock.acquire(timeout=5)
                assert acquired
                in_calls = False
                await client.settle()  # whatever the cancelled release left has run
                rival = client.engine.lock("undone")  # another owner
                seen["believes"] = lock.token is not None and not lock.lost
                seen["rival"] = rival.acquire(blocking=False)
                if seen["rival"]:
                    rival.release()
                with contextlib.suppress(LockLostError):
                    await lock.release()

            task = asyncio.ensure_future(holder())
            await inside.wait()
            for _ in range(steps):
                await asyncio.sleep(0)
            if in_calls:
                task.cancel()
            await task
            await client.settle()

    asyncio.run(scenario())
    assert not (seen["believes"] and seen["rival"]), seen
