"""Every kind of lock, on both engines, sends its own row of scripts (``KindScripts``).

Acquire, release, waiting and force-release are written once (``RLock`` and
``AsyncRLock``) and send what each kind's row names: a row that named another
kind's script would take or free the wrong keys. Force-release is the call
no other test runs on every kind and engine, so it is the one checked here,
against a real redis-server: False when free, True when held, the hold gone
after it, and its holder told at release (LockLostError).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from django_rlock.core import LockClient, LockLostError
from django_rlock.core.aio import AsyncLockClient

#: Each kind, as got from a client of either engine (same method names on both).
KINDS: dict[str, Callable[[Any], Any]] = {
    "lock": lambda client: client.lock("kind"),
    "fair": lambda client: client.fair_lock("kind"),
    "semaphore": lambda client: client.semaphore("kind", permits=2),
    "write": lambda client: client.read_write_lock("kind").write,
    "read": lambda client: client.read_write_lock("kind").read,
}


@pytest.mark.parametrize("kind", KINDS)
def test_force_release_frees_each_kind_sync(redis_url: str, kind: str) -> None:
    with LockClient(redis_url, key_prefix="kinds") as client:
        lock = KINDS[kind](client)
        assert lock.force_release() is False
        assert lock.acquire(lease=30)
        assert lock.ttl() is not None
        assert lock.force_release() is True
        assert lock.ttl() is None
        with pytest.raises(LockLostError):
            lock.release()
        assert lock.force_release() is False


@pytest.mark.parametrize("kind", KINDS)
def test_force_release_frees_each_kind_asyncio(redis_url: str, kind: str) -> None:
    async def scenario() -> None:
        async with AsyncLockClient(redis_url, key_prefix="kinds") as client:
            lock = KINDS[kind](client)
            assert await lock.force_release() is False
            assert await lock.acquire(lease=30)
            assert await lock.ttl() is not None
            assert await lock.force_release() is True
            assert await lock.ttl() is None
            with pytest.raises(LockLostError):
                await lock.release()
            assert await lock.force_release() is False

    asyncio.run(scenario())


@pytest.mark.parametrize("kind", KINDS)
def test_a_sync_hold_is_freed_by_the_asyncio_twin(redis_url: str, kind: str) -> None:
    """Both engines' rows name the same scripts on the same keys."""
    with LockClient(redis_url, key_prefix="kinds") as client:
        lock = KINDS[kind](client)
        assert lock.acquire(lease=30)

        async def force() -> bool:
            async with AsyncLockClient(redis_url, key_prefix="kinds") as twin_client:
                result: bool = await KINDS[kind](twin_client).force_release()
                return result

        assert asyncio.run(force()) is True
        assert lock.ttl() is None
        with pytest.raises(LockLostError):
            lock.release()
