"""The asyncio read-write lock against real Redis: tasks as owners, the sync twin, cancellation."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis

from django_rlock.core import LockClient, LockUpgradeError
from django_rlock.core._protocol.rwlock import RWKeys
from django_rlock.core.aio import AsyncLockClient, AsyncReadWriteLock
from tests.sync.test_rwlock import Held, overlaps


def run(url: str, scenario: Callable[[AsyncLockClient], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with AsyncLockClient(url, key_prefix="test") as client:
            return await scenario(client)

    return asyncio.run(main())


def test_reader_tasks_share_it_and_a_writer_task_follows(redis_url: str, r: redis.Redis) -> None:
    async def scenario(client: AsyncLockClient) -> None:
        rw = client.read_write_lock("report")
        inside = 0
        most = 0
        all_in = asyncio.Event()

        async def read() -> None:
            nonlocal inside, most
            async with rw.read:
                inside += 1
                most = max(most, inside)
                if inside == 4:
                    all_in.set()
                await asyncio.wait_for(all_in.wait(), 20)
                assert await rw.read.owned() and await rw.read.locked()
                inside -= 1

        readers = [asyncio.ensure_future(read()) for _ in range(4)]
        await asyncio.sleep(0)
        await asyncio.gather(*readers)
        assert most == 4
        async with rw.write:
            assert rw.write.token is not None
            assert await rw.write.owned()
        assert not await rw.read.locked() and not await rw.write.locked()

    run(redis_url, scenario)


def test_a_reader_task_asking_to_write_is_refused_and_keeps_its_read(
    redis_url: str, r: redis.Redis
) -> None:
    async def scenario(client: AsyncLockClient) -> tuple[int, bool]:
        rw = client.read_write_lock("report")
        async with rw.read:
            with pytest.raises(LockUpgradeError):
                await rw.write.acquire()
            count = await rw.read.hold_count()
        async with rw.write, rw.read:  # the writer may read
            writer_reads = await rw.read.owned()
        return count, writer_reads

    assert run(redis_url, scenario) == (1, True)


def test_sync_and_async_owners_exclude_each_other(
    redis_url: str, r: redis.Redis, lock_client: LockClient
) -> None:
    sync_rw = lock_client.read_write_lock("shared")
    sync_rw.write.acquire()

    async def scenario(client: AsyncLockClient) -> tuple[bool, bool, float]:
        rw = client.read_write_lock("shared")
        busy = await rw.read.acquire(blocking=False)
        loop = asyncio.get_running_loop()
        loop.call_later(0.3, sync_rw.write.release)  # on this thread: the sync owner
        started = time.monotonic()
        granted = await rw.read.acquire(timeout=20)  # woken by the sync writer's release
        waited = time.monotonic() - started
        await rw.read.release()
        return busy, granted, waited

    busy, granted, waited = run(redis_url, scenario)
    assert (busy, granted) == (False, True)
    assert waited < 10  # by message, not the writer's 30 s PTTL


def test_a_cancelled_wait_leaves_nothing_behind(redis_url: str, r: redis.Redis) -> None:
    keys = RWKeys.build("test", "cancelled")

    async def scenario(client: AsyncLockClient) -> None:
        rw = client.read_write_lock("cancelled")
        await rw.read.acquire()

        async def writer() -> None:
            other = client.read_write_lock("cancelled")
            await other.write.acquire()

        waiting = asyncio.ensure_future(writer())
        deadline = time.monotonic() + 10
        while not r.zcard(keys.waiters):
            assert time.monotonic() < deadline, "the writer never registered"
            await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await client.settle()
        await rw.read.release()
        assert client.listener.subscribed_channels() == set()

    run(redis_url, scenario)
    assert not r.exists(keys.write) and not r.exists(keys.readers)
    assert r.zcard(keys.waiters) == 0


@pytest.mark.slow
def test_no_write_task_overlaps_any_other_hold(redis_url: str, r: redis.Redis) -> None:
    history: list[Held] = []

    async def scenario(client: AsyncLockClient) -> None:
        rw: AsyncReadWriteLock = client.read_write_lock("history")

        async def worker(number: int) -> None:
            chance = random.Random(number)
            for _ in range(30):
                write = chance.random() < 0.3
                side = rw.write if write else rw.read
                assert await side.acquire(timeout=60)
                start = time.monotonic()
                await asyncio.sleep(chance.random() * 0.004)
                end = time.monotonic()
                await side.release()
                history.append(Held(number, write, start, end))

        await asyncio.gather(*(worker(number) for number in range(6)))

    run(redis_url, scenario)
    assert len(history) == 6 * 30
    assert sum(held.write for held in history) > 15
    assert overlaps(history) == []
