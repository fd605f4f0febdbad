"""Closing a client with live holds: the holder is told, not left believing it still holds."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis

from django_rlock.core import LockClient, LockLostError
from django_rlock.core.aio import AsyncLockClient

HANG = 10.0  # seconds: only ever reached when something hangs


def test_close_declares_the_holds_it_can_no_longer_renew_lost(
    redis_url: str, r: redis.Redis
) -> None:
    client = LockClient(redis_url, key_prefix="test", watchdog_timeout=1.5)
    lock = client.lock("closing")
    told = threading.Event()
    lock.on_lost(lambda _lock: told.set())
    told_by_client = threading.Event()
    client.on_lost(lambda _lock: told_by_client.set())
    assert lock.acquire()
    assert lock.acquire(lease=0.5)  # a re-entry does not make it a lease hold
    assert not lock.lost
    client.close()
    assert lock.lost  # at once: nobody renews it any more
    assert told.wait(HANG) and told_by_client.wait(HANG)
    with LockClient(redis_url, key_prefix="test") as rival_client:
        rival = rival_client.lock("closing")
        assert rival.acquire(timeout=HANG)  # its key expires unrenewed
        with pytest.raises(LockLostError):
            lock.release()
        with pytest.raises(LockLostError):
            lock.release()  # both holds are given back, each raising it
        rival.release()
    assert lock.lost


def test_close_leaves_a_lease_hold_to_its_lease(redis_url: str, r: redis.Redis) -> None:
    """A fixed lease needs no renewal: it stays held until the lease ends, then is lost."""
    client = LockClient(redis_url, key_prefix="test")
    lock = client.lock("leased")
    assert lock.acquire(lease=30)
    client.close()
    assert not lock.lost
    assert lock.owned()
    lock.release()  # the lease is still running: an ordinary release
    assert not lock.locked()


def test_aclose_declares_the_holds_it_can_no_longer_renew_lost(
    redis_url: str, r: redis.Redis
) -> None:
    async def scenario() -> None:
        client = AsyncLockClient(redis_url, key_prefix="test", watchdog_timeout=1.5)
        lock = client.lock("closing-async")
        told = asyncio.Event()
        lock.on_lost(lambda _lock: told.set())
        assert await lock.acquire()
        await client.aclose()
        # owned() asks Redis (as RLock's does), where the key lives on until it expires.
        assert lock.lost
        await asyncio.wait_for(told.wait(), HANG)
        async with AsyncLockClient(redis_url, key_prefix="test") as rival_client:
            rival = rival_client.lock("closing-async")
            assert await rival.acquire(timeout=HANG)
            with pytest.raises(LockLostError):
                await lock.release()
            await rival.release()

    asyncio.run(scenario())
