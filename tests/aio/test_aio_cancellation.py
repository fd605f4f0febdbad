"""Cancelling asyncio acquires and releases at every await point, against real Redis.

Each run sends one task through a sequence of lock calls and cancels it after
``k`` event-loop iterations, for every ``k`` from 0 until the sequence ends
before the cancellation lands: the cancellation falls on every await of every
call, whatever the calls await (the wait for an unfinished call of the same
task, the reply, a reload after NOSCRIPT, a resend after a broken connection,
a first connection). The task goes on after it, as code under
``asyncio.timeout`` does, and believes what a caller is told: a cancelled
acquire did not take the lock, a cancelled release gave one hold back.

Checked after every call that was not cancelled: while the task believes it
holds the lock, another owner cannot take it; Redis counts exactly the holds
the task believes it has (a cancelled acquire left no hold it does not know,
a cancelled release did not undo a later grant); its fencing token is there
exactly when it holds. At the end, after the client settles: nothing left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from django_rlock.core import LockClient, LockError
from django_rlock.core._process.identity import task_owner
from django_rlock.core.aio import AsyncLockClient
from tests.servers import RedisServer

#: The sequence a task runs; a release is skipped while it believes it holds nothing.
SEQUENCE = ("acquire", "acquire", "release", "acquire", "release", "release", "acquire", "release")

#: The same for a semaphore of one permit: an owner takes at most one.
SEMAPHORE_SEQUENCE = ("acquire", "release", "acquire", "release", "acquire", "release")

#: Generous bounds, against hangs only.
MOST_STEPS = 3000
RUN_TIMEOUT = 30.0


@dataclass
class Run:
    """What one run saw: the calls the cancellations landed on, and every broken rule."""

    cancelled: list[str] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)


def make(kind: str, client: Any, name: str) -> Any:
    if kind == "lock":
        return client.lock(name)
    if kind == "fair":
        return client.fair_lock(name)
    if kind == "write":
        return client.read_write_lock(name).write
    if kind == "semaphore":
        return client.semaphore(name, 1)
    raise AssertionError(kind)


async def run_once(
    client: AsyncLockClient,
    kind: str,
    name: str,
    *,
    rival_client: LockClient,
    direct: redis.Redis,
    cancel_at: list[int],
    before_cancel: Callable[[], object],
) -> tuple[Run, bool]:
    """One run, cancelled after each step count in ``cancel_at``; (run, any landed)."""
    lock = make(kind, client, name)
    rival = make(kind, rival_client, name)
    sequence = SEMAPHORE_SEQUENCE if kind == "semaphore" else SEQUENCE
    run = Run()
    believed = 0
    owners: list[str] = []

    def counted_now() -> int:
        return counted(owners[0])

    def counted(owner: str) -> int:
        # Read with a plain client, without an await: a cancellation lands only in lock calls.
        return int(direct.hget(lock.hold_keys(owner)[0], owner) or 0)

    def check(after: str) -> None:
        if believed and rival.acquire(blocking=False):
            rival.release()
            run.broken.append(f"another owner took the lock the task holds, after {after}")
        counted = counted_now()
        if counted != believed:
            run.broken.append(f"Redis counts {counted} holds, the task believes {believed}")
        if kind != "semaphore" and (lock.token is not None) != (believed > 0):
            run.broken.append(f"token {lock.token} with {believed} holds, after {after}")

    async def worker() -> None:
        nonlocal believed
        me = asyncio.current_task()
        assert me is not None
        owners.append(task_owner())
        for index, op in enumerate(sequence):
            label = f"{op} #{index}"
            if op == "release" and not believed:
                continue
            try:
                if op == "acquire":
                    if await lock.acquire(timeout=10):
                        believed += 1
                    else:
                        run.broken.append(f"{label} timed out on a lock nobody else holds")
                else:
                    await lock.release()
                    believed -= 1
            except asyncio.CancelledError:
                me.uncancel()
                run.cancelled.append(label)
                if op == "release":
                    believed -= 1  # a cancelled release still completes
                continue
            except LockError as error:
                run.broken.append(f"{label} raised {error!r}")
                continue
            check(label)
        while believed:
            await lock.release()
            believed -= 1

    task = asyncio.ensure_future(worker())
    await asyncio.sleep(0)  # the task starts: step 0 is its first await
    landed = False
    step = 0
    for target in cancel_at:
        while step < target and not task.done():
            await asyncio.sleep(0)
            step += 1
        if task.done():
            break
        before_cancel()
        task.cancel()
        landed = True
    async with asyncio.timeout(RUN_TIMEOUT):
        await task
        await client.settle()
    left = counted_now()
    if left:
        run.broken.append(f"{left} holds left after the last release")
    if client.unfinished:
        run.broken.append(f"unfinished calls left: {client.unfinished}")
    return run, landed


def sweep(
    url: str,
    kind: str,
    *,
    gaps: tuple[int, ...] = (),
    fresh_client: bool = False,
    before_run: Callable[[], object] = lambda: None,
    before_cancel: Callable[[], object] = lambda: None,
) -> list[str]:
    """Every cancellation point of the sequence (one more cancellation ``gaps`` steps later)."""
    failures: list[str] = []

    async def main() -> None:
        shared = AsyncLockClient(url, key_prefix="cancel", watchdog_timeout=5)
        direct = redis.Redis.from_url(url)
        with LockClient(url, key_prefix="cancel", watchdog_timeout=5) as rival_client:
            for k in range(MOST_STEPS):
                before_run()
                client = (
                    AsyncLockClient(url, key_prefix="cancel", watchdog_timeout=5)
                    if fresh_client
                    else shared
                )
                try:
                    run, landed = await run_once(
                        client,
                        kind,
                        f"{kind}-{k}",
                        rival_client=rival_client,
                        direct=direct,
                        cancel_at=[k, *(k + gap for gap in gaps)],
                        before_cancel=before_cancel,
                    )
                finally:
                    if fresh_client:
                        await client.aclose()
                failures.extend(f"k={k} ({', '.join(run.cancelled)}): {b}" for b in run.broken)
                if not landed:
                    break  # the sequence ended before step k: every point was reached
            else:
                failures.append(f"the sequence never ended within {MOST_STEPS} steps")
        await shared.aclose()
        direct.close()

    asyncio.run(main())
    return failures


KINDS = ["lock", "fair", "write", "semaphore"]


@pytest.mark.parametrize("kind", KINDS)
def test_one_cancellation_at_every_await_point(redis_url: str, r: redis.Redis, kind: str) -> None:
    assert sweep(redis_url, kind) == []


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_two_cancellations_at_every_await_point(redis_url: str, r: redis.Redis, kind: str) -> None:
    # The second lands on what the first left: often the wait for its unfinished call.
    for gap in (1, 3):
        assert sweep(redis_url, kind, gaps=(gap,)) == [], f"gap {gap}"


def test_cancellations_while_the_connection_is_made(redis_url: str, r: redis.Redis) -> None:
    # A new client's first calls wait for its connection (and go through redis-py if it fails).
    assert sweep(redis_url, "lock", fresh_client=True) == []


def test_cancellations_while_a_flushed_script_is_loaded_again(
    redis_url: str, r: redis.Redis
) -> None:
    # NOSCRIPT: the call did not run; redis-py loads the script and sends it again.
    assert sweep(redis_url, "lock", before_run=r.script_flush) == []


def test_cancellations_as_the_connection_breaks() -> None:
    # Every connection but the test's own is killed as the cancellation lands:
    # a call on its way is sent once more (its request id lets Redis answer a
    # call it already ran with what it did), and the cancelled one is finished.
    with RedisServer() as server:
        admin = server.client()

        def kill() -> None:
            admin.client_kill_filter(_type="normal", skipme=True)

        assert sweep(server.url, "lock", before_cancel=kill) == []
        admin.close()


#: Seconds: only ever reached when a loop's end hangs.
LOOP_END_HANG = 10.0


def test_a_loop_ending_while_the_connection_is_made_ends_the_calls_waiting_for_it(
    redis_url: str,
) -> None:
    """As ``asyncio.run`` ends: every task is cancelled, the connecting one too.

    The calls queued for that connection were never sent; they end (nothing
    waits for them for ever), and the client still closes. On every redis-py
    line: a client's first call waits for that connection even where the lean
    path is off (redis-py 5), until the connection is found not fit.
    """
    loop = asyncio.new_event_loop()
    try:
        client: AsyncLockClient = loop.run_until_complete(_made(redis_url))
        lock = client.lock("loop-ends")
        caller = loop.create_task(lock.acquire())
        loop.call_soon(loop.stop)
        loop.run_forever()  # one iteration: the call is queued, its connection being made
        assert client._wire._backlog, "the call waits for its connection"
        rest = asyncio.all_tasks(loop)
        for task in rest:
            task.cancel()
        timer = loop.call_later(LOOP_END_HANG, loop.stop)
        loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
        loop.run_until_complete(client.aclose())  # settles what the cancelled calls left
        timer.cancel()
        assert caller.cancelled()
        assert not client._wire._backlog
    finally:
        loop.close()


async def _made(url: str) -> AsyncLockClient:
    return AsyncLockClient(url, key_prefix="test")
