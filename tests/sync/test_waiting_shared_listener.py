"""No lost wake-up: many waiters of one client, each on its own lock, released together.

Every thread (or asyncio task) of a process waits through the client's one
release listener; another process releases all their locks at once. The
holder's watchdog timeout is 30 s, so a waiter whose release message goes
unread sleeps out the holder's PTTL and is granted seconds late, while a woken
one is granted within milliseconds: the bound (2 s) is generous for a loaded
2-core machine and still far from the 30 s a lost wake-up costs. The race
(which waiter reads the connection when the messages arrive) differs from run
to run, hence several rounds. ``python -m benchmarks.wakeups`` measures it.
"""

from __future__ import annotations

import asyncio

import pytest
import redis

from django_rlock.core import LockClient
from django_rlock.core.aio import AsyncLockClient
from tests.sync.shared_listener import holder, task_round, thread_round

pytestmark = pytest.mark.slow

WAITERS = 16
ROUNDS = 10
#: The holder's and the waiters' watchdog timeout: a lost wake-up costs up to this.
WATCHDOG = 30.0
#: Seconds a waiter may be granted after its lock's release.
BOUND = 2.0
#: A waiter's acquire timeout: past a lost wake-up's cost, so it is measured, not cut.
WAIT = WATCHDOG + 15


def _late(delays: list[float]) -> str:
    return ", ".join(
        f"waiter {index}: {delay:.2f}s" for index, delay in enumerate(delays) if delay > BOUND
    )


def test_every_thread_of_one_client_is_woken_by_its_release(redis_url: str, r: redis.Redis) -> None:
    with (
        LockClient(redis_url, key_prefix="test", watchdog_timeout=WATCHDOG) as client,
        holder(redis_url, WATCHDOG) as process,
    ):
        for round_ in range(ROUNDS):
            names = [f"shared-{round_}-{index}" for index in range(WAITERS)]
            delays = thread_round(client, process, r, names, WAIT)
            print(f"round {round_}: worst {max(delays) * 1000:.1f} ms")
            assert max(delays) <= BOUND, f"round {round_}, late wake-ups: {_late(delays)}"


def test_every_task_of_one_async_client_is_woken_by_its_release(
    redis_url: str, r: redis.Redis
) -> None:
    async def main() -> None:
        async with AsyncLockClient(
            redis_url, key_prefix="test", watchdog_timeout=WATCHDOG
        ) as client:
            for round_ in range(ROUNDS):
                names = [f"shared-aio-{round_}-{index}" for index in range(WAITERS)]
                delays = await task_round(client, process, r, names, WAIT)
                print(f"round {round_}: worst {max(delays) * 1000:.1f} ms")
                assert max(delays) <= BOUND, f"round {round_}, late wake-ups: {_late(delays)}"

    with holder(redis_url, WATCHDOG) as process:
        asyncio.run(main())
