"""A fair lock's handoff: the release grants the lock to the queue's head itself.

Against a real redis-server. A message is "lost" here by sending the holder's
release with a publish that reaches nobody (see :func:`release_unheard`), as
when the waiter's pub/sub connection drops at that moment, so the head is
handed the lock without being told.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from django_rlock.core import FairLock, LockClient
from django_rlock.core._process.identity import thread_owner
from django_rlock.core._protocol.fairlock import FairScripts
from django_rlock.core.aio import AsyncFairLock, AsyncLockClient
from tests.owners import acquire_in_task
from tests.servers import RedisServer
from tests.sync.fairqueue import HANG, kill_once_queued, queued, wait_until

#: Long: no watchdog renewal (an EVALSHA) falls inside a test's count.
LONG_WATCHDOG = 60.0

#: Short: a handed grant nobody takes expires within a couple of seconds.
SHORT_WATCHDOG = 1.5


@pytest.fixture
def client(r: redis.Redis, redis_url: str) -> Iterator[LockClient]:
    with LockClient(redis_url, key_prefix="fair", watchdog_timeout=LONG_WATCHDOG) as made:
        yield made


@pytest.fixture
def holder_client(r: redis.Redis, redis_url: str) -> Iterator[LockClient]:
    """The holder's own client: its release may be sent by hand (see ``release_unheard``)."""
    with LockClient(redis_url, key_prefix="fair", watchdog_timeout=LONG_WATCHDOG) as made:
        yield made


def script_calls(r: redis.Redis) -> int:
    """EVALSHA calls the server has run since its stats were reset (not a NOSCRIPT answer)."""
    stats: dict[str, Any] = r.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)) - int(stats.get("failed_calls", 0))


def queue_ids(r: redis.Redis, lock: FairLock | AsyncFairLock) -> list[str]:
    return [text(raw) for raw in r.zrange(lock.fair_keys.queue, 0, -1)]


def handed_to(r: redis.Redis, lock: FairLock | AsyncFairLock) -> str | None:
    mark = r.hget(lock.keys.hash, "~handoff")
    return None if mark is None else text(mark)


def text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def release_unheard(holder_client: LockClient, lock: FairLock) -> None:
    """Release the calling thread's hold, its handoff message heard by nobody.

    The script's publish command is replaced by EXISTS, which takes the same
    arguments and sends nothing (SPUBLISH did this on Redis 7, not on 6.2).
    """
    call = lock._release_call(thread_owner())
    args = list(call.args)
    args[1] = "exists"
    assert holder_client.scripts[FairScripts].release(keys=call.keys, args=args) == 0


def hold(holder_client: LockClient, lease: float | None = None) -> FairLock:
    """The holder's hold of "report", taken on this thread (``lease`` as ``acquire`` takes it)."""
    holder = holder_client.fair_lock("report")
    assert holder.acquire(lease=lease)
    return holder


def sleeps_on_the_channel(r: redis.Redis) -> Callable[[], bool]:
    """Whether the one waiter sleeps on the lock's channel, by the server's script count.

    The holder's acquire, the waiter's first attempt, and its attempt once subscribed.
    """
    return lambda: script_calls(r) == 3


def release_to_sleeping_waiter(
    r: redis.Redis, holder: FairLock, waiter: Callable[[], None], settle: float = 0.05
) -> threading.Thread:
    """Start ``waiter`` on a thread; once it sleeps on the channel, release ``holder``'s hold.

    The script count is reset just before the release (``settle`` seconds after
    the waiter went to sleep), so a test counts what the handoff alone ran.
    """
    thread = threading.Thread(target=waiter)
    thread.start()
    wait_until(sleeps_on_the_channel(r), "the waiter sleeps on the channel")
    time.sleep(settle)
    r.config_resetstat()
    holder.release()
    return thread


async def until(check: Callable[[], bool]) -> None:
    """Poll ``check`` from a task until it holds (bounded by HANG, never the lock's wait)."""
    async with asyncio.timeout(HANG):
        while not check():
            await asyncio.sleep(0.01)


def test_the_woken_head_holds_the_lock_without_an_acquire_call(
    client: LockClient, holder_client: LockClient, r: redis.Redis
) -> None:
    holder = hold(holder_client)
    lock = client.fair_lock("report")
    held = threading.Event()
    done = threading.Event()
    seen: dict[str, Any] = {}

    def waiter() -> None:
        assert lock.acquire(timeout=HANG)
        seen["token"] = lock.token
        held.set()
        done.wait(HANG)
        seen["count"] = lock.hold_count()
        lock.release()

    thread = release_to_sleeping_waiter(r, holder, waiter)
    assert held.wait(HANG)
    assert script_calls(r) == 1  # the release, and nothing else
    assert seen["token"] == int(r.get(lock.keys.fence) or 0)
    done.set()
    thread.join(HANG)
    assert seen["count"] == 1
    assert not lock.locked()
    assert r.exists(lock.fair_keys.queue, lock.fair_keys.entries, lock.keys.waiters) == 0


def test_a_lost_message_is_confirmed_by_the_next_attempt_as_one_grant(
    redis_url: str, holder_client: LockClient, r: redis.Redis
) -> None:
    holder = hold(holder_client, lease=60)
    with LockClient(redis_url, key_prefix="fair", watchdog_timeout=SHORT_WATCHDOG) as client:
        lock = client.fair_lock("report")
        seen: dict[str, Any] = {}

        def waiter() -> None:
            assert lock.acquire(timeout=HANG)
            seen["token"] = lock.token
            seen["count"] = lock.hold_count()
            lock.release()
            seen["locked"] = lock.locked()

        thread = threading.Thread(target=waiter)
        thread.start()
        wait_until(queued(r, lock, 1), "the waiter is queued")
        head = queue_ids(r, lock)[0]
        release_unheard(holder_client, holder)
        assert handed_to(r, lock) == head
        handed_token = int(r.get(lock.keys.fence) or 0)
        assert handed_token > 0
        # The waiter sleeps out its bound (the watchdog timeout) before it
        # retries; the handed grant must still be there when it does, its
        # fencing counter too (they expire together; under load the counter
        # alone ran out once, and the confirmation then reported token 0).
        r.pexpire(lock.keys.hash, 30_000)
        r.pexpire(lock.keys.fence, 30_000)
        thread.join(HANG)
    assert seen == {"token": handed_token, "count": 1, "locked": False}


def test_a_waiter_giving_up_as_it_is_handed_the_lock_hands_it_on(
    client: LockClient, holder_client: LockClient, r: redis.Redis
) -> None:
    """The quitter's 1 s runs out while the lock is handed to it (unheard): the patient gets it.

    On a loaded machine the quitter may find the lock handed to it before its
    time is up, and take it: a plain hand-over, not the case under test. Then
    it gives the lock back and the case is set up again (at most three times):
    the measurement is retried, never the assertion.
    """
    for _ in range(3):
        holder = hold(holder_client, lease=60)
        lock = client.fair_lock("report")
        outcomes: dict[str, Any] = {}

        def quitter() -> None:
            outcomes["quitter"] = lock.acquire(timeout=1.0)  # noqa: B023 -- joined below
            if outcomes["quitter"]:  # noqa: B023
                lock.release()  # noqa: B023 -- granted in time: not the case under test

        def patient() -> None:
            outcomes["patient"] = lock.acquire(timeout=HANG)  # noqa: B023
            outcomes["count"] = lock.hold_count()  # noqa: B023
            lock.release()  # noqa: B023

        first = threading.Thread(target=quitter)
        first.start()
        wait_until(queued(r, lock, 1), "the quitter is queued")
        second = threading.Thread(target=patient)
        second.start()
        wait_until(queued(r, lock, 2), "the patient waiter is queued")
        quitter_id = queue_ids(r, lock)[0]
        release_unheard(holder_client, holder)
        assert handed_to(r, lock) == quitter_id
        first.join(HANG)
        second.join(HANG)
        assert not first.is_alive() and not second.is_alive()
        assert outcomes["patient"] is True and outcomes["count"] == 1
        assert not lock.locked()
        assert r.exists(lock.fair_keys.queue, lock.fair_keys.entries, lock.keys.waiters) == 0
        if outcomes["quitter"] is False:
            return  # the case under test came up, and the patient got the lock
    pytest.fail("the quitter took the lock in time at each of three tries: the case never came up")


def test_a_cancelled_task_handed_the_lock_gives_it_to_the_next_waiter(
    redis_url: str, holder_client: LockClient, r: redis.Redis
) -> None:
    holder = hold(holder_client, lease=60)

    async def main() -> dict[str, Any]:
        async with AsyncLockClient(
            redis_url, key_prefix="fair", watchdog_timeout=LONG_WATCHDOG
        ) as aclient:
            lock = aclient.fair_lock("report")
            outcome: dict[str, Any] = {}

            async def patient() -> None:
                outcome["patient"] = await lock.acquire(timeout=HANG)
                outcome["count"] = await lock.hold_count()
                await lock.release()

            cancelled = asyncio.create_task(acquire_in_task(lock))
            await until(queued(r, lock, 1))
            second = asyncio.create_task(patient())
            await until(queued(r, lock, 2))
            head = queue_ids(r, lock)[0]
            # asyncio.run runs on this thread: the holder's owner (a blocking call is fine here).
            release_unheard(holder_client, holder)
            outcome["handed"] = handed_to(r, lock) == head
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            async with asyncio.timeout(HANG):
                await second
            await aclient.settle()
            outcome["locked"] = await lock.locked()
            return outcome

    outcome = asyncio.run(main())
    assert outcome == {"handed": True, "patient": True, "count": 1, "locked": False}


def test_a_killed_head_that_was_handed_the_lock_stalls_the_queue_about_the_watchdog_timeout(
    redis_url: str, holder_client: LockClient, r: redis.Redis, redis_server: RedisServer
) -> None:
    holder = hold(holder_client, lease=60)
    with LockClient(redis_url, key_prefix="fair", watchdog_timeout=SHORT_WATCHDOG) as client:
        lock = client.fair_lock("report")
        kill_once_queued(redis_server.url, SHORT_WATCHDOG, queued(r, lock, 1))
        dead = queue_ids(r, lock)[0]
        got: dict[str, float] = {}

        def next_in_line() -> None:
            assert lock.acquire(timeout=HANG)
            got["at"] = time.monotonic()
            got["count"] = lock.hold_count()
            lock.release()

        thread = threading.Thread(target=next_in_line)
        thread.start()
        wait_until(queued(r, lock, 2), "the next waiter is queued")
        holder.release()
        released = time.monotonic()
        assert handed_to(r, lock) == dead  # its entry was live: it was handed the lock
        thread.join(HANG)
    # The handed grant lives the watchdog timeout; the bound is generous for a loaded machine.
    assert got["at"] - released < 2 * SHORT_WATCHDOG + 2
    assert got["count"] == 1
    assert r.exists(lock.keys.hash, lock.fair_keys.queue) == 0


def test_a_waiter_with_a_fixed_lease_gets_its_own_lease(
    client: LockClient, holder_client: LockClient, r: redis.Redis
) -> None:
    holder = hold(holder_client)
    lock = client.fair_lock("report")
    held = threading.Event()
    done = threading.Event()
    seen: dict[str, Any] = {}

    def waiter() -> None:
        assert lock.acquire(timeout=HANG, lease=5)
        seen["ttl"] = lock.ttl()
        seen["count"] = lock.hold_count()
        seen["token"] = lock.token
        held.set()
        done.wait(HANG)
        lock.release()

    thread = release_to_sleeping_waiter(r, holder, waiter)
    assert held.wait(HANG)
    assert script_calls(r) == 2  # the release, and the waiter's confirmation
    assert seen["ttl"] is not None and 4 < seen["ttl"] <= 5  # its lease, not the watchdog's
    assert seen["count"] == 1
    assert seen["token"] == int(r.get(lock.keys.fence) or 0)
    assert handed_to(r, lock) is None  # the confirmation cleared the mark
    done.set()
    thread.join(HANG)
    assert not lock.locked()


def test_an_async_head_holds_the_lock_without_an_acquire_call(
    redis_url: str, holder_client: LockClient, r: redis.Redis
) -> None:
    holder = hold(holder_client)

    async def main() -> dict[str, Any]:
        async with AsyncLockClient(
            redis_url, key_prefix="fair", watchdog_timeout=LONG_WATCHDOG
        ) as aclient:
            lock = aclient.fair_lock("report")
            outcome: dict[str, Any] = {}

            async def waiter() -> None:
                assert await lock.acquire(timeout=HANG)
                outcome["calls"] = script_calls(r)
                outcome["token"] = lock.token
                outcome["count"] = await lock.hold_count()
                await lock.release()

            task = asyncio.create_task(waiter())
            await until(sleeps_on_the_channel(r))
            await asyncio.sleep(0.05)
            r.config_resetstat()
            holder.release()  # this thread's hold (asyncio.run runs on it)
            async with asyncio.timeout(HANG):
                await task
            outcome["locked"] = await lock.locked()
            return outcome

    outcome = asyncio.run(main())
    assert outcome["calls"] == 1  # the release, and nothing else
    assert outcome["count"] == 1
    assert outcome["locked"] is False
    assert outcome["token"] is not None


def test_the_watchdog_renews_a_handed_grant(
    redis_url: str, holder_client: LockClient, r: redis.Redis
) -> None:
    holder = hold(holder_client)
    with LockClient(redis_url, key_prefix="fair", watchdog_timeout=SHORT_WATCHDOG) as client:
        lock = client.fair_lock("report")
        held = threading.Event()
        seen: dict[str, Any] = {}

        def waiter() -> None:
            assert lock.acquire(timeout=HANG)
            seen["calls"] = script_calls(r)
            held.set()
            time.sleep(2 * SHORT_WATCHDOG)  # past the handed grant's first life
            seen["lost"] = lock.lost
            seen["count"] = lock.hold_count()
            lock.release()

        # Released at once: the waiter's last attempt is recent enough to take the grant as handed.
        thread = release_to_sleeping_waiter(r, holder, waiter, settle=0)
        assert held.wait(HANG)
        thread.join(HANG)
    assert seen == {"calls": 1, "lost": False, "count": 1}
    assert r.exists(lock.keys.hash) == 0


def test_a_message_that_names_another_attempt_only_wakes_the_waiter(
    client: LockClient, holder_client: LockClient, r: redis.Redis
) -> None:
    holder = hold(holder_client)
    lock = client.fair_lock("report")
    acquired = threading.Event()

    def waiter() -> None:
        assert lock.acquire(timeout=HANG)
        acquired.set()
        lock.release()

    thread = threading.Thread(target=waiter)
    thread.start()
    wait_until(sleeps_on_the_channel(r), "the waiter sleeps on the channel")
    head = queue_ids(r, lock)[0]
    # A handoff message of an older attempt (or a forged one): not a grant.
    for message in (f"{head} 123 not-its-request", f"{head} 123 1", f"{head} garbage"):
        r.publish(lock.keys.channel, message)
    wait_until(lambda: script_calls(r) >= 4, "the waiter retried")
    assert not acquired.wait(0.3)
    assert holder.owned()  # still the holder's
    holder.release()
    assert acquired.wait(HANG)
    thread.join(HANG)
    assert not lock.locked()
