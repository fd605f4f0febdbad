"""``async with rlock()`` on backends with no asyncio engine: the task is the owner.

A cache alias, MIN_REPLICAS (and Sentinel, Cluster) run the sync lock
on a worker thread. Nested ``async with`` in one task must re-enter (one owner,
hold count 2), as it does on the native asyncio lock, and two tasks must still
exclude each other.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import locks, rlock
from django_rlock.backends._threadowned import ThreadOwnedLock, _task_threads
from django_rlock.core.exceptions import LockTimeout
from tests.django.conftest import HANG
from tests.servers import RedisServer

THREAD_OWNED = ["cached", "replicas"]


@pytest.fixture(scope="module")
def replicated() -> Iterator[RedisServer]:
    """A master with one replica in sync (what MIN_REPLICAS=1 needs for a grant).

    The master starts the replica's sync at once (Redis 7 waits 5 s by default
    for more replicas, and the first grant's WAIT with it).
    """
    with (
        RedisServer("--repl-diskless-sync-delay", "0") as master,
        RedisServer("--replicaof", "127.0.0.1", str(master.port)),
    ):
        client = master.client()
        deadline = time.monotonic() + 20
        while int(client.info("replication").get("connected_slaves", 0)) < 1:
            assert time.monotonic() < deadline, "the replica never connected"
            time.sleep(0.05)
        client.close()
        yield master


@pytest.fixture
def aliases(
    settings: SettingsWrapper, rlocks: dict[str, Any], redis_url: str, replicated: RedisServer
) -> None:
    settings.CACHES = {
        **settings.CACHES,
        "redis": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": redis_url},
    }
    settings.RLOCKS = {
        **rlocks,
        "cached": {"CACHE": "redis", "KEY_PREFIX": "t", "WATCHDOG_TIMEOUT": 5},
        "replicas": {
            "LOCATION": replicated.url,
            "KEY_PREFIX": "t",
            "WATCHDOG_TIMEOUT": 5,
            "MIN_REPLICAS": 1,
            "REPLICA_SYNC_TIMEOUT": 5,
        },
    }


@pytest.mark.usefixtures("aliases")
@pytest.mark.parametrize("alias", THREAD_OWNED)
def test_nested_async_with_in_one_task_re_enters(alias: str) -> None:
    name = f"nested-{alias}"

    async def holders() -> dict[str, int]:
        info = await asyncio.to_thread(locks[alias].inspect, name)
        return {} if info is None else info.holders

    async def scenario() -> None:
        assert isinstance(locks[alias].async_lock(name), ThreadOwnedLock)
        async with rlock(name, using=alias, timeout=HANG):
            # With a new owner per entry, this waited on the task's own hold.
            async with rlock(name, using=alias, timeout=HANG):
                assert list((await holders()).values()) == [2]
            assert list((await holders()).values()) == [1]

            async def other_task() -> None:
                async with rlock(name, using=alias, timeout=0.2):
                    pass

            with pytest.raises(LockTimeout):
                await asyncio.create_task(other_task())
        assert await holders() == {}
        # Free again: another task takes it at once.
        await asyncio.create_task(_enter_once(name, alias))

    asyncio.run(asyncio.wait_for(scenario(), 3 * HANG))
    assert not _task_threads


async def _enter_once(name: str, alias: str) -> None:
    async with rlock(name, using=alias, blocking=False):
        pass


@pytest.mark.usefixtures("aliases")
@pytest.mark.parametrize("alias", THREAD_OWNED)
def test_two_tasks_exclude_each_other(alias: str) -> None:
    name = f"pair-{alias}"
    inside = 0
    most = 0

    async def one(step: int) -> None:
        nonlocal inside, most
        # Nested on purpose (SIM117): the inner entry is the re-entry under test.
        async with rlock(name, using=alias, timeout=HANG):  # noqa: SIM117
            async with rlock(name, using=alias, timeout=HANG):
                inside += 1
                most = max(most, inside)
                await asyncio.sleep(0.01)
                inside -= 1

    async def scenario() -> None:
        await asyncio.gather(*(one(step) for step in range(8)))

    asyncio.run(asyncio.wait_for(scenario(), 3 * HANG))
    assert most == 1
    assert not _task_threads
