"""The semaphore against real Redis: at most N holders, watchdog permits, dead holders, waking."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import threading
import time
from contextlib import AbstractContextManager

import pytest
import redis

from django_rlock.core import (
    LockClient,
    LockLostError,
    LockNotOwnedError,
    LockTimeout,
)
from django_rlock.core._process.identity import thread_owner
from django_rlock.core._protocol.semaphore import SemaphoreScripts, permit_key
from django_rlock.core.aio import AsyncLockClient, AsyncSemaphore
from tests.children import python_module, read_answer
from tests.owners import acquire_in_task
from tests.threads import run_to_end
from tests.waking import seconds_to_wake

#: A generous bound for what should take milliseconds: far below the 30 s a
#: waiter would sleep if nobody woke it (the default watchdog timeout).
PROMPT = 5.0


def holder_process(
    url: str, name: str, permits: int, take: int, watchdog_timeout: float
) -> AbstractContextManager[subprocess.Popen[str]]:
    """A ``tests.sync.semaphore_holder`` process taking ``take`` permits of ``name``."""
    args = [url, name, str(permits), str(take), str(watchdog_timeout)]
    return python_module("tests.sync.semaphore_holder", *args)


def read_held(process: subprocess.Popen[str]) -> int:
    held: int = read_answer(process)["held"]
    return held


def wait_until(predicate: object, timeout: float) -> float:
    """Seconds until ``predicate()`` held (fails the test after ``timeout``)."""
    started = time.monotonic()
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() - started < timeout, "the condition never held"
        time.sleep(0.02)
    return time.monotonic() - started


# -- arguments -------------------------------------------------------------------------


@pytest.mark.parametrize("permits", [0, -1, 1.5, True, "3", None])
def test_permits_must_be_an_int_of_at_least_one(lock_client: LockClient, permits: object) -> None:
    with pytest.raises(ValueError, match="permits must be an int >= 1"):
        lock_client.semaphore("x", permits)  # type: ignore[arg-type]


def test_min_replicas_is_refused_clearly(redis_url: str) -> None:
    with (
        LockClient(redis_url, min_replicas=1) as client,
        pytest.raises(ValueError, match="semaphores do not support min_replicas"),
    ):
        client.semaphore("x", 2)


def test_a_semaphore_and_a_lock_of_one_name_are_apart_but_in_one_slot(
    lock_client: LockClient, r: redis.Redis
) -> None:
    lock = lock_client.lock("shared")
    semaphore = lock_client.semaphore("shared", 1)
    assert lock.acquire()
    assert semaphore.acquire(blocking=False)
    keys = {key.decode() if isinstance(key, bytes) else key for key in r.keys("test:*")}
    assert "test:{shared}" in keys
    assert "test:{shared}:sem" in keys
    assert permit_key(semaphore.keys, thread_owner()) in keys
    assert all(key.startswith("test:{shared}") for key in keys)
    semaphore.release()
    lock.release()


# -- counting --------------------------------------------------------------------------


def test_at_most_n_threads_hold_a_permit_at_once(lock_client: LockClient) -> None:
    semaphore = lock_client.semaphore("pool", 3)
    inside = 0
    most = 0
    mutex = threading.Lock()
    done: list[bool] = []

    def work() -> None:
        nonlocal inside, most
        for _ in range(5):
            with semaphore:
                with mutex:
                    inside += 1
                    most = max(most, inside)
                time.sleep(0.01)
                with mutex:
                    inside -= 1
        done.append(True)

    threads = [threading.Thread(target=work) for _ in range(8)]
    run_to_end(threads, 60)
    assert len(done) == 8
    assert most == 3
    assert semaphore.available() == 3


def test_one_thread_may_take_several_permits_and_gives_each_back(
    lock_client: LockClient, r: redis.Redis
) -> None:
    semaphore = lock_client.semaphore("pool", 2)
    assert semaphore.available() == 2 and not semaphore.locked()
    assert semaphore.acquire() and semaphore.acquire()
    assert semaphore.hold_count() == 2 and semaphore.owned()
    assert semaphore.available() == 0 and semaphore.locked()
    assert not semaphore.acquire(blocking=False)
    semaphore.release()
    assert semaphore.hold_count() == 1 and semaphore.available() == 1
    semaphore.release()
    assert semaphore.hold_count() == 0 and not semaphore.owned()
    with pytest.raises(LockNotOwnedError):
        semaphore.release()
    # Nothing is left but the request latches (they expire on their own).
    assert [key for key in r.keys("test:*") if b":req:" not in key] == []


def test_a_full_semaphore_times_out_and_with_raises_lock_timeout(
    lock_client: LockClient,
) -> None:
    semaphore = lock_client.semaphore("full", 1)
    holder = threading.Thread(target=semaphore.acquire)
    holder.start()
    holder.join(10)
    assert semaphore.available() == 0
    started = time.monotonic()
    assert not semaphore.acquire(timeout=0.3)
    assert time.monotonic() - started >= 0.3
    assert not semaphore.acquire(blocking=False)
    with (
        pytest.raises(LockTimeout, match=r"semaphore 'full' \(permits=1\)"),
        lock_client.semaphore("full", 1, timeout=0.1),
    ):
        pass
    assert semaphore.force_release()
    assert semaphore.available() == 1


def test_each_caller_counts_against_its_own_permits(lock_client: LockClient) -> None:
    narrow = lock_client.semaphore("mixed", 1)
    wide = lock_client.semaphore("mixed", 3)
    assert narrow.acquire(blocking=False)
    assert not narrow.acquire(blocking=False)  # 1 held: the narrow one's limit
    assert wide.acquire(blocking=False) and wide.acquire(blocking=False)
    assert not wide.acquire(blocking=False)  # 3 held
    assert wide.available() == 0 and narrow.available() == 0
    for _ in range(3):
        wide.release()


# -- waking ----------------------------------------------------------------------------


def test_a_release_wakes_a_waiter_at_once(lock_client: LockClient) -> None:
    semaphore = lock_client.semaphore("wake", 1)
    assert semaphore.acquire()  # watchdog: the waiter's bound would be 30 s
    assert seconds_to_wake(semaphore, settle=0.3) < PROMPT


def test_two_permits_freed_at_once_wake_two_waiters(lock_client: LockClient) -> None:
    # Each release wakes one waiter and takes it off the waiting set, so the
    # second release names the second waiter (naming the first again would
    # leave the second asleep until the holder's PTTL, 30 s).
    semaphore = lock_client.semaphore("two", 2)
    assert semaphore.acquire() and semaphore.acquire()
    granted_at: list[float] = []
    entered = threading.Barrier(3)
    both = threading.Barrier(2)

    def waiter() -> None:
        entered.wait(10)
        assert semaphore.acquire(timeout=30)
        granted_at.append(time.monotonic())
        # Keep the permit until the other waiter has one too: it must be woken
        # by the second release, not by this one's.
        with contextlib.suppress(threading.BrokenBarrierError):
            both.wait(PROMPT + 1)
        semaphore.release()

    threads = [threading.Thread(target=waiter) for _ in range(2)]
    for thread in threads:
        thread.start()
    entered.wait(10)
    time.sleep(0.5)  # both registered and asleep
    released_at = time.monotonic()
    semaphore.release()
    semaphore.release()
    for thread in threads:
        thread.join(40)
    assert len(granted_at) == 2
    assert max(granted_at) - released_at < PROMPT


def test_a_waiter_giving_up_passes_the_wake_up_on(lock_client: LockClient, r: redis.Redis) -> None:
    semaphore = lock_client.semaphore("abandon", 1)
    r.zadd(semaphore.keys.waiters, {"other-waiter": time.time() * 1000 + 60_000})
    scripts = lock_client.scripts[SemaphoreScripts]
    call = semaphore._abandon_call("gone")
    # A permit is free and another waiter is registered: it is woken (and leaves the set).
    assert scripts.abandon(keys=call.keys, args=call.args) == 1
    assert r.zcard(semaphore.keys.waiters) == 0
    assert semaphore.acquire()
    r.zadd(semaphore.keys.waiters, {"other-waiter": time.time() * 1000 + 60_000})
    # No permit free: nobody to wake.
    assert scripts.abandon(keys=call.keys, args=call.args) == 0
    semaphore.release()


# -- watchdog, leases and dead holders ---------------------------------------------------


def test_the_watchdog_keeps_permits_alive(redis_url: str, r: redis.Redis) -> None:
    with LockClient(redis_url, key_prefix="test", watchdog_timeout=1) as client:
        semaphore = client.semaphore("renewed", 2)
        assert semaphore.acquire()
        time.sleep(2.5)  # past two and a half timeouts
        assert semaphore.hold_count() == 1
        assert semaphore.available() == 1
        assert not semaphore.lost
        semaphore.release()


def test_a_fixed_lease_permit_expires_and_is_reported_lost(lock_client: LockClient) -> None:
    semaphore = lock_client.semaphore("leased", 1)
    lost = threading.Event()
    semaphore.on_lost(lambda _semaphore: lost.set())
    assert semaphore.acquire(lease=0.3)
    wait_until(lambda: semaphore.available() == 1, PROMPT)
    assert semaphore.lost
    assert lost.wait(PROMPT)
    with pytest.raises(LockLostError, match="semaphore 'leased'"):
        semaphore.release()
    assert semaphore.acquire(blocking=False)  # and the name works again
    assert not semaphore.lost
    semaphore.release()


def test_extend_moves_a_permits_fixed_lease(lock_client: LockClient) -> None:
    semaphore = lock_client.semaphore("extended", 1)
    assert semaphore.acquire(lease=0.5)
    semaphore.extend(5)
    time.sleep(1)
    assert semaphore.hold_count() == 1 and not semaphore.lost
    ttl = semaphore.ttl()
    assert ttl is not None and 3 < ttl <= 5
    semaphore.release()


def test_a_killed_holders_permits_come_back_within_the_watchdog_timeout(
    redis_url: str, r: redis.Redis
) -> None:
    # 2 s, not 1: the child's renewals must ride out a stall of this 2-core VM
    # (stalls of 240 ms were measured while the suite ran; one CI run lost the
    # child's permits at 1 s, its watchdog told of it: "its key expired").
    watchdog_timeout = 2.0
    with (
        LockClient(redis_url, key_prefix="test", watchdog_timeout=watchdog_timeout) as client,
        holder_process(redis_url, "tenant", 3, 2, watchdog_timeout) as process,
    ):
        semaphore = client.semaphore("tenant", 3)
        assert read_held(process) == 2
        time.sleep(2 * watchdog_timeout)  # the child's watchdog keeps them alive
        assert semaphore.available() == 1
        assert semaphore.acquire(blocking=False)
        assert not semaphore.acquire(blocking=False)
        process.kill()
        process.wait(10)
        killed_at = time.monotonic()
        # A waiter gets a permit back once the dead holder's hash expires.
        assert semaphore.acquire(timeout=10)
        assert time.monotonic() - killed_at <= watchdog_timeout + 1.0
        assert semaphore.acquire(blocking=False)  # both of its permits came back
        assert semaphore.hold_count() == 3
        # The dead owner left the index: it names only the live holder.
        assert r.smembers(semaphore.keys.hash) == {thread_owner().encode()}
        for _ in range(3):
            semaphore.release()
    assert not r.exists(semaphore.keys.hash)


def test_the_index_never_holds_more_owners_than_permits(redis_url: str, r: redis.Redis) -> None:
    with LockClient(redis_url, key_prefix="test") as client:
        semaphore = client.semaphore("churn", 2)
        for _ in range(20):
            # Each round, two short-lived owners take a permit and die holding it.
            for _ in range(2):
                thread = threading.Thread(target=lambda: semaphore.acquire(lease=0.05))
                thread.start()
                thread.join(10)
            assert r.scard(semaphore.keys.hash) <= 2
        wait_until(lambda: semaphore.available() == 2, PROMPT)
        assert semaphore.acquire(blocking=False)
        assert r.scard(semaphore.keys.hash) == 1  # the dead were pruned
        semaphore.release()


# -- lost replies ----------------------------------------------------------------------


def test_a_resent_acquire_or_release_is_applied_once(lock_client: LockClient) -> None:
    semaphore = lock_client.semaphore("resent", 3)
    owner = thread_owner()
    scripts = lock_client.scripts[SemaphoreScripts]
    acquire = semaphore._acquire_call(owner, 5.0, "", 0.0)
    first = scripts.acquire(keys=acquire.keys, args=acquire.args)
    again = scripts.acquire(keys=acquire.keys, args=acquire.args)
    assert first[:2] == again[:2] == [0, 1]
    assert semaphore.hold_count() == 1 and semaphore.available() == 2
    release = semaphore._release_call(owner)
    assert scripts.release(keys=release.keys, args=release.args) == 0
    assert scripts.release(keys=release.keys, args=release.args) == 0  # reported, not -1
    assert semaphore.available() == 3


def test_a_busy_acquire_is_not_latched(lock_client: LockClient) -> None:
    # The latch is set only by a grant: a resend of a call that found no
    # permit, after one came free, is a new attempt (granted), never a report.
    semaphore = lock_client.semaphore("busy-latch", 1)
    holder = threading.Thread(target=lambda: semaphore.acquire(lease=0.3))
    holder.start()
    holder.join(10)
    owner = thread_owner()
    scripts = lock_client.scripts[SemaphoreScripts]
    call = semaphore._acquire_call(owner, 5.0, "", 0.0)
    assert isinstance(scripts.acquire(keys=call.keys, args=call.args), int)
    wait_until(lambda: semaphore.available() == 1, PROMPT)
    assert scripts.acquire(keys=call.keys, args=call.args)[:2] == [0, 1]
    assert semaphore.hold_count() == 1


# -- asyncio ---------------------------------------------------------------------------


def test_async_tasks_share_the_permits_with_threads(redis_url: str, r: redis.Redis) -> None:
    sync_client = LockClient(redis_url, key_prefix="test")
    sync_semaphore = sync_client.semaphore("mixed-engines", 3)
    assert sync_semaphore.acquire()

    async def scenario() -> tuple[int, int, bool]:
        async with AsyncLockClient(redis_url, key_prefix="test") as client:
            semaphore = client.semaphore("mixed-engines", 3)
            assert isinstance(semaphore, AsyncSemaphore)
            inside = most = 0

            async def work() -> None:
                nonlocal inside, most
                for _ in range(3):
                    async with semaphore:
                        inside += 1
                        most = max(most, inside)
                        await asyncio.sleep(0.01)
                        inside -= 1

            await asyncio.gather(*(work() for _ in range(6)))
            available = await semaphore.available()

            async def holds_two() -> bool:
                assert await semaphore.acquire() and await semaphore.acquire()
                two = await semaphore.hold_count() == 2 and await semaphore.owned()
                await semaphore.release()
                await semaphore.release()
                return two

            return most, available, await holds_two()

    try:
        most, available, two = asyncio.run(scenario())
    finally:
        sync_semaphore.release()
        sync_client.close()
    assert most == 2  # the sync thread holds the third permit
    assert available == 2
    assert two


def test_a_cancelled_async_waiter_leaves_nothing_behind(redis_url: str, r: redis.Redis) -> None:
    async def scenario() -> None:
        async with AsyncLockClient(redis_url, key_prefix="test") as client:
            semaphore = client.semaphore("cancelled", 1)
            assert await semaphore.acquire()
            waiter = asyncio.ensure_future(acquire_in_task(semaphore))
            await asyncio.sleep(0.3)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            await client.settle()
            assert await semaphore.available() == 0
            await semaphore.release()
            assert await semaphore.available() == 1
            assert client.listener.subscribed_channels() == set()

    asyncio.run(scenario())
    assert r.zcard("test:{cancelled}:sem:waiters") == 0
