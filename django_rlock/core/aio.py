"""The asyncio engine: the same lock for async code.

::

    from django_rlock.core.aio import AsyncLockClient

    client = AsyncLockClient("redis://127.0.0.1:6379/0", key_prefix="shop")
    async with client.lock("order:42") as lock:
        await charge(order, fence=lock.token)

Same names and semantics as the sync engine (``acquire``/``release`` are
awaited, as are ``locked``, ``ttl`` and ``force_release``); the owner is the
current asyncio task.
"""

from django_rlock.core._aio.client import AsyncLockClient
from django_rlock.core._aio.fairlock import AsyncFairLock
from django_rlock.core._aio.leader import AsyncLeadership
from django_rlock.core._aio.locks import AsyncRLock
from django_rlock.core._aio.ratelimiter import AsyncRateLimiter
from django_rlock.core._aio.rwlock import AsyncReadLock, AsyncReadWriteLock, AsyncWriteLock
from django_rlock.core._aio.semaphore import AsyncSemaphore

__all__ = [
    "AsyncFairLock",
    "AsyncLeadership",
    "AsyncLockClient",
    "AsyncRLock",
    "AsyncRateLimiter",
    "AsyncReadLock",
    "AsyncReadWriteLock",
    "AsyncSemaphore",
    "AsyncWriteLock",
]
