"""``blocking=False`` with a timeout is refused by every lock kind, as by ``threading.Lock``.

``threading.Lock().acquire(blocking=False, timeout=5)`` raises ValueError
("can't specify a timeout for a non-blocking call"): one attempt waits for
nothing, so a timeout beside it is a mistake worth telling. Every kind of the
engine refuses it in ``acquire()`` and when built with both defaults, sync and
asyncio alike; ``timeout=None`` beside ``blocking=False`` stays a single attempt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from django_rlock.core import LockClient
from django_rlock.core._sync.multilock import MultiLock, RedLock
from django_rlock.core.aio import AsyncLockClient

REFUSED = r"can't specify a timeout for a non-blocking call"

#: Each sync kind, as a factory of a lock from a client (keywords: the lock's defaults).
SYNC_KINDS: dict[str, Callable[..., Any]] = {
    "lock": lambda c, **o: c.lock("nb", **o),
    "fair": lambda c, **o: c.fair_lock("nb", **o),
    "read": lambda c, **o: c.read_write_lock("nb", **o).read,
    "write": lambda c, **o: c.read_write_lock("nb", **o).write,
    "semaphore": lambda c, **o: c.semaphore("nb-sem", 2, **o),
}

ASYNC_KINDS: dict[str, Callable[..., Any]] = {
    "lock": lambda c: c.lock("nb"),
    "fair": lambda c: c.fair_lock("nb"),
    "read": lambda c: c.read_write_lock("nb").read,
    "write": lambda c: c.read_write_lock("nb").write,
    "semaphore": lambda c: c.semaphore("nb-sem", 2),
}


@pytest.fixture
def second_client(r: redis.Redis, redis_url: str) -> Iterator[LockClient]:
    """Another client (RedLock wants each member from its own)."""
    with LockClient(redis_url, key_prefix="test-2") as client:
        yield client


def group_locks(
    first: LockClient, second: LockClient
) -> dict[str, Callable[..., MultiLock | RedLock]]:
    return {
        "MultiLock": lambda **o: MultiLock(first.lock("g1"), first.lock("g2"), **o),
        "RedLock": lambda **o: RedLock(first.lock("g1"), second.lock("g1"), **o),
    }


@pytest.mark.parametrize("kind", sorted(SYNC_KINDS))
@pytest.mark.parametrize("timeout", [5, 0])
def test_every_sync_kind_refuses_a_timeout_with_blocking_false(
    lock_client: LockClient, kind: str, timeout: float
) -> None:
    lock = SYNC_KINDS[kind](lock_client)
    with pytest.raises(ValueError, match=REFUSED):
        lock.acquire(blocking=False, timeout=timeout)
    with pytest.raises(ValueError, match=REFUSED):
        SYNC_KINDS[kind](lock_client, blocking=False, timeout=timeout)
    assert not lock.locked()


@pytest.mark.parametrize("kind", sorted(SYNC_KINDS))
def test_blocking_false_without_a_timeout_is_one_attempt(
    lock_client: LockClient, kind: str
) -> None:
    lock = SYNC_KINDS[kind](lock_client)
    assert lock.acquire(blocking=False, timeout=None)
    lock.release()


@pytest.mark.parametrize("group", ["MultiLock", "RedLock"])
def test_multilock_and_redlock_refuse_it_when_built_and_when_acquiring(
    lock_client: LockClient, second_client: LockClient, group: str
) -> None:
    make = group_locks(lock_client, second_client)[group]
    # Built with both defaults: refused at once, not at the first ``with``.
    with pytest.raises(ValueError, match=REFUSED):
        make(blocking=False, timeout=5)
    lock = make()
    with pytest.raises(ValueError, match=REFUSED):
        lock.acquire(blocking=False, timeout=5)
    assert lock.acquire(blocking=False, timeout=None)
    lock.release()
    assert not lock.locked()


@pytest.mark.parametrize("group", ["MultiLock", "RedLock"])
def test_multilock_and_redlock_refuse_a_blocking_that_is_not_a_bool(
    lock_client: LockClient, second_client: LockClient, group: str
) -> None:
    make = group_locks(lock_client, second_client)[group]
    with pytest.raises(ValueError, match="blocking must be True or False"):
        make(blocking="no")
    lock = make()
    with pytest.raises(ValueError, match="blocking must be True or False"):
        lock.acquire(blocking="no")  # type: ignore[arg-type]  # the mistake tested
    assert not lock.locked()


@pytest.mark.parametrize("kind", sorted(ASYNC_KINDS))
def test_every_asyncio_kind_refuses_a_timeout_with_blocking_false(
    r: redis.Redis, redis_url: str, kind: str
) -> None:
    async def scenario() -> None:
        async with AsyncLockClient(redis_url, key_prefix="test") as client:
            lock = ASYNC_KINDS[kind](client)
            with pytest.raises(ValueError, match=REFUSED):
                await lock.acquire(blocking=False, timeout=5)
            assert await lock.acquire(blocking=False, timeout=None)
            await lock.release()

    asyncio.run(scenario())
