"""A hold that expired on the server and was granted afresh leaves no loss record behind.

When an owner's fixed lease runs out unnoticed and its next acquire is a new
grant, the client reports the old hold lost (its owner acknowledges it at the
last release with LockLostError, as for a lock). That report must not be recorded
as holds the server may still count (core/lostholds.py): it would name the new
grant, and a read or a permit carries no fencing token to tell the two apart,
so the owner's next call would take its own live hold off the server. Found
by the model (tests/model) without any fault: a reader asking to write was
granted the write over its own read and another owner's.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from django_rlock.core import LockClient, LockLostError, LockUpgradeError
from django_rlock.core._process.identity import task_owner, thread_owner
from django_rlock.core._protocol.semaphore import permit_key
from django_rlock.core.aio import AsyncLockClient

#: Generous: a 0.2 s lease is gone long before.
EXPIRY_LIMIT = 10.0


def wait_gone(r: redis.Redis, key: str) -> None:
    """Until ``key`` has expired on the server (fails the test after EXPIRY_LIMIT)."""
    deadline = time.monotonic() + EXPIRY_LIMIT
    while r.exists(key):
        assert time.monotonic() < deadline, f"{key} never expired"
        time.sleep(0.02)


def test_a_read_taken_again_after_its_lease_ran_out_still_refuses_the_upgrade(
    lock_client: LockClient, r: redis.Redis
) -> None:
    rw = lock_client.read_write_lock("stale-read")
    reader = rw.read.rw_keys.reader(thread_owner())
    assert rw.read.acquire(lease=0.2)
    wait_gone(r, reader)
    assert rw.read.acquire(lease=5)  # a new grant: the expired read is reported lost
    with pytest.raises(LockUpgradeError):
        rw.write.acquire(blocking=False)
    assert r.hget(reader, thread_owner()) == b"1"  # the live read is still there
    assert rw.read.acquire(lease=5)  # and is re-entered, not taken off
    assert r.hget(reader, thread_owner()) == b"2"
    assert not rw.read.lost  # the live read is the current hold (the expired one raises below)
    rw.read.release()
    rw.read.release()
    assert not r.exists(reader)
    with pytest.raises(LockLostError):
        rw.read.release()  # the expired one, acknowledged


def test_a_permit_taken_again_after_its_lease_ran_out_is_kept_by_the_next_acquire(
    lock_client: LockClient, r: redis.Redis
) -> None:
    semaphore = lock_client.semaphore("stale-permit", 3)
    key = permit_key(semaphore.keys, thread_owner())
    assert semaphore.acquire(lease=0.2)
    wait_gone(r, key)
    assert semaphore.acquire(lease=5)  # a new grant: the expired permit is reported lost
    assert semaphore.acquire(lease=5)  # a second permit, not a fresh start
    assert r.hget(key, thread_owner()) == b"2"
    assert semaphore.available() == 1
    assert semaphore.hold_count() == 2
    semaphore.release()
    semaphore.release()
    assert semaphore.available() == 3
    with pytest.raises(LockLostError):
        semaphore.release()  # the expired one, acknowledged


def test_the_asyncio_twins_keep_their_live_read_and_permits(redis_url: str, r: redis.Redis) -> None:
    async def scenario() -> None:
        async with AsyncLockClient(redis_url, key_prefix="test") as client:
            owner = task_owner()
            rw = client.read_write_lock("stale-read-aio")
            reader = rw.read.rw_keys.reader(owner)
            assert await rw.read.acquire(lease=0.2)
            await asyncio.to_thread(wait_gone, r, reader)
            assert await rw.read.acquire(lease=5)
            with pytest.raises(LockUpgradeError):
                await rw.write.acquire(blocking=False)
            assert r.hget(reader, owner) == b"1"
            await rw.read.release()

            semaphore = client.semaphore("stale-permit-aio", 3)
            key = permit_key(semaphore.keys, owner)
            assert await semaphore.acquire(lease=0.2)
            await asyncio.to_thread(wait_gone, r, key)
            assert await semaphore.acquire(lease=5)
            assert await semaphore.acquire(lease=5)
            assert r.hget(key, owner) == b"2"
            assert await semaphore.available() == 1
            await semaphore.release()
            await semaphore.release()

    asyncio.run(scenario())
