"""Ownership is explicit: a hold ends when its owner or its scope provably ends, never on a guess.

Each test is a pattern users write in which the library used to give a hold
back while its owner still relied on it (a rival got in, and the owner's
release then failed): the main thread returning while its workers run,
``asyncio.wait_for`` / ``shield`` / ``gather`` / ``TaskGroup`` around
``acquire()``, a lease given to the lock, a lease hold re-entered. And the
other side: what does end a scope (a unit of work announced by its
framework) ends the holds taken in it, on every thread its code ran on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import redis

from django_rlock.core import LockClient, LockNotOwnedError
from django_rlock.core._process import leaks
from django_rlock.core.aio import AsyncLockClient

#: Watchdog timeout (s): the watchdog ticks every third of it, so a hold
#: wrongly found ownerless would be released within ~0.5 s.
TIMEOUT = 1.5
HANG = 20.0  # seconds: reached only when something hangs


def _rival_gets(redis_url: str, name: str) -> bool:
    """Whether another client (another process, as far as the lock knows) gets ``name`` now."""
    with LockClient(redis_url, watchdog_timeout=TIMEOUT) as rival:
        lock = rival.lock(name)
        if lock.acquire(blocking=False):
            lock.release()
            return True
        return False


# -- the main thread -------------------------------------------------------------------

MAIN_RETURNS = textwrap.dedent(
    """
    import sys, threading, time
    from django_rlock.core import LockClient

    client = LockClient(sys.argv[1], watchdog_timeout={timeout})
    lock = client.lock("process-wide")
    assert lock.acquire()

    def work():
        print("working", flush=True)
        time.sleep({work})   # the lock guards this work: the process is not done
        print("done", flush=True)

    threading.Thread(target=work).start()   # not a daemon: the process goes on
    # ... and the main thread returns, holding the lock.
    """
)


def test_the_main_thread_returning_while_workers_run_keeps_its_holds(
    redis_url: str, r: redis.Redis
) -> None:
    # Four watchdog ticks while the worker runs; the old guess ("the thread
    # that took it ended") released the lock after the first.
    work = 4 * TIMEOUT
    script = MAIN_RETURNS.format(timeout=TIMEOUT, work=work)
    process = subprocess.Popen(
        [sys.executable, "-c", script, redis_url], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "working"
        started = time.monotonic()
        tries = 0
        while process.poll() is None and time.monotonic() - started < work - 0.5:
            assert not _rival_gets(redis_url, "process-wide"), "taken while the process worked"
            tries += 1
            time.sleep(0.1)
        assert tries >= 10
        assert process.stdout.readline().strip() == "done"
        assert process.wait(HANG) == 0
        exited = time.monotonic()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    # Given back as the process exited: free at once, not a watchdog timeout later.
    assert not r.exists("rlock:{process-wide}")
    assert time.monotonic() - exited < TIMEOUT


# -- asyncio: the task that calls acquire() owns the hold --------------------------------


async def _hold_across_ticks(client: AsyncLockClient, redis_url: str, name: str) -> None:
    """The caller holds ``name``: no rival gets it across watchdog ticks; its release works."""
    lock = client.lock(name)
    assert await lock.owned()
    for _ in range(4):
        await asyncio.sleep(TIMEOUT / 3)
        assert not await asyncio.to_thread(_rival_gets, redis_url, name)
    assert await lock.hold_count() == 1
    await lock.release()
    assert not await lock.locked()


@pytest.mark.parametrize("wrapper", ["wait_for", "shield", "gather", "task_group", "timeout"])
def test_the_task_that_awaits_the_grant_owns_it(redis_url: str, wrapper: str) -> None:
    name = f"wrapped-{wrapper}"

    async def main() -> None:
        async with AsyncLockClient(redis_url, watchdog_timeout=TIMEOUT) as client:
            lock = client.lock(name)
            if wrapper == "wait_for":
                # Python 3.11 runs the coroutine in a task of wait_for's own.
                assert await asyncio.wait_for(lock.acquire(), HANG)
            elif wrapper == "shield":
                assert await asyncio.shield(lock.acquire())
            elif wrapper == "gather":
                other = client.lock(f"{name}-other")
                assert list(await asyncio.gather(lock.acquire(), other.acquire())) == [True, True]
                await other.release()
            elif wrapper == "task_group":
                async with asyncio.TaskGroup() as group:
                    granted = group.create_task(lock.acquire())
                assert granted.result()
            else:
                async with asyncio.timeout(HANG):
                    assert await lock.acquire()
            await _hold_across_ticks(client, redis_url, name)

    asyncio.run(main())


def test_a_release_wrapped_in_wait_for_is_the_callers(redis_url: str) -> None:
    async def main() -> None:
        async with AsyncLockClient(redis_url, watchdog_timeout=TIMEOUT) as client:
            lock = client.lock("release-wrapped")
            assert await lock.acquire()
            await asyncio.wait_for(lock.release(), HANG)
            assert not await lock.locked()

    asyncio.run(main())


def test_a_task_that_calls_acquire_and_ends_holding_has_ended_its_scope(
    redis_url: str,
) -> None:
    # The other side of the rule: the task that called acquire() is done, so
    # nobody can release its hold: reported and given back as it ends.
    async def main() -> None:
        async with AsyncLockClient(redis_url, watchdog_timeout=TIMEOUT) as client:
            lock = client.lock("task-ends")

            async def take() -> None:
                assert await lock.acquire()

            await asyncio.create_task(take())
            for _ in range(200):
                if not await lock.locked():
                    break
                await asyncio.sleep(0.01)
            assert not await lock.locked()
            with pytest.raises(LockNotOwnedError):
                await lock.release()  # the caller never held it

    asyncio.run(main())


# -- leases ----------------------------------------------------------------------------


def test_a_lease_given_to_the_lock_applies_to_acquire(redis_url: str, r: redis.Redis) -> None:
    with LockClient(redis_url, watchdog_timeout=TIMEOUT) as client:
        lock = client.lock("throttle", lease=4)
        assert lock.acquire(blocking=False)
        hold = client.holds.newest(lock.keys.hash, _owner())
        assert hold is not None and not hold.watchdog
        assert 3.0 < r.pttl(lock.keys.hash) / 1000 <= 4.0
        lock.release()


def test_a_lease_hold_reentered_without_a_lease_stays_a_lease(
    redis_url: str, r: redis.Redis
) -> None:
    with LockClient(redis_url, watchdog_timeout=TIMEOUT) as client:
        lock = client.lock("lease-reentered")
        assert lock.acquire(lease=4)
        with client.lock("lease-reentered"):  # a helper's block, watchdog-style
            assert lock.hold_count() == 2
            # The rest of the lease, not the watchdog's life: never shortened, never longer.
            assert r.pttl(lock.keys.hash) / 1000 <= 4.0
        hold = client.holds.newest(lock.keys.hash, _owner())
        assert hold is not None and not hold.watchdog and hold.count == 1
        assert 2.0 < r.pttl(lock.keys.hash) / 1000 <= 4.0
        lock.release()


def _owner() -> str:
    from django_rlock.core._process.identity import thread_owner  # noqa: PLC0415

    return thread_owner()


# -- units of work -----------------------------------------------------------------------


def test_a_lease_hold_outlives_its_unit_of_work_and_the_next_unit_cannot_reenter_it(
    redis_url: str, r: redis.Redis
) -> None:
    with LockClient(redis_url, watchdog_timeout=TIMEOUT) as client:
        throttle = client.lock("once-per-lease", lease=4)

        def unit() -> bool:
            leaks.work_started("request")
            try:
                return throttle.acquire(blocking=False)
            finally:
                leaks.work_ended("request")

        # One thread serving units one after another, as a sync web worker does.
        with concurrent.futures.ThreadPoolExecutor(1) as worker:
            assert worker.submit(contextvars.copy_context().run, unit).result(HANG)
            assert r.exists(throttle.keys.hash)  # not given back: a lease, not a leak
            assert not worker.submit(contextvars.copy_context().run, unit).result(HANG)
        assert r.exists(throttle.keys.hash)
        # Nobody can release it any more (its owner id is retired): the server
        # ends it, and the client keeps no record that would grow per request.
        assert not client.holds._holds


def test_a_thread_that_holds_an_older_lock_still_cannot_reenter_a_units_lease(
    redis_url: str, r: redis.Redis
) -> None:
    # A sync web worker's thread holding a process-wide lock, serving requests
    # that each take a throttle's lease: the next request must not re-enter the
    # last one's lease, and the thread keeps (renews, re-enters, releases) its lock.
    with LockClient(redis_url, watchdog_timeout=TIMEOUT) as client:
        process_wide = client.lock("process-wide")
        throttle = client.lock("once-per-lease", lease=4)

        def serve() -> tuple[bool, bool, bool]:
            assert process_wide.acquire()  # before any unit of work
            answers = []
            for _ in range(2):
                leaks.work_started("request")
                try:
                    answers.append(throttle.acquire(blocking=False))
                finally:
                    leaks.work_ended("request")
            time.sleep(TIMEOUT)  # watchdog ticks: the older hold is still renewed
            reentered = process_wide.acquire(blocking=False) and process_wide.hold_count() == 2
            process_wide.release()
            process_wide.release()
            return answers[0], answers[1], reentered

        with concurrent.futures.ThreadPoolExecutor(1) as worker:
            first, second, reentered = worker.submit(contextvars.copy_context().run, serve).result(
                HANG
            )
        assert (first, second, reentered) == (True, False, True)
        assert not r.exists(process_wide.keys.hash)
        assert r.exists(throttle.keys.hash)  # the lease runs on


def test_a_units_hold_taken_on_an_executor_thread_ends_with_the_unit(
    redis_url: str, r: redis.Redis
) -> None:
    reasons: list[str] = []
    with (
        LockClient(redis_url, watchdog_timeout=TIMEOUT) as client,
        concurrent.futures.ThreadPoolExecutor(1) as pool,  # lives on after the unit
    ):
        client.holds.on_leaked(lambda hold, reason: reasons.append(reason))
        lock = client.lock("executor-leak")

        async def view() -> None:
            # What sync_to_async(thread_sensitive=False) does: the call runs on
            # an executor thread, in a copy of the request's context.
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(pool, contextvars.copy_context().run, lock.acquire)

        leaks.work_started("request")
        try:
            asyncio.run(view())
            assert r.exists(lock.keys.hash)
        finally:
            leaks.work_ended("request")
        assert len(reasons) == 1 and "request" in reasons[0]
        # Given back by the unit's end, not by a thread's end: the pool's thread lives.
        assert not r.exists(lock.keys.hash)
        assert pool.submit(lambda: threading.current_thread().is_alive()).result(HANG)


def test_a_hold_taken_outside_any_unit_is_not_ended_by_one(redis_url: str) -> None:
    with LockClient(redis_url, watchdog_timeout=TIMEOUT) as client:
        lock = client.lock("before-the-unit")
        assert lock.acquire()
        done = threading.Event()

        def unit() -> None:
            leaks.work_started("task run")
            leaks.work_ended("task run")
            done.set()

        threading.Thread(target=unit).start()
        assert done.wait(HANG)
        leaks.work_started("request")
        leaks.work_ended("request")
        assert lock.owned()
        lock.release()
